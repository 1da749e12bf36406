"""Co-occurrence stage: boost the graph score of nodes that were extracted together with an anchor
(reference §3.11, default off). Runs after cross recall (which builds the score map), before scoring.

Reads
    ``state.anchors`` (exact anchors), ``state.supplemental_anchors``, ``state.candidates`` (the score map),
    ``state.active``, ``state.meta["visibility_hidden_mask"]``, the snapshot's node arrays and ``journal``.
Writes
    ``state.candidates`` with ``graph_score += boost`` and ``cooccurrence_boost = boost`` for boosted nodes;
    boosted nodes not yet in the map are appended (in boost order: anchor by anchor, each anchor's neighbours
    by count desc then node id) with zero vector/BM25 scores. Meta ``cooccurrenceBoostedNodes`` (reference
    §3.21).
Anchor weights
    Exact anchors 2.0 (reference §3.11, §5.3); supplemental anchors ``max(existing, vector_score or
    graph_score or 0.5)`` from their score-map entry (JS ``||`` chain: the first non-zero). Anchors
    in insertion order: exact, then supplemental.
Index
    :func:`~memory_recall.pipeline.kernels.cooccurrence.build_cooccurrence_index` over the eligible
    active nodes (non-archived, finite ``seqRange``, type not event/synopsis/reflection, has an
    anchor term): batch-journal pairs (top ``max_anchors_per_batch`` per batch by recency,
    importance, id), else seqRange overlaps. Built once per snapshot and cached on it
    (:func:`cooccurrence_index`); the per-recall visibility restriction is a cached column mask of the counts.
Boost
    Each anchor's first ``max_neighbors`` neighbours (count desc, id) among active, visible nodes get
    ``anchor_weight × ln(1 + count) × scale``; boosts of several anchors add up. Scenario 18:
    weight 2, count 3, scale 0.1 → +0.277259.
Settings
    ``CooccurrenceSettings``: ``enabled`` (False), ``scale`` (0.1), ``max_neighbors`` (10),
    ``max_anchors_per_batch`` (10).
Skip reasons
    ``cooccurrence-disabled`` (trace only), ``cooccurrence-no-anchor``, ``cooccurrence-no-neighbors``.
Departures (recall-spec)
    * 11 — the index is built once per snapshot (graph version), not per call, and the seqRange fallback is
      O(n log n + pairs) instead of all pairs (reference §7 item 27).
    * 2 — hidden or inactive nodes are never anchors and never boosted, and do not take neighbour slots.
    * 10 — ties in batch membership and neighbour order break by node id (byte order).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from memory_recall.pipeline._graph_cache import (
    COOCCURRENCE_EXCLUDED_TYPES,
    active_mask,
    cached_stats,
    has_anchor_term_mask,
    hidden_mask,
    lookup,
    mask_digest,
)
from memory_recall.pipeline.kernels.cooccurrence import (
    CooccurrenceIndex,
    build_cooccurrence_index,
    cooccurrence_boost,
    cooccurrence_neighbors,
)
from memory_recall.pipeline.state import Candidates, RecallState, StageResult, StageTrace, timed
from memory_recall.settings import CooccurrenceSettings
from memory_recall.store.snapshot import GraphSnapshot

__all__ = ["EXACT_ANCHOR_WEIGHT", "SUPPLEMENTAL_DEFAULT_WEIGHT", "CooccurrenceStage", "cooccurrence_index"]

#: Weight of an exact anchor (reference §3.11).
EXACT_ANCHOR_WEIGHT = 2.0
#: Weight of a supplemental anchor with neither a vector nor a graph score (reference §3.11).
SUPPLEMENTAL_DEFAULT_WEIGHT = 0.5

_SCORE_KIND = "graph_score_boost"


def _build_index(snapshot: GraphSnapshot, max_per_batch: int) -> CooccurrenceIndex:
    eligible = (
        ~snapshot.archived
        & snapshot.finite_range
        & ~snapshot.mask_types(COOCCURRENCE_EXCLUDED_TYPES)
        & has_anchor_term_mask(snapshot)
    )
    recency = np.where(np.isnan(snapshot.seq_end), snapshot.seq.astype(np.float64), snapshot.seq_end)
    ranges = np.array([e.processed_range for e in snapshot.journal], dtype=np.float64).reshape(-1, 2)
    return build_cooccurrence_index(
        snapshot.ids,
        recency,
        snapshot.importance,
        snapshot.seq_start,
        snapshot.seq_end,
        ranges,
        max_per_batch=max_per_batch,
        eligible=eligible,
    )


def cooccurrence_index(snapshot: GraphSnapshot, max_per_batch: int = 10) -> tuple[CooccurrenceIndex, bool]:
    """``(index, was_cached)``: the co-occurrence index of ``snapshot``, built once per snapshot and batch
    size (recall-spec departure 11)."""
    # Batches rank their nodes by recency, then importance: the index reads the statistics overlay.
    return cached_stats(
        snapshot, ("cooccurrence-index", max_per_batch), lambda: _build_index(snapshot, max_per_batch)
    )


def _mask_columns(counts: sp.csr_array, allowed: np.ndarray) -> sp.csr_array:
    data = counts.data * allowed[counts.indices]
    out = sp.csr_array((data, counts.indices.copy(), counts.indptr.copy()), shape=counts.shape)
    out.eliminate_zeros()
    return out


class CooccurrenceStage:
    """Co-occurrence boost (reference §3.11); see the module docstring for the contract.

    Usage: ``CooccurrenceStage(settings.cooccurrence).run(state)``.
    """

    name = "cooccurrence"

    def __init__(self, settings: CooccurrenceSettings) -> None:
        self.settings = settings

    def run(self, state: RecallState) -> StageResult:
        with timed() as elapsed:
            new_state, fields = self._run(state)
        return StageResult(new_state, StageTrace(name=self.name, elapsed_ms=elapsed[0], **fields))

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        s = self.settings
        if not s.enabled:
            return self._skip(state, "cooccurrence-disabled")
        snap = state.snapshot
        allowed = active_mask(state).copy()
        hidden = hidden_mask(state)
        if hidden is not None:
            allowed &= ~hidden

        anchor_idx, anchor_w = self._anchor_weights(state, allowed)
        if anchor_idx.size == 0:
            return self._skip(state, "cooccurrence-no-anchor")

        index, index_cached = cooccurrence_index(snap, s.max_anchors_per_batch)
        counts, _ = cached_stats(
            snap,
            ("cooccurrence-columns", s.max_anchors_per_batch, mask_digest(allowed)),
            lambda: _mask_columns(index.counts, allowed),
        )
        notes: dict[str, Any] = {
            "anchors": int(anchor_idx.size),
            "source": index.source,
            "batchCount": index.batch_count,
            "indexCached": index_cached,
        }
        boosted, boost = cooccurrence_boost(
            anchor_idx, anchor_w, counts, max_neighbors=s.max_neighbors, scale=s.scale, order_key=snap.id_rank
        )
        if boosted.size == 0:
            return self._skip(state, "cooccurrence-no-neighbors", count_in=int(anchor_idx.size), **notes)

        cand = state.candidates
        in_map = np.isin(boosted, cand.index)
        # Unseen nodes are appended in boost order (anchor by anchor, neighbour order), as the reference's
        # insertion-ordered map does; a handful of anchors, so a loop over anchors is fine.
        order: list[np.ndarray] = [
            cooccurrence_neighbors(counts, int(a), snap.id_rank, s.max_neighbors)[0] for a in anchor_idx
        ]
        sequence = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
        sequence = sequence[~np.isin(sequence, cand.index)]
        _, first = np.unique(sequence, return_index=True)
        new_nodes = sequence[np.sort(first)]

        index_all = np.concatenate([cand.index, new_nodes]).astype(np.int64)
        add = lookup(boosted, boost, index_all)
        pad = np.zeros(new_nodes.size)
        candidates = Candidates(
            index=index_all,
            graph_score=np.concatenate([cand.graph_score, pad]) + add,
            vector_score=np.concatenate([cand.vector_score, pad]),
            vector_raw=np.concatenate([cand.vector_raw, pad]),
            bm25_score=np.concatenate([cand.bm25_score, pad]),
            cooccurrence_boost=np.concatenate([self._old_boost(cand), pad]) + add,
        )
        notes["newCandidates"] = int(new_nodes.size)
        notes["boostedInMap"] = int(in_map.sum())
        new_state = state.evolve(
            candidates=candidates, meta=state.with_meta(cooccurrenceBoostedNodes=int(boosted.size))
        )
        return new_state, {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": int(anchor_idx.size),
            "count_out": int(boosted.size),
            "notes": notes,
        }

    @staticmethod
    def _old_boost(cand: Candidates) -> np.ndarray:
        old = np.asarray(cand.cooccurrence_boost, dtype=np.float64)
        return old if old.shape == cand.index.shape else np.zeros(cand.index.size)

    @staticmethod
    def _anchor_weights(state: RecallState, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Anchors in insertion order (exact, then supplemental) with their weights (reference §3.11)."""
        snap = state.snapshot
        cand = state.candidates
        weights: dict[int, float] = {}  # insertion-ordered; a handful of anchors
        for i, _ in state.anchors:
            if 0 <= i < snap.n and allowed[i]:
                weights[int(i)] = EXACT_ANCHOR_WEIGHT
        supplemental = np.asarray(state.supplemental_anchors, dtype=np.int64)
        vec = lookup(cand.index, cand.vector_score, supplemental)
        graph = lookup(cand.index, cand.graph_score, supplemental)
        for i, v, g in zip(supplemental.tolist(), vec.tolist(), graph.tolist(), strict=True):
            if not (0 <= i < snap.n and allowed[i]):
                continue
            score = v or g or SUPPLEMENTAL_DEFAULT_WEIGHT
            weights[i] = max(weights.get(i, 0.0), score)
        idx = np.fromiter(weights.keys(), dtype=np.int64, count=len(weights))
        w = np.fromiter(weights.values(), dtype=np.float64, count=len(weights))
        return idx, w

    @staticmethod
    def _skip(
        state: RecallState, reason: str, count_in: int = 0, **notes: Any
    ) -> tuple[RecallState, dict[str, Any]]:
        # Switched off by settings: trace only (the reference lists no skip reason for it).
        new_state = state if reason == "cooccurrence-disabled" else state.evolve(
            skip_reasons=state.with_skip(reason)
        )
        return new_state, {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": count_in,
            "count_out": 0,
            "skipped": True,
            "skip_reason": reason,
            "notes": notes,
        }
