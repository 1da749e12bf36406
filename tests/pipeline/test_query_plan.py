"""QueryPlanStage: context query blend, vector query plan, lexical sources (reference §3.5–§3.6)."""

from __future__ import annotations

import pytest
from ctx_helpers import assert_not_mutated, make_state, result_image, snapshot

from memory_recall.pipeline.query_plan import (
    QueryPlanStage,
    build_query_blend,
    build_vector_queries,
    parse_context_line,
)
from memory_recall.pipeline.state import BlendPart
from memory_recall.settings import QueryPlanSettings

STAGE = QueryPlanStage(QueryPlanSettings())
SCENARIO_2_RECENT = ["[assistant]: 他提到了规则二的限制", "[user]: 我们先看规则一", "[user]: 他后来怎么做？"]


def plan_of(message: str, recent=(), settings: QueryPlanSettings | None = None):
    stage = QueryPlanStage(settings) if settings else STAGE
    return stage.run(make_state(snapshot(), message, recent))


class TestParseContextLine:
    @pytest.mark.parametrize(
        ("line", "parsed"),
        [
            ("[user]: hi", ("user", "hi")),
            ("[ASSISTANT]:  a \n b ", ("assistant", "a b")),
            ("user: x", ("user", "x")),
            ("Assistant：y", ("assistant", "y")),
            ("用户：现在该怎么做？", ("user", "现在该怎么做？")),
            ("助手: 好", ("assistant", "好")),
            ("AI: z", ("assistant", "z")),
            ("[user]：全角", ("user", "全角")),
            ("narrator: x", None),
            ("username: x", None),
            ("no role here", None),
        ],
    )
    def test_roles_and_colons(self, line, parsed):
        assert parse_context_line(line) == parsed


class TestScenario2Blend:
    def test_scenario_2_three_parts(self):
        res = plan_of("他后来怎么做？", SCENARIO_2_RECENT)
        plan = res.state.plan
        assert [(p.kind, p.weight, p.text) for p in plan.parts] == [
            ("currentUser", 0.7, "他后来怎么做？"),
            ("assistantContext", 0.2, "他提到了规则二的限制"),
            ("previousUser", 0.1, "我们先看规则一"),
        ]
        assert plan.active is True
        assert plan.combined_text == (
            "当前用户消息:\n他后来怎么做？\n\n"
            "最近 assistant 回复:\n他提到了规则二的限制\n\n"
            "上一条 user 消息:\n我们先看规则一"
        )
        meta = res.state.meta
        assert meta["queryBlendActive"] is True
        assert meta["queryBlendWeights"] == {"currentUser": 0.7, "assistantContext": 0.2, "previousUser": 0.1}
        assert meta["queryBlendParts"][1] == {
            "kind": "assistantContext",
            "label": "最近 assistant 回复",
            "weight": 0.2,
            "preview": "他提到了规则二的限制",
            "length": 10,
        }

    def test_current_and_assistant_only(self):
        parts, active, _ = build_query_blend("now what", ["[assistant]: she left"])
        assert [(p.kind, p.weight) for p in parts] == [("currentUser", 0.778), ("assistantContext", 0.222)]
        assert active

    def test_preview_is_120_units_and_length_is_js_length(self):
        long = "字" * 150 + "😀"
        res = plan_of(long)
        part = res.state.meta["queryBlendParts"][0]
        assert part["preview"] == "字" * 120
        assert part["length"] == 152


class TestScenario3Blend:
    def test_scenario_3_full_width_colon_chinese_role(self):
        parts, active, _ = build_query_blend("请根据规则给出结论", ["用户：现在该怎么做？"])
        assert [(p.kind, p.weight, p.text) for p in parts] == [
            ("currentUser", 0.875, "请根据规则给出结论"),
            ("previousUser", 0.125, "现在该怎么做？"),
        ]
        assert active

    def test_scenario_3_no_usable_context(self):
        parts, active, combined = build_query_blend("hello", ["narrator: x", "[user]: HELLO"])
        assert [(p.kind, p.weight) for p in parts] == [("currentUser", 1.0)]
        assert (active, combined) == (False, "hello")

    def test_scenario_3_blend_disabled(self):
        settings = QueryPlanSettings(enable_context_query_blend=False)
        res = plan_of("他后来怎么做？", SCENARIO_2_RECENT, settings)
        assert [(p.kind, p.weight) for p in res.state.plan.parts] == [("currentUser", 1.0)]
        assert res.state.plan.active is False

    def test_duplicate_texts_dropped_case_insensitively(self):
        parts, _, _ = build_query_blend("Hi", ["[assistant]: hi", "[user]: other"])
        assert [p.kind for p in parts] == ["currentUser", "previousUser"]

    def test_zero_weights_split_equally(self):
        parts, _, _ = build_query_blend(
            "a", ["[assistant]: b"], assistant_weight=1.0, previous_user_weight=0.5
        )
        # current weight max(0, 1 − 1 − 0.5) = 0 → renormalised: 0 / 1 → 0, assistant 1.
        assert [(p.kind, p.weight) for p in parts] == [("currentUser", 0.0), ("assistantContext", 1.0)]
        parts, _, _ = build_query_blend("a", [], assistant_weight=1.0, previous_user_weight=0.5)
        assert [(p.kind, p.weight) for p in parts] == [("currentUser", 1.0)]


class TestScenario4Plan:
    def test_scenario_4_multi_intent_on_near_duplicate_merged(self):
        """Departure 8 (§7 item 16): the reference plans 4 queries (``他后来怎么做？`` and ``他后来怎么做``);
        the
        trailing-punctuation near-duplicate is one query here, so 3 remain."""
        plan = plan_of("他后来怎么做？", SCENARIO_2_RECENT).state.plan
        assert plan.vector_queries == (
            ("他后来怎么做？", 0.7),
            ("他提到了规则二的限制", 0.2),
            ("我们先看规则一", 0.1),
        )
        assert plan.segments == ("他后来怎么做",)

    def test_scenario_4_multi_intent_off(self):
        plan = plan_of(
            "他后来怎么做？", SCENARIO_2_RECENT, QueryPlanSettings(enable_multi_intent=False)
        ).state.plan
        assert plan.vector_queries == (
            ("他后来怎么做？", 0.7),
            ("他提到了规则二的限制", 0.2),
            ("我们先看规则一", 0.1),
        )
        assert plan.segments == ()
        assert plan.lexical_sources == ("他后来怎么做？",)

    def test_scenario_4_lexical_sources(self):
        plan = plan_of("规则一，然后规则二。另外规则三；顺便看看规则四！还有五").state.plan
        assert plan.lexical_sources == (
            "规则一，然后规则二。另外规则三；顺便看看规则四！还有五",
            "规则一",
            "规则二",
            "规则三",
            "看看规则四",
        )
        # Real segments still give their own vector queries.
        assert [t for t, _ in plan.vector_queries] == list(plan.lexical_sources)

    def test_lexical_sources_split_the_raw_message(self):
        # A line break separates intents in the raw message, while NQ has already turned it into a space: the
        # lexical sources come from the raw text, the vector segments from the normalised one.
        plan = plan_of("Where is the key\nor the old map").state.plan
        assert plan.lexical_sources == ("Where is the key or the old map", "Where is the key", "or the old map")
        assert plan.segments == ("Where is the key or the old map",)
        plan = plan_of("Where is the key, or the old map").state.plan
        assert plan.lexical_sources == ("Where is the key, or the old map", "Where is the key", "or the old map")
        assert plan.segments == ("Where is the key", "or the old map")

    def test_segments_meta(self):
        res = plan_of("规则一，然后规则二")
        assert res.state.meta["segmentsUsed"] == ["规则一", "规则二"]


class TestNearDuplicateQueries:
    """Departure 8: queries differing only by trailing punctuation/whitespace or case are one query."""

    @pytest.mark.parametrize(
        ("texts", "expected"),
        [
            (["What now?", "what now"], ["What now?"]),
            (["他后来怎么做？！", "他后来怎么做"], ["他后来怎么做？！"]),
            (["？？", "!!"], ["？？", "!!"]),  # punctuation-only texts are not merged with each other
            (["Où est-il ?", "où est-il"], ["Où est-il ?"]),
            (["Ann.", "Anna"], ["Ann.", "Anna"]),
        ],
    )
    def test_merge(self, texts, expected):
        parts = [BlendPart("currentUser", "x", texts[0], 0.5)]
        parts += [BlendPart("assistantContext", "y", t, 0.5) for t in texts[1:]]
        assert [t for t, _ in build_vector_queries(parts, [], multi_intent=False)] == expected

    def test_merged_query_keeps_the_larger_weight(self):
        parts = [
            BlendPart("currentUser", "x", "规则一，规则二", 0.2),
            BlendPart("assistantContext", "y", "规则二。", 0.8),
        ]
        assert build_vector_queries(parts, ["规则一", "规则二"], multi_intent=True) == (
            ("规则一，规则二", 0.2),
            ("规则一", 0.2),
            ("规则二", 0.8),
        )


class TestEmpty:
    def test_empty_message_and_context_skip(self):
        res = plan_of("   ")
        assert res.trace.skipped and res.trace.skip_reason == "empty-query"
        assert res.state.skip_reasons == ("empty-query",)
        assert res.state.plan.vector_queries == ()

    def test_empty_message_with_context_uses_the_context(self):
        plan = plan_of("", ["[assistant]: the bell rang"]).state.plan
        assert plan.vector_queries == (("the bell rang", 1.0),)
        assert plan.lexical_sources == ()


class TestContract:
    def test_trace(self):
        res = plan_of("他后来怎么做？", SCENARIO_2_RECENT)
        assert (res.trace.name, res.trace.count_in, res.trace.count_out) == ("query_plan", 4, 3)
        assert res.trace.score_kind == "blend_weight"

    def test_input_not_mutated(self):
        assert_not_mutated(make_state(snapshot(), "他后来怎么做？", SCENARIO_2_RECENT), STAGE.run)

    def test_deterministic(self):
        state = make_state(snapshot(), "规则一，然后规则二。另外规则三", SCENARIO_2_RECENT)
        assert result_image(STAGE.run(state)) == result_image(STAGE.run(state))
