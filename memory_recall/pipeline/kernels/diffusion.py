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
  steps" map of reference §3.9 steps 1–7, as arrays sorted by node index. Each step gathers the normal and
  inhibit rows of the (at most ``top_k`` + #seeds) active nodes in one pass over a stacked copy of both
  matrices (built once per :class:`Adjacency`) and sums the contributions per node with one ``bincount``:
  O(steps · (n + nnz of the active rows)), a fixed few dozen numpy calls per step whatever the frontier size;
  no Python loop over nodes or edges.
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["INHIBIT_EDGE_TYPE", "Adjacency", "build_adjacency", "propagate", "rank"]

INHIBIT_EDGE_TYPE = 255  # reference §1.3: edgeType 255 = inhibit


@dataclass(frozen=True)
class Adjacency:
    """Symmetric n×n CSR strength matrices; built once per graph version (recall-spec departure 11).

    The matrices are never modified once built. ``derived`` holds values computed from them on first use and
    kept as long as the adjacency lives (the kernel's stacked rows, see :func:`propagate`; callers may keep
    their own per-adjacency memos there under their own keys).
    """

    normal: sp.csr_array
    inhibit: sp.csr_array
    synthetic_edge_count: int = 0
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

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


class _StackedRows:
    """``normal``'s rows (0..n-1) and ``inhibit``'s rows (n..2n-1) in one CSR layout, so that one gather
    serves both matrices of a propagation step. A copy of both matrices, built on the first :func:`propagate`
    call on an adjacency: 12 bytes per stored entry plus 32 per node (about 12 MB at 100k nodes with the
    bench graphs' ~7 stored entries per node), as much again for each cached masked variant."""

    __slots__ = ("data", "indices", "lengths", "starts")

    def __init__(self, adj: Adjacency) -> None:
        normal, inhibit = adj.normal, adj.inhibit
        indptr = np.concatenate([normal.indptr, inhibit.indptr[1:] + normal.indptr[-1]]).astype(np.int64)
        self.starts = indptr[:-1]
        self.lengths = np.diff(indptr)
        self.indices = np.concatenate([normal.indices, inhibit.indices])
        self.data = np.concatenate([normal.data, inhibit.data]).astype(np.float64, copy=False)


def _stacked_rows(adj: Adjacency) -> _StackedRows:
    rows = adj.derived.get("propagate-stacked-rows")
    if rows is None:
        # Two threads may both build it; either copy is correct.
        rows = adj.derived["propagate-stacked-rows"] = _StackedRows(adj)
    return rows


def _initial_seeds(
    n: int, seed_idx: np.ndarray, seed_energy: np.ndarray, clamp: float, min_energy: float
) -> tuple[np.ndarray, np.ndarray]:
    """Reference step 1: clamp each seed, drop |e| < min_energy, sum per node with a clamp after each add.
    Returns the distinct seed nodes in index order and their energies."""
    e = seed_energy.clip(-clamp, clamp)
    keep = np.abs(e) >= min_energy
    idx, e = seed_idx[keep], e[keep]
    if idx.size == 0:
        return idx, e
    order = idx.argsort(kind="stable")
    idx, e = idx[order], e[order]
    if idx[0] < 0 or idx[-1] >= n:
        raise ValueError(f"The 'seed_idx' indices must be in the range [0, {n}).")
    dup = idx[1:] == idx[:-1]
    if not dup.any():
        return idx, e
    # Seeds are few (vector hits + anchors); only duplicated nodes need the sequential incremental clamp
    # (stable order: each node's values stay in input order).
    first = np.flatnonzero(np.concatenate([[True], ~dup]))
    uniq, values = idx[first], e[first]
    counts = np.diff(np.append(first, idx.size))
    for pos in np.flatnonzero(counts > 1):
        acc = 0.0
        for val in e[first[pos] : first[pos] + counts[pos]]:
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
    hidden: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Spreading activation (reference §3.9 ``propagateActivation``), sparse mat-vec per step.

    ``hidden`` ((n,) bool): nodes that neither receive nor relay energy — the same result, bit for bit, as
    propagating on the adjacency with their rows and columns zeroed and stored zeros dropped (``D·A·D``,
    ``D = diag(~hidden)``; tested), without building that matrix: each step drops the gathered entries of hidden
    rows, hidden columns and zero weight, keeping the others in stored order (the order they are summed in).

    Returns ``(idx, energy)`` sorted by node index: for every node touched (seeds included), the value with
    the largest ``|value|`` over the initial seeds and all steps (negative = inhibited). Defaults: §5.3.
    Cost per step O(n + nnz(active rows)); ``top_k`` bounds the active set. Ties at the top-k cut break by
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
    rows = _stacked_rows(adj)
    if hidden is not None:
        hidden = np.asarray(hidden, dtype=bool)
        if hidden.shape != (n,):
            raise ValueError(f"hidden must have shape ({n},); got {hidden.shape}.")
        if not hidden.any():
            hidden = None
    teleport = alpha > 0.0 and init_idx.size > 0

    result = np.zeros(n, dtype=np.float64)
    touched = np.zeros(n, dtype=bool)
    result[init_idx] = init_val
    touched[init_idx] = True

    normal_factor = decay * (1.0 - alpha)
    inhibit_factor = -decay * inhibit_multiplier
    k = max(0, top_k)
    cur_idx, cur_val = init_idx, init_val
    for _ in range(max_steps):
        m = cur_idx.size
        if m == 0:
            break
        # One gather over the stacked rows: the normal rows of the active nodes (weight = value), then their
        # inhibit rows (weight = |value|), each row in stored order — the order the reference adds them in.
        gather = np.concatenate([cur_idx, cur_idx + n])
        starts = rows.starts[gather]
        lengths = rows.lengths[gather]
        ends = lengths.cumsum()
        total = int(ends[-1])
        split = int(ends[m - 1])
        pos = (starts - ends + lengths).repeat(lengths)
        pos += np.arange(total)
        cols = rows.indices[pos]
        contrib = rows.data[pos]
        contrib *= np.concatenate([cur_val, np.abs(cur_val)]).repeat(lengths)
        contrib[:split] *= normal_factor
        contrib[split:] *= inhibit_factor
        if hidden is not None:
            # What the masked matrix holds of these rows: entries of visible rows to visible columns, non-zero.
            ok = ~hidden[cols]
            ok &= ~np.concatenate([hidden[cur_idx], hidden[cur_idx]]).repeat(lengths)
            ok &= rows.data[pos] != 0
            cols, contrib = cols[ok], contrib[ok]
        # Sum per reached node: a dense bincount over all n nodes (adds in input order, from 0.0, as the
        # reference's map does) and the reached nodes read off a mask, in index order — cheaper than a sort
        # of the few hundred entries a step produces. With teleport the seeds are marked reached too, so
        # the re-injection below finds each of them in ``nxt_idx``.
        reached = np.zeros(n, dtype=bool)
        reached[cols] = True
        if teleport:
            reached[init_idx] = True
        nxt_idx = reached.nonzero()[0]
        nxt_val = np.bincount(cols, weights=contrib, minlength=n)[nxt_idx].clip(-clamp, clamp)
        alive = np.abs(nxt_val) >= min_energy
        if teleport:
            # Step 4: every seed is re-injected — its filtered value (0 when dropped) blended with its initial
            # energy — then re-filtered.
            at = nxt_idx.searchsorted(init_idx)
            blended = np.where(alive[at], nxt_val[at], 0.0)
            blended = ((1.0 - alpha) * blended + alpha * init_val).clip(-clamp, clamp)
            nxt_val[at] = blended
            alive[at] = np.abs(blended) >= min_energy
        nxt_idx, nxt_val = nxt_idx[alive], nxt_val[alive]

        if nxt_idx.size > k:
            # The top_k by |value| desc, ties by node index asc (entries are index-sorted), kept in index
            # order: everything at or above the top_k-th largest |value|; when entries equal to it straddle
            # the cut, only the first of them (the same selection as a stable sort, with a partition instead).
            mag = np.abs(nxt_val)
            if k == 0:
                keep = np.zeros(mag.size, dtype=bool)
            else:
                kth = np.partition(mag, mag.size - k)[mag.size - k]
                keep = mag >= kth
                if np.count_nonzero(keep) > k:
                    keep = mag > kth
                    keep[np.flatnonzero(mag == kth)[: k - int(keep.sum())]] = True
            nxt_idx, nxt_val = nxt_idx[keep], nxt_val[keep]

        stronger = np.abs(nxt_val) > np.abs(result[nxt_idx])
        result[nxt_idx[stronger]] = nxt_val[stronger]
        touched[nxt_idx[stronger]] = True
        cur_idx, cur_val = nxt_idx, nxt_val

    out_idx = touched.nonzero()[0]
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
