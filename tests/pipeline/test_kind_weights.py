"""Weights per node kind (memory_recall.pipeline.kind_weights) through the scoring stage: message rows score with
the ``scoring.message_*`` values, extracted rows with the reference's, and with ``message_weights`` off every row
is scored exactly as the reference."""

from __future__ import annotations

import numpy as np
import pytest
from score_helpers import NOW, candidates_for, make_graph, make_node, make_snapshot, make_state, run_scoring, settings

from memory_recall.pipeline.kernels.scoring import hybrid_score
from memory_recall.pipeline.kind_weights import kind_weights, message_rows, per_kind_hybrid
from memory_recall.pipeline.scoring import explain_row
from memory_recall.settings import load_settings

DAY = 86_400_000


def _mixed():  # type: ignore[no-untyped-def]
    nodes = [
        make_node("ev-1", "event", seq=1, created_time=NOW - 30 * DAY, title="Harbour fire", summary="The shed burnt"),
        make_node("msg:2", "message", seq=2, created_time=NOW - 30 * DAY, summary="The shed burnt last night"),
        make_node("msg:3", "message", seq=3, created_time=NOW - 30 * DAY, summary="Yes, I saw the smoke"),
    ]
    # One chain ev-1 → msg:2 → msg:3 (as prev/next links), so the neighbour carry has neighbours to read.
    chain = ["ev-1", "msg:2", "msg:3"]
    nodes = [n.model_copy(update={"prev_id": chain[i - 1] if i else None,
                                  "next_id": chain[i + 1] if i < 2 else None}) for i, n in enumerate(nodes)]
    snap = make_snapshot(make_graph(nodes))
    cands = candidates_for(snap, ["ev-1", "msg:2", "msg:3"], graph={"ev-1": 0.4},
                           vector={"ev-1": 0.6, "msg:2": 0.6, "msg:3": 0.2}, bm25={"ev-1": 0.5, "msg:2": 0.5})
    return snap, cands


def test_kind_weights_follow_the_switch() -> None:
    ref = settings()
    assert kind_weights(ref.scoring, ref.lexical, message=True) == kind_weights(ref.scoring, ref.lexical, message=False)
    on = settings(scoring={"message_weights": True})
    msg = kind_weights(on.scoring, on.lexical, message=True)
    assert (msg.raw, msg.field_match, msg.time_decay, msg.neighbour_carry) == ((0.6, 3.0, 5.0, 0.1), 0.0, False, 0.7)
    off_boost = settings(scoring={"message_weights": True}, lexical={"enable_lexical_boost": False})
    assert kind_weights(off_boost.scoring, off_boost.lexical, message=True).lexical == 0.0


def test_per_kind_hybrid_scores_each_row_with_its_kind() -> None:
    g, v, lx, imp = (np.array([0.4, 0.0, 0.0]), np.array([0.6, 0.6, 0.2]), np.array([0.5, 0.5, 0.0]),
                     np.array([5.0, 5.0, 5.0]))
    created = np.full(3, NOW - 30 * DAY, dtype=np.float64)
    on = settings(scoring={"message_weights": True})
    ref_w = kind_weights(on.scoring, on.lexical, message=False)
    msg_w = kind_weights(on.scoring, on.lexical, message=True)
    hp = per_kind_hybrid(g, v, lx, imp, created, NOW, np.array([False, True, True]), ref_w, msg_w)
    ref = hybrid_score(g[:1], v[:1], lx[:1], imp[:1], created[:1], NOW, 0.6, 0.3, 0.1, 0.18)
    msg = hybrid_score(g[1:], v[1:], lx[1:], imp[1:], np.full(2, np.nan), NOW, 0.6, 3.0, 0.1, 5.0)
    assert hp.score.tolist() == [*ref.score.tolist(), *msg.score.tolist()]
    assert hp.decay[0] < 1.0 and hp.decay[1:].tolist() == [1.0, 1.0]  # message rows: no time decay
    assert hp.stacked is not None and hp.stacked.sum(axis=0) == pytest.approx(hp.score, rel=1e-15)


def test_off_is_bit_for_bit_the_reference() -> None:
    snap, cands = _mixed()
    assert message_rows(snap, np.arange(3), settings().scoring) is None
    base = run_scoring(make_state(snap, "shed fire", candidates=cands), settings()).state.scored
    # The per-kind values do not matter while the switch is off.
    other = settings(scoring={"message_vector_weight": 9.0, "message_lexical_weight": 0.0})
    again = run_scoring(make_state(snap, "shed fire", candidates=cands), other).state.scored
    assert base.index.tolist() == again.index.tolist()
    assert base.weighted_score.tolist() == again.weighted_score.tolist()
    assert base.final_score.tolist() == again.final_score.tolist()


def test_mixed_rows_scored_by_kind_and_explained_with_their_weights() -> None:
    snap, cands = _mixed()
    on = settings(scoring={"message_weights": True})
    result = run_scoring(make_state(snap, "shed fire", candidates=cands), on)
    table = result.state.scored
    assert result.trace.notes["message_rows"] == 2
    by_id = {snap.ids[i]: r for r, i in enumerate(table.index.tolist())}
    # The event keeps the reference's decayed score; the message turns have decay 1 and the message weights.
    assert table.decay[by_id["ev-1"]] < 1.0 and table.decay[by_id["msg:2"]] == 1.0
    # msg:3 inherits 0.7 of msg:2's vector and lexical evidence (neighbour carry of message rows only).
    assert table.vector_score[by_id["msg:3"]] == pytest.approx(0.7 * 0.6)
    assert table.lexical_score[by_id["msg:3"]] == pytest.approx(0.7 * 0.5)
    assert table.vector_score[by_id["ev-1"]] == 0.6  # the event carries nothing from msg:2 (reference: no carry)
    for node_id, raw in (("ev-1", (0.6, 0.3, 0.18, 0.1)), ("msg:2", (0.6, 3.0, 5.0, 0.1))):
        expl = explain_row(snap, table, by_id[node_id], on.scoring, on.lexical)
        assert sum(p.contribution for p in expl.parts) == pytest.approx(float(table.weighted_score[by_id[node_id]]))
        # The graph part of a message row has value 0: its weight is the kind's raw weight over the kind's sum.
        if node_id == "msg:2":
            graph = next(p for p in expl.parts if p.name == "graph")
            assert graph.value == 0.0
            assert graph.weight == pytest.approx(raw[0] / sum(raw) * float(np.prod(list(expl.multipliers.values()))))


def test_the_default_profile_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMORY_RECALL_PROFILE", "MEMORY_RECALL_CONFIG", "MEMORY_RECALL_SCORING__MESSAGE_WEIGHTS"):
        monkeypatch.delenv(name, raising=False)
    assert load_settings().scoring.message_weights is True
    assert load_settings(profile="app").scoring.message_weights is False
