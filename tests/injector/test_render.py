"""Injector layout (reference §4.1, §4.3, scenarios 41, 43, 44) and fixture goldens (English and Chinese).

Golden files in ``golden/``:

* ``reference_4_3.txt``, ``reference_4_3_legacy.txt``, ``scenario_44.txt`` — copied from the text of
  ``stbme-reference.md`` (§4.3 code block, the legacy string at the end of §4.3, scenario 44), never from output.
  The reference prints Chinese labels whatever the content, so the two whose memories are Latin placeholders
  (``S``, ``T``) are rendered with ``language="zh"``; ``auto`` gives them English labels (asserted beside them).
* ``en_user_pov_section.hand.txt``, ``zh_character_pov_section.hand.txt`` — written by hand from the §4.2 rules and
  the fixture node fields.
* ``en_thornwick_block.txt``, ``zh_bell_tower_block.txt`` — full blocks generated once from the renderer and
  reviewed line by line against §4.1/§4.2 (section order, headings, owner labels, derived columns, column
  omission, printed-once rule, gated node absent); the hand-written sections above must appear in them verbatim.
  The English ones carry English labels (``messages``, ``Character:``, ``User:``, the English user-POV note):
  regenerated when the labels began to follow the block's language, and checked to differ from the earlier
  (Chinese-labelled) block in those label lines only, which :class:`TestBlockLanguage` pins.
"""

from __future__ import annotations

import functools

import pytest
from injector_helpers import (
    NOW_MS,
    char_pov,
    en_result,
    fixture_graph,
    golden,
    make_result,
    node,
    user_pov,
    zh_result,
)

import injector
from injector import Injection, InjectionBlock, render, render_parts
from memory_recall.model.graph import MemoryScope, StoryTimeSpan
from memory_recall.model.state import SummaryEntry
from memory_recall.pipeline.result import ScopeBucketsModel
from memory_recall.pipeline.retrieve import retrieve
from memory_recall.pipeline.state import Providers, RecallQuery
from memory_recall.settings import InjectorSettings, RecallSettings
from memory_recall.store.snapshot import snapshot_from_graph

#: The reference's labels whatever the content (the goldens copied from the reference are in this mode).
REFERENCE = InjectorSettings(language="zh")
EN_NOTE = ("These are the user's (player's) subjective memories, not facts the characters know; use them only as "
           "background on relationships, promises, feelings and the long-term interaction.")
ZH_NOTE = "这些是用户/玩家侧主观记忆，不等于角色已知事实；只能作为关系、承诺、情绪和长期互动背景参考。"


def replaced(text: str, *pairs: tuple[str, str]) -> str:
    """``text`` with each ``old`` → ``new`` applied, every ``old`` present (so a test cannot pass vacuously)."""
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


def reference_example() -> dict:
    """The nodes of the reference's ``tests/injector-format.mjs`` fixture (§4.3)."""
    summary = SummaryEntry(
        id="sum-1", level=0, kind="small", message_range=(2, 7),
        text="艾琳刚在钟楼重新站稳脚跟，并确认地下入口和失踪案直接相关，局面从调查转向即将下探。",
        story_time_span=StoryTimeSpan(start_label="昨夜冲突之后", end_label="第二天清晨"),
    )
    char = node("pov-ailin", "pov_memory", scope=char_pov("艾琳"), time="第二天清晨", tense="ongoing",
                summary="艾琳觉得地下室入口说明钟楼里有人长期活动", belief="这里藏着失踪案线索", emotion="警觉",
                attitude="必须立刻下去查看")
    user = node("pov-player", "pov_memory", scope=user_pov("玩家"), summary="玩家已经把钟楼和失踪案牢牢绑定起来了",
                belief="钟楼地下室肯定有更深的秘密", emotion="紧张", attitude="希望艾琳谨慎推进")
    event = node("ev-entrance", "event", scope=MemoryScope(region_primary="钟楼"), time="第二天清晨", tense="ongoing",
                 summary="艾琳在钟楼发现了地下入口", participants=["艾琳"], status="resolved")
    synopsis = node("syn-1", "synopsis", span=("昨夜冲突之后", "第二天清晨"),
                    summary="昨夜冲突后，艾琳在第二天清晨重新回到钟楼，并发现地下入口与失踪案有直接联系。")
    return {"summary": summary, "char": char, "user": user, "event": event, "synopsis": synopsis}


class TestPublicSurface:
    def test_all(self):
        assert set(injector.__all__) >= {"render", "render_parts", "Injection", "InjectionBlock"}
        for name in injector.__all__:
            assert hasattr(injector, name)

    def test_models_frozen(self):
        inj = render_parts()
        assert isinstance(inj, Injection)
        with pytest.raises(ValueError):
            inj.text = "x"  # type: ignore[misc]


class TestScenario41ReferenceExample:
    """Scenario 41: the §4.3 fixture produces exactly the text shown there."""

    def test_render_parts_byte_for_byte(self):
        ex = reference_example()
        inj = render_parts(
            summary_entries=[ex["summary"]],
            scope_buckets={
                "characterPov": [ex["char"]],
                "characterPovByOwner": {"character:艾琳": [ex["char"]]},
                "characterPovOwnerOrder": ["character:艾琳"],
                "userPov": [ex["user"]],
                "objectiveCurrentRegion": [ex["event"]],
                "objectiveGlobal": [ex["synopsis"]],
            },
            core_nodes=[ex["event"], ex["synopsis"]],
            recall_nodes=[ex["char"], ex["user"]],
            owner_labels={"character:艾琳": "艾琳"},
            settings=InjectorSettings(),
        )
        assert (inj.text + "\n").encode("utf-8") == (golden("reference_4_3.txt") + "\n").encode("utf-8")
        assert inj.omitted == []
        assert inj.char_count == len(inj.text)
        assert [b.section for b in inj.blocks] == [
            "summary", "character_pov", "user_pov", "objective_current_region", "objective_global"]
        assert inj.blocks[1].owner_key == "character:艾琳"
        assert inj.blocks[3].tables[0].model_dump() == {
            "type": "event", "table_name": "event_table",
            "columns": ["story_time", "summary", "participants", "status"],
            "rows": [["第二天清晨 · ongoing", "艾琳在钟楼发现了地下入口", "艾琳", "resolved"]],
            "node_ids": ["ev-entrance"], "heading": "",
        }

    def test_render_from_result(self):
        ex = reference_example()
        nodes = [ex["char"], ex["user"], ex["event"], ex["synopsis"]]
        result = make_result(
            nodes,
            scores={"pov-ailin": 0.9, "pov-player": 0.6},
            core=["ev-entrance", "syn-1"], recall=["pov-ailin", "pov-player"],
            buckets=ScopeBucketsModel(
                characterPov=["pov-ailin"], characterPovByOwner={"character:艾琳": ["pov-ailin"]},
                characterPovOwnerOrder=["character:艾琳"], userPov=["pov-player"],
                objectiveCurrentRegion=["ev-entrance"], objectiveGlobal=["syn-1"],
            ),
            summaries=[ex["summary"].model_dump(mode="json")],
        )
        assert render(result, InjectorSettings()).text == golden("reference_4_3.txt")
        assert render(result, RecallSettings()).text == golden("reference_4_3.txt")


class TestScenario43Legacy:
    """Scenario 43: legacy layout only when no scoped section is emitted; empty → ""; unknown type → header."""

    def legacy_result(self, **meta):
        nodes = [node("S1", "event", summary="S"), node("C1", "character", name="C"),
                 node("I1", "reflection", insight="I"), node("G1", "event", summary="gated")]
        return make_result(nodes, scores={"C1": 0.5, "I1": 0.4}, core=["S1", "G1"], recall=["C1", "I1"],
                           buckets=ScopeBucketsModel(), meta=meta)

    def legacy_parts(self, settings=None):
        return render_parts(
            scope_buckets={}, core_nodes=[node("S1", "event", summary="S")],
            recall_nodes=[node("C1", "character", name="C"), node("I1", "reflection", insight="I")],
            settings=settings,
        )

    def test_reference_legacy_string(self):
        inj = self.legacy_parts(REFERENCE)
        assert inj.text == golden("reference_4_3_legacy.txt")
        assert [b.section for b in inj.blocks] == ["core", "recalled"]
        assert [t.heading for t in inj.blocks[1].tables] == ["## 当前状态记忆", "## 反思与长期锚点"]

    def test_legacy_group_headings_follow_english_content(self):
        inj = self.legacy_parts()
        assert inj.text == replaced(golden("reference_4_3_legacy.txt"), ("## 当前状态记忆", "## Current State"),
                                    ("## 反思与长期锚点", "## Reflections and Long-Term Anchors"))
        assert [t.heading for t in inj.blocks[1].tables] == ["## Current State", "## Reflections and Long-Term Anchors"]

    def test_legacy_never_prints_gated_node(self):
        """Departure 2: a node the gate removed stays out even when the legacy layout is used."""
        inj = render(self.legacy_result(retrieval={"gate_suppressed": ["G1"]}), REFERENCE)
        assert inj.text == golden("reference_4_3_legacy.txt")
        assert "gated" not in inj.text
        assert [(o.node_id, o.reason) for o in inj.omitted] == [("G1", "gate-suppressed")]
        top = render(self.legacy_result(gate_suppressed=["G1"]), REFERENCE)
        assert top.text == inj.text

    def test_legacy_only_prints_listed_nodes(self):
        result = self.legacy_result()
        extra = make_result([*result.nodes.values(), node("X1", "rule", title="stray")], core=["S1"],
                            recall=["C1", "I1"], scores={"C1": 0.5, "I1": 0.4})
        assert render(extra, REFERENCE).text == golden("reference_4_3_legacy.txt")

    def test_no_legacy_when_a_scoped_section_exists(self):
        inj = render_parts(scope_buckets={"objectiveGlobal": [node("S1", "event", summary="S")]},
                           recall_nodes=[node("C1", "character", name="C")])
        assert inj.text == "[Memory - Objective / Global]\nevent_table:\n| summary |\n| --- |\n| S |"

    def test_no_legacy_when_a_summary_exists(self):
        inj = render_parts(summary_entries=[SummaryEntry(id="s", text="T", message_range=(1, 2))], scope_buckets={},
                           core_nodes=[node("S1", "event", summary="S")])
        assert inj.text == "[Summary - Active Frontier]\n[Summary L0 / messages 1 ~ 2]\nT"

    def test_everything_empty(self):
        assert render_parts().text == ""
        assert render_parts(scope_buckets={}).model_dump() == {
            "text": "", "blocks": [], "omitted": [], "char_count": 0, "token_estimate": 0}
        assert render(make_result([])).text == ""

    def test_unknown_type_prints_only_header(self):
        mystery = {"id": "m1", "type": "mystery", "fields": {"summary": "?"}}
        inj = render_parts(scope_buckets={"objectiveCurrentRegion": [mystery]})
        assert inj.text == "[Memory - Objective / Current Region]"
        assert [(o.node_id, o.reason) for o in inj.omitted] == [("m1", "unknown-type")]
        assert inj.blocks == [InjectionBlock(section="objective_current_region",
                                             heading="[Memory - Objective / Current Region]")]

    def test_unknown_type_in_legacy_group(self):
        mystery = {"id": "m1", "type": "mystery", "fields": {}}
        inj = render_parts(scope_buckets={}, recall_nodes=[mystery])
        assert inj.text == "[Memory - Recalled]\n## Other Related Memories"  # no text at all: English
        inj = render_parts(scope_buckets={}, recall_nodes=[mystery], settings=REFERENCE)
        assert inj.text == "[Memory - Recalled]\n## 其他关联记忆"


class TestScenario44Summary:
    def test_reference_string(self):
        entries = [
            SummaryEntry(id="b", level=0, kind="small", message_range=(10, 12), text="T"),
            SummaryEntry(id="a", level=1, kind="rollup", message_range=(0, 9), text="R"),
            SummaryEntry(id="f", level=0, kind="small", status="folded", message_range=(13, 14), text="F"),
        ]
        assert render_parts(summary_entries=entries, settings=REFERENCE).text == golden("scenario_44.txt")
        assert render_parts(summary_entries=entries).text == replaced(golden("scenario_44.txt"), ("楼 ", "messages "))

    def test_missing_range_and_empty_text(self):
        entries = [{"id": "x", "level": 2, "kind": "legacy-import", "text": "L", "message_range": None},
                   {"id": "y", "level": 0, "text": "   "}]
        assert render_parts(summary_entries=entries).text == (
            "[Summary - Active Frontier]\n[Summary L2 / messages ? ~ ?]\nL")


class TestCharacterPovSections:
    def test_owner_labels_fallback_chain(self):
        a = node("a", "pov_memory", scope=char_pov("Ann"), summary="A")
        b = node("b", "pov_memory", scope=MemoryScope(layer="pov", owner_type="character", owner_id="bob-1"),
                 summary="B")
        c = {"id": "c", "type": "pov_memory", "fields": {"summary": "C"}, "scope": {}}
        inj = render_parts(scope_buckets={
            "characterPovByOwner": {"character:ann": [a], "character:bob-1": [b], "character:zed": [c], "": [c]},
            "characterPovOwnerOrder": ["character:ann", "character:bob-1", "character:zed", ""],
        }, owner_labels={"character:ann": "Ann Lee"})
        headings = [b.heading for b in inj.blocks]
        assert headings == ["[Memory - Character POV: Ann Lee]", "[Memory - Character POV: bob-1]",
                            "[Memory - Character POV: character:zed]", "[Memory - Character POV: unnamed character]"]
        # ``c`` is printed once (under zed); the last section's list is not empty, so as in the reference its
        # header is printed although its only node was already printed.
        assert inj.text.count("| POV: unnamed | C |") == 1
        assert inj.text.endswith("| POV: unnamed | C |\n\n[Memory - Character POV: unnamed character]")

    def test_unnamed_owner_label(self):
        c = {"id": "c", "type": "pov_memory", "fields": {"summary": "C"}, "scope": {}}
        inj = render_parts(scope_buckets={"characterPovByOwner": {"": [c]}, "characterPovOwnerOrder": [""]})
        assert inj.blocks[0].heading == "[Memory - Character POV: unnamed character]"
        inj = render_parts(scope_buckets={"characterPovByOwner": {"": [c]}, "characterPovOwnerOrder": [""]},
                           settings=REFERENCE)
        assert inj.blocks[0].heading == "[Memory - Character POV: 未命名角色]"

    def test_single_section_without_order(self):
        a = node("a", "pov_memory", scope=char_pov("Ann"), summary="A")
        inj = render_parts(scope_buckets={"characterPov": [a]})
        assert inj.text.splitlines()[0] == "[Memory - Character POV]"

    def test_flags(self):
        u = node("u", "pov_memory", scope=user_pov("P"), summary="U")
        g = node("g", "event", summary="G")
        inj = render_parts(scope_buckets={"userPov": [u], "objectiveGlobal": [g]},
                           settings=InjectorSettings(inject_user_pov_memory=False,
                                                     inject_objective_global_memory=False))
        assert inj.text == ""
        assert [(o.node_id, o.reason) for o in inj.omitted] == [("u", "user-pov-disabled"),
                                                                 ("g", "objective-global-disabled")]


class TestFixtureGoldens:
    """English and Chinese blocks from the real fixture graphs (see the module docstring for how the goldens were
    made)."""

    def test_english(self):
        inj = render(en_result(), InjectorSettings())
        assert inj.text == golden("en_thornwick_block.txt")
        assert golden("en_user_pov_section.hand.txt") in inj.text
        assert "[Memory - Character POV: Erin Vale]" in inj.text
        assert "A burglar broke in from the garden" not in inj.text
        assert [(o.node_id, o.reason) for o in inj.omitted] == [("ev-will-reading", "core-cap"),
                                                                 ("ev-burglar-theory", "gate-suppressed")]

    def test_chinese(self):
        inj = render(zh_result(), InjectorSettings())
        assert inj.text == golden("zh_bell_tower_block.txt")
        assert golden("zh_character_pov_section.hand.txt") in inj.text
        assert "[Memory - Character POV: 露西亚]" in inj.text
        assert inj.omitted == []
        assert inj.token_estimate > 0 and inj.char_count == len(inj.text)


class TestDeterminism:
    @pytest.mark.parametrize("build", [en_result, zh_result])
    def test_same_input_same_bytes(self, build):
        a = render(build(), InjectorSettings())
        b = render(build(), InjectorSettings())
        assert a.text.encode("utf-8") == b.text.encode("utf-8")
        assert a.model_dump_json() == b.model_dump_json()

    def test_input_not_mutated(self):
        result = en_result()
        before = result.model_dump_json()
        render(result, InjectorSettings(max_chars=500))
        assert result.model_dump_json() == before


@functools.cache
def pipeline_result():
    """A real recall over the Chinese fixture (lexical only, no providers)."""
    snap = snapshot_from_graph(fixture_graph("zh-bell-tower"), now_ms=NOW_MS, embeddings={})
    query = RecallQuery(user_message="露西亚和卡尔在储藏室说了什么？", now_ms=NOW_MS)
    return retrieve(snap, query, RecallSettings(), Providers())


class TestPipelineEndToEnd:
    @pytest.mark.parametrize("max_chars", [16_000, 1_200])
    def test_prints_only_admitted_nodes(self, max_chars):
        result = pipeline_result()
        inj = render(result, RecallSettings(injector={"max_chars": max_chars}))
        printed = [nid for b in inj.blocks for t in b.tables for nid in t.node_ids]
        assert printed and len(printed) == len(set(printed))
        assert set(printed) <= set(result.selected_node_ids) | set(result.core_node_ids)
        assert not set(printed) & set(result.meta["retrieval"].get("gate_suppressed", []))
        assert inj.char_count <= max_chars
        assert inj == render(result, RecallSettings(injector={"max_chars": max_chars}))


class TestConfigurableHeadings:
    """Headings are settings; the defaults reproduce the reference text (the goldens above), others replace it."""

    def test_english_headings_replace_every_reference_line(self):
        from memory_recall.settings import RecallSettings

        settings = RecallSettings().with_overrides({"injector": {"headings": {
            "summary": "[Story so far]", "character_pov_owner": "[What {owner} remembers]",
            "user_pov": "[Player's view]", "user_pov_note": "Not known to the characters.",
            "objective_current_region": "[Here]", "objective_global": "[Elsewhere]",
        }}}).injector
        ex = reference_example()
        inj = render_parts(
            summary_entries=[ex["summary"]],
            scope_buckets={
                "characterPovByOwner": {"character:艾琳": [ex["char"]]},
                "characterPovOwnerOrder": ["character:艾琳"],
                "userPov": [ex["user"]],
                "objectiveCurrentRegion": [ex["event"]],
                "objectiveGlobal": [ex["synopsis"]],
            },
            owner_labels={"character:艾琳": "艾琳"},
            settings=settings,
        )
        expected = golden("reference_4_3.txt")
        for old, new in (
            ("[Summary - Active Frontier]", "[Story so far]"),
            ("[Memory - Character POV: 艾琳]", "[What 艾琳 remembers]"),
            ("[Memory - User POV / Not Character Facts]", "[Player's view]"),
            ("这些是用户/玩家侧主观记忆，不等于角色已知事实；只能作为关系、承诺、情绪和长期互动背景参考。",
             "Not known to the characters."),
            ("[Memory - Objective / Current Region]", "[Here]"),
            ("[Memory - Objective / Global]", "[Elsewhere]"),
        ):
            assert old in expected
            expected = expected.replace(old, new)
        assert inj.text == expected

    def test_owner_heading_needs_its_slot(self):
        from memory_recall.errors import ConfigError
        from memory_recall.settings import RecallSettings

        with pytest.raises(ConfigError, match="must contain '\\{owner\\}'"):
            RecallSettings().with_overrides({"injector": {"headings": {"character_pov_owner": "[POV]"}}})


def _has_han(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


class TestBlockLanguage:
    """Departure "Injector labels": the fixed labels follow the language of the printed memories (``auto``), or
    the ``language`` setting; headings changed from their defaults are printed as written."""

    def test_english_fixture_differs_from_the_reference_labels_in_labels_only(self):
        expected = replaced(
            golden("en_thornwick_block.txt"),
            ("[Summary L0 / messages 0 ~ 15]", "[Summary L0 / 楼 0 ~ 15]"),
            ("[Summary L0 / messages 16 ~ 29]", "[Summary L0 / 楼 16 ~ 29]"),
            ("\n| Character: Erin |", "\n| 角色: Erin |"), ("\n| User: Wren |", "\n| 用户: Wren |"), (EN_NOTE, ZH_NOTE),
        )
        assert render(en_result(), REFERENCE).text == expected
        assert not _has_han(golden("en_thornwick_block.txt"))

    def test_chinese_fixture_in_english_when_asked(self):
        expected = replaced(
            golden("zh_bell_tower_block.txt"),
            ("[Summary L1 / Rolled Up / 楼 0 ~ 21]", "[Summary L1 / Rolled Up / messages 0 ~ 21]"),
            ("[Summary L0 / 楼 22 ~ 27]", "[Summary L0 / messages 22 ~ 27]"),
            ("\n| 角色: ", "\n| Character: "), ("\n| 用户: 叶行 |", "\n| User: 叶行 |"), (ZH_NOTE, EN_NOTE),
        )
        assert render(zh_result(), InjectorSettings(language="en")).text == expected
        assert render(zh_result(), InjectorSettings(language="zh")).text == golden("zh_bell_tower_block.txt")

    def every_label(self, summary: str, text: str):
        """Parts that print every fixed label of the scoped layout: summary header, an unnamed character owner
        (section label and owner cell), a user POV with its note."""
        nameless = {"id": "c", "type": "pov_memory", "fields": {"summary": text},
                    "scope": {"layer": "pov", "owner_type": "character"}}
        return dict(
            summary_entries=[SummaryEntry(id="s", text=summary, message_range=(3, 4))],
            scope_buckets={"characterPovByOwner": {"": [nameless]}, "characterPovOwnerOrder": [""],
                           "userPov": [node("u", "pov_memory", scope=user_pov(""), summary=text)],
                           "objectiveGlobal": [node("g", "event", summary=text)]},
        )

    def test_english_block_has_no_chinese_label(self):
        inj = render_parts(**self.every_label("They met at dawn.", "Ann waits"))
        assert inj.text == "\n".join([
            "[Summary - Active Frontier]", "[Summary L0 / messages 3 ~ 4]", "They met at dawn.", "",
            "[Memory - Character POV: unnamed character]", "pov_memory_table:", "| owner | summary |",
            "| --- | --- |", "| Character: unnamed | Ann waits |", "",
            "[Memory - User POV / Not Character Facts]", EN_NOTE, "pov_memory_table:", "| owner | summary |",
            "| --- | --- |", "| User: unnamed | Ann waits |", "",
            "[Memory - Objective / Global]", "event_table:", "| summary |", "| --- |", "| Ann waits |",
        ])
        legacy = render_parts(scope_buckets={}, recall_nodes=[
            node(f"n{t}", t, summary="Ann waits", name="Ann", insight="Ann waits", title="Rule")
            for t in ("character", "event", "reflection", "rule", "message")])
        assert [line for line in legacy.text.splitlines() if line.startswith("## ")] == [
            "## Current State", "## Events and Episodes", "## Reflections and Long-Term Anchors",
            "## Rules and Constraints", "## Other Related Memories"]
        assert not _has_han(inj.text) and not _has_han(legacy.text)

    def test_chinese_block_keeps_the_reference_labels(self):
        inj = render_parts(**self.every_label("他们在黎明相见。", "安妮在等待"))
        assert inj.text == "\n".join([
            "[Summary - Active Frontier]", "[Summary L0 / 楼 3 ~ 4]", "他们在黎明相见。", "",
            "[Memory - Character POV: 未命名角色]", "pov_memory_table:", "| owner | summary |",
            "| --- | --- |", "| 角色: 未命名 | 安妮在等待 |", "",
            "[Memory - User POV / Not Character Facts]", ZH_NOTE, "pov_memory_table:", "| owner | summary |",
            "| --- | --- |", "| 用户: 未命名 | 安妮在等待 |", "",
            "[Memory - Objective / Global]", "event_table:", "| summary |", "| --- |", "| 安妮在等待 |",
        ])

    def test_language_is_decided_on_everything_passed_in_before_the_budget(self):
        # The Chinese row outweighs the English one and its owner names (2 × 19 Han > 26 letters): Chinese labels.
        # The budget then drops that row (the lower score); the labels of what is left do not switch.
        rows = [node("u", "pov_memory", scope=user_pov("Wren"), summary="Wren waits by the door"),
                node("v", "pov_memory", scope=user_pov("Wren"), summary="叶行夹在露西亚的恳求和孩子们的性命之间")]
        full = render_parts(scope_buckets={"userPov": rows}, scores={"u": 1.0, "v": 0.1})
        assert "| 用户: Wren | Wren waits by the door |" in full.text
        cut = render_parts(scope_buckets={"userPov": rows}, scores={"u": 1.0, "v": 0.1},
                           settings=InjectorSettings(max_chars=len(full.text) - 10))
        assert [(o.node_id, o.reason) for o in cut.omitted] == [("v", "budget-block")]
        assert cut.text.splitlines()[1] == ZH_NOTE
        assert cut.text.endswith("| 用户: Wren | Wren waits by the door |")

    def test_changed_headings_are_printed_as_written(self):
        headings = {"group_state": "## State", "user_pov_note": "Player-side only."}
        settings = RecallSettings().with_overrides({"injector": {"headings": headings}}).injector
        legacy = render_parts(scope_buckets={}, recall_nodes=[node("c", "character", name="Ann"),
                                                               node("i", "reflection", insight="Ann")],
                              settings=settings)
        assert [line for line in legacy.text.splitlines() if line.startswith("## ")] == [
            "## State", "## Reflections and Long-Term Anchors"]
        chinese = render_parts(scope_buckets={"userPov": [node("u", "pov_memory", scope=user_pov("叶行"),
                                                               summary="叶行很矛盾")]}, settings=settings)
        assert chinese.text.splitlines()[:2] == ["[Memory - User POV / Not Character Facts]", "Player-side only."]
        assert "| 用户: 叶行 | 叶行很矛盾 |" in chinese.text

    @pytest.mark.parametrize(("summary", "label"), [("Ann waits", "unnamed character"), ("安妮在等待", "未命名角色")])
    def test_result_placeholder_owner_label_follows_the_block(self, summary, label):
        # The result builder labels an owner with neither key nor name "未命名角色".
        pov = {"id": "p", "type": "pov_memory", "fields": {"summary": summary}, "scope": {}}
        result = make_result([pov], scores={"p": 0.5}, recall=["p"], buckets=ScopeBucketsModel(
            characterPov=["p"], characterPovByOwner={"": ["p"]}, characterPovOwnerOrder=[""],
            characterPovOwnerLabels={"": "未命名角色"}))
        assert render(result).blocks[0].heading == f"[Memory - Character POV: {label}]"

    def test_setting_is_validated(self):
        from memory_recall.errors import ConfigError

        assert RecallSettings().with_overrides({"injector": {"language": "en"}}).injector.language == "en"
        assert InjectorSettings().language == "auto"
        with pytest.raises(ConfigError, match="injector.language"):
            RecallSettings().with_overrides({"injector": {"language": "fr"}})
