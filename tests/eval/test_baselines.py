"""Baselines: RRF order and scores, BM25 unit filtering, dense cosine order."""

from __future__ import annotations

import numpy as np
import pytest

from memory_recall.eval.baselines import RRF_K, bm25_ranking, dense_ranking, rrf


class TestRRF:
    def test_exact_order_and_scores(self) -> None:
        got = rrf([["a", "b", "c"], ["c", "a"]])
        assert [uid for uid, _ in got] == ["a", "c", "b"]
        assert [s for _, s in got] == [1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62]

    def test_k_is_60(self) -> None:
        assert RRF_K == 60
        assert rrf([["x"]]) == [("x", 1 / 61)]
        assert rrf([["x"]], k=0) == [("x", 1.0)]

    def test_ties_break_by_id(self) -> None:
        assert rrf([["y"], ["x"]]) == [("x", 1 / 61), ("y", 1 / 61)]

    def test_repeated_id_in_one_list_counts_once(self) -> None:
        assert rrf([["a", "a", "b"]]) == [("a", 1 / 61), ("b", 1 / 62)]

    @pytest.mark.parametrize("lists", [[], [[]], [[], []]])
    def test_empty(self, lists: list[list[str]]) -> None:
        assert rrf(lists) == []

    def test_bad_k(self) -> None:
        with pytest.raises(ValueError, match="'k' parameter"):
            rrf([["a"]], k=-1)


class TestBM25:
    def test_filters_units_and_cuts(self) -> None:
        calls: list[tuple[list[str], int]] = []

        def search(terms: list[str], limit: int) -> list[tuple[str, float]]:
            calls.append((terms, limit))
            return [("char:a", 9.0), ("msg:2", 5.0), ("ent:x", 4.0), ("msg:1", 3.0), ("msg:3", 1.0)]

        assert bm25_ranking(search, "Where is the puppy?", {"msg:1", "msg:2", "msg:3"}, 2) == ["msg:2", "msg:1"]
        assert calls == [(["puppy"], 202)]

    def test_no_terms(self) -> None:
        assert bm25_ranking(lambda t, n: [("msg:1", 1.0)], "the", {"msg:1"}, 5) == []


class TestDense:
    def test_cosine_order_ties_by_id(self) -> None:
        vectors = np.array([[1.0, 0.0], [0.6, 0.8], [0.6, 0.8], [0.0, 1.0]], dtype=np.float32)
        ids = ["m4", "m3", "m2", "m1"]
        assert dense_ranking(np.array([0.0, 1.0]), ids, vectors, 3) == ["m1", "m2", "m3"]
        assert dense_ranking(np.array([1.0, 0.0]), ids, vectors, 10) == ["m4", "m2", "m3", "m1"]
        assert dense_ranking(np.array([1.0, 0.0]), [], np.zeros((0, 2), np.float32), 3) == []
