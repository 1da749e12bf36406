"""Caps and character budget (recall-spec departure 5, reference §7 item 15)."""

from __future__ import annotations

import pytest
from injector_helpers import char_pov, node, user_pov, zh_result

from injector import render, render_parts
from injector.budget import DropCandidate, fill_cap, fit
from memory_recall.model.state import SummaryEntry
from memory_recall.settings import InjectorSettings


def ev(nid: str, text: str = "", n: int = 80) -> dict:
    return node(nid, "event", summary=text or (nid + " " + "x" * n))


def reasons(inj) -> list[tuple[str, str]]:
    return [(o.node_id, o.reason) for o in inj.omitted]


def settings(**kw) -> InjectorSettings:
    return InjectorSettings(**kw)


class TestFillCap:
    def test_scored_first_then_given_order(self):
        nodes = [ev("a"), ev("b"), ev("c"), ev("d")]
        kept, left = fill_cap(nodes, {"c": 0.2, "d": 0.9}, 3)
        assert [n["id"] for n in kept] == ["a", "c", "d"]  # kept in given (recall) order
        assert [n["id"] for n in left] == ["b"]

    def test_zero_and_oversized_caps(self):
        nodes = [ev("a"), ev("b")]
        assert fill_cap(nodes, {}, 0) == ([], nodes)
        assert fill_cap(nodes, {}, 5) == (nodes, [])


class TestFit:
    """Bisection finds the shortest drop prefix (lengths non-increasing in the number of drops)."""

    WEIGHTS = {"a": 50, "b": 30, "c": 20, "d": 10}

    def length(self, dropped: frozenset[str]) -> int:
        return 200 - sum(self.WEIGHTS[k] for k in dropped)

    def candidates(self):
        ranks = {"a": (1, 0.5), "b": (1, 0.1), "c": (2, 0.0), "d": (0, 0.0)}
        return [DropCandidate(k, "s", ranks[k]) for k in "abcd"]

    @pytest.mark.parametrize(("limit", "expected"), [
        (200, []), (199, ["d"]), (190, ["d"]), (189, ["d", "b"]), (160, ["d", "b"]), (159, ["d", "b", "a"]),
        (110, ["d", "b", "a"]), (109, ["d", "b", "a", "c"]), (0, ["d", "b", "a", "c"]),
    ])
    def test_shortest_prefix(self, limit, expected):
        assert fit(self.candidates(), self.length, limit) == expected


class TestCoreCap:
    def test_filled_by_score_not_recency(self):
        # Recall order = most recent first; the old core event has a score, so it beats the recent unscored ones.
        core = [ev("new1"), ev("new2"), ev("new3"), ev("old")]
        inj = render_parts(scope_buckets={"objectiveGlobal": core}, core_nodes=core, scores={"old": 0.3},
                           settings=settings(core_cap=2, objective_global_cap=10))
        assert inj.blocks[0].tables[0].node_ids == ["new1", "old"]
        assert reasons(inj) == [("new2", "core-cap"), ("new3", "core-cap")]

    def test_selected_core_node_is_never_capped_out(self):
        core = [ev("a"), ev("b")]
        inj = render_parts(scope_buckets={"objectiveGlobal": core}, core_nodes=core, recall_nodes=[],
                           scores={"b": 0.1}, settings=settings(core_cap=0))
        assert inj.blocks[0].tables[0].node_ids == ["b"]
        assert reasons(inj) == [("a", "core-cap")]

    def test_legacy_layout_capped(self):
        inj = render_parts(scope_buckets={}, core_nodes=[ev("a"), ev("b"), ev("c")], settings=settings(core_cap=1))
        assert [t.node_ids for t in inj.blocks[0].tables] == [["a"]]
        assert reasons(inj) == [("b", "core-cap"), ("c", "core-cap")]


class TestObjectiveGlobalCap:
    def test_filled_by_score(self):
        nodes = [ev(f"g{k}") for k in range(5)]
        inj = render_parts(scope_buckets={"objectiveGlobal": nodes}, scores={"g4": 0.9, "g3": 0.1},
                           settings=settings(objective_global_cap=3))
        assert inj.blocks[0].tables[0].node_ids == ["g0", "g3", "g4"]
        assert reasons(inj) == [("g1", "objective-global-cap"), ("g2", "objective-global-cap")]

    def test_result_omissions_passed_through(self):
        inj = render(zh_result(), InjectorSettings())
        assert inj.omitted == []


class TestRowBudget:
    def test_long_row_dropped_whole(self):
        long = node("long", "event", title="t" * 150, summary="s" * 150)
        short = ev("short")
        inj = render_parts(scope_buckets={"objectiveGlobal": [long, short]},
                           settings=settings(max_row_chars=200))
        assert "t" * 10 not in inj.text
        assert inj.blocks[0].tables[0].node_ids == ["short"]
        assert [(o.node_id, o.reason, o.section) for o in inj.omitted] == [("long", "budget-row", "objective_global")]
        # Columns are recomputed for the rows that stay: no empty title column.
        assert inj.blocks[0].tables[0].columns == ["summary"]

    def test_only_row_of_section_drops_header(self):
        long = node("long", "event", summary="s" * 190, title="t" * 190)
        inj = render_parts(scope_buckets={"objectiveCurrentRegion": [long], "objectiveGlobal": [ev("g")]},
                           settings=settings(max_row_chars=300))
        assert "[Memory - Objective / Current Region]" not in inj.text
        assert inj.text.startswith("[Memory - Objective / Global]")


def scoped_fixture():
    """Four sections with rows of known scores."""
    return {
        "characterPovByOwner": {"character:ann": [node("c1", "pov_memory", scope=char_pov("Ann"), summary="c" * 80),
                                                  node("c2", "pov_memory", scope=char_pov("Ann"), summary="d" * 80)]},
        "characterPovOwnerOrder": ["character:ann"],
        "userPov": [node("u1", "pov_memory", scope=user_pov("Me"), summary="u" * 80)],
        "objectiveCurrentRegion": [ev("r1"), ev("r2"), ev("r3")],
        "objectiveGlobal": [ev("g1"), ev("g2"), ev("g3")],
    }


SCORES = {"c1": 0.2, "c2": 0.9, "u1": 0.5, "r1": 0.1, "r2": 0.8, "g1": 0.3, "g3": 0.95}
#: Expected drop order: lowest-priority section first (global < current region < user < character), unscored
#: rows first, then by score, later rows first among unscored ones; summary entries last.
DROP_ORDER = ["g2", "g1", "g3", "r3", "r1", "r2", "u1", "c1", "c2", "sum-old", "sum-new"]


def budgeted(max_chars: int):
    return render_parts(
        summary_entries=[SummaryEntry(id="sum-new", text="N" * 60, message_range=(5, 9)),
                         SummaryEntry(id="sum-old", text="O" * 60, message_range=(0, 4))],
        scope_buckets=scoped_fixture(), scores=SCORES,
        settings=settings(max_chars=max_chars, objective_global_cap=10),
    )


class TestBlockBudget:
    def test_unbudgeted_fits(self):
        full = budgeted(16_000)
        assert full.omitted == []
        assert full.char_count == len(full.text) > 1000

    def test_one_char_over_drops_one_row(self):
        full = budgeted(16_000)
        inj = budgeted(full.char_count - 1)
        assert reasons(inj) == [("g2", "budget-block")]
        assert inj.omitted[0].section == "objective_global"
        assert "g2 " not in inj.text and "g1 " in inj.text

    @pytest.mark.parametrize("max_chars", [200, 300, 450, 600, 750, 900, 1000, 1100, 1200])
    def test_drop_order_and_limit(self, max_chars):
        inj = budgeted(max_chars)
        assert inj.char_count <= max_chars
        dropped = [nid for nid, r in reasons(inj)]
        assert all(r == "budget-block" for _, r in reasons(inj))
        assert dropped == DROP_ORDER[: len(dropped)]
        kept = [nid for b in inj.blocks for t in b.tables for nid in t.node_ids]
        kept += [e.id for b in inj.blocks for e in b.summary_entries]
        assert sorted(kept) == sorted(DROP_ORDER[len(dropped):])

    @pytest.mark.parametrize("max_chars", range(200, 1400, 37))
    def test_headers_only_with_rows(self, max_chars):
        inj = budgeted(max_chars)
        assert inj.char_count <= max_chars
        text = inj.text
        for block in inj.blocks:
            assert block.tables or block.summary_entries
            assert block.heading in text
        for heading in ("[Memory - Objective / Global]", "[Memory - Objective / Current Region]",
                        "[Memory - User POV / Not Character Facts]", "[Memory - Character POV: Ann]",
                        "[Summary - Active Frontier]"):
            if heading in text:
                assert any(b.heading == heading for b in inj.blocks)
        # Every table printed has at least one row, and each row is whole.
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.endswith("_table:"):
                assert lines[i + 3].startswith("| ") and lines[i + 3].endswith(" |")
        # The user-POV note (English: the memories are Latin text) never outlives its section.
        assert ("These are the user's (player's) subjective memories" in text) == (
            "[Memory - User POV / Not Character Facts]" in text)
        assert "这些是用户/玩家侧主观记忆" not in text

    def test_summary_kept_longest(self):
        inj = budgeted(200)
        assert inj.text.startswith("[Summary - Active Frontier]")
        assert [b.section for b in inj.blocks] == ["summary"]
        assert "N" * 60 in inj.text

    def test_nothing_fits(self):
        many = [{"id": f"m{k}", "type": "mystery", "fields": {}} for k in range(3)]
        buckets = {"characterPovByOwner": {f"character:{'x' * 100}{k}": [many[k]] for k in range(3)},
                   "characterPovOwnerOrder": [f"character:{'x' * 100}{k}" for k in range(3)]}
        inj = render_parts(scope_buckets=buckets, settings=settings(max_chars=200))
        assert inj.text == "" and inj.blocks == []
        assert [r for _, r in reasons(inj)] == ["unknown-type"] * 3

    def test_fixture_budget_drops_lowest_priority_rows(self):
        full = render(zh_result(), InjectorSettings())
        inj = render(zh_result(), InjectorSettings(max_chars=1500))
        assert full.char_count > 1500 >= inj.char_count
        assert reasons(inj)[:4] == [("rule-midnight-bell", "budget-block"), ("thread-missing-children", "budget-block"),
                                    ("ev-ambush-plan", "budget-block"), ("refl-midnight-signal", "budget-block")]
        assert "[Memory - Objective / Global]" not in inj.text
        # What survives is byte-identical to the unbudgeted block's prefix up to the first dropped section.
        assert full.text.startswith(inj.text.split("\n\n[Memory - Objective")[0])

    def test_deterministic(self):
        a, b = budgeted(700), budgeted(700)
        assert a.model_dump_json() == b.model_dump_json()
