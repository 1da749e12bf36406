"""Lexical stage: the BM25 channel over the store's per-chat BM25 index (recall-spec "Added beyond the reference").

Reads
    ``state.plan.lexical_sources`` (reference §3.6: the current message and its intent segments),
    ``state.active`` (falls back to non-archived nodes with a finite range when unset), ``snapshot.index`` /
    ``id_rank``, and ``providers.lexical_index(terms, limit) -> [(node_id, score)]`` (higher is better; the
    store's :meth:`~memory_recall.store.sqlite.Store.bm25` bound to the chat); with ``LexicalSettings.stem``
    other than ``"none"`` it is called as ``lexical_index(terms, limit, stem=method)``.
Writes
    ``state.bm25_hits = (index, score)``: active nodes of this snapshot among the index's hits, score = BM25
    score / the best hit's score (so in (0, 1], the best hit 1), ordered by score desc then node-id byte
    order. Meta ``bm25Hits`` (count). The trace notes list the query terms.
    With ``turn_context_previous`` / ``turn_context_next`` > 0 (the default profile), the hits' scores are then
    mixed over chat turns (:mod:`memory_recall.pipeline.turn_context`): a message turn next to a hit becomes a
    hit, every active node with a positive mixed score is kept, best-relative again (trace ``turnContextHits``).
Query terms
    :func:`memory_recall.text.tokenize.query_terms` of each lexical source (Latin words accent-folded, CJK
    bigrams, stop words dropped), concatenated without repeats in source order, at most
    ``LexicalSettings.bm25_max_terms`` (64, the seed's limit). The store takes terms as plain text, so user text
    is never query syntax.
Not here
    The reference's field-match lexical score (§3.12 step 1) is computed by the scoring stage on the
    candidates.
Settings
    ``LexicalSettings``: ``enable_bm25``, ``bm25_top_k`` (hits asked from the index), ``bm25_max_terms``,
    ``stem`` (stem method of index and query terms), ``turn_context_previous`` / ``turn_context_next``.
Skip reasons
    ``bm25-disabled`` (settings; trace only), ``no-lexical-index`` (no provider), ``no-query-terms``.
Notes
    The index is asked for ``bm25_top_k`` hits before the active-set filter, so hidden or range-less nodes can
    leave fewer than ``bm25_top_k`` (the index does not know the per-recall visibility filter). Errors of
    the index (a broken store) are not degraded: they propagate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import active_mask
from memory_recall.pipeline.state import Providers, RecallState, TimedStage
from memory_recall.pipeline.turn_context import with_turn_context
from memory_recall.settings import LexicalSettings
from memory_recall.store.snapshot import GraphSnapshot
from memory_recall.text.tokenize import query_terms

__all__ = ["LexicalStage", "bm25_query_terms"]

_SCORE_KIND = "bm25_normalised"


def bm25_query_terms(sources: Sequence[str], max_terms: int) -> list[str]:
    """Query terms of all ``sources``, first occurrence order, at most ``max_terms``.

    >>> bm25_query_terms(["规则一，然后规则二", "规则一"], 64)
    ['规则', '则一', '然后', '后规', '则二']
    """
    seen: dict[str, None] = {}
    for source in sources:
        for term in query_terms(source, max_terms):
            seen.setdefault(term, None)
            if len(seen) >= max_terms:
                return list(seen)
    return list(seen)


class LexicalStage(TimedStage):
    """Query the BM25 index with the plan's lexical sources (see the module docstring)."""

    name = "lexical"

    def __init__(self, settings: LexicalSettings, providers: Providers) -> None:
        self.settings = settings
        self.providers = providers

    @staticmethod
    def _skip(
        state: RecallState, reason: str, record: bool = True, **notes: Any
    ) -> tuple[RecallState, dict[str, Any]]:
        new_state = state.evolve(skip_reasons=state.with_skip(reason)) if record else state
        return new_state, {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": 0,
            "count_out": 0,
            "skipped": True,
            "skip_reason": reason,
            "notes": notes,
        }

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        if not self.settings.enable_bm25:
            return self._skip(state, "bm25-disabled", record=False)
        index_fn = self.providers.lexical_index
        if index_fn is None:
            return self._skip(state, "no-lexical-index")
        terms = bm25_query_terms(state.plan.lexical_sources, self.settings.bm25_max_terms)
        if not terms:
            return self._skip(state, "no-query-terms")
        snap = state.snapshot
        # The stem method goes to the index only when set, so a provider without stemming keeps working.
        stem = self.settings.stem

        def ask(query: list[str]) -> list[Any]:
            if stem == "none":
                return list(index_fn(query, self.settings.bm25_top_k))
            return list(index_fn(query, self.settings.bm25_top_k, stem=stem))

        raw_hits = ask(terms)
        act = active_mask(state)
        index_of = snap.index
        idx, scores = _ranked_hits(raw_hits, index_of, act)
        notes: dict[str, Any] = {"terms": terms, "indexHits": len(raw_hits)}
        if self.settings.feedback_docs > 0 and idx.size:
            expansion = feedback_terms(snap, idx[: self.settings.feedback_docs], terms, self.settings.feedback_terms)
            if expansion:
                second = ask(terms + expansion)
                idx, scores = _merge_hits(idx, scores, *_ranked_hits(second, index_of, act),
                                          float(self.settings.feedback_weight), snap.id_rank)
                notes["feedbackTerms"] = expansion
                notes["feedbackHits"] = len(second)
        if idx.size and (self.settings.turn_context_previous > 0 or self.settings.turn_context_next > 0):
            idx, scores = _with_turn_context(idx, scores, snap, act, self.settings)
            notes["turnContextHits"] = int(idx.size)
        meta = state.with_meta(bm25Hits=int(idx.size))
        return state.evolve(bm25_hits=(idx, scores), meta=meta), {
            "score_kind": _SCORE_KIND,
            "score_direction": "higher_is_better",
            "count_in": len(raw_hits),
            "count_out": int(idx.size),
            "notes": notes,
        }


def _ranked_hits(
    raw_hits: Sequence[Any], index_of: Mapping[str, int], act: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Active snapshot nodes among an index's hits, score / best score, by score desc then node-id byte order."""
    # A few dozen hits: plain Python per hit is cheaper than numpy calls on tiny arrays.
    pairs: list[tuple[float, str, int]] = []  # (-score, node id, node index): the sort key, then the node
    for node_id, raw_score in raw_hits:
        key = str(node_id)
        i = index_of.get(key, -1)
        score = float(raw_score)
        if i >= 0 and score > 0 and math.isfinite(score) and act[i]:
            pairs.append((-score, key, i))
    # Score desc, then node-id byte order (str order is UTF-8 byte order: the snapshot's id_rank order). One
    # node id can only come back once from the store; keep the best anyway if an index repeats it (the first
    # after the sort; equal keys are the same hit).
    pairs.sort()
    best: dict[int, float] = {}
    for neg_score, _, i in pairs:
        best.setdefault(i, -neg_score)
    idx = np.fromiter(best.keys(), dtype=np.int64, count=len(best))
    scores = np.fromiter(best.values(), dtype=np.float64, count=len(best))
    if idx.size:
        scores = scores / scores[0]  # the best hit, first after the sort
    return idx, scores


def feedback_terms(snapshot: GraphSnapshot, hits: np.ndarray, query: Sequence[str], limit: int) -> list[str]:
    """Expansion terms from the texts of the first-pass ``hits`` (best first): the query terms of each hit's
    summary, title and name, not already in ``query``, the ones found in more hits first, then by first
    occurrence (best hit first); at most ``limit``."""
    asked = set(query)
    count: dict[str, int] = {}
    for i in hits.tolist():
        node = snapshot.node(int(i))
        text = " ".join(t for key in ("summary", "title", "name") for t in node.field_text(key))
        for term in dict.fromkeys(query_terms(text, 64)):
            if term not in asked:
                count[term] = count.get(term, 0) + 1
    order = sorted(count, key=lambda t: -count[t])  # stable: first occurrence among equal counts
    return order[:limit]


def _merge_hits(
    idx: np.ndarray, scores: np.ndarray, idx2: np.ndarray, scores2: np.ndarray, weight: float, id_rank: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per node the max of its first-pass score and ``weight`` × its expanded-pass score, ordered by score desc
    then node-id byte order (the first pass's best keeps 1)."""
    all_idx = np.concatenate([idx, idx2])
    all_scores = np.concatenate([scores, weight * scores2])
    uniq, inverse = np.unique(all_idx, return_inverse=True)
    best = np.full(uniq.size, -np.inf)
    np.maximum.at(best, inverse, all_scores)
    order = np.lexsort((id_rank[uniq], -best))
    return uniq[order], best[order]


def _with_turn_context(
    idx: np.ndarray, scores: np.ndarray, snap: GraphSnapshot, act: np.ndarray, settings: LexicalSettings
) -> tuple[np.ndarray, np.ndarray]:
    """The hits with turn context (pipeline.turn_context): each message turn's score averaged with its neighbours',
    so the turn next to a hit becomes a hit; active nodes with a positive score, best-relative again, by score desc
    then node-id byte order."""
    dense = np.zeros(snap.n)
    dense[idx] = scores
    mixed = with_turn_context(dense, snap, settings.turn_context_previous, settings.turn_context_next)
    rows = np.flatnonzero((mixed > 0) & act)
    order = np.lexsort((snap.id_rank[rows], -mixed[rows]))
    rows, values = rows[order], mixed[rows][order]
    return rows, values / values[0]
