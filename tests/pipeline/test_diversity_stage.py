"""Diversity stage (reference §3.14): pool target, DPP on final scores, skip reasons; scenarios 25, 27, 31, 34
(DPP and pool parts)."""

from __future__ import annotations

import numpy as np
import pytest
from score_helpers import (
    assert_same,
    freeze,
    ids_of,
    make_graph,
    make_node,
    make_snapshot,
    make_state,
    rules_fixture,
    run_scoring,
    settings,
)

from memory_recall.pipeline.diversity import DiversityStage
from memory_recall.pipeline.state import ScoredTable


def _rules_scored(cfg):
    graph, emb = rules_fixture()
    snap = make_snapshot(graph, emb)
    return snap, run_scoring(make_state(snap, "请根据规则给出结论"), cfg).state


def _stage(cfg, llm: bool = False) -> DiversityStage:
    return DiversityStage(cfg.diversity, cfg.selection, cfg.rerank, llm_configured=llm)


class TestReferenceScenarios:
    def test_scenario_25_dpp_pool_of_three(self) -> None:
        """RULES, topK 2, maxRecallNodes 2, no LLM: all three rules scored, pool 3 → DPP picks rule-1 then the
        orthogonal rule-3 (rule-2 nearly duplicates rule-1)."""
        cfg = settings(selection={"top_k": 2, "max_recall_nodes": 2})
        snap, state = _rules_scored(cfg)
        assert ids_of(snap, state.scored.index) == ["rule-1", "rule-2", "rule-3"]
        res = _stage(cfg).run(state)
        assert ids_of(snap, res.state.pool) == ["rule-1", "rule-3"]
        meta = res.state.meta
        assert (meta["candidatePoolBeforeDpp"], meta["candidatePoolAfterDpp"], meta["diversityApplied"]) == (
            3,
            2,
            True,
        )
        assert not res.trace.skipped and res.state.skip_reasons == ()

    def test_scenario_27_llm_pool_of_two(self) -> None:
        """LLM on with llmCandidatePool 2, maxRecallNodes 2: target 2, pool 3 → DPP → [rule-1, rule-3]."""
        cfg = settings(selection={"top_k": 4, "max_recall_nodes": 2, "llm_candidate_pool": 2})
        snap, state = _rules_scored(cfg)
        res = _stage(cfg, llm=True).run(state)
        assert ids_of(snap, res.state.pool) == ["rule-1", "rule-3"]
        assert res.state.meta["diversityTarget"] == 2

    def test_scenario_31_pool_equal_to_target_skips_dpp(self) -> None:
        cfg = settings(selection={"top_k": 4, "max_recall_nodes": 2, "llm_candidate_pool": 3})
        snap, state = _rules_scored(cfg)
        res = _stage(cfg, llm=True).run(state)
        assert ids_of(snap, res.state.pool) == ["rule-1", "rule-2", "rule-3"]
        assert res.trace.skip_reason == "candidate-pool-too-small"
        assert res.state.skip_reasons == ("candidate-pool-too-small",)
        assert res.state.meta["diversityApplied"] is False

    def test_scenario_34_pool_too_small_without_llm(self) -> None:
        nodes = [make_node(f"Char{i}", name=f"Char{i}", importance=i, seq=i) for i in range(10)]
        snap = make_snapshot(make_graph(nodes), {f"Char{i}": [1.0, float(i)] for i in range(10)})
        cfg = settings()
        state = run_scoring(make_state(snap, "hello"), cfg).state
        res = _stage(cfg).run(state.evolve(skip_reasons=("vector-config-invalid",)))
        assert len(res.state.pool) == 10
        assert res.state.skip_reasons == ("vector-config-invalid", "candidate-pool-too-small")


class TestPool:
    def test_llm_pool_needs_a_configured_llm(self) -> None:
        cfg = settings(selection={"top_k": 2, "max_recall_nodes": 5, "llm_candidate_pool": 7})
        assert _stage(cfg, llm=True).target() == 7
        assert _stage(cfg, llm=False).target() == 2
        off = settings(
            selection={"top_k": 2, "max_recall_nodes": 5, "llm_candidate_pool": 7}, rerank={"enabled": False}
        )
        assert _stage(off, llm=True).target() == 2
        big = settings(selection={"max_recall_nodes": 40, "llm_candidate_pool": 7})
        assert _stage(big, llm=True).target() == 40

    def test_missing_embeddings_fall_back_to_the_head(self) -> None:
        graph, emb = rules_fixture()
        del emb["rule-3"]
        snap = make_snapshot(graph, emb)
        cfg = settings(selection={"top_k": 2})
        state = run_scoring(make_state(snap, "x"), cfg).state
        res = _stage(cfg).run(state)
        assert ids_of(snap, res.state.pool) == ["rule-1", "rule-2"]
        assert res.trace.skip_reason == "candidate-embeddings-missing"
        assert res.state.skip_reasons == ("candidate-embeddings-missing",)
        assert res.state.meta["candidatePoolBeforeDpp"] == 3 and res.state.meta["candidatePoolAfterDpp"] == 2

    def test_disabled_cuts_to_target(self) -> None:
        cfg = settings(selection={"top_k": 2}, diversity={"enabled": False})
        snap, state = _rules_scored(cfg)
        res = _stage(cfg).run(state)
        assert ids_of(snap, res.state.pool) == ["rule-1", "rule-2"]
        assert res.state.meta["diversityApplied"] is False
        assert res.state.meta["candidatePoolBeforeDpp"] == res.state.meta["candidatePoolAfterDpp"] == 2
        assert res.trace.skip_reason == "diversity-disabled" and res.state.skip_reasons == ()

    def test_pool_is_limited_by_the_multiplier(self) -> None:
        nodes = [make_node(f"n{i}", importance=10 - i * 0.5, seq=i) for i in range(12)]
        vecs = {f"n{i}": np.eye(12)[i] for i in range(12)}
        snap = make_snapshot(make_graph(nodes), vecs)
        cfg = settings(selection={"top_k": 2}, diversity={"candidate_multiplier": 2})
        state = run_scoring(make_state(snap, "x"), cfg).state
        res = _stage(cfg).run(state)
        assert res.state.meta["candidatePoolBeforeDpp"] == 4
        assert ids_of(snap, res.state.pool) == ["n0", "n1"]  # orthogonal vectors: pure quality order

    def test_quality_is_final_score_not_weighted_score(self) -> None:
        """Reference §3.14 (kept; §7 item 14): DPP reads ``final_score``. Swapping the weighted scores does
        not change the pick."""
        cfg = settings(selection={"top_k": 2, "max_recall_nodes": 2})
        snap, state = _rules_scored(cfg)
        flipped = ScoredTable(
            **{**state.scored.__dict__, "weighted_score": state.scored.weighted_score[::-1].copy()}
        )
        res = _stage(cfg).run(state.evolve(scored=flipped))
        assert ids_of(snap, res.state.pool) == ["rule-1", "rule-3"]


class TestContract:
    def test_empty_input_skips(self) -> None:
        cfg = settings()
        snap, state = _rules_scored(cfg)
        state = state.evolve(scored=ScoredTable())
        res = _stage(cfg).run(state)
        assert res.state is state and res.trace.skipped and res.trace.skip_reason == "no-candidates"

    @pytest.mark.parametrize("llm", [False, True])
    def test_input_not_mutated_and_deterministic(self, llm: bool) -> None:
        cfg = settings(selection={"top_k": 2, "max_recall_nodes": 2, "llm_candidate_pool": 2})
        snap, state = _rules_scored(cfg)
        before = freeze(state)
        a = _stage(cfg, llm).run(state)
        b = _stage(cfg, llm).run(state)
        assert_same(before, freeze(state))
        assert a.state.pool == b.state.pool and a.state.meta == b.state.meta
        assert a.trace.name == "diversity" and a.trace.count_in == 3 and a.trace.count_out == 2
        assert a.trace.score_direction == "higher_is_better"

    def test_stage_stores_its_arguments(self) -> None:
        cfg = settings()
        stage = DiversityStage(cfg.diversity, cfg.selection, cfg.rerank, True)
        assert (stage.settings, stage.selection, stage.rerank, stage.llm_configured) == (
            cfg.diversity,
            cfg.selection,
            cfg.rerank,
            True,
        )
