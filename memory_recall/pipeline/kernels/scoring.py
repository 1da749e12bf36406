"""Hybrid score and time decay (reference §1.9, §3.12 step 2 ``dynamics.hybridScore``, scenario §6.2 10).

Public functions
----------------
* :func:`time_decay` ``(created_ms, now_ms) -> ndarray`` — ``0.8 + 0.2 / (1 + ln(1 + Δdays))`` with
  ``Δdays = max(0, (now − created) / 86 400 000)``; a missing (NaN or other non-finite) ``createdTime``
  gives 1.0. ``now_ms`` is injected (recall-spec departure 10). O(n).
* :func:`hybrid_score` ``(graph, vector, lexical, importance, created_ms, now_ms, graph_weight=0.6,
  vector_weight=0.3, importance_weight=0.1, lexical_weight=0.18) -> HybridParts`` — vectorised over
  candidates. Inputs are the **raw** scores: ``graph`` is the diffusion energy in [0, 2] (halved here:
  ``g = clamp(graph/2, 0, 1)``), ``vector`` the weighted vector score, ``lexical`` the lexical score,
  ``importance`` on the 0–10 scale (NaN → 5; NaN graph/vector/lexical → 0). ``base = (αg + βv + δl + γi) /
  max(1e-6, α⁺ + β⁺ + γ⁺ + δ⁺)`` and ``score = base × decay``. O(n).

:class:`HybridParts` carries the score and its four additive parts, each already divided by the weight sum
and multiplied by the decay. ``score`` is *defined* as ``((graph + vector) + lexical) + importance`` of the
parts, so an explanation that sums its parts in that order reproduces it bit for bit; it differs from the
reference's ``base × decay`` by at most a few ulps (tested).

``_reference_hybrid_score`` / ``_reference_time_decay`` are the scalar transliterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["DAY_MS", "HybridParts", "hybrid_score", "time_decay"]

DAY_MS = 86_400_000


def time_decay(created_ms: ArrayLike, now_ms: float) -> np.ndarray:
    """Reference §1.9 time decay; non-finite ``created_ms`` → 1.0.

    >>> time_decay([0.0, float("nan")], 7 * DAY_MS).round(6).tolist()
    [0.864947, 1.0]
    """
    created = np.asarray(created_ms, dtype=np.float64)
    missing = ~np.isfinite(created)
    if missing.all():  # e.g. the decay switched off: every factor is 1
        return np.ones(created.shape)
    days = np.maximum(0.0, (float(now_ms) - np.where(missing, float(now_ms), created)) / DAY_MS)
    return np.where(missing, 1.0, 0.8 + 0.2 / (1.0 + np.log(1.0 + days)))


@dataclass(frozen=True)
class HybridParts:
    """Final hybrid score and its additive, already weighted and decayed parts (same shape). ``stacked``, when
    set, is the (4, …) array whose rows are graph, vector, lexical and importance (those fields are its rows)."""

    score: np.ndarray
    graph: np.ndarray
    vector: np.ndarray
    lexical: np.ndarray
    importance: np.ndarray
    decay: np.ndarray
    stacked: np.ndarray | None = field(default=None, repr=False, compare=False)


def _weight_sum(*weights: float) -> float:
    # Only positive weights count in the denominator (reference: x⁺ = max(0, x)); floor 1e-6.
    return max(1e-6, sum(max(0.0, w) for w in weights))


def hybrid_score(
    graph: ArrayLike,
    vector: ArrayLike,
    lexical: ArrayLike,
    importance: ArrayLike,
    created_ms: ArrayLike,
    now_ms: float,
    graph_weight: float = 0.6,
    vector_weight: float = 0.3,
    importance_weight: float = 0.1,
    lexical_weight: float = 0.18,
) -> HybridParts:
    """Reference ``hybridScore`` × time decay, with its additive parts.

    >>> parts = hybrid_score(1.0, 0.8, 0.5, 8, 0, 0)  # scenario 10: 0.601695
    >>> round(float(parts.score), 12), float(parts.graph + parts.vector + parts.lexical + parts.importance)
    (0.601694915254, 0.6016949152542374)
    """
    g = np.asarray(graph, dtype=np.float64)
    v = np.asarray(vector, dtype=np.float64)
    lx = np.asarray(lexical, dtype=np.float64)
    imp = np.asarray(importance, dtype=np.float64)
    decay = time_decay(created_ms, now_ms)
    shapes = {g.shape, v.shape, lx.shape, imp.shape, decay.shape}
    shape = shapes.pop() if len(shapes) == 1 else np.broadcast_shapes(*shapes)
    # The four normalised inputs as the rows of one array, so each step below is one operation for all four
    # (element by element the same operations as column by column): g = graph / 2, NaN importance → 5.
    x = np.empty((4, *shape))
    x[0] = g / 2.0
    x[1] = v
    x[2] = lx
    x[3] = np.where(np.isnan(imp), 5.0, imp) / 10.0
    np.copyto(x, 0.0, where=np.isnan(x))  # NaN → 0, then clamped to [0, 1] (in place)
    x.clip(0.0, 1.0, out=x)
    denom = _weight_sum(graph_weight, vector_weight, importance_weight, lexical_weight)
    weights = np.array([graph_weight, vector_weight, lexical_weight, importance_weight]).reshape(4, *[1] * len(shape))
    parts = weights * x / denom * decay
    score = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    if decay.shape != shape:
        decay = np.broadcast_to(decay, shape).copy()
    return HybridParts(score, parts[0], parts[1], parts[2], parts[3], decay, stacked=parts)


# --- scalar transliterations ------------------------------------------------------------------------------


def _reference_time_decay(created_ms: float | None, now_ms: float) -> float:
    if created_ms is None or not math.isfinite(created_ms):
        return 1.0
    days = max(0.0, (now_ms - created_ms) / DAY_MS)
    return 0.8 + 0.2 / (1 + math.log(1 + days))


def _reference_hybrid_score(
    graph: float,
    vector: float,
    lexical: float,
    importance: float | None,
    created_ms: float | None,
    now_ms: float,
    graph_weight: float = 0.6,
    vector_weight: float = 0.3,
    importance_weight: float = 0.1,
    lexical_weight: float = 0.18,
) -> float:
    """Reference ``hybridScore(...) × timeDecayFactor(...)`` for one node."""

    def clamp01(x: float) -> float:
        return min(1.0, max(0.0, x))

    g = clamp01(graph / 2)
    v = clamp01(vector)
    lx = clamp01(lexical)
    i = clamp01((5.0 if importance is None or math.isnan(importance) else importance) / 10)
    denom = _weight_sum(graph_weight, vector_weight, importance_weight, lexical_weight)
    base = (graph_weight * g + vector_weight * v + lexical_weight * lx + importance_weight * i) / denom
    return base * _reference_time_decay(created_ms, now_ms)
