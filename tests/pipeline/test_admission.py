"""Admission of late additions (recall-spec departure 2): the suppressed lists the earlier stages record."""

from __future__ import annotations

import numpy as np
from e2e_helpers import edge, graph, node, scored_state, snapshot

from memory_recall.pipeline._admission import admissible, ids_to_index, suppressed_mask_for


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
