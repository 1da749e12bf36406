"""Co-occurrence kernels: reference §3.11 and scenario 18 (boost and index), neighbour ordering, and a
differential test of the sweep against the all-pairs transliteration."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from memory_recall.pipeline.kernels import (
    SOURCE_BATCH_JOURNAL,
    SOURCE_SEQ_RANGE,
    build_cooccurrence_index,
    cooccurrence_boost,
    cooccurrence_neighbors,
    id_order_key,
)
from memory_recall.pipeline.kernels.cooccurrence import (
    _reference_build_cooccurrence_index,
    _reference_cooccurrence_boost,
)

NAN = float("nan")


def _counts(n: int, pairs: list[tuple[int, int, float]]) -> sp.csr_array:
    rows = [a for a, b, _ in pairs] + [b for a, b, _ in pairs]
    cols = [b for a, b, _ in pairs] + [a for a, b, _ in pairs]
    vals = [c for *_, c in pairs] * 2
    return sp.csr_array((vals, (rows, cols)), shape=(n, n))


class TestScenario18Boost:
    def test_boost_values(self) -> None:
        a, x, y = 0, 1, 2
        idx, boost = cooccurrence_boost([a], [2.0], _counts(3, [(a, x, 3), (a, y, 1)]), scale=0.1)
        graph = {x: 0.1}
        for i, b in zip(idx.tolist(), boost.tolist(), strict=True):
            graph[i] = graph.get(i, 0.0) + b
        assert graph[x] == pytest.approx(0.377259, abs=1e-6)
        assert graph[y] == pytest.approx(0.138629, abs=1e-6)  # new entry
        assert boost.tolist() == pytest.approx([2 * math.log(4) * 0.1, 2 * math.log(2) * 0.1], abs=1e-15)
        ref = _reference_cooccurrence_boost({"x": 0.1}, {"a": 2.0}, {"a": {"x": 3.0, "y": 1.0}})
        assert ref == pytest.approx({"x": 0.377259, "y": 0.138629}, abs=1e-6)

    def test_max_neighbors_keeps_highest_counts_then_id(self) -> None:
        counts = _counts(5, [(0, 1, 1), (0, 2, 5), (0, 3, 1), (0, 4, 2)])
        order_key = np.array([0, 2, 3, 1, 4])  # node 3's id sorts before node 1's
        idx, boost = cooccurrence_boost([0], [1.0], counts, max_neighbors=3, order_key=order_key)
        assert idx.tolist() == [2, 3, 4]
        nbr, cnt = cooccurrence_neighbors(counts, 0, order_key)
        assert nbr.tolist() == [2, 4, 3, 1] and cnt.tolist() == [5, 2, 1, 1]

    def test_boosts_of_several_anchors_add_up(self) -> None:
        shared = cooccurrence_boost([0, 1], [2.0, 0.5], _counts(3, [(0, 2, 1), (1, 2, 3)]))
        assert shared[0].tolist() == [2]
        assert shared[1].tolist() == pytest.approx([0.2 * math.log(2) + 0.05 * math.log(4)], abs=1e-15)
        # Anchors that co-occur boost each other.
        mutual = cooccurrence_boost([0, 1], [2.0, 0.5], _counts(3, [(0, 1, 1), (1, 2, 3)]))
        assert mutual[0].tolist() == [0, 1, 2]
        expected = [0.05 * math.log(2), 0.2 * math.log(2), 0.05 * math.log(4)]
        assert mutual[1].tolist() == pytest.approx(expected, abs=1e-15)

    def test_no_anchors_or_no_neighbours(self) -> None:
        counts = _counts(3, [(0, 1, 1)])
        assert cooccurrence_boost([], [], counts)[0].size == 0
        assert cooccurrence_boost([2], [2.0], counts)[0].size == 0


class TestScenario18Index:
    # rules A [1,2], B [2,3], location L [2,2]
    IDS = ["A", "B", "L"]
    START = [1, 2, 2]
    END = [2, 3, 2]

    def test_batch_journal_pairs_a_and_b(self) -> None:
        idx = build_cooccurrence_index(self.IDS, [3, 2, 1], [5, 5, 5], self.START, self.END, [[2, 2]],
                                       eligible=[True, True, False])
        assert idx.source == SOURCE_BATCH_JOURNAL and idx.batch_count == 1
        assert idx.counts.toarray().tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 0]]

    def test_batch_journal_with_location_eligible(self) -> None:
        idx = build_cooccurrence_index(self.IDS, [3, 2, 1], [5, 5, 5], self.START, self.END, [[2, 2]])
        assert idx.source == SOURCE_BATCH_JOURNAL
        assert idx.counts.toarray().tolist() == [[0, 1, 1], [1, 0, 1], [1, 1, 0]]

    def test_empty_journal_falls_back_to_seq_range(self) -> None:
        idx = build_cooccurrence_index(self.IDS, [3, 2, 1], [5, 5, 5], self.START, self.END, np.zeros((0, 2)),
                                       eligible=[True, True, False])
        assert idx.source == SOURCE_SEQ_RANGE and idx.batch_count == 0
        assert idx.counts.toarray().tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 0]]

    def test_journal_without_finite_range_or_pairs_falls_back(self) -> None:
        idx = build_cooccurrence_index(self.IDS, [3, 2, 1], [5, 5, 5], self.START, self.END,
                                       [[NAN, NAN], [3, 3], [9, 9]])
        # Batch [3,3] holds only B, [9,9] nothing: no batch with two nodes → seqRange overlaps.
        assert idx.source == SOURCE_SEQ_RANGE
        assert idx.counts.toarray().tolist() == [[0, 1, 1], [1, 0, 1], [1, 1, 0]]

    def test_overlap_length_is_inclusive(self) -> None:
        idx = build_cooccurrence_index(["p", "q"], [0, 0], [0, 0], [1, 3], [5, 9], [])
        assert idx.counts.toarray()[0, 1] == 3  # floors 3, 4, 5


class TestBatchCut:
    def test_max_per_batch_by_recency_importance_then_id(self) -> None:
        ids = ["e", "d", "c", "b", "a"]
        recency = [1, 5, 5, 5, 0]
        importance = [9, 2, 7, 7, 9]
        idx = build_cooccurrence_index(ids, recency, importance, [1] * 5, [1] * 5, [[1, 1]], max_per_batch=3)
        # Sorted: c/b (rec 5, imp 7; tie → id "b" < "c"), then d (rec 5, imp 2): pairs among {b, c, d}.
        dense = idx.counts.toarray()
        kept = sorted({i for i in range(5) if dense[i].any()})
        assert [ids[i] for i in kept] == ["d", "c", "b"]

    def test_id_order_key_is_byte_order(self) -> None:
        assert id_order_key(["b", "é", "a", "Z"]).tolist() == [2, 3, 1, 0]


def _random_nodes(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    start = rng.integers(0, 60, n).astype(float)
    end = start + rng.integers(-1, 6, n)  # some reversed (never overlapping) ranges
    start[rng.random(n) < 0.05] = np.nan
    return {
        "recency": rng.integers(0, 5, n).astype(float),
        "importance": rng.integers(0, 3, n).astype(float),
        "start": start,
        "end": end,
        "eligible": rng.random(n) < 0.85,
    }


def test_differential_random_indexes_match_all_pairs_reference() -> None:
    """150 random graphs (both sources, ties in recency/importance, reversed and missing ranges)."""
    rng = np.random.default_rng(77)
    for case in range(150):
        n = int(rng.integers(0, 60))
        ids = [f"id{int(v):04d}" for v in rng.permutation(10_000)[:n]]
        nodes = _random_nodes(rng, n)
        n_batches = int(rng.choice([0, 1, 5]))
        lo = rng.integers(0, 60, n_batches).astype(float)
        batches = np.stack([lo, lo + rng.integers(0, 4, n_batches)], axis=1)
        idx = build_cooccurrence_index(
            ids, nodes["recency"], nodes["importance"], nodes["start"], nodes["end"], batches,
            max_per_batch=4, eligible=nodes["eligible"],
        )
        eligible_nodes = [
            {"id": ids[i], "recency": nodes["recency"][i], "importance": nodes["importance"][i],
             "start": nodes["start"][i], "end": nodes["end"][i]}
            for i in range(n) if nodes["eligible"][i]
        ]
        ref, source = _reference_build_cooccurrence_index(
            eligible_nodes, [tuple(b) for b in batches.tolist()], max_per_batch=4
        )
        assert idx.source == source, case
        coo = idx.counts.tocoo()
        got: dict[str, dict[str, float]] = {}
        for r, c, v in zip(coo.row, coo.col, coo.data, strict=True):
            got.setdefault(ids[r], {})[ids[c]] = float(v)
        assert got == {k: v for k, v in ref.items() if v}, case
        anchors = {ids[i]: 1.0 + i % 3 for i in range(0, n, 5) if nodes["eligible"][i]}
        anchor_idx = [ids.index(a) for a in anchors]
        b_idx, b_val = cooccurrence_boost(anchor_idx, list(anchors.values()), idx.counts, max_neighbors=3,
                                          order_key=idx.order_key)
        ref_boost = _reference_cooccurrence_boost({}, anchors, ref, max_neighbors=3)
        got_boost = {ids[i]: v for i, v in zip(b_idx, b_val.tolist(), strict=True)}
        assert got_boost == pytest.approx(ref_boost, abs=1e-15), case


def test_seq_range_sweep_scales_with_pairs_not_n_squared() -> None:
    rng = np.random.default_rng(0)
    n = 50_000  # an all-pairs Python loop would need 1.25e9 iterations
    start = np.sort(rng.integers(0, 200_000, n)).astype(float)
    idx = build_cooccurrence_index([f"n{i:06d}" for i in range(n)], np.zeros(n), np.zeros(n), start,
                                   start + 3, [])
    assert idx.source == SOURCE_SEQ_RANGE
    gaps = start[None, 1:] - start[None, :-1]
    assert idx.counts.nnz >= 2 * int((gaps < 4).sum())
