"""CooccurrenceStage (reference §3.11): scenario 18 (boost values and the index sources), anchor weights,
neighbour limits, visibility (departure 2), the per-snapshot index cache (departure 11), skips and the stage
contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
from graph_helpers import (
    candidate_table,
    graph,
    make_state,
    node,
    result_fingerprint,
    snapshot,
    state_fingerprint,
)

from memory_recall.pipeline.cooccurrence import CooccurrenceStage, cooccurrence_index
from memory_recall.pipeline.kernels.cooccurrence import SOURCE_BATCH_JOURNAL, SOURCE_SEQ_RANGE
from memory_recall.settings import CooccurrenceSettings

ON = CooccurrenceSettings(enabled=True)


def _scenario_18_graph(extra=()):
    # Batches [1,1], [2,2], [3,3]: a and x share all three, a and y only the last → counts x 3, y 1.
    nodes = [
        node("a", "character", name="Alice", seq=1, seq_range=(1, 3)),
        node("x", "location", name="Garden", seq=1, seq_range=(1, 3)),
        node("y", "location", name="Tower", seq=3),
        *extra,
    ]
    return graph(nodes, journal=[(1, 1), (2, 2), (3, 3)])


def _run(state, settings=ON):
    return CooccurrenceStage(settings).run(state)


class TestScenario18Boost:
    def test_scenario_18_values(self) -> None:
        """Base {x: 0.1}, anchor a weight 2, neighbours [(x, 3), (y, 1)], scale 0.1 →
        x = 0.1 + 2·ln4·0.1 = 0.377259, y = 0.138629 (new entry, appended)."""
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"], candidates=[("x", 0.1, 0.0)])
        out = _run(state)
        table = candidate_table(out.state)
        assert [row[0] for row in table] == ["x", "y"]
        assert table[0][1] == pytest.approx(0.377259, abs=1e-6)
        assert table[1][1] == pytest.approx(0.138629, abs=1e-6)
        assert table[0][5] == pytest.approx(2 * math.log(4) * 0.1)
        assert table[1][2:5] == (0.0, 0.0, 0.0)
        assert out.state.meta["cooccurrenceBoostedNodes"] == 2
        assert out.trace.notes["source"] == SOURCE_BATCH_JOURNAL
        assert out.trace.notes["batchCount"] == 3
        assert out.trace.notes["newCandidates"] == 1

    def test_scenario_18_index_batch_journal(self) -> None:
        """Repo test: rules A [1,2], B [2,3], a location [2,2]; journal [[2,2]] → batchJournal, 1 batch,
        A↔B paired; an event in the batch is not eligible."""
        nodes = [
            node("A", "rule", title="Rule A", seq=1, seq_range=(1, 2)),
            node("B", "rule", title="Rule B", seq=2, seq_range=(2, 3)),
            node("L", "location", name="Place", seq=2),
            node("E", "event", title="Event", seq=2),
        ]
        snap = snapshot(graph(nodes, journal=[(2, 2)]))
        index, _ = cooccurrence_index(snap)
        assert (index.source, index.batch_count) == (SOURCE_BATCH_JOURNAL, 1)
        dense = index.counts.toarray()
        a, b, e = snap.index["A"], snap.index["B"], snap.index["E"]
        assert dense[a, b] == dense[b, a] == 1.0
        assert dense[e].sum() == 0

    def test_scenario_18_index_seq_range_fallback(self) -> None:
        nodes = [
            node("A", "rule", title="Rule A", seq=1, seq_range=(1, 2)),
            node("B", "rule", title="Rule B", seq=2, seq_range=(2, 3)),
        ]
        snap = snapshot(graph(nodes))
        index, _ = cooccurrence_index(snap)
        assert index.source == SOURCE_SEQ_RANGE
        assert index.counts.toarray()[snap.index["A"], snap.index["B"]] == 1.0


class TestAnchorWeights:
    def test_supplemental_weight_vector_then_graph_then_default(self) -> None:
        """Supplemental anchors weigh ``vector_score or graph_score or 0.5`` (reference §3.11)."""
        nodes = [
            node("s1", "character", name="S one", seq=5),
            node("s2", "character", name="S two", seq=6),
            node("s3", "character", name="S three", seq=7),
            node("t1", "location", name="T one", seq=5),
            node("t2", "location", name="T two", seq=6),
            node("t3", "location", name="T three", seq=7),
        ]
        g = graph(nodes, journal=[(5, 5), (6, 6), (7, 7)])
        state = make_state(
            g, "q", supplemental=["s1", "s2", "s3"], candidates=[("s1", 0.9, 0.4), ("s2", 0.8, 0.0)]
        )
        out = _run(state)
        boost = {row[0]: row[5] for row in candidate_table(out.state)}
        ln2 = math.log(2) * 0.1
        assert boost["t1"] == pytest.approx(0.4 * ln2)
        assert boost["t2"] == pytest.approx(0.8 * ln2)
        assert boost["t3"] == pytest.approx(0.5 * ln2)
        assert [row[0] for row in candidate_table(out.state)] == ["s1", "s2", "t1", "t2", "t3"]

    def test_exact_anchor_weight_is_2(self) -> None:
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"])
        table = {row[0]: row[1] for row in candidate_table(_run(state).state)}
        assert table == pytest.approx({"x": 2 * math.log(4) * 0.1, "y": 2 * math.log(2) * 0.1})

    def test_boosts_of_several_anchors_add_up(self) -> None:
        state = make_state(_scenario_18_graph(), "q", anchors=["a"], supplemental=["x"])
        table = {row[0]: row[5] for row in candidate_table(_run(state).state)}
        # x (supplemental, no score → 0.5) boosts a (count 3) and y (count 1); a boosts x and y.
        assert table["y"] == pytest.approx((2.0 + 0.5) * math.log(2) * 0.1)
        assert table["a"] == pytest.approx(0.5 * math.log(4) * 0.1)


class TestNeighbourLimitAndVisibility:
    def test_max_neighbors(self) -> None:
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"])
        out = _run(state, CooccurrenceSettings(enabled=True, max_neighbors=1))
        assert [row[0] for row in candidate_table(out.state)] == ["x"]

    def test_hidden_neighbour_neither_boosted_nor_taking_a_slot(self) -> None:
        """Departure 2: x (count 3) is hidden, so with one neighbour slot y is boosted instead."""
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"], hidden=["x"])
        out = _run(state, CooccurrenceSettings(enabled=True, max_neighbors=1))
        assert [row[0] for row in candidate_table(out.state)] == ["y"]

    def test_hidden_anchor_is_ignored(self) -> None:
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"], hidden=["a"])
        assert _run(state).trace.skip_reason == "cooccurrence-no-anchor"

    def test_inactive_neighbour_not_boosted(self) -> None:
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"], active=["a", "y"])
        assert [row[0] for row in candidate_table(_run(state).state)] == ["y"]


class TestIndexCache:
    def test_index_built_once_per_snapshot(self) -> None:
        snap = snapshot(_scenario_18_graph())
        state = make_state(snap, "Alice", anchors=["a"])
        first, second = _run(state), _run(state)
        assert first.trace.notes["indexCached"] is False
        assert second.trace.notes["indexCached"] is True
        i1, _ = cooccurrence_index(snap)
        i2, hit = cooccurrence_index(snap)
        assert i1 is i2 and hit
        assert cooccurrence_index(snap, 2)[0] is not i1  # keyed by the batch size


class TestSkips:
    def test_disabled_leaves_state_unchanged(self) -> None:
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"])
        out = _run(state, CooccurrenceSettings())
        assert out.state is state
        assert out.trace.skipped and out.trace.skip_reason == "cooccurrence-disabled"

    def test_no_anchor(self) -> None:
        out = _run(make_state(_scenario_18_graph(), "q", candidates=[("x", 0.1, 0.0)]))
        assert out.trace.skip_reason == "cooccurrence-no-anchor"
        assert out.state.skip_reasons == ("cooccurrence-no-anchor",)
        assert candidate_table(out.state) == [("x", 0.1, 0.0, 0.0, 0.0, 0.0)]

    def test_no_neighbors(self) -> None:
        g = graph([node("a", "character", name="Alice", seq=1), node("b", "character", name="Bob", seq=9)])
        out = _run(make_state(g, "Alice", anchors=["a"]))
        assert out.trace.skip_reason == "cooccurrence-no-neighbors"
        assert out.state.skip_reasons == ("cooccurrence-no-neighbors",)

    def test_ineligible_exact_anchor_has_no_neighbors(self) -> None:
        g = graph(
            [node("e", "event", title="Duel", seq=1), node("b", "character", name="Bob", seq=1)],
            journal=[(1, 1)],
        )
        assert _run(make_state(g, "Duel", anchors=["e"])).trace.skip_reason == "cooccurrence-no-neighbors"


class TestContract:
    def test_empty_graph(self) -> None:
        out = _run(make_state(graph([]), "q"))
        assert out.trace.skipped and out.trace.skip_reason == "cooccurrence-no-anchor"

    def test_input_not_mutated(self) -> None:
        state = make_state(
            _scenario_18_graph(), "Alice", anchors=["a"], supplemental=["y"], candidates=[("x", 0.1, 0.2)],
            hidden=["y"],
        )
        before = state_fingerprint(state)
        _run(state)
        assert state_fingerprint(state) == before

    def test_deterministic(self) -> None:
        state = make_state(_scenario_18_graph(), "Alice", anchors=["a"], candidates=[("x", 0.1, 0.0)])
        a, b = _run(state), _run(state)
        assert result_fingerprint(a.state) == result_fingerprint(b.state)

    def test_trace(self) -> None:
        out = _run(make_state(_scenario_18_graph(), "Alice", anchors=["a"]))
        assert out.trace.name == "cooccurrence"
        assert (out.trace.count_in, out.trace.count_out) == (1, 2)
        assert out.trace.score_direction == "higher_is_better"
        assert np.all(out.state.candidates.graph_score > 0)
