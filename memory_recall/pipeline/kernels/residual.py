"""Residual-recall maths: reference NMF query analysis, a well-defined novelty, and FISTA sparse coding
(reference §3.10 steps 3–4, §7 item 17; scenarios §6.3 16–17; recall-spec departure 9).

Public functions
----------------
* :func:`nmf_query_analysis` ``(q, basis, n_topics=15, max_iter=100, tol=1e-4) -> NmfAnalysis`` — the
  reference ``nmfQueryAnalysis``, reproduced exactly. Basis rows are L2-normalised then absolute-valued into
  ``V`` (``rows × dim``); the query is only absolute-valued. ``k = min(max(1, ⌊n_topics⌋), rows)``;
  ``V ≈ W·H`` with **W = rows × k** (row weights) and **H = k × dim** (topic vectors, the factor the query
  is projected on). Init: LCG ``x ← (1664525·x + 1013904223) mod 2³²`` from seed 42, ``r = x / 0xffffffff``,
  W then H filled row-major with ``|avg + avg·0.5·(r − 0.5)| + 1e-6``, ``avg = max(sqrt(mean(V)/k), 0.01)``.
  Each iteration updates H then W multiplicatively with ε = 1e-10 in the denominator, **in place, element
  by element** (Gauss–Seidel: the denominator of entry ``(i, j)`` already sees the updated entries
  ``(< i, j)``). After iterations 0, 10, 20, … it stops when ``‖V − WH‖_F / ‖V‖_F < tol``. Then
  ``topics = softmax(H·q)``, ``novelty = ‖q − Σ_k topics_k·H_k‖ / max(‖q‖, 1e-10)`` (can exceed 1),
  ``semantic_depth = 1 − entropy / ln k`` (denominator 1 when k = 1), ``topic_coverage = #{topics > 0.5/k}``.
  Fewer than two rows or an empty query → ``(semantic_depth 0, topic_coverage 0, novelty 1, topics ())``.
  Cost O(max_iter · k · (rows + k) · dim); the sequential in-place sweep costs one small numpy call per
  topic per iteration (~10–20 ms for 24 × 384, 15 topics, 100 iterations).
* :func:`residual_novelty` ``(q, basis, method="nnls") -> ResidualNovelty`` — this project's novelty
  (departure 9), defined below.
* :func:`sparse_code_residual` ``(q, basis, lam=0.1, max_iter=80) -> SparseCode`` — the reference
  ``sparseCodeResidual``: query raw, basis rows L2-normalised (zero rows stay zero), Gram ``G = E·Eᵀ`` and
  ``b = E·q``; ``L`` = max absolute row sum of ``G`` (``< 1e-10`` → α = 0, residual = q); exactly
  ``max_iter`` FISTA steps with step ``1/L``, soft threshold ``lam/L``, momentum ``(t − 1)/t'``,
  ``t' = (1 + sqrt(1 + 4t²))/2``; ``residual = q − Σ α_i E_i``. Cost O(rows²·dim + max_iter·rows²).

``_reference_nmf_query_analysis`` and ``_reference_sparse_code_residual`` are plain-list transliterations
(differential tests, ``scripts/bench_kernels.py``).

Why not scikit-learn's NMF
--------------------------
``sklearn.decomposition.non_negative_factorization(init="custom", solver="mu")`` cannot reproduce the
reference factors. Transposing the problem (factorising ``Vᵀ`` with sklearn's ``W := Hᵀ``, ``H := Wᵀ``) does
fix the update order (sklearn updates its W before its H), but three differences remain:

1. sklearn's multiplicative update is *Jacobi*: a whole factor is updated from the previous iterate. The
   reference updates in place (Gauss–Seidel), which is the only reading that reproduces scenario 16 (with a
   Jacobi update the scenario gives novelty 0.3054 and topics [0.5070, 0.4930] instead of 0.1108 and
   [0.5451, 0.4549]); no sklearn option changes this.
2. sklearn has no ε in the denominator (it only replaces exact zeros by float32 eps), the reference adds
   1e-10 everywhere.
3. sklearn stops on the relative *decrease* of the error every 10 iterations, the reference on the relative
   *residual*; matching it would need chunked calls with ``tol=0``.

``scripts/bench_kernels.py`` prints the factor difference (order 1e-1, far above 1e-6), so the kernel keeps
its own numpy implementation.

The ambiguity left in the spec: the scenario values agree to 1e-7 whether the stop test runs after
iterations 0, 10, 20, … (chosen, the ``iter % 10 === 0`` idiom) or 9, 19, 29, … or never.

Novelty used by this project (departure 9, :func:`residual_novelty`)
-------------------------------------------------------------------
The reference's novelty mixes an absolute-valued, unnormalised query with softmax weights over arbitrarily
scaled NMF rows, so it is not bounded (1.377 for an orthogonal query) and discards signs (§7 item 17).
Here query and basis rows are treated identically: both L2-normalised, signs kept (no ``abs``). The novelty
is the distance from the normalised query ``q̂`` to the cone of non-negative combinations of the normalised
basis rows — ``novelty = min_{α ≥ 0} ‖q̂ − Σ α_i b̂_i‖`` (non-negative least squares, the constraint that
makes NMF explanations additive). Because ``α = 0`` is feasible and ``‖q̂‖ = 1`` it lies in [0, 1]; it is 0
exactly when the query is a non-negative mix of basis rows (e.g. equal to one), 1 when the query is
orthogonal to (or opposite to) every basis row, and ``sqrt(1 − cos²)`` for a single basis row. Its square
plus the squared norm of the reconstruction is 1 (the cone projection is orthogonal to its residual).
``method="projection"`` drops the sign constraint (distance to the span, ``sin`` of the angle to it).
A zero or empty query, or no usable basis row, gives novelty 1 (nothing explains it; the reference also
returns 1 for an empty query). Note that the reference threshold 0.4 was calibrated on the old measure.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.optimize

__all__ = [
    "NmfAnalysis",
    "ResidualNovelty",
    "SparseCode",
    "nmf_query_analysis",
    "residual_novelty",
    "sparse_code_residual",
]

_EPS = 1e-10  # reference: multiplicative-update denominator, norm floors
_LCG_A = 1664525
_LCG_C = 1013904223
_LCG_SEED = 42
_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class NmfAnalysis:
    """Reference ``nmfQueryAnalysis`` output. ``top_topics`` is the softmax over topics in topic order
    (the reference's ``topTopics`` in scenario 16); ``n_iter`` counts the iterations run."""

    semantic_depth: float
    topic_coverage: int
    novelty: float
    top_topics: tuple[float, ...]
    n_iter: int = 0


@dataclass(frozen=True)
class ResidualNovelty:
    """Departure-9 novelty in [0, 1] and the non-negative (or free) coefficients over the basis rows."""

    novelty: float
    coefficients: np.ndarray


@dataclass(frozen=True)
class SparseCode:
    """Reference ``sparseCodeResidual`` output."""

    alpha: np.ndarray
    residual: np.ndarray
    residual_norm: float


_EMPTY_ANALYSIS = NmfAnalysis(semantic_depth=0.0, topic_coverage=0, novelty=1.0, top_topics=(), n_iter=0)


@functools.lru_cache(maxsize=16)
def _lcg_uniforms(count: int) -> np.ndarray:
    """First ``count`` reference LCG draws ``x/0xffffffff`` from seed 42, by jump-ahead (no Python loop
    per draw): ``x_j = a_j·x_0 + c_j mod 2³²`` with ``a_{m+j} = a_j·a_m``, ``c_{m+j} = a_j·c_m + c_j``."""
    mask = np.uint64(_U32)
    a = np.array([_LCG_A], dtype=np.uint64)
    c = np.array([_LCG_C], dtype=np.uint64)
    while a.size < count:
        a_m, c_m = a[-1], c[-1]
        # Products of two values < 2³² fit in uint64; wrap-around mod 2⁶⁴ is harmless modulo 2³².
        a, c = np.concatenate([a, (a * a_m) & mask]), np.concatenate([c, (a * c_m + c) & mask])
    x = (a[:count] * np.uint64(_LCG_SEED) + c[:count]) & mask
    out = x.astype(np.float64) / float(_U32)
    out.flags.writeable = False
    return out


def _as_matrix(basis: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    b = np.asarray(basis, dtype=np.float64)
    if b.ndim == 1:
        b = np.zeros((0, 0)) if b.size == 0 else b.reshape(1, -1)
    if b.ndim != 2:
        raise ValueError(f"basis must be a 2-D (rows × dim) array; got shape {b.shape}.")
    return b


def _row_normalise(b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(b, axis=1, keepdims=True)
    return np.divide(b, norms, out=np.zeros_like(b), where=norms > 0)


def _check_dims(q: np.ndarray, b: np.ndarray) -> None:
    if b.shape[0] and q.shape[0] != b.shape[1]:
        raise ValueError(f"query has dimension {q.shape[0]} but the basis rows have {b.shape[1]}.")


def _topic_summary(h: np.ndarray, q: np.ndarray, k: int, n_iter: int) -> NmfAnalysis:
    s = h @ q
    p = np.exp(s - s.max())
    p /= p.sum()
    novelty = float(np.linalg.norm(q - p @ h) / max(float(np.linalg.norm(q)), _EPS))
    pos = p[p > 0]
    entropy = float(-(pos * np.log(pos)).sum())
    depth = 1.0 - entropy / (math.log(k) if k > 1 else 1.0)
    coverage = int(np.count_nonzero(p > 0.5 / k))
    return NmfAnalysis(depth, coverage, novelty, tuple(float(v) for v in p), n_iter)


def nmf_query_analysis(
    q: np.ndarray | Sequence[float],
    basis: np.ndarray | Sequence[Sequence[float]],
    n_topics: int = 15,
    max_iter: int = 100,
    tol: float = 1e-4,
) -> NmfAnalysis:
    """Reference ``nmfQueryAnalysis`` (see the module docstring for the exact algorithm).

    >>> r = nmf_query_analysis([0.8, 0.6, 0, 0], [[1, 0, 0, 0], [0, 1, 0, 0]], n_topics=2, max_iter=50)
    >>> round(r.novelty, 6), [round(t, 6) for t in r.top_topics], r.topic_coverage
    (0.11083, [0.545115, 0.454885], 2)
    """
    qv = np.abs(np.asarray(q, dtype=np.float64).reshape(-1))
    b = _as_matrix(basis)
    rows = b.shape[0]
    if rows < 2 or qv.size == 0:
        return _EMPTY_ANALYSIS
    _check_dims(qv, b)
    v = np.abs(_row_normalise(b))
    k = min(max(1, math.floor(n_topics)), rows)
    _, h, n_iter = _nmf_factorise(v, k, max_iter, tol)
    return _topic_summary(h, qv, k, n_iter)


def _nmf_init(v: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference deterministic init: LCG draws fill W (rows × k) then H (k × dim), row-major."""
    rows, dim = v.shape
    avg = max(math.sqrt(float(v.mean()) / k), 0.01)
    init = np.abs(avg + avg * 0.5 * (_lcg_uniforms(rows * k + k * dim) - 0.5)) + 1e-6
    return init[: rows * k].reshape(rows, k).copy(), init[rows * k :].reshape(k, dim).copy()


def _nmf_factorise(v: np.ndarray, k: int, max_iter: int, tol: float) -> tuple[np.ndarray, np.ndarray, int]:
    """``V ≈ W·H`` by the reference's in-place multiplicative updates; returns ``(W, H, iterations run)``."""
    w, h = _nmf_init(v, k)
    norm_v = max(float(np.linalg.norm(v)), _EPS)
    n_iter = 0
    for it in range(max_iter):
        n_iter = it + 1
        wtv = w.T @ v
        wtw = w.T @ w
        for i in range(k):  # in place: row i's denominator sees rows < i already updated
            h[i] *= wtv[i] / (wtw[i] @ h + _EPS)
        vht = v @ h.T
        hht = h @ h.T
        for i in range(k):
            w[:, i] *= vht[:, i] / (w @ hht[:, i] + _EPS)
        if it % 10 == 0 and float(np.linalg.norm(v - w @ h)) / norm_v < tol:
            break
    return w, h, n_iter


def residual_novelty(
    q: np.ndarray | Sequence[float],
    basis: np.ndarray | Sequence[Sequence[float]],
    method: Literal["nnls", "projection"] = "nnls",
) -> ResidualNovelty:
    """Novelty in [0, 1] of a query against a basis, both L2-normalised, signs kept (departure 9).

    ``nnls``: distance to the cone of non-negative combinations of the basis rows; ``projection``: distance
    to their span. O(dim · rows²).

    >>> residual_novelty([0, 0, 1], [[1, 0, 0], [0, 1, 0]]).novelty
    1.0
    """
    if method not in ("nnls", "projection"):
        raise ValueError(f"The 'method' parameter must be 'nnls' or 'projection'. Got {method!r} instead.")
    qv = np.asarray(q, dtype=np.float64).reshape(-1)
    b = _as_matrix(basis)
    _check_dims(qv, b)
    q_norm = float(np.linalg.norm(qv))
    keep = np.linalg.norm(b, axis=1) > 0
    coef = np.zeros(b.shape[0])
    if q_norm == 0.0 or not np.isfinite(q_norm) or not keep.any():
        return ResidualNovelty(1.0, coef)
    qh = qv / q_norm
    a = _row_normalise(b[keep]).T  # dim × rows
    if method == "nnls":
        x, _ = scipy.optimize.nnls(a, qh)
    else:
        x = np.linalg.lstsq(a, qh, rcond=None)[0]
    coef[keep] = x
    novelty = float(np.linalg.norm(qh - a @ x))
    return ResidualNovelty(min(1.0, max(0.0, novelty)), coef)


def sparse_code_residual(
    q: np.ndarray | Sequence[float],
    basis: np.ndarray | Sequence[Sequence[float]],
    lam: float = 0.1,
    max_iter: int = 80,
) -> SparseCode:
    """Reference ``sparseCodeResidual``: FISTA lasso of the raw query over the normalised basis rows.

    >>> r = sparse_code_residual([0.8, 0.6, 0, 0], [[1, 0, 0, 0], [0, 1, 0, 0]])
    >>> r.alpha.round(6).tolist(), round(r.residual_norm, 6)
    ([0.7, 0.5], 0.141421)
    """
    qv = np.asarray(q, dtype=np.float64).reshape(-1)
    b = _as_matrix(basis)
    _check_dims(qv, b)
    e = _row_normalise(b)
    m = e.shape[0]
    gram = e @ e.T
    lip = float(np.abs(gram).sum(axis=1).max()) if m else 0.0
    if lip < _EPS:
        return SparseCode(np.zeros(m), qv.copy(), float(np.linalg.norm(qv)))
    eq = e @ qv
    thr = lam / lip
    alpha = np.zeros(m)
    y = alpha.copy()
    t = 1.0
    for _ in range(max_iter):
        z = y - (gram @ y - eq) / lip
        new = np.sign(z) * np.maximum(np.abs(z) - thr, 0.0)
        t_new = (1.0 + math.sqrt(1.0 + 4.0 * t * t)) / 2.0
        y = new + ((t - 1.0) / t_new) * (new - alpha)
        alpha, t = new, t_new
    residual = qv - alpha @ e
    return SparseCode(alpha, residual, float(np.linalg.norm(residual)))


# --- plain-Python transliterations (differential tests, benchmark) ------------------------------------------


def _py_normalise(row: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in row))
    return [x / norm for x in row] if norm > 0 else [0.0] * len(row)


def _reference_nmf_query_analysis(
    q: Sequence[float],
    basis: Sequence[Sequence[float]],
    n_topics: int = 15,
    max_iter: int = 100,
    tol: float = 1e-4,
) -> NmfAnalysis:
    """Plain-list transliteration of reference ``nmfQueryAnalysis`` (in-place multiplicative updates)."""
    rows = len(basis)
    if rows < 2 or len(q) == 0:
        return _EMPTY_ANALYSIS
    v = [[abs(x) for x in _py_normalise(r)] for r in basis]
    qa = [abs(x) for x in q]
    dim = len(v[0])
    k = min(max(1, math.floor(n_topics)), rows)
    avg = max(math.sqrt(sum(sum(r) for r in v) / (rows * dim) / k), 0.01)
    state = _LCG_SEED

    def rand() -> float:
        nonlocal state
        state = (_LCG_A * state + _LCG_C) % 2**32
        return state / _U32

    w = [[abs(avg + avg * 0.5 * (rand() - 0.5)) + 1e-6 for _ in range(k)] for _ in range(rows)]
    h = [[abs(avg + avg * 0.5 * (rand() - 0.5)) + 1e-6 for _ in range(dim)] for _ in range(k)]
    norm_v = max(math.sqrt(sum(x * x for r in v for x in r)), _EPS)
    n_iter = 0
    for it in range(max_iter):
        n_iter = it + 1
        wtv = [[sum(w[r][a] * v[r][j] for r in range(rows)) for j in range(dim)] for a in range(k)]
        wtw = [[sum(w[r][a] * w[r][c] for r in range(rows)) for c in range(k)] for a in range(k)]
        for a in range(k):
            for j in range(dim):
                den = sum(wtw[a][c] * h[c][j] for c in range(k))
                h[a][j] *= wtv[a][j] / (den + _EPS)
        vht = [[sum(v[r][j] * h[a][j] for j in range(dim)) for a in range(k)] for r in range(rows)]
        hht = [[sum(h[a][j] * h[c][j] for j in range(dim)) for c in range(k)] for a in range(k)]
        for r in range(rows):
            for a in range(k):
                den = sum(w[r][c] * hht[c][a] for c in range(k))
                w[r][a] *= vht[r][a] / (den + _EPS)
        if it % 10 == 0:
            err = math.sqrt(
                sum(
                    (v[r][j] - sum(w[r][a] * h[a][j] for a in range(k))) ** 2
                    for r in range(rows)
                    for j in range(dim)
                )
            )
            if err / norm_v < tol:
                break
    scores = [sum(h[a][j] * qa[j] for j in range(dim)) for a in range(k)]
    top = max(scores)
    ex = [math.exp(s - top) for s in scores]
    total = sum(ex)
    topics = [x / total for x in ex]
    recon = [sum(topics[a] * h[a][j] for a in range(k)) for j in range(dim)]
    q_norm = math.sqrt(sum(x * x for x in qa))
    novelty = math.sqrt(sum((qa[j] - recon[j]) ** 2 for j in range(dim))) / max(q_norm, _EPS)
    entropy = -sum(p * math.log(p) for p in topics if p > 0)
    depth = 1 - entropy / (math.log(k) if k > 1 else 1.0)
    coverage = sum(1 for p in topics if p > 0.5 / k)
    return NmfAnalysis(depth, coverage, novelty, tuple(topics), n_iter)


def _reference_sparse_code_residual(
    q: Sequence[float], basis: Sequence[Sequence[float]], lam: float = 0.1, max_iter: int = 80
) -> SparseCode:
    """Plain-list transliteration of reference ``sparseCodeResidual``."""
    e = [_py_normalise(r) for r in basis]
    m = len(e)
    gram = [[sum(a * b for a, b in zip(e[i], e[j], strict=True)) for j in range(m)] for i in range(m)]
    lip = max((sum(abs(x) for x in row) for row in gram), default=0.0)
    if lip < _EPS:
        return SparseCode(np.zeros(m), np.array(q, dtype=float), math.sqrt(sum(x * x for x in q)))
    eq = [sum(a * b for a, b in zip(e[i], q, strict=True)) for i in range(m)]
    thr = lam / lip
    alpha = [0.0] * m
    y = alpha[:]
    t = 1.0
    for _ in range(max_iter):
        grad = [sum(gram[i][j] * y[j] for j in range(m)) - eq[i] for i in range(m)]
        new = []
        for i in range(m):
            z = y[i] - grad[i] / lip
            new.append(math.copysign(max(abs(z) - thr, 0.0), z) if z != 0 else 0.0)
        t_new = (1 + math.sqrt(1 + 4 * t * t)) / 2
        y = [new[i] + ((t - 1) / t_new) * (new[i] - alpha[i]) for i in range(m)]
        alpha, t = new, t_new
    residual = [q[j] - sum(alpha[i] * e[i][j] for i in range(m)) for j in range(len(q))]
    return SparseCode(np.array(alpha), np.array(residual), math.sqrt(sum(x * x for x in residual)))
