"""Structure apart from statistics: a reinforcement write gives the chat a snapshot with a new statistics overlay
and the same structure, so every structure-keyed cache survives it with no carry-over; what reads the overlay
(``cached_stats``) is built again and equals a fresh build."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pytest
from store_helpers import edge, node

from memory_recall.model.graph import Node
from memory_recall.pipeline import _admission, _graph_cache, owners, result
from memory_recall.pipeline._graph_cache import cached, cached_stats
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache

CHAT = "overlay"
NOW = 1_700_000_000_000


def _entries(owner: object) -> dict[Hashable, object]:
    with _graph_cache._LOCK:
        return dict(_graph_cache._CACHE.get(owner, {}))


@pytest.fixture
def chat(store: Store) -> Store:
    store.upsert_nodes(CHAT, [node("a", title="dragon lair"), node("b", title="mountain pass")])
    return store


def _reinforce(store: Store, cache: SnapshotCache, ids: list[str], *, tell_cache: bool) -> GraphSnapshot:
    with store.write(CHAT) as w:
        base = w.chat_version(CHAT)
        w.reinforce(ids, NOW + 1, 0.5)
        new = w.version
    if tell_cache:  # the controller's path
        assert cache.apply_reinforcement(CHAT, "", ids, 0.5, new, base_version=base, now_ms=NOW + 1)
    return cache.get(store, CHAT, "", now_ms=NOW + 1)


@pytest.mark.parametrize("tell_cache", [True, False])
def test_reinforcement_keeps_the_structure_and_its_caches(chat: Store, tell_cache: bool) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, "", now_ms=NOW)
    structural, per_stats = object(), object()
    assert cached(old, ("scoring-arrays",), lambda: structural) == (structural, False)
    assert cached_stats(old, ("result-core-order",), lambda: per_stats) == (per_stats, False)
    new = _reinforce(chat, cache, ["a"], tell_cache=tell_cache)
    assert cache.last_update[CHAT] == ("cached" if tell_cache else "stats")
    assert new is not old and new.structure is old.structure and new.version == old.version + 1
    assert new.importance[0] == old.importance[0] + 0.5 and old.importance[0] == 5.0  # the old overlay is kept
    assert cached(new, ("scoring-arrays",), lambda: pytest.fail("structure cache rebuilt")) == (structural, True)
    assert cached_stats(new, ("result-core-order",), lambda: "rebuilt") == ("rebuilt", False)
    assert set(_entries(new.structure)) == {("scoring-arrays",)}
    # The node reflects the overlay and equals the stored node; the old snapshot's node is unchanged.
    assert new.node(0) == chat.get_node(CHAT, "a") and new.node(0).access_count == 1
    assert old.node(0).access_count == 0


def test_a_graph_write_makes_a_new_structure(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, "", now_ms=NOW)
    cached(old, ("scoring-arrays",), lambda: "arrays")
    chat.upsert_nodes(CHAT, [node("c", title="river ford")])
    new = cache.get(chat, CHAT, "", now_ms=NOW)
    assert cache.last_update[CHAT] == "delta" and new.structure is not old.structure
    assert _entries(new.structure) == {} and _entries(old.structure) == {("scoring-arrays",): "arrays"}


def test_module_tables_are_shared_by_the_structure(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, "", now_ms=NOW)
    memo = owners._memo(old)
    verdicts = _admission._verdicts(old, "scene")
    owners._participant_memo(old)["row"] = ("contribution",)
    kept = result._kept(old)
    dumps = result._dumps_memo(old)
    new = _reinforce(chat, cache, ["a"], tell_cache=True)
    assert owners._memo(new) is memo and result._kept(new) is kept
    assert _admission._verdicts(new, "scene") is verdicts
    assert owners._participant_memo(new) == {"row": ("contribution",)}
    assert result._dumps_memo(new) is not dumps  # node dumps hold access_count: per overlay


TIES = "ties"


@pytest.mark.parametrize("tell_cache", [True, False])
def test_importance_ordered_values_equal_fresh_builds_when_reinforcement_reorders_ties(
    store: Store, tell_cache: bool
) -> None:
    """Three events tied on recency, ordered by importance: reinforcing the least important one (step 5) moves it
    first. The structure's walk lists are shared; the importance-ordered ones ("pov"/"entity", the core order)
    are built again and equal a fresh build, and differ from the old order."""
    store.upsert_nodes(
        TIES,
        [
            Node(id="hub", type="character", fields={"name": "Hub"}, seq=1),
            *(Node(id=f"e{k}", type="event", fields={"title": f"event {k}"}, seq=5, importance=float(k))
              for k in (1, 2, 3)),
        ],
    )
    store.upsert_edges(TIES, [edge(f"x{k}", "hub", f"e{k}") for k in (1, 2, 3)])
    cache = SnapshotCache()
    old = cache.get(store, TIES, "", now_ms=NOW)
    hub, e1 = old.index["hub"], old.index["e1"]
    memo = owners._memo(old)
    lists = {(kind, i): owners._walk_list(old, memo, kind, i) for kind, i in
             (("pov", hub), ("entity", hub), ("event", e1), ("near", e1))}
    old_core = result._core_order(old)[0].tolist()
    assert [old.ids[i] for i in lists[("pov", hub)]] == ["e3", "e2", "e1"]

    with store.write(TIES) as w:
        base = w.chat_version(TIES)
        w.reinforce(["e1"], NOW + 1, 5.0)
        version = w.version
    if tell_cache:
        assert cache.apply_reinforcement(TIES, "", ["e1"], 5.0, version, base_version=base, now_ms=NOW + 1)
    carried = cache.get(store, TIES, "", now_ms=NOW + 1)
    fresh = SnapshotCache().get(store, TIES, "", now_ms=NOW + 1)
    assert carried.structure is old.structure and fresh.version == carried.version == version

    carried_memo = owners._memo(carried)
    assert carried_memo is memo and set(memo.walk) == {("event", e1), ("near", e1)}
    fresh_memo = owners._SnapshotMemo(fresh)
    for key in lists:
        assert owners._walk_list(carried, carried_memo, *key) == owners._walk_list(fresh, fresh_memo, *key)
    assert [carried.ids[i] for i in owners._walk_list(carried, carried_memo, "pov", hub)] == ["e1", "e3", "e2"]
    assert owners._walk_list(carried, carried_memo, "entity", hub) != lists[("entity", hub)]
    core = result._core_order(carried)[0].tolist()
    assert core == result._core_order(fresh)[0].tolist() != old_core
    assert np.array_equal(carried.importance, fresh.importance)
