"""The chat's BM25 index carried over a write that changes no indexed text (access reinforcement) as is, and brought
up to date from the touched rows (not rebuilt) over a write that does."""

from __future__ import annotations

import pytest
from store_helpers import node

from memory_recall.store import Store
from memory_recall.store.bm25_index import Bm25Cache, Bm25Index, cache_for

CHAT = "carry"
NOW = 1_700_000_000_000
NODES = [
    node("a", title="dragon lair", summary="cave north"),
    node("b", title="mountain pass", summary="dragon sleeps"),
    node("c", title="old road", notes="dragon seen"),
    node("d", title="castle gate", summary="stone wall"),
]


def _no_build() -> Bm25Index:
    raise AssertionError("the index was expected to be cached")


def _cached_index(store: Store, version: int, stem: str = "none") -> Bm25Index:
    """The index the store's cache holds for ``CHAT`` at ``version`` (fails if it would have to build)."""
    return cache_for(store).get(CHAT, version, _no_build, stem)


@pytest.fixture
def chat(store: Store) -> Store:
    store.upsert_nodes(CHAT, NODES)
    return store


class TestStoreCarry:
    def test_reused_across_a_reinforcement_write(self, chat: Store) -> None:
        store = chat
        before = store.bm25(CHAT, ["dragon"], 10)
        base = store.chat_version(CHAT)
        index = _cached_index(store, base)
        builds = cache_for(store).builds
        with store.write(CHAT) as w:
            assert w.chat_version(CHAT) == base
            w.reinforce(["a", "c"], NOW, 0.5)
            new = w.version
        # The commit moved the cached index to the new version (the batch touched no FTS row).
        assert _cached_index(store, new) is index
        after = store.bm25(CHAT, ["dragon"], 10)
        assert cache_for(store).builds == builds  # served by the carried index, not rebuilt
        assert after == before
        # ... and it is what a rebuild at the new version gives (reinforcement changed no indexed text).
        cache_for(store).clear()
        assert store.bm25(CHAT, ["dragon"], 10) == after
        assert cache_for(store).builds == builds + 1

    @pytest.mark.parametrize("write", ["upsert_nodes", "delete_nodes", "archive"])
    def test_not_reused_across_a_graph_write(self, chat: Store, write: str) -> None:
        store = chat
        store.bm25(CHAT, ["dragon"], 10)
        base = store.chat_version(CHAT)
        index = _cached_index(store, base)
        builds, deltas = cache_for(store).builds, cache_for(store).deltas
        with store.write(CHAT) as w:
            if write == "upsert_nodes":
                w.upsert_nodes([node("e", title="dragon egg", summary="warm shell")])
            elif write == "delete_nodes":
                w.delete_nodes(["b"])
            else:
                w.upsert_nodes([NODES[0].model_copy(update={"archived": True})])
        new = store.chat_version(CHAT)
        hits = dict(store.bm25(CHAT, ["dragon"], 10))
        # Brought to the new version from the one touched row, not rebuilt from the chat.
        assert (cache_for(store).builds, cache_for(store).deltas) == (builds, deltas + 1)
        assert _cached_index(store, new) is not index
        expected = {"upsert_nodes": {"a", "b", "c", "e"}, "delete_nodes": {"a", "c"}, "archive": {"b", "c"}}[write]
        assert set(hits) == expected

    def test_carry_only_from_the_exact_base_version(self, chat: Store) -> None:
        store = chat
        store.bm25(CHAT, ["dragon"], 10)
        base = store.chat_version(CHAT)
        assert cache_for(store).carry(CHAT, base - 1, base + 1) == 0  # the cache holds `base`, not `base - 1`
        assert cache_for(store).carry("other-chat", base, base + 1) == 0
        assert _cached_index(store, base) is not None
        with pytest.raises(AssertionError, match="expected to be cached"):
            _cached_index(store, base + 1)

    def test_every_stem_method_is_carried(self, chat: Store) -> None:
        store = chat
        store.bm25(CHAT, ["dragons"], 10)
        store.bm25(CHAT, ["dragons"], 10, stem="s")
        base = store.chat_version(CHAT)
        plain, stemmed = _cached_index(store, base), _cached_index(store, base, "s")
        with store.write(CHAT) as w:
            w.reinforce(["b"], NOW)
            new = w.version
        assert _cached_index(store, new) is plain and _cached_index(store, new, "s") is stemmed


class TestCacheCarry:
    def test_rekeys_only_matching_entries(self) -> None:
        cache = Bm25Cache()
        one = Bm25Index.build(["x"], ["dragon"], [""], [""])
        two = Bm25Index.build(["y"], ["lair"], [""], [""])
        cache.get("c1", 5, lambda: one)
        cache.get("c2", 5, lambda: two)
        assert cache.carry("c1", 5, 7) == 1
        assert cache.get("c1", 7, _no_build) is one
        assert cache.get("c2", 5, _no_build) is two  # another chat is untouched
        assert cache.carry("c1", 5, 8) == 0  # no entry at 5 any more

    def test_rejects_a_version_that_does_not_follow(self) -> None:
        with pytest.raises(ValueError, match="must follow"):
            Bm25Cache().carry("c1", 5, 5)
