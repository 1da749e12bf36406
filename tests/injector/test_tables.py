"""Table format and cell handling (reference §4.2, scenario 42)."""

from __future__ import annotations

import pytest
from injector_helpers import char_pov, node, user_pov

from injector import render_parts
from injector.labels import EN
from injector.tables import build_table, format_cell, js_number, js_string, table_lines
from memory_recall.model.graph import DEFAULT_SCHEMA, MemoryScope
from memory_recall.settings import InjectorSettings

SPEC = {s.id: s for s in DEFAULT_SCHEMA}


def table(type_, nodes, *, cell_chars=200, labels=True):
    return build_table(SPEC[type_], nodes, cell_chars=cell_chars, story_time_labels=labels)


class TestScenario42CellHandling:
    """Scenario 42, exactly as listed in the reference."""

    def test_reference_cases(self):
        long = "x" * 250
        t = table("character", [
            node("c1", "character", name="A|B", state="line1\nline2", traits=["brave", "kind"], goal=long,
                 inventory=""),
            node("c2", "character", name="N"),
        ])
        assert t.columns == ["name", "traits", "state", "goal"]  # inventory/core_note empty in every row
        assert t.rows == [["A\\|B", "brave,kind", "line1 line2", "x" * 200], ["N", "", "", ""]]
        assert table_lines(t) == [
            "character_table:",
            "| name | traits | state | goal |",
            "| --- | --- | --- | --- |",
            f"| A\\|B | brave,kind | line1 line2 | {'x' * 200} |",
            "| N |  |  |  |",
        ]


class TestCellString:
    @pytest.mark.parametrize(("value", "expected"), [
        (None, ""),
        ("", ""),
        ("text", "text"),
        (True, "true"),
        (False, "false"),
        (5, "5"),
        (5.0, "5"),
        (-2.5, "-2.5"),
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (1.5e-6, "0.0000015"),
        (-0.0, "0"),
        (2**60, "1152921504606847000"),
        ({"a": 1}, "[object Object]"),
        ([], ""),
        (["a", None, 1.0, True], "a,,1,true"),
        (["a", ["b", "c"]], "a,b,c"),
        ([{"k": "v"}, "x"], "[object Object],x"),
    ])
    def test_js_string(self, value, expected):
        assert js_string(value) == expected

    def test_js_number_large_and_special(self):
        assert js_number(float("inf")) == "Infinity"
        assert js_number(float("-inf")) == "-Infinity"
        assert js_number(float("nan")) == "NaN"
        assert js_number(123456789012345680000.0) == "123456789012345680000"
        assert js_number(1.2345e-5) == "0.000012345"

    def test_escape_then_cut(self):
        # The escape is applied first, so a cut can split it (as in the reference).
        assert format_cell("x" * 199 + "|", 200) == "x" * 199 + "\\"
        assert format_cell("a\r\nb", 200) == "a\r b"
        assert format_cell("a||b", 200) == "a\\|\\|b"

    def test_cut_counts_js_units(self):
        astral = "\U0001f600"  # two UTF-16 units
        assert format_cell(astral * 3, 4) == astral * 2
        assert format_cell("a" + astral, 2) == "a"
        assert format_cell("x" * 20, 10) == "x" * 10


class TestColumns:
    def test_present_means_not_null_and_not_empty_string(self):
        t = table("location", [node("l", "location", name="L", state=0, features=False, danger=[])])
        assert t.columns == ["name", "state", "features", "danger"]
        assert t.rows == [["L", "0", "false", ""]]

    def test_no_columns(self):
        t = table("event", [node("e", "event")])
        assert t.columns == [] and t.rows == [[]]
        assert table_lines(t) == ["event_table:", "|  |", "|  |", "|  |"]

    def test_schema_order(self):
        t = table("event", [node("e", "event", status="s", summary="m", title="t", participants="p")])
        assert t.columns == ["title", "summary", "participants", "status"]


class TestDerivedColumns:
    def test_owner_prefixes(self):
        other = {"id": "o", "type": "pov_memory", "fields": {"summary": "S"},
                 "scope": {"layer": "pov", "owner_type": "", "owner_id": "zed"}}
        nameless = node("n", "pov_memory", scope=MemoryScope(layer="pov", owner_type="user"), summary="S")
        idonly = node("i", "pov_memory", scope=MemoryScope(layer="pov", owner_type="character", owner_id="c-1"),
                      summary="S")
        t = table("pov_memory", [node("c", "pov_memory", scope=char_pov("Ann"), summary="S"),
                                 node("u", "pov_memory", scope=user_pov("Me"), summary="S"), other, nameless, idonly])
        assert [r[0] for r in t.rows] == ["角色: Ann", "用户: Me", "POV: zed", "用户: 未命名", "角色: c-1"]
        assert t.columns == ["owner", "summary"]
        english = build_table(SPEC["pov_memory"], [node("c", "pov_memory", scope=char_pov("Ann"), summary="S"),
                                                    node("u", "pov_memory", scope=user_pov("Me"), summary="S"),
                                                    other, nameless, idonly],
                              cell_chars=200, story_time_labels=True, labels=EN)
        assert [r[0] for r in english.rows] == ["Character: Ann", "User: Me", "POV: zed", "User: unnamed",
                                                "Character: c-1"]

    def test_story_time_only_when_a_row_has_one(self):
        a = node("a", "event", time="Dawn", tense="past", summary="A")
        b = node("b", "event", time="Noon", summary="B")
        c = node("c", "event", summary="C")
        assert table("event", [a, b, c]).rows == [["Dawn · past", "A"], ["Noon", "B"], ["", "C"]]
        assert table("event", [c]).columns == ["summary"]
        assert table("event", [a], labels=False).columns == ["summary"]

    def test_story_time_span_types(self):
        for type_, col in (("thread", "title"), ("synopsis", "summary"), ("reflection", "insight")):
            n = node("x", type_, span=("S", "E"), **{col: "v"})
            same = node("y", type_, span=("S", "S"), **{col: "w"})
            t = table(type_, [n, same])
            assert t.columns == ["story_time_span", col]
            assert [r[0] for r in t.rows] == ["S -> E", "S"]
        # Point story time is not printed for span types, nor spans for event tables.
        assert table("thread", [node("t", "thread", time="Dawn", title="T")]).columns == ["title"]
        assert table("event", [node("e", "event", span=("S", "E"), title="T")]).columns == ["title"]

    def test_camel_case_nodes(self):
        raw = {"id": "r", "type": "pov_memory", "fields": {"summary": "S"},
               "scope": {"layer": "pov", "ownerType": "character", "ownerName": "Kai"},
               "storyTime": {"label": "Dusk", "tense": "ongoing"}}
        assert table("pov_memory", [raw]).rows == [["角色: Kai", "Dusk · ongoing", "S"]]


class TestProjectTypes:
    def test_message_and_entity_tables(self):
        msg = node("m1", "message", speaker="Ann", summary="hello | there", participants=["Ann", "Bo"], date="d1")
        ent = node("e1", "entity", name="Bo", kind="person", aliases=["Bobby", "B"])
        inj = render_parts(scope_buckets={"objectiveGlobal": [msg, ent]})
        assert inj.text == "\n".join([
            "[Memory - Objective / Global]",
            "message_table:",
            "| speaker | summary | participants | date |",
            "| --- | --- | --- | --- |",
            "| Ann | hello \\| there | Ann,Bo | d1 |",
            "entity_table:",
            "| name | kind | aliases |",
            "| --- | --- | --- |",
            "| Bo | person | Bobby,B |",
        ])


class TestBlockRules:
    def test_node_printed_once_per_block(self):
        e = node("e", "event", summary="E")
        inj = render_parts(scope_buckets={"objectiveCurrentRegion": [e], "objectiveGlobal": [e, node("f", "event",
                                                                                                    summary="F")]})
        assert inj.text.count("| E |") == 1
        assert inj.blocks[1].tables[0].node_ids == ["f"]

    def test_types_grouped_in_first_appearance_order(self):
        nodes = [node("r", "rule", title="R"), node("e1", "event", summary="E1"), node("r2", "rule", title="R2"),
                 node("e2", "event", summary="E2")]
        inj = render_parts(scope_buckets={"objectiveGlobal": nodes})
        tables = inj.blocks[0].tables
        assert [(t.type, t.node_ids) for t in tables] == [("rule", ["r", "r2"]), ("event", ["e1", "e2"])]

    def test_cell_chars_setting(self):
        inj = render_parts(scope_buckets={"objectiveGlobal": [node("e", "event", summary="y" * 50)]},
                           settings=InjectorSettings(cell_chars=10))
        assert inj.blocks[0].tables[0].rows == [["y" * 10]]
