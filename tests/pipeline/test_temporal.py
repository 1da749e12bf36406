"""Time cue (memory_recall.pipeline.temporal): what a question says about time, which turns say when, and the
multipliers and explanation row the scoring stage gives them."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from score_helpers import NOW, candidates_for, make_graph, make_node, make_snapshot, make_state, run_scoring, settings

from memory_recall.pipeline.scoring import explain_row
from memory_recall.pipeline.temporal import TELL_LAG_MS, TimeCue, parse_time_cue, says_when, time_cue_weights

DAY = 86_400_000


def _ms(y: int, m: int, d: int) -> int:
    return int(datetime(y, m, d, tzinfo=UTC).timestamp() * 1000)


class TestParseTimeCue:
    def test_a_dated_question_looks_at_that_day_and_the_week_before(self) -> None:
        day = _ms(2023, 11, 16)
        expected = TimeCue(asks_when=False, spans=((day - 8 * DAY, day + DAY),))
        assert parse_time_cue("Where was Tim in the week before 16 November 2023?", 0) == expected
        assert parse_time_cue("Where was Tim in the week before November 16th, 2023?", 0) == expected

    def test_month_of_a_year_and_a_year(self) -> None:
        assert parse_time_cue("What did Nate win in the beginning of November 2022?", 0).spans == (
            (_ms(2022, 11, 1), _ms(2022, 12, 1)),
        )
        assert parse_time_cue("What happened in 2021?", 0).spans == ((_ms(2021, 1, 1), _ms(2022, 1, 1)),)

    def test_a_month_alone_means_that_month_of_every_year_of_the_chat(self) -> None:
        cue = parse_time_cue("When did Melanie go camping in June?", 0, (2022, 2023))
        assert cue == TimeCue(asks_when=True, spans=((_ms(2022, 6, 1), _ms(2022, 7, 1)),
                                                     (_ms(2023, 6, 1), _ms(2023, 7, 1))))

    def test_may_counts_only_as_a_name(self) -> None:
        assert parse_time_cue("What did she paint in May?", 0, (2023,)).spans == ((_ms(2023, 5, 1), _ms(2023, 6, 1)),)
        assert parse_time_cue("Which trip may she take in march?", 0, (2023,)).spans == (
            (_ms(2023, 3, 1), _ms(2023, 4, 1)),
        )
        assert parse_time_cue("what she may do in may be odd", 0, (2023,)) == TimeCue()

    def test_spans_relative_to_now(self) -> None:
        assert parse_time_cue("What did John do last week?", NOW).spans == ((NOW - 14 * DAY, NOW + 1),)
        assert parse_time_cue("他昨天做了什么？", NOW).spans == ((NOW - 2 * DAY, NOW + 1),)
        assert parse_time_cue("What did John do last week?", 0).spans == ()  # no query time: nothing to count from

    @pytest.mark.parametrize("question", [
        "When did Caroline go biking?", "What year did they move?", "How long ago was the trip?",
        "Since when has he painted?", "他们什么时候见面的？",
    ])
    def test_asks_when(self, question: str) -> None:
        assert parse_time_cue(question, 0).asks_when is True

    @pytest.mark.parametrize("question", ["What did Caroline paint?", "Whence came the dragon?", "猫叫什么名字？"])
    def test_does_not_ask_when(self, question: str) -> None:
        assert parse_time_cue(question, 0) == TimeCue()


@pytest.mark.parametrize(("text", "expected"), [
    ("I joined a service-focused online group last week", True),
    ("Dyed my hair yesterday - come see!", True),
    ("We moved here two years ago.", True),
    ("The roadtrip this past weekend was insane!", True),
    ("Back in 2019 I lived in Paris", True),
    ("我上周去了海边", True),
    ("That sounds lovely, thanks for sharing!", False),
    ("I may go, the weekday crowd is small", False),
])
def test_says_when(text: str, expected: bool) -> None:
    assert says_when(text) is expected


def _chat() -> tuple[object, list[str]]:
    nodes = [
        make_node("m1", "message", seq=1, created_time=_ms(2023, 5, 20), summary="I went camping last week!"),
        make_node("m2", "message", seq=2, created_time=_ms(2023, 6, 10), summary="The camping trip was fun."),
        make_node("m3", "message", seq=3, created_time=_ms(2023, 7, 1), summary="Camping again soon, I hope."),
        make_node("e1", "event", seq=4, created_time=_ms(2023, 5, 21), title="Camping",
                  summary="went camping yesterday"),
    ]
    return make_snapshot(make_graph(nodes)), ["m1", "m2", "m3", "e1"]


class TestTimeCueWeights:
    def test_off_by_default_and_ones_without_a_cue(self) -> None:
        snap, ids = _chat()
        idx = np.array([snap.index[i] for i in ids])  # type: ignore[attr-defined]
        is_msg = np.array([True, True, True, False])
        w, notes = time_cue_weights(snap, idx, is_msg, "When did she go camping?", NOW,  # type: ignore[arg-type]
                                    settings().scoring)
        assert w.tolist() == [1.0, 1.0, 1.0, 1.0] and notes == {}
        on = settings(scoring={"time_cue": True}).scoring
        w, notes = time_cue_weights(snap, idx, is_msg, "Did she like camping?", NOW, on)  # type: ignore[arg-type]
        assert w.tolist() == [1.0, 1.0, 1.0, 1.0] and notes == {}

    def test_asks_when_raises_turns_that_say_when_and_never_extracted_nodes(self) -> None:
        snap, ids = _chat()
        idx = np.array([snap.index[i] for i in ids])  # type: ignore[attr-defined]
        on = settings(scoring={"time_cue": True, "time_expression_boost": 0.5}).scoring
        w, notes = time_cue_weights(snap, idx, np.array([True, True, True, False]),  # type: ignore[arg-type]
                                    "When did she go camping?", NOW, on)
        assert w.tolist() == [1.5, 1.0, 1.0, 1.0]
        assert notes == {"asks_when": True, "spans": 0, "raised": 1}

    def test_a_named_month_raises_turns_sent_in_it_or_up_to_a_fortnight_after(self) -> None:
        snap, ids = _chat()
        idx = np.array([snap.index[i] for i in ids])  # type: ignore[attr-defined]
        on = settings(scoring={"time_cue": True, "time_range_boost": 0.25}).scoring
        w, notes = time_cue_weights(snap, idx, np.array([True, True, True, False]),  # type: ignore[arg-type]
                                    "Where did she camp in May 2023?", NOW, on)
        # m1 sent in May, m2 on 10 June (within the 14-day lag after 1 June), m3 on 1 July (past it).
        assert _ms(2023, 6, 10) < _ms(2023, 6, 1) + TELL_LAG_MS < _ms(2023, 7, 1)
        assert w.tolist() == [1.25, 1.25, 1.0, 1.0]
        assert notes == {"asks_when": False, "spans": 1, "raised": 2}


def test_scoring_applies_the_cue_and_explains_it_in_its_own_row() -> None:
    """Two turns with the same evidence: without the cue they tie and sort by id; with it the turn that says
    when ranks first, and its explanation lists the ``time_cue`` multiplier (the other's does not)."""
    nodes = [
        make_node("m-a", "message", seq=1, summary="We finally went to the lake."),
        make_node("m-b", "message", seq=5, summary="We went to the lake last Saturday."),
    ]
    snap = make_snapshot(make_graph(nodes))
    cands = candidates_for(snap, ["m-a", "m-b"], vector={"m-a": 0.5, "m-b": 0.5})
    question = "When did they go to the lake?"
    off = settings(scoring={"message_weights": True}, lexical={"enable_bm25": False})
    on = off.with_overrides({"scoring": {"time_cue": True}})
    plain = run_scoring(make_state(snap, question, candidates=cands), off).state.scored
    cued = run_scoring(make_state(snap, question, candidates=cands), on)
    table = cued.state.scored
    assert [snap.ids[i] for i in plain.index] == ["m-a", "m-b"]
    assert [snap.ids[i] for i in table.index] == ["m-b", "m-a"]
    assert table.weighted_score[0] == pytest.approx(1.3 * plain.weighted_score[1], rel=1e-12)
    first = explain_row(snap, table, 0, on.scoring, on.lexical)
    second = explain_row(snap, table, 1, on.scoring, on.lexical)
    assert first.multipliers["time_cue"] == pytest.approx(1.3)
    assert "time_cue" not in second.multipliers
    assert sum(p.contribution for p in first.parts) == pytest.approx(float(table.weighted_score[0]), rel=1e-12)
    assert cued.trace.notes["time_cue"] == {"asks_when": True, "spans": 0, "raised": 1}
