"""Baseline rankers of the evaluation: BM25, dense cosine and their reciprocal rank fusion.

All three rank the same units as the pipeline is judged on (the ids in ``units``, e.g. the ``message``
nodes of a LoCoMo chat), from the question text alone, with the same store and embedder:

* :func:`bm25_ranking` — the store's FTS5 BM25 (:meth:`memory_recall.store.Store.bm25`) over
  :func:`~memory_recall.text.tokenize.query_terms` of the question, filtered to ``units``.
* :func:`dense_ranking` — cosine similarity between the query vector and the units' stored vectors (rows are
  L2-normalised, so a dot product); ties by id.
* :func:`rrf` — reciprocal rank fusion (Cormack et al., SIGIR 2009): ``score(d) = Σ_lists 1 / (k + rank(d))``
  with 1-based ranks and ``k = 60``; ties by id.

>>> rrf([["a", "b"], ["b", "c"]])[:2]
[('b', 0.03252247488101534), ('a', 0.01639344262295082)]
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from memory_recall.text.tokenize import query_terms

__all__ = ["RRF_K", "bm25_ranking", "dense_ranking", "rrf"]

#: RRF constant: 60 as in Cormack et al. 2009 and the issue.
RRF_K = 60


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Fuse ranked id lists: ``[(id, score)]`` by score descending, ties by id (byte order)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"The 'k' parameter must be an int in the range [0, inf). Got {k!r} instead.")
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, uid in enumerate(dict.fromkeys(ranking), start=1):
            scores[uid] = scores.get(uid, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0].encode("utf-8")))


def bm25_ranking(
    search: Callable[[list[str], int], list[tuple[str, float]]],
    question: str,
    units: Collection[str],
    depth: int,
) -> list[str]:
    """Up to ``depth`` unit ids by BM25 score. ``search(terms, limit)`` is the store's ``bm25`` for one chat;
    it is asked for enough hits that non-unit nodes (characters, entities) cannot crowd units out."""
    terms = query_terms(question)
    if not terms:
        return []
    hits = search(terms, max(depth * 4, depth + 200))
    return [uid for uid, _ in hits if uid in units][:depth]


def dense_ranking(
    query_vector: np.ndarray, unit_ids: Sequence[str], unit_vectors: np.ndarray, depth: int
) -> list[str]:
    """Up to ``depth`` of ``unit_ids`` by cosine with ``query_vector`` (``unit_vectors`` rows L2-normalised)."""
    if not len(unit_ids):
        return []
    sims = unit_vectors @ np.asarray(query_vector, dtype=np.float32)
    order = sorted(range(len(unit_ids)), key=lambda i: (-float(sims[i]), unit_ids[i].encode("utf-8")))
    return [unit_ids[i] for i in order[:depth]]
