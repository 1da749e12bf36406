"""Per-snapshot derived caches carried over access reinforcement: exactly the allow-listed keys, shared values."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from store_helpers import edge, node

from memory_recall.model.graph import Node
from memory_recall.pipeline import _admission, _graph_cache, owners, result, scoring
from memory_recall.pipeline._graph_cache import (
    MAX_ENTRIES_PER_SNAPSHOT,
    REINFORCEMENT_DERIVED,
    REINFORCEMENT_SAFE_KEYS,
    cached,
    carry_over,
)
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
    # importance-dependent: rebuilt
    ("cooccurrence-index", 10): False,
    ("cooccurrence-columns", 10, "12:abcd"): False,
    ("result-core-order",): False,
    # carried only in part by a derive function, which carries nothing of a value that is not its own type
    ("owners", "snapshot"): False,
    ("result-kept",): False,
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


def test_derived_keys_are_the_documented_ones() -> None:
    assert set(REINFORCEMENT_DERIVED) == {("owners", "snapshot"), ("result-kept",)}


def test_apply_reinforcement_carries_the_derived_entries_and_weak_tables(chat: Store) -> None:
    cache = SnapshotCache()
    old = cache.get(chat, CHAT, "", now_ms=NOW)
    memo = owners._memo(old)
    memo.walk[("event", 0)] = (1,)
    memo.walk[("near", 0)] = ((1,), True)
    memo.walk[("pov", 0)] = (1,)
    memo.walk[("entity", 1)] = (0,)
    memo.scene("scene")[0][0] = "objectiveGlobal"
    kept = result._kept(old)
    kept.nodes[0] = ({"id": "a", "access_count": 0}, "dragon lair")
    kept.omitted[(1, "cap")] = result.OmittedNode(node_id="b", reason="cap")
    verdicts = _admission._verdicts(old, "scene")
    with scoring._SCENES_LOCK:
        scoring._SCENES[old] = {"scene": "codes"}  # type: ignore[dict-item]
    participants = owners._participant_memo(old)
    participants["row"] = ("contribution",)

    new = _reinforce(chat, cache, ["a"])
    carried = _entries(new)
    assert set(carried) == {("owners", "snapshot"), ("result-kept",)}
    new_memo = carried[("owners", "snapshot")]
    assert isinstance(new_memo, owners._SnapshotMemo) and new_memo is not memo
    assert new_memo.walk == {("event", 0): (1,), ("near", 0): ((1,), True)}  # not the importance-ordered ones
    assert new_memo.types is memo.types and new_memo.pov_owner is memo.pov_owner
    assert new_memo.scenes is not memo.scenes and new_memo.scenes["scene"] is memo.scenes["scene"]
    new_kept = carried[("result-kept",)]
    assert isinstance(new_kept, result._Kept) and new_kept.nodes == {}  # node dumps hold access_count
    assert new_kept.omitted is kept.omitted and new_kept.priority is kept.priority
    with _admission._VERDICTS_LOCK:
        assert _admission._VERDICTS[new] is not _admission._VERDICTS[old]
        assert _admission._VERDICTS[new]["scene"] is verdicts
    with scoring._SCENES_LOCK:
        assert scoring._SCENES[new] == {"scene": "codes"} and scoring._SCENES[new] is not scoring._SCENES[old]
    assert owners._participant_memo(new) == {"row": ("contribution",)}


TIES = "ties"


def test_carried_entries_equal_fresh_builds_when_reinforcement_reorders_ties(store: Store) -> None:
    """Three events tied on recency, ordered by importance: reinforcing the least important one (step 5) moves it
    first. What is carried must still equal a fresh build at the new version; what is ordered by importance (the
    "pov"/"entity" walk lists, the core order) is rebuilt, and the rebuilt order differs from the old one."""
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
    assert cache.apply_reinforcement(TIES, "", ["e1"], 5.0, version, base_version=base, now_ms=NOW + 1)
    carried = cache.get(store, TIES, "", now_ms=NOW + 1)
    fresh = SnapshotCache().get(store, TIES, "", now_ms=NOW + 1)
    assert carried is not old and fresh.version == carried.version == version

    carried_memo = owners._memo(carried)
    fresh_memo = owners._SnapshotMemo(fresh)
    assert set(carried_memo.walk) == {("event", e1), ("near", e1)}
    for key in lists:
        assert owners._walk_list(carried, carried_memo, *key) == owners._walk_list(fresh, fresh_memo, *key)
    assert [carried.ids[i] for i in owners._walk_list(carried, carried_memo, "pov", hub)] == ["e1", "e3", "e2"]
    assert owners._walk_list(carried, carried_memo, "entity", hub) != lists[("entity", hub)]
    core = result._core_order(carried)[0].tolist()
    assert core == result._core_order(fresh)[0].tolist() != old_core
