"""Admission of late additions (recall-spec departure 2): the suppressed lists the earlier stages record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from e2e_helpers import edge, graph, node, scored_state, snapshot

from memory_recall.model.graph import MemoryScope, Node
from memory_recall.model.state import KnowledgeOwner, KnowledgeState
from memory_recall.pipeline import _admission
from memory_recall.pipeline._admission import admissible, ids_to_index, suppressed_mask_for
from memory_recall.pipeline.state import ContextInfo
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache, build_snapshot


def state_with(meta):
    g = graph(
        [node("ev-0", "event", seq=0), node("ev-1", "event", seq=1), node("loc", "location", seq=1, name="L"),
         node("char", "character", seq=1, name="C")],
        [edge("ev-0", "loc"), edge("ev-1", "char")],
    )
    snap = snapshot(g)
    return scored_state(snap, [(i, 0.1) for i in snap.ids], meta=meta)


def admitted(state):
    idx = np.arange(state.snapshot.n, dtype=np.int64)
    return [state.snapshot.ids[i] for i in idx[admissible(state, idx)].tolist()]


def test_listed_ids_are_suppressed_and_odd_entries_ignored():
    """Unknown ids, non-strings and unhashable entries in the recorded lists name no node; repeats are harmless."""
    meta = {"gate_suppressed": ["loc", "nope", 3, None, "loc"], "temporalSuppressedNodes": ["ev-1", ["ev-0"]]}
    state = state_with(meta)
    assert admitted(state) == ["ev-0", "char"]
    idx = np.arange(state.snapshot.n, dtype=np.int64)
    assert suppressed_mask_for(state, idx).tolist() == [False, True, True, False]
    assert ids_to_index(state, meta["gate_suppressed"]).tolist() == [state.snapshot.index["loc"]]


def test_a_one_shot_iterable_with_an_unhashable_entry_still_counts_every_id():
    state = state_with({"temporalSuppressedNodes": (x for x in ["ev-1", ["ev-0"], "char"])})
    idx = np.arange(state.snapshot.n, dtype=np.int64)
    assert suppressed_mask_for(state, idx).tolist() == [False, True, False, True]


def test_hidden_mask_joins_the_lists_without_being_modified():
    hidden = np.zeros(4, dtype=bool)
    hidden[3] = True
    state = state_with({"visibility_hidden_mask": hidden, "gate_suppressed": ["ev-0"], "temporalSuppressedNodes": None})
    assert admitted(state) == ["ev-1", "loc"]
    assert hidden.tolist() == [False, False, False, True]


def test_nothing_recorded_admits_every_scored_active_node():
    assert admitted(state_with(None)) == ["ev-0", "ev-1", "loc", "char"]


# --- verdicts carried over a real append (per-structure update) ---------------------------------------------

_CHAT, _NOW = "adm", 1_700_000_000_000


def _node(i: int, prev: str | None) -> Node:
    kind = ("event", "pov_memory", "location", "message")[i % 4]
    scope = MemoryScope(region_primary=f"Region {i % 3}")
    if kind == "pov_memory":
        scope = MemoryScope(layer="pov", owner_type="character", owner_name="Erin" if i % 3 else "Bob")
    return Node(id=f"n{i:03d}", type=kind, seq=i, importance=1.0, prev_id=prev, scope=scope,
                fields={"title": f"scene {i}", "summary": f"text {i}"}, seq_range=(i, i + 1),
                story_time={"segment_id": f"seg-{i % 3}", "tense": "future" if i % 7 == 0 else "past"})


def _knowledge(known: list[str]) -> KnowledgeState:
    return KnowledgeState(owners={"character:erin": KnowledgeOwner(
        owner_key="character:erin", owner_type="character", owner_name="Erin", known_node_ids=known,
        manual_hidden_node_ids=["n005"], visibility_scores={"n008": 0.7, "n010": 0.3})})


def _store(path: Path) -> Store:
    store = Store(path)
    with store.write(_CHAT) as w:
        w.upsert_nodes([_node(i, f"n{i - 1:03d}" if i else None) for i in range(16)])
        w.set_knowledge(_knowledge(["n000", "n004"]))
    return store


_CTX = ContextInfo(owner_keys=("character:erin",), active_region="region 1")


def _verdict(snap: GraphSnapshot, idx: np.ndarray) -> list[bool]:
    return admissible(scored_state(snap, [], context=_CTX), idx).tolist()


def _fresh(store: Store) -> GraphSnapshot:
    return build_snapshot(store.snapshot_source(_CHAT, ""), now_ms=_NOW)


class TestCarriedVerdicts:
    def test_an_append_carries_every_scene_of_the_parent(self, tmp_path: Path) -> None:
        with _store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _CHAT, "", now_ms=_NOW)
            _verdict(first, np.arange(0, first.n, 2))
            other = dataclasses.replace(_CTX, active_region="region 2")
            admissible(scored_state(first, [], context=other), np.arange(first.n))
            parent = dict(_admission._scenes(first))
            assert len(parent) == 2
            with store.write(_CHAT) as w:
                w.upsert_nodes([_node(16, "n015")])
            snap = cache.get(store, _CHAT, "", now_ms=_NOW)
            assert snap.structure.parent is first.structure and snap.structure.change.appended_only
            _admission._verdicts(snap, next(iter(parent)))
            carried = _admission._scenes(snap)
            assert set(carried) == set(parent)  # both scenes
            for key, old in parent.items():
                assert carried[key].tolist() == [*old.tolist(), -1]
            every = np.arange(snap.n)
            assert _verdict(snap, every) == _verdict(_fresh(store), every)

    def test_a_state_write_carries_nothing(self, tmp_path: Path) -> None:
        with _store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _CHAT, "", now_ms=_NOW)
            every = np.arange(first.n)
            before = _verdict(first, every)
            with store.write(_CHAT) as w:  # n004 is no longer known: its verdict changes
                w.set_knowledge(_knowledge(["n000"]))
            snap = cache.get(store, _CHAT, "", now_ms=_NOW)
            assert snap.structure.parent is first.structure and snap.structure.change.state_changed
            key = next(iter(_admission._scenes(first)))
            assert (_admission._verdicts(snap, key) == -1).all()
            after = _verdict(snap, every)
            assert after == _verdict(_fresh(store), every) and after != before

    def test_a_rewritten_node_is_judged_again(self, tmp_path: Path) -> None:
        with _store(tmp_path / "s.sqlite3") as store:
            cache = SnapshotCache()
            first = cache.get(store, _CHAT, "", now_ms=_NOW)
            every = np.arange(first.n)
            _verdict(first, every)
            with store.write(_CHAT) as w:  # n001 (Erin's own POV) becomes Bob's
                w.upsert_nodes([_node(1, "n000").model_copy(update={"scope": MemoryScope(
                    layer="pov", owner_type="character", owner_name="Bob")})])
            snap = cache.get(store, _CHAT, "", now_ms=_NOW)
            key = next(iter(_admission._scenes(first)))
            carried = _admission._verdicts(snap, key)
            assert carried[snap.structure.change.rewritten].tolist() == [-1]
            assert _verdict(snap, every) == _verdict(_fresh(store), every)
