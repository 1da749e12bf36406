"""Greedy DPP selection (reference §3.14 ``dppGreedySelect``, scenario §6.3 15).

Public function
---------------
* :func:`dpp_greedy_select` ``(embeddings, scores, k, quality_weight=1.0) -> list[int]``: indices in
  **pick order** (not score order). Rows are L2-normalised (a zero row stays zero);
  ``q_i = max(score_i, 1e-10) ** quality_weight``; ``d_i = q_i² + 1e-8``; each of the ``k`` picks takes the
  unselected index with the largest ``d`` (first index on ties), then — unless it is the last pick or
  ``d_best < 1e-10`` — appends the incremental Cholesky row
  ``c = (q_best·⟨x_best, x⟩·q − Σ_prev C_j[best]·C_j) / sqrt(d_best)`` and sets ``d = max(0, d − c²)``.
  ``k ≥ n`` returns ``[0, …, n−1]``; ``k ≤ 0`` returns ``[]``. Non-finite scores or embeddings (or an
  overflowing ``q``) raise ``ValueError``.
  Cost O(n²·dim) for the Gram matrix plus O(k²·n) for the rows (n is the candidate pool, tens to a few
  hundred).

``_reference_dpp_greedy_select`` is the plain-list transliteration used by the differential tests and the
benchmark. Both agree exactly except at near-ties of ``d`` (within ~1e-15 relative), where BLAS and a
Python loop may round the dot products differently and pick a different index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["dpp_greedy_select"]

_SCORE_FLOOR = 1e-10  # reference: max(score, 1e-10)
_DIAG_JITTER = 1e-8  # reference: d_i = q_i² + 1e-8
_MIN_GAIN = 1e-10  # reference: no Cholesky update once d_best < 1e-10


def dpp_greedy_select(
    embeddings: np.ndarray | Sequence[Sequence[float]],
    scores: np.ndarray | Sequence[float],
    k: int,
    quality_weight: float = 1.0,
) -> list[int]:
    """Greedy MAP selection of a quality-weighted DPP; returns indices in pick order.

    >>> dpp_greedy_select([[1, 0, 0], [0.99, 0.01, 0], [0, 1, 0]], [0.95, 0.9, 0.85], 2)
    [0, 2]
    """
    x = np.array(embeddings, dtype=np.float64)  # always a copy: normalised in place below
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = s.shape[0]
    if x.ndim != 2 or x.shape[0] != n:
        raise ValueError(f"embeddings must be an (n × dim) array with n = len(scores) = {n}; got {x.shape}.")
    if not np.all(np.isfinite(s)):
        raise ValueError("The 'scores' parameter must contain only finite values.")
    if k >= n:
        return list(range(n))
    if k <= 0:
        return []

    # The same operations as np.linalg.norm(x, axis=1), without its conj() copy.
    norms = np.sqrt(np.add.reduce(x * x, axis=1))
    if not bool(np.isfinite(norms).all()):
        raise ValueError("The 'embeddings' parameter must contain only finite values.")
    if bool((norms > 0).all()):
        np.divide(x, norms[:, None], out=x)
    else:  # a zero row stays zero
        x = np.divide(x, norms[:, None], out=np.zeros_like(x), where=norms[:, None] > 0)
    q = np.maximum(s, _SCORE_FLOOR) ** quality_weight
    kernel = (q[:, None] * (x @ x.T)) * q[None, :]
    d = q * q + _DIAG_JITTER
    if not bool(np.isfinite(d).all()):  # then the kernel (|⟨x_i, x_j⟩| ≤ 1) and every row below stay finite
        raise ValueError("The quality scores ** quality_weight overflow.")
    # A picked index gets d = -inf and floor = -inf, so d.argmax() only sees unpicked ones: d − c² keeps -inf
    # there (c is finite), max(0, d − c²) as the reference everywhere else.
    floor = np.zeros(n)
    chol = np.zeros((k, n))
    n_rows = 0
    picked: list[int] = []
    for t in range(k):
        # argmax returns the first maximum: ties go to the lowest index, as in the reference.
        best = int(d.argmax())
        d_best = float(d[best])
        picked.append(best)
        d[best] = floor[best] = -np.inf
        if t == k - 1 or d_best < _MIN_GAIN:
            continue
        row = chol[n_rows]  # the new Cholesky row, computed in place
        np.subtract(kernel[best], chol[:n_rows, best] @ chol[:n_rows], out=row)
        row /= math.sqrt(d_best)
        n_rows += 1
        d = np.maximum(floor, d - row * row)
    return picked


def _reference_dpp_greedy_select(
    embeddings: Sequence[Sequence[float]], scores: Sequence[float], k: int, quality_weight: float = 1.0
) -> list[int]:
    """Plain-list transliteration of reference §3.14 ``dppGreedySelect``."""
    n = len(embeddings)
    if k >= n:
        return list(range(n))
    if k <= 0:
        return []
    vecs: list[list[float]] = []
    for v in embeddings:
        norm = math.sqrt(sum(c * c for c in v))
        vecs.append([c / norm for c in v] if norm > 0 else [0.0] * len(v))
    q = [max(sc, _SCORE_FLOOR) ** quality_weight for sc in scores]
    d = [qi * qi + _DIAG_JITTER for qi in q]
    rows: list[list[float]] = []
    chosen = [False] * n
    picked: list[int] = []
    for t in range(k):
        best, best_d = -1, -math.inf
        for i in range(n):
            if not chosen[i] and d[i] > best_d:
                best, best_d = i, d[i]
        picked.append(best)
        chosen[best] = True
        if t == k - 1 or best_d < _MIN_GAIN:
            continue
        xb = vecs[best]
        sq = math.sqrt(best_d)
        new_row = []
        for i in range(n):
            val = q[best] * sum(a * b for a, b in zip(xb, vecs[i], strict=True)) * q[i]
            for prev in rows:
                val -= prev[best] * prev[i]
            new_row.append(val / sq)
        rows.append(new_row)
        for i in range(n):
            d[i] = max(0.0, d[i] - new_row[i] * new_row[i])
    return picked
