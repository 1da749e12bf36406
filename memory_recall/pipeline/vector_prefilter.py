"""Vector prefilter stage: embed the planned queries and search the active nodes' vectors (reference §3.7).

Reads
    ``state.plan.vector_queries`` ((text, blend weight) pairs), ``state.active`` (falls back to non-archived
    nodes with a finite range when unset), ``snapshot.embeddings`` (L2-normalised (n × d) float32),
    ``has_vector``, ``model_id``, ``id_rank``; ``providers.embedder`` (``embed_query(text) -> (d,)``,
    ``model_id``) and ``providers.strict``.
Writes
    * ``state.vector_hits = (index, weighted, raw)``: merged hits, weighted score desc then node-id byte
      order, at most ``max(2·topK, 24)``; ``weighted`` = raw cosine × the query's blend weight (ranking),
      ``raw`` = the raw cosine of the query that won the merge (thresholds: recall-spec departure 4).
    * ``state.vector_raw_hit_count`` (hits before merging), ``state.query_vectors`` ((q × d) float32, rows
      aligned with ``plan.vector_queries``), ``state.vector_status``.
    * meta ``vectorHits`` (= raw hit count), ``vectorMergedHits`` (reference §3.21).
Search
    One float32 product ``Q · Eᵀ`` for all queries (:func:`query_similarities`); per query keep cosine > 0
    among active nodes with a vector, the first ``topK`` by cosine desc (ties in graph order, as the
    reference's stable sort) via a sampled lower bound and a partition (:func:`top_k_per_query`); multiply
    by the part weight. With ``VectorSettings.turn_context_previous`` / ``turn_context_next`` > 0 (the default
    profile) a message turn's cosine is first averaged with its neighbouring turns'
    (:mod:`memory_recall.pipeline.turn_context`; raw = that mixed cosine; other nodes unchanged). Merge
    (:func:`merge_vector_hits`): max weighted score per node (on equal weighted scores the earlier query wins
    and gives the raw cosine), sort weighted desc then node id.
Failure policy (recall-spec departure 3, fixing §7 items 20–21)
    An :class:`~memory_recall.errors.EmbeddingUnavailable` from the embedder, a query vector whose dimension
    is not the snapshot's, or a snapshot whose vectors belong to another model than the embedder's (vectors of
    two models are never compared) → ``VectorStatus("lexical_fallback", False, category, detail)`` and the
    recall goes on without vectors (no partial result: the first failure stops the remaining queries, so a
    timeout is paid once). With ``providers.strict`` a :class:`~memory_recall.errors.StrictModeViolation`
    wrapping the failure is raised instead. Success → ``VectorStatus("ok", True)``.
Settings
    ``VectorSettings.enabled``, ``turn_context_previous``, ``turn_context_next``; ``SelectionSettings.top_k`` (k
    per query, merge limit ``max(2·topK, 24)``).
Skip reasons
    ``vector-disabled`` (settings; trace only, status ``disabled``), ``no-embedder`` (the reference reports
    ``vector-config-invalid`` for an unusable embedding config; status ``disabled``), ``no-vector-queries``,
    ``no-node-vectors`` (no active node at all: nothing to search, the embedder is not called; status
    ``lexical_fallback``), ``embedding-unavailable`` (any fallback of the failure policy, including active nodes
    none of which has a vector — category ``missing_vectors``: embedding failed or never ran for the chat; strict
    mode raises).
Departures
    * 3 (above), 4 (raw cosine kept beside the weighted score), 10 (merge ties by node-id byte order instead
      of ``localeCompare``), 8 via the query plan (one query per near-duplicate text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memory_recall.errors import EmbeddingUnavailable, StrictModeViolation
from memory_recall.pipeline._graph_cache import active_mask
from memory_recall.pipeline.state import (
    EMPTY_INDEX,
    Providers,
    RecallState,
    TimedStage,
    VectorStatus,
)
from memory_recall.pipeline.turn_context import with_turn_context
from memory_recall.settings import SelectionSettings, VectorSettings

__all__ = [
    "MIN_MERGE_LIMIT",
    "VectorPrefilterStage",
    "merge_limit",
    "merge_vector_hits",
    "query_similarities",
    "top_k_per_query",
]

#: ``mergeVectorResults`` keeps ``max(2·topK, 24)`` hits (reference §3.7, §5.3).
MIN_MERGE_LIMIT = 24

_SCORE_KIND = "cosine_x_blend_weight"
Hits = tuple[np.ndarray, np.ndarray, np.ndarray]


def merge_limit(top_k: int) -> int:
    return max(2 * top_k, MIN_MERGE_LIMIT)


#: Sampling stride of :func:`top_k_per_query`'s threshold estimate, and the row length (in multiples of ``k``)
#: from which the estimate pays off.
_SAMPLE_STRIDE = 16
_SAMPLE_MIN_ROW = 64


def top_k_per_query(sims: np.ndarray, eligible: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row of ``sims`` (q × n): the indices and cosines of the first ``k`` eligible nodes with cosine > 0,
    cosine desc, ties in graph (index) order. O(q·n).

    On a long row a lower bound of the k-th best cosine is read off every 16th eligible value (the k-th best
    of a subset is ≤ the k-th best of the row), and only the values ≥ it are gathered, widened and partitioned
    (about 16·k of them instead of half the row); the result is the same as without the bound.
    """
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for row in sims:
        keep = eligible & (row > 0)
        if k > 0 and row.size >= _SAMPLE_MIN_ROW * k:
            sample = row[::_SAMPLE_STRIDE][keep[::_SAMPLE_STRIDE]]
            if sample.size >= k:
                keep &= row >= np.partition(sample, sample.size - k)[sample.size - k]
        idx = np.flatnonzero(keep)
        scores = row[idx].astype(np.float64)
        if idx.size > k:
            # Keep all scores tied with the k-th best: a tie at the boundary then breaks by node index
            # (graph order), not by argpartition's arbitrary order.
            kth = -np.partition(-scores, k - 1)[k - 1]
            tied = scores >= kth
            idx, scores = idx[tied], scores[tied]
        order = np.lexsort((idx, -scores))[:k]
        out.append((idx[order], scores[order]))
    return out


#: Rows per product of :func:`query_similarities`, and the query-count multiple it pads to (see there).
_SIM_BLOCK_ROWS = 128
_SIM_QUERY_PAD = 4


def query_similarities(embeddings: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``queries @ embeddings.T`` (q × n, float32).

    Computed block by block as ``embeddings[block] @ group.T``: the queries in groups of four (the last one
    padded by zero rows), blocks of 128 node rows, every group of a block before the next block (one pass through
    the node matrix). Why this shape:

    * a product this small takes OpenBLAS's small-matrix path (or a GEMM that splits rows and columns among
      threads, never the sum over the dimensions), which does not pack the node matrix (a whole-graph GEMM writes
      a packed copy of it: 15 MB at 10k nodes, evicted from the cache by the rest of the recall, so it costs a
      second pass through memory);
    * four query columns run the kernel's full width (three cost more than four), and a wider product is not
      used: with eight columns some kernels (OpenBLAS's Haswell and Zen ones) give a column other bits than the
      same query alone;
    * a single query alone would be a GEMV, whose bits change with the thread count.

    Guarantee (what ``tests/pipeline/test_vector_prefilter.py`` checks under every OpenBLAS kernel the CPU can
    run): the same input gives the same bits, whatever the BLAS thread count, and a query's row has the same bits
    whatever the other queries are. About 1.7× faster than one whole-graph GEMM at 10k nodes with the cache cold
    (one BLAS thread).
    """
    q, dim = queries.shape
    n = embeddings.shape[0]
    groups = -(-q // _SIM_QUERY_PAD)
    padded = np.zeros((groups * _SIM_QUERY_PAD, dim), dtype=np.float32)
    padded[:q] = queries
    rights = [padded[g * _SIM_QUERY_PAD : (g + 1) * _SIM_QUERY_PAD].T for g in range(groups)]
    out = np.empty((groups, n, _SIM_QUERY_PAD), dtype=np.float32)
    for start in range(0, n, _SIM_BLOCK_ROWS):
        stop = start + _SIM_BLOCK_ROWS
        block = embeddings[start:stop]
        for g, right in enumerate(rights):
            np.matmul(block, right, out=out[g, start:stop])
    return np.ascontiguousarray(out.transpose(0, 2, 1).reshape(groups * _SIM_QUERY_PAD, n)[:q])


def merge_vector_hits(
    per_query: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], id_rank: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``mergeVectorResults`` (reference §3.7): ``(index, weighted, raw, raw_hit_count)``.

    ``per_query`` holds ``(index, weighted, raw)`` per query in plan order. Max weighted score per node (the
    earlier query wins ties and provides ``raw``), sorted by weighted desc then ``id_rank``, cut to ``limit``.
    """
    parts = [p for p in per_query if p[0].size]
    raw_count = int(sum(p[0].size for p in parts))
    if not parts:
        return EMPTY_INDEX, np.zeros(0), np.zeros(0), 0
    idx = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts])
    weighted = np.concatenate([np.asarray(p[1], dtype=np.float64) for p in parts])
    raw = np.concatenate([np.asarray(p[2], dtype=np.float64) for p in parts])
    qpos = np.concatenate([np.full(p[0].size, j, dtype=np.int64) for j, p in enumerate(parts)])
    order = np.lexsort((qpos, -weighted, idx))  # by node, best weighted first, earlier query first
    idx, weighted, raw = idx[order], weighted[order], raw[order]
    first = np.concatenate(([True], idx[1:] != idx[:-1]))
    idx, weighted, raw = idx[first], weighted[first], raw[first]
    final = np.lexsort((id_rank[idx], -weighted))[:limit]
    return idx[final], weighted[final], raw[final], raw_count


class VectorPrefilterStage(TimedStage):
    """Embed the plan's queries and find the most similar active nodes (see the module docstring)."""

    name = "vector_prefilter"

    def __init__(self, settings: VectorSettings, selection: SelectionSettings, providers: Providers) -> None:
        self.settings = settings
        self.selection = selection
        self.providers = providers

    def _skip(
        self,
        state: RecallState,
        reason: str,
        status: VectorStatus,
        count_in: int = 0,
        *,
        record: bool = True,
        **notes: Any,
    ) -> tuple[RecallState, dict[str, Any]]:
        skip_reasons = state.with_skip(reason) if record else state.skip_reasons
        new_state = state.evolve(vector_status=status, skip_reasons=skip_reasons)
        return new_state, {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": count_in,
            "count_out": 0,
            "skipped": True,
            "skip_reason": reason,
            "notes": notes,
        }

    def _fallback(
        self, state: RecallState, failure: EmbeddingUnavailable, count_in: int, **notes: Any
    ) -> tuple[RecallState, dict[str, Any]]:
        if self.providers.strict:
            raise StrictModeViolation(failure) from failure
        status = VectorStatus("lexical_fallback", False, failure.category, failure.detail)
        return self._skip(
            state, "embedding-unavailable", status, count_in, failureCategory=failure.category, **notes
        )

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        snap = state.snapshot
        if not self.settings.enabled:
            return self._skip(state, "vector-disabled", VectorStatus("disabled", False), record=False)
        embedder = self.providers.embedder
        if embedder is None:
            return self._skip(
                state,
                "no-embedder",
                VectorStatus("disabled", False, "", "no embedder configured"),
                referenceSkipReason="vector-config-invalid",
            )
        queries = state.plan.vector_queries
        if not queries:
            return self._skip(
                state, "no-vector-queries", VectorStatus("disabled", False, "", "no vector queries")
            )
        act = active_mask(state)
        eligible = act & snap.has_vector
        count_in = int(eligible.sum())
        if count_in == 0:
            detail = f"no active node has a vector of model {embedder.model_id!r}"
            if not act.any():
                return self._skip(state, "no-node-vectors", VectorStatus("lexical_fallback", False, "", detail))
            # Active nodes but no vectors: embedding failed (or has not run) for this chat — a failure of the
            # embedding side, reported with its category, and fatal in strict mode like any other.
            return self._fallback(state, EmbeddingUnavailable("missing_vectors", detail), 0)
        if snap.model_id != embedder.model_id:
            failure = EmbeddingUnavailable(
                "dimension_mismatch",
                f"node vectors are of model {snap.model_id!r}, the embedder is {embedder.model_id!r}",
            )
            return self._fallback(state, failure, count_in)

        vectors: list[np.ndarray] = []
        for text, _ in queries:
            try:
                vec = np.asarray(embedder.embed_query(text), dtype=np.float32).reshape(-1)
            except EmbeddingUnavailable as exc:
                return self._fallback(state, exc, count_in, embeddedQueries=len(vectors))
            if vec.shape[0] != snap.dim:
                failure = EmbeddingUnavailable(
                    "dimension_mismatch",
                    f"query vector has {vec.shape[0]} dimensions, node vectors {snap.dim}",
                )
                return self._fallback(state, failure, count_in, embeddedQueries=len(vectors))
            norm = float(np.linalg.norm(vec))
            if not np.isfinite(norm) or norm <= 0:
                failure = EmbeddingUnavailable("bad_payload", "query vector is zero or not finite")
                return self._fallback(state, failure, count_in, embeddedQueries=len(vectors))
            vectors.append(vec / norm)
        q_matrix = np.stack(vectors)

        sims = query_similarities(snap.embeddings, q_matrix)
        # A row without a vector holds unspecified values (a newer snapshot may have filled it in place): zero its
        # cosines, which the turn context below reads for a turn's neighbours.
        missing = np.flatnonzero(~snap.has_vector)
        if missing.size:
            sims[:, missing] = 0.0
        k = self.selection.top_k
        # Turn context (pipeline.turn_context): a chat turn's cosine averaged with its neighbours' (message nodes).
        sims = with_turn_context(sims, snap, self.settings.turn_context_previous, self.settings.turn_context_next)
        per_query = [
            (idx, scores * weight, scores)
            for (idx, scores), (_, weight) in zip(top_k_per_query(sims, eligible, k), queries, strict=True)
        ]
        idx, weighted, raw, raw_count = merge_vector_hits(per_query, snap.id_rank, merge_limit(k))
        meta = state.with_meta(vectorHits=raw_count, vectorMergedHits=int(idx.size))
        new_state = state.evolve(
            vector_hits=(idx, weighted, raw),
            vector_raw_hit_count=raw_count,
            query_vectors=q_matrix,
            vector_status=VectorStatus("ok", True),
            meta=meta,
        )
        notes = {"queries": len(queries), "perQueryHits": [int(p[0].size) for p in per_query], "topK": k}
        return new_state, {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": count_in,
            "count_out": int(idx.size),
            "notes": notes,
        }
