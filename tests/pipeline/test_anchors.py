"""AnchorStage: entity anchors from node names/titles found in the user message (reference §3.8, departure
8)."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from ctx_helpers import assert_not_mutated, edge, make_state, node, result_image, snapshot

from memory_recall.pipeline.anchors import AnchorStage, find_anchors
from memory_recall.settings import AnchorSettings
from memory_recall.text.mentions import fold, term_at_boundaries
from memory_recall.text.normalize import normalize_query

STAGE = AnchorStage(AnchorSettings())


def anchors_of(snap, message: str, **kw):
    res = STAGE.run(make_state(snap, message, **kw))
    return [(snap.ids[i], term) for i, term in res.state.anchors], res


class TestScenario7:
    def test_scenario_7_cjk_substring_one_char_names_never_anchor(self):
        snap = snapshot(
            [node("a", name="艾琳"), node("b", "location", title="钟楼", name="X"), node("c", name="A")]
        )
        found, res = anchors_of(snap, "艾琳在钟楼")
        assert found == [("a", "艾琳"), ("b", "钟楼")]
        assert res.state.meta["anchorCount"] == 2
        assert (res.trace.count_in, res.trace.count_out) == (3, 2)


class TestScenario33:
    @classmethod
    def snap(cls):
        return snapshot(
            [
                node("a", name="Alice"),
                node("b", "location", name="Garden"),
                node("c", "location", name="Tower"),
            ],
            [edge("a", "b", 0.5)],
        )

    def test_scenario_33_alice_anchors_only_a(self):
        found, _ = anchors_of(self.snap(), "Alice?")
        assert found == [("a", "Alice")]

    def test_scenario_33_nobody_anchors_nothing(self):
        found, res = anchors_of(self.snap(), "nobody")
        assert found == []
        assert not res.trace.skipped
        assert res.state.meta["anchorCount"] == 0


class TestLatinMatching:
    """Departure 8 (§7 item 16): case- and accent-insensitive, on word boundaries; the reference was a
    case-sensitive raw substring test."""

    @pytest.mark.parametrize(
        ("message", "found"),
        [
            ("where is alice", True),
            ("ALICE!", True),
            ("Alice's garden", True),
            ("Malice aforethought", False),
            ("Alicent", False),
            ("我看见Alice了", True),
        ],
    )
    def test_alice(self, message, found):
        result, _ = anchors_of(snapshot([node("a", name="Alice")]), message)
        assert (result == [("a", "Alice")]) is found

    def test_ann_does_not_anchor_announcement(self):
        result, _ = anchors_of(snapshot([node("a", name="Ann")]), "The Announcement")
        assert result == []

    def test_accents_and_multi_word_terms(self):
        snap = snapshot([node("r", name="Renée"), node("t", "location", name="Red Dragon Inn")])
        result, _ = anchors_of(snap, "renee went to the red dragon inn.")
        assert result == [("r", "Renée"), ("t", "Red Dragon Inn")]

    def test_terms_folding_alike_anchor_every_node(self):
        # "Renée", "RENEE" and "Renee" fold to one term: its node list merges the three nodes (sorted, once each).
        snap = snapshot(
            [node("c", name="Renee"), node("a", name="Renée"), node("b", "location", name="RENEE", title="Renée")]
        )
        result, _ = anchors_of(snap, "Renee waved.")
        assert result == [("c", "Renee"), ("a", "Renée"), ("b", "RENEE")]

    def test_digits_on_boundaries(self):
        snap = snapshot([node("r", name="R2")])
        assert anchors_of(snap, "R2D2 beeps")[0] == []
        assert anchors_of(snap, "r2, come here")[0] == [("r", "R2")]


class TestSelection:
    def test_first_term_name_before_title(self):
        snap = snapshot([node("n", "event", name="Bell", title="Bell Tower")])
        assert anchors_of(snap, "the Bell Tower rang")[0] == [("n", "Bell")]
        assert anchors_of(snap, "Bell Tower")[0] == [("n", "Bell")]

    def test_title_when_name_absent_from_message(self):
        snap = snapshot([node("n", "event", name="Zed", title="Bell Tower")])
        assert anchors_of(snap, "the bell tower rang")[0] == [("n", "Bell Tower")]

    def test_one_anchor_per_node_in_graph_order(self):
        snap = snapshot([node("z", name="Tower"), node("a", name="Alice"), node("m", name="Tower")])
        assert anchors_of(snap, "Alice at the Tower, the tower")[0] == [
            ("z", "Tower"),
            ("a", "Alice"),
            ("m", "Tower"),
        ]

    def test_list_valued_names(self):
        snap = snapshot([node("n", name=["Liz", "Elizabeth"])])
        assert anchors_of(snap, "Elizabeth smiled")[0] == [("n", "Elizabeth")]

    def test_inactive_nodes_never_anchor(self):
        snap = snapshot(
            [node("a", name="Alice"), node("b", name="Alice", archived=True), node("c", name="Alice")]
        )
        found, _ = anchors_of(snap, "Alice", active=np.array([True, False, False]))
        assert found == [("a", "Alice")]

    def test_message_normalised_and_cut_to_400(self):
        snap = snapshot([node("a", name="Alice")])
        assert anchors_of(snap, "x" * 398 + " Alice")[0] == []
        assert anchors_of(snap, "  hi\r\n\tAlice  ")[0] == [("a", "Alice")]


class TestSkips:
    def test_disabled(self):
        res = AnchorStage(AnchorSettings(enabled=False)).run(
            make_state(snapshot([node("a", name="Alice")]), "Alice")
        )
        assert (res.trace.skip_reason, res.state.anchors, res.state.skip_reasons) == (
            "anchors-disabled",
            (),
            (),
        )

    def test_empty_message(self):
        _, res = anchors_of(snapshot([node("a", name="Alice")]), "  ")
        assert res.trace.skip_reason == "empty-message"
        assert res.state.skip_reasons == ("empty-message",)

    def test_no_anchor_terms(self):
        _, res = anchors_of(snapshot([node("a", name="A")]), "A")
        assert res.trace.skip_reason == "no-anchor-terms"
        _, res = anchors_of(snapshot(), "Alice")
        assert res.trace.skip_reason == "no-anchor-terms"


class TestScale:
    def test_lookup_not_a_scan_and_matches_brute_force(self):
        names = [f"Name{i:05d}" for i in range(4_000)]
        snap = snapshot([node(f"n{i}", name=n) for i, n in enumerate(names)])
        message = "Name00042 met name03999 and Name123 near Name00007x"
        active = ~snap.archived
        find_anchors(snap, message, active)  # warm the per-snapshot folded index
        start = time.perf_counter()
        found = find_anchors(snap, message, active)
        elapsed = time.perf_counter() - start
        assert [(snap.ids[i], t) for i, t in found] == [("n42", "Name00042"), ("n3999", "Name03999")]
        assert elapsed < 0.05  # about 50 dict lookups, whatever the graph size


def brute_force_anchors(snap, message: str, active) -> list[tuple[int, str]]:
    """§3.8 by definition: every node's first anchor term occurring in the folded message on its boundaries."""
    text = fold(normalize_query(message))
    out = []
    for i, terms in enumerate(snap.anchor_terms):
        if not active[i] or snap.archived[i]:
            continue
        for term in terms:
            t = fold(term)
            if any(
                text[s : s + len(t)] == t and term_at_boundaries(text, s, s + len(t))
                for s in range(len(text) - len(t) + 1)
            ):
                out.append((i, term))
                break
    return out


class TestAgainstDefinition:
    NAMES = [
        *("Ann", "Anna", "Ann Lee", "an", "艾琳", "艾", "钟楼", "钟楼顶", "Renée", "Zoë Ann"),
        *("\U00020bb7", "\U00020bb7\U00020bb8", "ab", "abc", "b c", "x1"),
    ]

    def test_single_astral_character_name_anchors(self):
        # JS length 2, Python length 1: an anchor term although it is one character long.
        snap = snapshot([node("a", name="\U00020bb7"), node("b", name="艾")])
        found, _ = anchors_of(snap, "我见到\U00020bb7和艾了")
        assert found == [("a", "\U00020bb7")]

    def test_random_messages_match_the_definition(self):
        rng = random.Random(7)
        nodes = [
            node(f"n{i:02d}", name=rng.choice(self.NAMES), title=rng.choice(["", *self.NAMES]))
            for i in range(40)
        ]
        snap = snapshot(nodes)
        active = ~snap.archived
        active[::5] = False
        pieces = [*self.NAMES, " ", "，", "'s", "x", "ANN", "renee", "钟", "楼", "-"]
        anchored = 0
        for _ in range(300):
            message = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 9)))
            expected = brute_force_anchors(snap, message, active)
            assert find_anchors(snap, message, active) == expected, message
            anchored += len(expected)
        assert anchored > 300  # the messages do anchor: the comparison is not between empty lists


class TestContract:
    def test_input_not_mutated(self):
        snap = snapshot([node("a", name="Alice"), node("b", name="艾琳")])
        assert_not_mutated(make_state(snap, "Alice和艾琳"), STAGE.run)

    def test_deterministic(self):
        snap = snapshot([node(f"n{i}", name=f"Ent{i % 7}") for i in range(30)])
        state = make_state(snap, "Ent1 Ent3 ent5")
        assert result_image(STAGE.run(state)) == result_image(STAGE.run(state))
