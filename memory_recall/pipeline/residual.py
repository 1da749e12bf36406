"""Residual stage: residual recall — what the query asks that the already-found nodes do not explain
(reference §3.10 "Residual recall", default off). Runs after diffusion and before cross recall, which uses the
hits as extra diffusion seeds.

Reads
    ``state.anchors`` (exact anchors), ``state.vector_hits``, ``state.plan.combined_text`` (the residual
    query), ``state.plan.vector_queries`` + ``state.query_vectors`` (reused when one of them is exactly the
    combined text, saving the extra embedding call of reference §7 item 28), ``state.active``,
    ``state.meta["visibility_hidden_mask"]``, the snapshot's normalised embeddings; ``providers.embedder``.
Writes
    ``state.residual_hits``: ``((node index, cosine), …)`` cosine desc then node-id byte order, at most
    ``top_k``. Meta (reference §3.21): ``residualTriggered`` (bool), ``residualHits`` (count).
Steps
    1. Basis = exact-anchor nodes with a vector, then vector-hit nodes that are co-occurrence-eligible
       (non-archived, type not event/synopsis/reflection, has an anchor term) with a vector; unique, visible,
       at most ``basis_max_nodes``. Fewer than 2 → ``residual-basis-insufficient``.
    2. Query vector of ``combined_text`` through ``providers.embedder.embed_query`` under the failure policy:
       failure (or no embedder, empty text, wrong dimension) → ``residual-query-embedding-missing`` with the
       failure category in the trace notes; strict mode raises :class:`StrictModeViolation` for provider
       failures (recall-spec departure 3).
    3. Novelty :func:`~memory_recall.pipeline.kernels.residual.residual_novelty` (query and basis normalised
       alike, in [0, 1]); not finite or ``< nmf_novelty_threshold`` → ``residual-novelty-below-threshold``.
    4. :func:`~memory_recall.pipeline.kernels.residual.sparse_code_residual` (λ 0.1, 80 FISTA steps, reference
       defaults) of the normalised query; ``residual_norm ≤ residual_threshold`` →
       ``residual-norm-below-threshold``.
    5. Cosine of the residual against active, visible nodes with a vector outside the basis; keep > 0, top
       ``top_k``. Empty search space → triggered with ``residual-search-space-empty``; no positive cosine →
       ``residual-no-hit``.
Settings
    ``ResidualSettings``: ``enabled`` (False), ``basis_max_nodes`` (24), ``nmf_novelty_threshold`` (0.4),
    ``residual_threshold`` (0.3), ``top_k`` (5). ``nmf_topics`` is unused: the reference NMF novelty is
    replaced (departure 9).
Skip reasons
    ``residual-disabled`` (trace only: switched off by settings, state untouched),
    ``residual-basis-insufficient``, ``residual-query-embedding-missing``,
    ``residual-novelty-below-threshold``, ``residual-norm-below-threshold``,
    ``residual-search-space-empty``, ``residual-no-hit``. All but the first also go to
    ``state.skip_reasons``; ``residualTriggered``/``residualHits`` are set on every path but the first.
Departures (recall-spec)
    * 9 — novelty is well defined (normalised query and basis, in [0, 1]) instead of the reference NMF measure
      (§7 item 17); the sparse code gets the normalised query too.
    * 2 — hidden nodes are neither basis rows nor hits.
    * 3 — an embedding failure degrades to a skip with its category (strict mode raises).
    * "Direct embedding mode required" does not exist here: every snapshot keeps its vectors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memory_recall.errors import EmbeddingUnavailable, StrictModeViolation
from memory_recall.pipeline._graph_cache import (
    active_mask,
    cooccurrence_eligible,
    hidden_mask,
    unique_in_order,
)
from memory_recall.pipeline.kernels.residual import residual_novelty, sparse_code_residual
from memory_recall.pipeline.state import Providers, RecallState, TimedStage
from memory_recall.providers.embedding import embed_query_or_fallback
from memory_recall.settings import ResidualSettings

__all__ = ["ResidualStage"]

_SCORE_KIND = "residual_cosine"


class ResidualStage(TimedStage):
    """Residual recall (reference §3.10); see the module docstring for the contract.

    Usage: ``ResidualStage(settings.residual, providers).run(state)``.
    """

    name = "residual"

    def __init__(self, settings: ResidualSettings, providers: Providers | None = None) -> None:
        self.settings = settings
        self.providers = providers

    # -- steps ---------------------------------------------------------------------------------------------

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        s = self.settings
        if not s.enabled:
            return self._skip(state, "residual-disabled", 0)
        snap = state.snapshot
        hidden = hidden_mask(state)
        basis = self._basis(state, hidden)
        notes: dict[str, Any] = {"basisSize": int(basis.size)}
        if basis.size < 2:
            return self._skip(state, "residual-basis-insufficient", int(basis.size), **notes)

        query, query_notes = self._query_vector(state)
        notes.update(query_notes)
        if query is None:
            return self._skip(state, "residual-query-embedding-missing", int(basis.size), **notes)
        q = query / float(np.linalg.norm(query))  # departure 9: query normalised like the basis rows
        basis_vecs = snap.embeddings[basis].astype(np.float64)

        novelty = residual_novelty(q, basis_vecs).novelty
        notes["novelty"] = round(float(novelty), 6)
        if not math.isfinite(novelty) or novelty < s.nmf_novelty_threshold:
            return self._skip(state, "residual-novelty-below-threshold", int(basis.size), **notes)

        code = sparse_code_residual(q, basis_vecs)
        notes["residualNorm"] = round(float(code.residual_norm), 6)
        if not code.residual_norm > s.residual_threshold:
            return self._skip(state, "residual-norm-below-threshold", int(basis.size), **notes)

        space = active_mask(state) & snap.has_vector
        if hidden is not None:
            space &= ~hidden
        space[basis] = False
        candidates = np.flatnonzero(space)
        notes["searchSpace"] = int(candidates.size)
        if candidates.size == 0:
            # Reference: an empty search space still counts as triggered (cross recall re-diffuses).
            return self._skip(state, "residual-search-space-empty", int(basis.size), triggered=True, **notes)
        direction = code.residual / code.residual_norm
        cos = snap.embeddings[candidates].astype(np.float64) @ direction
        positive = cos > 0
        candidates, cos = candidates[positive], cos[positive]
        if candidates.size == 0:
            return self._skip(state, "residual-no-hit", int(basis.size), **notes)
        order = np.lexsort((snap.id_rank[candidates], -cos))[: s.top_k]
        hits = tuple((int(i), float(c)) for i, c in zip(candidates[order], cos[order], strict=True))
        meta = state.with_meta(residualTriggered=True, residualHits=len(hits))
        new_state = state.evolve(residual_hits=hits, meta=meta)
        return new_state, {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": int(basis.size),
            "count_out": len(hits),
            "notes": notes,
        }

    def _basis(self, state: RecallState, hidden: np.ndarray | None) -> np.ndarray:
        """Exact anchors with a vector, then co-occurrence-eligible vector hits with a vector (reference §3.10
        step 1), unique, visible, cut to ``basis_max_nodes``."""
        snap = state.snapshot
        anchors = np.fromiter((i for i, _ in state.anchors), dtype=np.int64, count=len(state.anchors))
        hits = np.asarray(state.vector_hits[0], dtype=np.int64)
        hits = hits[cooccurrence_eligible(snap, hits)]
        basis = unique_in_order(np.concatenate([anchors, hits]))
        basis = basis[(basis >= 0) & (basis < snap.n)]
        keep = snap.has_vector[basis] & ~snap.archived[basis]
        if hidden is not None:
            keep &= ~hidden[basis]
        return basis[keep][: self.settings.basis_max_nodes]

    def _query_vector(self, state: RecallState) -> tuple[np.ndarray | None, dict[str, Any]]:
        """The embedding of ``plan.combined_text``: a vector already computed for the same text by the
        vector stage, else one ``embed_query`` call under the failure policy. ``None`` plus the category on
        failure."""
        snap = state.snapshot
        text = state.plan.combined_text.strip()
        if not text:
            return None, {"failureCategory": "empty_query"}
        if state.query_vectors is not None:
            for row, (query_text, _) in enumerate(state.plan.vector_queries):
                if query_text.strip() == text and row < state.query_vectors.shape[0]:
                    vec = np.asarray(state.query_vectors[row], dtype=np.float64).reshape(-1)
                    if vec.shape == (snap.dim,) and np.all(np.isfinite(vec)) and np.linalg.norm(vec) > 0:
                        return vec, {"queryReused": True}
        providers = self.providers or Providers()
        if providers.embedder is None:
            return None, {"failureCategory": "not_configured"}
        outcome = embed_query_or_fallback(providers.embedder, text, strict=providers.strict)
        if outcome.vector is None:
            return None, {"failureCategory": outcome.failure_category, "detail": outcome.detail}
        vec = np.asarray(outcome.vector, dtype=np.float64).reshape(-1)
        if vec.shape != (snap.dim,) or not np.all(np.isfinite(vec)) or not np.linalg.norm(vec) > 0:
            failure = EmbeddingUnavailable(
                "dimension_mismatch",
                f"query vector has shape {vec.shape}, the snapshot's vectors have dimension {snap.dim}",
            )
            if providers.strict:
                raise StrictModeViolation(failure)
            return None, {"failureCategory": failure.category, "detail": failure.detail}
        return vec, {"queryReused": False}

    @staticmethod
    def _skip(
        state: RecallState, reason: str, count_in: int, *, triggered: bool = False, **notes: Any
    ) -> tuple[RecallState, dict[str, Any]]:
        if reason == "residual-disabled":
            # Switched off by settings: trace only, the state (and the reference's skipReasons) untouched.
            new_state = state
        else:
            meta = state.with_meta(residualTriggered=triggered, residualHits=0)
            new_state = state.evolve(skip_reasons=state.with_skip(reason), meta=meta)
        return new_state, {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": count_in,
            "count_out": 0,
            "skipped": True,
            "skip_reason": reason,
            "notes": notes,
        }
