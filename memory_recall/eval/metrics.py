"""Ranking metrics of the offline evaluation: Recall@k, recall_all@k, nDCG@k, MRR, latency percentiles.

Every function takes one question's ranked unit ids (best first, no duplicates) and its relevant ids (the
evidence, deduplicated by the caller or here); :func:`summarise` averages per-question values into the
``metrics.json`` system entry.

Definitions (binary relevance):

* ``recall_at_k`` — the LoCoMo paper's evidence-turn Recall@k: ``|relevant ∩ top k| / |relevant|``.
* ``recall_all_at_k`` — 1.0 when every relevant id is in the top k, else 0.0.
* ``ndcg_at_k`` — ``DCG / IDCG`` with ``DCG = Σ_{rank r ≤ k, relevant} 1 / log2(r + 1)`` and IDCG the DCG of
  ``min(|relevant|, k)`` relevant ids at ranks 1, 2, ….
* ``reciprocal_rank`` — ``1 / r`` of the first relevant id in the ranked list, 0.0 when none is ranked (the
  list is cut at the largest evaluated k, so MRR is MRR@max k).
* ``percentile`` — numpy's linear interpolation; 0.0 for no values.

A question with no relevant id has no defined recall: :func:`summarise` leaves it out of every average (the
runner counts such questions separately).

>>> recall_at_k(["a", "b", "c"], ["c", "d"], 3)
0.5
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ADVERSARIAL_CATEGORY",
    "QuestionOutcome",
    "latency_without_embedding",
    "ndcg_at_k",
    "percentile",
    "recall_all_at_k",
    "recall_at_k",
    "reciprocal_rank",
    "summarise",
]

ADVERSARIAL_CATEGORY = 5


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"The 'k' parameter must be an int in the range [1, inf). Got {k!r} instead.")


def recall_at_k(ranked: Sequence[str], relevant: Iterable[str], k: int) -> float:
    """Fraction of ``relevant`` found among the first ``k`` of ``ranked`` (0.0 when ``relevant`` is empty)."""
    _check_k(k)
    rel = set(relevant)
    if not rel:
        return 0.0
    return len(rel.intersection(ranked[:k])) / len(rel)


def recall_all_at_k(ranked: Sequence[str], relevant: Iterable[str], k: int) -> float:
    """1.0 when every relevant id is among the first ``k`` of ``ranked``, else 0.0."""
    _check_k(k)
    rel = set(relevant)
    return 1.0 if rel and rel.issubset(ranked[:k]) else 0.0


def ndcg_at_k(ranked: Sequence[str], relevant: Iterable[str], k: int) -> float:
    """Binary-relevance nDCG of the first ``k`` of ``ranked``."""
    _check_k(k)
    rel = set(relevant)
    if not rel:
        return 0.0
    dcg = sum(1.0 / math.log2(r + 2) for r, uid in enumerate(ranked[:k]) if uid in rel)
    ideal = sum(1.0 / math.log2(r + 2) for r in range(min(len(rel), k)))
    return dcg / ideal


def reciprocal_rank(ranked: Sequence[str], relevant: Iterable[str]) -> float:
    """``1 / rank`` of the first relevant id of ``ranked`` (1-based), 0.0 when none is ranked."""
    rel = set(relevant)
    for r, uid in enumerate(ranked):
        if uid in rel:
            return 1.0 / (r + 1)
    return 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100, linear interpolation) of ``values``; 0.0 when empty."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else 0.0


@dataclass(frozen=True)
class QuestionOutcome:
    """One question answered by one system: its ranked units, evidence, category and latencies (ms)."""

    ranked: tuple[str, ...]
    relevant: tuple[str, ...]
    category: int
    latency_ms: float
    latency_ms_without_embedding: float


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _recall_table(outcomes: Sequence[QuestionOutcome], ks: Sequence[int]) -> dict[str, float]:
    return {str(k): _mean([recall_at_k(o.ranked, o.relevant, k) for o in outcomes]) for k in ks}


def summarise(outcomes: Sequence[QuestionOutcome], ks: Sequence[int]) -> dict[str, object]:
    """The ``metrics.json`` entry of one system (questions without evidence are left out of the averages).

    Latency covers every question, including those without evidence (they were recalled all the same).
    """
    scored = [o for o in outcomes if o.relevant]
    categories = sorted({o.category for o in scored})
    by_category = {
        str(c): _recall_table([o for o in scored if o.category == c], ks) for c in categories
    }
    latencies = [o.latency_ms for o in outcomes]
    return {
        "recall": _recall_table(scored, ks),
        "recall_excluding_adversarial": _recall_table(
            [o for o in scored if o.category != ADVERSARIAL_CATEGORY], ks
        ),
        "recall_by_category": by_category,
        "recall_all": {str(k): _mean([recall_all_at_k(o.ranked, o.relevant, k) for o in scored]) for k in ks},
        "ndcg@10": _mean([ndcg_at_k(o.ranked, o.relevant, 10) for o in scored]),
        "mrr": _mean([reciprocal_rank(o.ranked, o.relevant) for o in scored]),
        "latency_ms": {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95)},
    }


def latency_without_embedding(outcomes: Sequence[QuestionOutcome]) -> dict[str, float]:
    """p50/p95 of the latencies with the query embedding time taken out."""
    values = [o.latency_ms_without_embedding for o in outcomes]
    return {"p50": percentile(values, 50), "p95": percentile(values, 95)}

