"""Turn context (memory_recall.pipeline.turn_context): a chat turn is matched with the turns around it."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from score_helpers import make_graph, make_node, make_snapshot

from memory_recall.model.state import MemoryGraph
from memory_recall.pipeline.lexical import LexicalStage
from memory_recall.pipeline.state import Providers, QueryPlan
from memory_recall.pipeline.turn_context import turn_neighbours, with_turn_context
from memory_recall.settings import LexicalSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import build_snapshot


def _linked(node_id: str, type_: str, prev: str | None, nxt: str | None, **fields: str):  # type: ignore[no-untyped-def]
    return make_node(node_id, type_, **fields).model_copy(update={"prev_id": prev, "next_id": nxt})


def _chain():  # type: ignore[no-untyped-def]
    """Three turns (the last one's ``next`` is an event) and an event chain of two."""
    return [
        _linked("msg:1", "message", None, "msg:2", summary="We adopted two turtles."),
        _linked("msg:2", "message", "msg:1", "msg:3", summary="How lovely! Do you hold them?"),
        _linked("msg:3", "message", "msg:2", "ev-1", summary="Yes, I like holding them."),
        _linked("ev-1", "event", None, "ev-2", summary="Nate adopts turtles"),
        _linked("ev-2", "event", "ev-1", None, summary="Nate bathes the turtles"),
    ]


def _scores(snap, values):  # type: ignore[no-untyped-def]
    out = np.zeros(snap.n)
    for node_id, value in values.items():
        out[snap.index[node_id]] = value
    return out


def test_weighted_mean_with_message_neighbours_only() -> None:
    snap = make_snapshot(make_graph(_chain()))
    s = _scores(snap, {"msg:1": 1.0, "msg:2": 0.0, "msg:3": 0.5, "ev-1": 0.2, "ev-2": 0.4})
    before = s.copy()
    out = with_turn_context(s, snap, 0.5, 0.2)
    got = {node_id: out[snap.index[node_id]] for node_id in snap.ids}
    assert got["msg:1"] == pytest.approx((1.0 + 0.2 * 0.0) / 1.2, rel=1e-15)
    assert got["msg:2"] == pytest.approx((0.0 + 0.5 * 1.0 + 0.2 * 0.5) / 1.7, rel=1e-15)
    assert got["msg:3"] == pytest.approx((0.5 + 0.5 * 0.0) / 1.5, rel=1e-15)  # its next is an event: not mixed
    assert (got["ev-1"], got["ev-2"]) == (0.2, 0.4)  # extracted memories keep their scores bit for bit
    assert np.array_equal(s, before)  # the input is not mutated


def test_rows_of_a_query_matrix_are_mixed_alone_and_zero_weights_change_nothing() -> None:
    snap = make_snapshot(make_graph(_chain()))
    a = _scores(snap, {"msg:1": 1.0, "msg:3": 0.5})
    b = _scores(snap, {"msg:2": 0.3, "ev-2": 0.9})
    both = with_turn_context(np.stack([a, b]).astype(np.float32), snap, 0.5, 0.2)
    assert both.dtype == np.float32
    assert np.array_equal(both[0], with_turn_context(a.astype(np.float32), snap, 0.5, 0.2))
    assert np.array_equal(both[1], with_turn_context(b.astype(np.float32), snap, 0.5, 0.2))
    assert with_turn_context(a, snap, 0.0, 0.0) is a
    pairs = turn_neighbours(snap)
    assert [snap.ids[i] for i in pairs.prev_rows] == ["msg:2", "msg:3"]
    assert [snap.ids[i] for i in pairs.next_rows] == ["msg:1", "msg:2"]


def test_bm25_hit_lifts_the_reply_that_shares_no_word_with_the_query(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(tmp_path / "store.sqlite3")
    try:
        store.replace_graph("c", MemoryGraph(nodes=tuple(_chain())))
        snap = build_snapshot(store.snapshot_source("c", ""), now_ms=0)
        providers = Providers(lexical_index=partial(store.bm25, "c"))
        from ctx_helpers import make_state

        state = make_state(snap, "adopted turtles").evolve(plan=QueryPlan(lexical_sources=("adopted turtles",)))
        plain = LexicalStage(LexicalSettings(), providers).run(state).state
        result = LexicalStage(LexicalSettings(turn_context_previous=0.5, turn_context_next=0.2), providers).run(state)
        mixed, trace = result.state, result.trace
        plain_ids = [snap.ids[i] for i in plain.bm25_hits[0]]
        mixed_ids = [snap.ids[i] for i in mixed.bm25_hits[0]]
        # "How lovely! Do you hold them?" shares no query word: a hit only with its previous turn's context.
        assert plain_ids == ["msg:1", "ev-1", "ev-2"]
        assert mixed_ids == ["msg:1", "msg:2", "ev-1", "ev-2"]
        plain_s, mixed_s = plain.bm25_hits[1].tolist(), mixed.bm25_hits[1].tolist()
        best = plain_s[0] / 1.2  # msg:1 with its (missing) next-turn score, then best-relative again
        assert mixed_s[0] == 1.0
        assert mixed_s[1] == pytest.approx((0.5 * plain_s[0] / 1.7) / best, rel=1e-12)
        assert mixed_s[2:] == pytest.approx([plain_s[1] / best, plain_s[2] / best], rel=1e-12)  # events unmixed
        assert trace.notes["turnContextHits"] == len(mixed_ids)
    finally:
        store.close()
