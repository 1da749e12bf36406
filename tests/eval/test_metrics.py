"""Ranking metrics on hand-computed cases (exact values)."""

from __future__ import annotations

import math

import pytest

from memory_recall.eval.metrics import (
    QuestionOutcome,
    latency_without_embedding,
    ndcg_at_k,
    percentile,
    recall_all_at_k,
    recall_at_k,
    reciprocal_rank,
    summarise,
)

RANKED = ("a", "b", "c", "d")


class TestRecallAtK:
    @pytest.mark.parametrize(
        ("relevant", "k", "expected"),
        [
            (("b", "d", "x"), 1, 0.0),
            (("b", "d", "x"), 2, 1 / 3),
            (("b", "d", "x"), 4, 2 / 3),
            (("a",), 1, 1.0),
            (("a", "a"), 1, 1.0),  # duplicates count once
            ((), 4, 0.0),
        ],
    )
    def test_values(self, relevant: tuple[str, ...], k: int, expected: float) -> None:
        assert recall_at_k(RANKED, relevant, k) == expected

    def test_k_beyond_the_list(self) -> None:
        assert recall_at_k(("a",), ("a", "b"), 10) == 0.5

    @pytest.mark.parametrize("k", [0, -1, True, 1.5])
    def test_bad_k(self, k: object) -> None:
        with pytest.raises(ValueError, match="'k' parameter"):
            recall_at_k(RANKED, ("a",), k)  # type: ignore[arg-type]


class TestRecallAll:
    @pytest.mark.parametrize(
        ("relevant", "k", "expected"),
        [(("a", "b"), 2, 1.0), (("a", "b"), 1, 0.0), (("a", "x"), 4, 0.0), ((), 4, 0.0)],
    )
    def test_values(self, relevant: tuple[str, ...], k: int, expected: float) -> None:
        assert recall_all_at_k(RANKED, relevant, k) == expected


class TestNdcg:
    def test_two_relevant_at_ranks_2_and_3(self) -> None:
        dcg = 1 / math.log2(3) + 1 / math.log2(4)
        ideal = 1 + 1 / math.log2(3)
        assert ndcg_at_k(RANKED, ("b", "c"), 3) == pytest.approx(dcg / ideal, abs=1e-15)

    def test_perfect_and_empty(self) -> None:
        assert ndcg_at_k(RANKED, ("a", "b"), 10) == 1.0
        assert ndcg_at_k(RANKED, ("x",), 10) == 0.0
        assert ndcg_at_k(RANKED, (), 10) == 0.0

    def test_ideal_is_cut_at_k(self) -> None:
        # three relevant ids, k = 1, the first is relevant: DCG = IDCG = 1
        assert ndcg_at_k(RANKED, ("a", "c", "d"), 1) == 1.0


class TestReciprocalRank:
    @pytest.mark.parametrize(("relevant", "expected"), [(("c",), 1 / 3), (("d", "b"), 0.5), (("x",), 0.0)])
    def test_values(self, relevant: tuple[str, ...], expected: float) -> None:
        assert reciprocal_rank(RANKED, relevant) == expected


class TestPercentile:
    def test_linear_interpolation(self) -> None:
        assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
        assert percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
        assert percentile([], 50) == 0.0


def _o(ranked: str, relevant: str, category: int, latency: float = 10.0) -> QuestionOutcome:
    return QuestionOutcome(tuple(ranked), tuple(relevant), category, latency, latency - 4.0)


class TestSummarise:
    OUT = [
        _o("abc", "a", 1, 10.0),  # R@1 1, R@2 1
        _o("abc", "bx", 5, 20.0),  # R@1 0, R@2 1/2
        _o("abc", "c", 1, 30.0),  # R@1 0, R@2 0
        _o("abc", "", 2, 40.0),  # no evidence: out of every average, in the latency
    ]

    def test_exact_entry(self) -> None:
        got = summarise(self.OUT, (1, 2))
        assert got == {
            "recall": {"1": 1 / 3, "2": 1.5 / 3},
            "recall_excluding_adversarial": {"1": 0.5, "2": 0.5},
            "recall_by_category": {"1": {"1": 0.5, "2": 0.5}, "5": {"1": 0.0, "2": 0.5}},
            "recall_all": {"1": 1 / 3, "2": 1 / 3},
            "ndcg@10": pytest.approx((1.0 + 1 / math.log2(3) / (1 + 1 / math.log2(3)) + 0.5) / 3),
            "mrr": pytest.approx((1.0 + 0.5 + 1 / 3) / 3),
            "latency_ms": {"p50": 25.0, "p95": pytest.approx(38.5)},
        }

    def test_latency_without_embedding(self) -> None:
        assert latency_without_embedding(self.OUT) == {"p50": 21.0, "p95": pytest.approx(34.5)}

    def test_empty(self) -> None:
        got = summarise([], (5,))
        assert got["recall"] == {"5": 0.0}
        assert got["recall_by_category"] == {}
