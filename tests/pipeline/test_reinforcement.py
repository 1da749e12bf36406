"""Reinforcement stage (reference §1.9, scenario 39's pure part): which nodes the controller reinforces."""

from __future__ import annotations

from e2e_helpers import deep_freeze, graph, ids_of, node, scored_state, snapshot, trace_key

from memory_recall.pipeline.reinforcement import ReinforcementStage
from memory_recall.settings import ReinforcementSettings


def state(selection, probabilistic=()):
    snap = snapshot(graph([node(f"n{k}", importance=5 + k) for k in range(5)]))
    return scored_state(snap, [(i, 0.1) for i in selection], selection=list(selection),
                        probabilistic=list(probabilistic))


class TestScenario39:
    def test_selected_minus_probabilistic(self):
        """Every selected node is reinforced except the probabilistic additions (reference §3.18)."""
        r = ReinforcementStage(ReinforcementSettings()).run(state(["n3", "n0", "n4"], probabilistic=["n4"]))
        assert ids_of(r.state, r.state.reinforced) == ["n3", "n0"]
        assert r.state.meta["reinforcement"] == {"ids": ["n3", "n0"], "importance_step": 0.1}

    def test_the_snapshot_is_not_written(self):
        """The store write belongs to the controller's record transaction (issue 4)."""
        s = state(["n1"])
        before = (s.snapshot.importance.copy(), s.snapshot.node(1).access_count)
        ReinforcementStage(ReinforcementSettings(importance_step=0.5)).run(s)
        assert (s.snapshot.importance == before[0]).all()
        assert s.snapshot.node(1).access_count == before[1]

    def test_custom_step(self):
        r = ReinforcementStage(ReinforcementSettings(importance_step=0.25)).run(state(["n1"]))
        assert r.state.meta["reinforcement"]["importance_step"] == 0.25


class TestSkips:
    def test_disabled(self):
        s = state(["n1"])
        r = ReinforcementStage(ReinforcementSettings(enabled=False)).run(s)
        assert r.state is s and r.state.reinforced == ()
        assert r.trace.skipped and r.trace.skip_reason == "reinforcement-disabled"

    def test_empty_selection(self):
        s = state([])
        r = ReinforcementStage(ReinforcementSettings()).run(s)
        assert r.state is s and r.trace.skip_reason == "empty-selection"


class TestContract:
    def test_not_mutated_and_deterministic(self):
        s = state(["n2", "n1"])
        before = deep_freeze(s)
        a, b = (ReinforcementStage(ReinforcementSettings()).run(s) for _ in range(2))
        assert deep_freeze(s) == before
        assert deep_freeze(a.state) == deep_freeze(b.state) and trace_key(a.trace) == trace_key(b.trace)
        assert (a.trace.name, a.trace.count_in, a.trace.count_out) == ("reinforcement", 2, 2)
