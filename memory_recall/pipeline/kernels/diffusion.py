"""PEDSA spreading activation on CSR adjacency (reference §1.3 adjacency, §3.9 ``propagateActivation`` /
``diffuseAndRank``, constants §5.3, scenarios §6.2 11–14).

Public functions
----------------
* :func:`build_adjacency` ``(n, src, dst, strength, inhibit_mask, temporal_pairs=None, temporal_strength=0.2)
  -> Adjacency``. Every edge is undirected and added to both endpoints; parallel edges are **summed** (the
  reference appends each edge to both endpoint lists, so two parallel edges both contribute). Inhibit edges
  (reference ``edgeType 255``) go to a separate matrix. Temporal pairs are deduplicated per unordered pair and
  added once each with ``temporal_strength`` (clamped to [0, 1]). O(E log E).
* :func:`propagate` ``(adj, seed_idx, seed_energy, *, max_steps=2, decay=0.6, top_k=100, min_energy=0.01,
  clamp=2.0, teleport_alpha=0.0, inhibit_multiplier=2.0) -> (idx, energy)``: the "strongest value over all
  steps" map of reference §3.9 steps 1–7, as arrays sorted by node index. Each step gathers the CSR rows of
  the (at most ``top_k`` + #seeds) active nodes and reduces the contributions with one ``np.unique`` +
  ``bincount``: O(steps · (nnz of the active rows) · log) plus one O(n) result buffer per call; no Python
  loop over nodes or edges.
* :func:`rank` ``(idx, energy, order_key) -> (idx, energy)``: ``diffuseAndRank``'s ordering — positive
  energies only, energy desc, ties by ``order_key`` (each node's byte-order rank of its id) asc.

Private ``_reference_build_adjacency`` / ``_reference_propagate`` / ``_reference_rank`` are plain-Python
transliterations over insertion-ordered adjacency lists, used by the differential tests and
``scripts/bench_kernels.py``.

Departures from the reference (recall-spec "Deliberate departures")
------------------------------------------------------------------
* ``temporal_strength = 0`` means **no** temporal links. The reference parses the strength as
  ``Number(x) || 0.2`` so an explicit 0 silently becomes 0.2 (reference §7 item 13, scenario 14).
* Top-k pruning (step 5) breaks ``|value|`` ties by node index ascending. The reference's stable sort keeps
  the insertion order of the step's ``next`` map (adjacency order of the active nodes, then re-injected
  seeds), which depends on edge-list order. Ties at the cut are common in practice because energies clamp
  to exactly ±``clamp``; the snapshot assigns indices in id byte order, so this is "ties by node id"
  (recall-spec departure 10).
* Seeds with the same node are summed with a clamp after each addition, in input order (the reference's
  incremental ``clamp(initial[id] + e)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["INHIBIT_EDGE_TYPE", "Adjacency", "build_adjacency", "propagate", "rank"]

INHIBIT_EDGE_TYPE = 255  # reference §1.3: edgeType 255 = inhibit


@dataclass(frozen=True)
class Adjacency:
    """Symmetric n×n CSR strength matrices; built once per graph version (recall-spec departure 11)."""

    normal: sp.csr_array
    inhibit: sp.csr_array
    synthetic_edge_count: int = 0

    @property
    def n(self) -> int:
        return int(self.normal.shape[0])


def _symmetric_csr(n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> sp.csr_array:
    rows = np.concatenate([src, dst])
    cols = np.concatenate([dst, src])
    data = np.concatenate([w, w])
    mat = sp.csr_array((data, (rows, cols)), shape=(n, n))
    mat.sum_duplicates()
    mat.sort_indices()
    return mat


def build_adjacency(
    n: int,
    src: np.ndarray | Sequence[int],
    dst: np.ndarray | Sequence[int],
    strength: np.ndarray | Sequence[float],
    inhibit_mask: np.ndarray | Sequence[bool] | None = None,
    temporal_pairs: np.ndarray | Sequence[tuple[int, int]] | None = None,
    temporal_strength: float = 0.2,
) -> Adjacency:
    """Build the diffusion adjacency (reference §1.3 ``buildTemporalAdjacencyMap``) as two CSR matrices.

    ``src``/``dst``/``strength``/``inhibit_mask`` describe the active edges between non-archived nodes (the
    caller filters; strengths are used as given). ``temporal_pairs`` is a (p × 2) array of node indices
    (prev/next neighbours); each unordered pair counts once. ``temporal_strength`` is clamped to [0, 1]; 0
    or less adds no links (departure from the reference's ``|| 0.2`` quirk). O(E log E).

    >>> adj = build_adjacency(3, [0], [1], [0.5], [False], temporal_pairs=[(1, 2), (2, 1)])
    >>> adj.normal.toarray()[1].tolist(), adj.synthetic_edge_count
    ([0.5, 0.0, 0.2], 1)
    """
    if n < 0:
        raise ValueError(f"The 'n' parameter must be an int in the range [0, inf). Got {n} instead.")
    src_a = np.asarray(src, dtype=np.int64).reshape(-1)
    dst_a = np.asarray(dst, dtype=np.int64).reshape(-1)
    w_a = np.asarray(strength, dtype=np.float64).reshape(-1)
    if inhibit_mask is None:
        inh = np.zeros(src_a.shape[0], dtype=bool)
    else:
        inh = np.asarray(inhibit_mask, dtype=bool).reshape(-1)
    if not (src_a.shape == dst_a.shape == w_a.shape == inh.shape):
        raise ValueError(
            "src, dst, strength and inhibit_mask must have the same length; got "
            f"{src_a.shape[0]}, {dst_a.shape[0]}, {w_a.shape[0]}, {inh.shape[0]}."
        )
    for name, arr in (("src", src_a), ("dst", dst_a)):
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise ValueError(f"The '{name}' indices must be in the range [0, {n}).")

    normal_src, normal_dst, normal_w = src_a[~inh], dst_a[~inh], w_a[~inh]
    synthetic = 0
    strength_t = min(1.0, max(0.0, float(temporal_strength))) if math.isfinite(temporal_strength) else 0.0
    if temporal_pairs is not None and strength_t > 0.0:
        pairs = np.asarray(temporal_pairs, dtype=np.int64).reshape(-1, 2)
        if pairs.size and (pairs.min() < 0 or pairs.max() >= n):
            raise ValueError(f"The 'temporal_pairs' indices must be in the range [0, {n}).")
        # Once per unordered pair (reference key = the two ids sorted).
        pairs = np.unique(np.sort(pairs, axis=1), axis=0)
        synthetic = int(pairs.shape[0])
        normal_src = np.concatenate([normal_src, pairs[:, 0]])
        normal_dst = np.concatenate([normal_dst, pairs[:, 1]])
        normal_w = np.concatenate([normal_w, np.full(synthetic, strength_t)])
    return Adjacency(
        normal=_symmetric_csr(n, normal_src, normal_dst, normal_w),
        inhibit=_symmetric_csr(n, src_a[inh], dst_a[inh], w_a[inh]),
        synthetic_edge_count=synthetic,
    )


def _gather_rows(mat: sp.csr_array | sp.csr_matrix, rows: np.ndarray, weights: np.ndarray) -> tuple[
    np.ndarray, np.ndarray
]:
    """Columns and ``data * weight[row]`` of the CSR rows ``rows`` (no scipy fancy-indexing overhead)."""
    indptr = mat.indptr
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    # Flat positions of the concatenated row slices: arange shifted per row.
    offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)
    return mat.indices[offsets].astype(np.int64, copy=False), mat.data[offsets] * np.repeat(weights, lengths)


def _initial_seeds(
    n: int, seed_idx: np.ndarray, seed_energy: np.ndarray, clamp: float, min_energy: float
) -> tuple[np.ndarray, np.ndarray]:
    """Reference step 1: clamp each seed, drop |e| < min_energy, sum per node with a clamp after each add."""
    e = np.clip(seed_energy, -clamp, clamp)
    keep = np.abs(e) >= min_energy
    idx, e = seed_idx[keep], e[keep]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"The 'seed_idx' indices must be in the range [0, {n}).")
    uniq, first, counts = np.unique(idx, return_index=True, return_counts=True)
    values = e[first].copy()
    # Seeds are few (vector hits + anchors); only duplicated nodes need the sequential incremental clamp.
    for pos in np.flatnonzero(counts > 1):
        acc = 0.0
        for val in e[idx == uniq[pos]]:
            acc = min(clamp, max(-clamp, acc + float(val)))
        values[pos] = acc
    return uniq, values


def propagate(
    adj: Adjacency,
    seed_idx: np.ndarray | Sequence[int],
    seed_energy: np.ndarray | Sequence[float],
    *,
    max_steps: int = 2,
    decay: float = 0.6,
    top_k: int = 100,
    min_energy: float = 0.01,
    clamp: float = 2.0,
    teleport_alpha: float = 0.0,
    inhibit_multiplier: float = 2.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Spreading activation (reference §3.9 ``propagateActivation``), sparse mat-vec per step.

    Returns ``(idx, energy)`` sorted by node index: for every node touched (seeds included), the value with
    the largest ``|value|`` over the initial seeds and all steps (negative = inhibited). Defaults: §5.3.
    Cost per step O(nnz(active rows) · log); ``top_k`` bounds the active set. Ties at the top-k cut break by
    node index (module docstring).

    >>> adj = build_adjacency(3, [0, 1], [1, 2], [1.0, 0.5], [False, False])
    >>> idx, e = propagate(adj, [0], [1.0])
    >>> idx.tolist(), e.round(6).tolist()
    ([0, 1, 2], [1.0, 0.6, 0.18])
    """
    n = adj.n
    alpha = min(1.0, max(0.0, float(teleport_alpha)))
    seed_i = np.asarray(seed_idx, dtype=np.int64).reshape(-1)
    seed_e = np.asarray(seed_energy, dtype=np.float64).reshape(-1)
    if seed_i.shape != seed_e.shape:
        raise ValueError("seed_idx and seed_energy must have the same length.")
    init_idx, init_val = _initial_seeds(n, seed_i, seed_e, clamp, min_energy)

    result = np.zeros(n, dtype=np.float64)
    touched = np.zeros(n, dtype=bool)
    result[init_idx] = init_val
    touched[init_idx] = True

    normal_factor = decay * (1.0 - alpha)
    inhibit_factor = -decay * inhibit_multiplier
    cur_idx, cur_val = init_idx, init_val
    for _ in range(max_steps):
        if cur_idx.size == 0:
            break
        n_cols, n_w = _gather_rows(adj.normal, cur_idx, cur_val)
        i_cols, i_w = _gather_rows(adj.inhibit, cur_idx, np.abs(cur_val))
        cols = np.concatenate([n_cols, i_cols])
        contrib = np.concatenate([n_w * normal_factor, i_w * inhibit_factor])
        # Sum per reached node: a dense bincount over all n nodes (adds in input order, as the bincount over
        # np.unique's inverse would: same bits) and the reached nodes read off a mask, in index order — cheaper
        # than np.unique's sort for the few thousand entries a step produces.
        reached = np.zeros(n, dtype=bool)
        reached[cols] = True
        nxt_idx = np.flatnonzero(reached)
        summed = np.bincount(cols, weights=contrib, minlength=n)[nxt_idx]
        nxt_val: np.ndarray = np.clip(summed, -clamp, clamp)
        alive = np.abs(nxt_val) >= min_energy
        nxt_idx, nxt_val = nxt_idx[alive], nxt_val[alive]

        if alpha > 0.0 and init_idx.size:
            # Step 4: every seed is re-injected (appended if not reached), then re-filtered. Done on dense
            # (n,) arrays — value and membership per node — instead of a sorted union and searchsorted: the
            # same values, read back in index order.
            merged_val = np.zeros(n)
            merged_val[nxt_idx] = nxt_val
            member = reached  # reused: every reached node not in nxt_idx is reset first
            member[:] = False
            member[nxt_idx] = True
            member[init_idx] = True
            merged_val[init_idx] = np.clip((1.0 - alpha) * merged_val[init_idx] + alpha * init_val, -clamp, clamp)
            member[init_idx] = np.abs(merged_val[init_idx]) >= min_energy
            nxt_idx = np.flatnonzero(member)
            nxt_val = merged_val[nxt_idx]

        if nxt_idx.size > top_k:
            # The top_k by |value| desc, ties by node index asc (entries are index-sorted), kept in index order:
            # everything above the top_k-th largest |value|, then the first entries equal to it. The same
            # selection as a stable sort, with a partition instead.
            mag = np.abs(nxt_val)
            k = max(0, top_k)
            if k == 0:
                keep = np.zeros(mag.size, dtype=bool)
            else:
                kth = np.partition(mag, mag.size - k)[mag.size - k]
                keep = mag > kth
                keep[np.flatnonzero(mag == kth)[: k - int(keep.sum())]] = True
            nxt_idx, nxt_val = nxt_idx[keep], nxt_val[keep]

        stronger = np.abs(nxt_val) > np.abs(result[nxt_idx])
        result[nxt_idx[stronger]] = nxt_val[stronger]
        touched[nxt_idx[stronger]] = True
        cur_idx, cur_val = nxt_idx, nxt_val

    out_idx = np.flatnonzero(touched)
    return out_idx, result[out_idx]


def rank(
    idx: np.ndarray, energy: np.ndarray, order_key: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``diffuseAndRank`` ordering: keep ``energy > 0``; sort by energy desc, then ``order_key[idx]`` asc.

    ``order_key`` gives each node's rank in id byte order (default: node index). O(m log m).
    """
    idx = np.asarray(idx, dtype=np.int64)
    energy = np.asarray(energy, dtype=np.float64)
    pos = energy > 0
    idx, energy = idx[pos], energy[pos]
    key = idx if order_key is None else np.asarray(order_key)[idx]
    order = np.lexsort((key, -energy))
    return idx[order], energy[order]


# --- plain-Python transliterations (differential tests, benchmark) ------------------------------------------

AdjLists = dict[str, list[tuple[str, float, int]]]


def _reference_build_adjacency(
    node_ids: Sequence[str],
    edges: Iterable[tuple[str, str, float, int]],
    temporal_pairs: Iterable[tuple[str, str]] = (),
    temporal_strength: float = 0.2,
) -> tuple[AdjLists, int]:
    """Reference §1.3 adjacency lists: each edge appended to both endpoints in edge order; temporal pairs
    once per unordered pair (with this project's departure: strength 0 adds nothing)."""
    adj: AdjLists = {nid: [] for nid in node_ids}
    for a, b, w, etype in edges:
        adj[a].append((b, w, etype))
        adj[b].append((a, w, etype))
    strength = min(1.0, max(0.0, temporal_strength))
    seen: set[tuple[str, str]] = set()
    if strength > 0:
        for a, b in temporal_pairs:
            key = (a, b) if a <= b else (b, a)
            if key in seen:
                continue
            seen.add(key)
            adj[a].append((b, strength, 0))
            adj[b].append((a, strength, 0))
    return adj, len(seen)


def _clamp(x: float, lim: float) -> float:
    return min(lim, max(-lim, x))


def _reference_propagate(
    adj_lists: Mapping[str, list[tuple[str, float, int]]],
    seeds: Sequence[tuple[str, float]],
    *,
    max_steps: int = 2,
    decay: float = 0.6,
    top_k: int = 100,
    min_energy: float = 0.01,
    clamp: float = 2.0,
    teleport_alpha: float = 0.0,
    inhibit_multiplier: float = 2.0,
    tie_key: Callable[[str], Any] | None = None,
) -> dict[str, float]:
    """Reference §3.9 ``propagateActivation`` over insertion-ordered adjacency lists.

    ``tie_key=None`` keeps the reference's stable-sort tie order (insertion order of ``next``); passing a key
    (e.g. node index) reproduces :func:`propagate`'s deterministic tie-break for differential tests.
    """
    alpha = min(1.0, max(0.0, teleport_alpha))
    initial: dict[str, float] = {}
    for nid, energy in seeds:
        e = _clamp(energy, clamp)
        if abs(e) < min_energy:
            continue
        initial[nid] = _clamp(initial.get(nid, 0.0) + e, clamp)
    result = dict(initial)
    current = dict(initial)
    for _ in range(max_steps):
        if not current:
            break
        nxt: dict[str, float] = {}
        for u, e in current.items():
            for v, w, etype in adj_lists.get(u, ()):
                if etype == INHIBIT_EDGE_TYPE:
                    c = -abs(e) * w * decay * inhibit_multiplier
                else:
                    c = e * w * decay * (1 - alpha)
                nxt[v] = nxt.get(v, 0.0) + c
        for v in list(nxt):
            nxt[v] = _clamp(nxt[v], clamp)
            if abs(nxt[v]) < min_energy:
                del nxt[v]
        if alpha > 0:
            for s, e0 in initial.items():
                val = _clamp((1 - alpha) * nxt.get(s, 0.0) + alpha * e0, clamp)
                if abs(val) < min_energy:
                    nxt.pop(s, None)
                else:
                    nxt[s] = val
        if len(nxt) > top_k:
            items = list(nxt.items())
            if tie_key is None:
                items.sort(key=lambda kv: -abs(kv[1]))
            else:
                key_fn = tie_key
                items.sort(key=lambda kv: (-abs(kv[1]), key_fn(kv[0])))
            nxt = dict(items[: max(0, top_k)])
        for v, val in nxt.items():
            if abs(val) > abs(result.get(v, 0.0)):
                result[v] = val
        current = nxt
    return result


def _reference_rank(result: Mapping[str, float], tie_key: Callable[[str], Hashable] | None = None) -> list[
    tuple[str, float]
]:
    """``diffuseAndRank``: positive energies, energy desc then id (byte order unless ``tie_key``)."""
    key_fn: Callable[[str], Any] = tie_key if tie_key is not None else (lambda s: s.encode("utf-8"))
    items = [(k, v) for k, v in result.items() if v > 0]
    items.sort(key=lambda kv: (-kv[1], key_fn(kv[0])))
    return items
