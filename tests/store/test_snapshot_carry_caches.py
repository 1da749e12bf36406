"""Per-snapshot derived caches carried over access reinforcement: exactly the allow-listed keys, shared values."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from store_helpers import node

from memory_recall.pipeline import _graph_cache
from memory_recall.pipeline._graph_cache import MAX_ENTRIES_PER_SNAPSHOT, REINFORCEMENT_SAFE_KEYS, cached, carry_over
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache

CHAT = "carry"
NOW = 1_700_000_000_000

#: Keys a recall may cache, with whether they must be carried over reinforcement.
KEYS: dict[Hashable, bool] = {
    ("scoring-arrays",): True,
    ("lexical-fields",): True,
    ("anchors", "folded-index"): True,
    ("visibility", "index"): True,
    ("context", "has-primary-region"): True,
    ("context", "owner-index"): True,
    "cross-recall-cooccurrence-eligible": True,
    ("diffusion-adjacency", 0.2, 0, 1.0): True,
    ("diffusion-adjacency-masked", 0.2, 0, 1.0, "12:abcd"): True,
    ("dedup-keys",): True,
    # importance-dependent or holding node dumps: rebuilt
    ("cooccurrence-index", 10): False,
    ("cooccurrence-columns", 10, "12:abcd"): False,
    ("owners", "snapshot"): False,
    ("result-kept",): False,
    ("result-core-order",): False,
    # look-alikes of allowed keys: a prefix matches whole key items only
    ("scoring-arrays-v2",): False,
    ("context", "owner-index-by-importance"): False,
    ("anchors",): False,
    "scoring-arrays": False,
    ("cross-recall-cooccurrence-eligible", "x"): False,
}


def _entries(snap: GraphSnapshot) -> dict[Hashable, object]:
    with _graph_cache._LOCK:
        return dict(_graph_cache._CACHE.get(snap, {}))


@pytest.fixture
def chat(store: Store) -> Store:
    store.upsert_nodes(CHAT, [node("a", title="dragon lair"), node("b", title="mountain pass")])
    return store


def _reinforce(store: Store, cache: SnapshotCache, ids: list[str]) -> GraphSnapshot:
    with store.write(CHAT) as w:
        base = w.chat_version(CHAT)
        w.reinforce(ids, NOW + 1, 0.5)
        new = w.version
    assert cache.apply_reinforcement(CHAT, "", ids, 0.5, new, base_version=base, now_ms=NOW + 1)
    return cache.get(store, CHAT, "", now_ms=NOW + 1)


def test_apply_reinforcement_carries_exactly_the_allow_listed_entries(chat: Store) -> None:
    values: dict[Hashable, object] = {}
    # Fill in two rounds (the cache holds MAX_ENTRIES_PER_SNAPSHOT entries per snapshot): the carried set of each
    # round is exactly the allowed keys of what the old snapshot held.
    keys = list(KEYS)
    for part in (keys[0::2], keys[1::2]):
        cache = SnapshotCache()
        old = cache.get(chat, CHAT, "", now_ms=NOW)
        for key in part:
            values[key] = object()
            assert cached(old, key, lambda k=key: values[k]) == (values[key], False)
        new = _reinforce(chat, cache, ["a"])
        assert new is not old and new.version == old.version + 1 and new.importance[0] == old.importance[0] + 0.5
        carried = _entries(new)
        assert set(carried) == {k for k in part if KEYS[k]}
        for key, value in carried.items():
            assert value is values[key]  # shared, not rebuilt
        assert set(_entries(old)) == set(part)  # the old snapshot keeps its own entries
        # a carried entry is a cache hit on the new snapshot; an unsafe one is built again
        hit = next(k for k in part if KEYS[k])
        miss = next(k for k in part if not KEYS[k])
        assert cached(new, hit, lambda: pytest.fail("carried entry rebuilt")) == (values[hit], True)
        assert cached(new, miss, lambda: "rebuilt") == ("rebuilt", False)


def test_allow_list_is_the_documented_one() -> None:
    """The allow-list reported to reviewers; a change to it must be deliberate (and judged key by key)."""
    assert REINFORCEMENT_SAFE_KEYS == (
        ("scoring-arrays",),
        ("lexical-fields",),
        ("anchors", "folded-index"),
        ("visibility", "index"),
        ("context", "has-primary-region"),
        ("context", "owner-index"),
        "cross-recall-cooccurrence-eligible",
        ("diffusion-adjacency",),
        ("diffusion-adjacency-masked",),
        ("dedup-keys",),
    )


def test_carry_over_keeps_the_new_snapshots_entries_and_the_bound(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, "", now_ms=NOW)
    for i in range(MAX_ENTRIES_PER_SNAPSHOT):
        cached(old, ("diffusion-adjacency", float(i)), lambda i=i: f"old-{i}")
    new = cache.get(chat, CHAT, "", now_ms=NOW)
    assert new is old  # nothing written yet
    cache.invalidate(CHAT)
    new = cache.get(chat, CHAT, "", now_ms=NOW)
    assert new is not old
    cached(new, ("diffusion-adjacency", 0.0), lambda: "new-0")
    cached(new, ("result-kept",), lambda: "kept")
    carried = carry_over(old, new)
    entries = _entries(new)
    assert len(entries) == MAX_ENTRIES_PER_SNAPSHOT
    assert entries[("diffusion-adjacency", 0.0)] == "new-0" and entries[("result-kept",)] == "kept"
    # the least recently used carried entries make room for the new snapshot's own
    assert carried == [("diffusion-adjacency", float(i)) for i in range(2, MAX_ENTRIES_PER_SNAPSHOT)]
    assert carry_over(old, new, keys=()) == []


def test_not_carried_when_the_snapshot_is_not_carried(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, "", now_ms=NOW)
    cached(old, ("scoring-arrays",), lambda: "arrays")
    with chat.write(CHAT) as w:
        base = w.chat_version(CHAT)
        w.reinforce(["a"], NOW + 1)
        new_version = w.version
    assert not cache.apply_reinforcement(CHAT, "", ["a"], 0.1, new_version, base_version=base - 1, now_ms=NOW + 1)
    rebuilt = cache.get(chat, CHAT, "", now_ms=NOW + 1)
    assert rebuilt is not old and _entries(rebuilt) == {}
