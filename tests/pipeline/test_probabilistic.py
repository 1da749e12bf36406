"""Probabilistic stage (reference §3.18 reworked by recall-spec departure 6)."""

from __future__ import annotations

import pytest
from e2e_helpers import deep_freeze, graph, ids_of, node, owner, scored_state, seed_where, snapshot, trace_key

from memory_recall.model.graph import StoryTime
from memory_recall.pipeline.probabilistic import ProbabilisticStage, recall_seed
from memory_recall.pipeline.state import ContextInfo
from memory_recall.settings import ContextSettings, ProbabilisticSettings, ScoringSettings, SelectionSettings

ALL_HIT = seed_where([True, True, True])


def stage(chance=0.5, *, enabled=True, reserved=1, max_nodes=8, min_importance=6.0):
    return ProbabilisticStage(
        ProbabilisticSettings(enabled=enabled, chance=chance, reserved_slots=reserved, min_importance=min_importance),
        SelectionSettings(max_recall_nodes=max_nodes),
        ContextSettings(),
        ScoringSettings(),
    )


def twelve(**extra_nodes):
    nodes = [node(f"c{k:02d}", "character", seq=k, importance=9, name=f"C{k}") for k in range(12)]
    return snapshot(graph(nodes + list(extra_nodes.values())))


def state_for(snap, selection, seed=ALL_HIT, rows=None, **kw):
    rows = rows if rows is not None else [(i, 0.5) for i in selection]
    return scored_state(snap, rows, selection=list(selection), seed=seed, **kw)


def sel(result):
    return ids_of(result.state, result.state.selection)


class TestScenario40:
    """Reworked under departure 6: twelve importance-9 characters, chance 0.5, a seed whose draws all hit."""

    def test_full_selection_keeps_one_reserved_slot(self):
        snap = twelve()
        selection = [f"c{k:02d}" for k in range(8)]
        r = stage().run(state_for(snap, selection))
        # reference: the 3 additions are appended after 8 ranked ids and cut → 8 ranked, 0 added
        assert sel(r) == [f"c{k:02d}" for k in range(7)] + ["c08"]
        assert ids_of(r.state, r.state.probabilistic) == ["c08"]
        assert r.state.meta["probabilisticRecall"]["candidates"] == ["c08", "c09", "c10"]
        assert r.state.meta["selectionOrigins"]["c08"] == "probabilistic"

    def test_short_selection_takes_all_three(self):
        snap = twelve()
        r = stage().run(state_for(snap, ["c00", "c01"]))
        assert sel(r) == ["c00", "c01", "c02", "c03", "c04"]
        assert r.state.meta["probabilisticRecall"]["slots"] == 6

    def test_misses_leave_the_slot_to_the_ranking(self):
        snap = twelve()
        selection = [f"c{k:02d}" for k in range(8)]
        r = stage().run(state_for(snap, selection, seed=seed_where([False, False, False])))
        assert sel(r) == selection
        assert r.state.probabilistic == ()

    def test_second_candidate_hit(self):
        snap = twelve()
        r = stage().run(state_for(snap, ["c00"], seed=seed_where([False, True, False])))
        assert sel(r) == ["c00", "c02"]


class TestCandidates:
    def test_eligibility(self):
        extra = {
            "low": node("low", "character", importance=5.9),
            "rule": node("rule", "rule", importance=10, title="R"),
            "syn": node("syn", "synopsis", importance=10, summary="S"),
            "norange": node("norange", "character", seq_range=None, importance=10),
            "gated": node("gated", "character", importance=10),
            "future": node("future", "event", importance=10, story_time=StoryTime(label="x", tense="future")),
            "ok": node("ok", "event", importance=6),
        }
        snap = snapshot(graph(list(extra.values())))
        state = state_for(snap, [], meta={"gate_suppressed": ["gated"]})
        r = stage(max_nodes=3).run(state)
        assert r.state.meta["probabilisticRecall"]["candidates"] == ["ok"]

    def test_unscored_candidate_passes_the_knowledge_gate(self):
        """Departure 2: with a scene owner that has no visibility for it, an objective node stays out."""
        g = graph([node("a", "character", importance=9), node("b", "character", importance=8)],
                  owners=[owner("Erin", visibility={"b": 0.9})])
        ctx = ContextInfo(owner_keys=("character:erin",), owner_scores=(1.0,), owner_mode="request")
        r = stage().run(state_for(snapshot(g), [], context=ctx))
        assert r.state.meta["probabilisticRecall"]["candidates"] == ["b"]

    def test_importance_ties_by_node_id(self):
        snap = snapshot(graph([node("b", importance=7), node("a", importance=7), node("c", importance=8)]))
        r = stage().run(state_for(snap, []))
        assert r.state.meta["probabilisticRecall"]["candidates"] == ["c", "a", "b"]

    @pytest.mark.parametrize(("chance", "p"), [(0.9, 0.5), (0.001, 0.01), (0.2, 0.2)])
    def test_chance_is_clamped(self, chance, p):
        r = stage(chance).run(state_for(twelve(), ["c00"]))
        assert r.state.meta["probabilisticRecall"]["chance"] == p


class TestSeed:
    def test_same_seed_same_draws(self):
        snap = twelve()
        seed = recall_seed("chat-1", 7, 3)
        a = stage(0.3).run(state_for(snap, ["c00"], seed=seed))
        b = stage(0.3).run(state_for(snap, ["c00"], seed=seed))
        assert a.state.selection == b.state.selection
        assert a.state.meta["probabilisticRecall"]["draws"] == b.state.meta["probabilisticRecall"]["draws"]

    def test_recall_seed(self):
        import hashlib

        digest = hashlib.sha256(b"chat-1:7:3").digest()
        assert recall_seed("chat-1", 7, 3) == int.from_bytes(digest[:8], "big")
        assert recall_seed("chat-1", 7, 3) != recall_seed("chat-1", 8, 3) != recall_seed("chat-1", 8, 4)


class TestSkips:
    def test_disabled(self):
        state = state_for(twelve(), ["c00"])
        r = stage(enabled=False).run(state)
        assert r.state is state and r.trace.skip_reason == "probabilistic-disabled"

    def test_chance_zero(self):
        assert stage(0.0).run(state_for(twelve(), ["c00"])).trace.skip_reason == "probabilistic-disabled"

    def test_no_candidates(self):
        snap = snapshot(graph([node("a", importance=1)]))
        state = state_for(snap, [])
        r = stage().run(state)
        assert r.state is state and r.trace.skipped and r.trace.skip_reason == "no-probabilistic-candidates"


class TestContract:
    def test_input_not_mutated_and_deterministic(self):
        state = state_for(twelve(), ["c00"])
        before = deep_freeze(state)
        a, b = stage().run(state), stage().run(state)
        assert deep_freeze(state) == before
        assert deep_freeze(a.state) == deep_freeze(b.state)
        assert trace_key(a.trace) == trace_key(b.trace)
        assert (a.trace.name, a.trace.count_in, a.trace.count_out) == ("probabilistic", 1, 4)
        assert (a.trace.score_kind, a.trace.score_direction) == ("importance", "higher_is_better")
