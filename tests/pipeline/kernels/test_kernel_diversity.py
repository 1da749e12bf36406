"""Greedy DPP kernel: reference §3.14 / scenario 15, edge cases, and a differential test against the
plain-list transliteration."""

from __future__ import annotations

import numpy as np
import pytest

from memory_recall.pipeline.kernels import dpp_greedy_select
from memory_recall.pipeline.kernels.diversity import _reference_dpp_greedy_select

SCENARIO_15 = ([[1, 0, 0], [0.99, 0.01, 0], [0, 1, 0]], [0.95, 0.9, 0.85])


class TestScenario15:
    @pytest.mark.parametrize("quality_weight", [1.0, 0.0])
    def test_near_duplicate_is_skipped(self, quality_weight: float) -> None:
        emb, scores = SCENARIO_15
        assert dpp_greedy_select(emb, scores, 2, quality_weight) == [0, 2]
        assert _reference_dpp_greedy_select(emb, scores, 2, quality_weight) == [0, 2]

    @pytest.mark.parametrize("k", [3, 4, 10])
    def test_k_at_least_n_returns_all_in_order(self, k: int) -> None:
        emb, scores = SCENARIO_15
        assert dpp_greedy_select(emb, scores, k) == [0, 1, 2]
        assert _reference_dpp_greedy_select(emb, scores, k) == [0, 1, 2]


class TestEdgeCases:
    def test_k_zero_returns_empty(self) -> None:
        emb, scores = SCENARIO_15
        assert dpp_greedy_select(emb, scores, 0) == [] == _reference_dpp_greedy_select(emb, scores, 0)

    def test_zero_vectors_stay_zero_and_count_as_diverse(self) -> None:
        # Pick 1 (best quality); its duplicate 2 then has ~no gain, the zero vector keeps its full gain.
        emb = [[0, 0, 0], [1, 0, 0], [2, 0, 0]]
        scores = [0.5, 0.9, 0.8]
        assert dpp_greedy_select(emb, scores, 2) == [1, 0]
        assert _reference_dpp_greedy_select(emb, scores, 2) == [1, 0]

    def test_result_is_pick_order_not_score_order(self) -> None:
        emb = [[1, 0], [1, 0.001], [0, 1]]
        scores = [0.5, 0.9, 0.3]
        assert dpp_greedy_select(emb, scores, 2) == [1, 2]

    def test_ties_go_to_the_lowest_index(self) -> None:
        emb = [[1, 0], [1, 0], [1, 0]]
        assert dpp_greedy_select(emb, [0.5, 0.5, 0.5], 2) == [0, 1]
        assert _reference_dpp_greedy_select(emb, [0.5, 0.5, 0.5], 2) == [0, 1]

    def test_non_positive_scores_use_the_floor(self) -> None:
        emb = [[1, 0], [0, 1], [0.7, 0.7]]
        scores = [0.0, -1.0, 0.2]  # q = max(score, 1e-10): the two floored candidates tie, lowest index wins
        assert dpp_greedy_select(emb, scores, 2) == [2, 0] == _reference_dpp_greedy_select(emb, scores, 2)

    def test_shape_mismatch_and_non_finite_scores_raise(self) -> None:
        with pytest.raises(ValueError, match="embeddings"):
            dpp_greedy_select([[1, 0]], [0.5, 0.4], 1)
        with pytest.raises(ValueError, match="finite"):
            dpp_greedy_select([[1, 0], [0, 1]], [0.5, float("nan")], 1)
        for bad in (float("inf"), float("nan")):
            with pytest.raises(ValueError, match="'embeddings'.*finite"):
                dpp_greedy_select([[1, 0], [bad, 1], [0, 1]], [0.5, 0.4, 0.3], 2)

    def test_input_not_mutated_and_deterministic(self) -> None:
        rng = np.random.default_rng(3)
        emb, scores = rng.normal(size=(40, 16)), rng.random(40)
        emb_copy, scores_copy = emb.copy(), scores.copy()
        first = dpp_greedy_select(emb, scores, 12)
        assert first == dpp_greedy_select(emb, scores, 12)
        assert np.array_equal(emb, emb_copy) and np.array_equal(scores, scores_copy)


def test_differential_random_inputs_match_reference_transliteration() -> None:
    """220 random pools (incl. more candidates than dimensions, so the kernel becomes singular and the
    1e-8 jitter decides), all quality weights of interest: identical selections.

    Exact agreement relies on the absence of near-ties in ``d`` (a gap below ~1e-15 could be rounded
    differently by BLAS and the Python loop); with continuous random data none occurs in these seeds.
    """
    rng = np.random.default_rng(1234)
    for case in range(200):
        n = int(rng.integers(2, 40))
        dim = int(rng.integers(2, 48))
        emb = rng.normal(size=(n, dim))
        if rng.random() < 0.2:
            emb[rng.integers(0, n)] = 0.0
        scores = rng.random(n)
        k = int(rng.integers(1, n + 1))
        qw = float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        assert dpp_greedy_select(emb, scores, k, qw) == _reference_dpp_greedy_select(
            emb.tolist(), scores.tolist(), k, qw
        ), case
    for case in range(20):  # realistic pool: 90 candidates × 384 dimensions, k 30
        emb = rng.normal(size=(90, 384))
        scores = rng.uniform(0.2, 1.0, 90)
        assert dpp_greedy_select(emb, scores, 30) == _reference_dpp_greedy_select(
            emb.tolist(), scores.tolist(), 30
        ), case
