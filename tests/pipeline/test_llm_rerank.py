"""Rerank stage (reference §3.15, recall-spec departure 3): outcomes, candidate lines, selection rules, failures.

States are hand-built (``scored_state``) so the stage is tested alone; the end-to-end scenarios 27–31 run
through ``retrieve()`` in test_retrieve.py.
"""

from __future__ import annotations

import dataclasses

import pytest
from e2e_helpers import (
    ScriptedLLM,
    deep_freeze,
    graph,
    node,
    owner,
    pov,
    rules_snapshot,
    scored_state,
    snapshot,
    trace_key,
)

from memory_recall.errors import LLMUnavailable, StrictModeViolation
from memory_recall.model.graph import StoryTime
from memory_recall.pipeline.llm_rerank import (
    DISABLED_REASON,
    RerankStage,
    candidate_line,
    js_string,
)
from memory_recall.pipeline.state import ContextInfo, OwnerCandidate, Providers
from memory_recall.settings import LLMSettings, RerankSettings, SelectionSettings

SEL2 = SelectionSettings(top_k=4, max_recall_nodes=2, llm_candidate_pool=2)


def stage(llm=None, *, enabled=True, selection=SEL2, strict=False, timeout=7.5, llm_strict=False):
    return RerankStage(
        RerankSettings(enabled=enabled),
        selection,
        Providers(llm=llm, strict=strict),
        LLMSettings(timeout_s=timeout, strict=llm_strict),
    )


def rules_state(pool=("rule-1", "rule-3")):
    """RULES scored as the pipeline ranks them (rule-1, rule-2, rule-3) with the DPP pool of scenario 27."""
    snap = rules_snapshot()
    rows = [("rule-1", 0.086), ("rule-2", 0.075), ("rule-3", 0.057)]
    return scored_state(snap, rows, pool=list(pool), message="请根据规则给出结论", recent=["用户：现在该怎么做？"])


def selected(result):
    return [result.state.snapshot.ids[i] for i in result.state.selection]


class TestDisabledAndSkipped:
    def test_disabled_keeps_pool_and_reports_disabled(self):
        state = rules_state(("rule-1", "rule-2", "rule-3"))
        llm = ScriptedLLM({"selected_keys": ["R1"]})
        result = stage(llm, enabled=False).run(state)
        assert selected(result) == ["rule-1", "rule-2", "rule-3"]
        assert result.state.llm["status"] == "disabled"
        assert result.state.llm["reason"] == DISABLED_REASON == "LLM 精排已关闭，直接采用评分排序"
        assert result.trace.skipped and result.trace.skip_reason == "rerank-disabled"
        assert result.state.skip_reasons == ()  # trace only
        assert llm.calls == []

    def test_no_llm_configured_is_skipped_with_reason_code(self):
        result = stage(None).run(rules_state())
        assert selected(result) == ["rule-1", "rule-3"]
        assert result.state.llm["status"] == "skipped"
        assert result.state.llm["skipReason"] == "no-llm-configured"
        assert result.trace.skip_reason == "no-llm-configured"
        assert "no-llm-configured" in result.state.skip_reasons

    def test_empty_pool_gives_empty_selection_with_skip_reason(self):
        snap = rules_snapshot()
        state = scored_state(snap, [], pool=[])
        llm = ScriptedLLM({"selected_keys": ["R1"]})
        result = stage(llm).run(state)
        assert result.state.selection == ()
        assert result.trace.skipped and result.trace.skip_reason == "empty-candidate-pool"
        assert result.state.llm["status"] == "skipped"
        assert llm.calls == []


class TestCandidateLines:
    def test_exact_line_format(self):
        n = node("pov-1", "pov_memory", scope=pov("艾琳", region="钟楼"),
                 story_time=StoryTime(label="第二天清晨", tense="ongoing"),
                 summary="地下室入口", belief="有线索", certainty=0.5, tags=["a", "b"], extra={"k": 1}, flag=True)
        line = candidate_line("R3", n, scope_bucket="characterPov", temporal_bucket="current",
                              knowledge_mode="anchored", visibility=0.6, weighted_score=0.123456)
        assert line == (
            "[R3] 类型=主观记忆, 作用域=POV | character:艾琳 | 地区:钟楼, 时间=第二天清晨 · ongoing, 时间桶=current, "
            "召回桶=角色 POV, 认知=anchored, 可见性=0.600, summary: 地下室入口, belief: 有线索, certainty: 0.5, "
            'tags: a,b, extra: {"k":1}, flag: true (评分=0.123)'
        )

    def test_undated_node_says_unlabelled(self):
        line = candidate_line("R1", node("x", "event", title="T"), scope_bucket="objectiveGlobal",
                              temporal_bucket="undated", knowledge_mode="no-owner-state", visibility=0,
                              weighted_score=0)
        assert line == ("[R1] 类型=事件, 作用域=客观, 时间=未标注, 时间桶=undated, 召回桶=全局客观, "
                        "认知=no-owner-state, 可见性=0.000, title: T (评分=0.000)")

    def test_js_string_conversion(self):
        assert js_string(None) == "null"
        assert js_string([1, None, "x", 2.5, False]) == "1,,x,2.5,false"
        assert js_string(3.0) == "3"

    def test_keys_in_pool_order_and_never_node_ids(self):
        llm = ScriptedLLM({"selected_keys": ["R1"]})
        result = stage(llm, selection=SelectionSettings(max_recall_nodes=2, llm_candidate_pool=3)).run(
            rules_state(("rule-3", "rule-1", "rule-3", "rule-2"))
        )
        prompt = llm.user_prompt
        assert [line.split("]")[0] + "]" for line in prompt.splitlines() if line.startswith("[R")] == [
            "[R1]", "[R2]", "[R3]"
        ]
        assert "rule-1" not in prompt and "rule-2" not in prompt and "rule-3" not in prompt
        preview = result.state.llm["candidateKeyMapPreview"]
        assert [preview[k]["nodeId"] for k in ("R1", "R2", "R3")] == ["rule-3", "rule-1", "rule-2"]
        assert result.state.llm["candidatePool"] == 3

    def test_one_call_within_the_deadline(self):
        llm = ScriptedLLM({"selected_keys": ["R1"]})
        stage(llm, timeout=7.5).run(rules_state())
        assert len(llm.calls) == 1
        assert llm.calls[0][1] == 7.5


class TestSelectionRules:
    """Scenarios 28–31 on the pool of scenario 27 (R1 = rule-1, R2 = rule-3)."""

    def run(self, answer, pool=("rule-1", "rule-3"), selection=SEL2):
        return stage(ScriptedLLM(answer), selection=selection).run(rules_state(pool))

    def test_scenario_27_keys(self):
        r = self.run({"selected_keys": ["R1", "R2"]})
        assert selected(r) == ["rule-1", "rule-3"]
        llm = r.state.llm
        assert (llm["status"], llm["selectionProtocol"], llm["candidatePool"], llm["legacySelectionUsed"]) == (
            "llm", "candidate-keys-v1", 2, False)
        assert llm["resolvedSelectedKeys"] == ["R1", "R2"]
        assert llm["resolvedSelectedNodeIds"] == ["rule-1", "rule-3"]
        assert llm["emptySelectionAccepted"] is False

    def test_scenario_28_keys_win_over_ids(self):
        r = self.run({"selected_keys": ["R2"], "selected_ids": ["rule-1"]})
        assert selected(r) == ["rule-3"]
        assert r.state.llm["selectionProtocol"] == "candidate-keys-v1"

    def test_scenario_29_legacy_ids(self):
        r = self.run({"selected_ids": ["rule-3"]})
        assert selected(r) == ["rule-3"]
        assert r.state.llm["selectionProtocol"] == "legacy-selected-ids"
        assert r.state.llm["legacySelectionUsed"] is True

    def test_scenario_29_legacy_id_outside_pool_falls_back(self):
        r = self.run({"selected_ids": ["rule-2"]})
        assert r.state.llm["status"] == "fallback"
        assert r.state.llm["fallbackType"] == "invalid-candidate"
        assert r.state.llm["selectionProtocol"] == "legacy-selected-ids"
        assert selected(r) == ["rule-1", "rule-3"]

    @pytest.mark.parametrize(
        ("answer", "kind"),
        [
            ({"selected_keys": []}, "empty-selection"),
            ({"selected_keys": ["R99"]}, "invalid-candidate"),
            ({"selected_keys": "R1"}, "invalid-candidate"),
            ({"foo": 1}, "invalid-candidate"),
            ({"reason": "nothing"}, "invalid-candidate"),
            ({"selected_ids": []}, "empty-selection"),
            ({"selected_keys": [None, "  "]}, "empty-selection"),
        ],
    )
    def test_scenario_30_fallback_types(self, answer, kind):
        r = self.run(answer)
        assert r.state.llm["status"] == "fallback"
        assert r.state.llm["fallbackType"] == kind
        assert r.state.llm["fallbackReason"] == r.state.llm["reason"] != ""
        assert selected(r) == ["rule-1", "rule-3"]

    def test_scenario_30_invalid_json_call_failure(self):
        """Reference ``invalid-json`` is the provider's ``bad_payload`` category (same reason text)."""
        r = self.run(LLMUnavailable("bad_payload", "content is not a JSON object"))
        llm = r.state.llm
        assert (llm["status"], llm["fallbackType"]) == ("fallback", "bad_payload")
        assert llm["reason"] == "LLM 精排未返回有效 JSON，已回退到评分排序"
        assert llm["failureCategory"] == "bad_payload"
        assert selected(r) == ["rule-1", "rule-3"]

    def test_garbage_text_is_bad_payload(self):
        r = self.run("I think R1 is best!")
        assert (r.state.llm["status"], r.state.llm["fallbackType"]) == ("fallback", "bad_payload")

    @pytest.mark.parametrize("category", ["timeout", "connect", "http_status", "refusal"])
    def test_provider_failures_fall_back_with_their_category(self, category):
        r = self.run(LLMUnavailable(category, "boom"))
        assert (r.state.llm["status"], r.state.llm["fallbackType"]) == ("fallback", category)
        assert r.trace.notes["failure"] == category
        assert selected(r) == ["rule-1", "rule-3"]

    def test_scenario_31_dedupe_and_cap(self):
        r = self.run({"selected_keys": ["R3", "R1", "R2", "R1"]}, pool=("rule-1", "rule-2", "rule-3"),
                     selection=SelectionSettings(top_k=4, max_recall_nodes=2, llm_candidate_pool=3))
        assert selected(r) == ["rule-3", "rule-1"]
        assert r.state.llm["resolvedSelectedKeys"] == ["R3", "R1"]

    def test_lenient_key_spelling_and_partial_validity(self):
        r = self.run({"selected_keys": ["[r2]", "R7", " R1 "]})
        assert selected(r) == ["rule-3", "rule-1"]
        assert r.state.llm["status"] == "llm"
        assert "1" in r.state.llm["reason"]  # notes the ignored entry

    def test_list_capped_at_four_times_max_nodes(self):
        keys = [f"R{k}" for k in range(10, 18)] + ["R1"]  # 8 invalid keys first, cap = 4 × 2 = 8
        r = self.run({"selected_keys": keys})
        assert r.state.llm["fallbackType"] == "invalid-candidate"
        assert len(r.state.llm["rawSelectedKeys"]) == 8


class TestStrictMode:
    def test_strict_provider_raises(self):
        with pytest.raises(StrictModeViolation) as info:
            stage(ScriptedLLM(LLMUnavailable("timeout", "slow")), strict=True).run(rules_state())
        assert info.value.cause.category == "timeout"

    def test_llm_settings_strict_raises(self):
        with pytest.raises(StrictModeViolation):
            stage(ScriptedLLM("not json"), llm_strict=True).run(rules_state())

    def test_strict_does_not_raise_for_an_invalid_selection(self):
        r = stage(ScriptedLLM({"selected_keys": []}), strict=True).run(rules_state())
        assert r.state.llm["fallbackType"] == "empty-selection"


class TestOwnerKeys:
    def owner_state(self):
        g = graph(
            [node("alice", "character", name="Alice"), node("bob", "character", name="Bob"),
             node("ev", "event", title="Meeting")],
            owners=[owner("Alice", node_id="alice", aliases=("Ally",)), owner("Bob")],
        )
        snap = snapshot(g)
        ctx = ContextInfo(
            owner_catalog=("character:alice#alice", "character:bob"),
            owner_candidates=(
                OwnerCandidate("character:alice#alice", "Alice", 0.8, ("recent-message",), ("mentioned:Alice",)),
                OwnerCandidate("character:bob", "Bob", 0.35, ("recent-active",), ("recent-active",)),
            ),
        )
        return scored_state(snap, [("ev", 0.5), ("alice", 0.4), ("bob", 0.3)], context=ctx)

    def test_owner_keys_resolved_against_candidates(self):
        answer = {
            "selected_keys": ["R1"],
            "active_owner_keys": ["character:alice", "BOB", "character:carol", "ally", "character:bob", "x"],
            "active_owner_scores": [{"ownerKey": "Bob", "score": 1.7, "reason": "speaks"}],
        }
        r = stage(ScriptedLLM(answer)).run(self.owner_state())
        llm = r.state.llm
        assert llm["activeOwnerKeys"] == ["character:alice#alice", "character:bob"]
        assert llm["activeOwnerScores"] == [
            {"ownerKey": "character:alice#alice", "score": 1.0, "reason": ""},  # min(1, candidate score)
            {"ownerKey": "character:bob", "score": 1.0, "reason": "speaks"},
        ]

    def test_owner_lines_in_prompt(self):
        llm = ScriptedLLM({"selected_keys": ["R1"]})
        stage(llm).run(self.owner_state())
        # preliminary 0.8 + the character node naming Alice (0.9 + min(0.6, 0.4 / 10)), reference §3.13
        lines = [line for line in llm.user_prompt.splitlines() if line.startswith("- ownerKey=")]
        assert lines == [
            "- ownerKey=character:alice#alice; ownerName=Alice; score=1.740; reasons=mentioned:Alice,participant:Alice",
            "- ownerKey=character:bob; ownerName=Bob; score=1.280; reasons=recent-active,participant:Bob",
        ]

    def test_owner_keys_discarded_on_fallback(self):
        answer = {"selected_keys": ["R9"], "active_owner_keys": ["character:alice"]}
        r = stage(ScriptedLLM(answer)).run(self.owner_state())
        assert r.state.llm["status"] == "fallback"
        assert r.state.llm["activeOwnerKeys"] == []


class TestContract:
    def test_input_not_mutated(self):
        state = rules_state()
        before = deep_freeze(state)
        stage(ScriptedLLM({"selected_keys": ["R2"]})).run(state)
        assert deep_freeze(state) == before

    def test_deterministic(self):
        runs = [stage(ScriptedLLM({"selected_keys": ["R2", "R1"]})).run(rules_state()) for _ in range(2)]
        assert deep_freeze(runs[0].state) == deep_freeze(runs[1].state)
        assert trace_key(runs[0].trace) == trace_key(runs[1].trace)

    def test_trace_filled(self):
        r = stage(ScriptedLLM({"selected_keys": ["R2"]})).run(rules_state())
        t = r.trace
        assert (t.name, t.count_in, t.count_out, t.score_kind, t.score_direction) == (
            "rerank", 2, 1, "selection_rank", "lower_is_better")
        assert dataclasses.is_dataclass(t)
