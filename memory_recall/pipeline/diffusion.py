"""Diffusion stage: the first PEDSA spreading activation over the memory graph (reference §3.9).

Reads
    ``state.vector_hits`` (index, weighted score), ``state.anchors`` (exact anchors), ``state.bm25_hits``
    (index, normalised BM25 score in [0, 1]), ``state.plan.parts`` (the current-user blend weight),
    ``state.meta["visibility_hidden_mask"]`` (optional (n,) bool mask of nodes the visibility filter removed),
    the snapshot's ``adjacency`` / ``inhibit`` CSR matrices and ``temporal_pairs``.
Writes
    ``state.diffusion = (index, energy)``: nodes with energy > 0, energy desc then node-id byte order
    (``snapshot.id_rank``), never an archived or hidden node. Meta (reference §3.21): ``seedCount`` (distinct
    seeds), ``diffusionHits``, ``temporalSyntheticEdgeCount``, ``teleportAlpha``.
Seeds (deduplicated by the MAX energy per node, first-occurrence order; reference §3.9)
    * every vector hit with its blend-weighted score;
    * every exact anchor with ``AnchorSettings.energy`` (2.0, reference §5.3);
    * every BM25 hit with ``normalised BM25 score × w``, ``w`` = the current-user part's blend weight
      (``plan.parts`` entry of kind ``currentUser``, else the first part, 1 without a plan). recall-spec
      "BM25 channel": its candidates "join the vector candidates as diffusion seeds"; scaling by the
      current-user weight puts a perfect lexical hit on the same footing as a perfect vector hit of
      the current message (vector scores are multiplied by the same weight, reference §3.7), so
      neither channel dominates the other and neither reaches the anchors' 2.0.
    Seeds with energy ≤ 0, archived seeds and hidden seeds are dropped before counting.
Settings
    ``DiffusionSettings``: ``enabled``, ``top_k`` (100), ``max_steps`` (2), ``decay`` (0.6),
    ``teleport_alpha`` (0.15), ``enable_temporal_links``, ``temporal_link_strength`` (0.2),
    ``min_energy`` (0.01), ``inhibit_multiplier`` (2); ``AnchorSettings.energy``. Energy clamp ±2
    (reference §5.3, constant).
Skip reasons
    ``diffusion-disabled`` (switched off by settings: trace only, the state and its ``skip_reasons`` are
    untouched, as the reference lists no reason for it), ``no-seeds`` (no usable seed).
Invariants
    The adjacency is built once per (snapshot, temporal-link strength) and cached on the snapshot
    (:func:`diffusion_adjacency`); a visibility mask is applied by the propagation kernel, exactly as if the
    rows and columns of hidden nodes were zeroed, so no hidden node receives energy or relays it. The last
    ranking computed on an adjacency is kept with it (:func:`diffuse`): the cross-recall stage's
    re-diffusion with unchanged seeds reuses it. After an appended-only delta (a new message) the adjacency is
    derived from the parent structure's instead of built: only the rows the delta changed are computed (as the
    build computes them) and spliced into the parent's matrices, equal to a build array by array
    (:func:`_updated_adjacency`). No Python loop over nodes.
Departures (recall-spec)
    * 2 — hidden nodes never receive energy and never appear in the result (reference §7 item 2: diffusion
      re-introduced them; scenario 38).
    * 11 — adjacency built once per graph version, not per recall (§7 item 25).
    * Temporal link strength 0 means no temporal links (§7 item 13; the reference turns 0 into 0.2).
    * Top-k pruning ties break by node index (the diffusion kernel's documented departure 10).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from memory_recall.pipeline._graph_cache import cached, hidden_mask
from memory_recall.pipeline.kernels.diffusion import Adjacency, propagate, rank
from memory_recall.pipeline.kind_weights import MESSAGE_TYPE_CODE
from memory_recall.pipeline.state import QueryPlan, RecallState, StageResult, StageTrace, timed
from memory_recall.settings import AnchorSettings, DiffusionSettings
from memory_recall.store.csr import assembled, kept_entries, rows_of, spliced_rows
from memory_recall.store.snapshot import GraphSnapshot

if TYPE_CHECKING:
    from memory_recall.store.snapshot import StructureChange

__all__ = [
    "ENERGY_CLAMP",
    "DiffusionOutcome",
    "DiffusionStage",
    "Seeds",
    "collect_seeds",
    "current_user_weight",
    "diffuse",
    "diffusion_adjacency",
    "hub_factors",
]

#: Energy clamp of ``propagateActivation`` (reference §3.9, §5.3).
ENERGY_CLAMP = 2.0

_SCORE_KIND = "diffusion_energy"


@dataclass(frozen=True)
class Seeds:
    """Deduplicated diffusion seeds (first-occurrence order) and how many raw seeds each source gave."""

    index: np.ndarray
    energy: np.ndarray
    sources: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])


@dataclass(frozen=True)
class DiffusionOutcome:
    """Ranked positive energies of one diffusion run plus its diagnostics."""

    index: np.ndarray
    energy: np.ndarray
    synthetic_edge_count: int
    adjacency_cached: bool


def current_user_weight(plan: QueryPlan) -> float:
    """Blend weight of the current-user part (reference §3.5): the part of kind ``currentUser``,
    else the first part, 1.0 without a plan."""
    for part in plan.parts:
        if part.kind == "currentUser":
            return float(part.weight)
    return float(plan.parts[0].weight) if plan.parts else 1.0


class _FromState:
    """Marker default of :func:`collect_seeds`'s ``hidden``: read the mask off the state."""


_FROM_STATE = _FromState()


def collect_seeds(
    state: RecallState,
    anchor_energy: float,
    extra: tuple[tuple[str, np.ndarray, np.ndarray], ...] = (),
    *,
    hidden: np.ndarray | None | _FromState = _FROM_STATE,
) -> Seeds:
    """Seeds of reference §3.9 (vector hits, exact anchors) plus BM25 hits and ``extra`` ``(name,
    idx, energy)`` groups, deduplicated by the maximum energy per node in first-occurrence order.
    Seeds that are out of range, non-finite, ≤ 0, archived or hidden by the visibility filter are
    dropped (recall-spec departure 2). ``hidden`` is :func:`hidden_mask` of ``state``, for a caller that
    already has it."""
    snap = state.snapshot
    n = snap.n
    vec_idx, vec_score, _ = state.vector_hits
    anchor_idx = np.array([i for i, _ in state.anchors], dtype=np.int64)
    bm25_idx, bm25_score = state.bm25_hits
    groups: list[tuple[str, np.ndarray, np.ndarray]] = [
        ("vector", np.asarray(vec_idx, dtype=np.int64), np.asarray(vec_score, dtype=np.float64)),
        ("anchor", anchor_idx, np.full(anchor_idx.size, float(anchor_energy))),
        (
            "bm25",
            np.asarray(bm25_idx, dtype=np.int64),
            np.asarray(bm25_score, dtype=np.float64) * current_user_weight(state.plan),
        ),
        *extra,
    ]
    sources = {name: int(np.asarray(idx).size) for name, idx, _ in groups}
    idx = np.concatenate([np.asarray(g[1], dtype=np.int64).reshape(-1) for g in groups])
    energy = np.concatenate([np.asarray(g[2], dtype=np.float64).reshape(-1) for g in groups])
    ok = np.isfinite(energy) & (energy > 0)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        ok &= (idx >= 0) & (idx < n)
    idx, energy = idx[ok], energy[ok]
    dropped = snap.archived[idx]
    if isinstance(hidden, _FromState):
        hidden = hidden_mask(state)
    if hidden is not None:
        dropped |= hidden[idx]
    idx, energy = idx[~dropped], energy[~dropped]
    if idx.size == 0:
        return Seeds(np.zeros(0, dtype=np.int64), np.zeros(0), sources)
    # Group equal nodes with a stable sort (each group's first entry is the node's first occurrence), take the
    # maximum per group, then put the groups back in first-occurrence order.
    order = idx.argsort(kind="stable")
    sorted_idx = idx[order]
    head = np.empty(idx.size, dtype=bool)
    head[0] = True
    np.not_equal(sorted_idx[1:], sorted_idx[:-1], out=head[1:])
    if head.all():
        return Seeds(idx, energy, sources)
    starts = head.nonzero()[0]
    best = np.maximum.reduceat(energy[order], starts)
    by_first = order[starts].argsort()
    return Seeds(sorted_idx[starts][by_first], best[by_first], sources)


def _temporal_strength(settings: DiffusionSettings) -> float:
    # Departure (§7 item 13): a strength of 0 means no links; the reference's `|| 0.2` is not reproduced.
    return float(settings.temporal_link_strength) if settings.enable_temporal_links else 0.0


def _hub_degree(csr: sp.csr_array, counted: np.ndarray | None) -> np.ndarray:
    """(rows,) float64 degree of each row of ``csr``: its stored entries, or with ``counted`` (an (n,) boolean mask
    of the columns) only those it marks. Exact integers, whatever rows the matrix holds (a row's degree does not
    depend on the other rows)."""
    if counted is None:
        return np.diff(csr.indptr).astype(np.float64)
    # Row sums of the counted neighbours by differences of one prefix sum (exact: 0/1 values), which also holds
    # for empty rows at the end (``np.add.reduceat`` rejects a start offset equal to nnz).
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(counted, dtype=np.float64)[csr.indices])))
    return prefix[csr.indptr[1:]] - prefix[csr.indptr[:-1]]


def _damping(degree: np.ndarray, threshold: int, exponent: float) -> np.ndarray:
    """``min(1, threshold / degree) ** exponent`` per node (elementwise: a subset gives the same values)."""
    return np.minimum(1.0, threshold / np.maximum(degree, 1.0)) ** float(exponent)


def hub_factors(
    adjacency: sp.csr_matrix | sp.csr_array, threshold: int, exponent: float, counted: np.ndarray | None = None
) -> np.ndarray:
    """Per-node damping ``min(1, threshold / degree) ** exponent`` (degree = distinct neighbours over real
    edges; with ``counted``, a boolean mask, only the neighbours it marks); all ones when ``threshold`` is 0.
    O(n + nnz)."""
    n = adjacency.shape[0]
    if threshold <= 0 or n == 0:
        return np.ones(n)
    return _damping(_hub_degree(sp.csr_array(adjacency), counted), threshold, exponent)


def _unique_pairs(pairs: np.ndarray, n: int) -> np.ndarray:
    """``np.unique(pairs, axis=0)`` of (P, 2) int64 pairs: sorted by first then second column, no repeats. Pairs
    of node indices in ``[0, n)`` are deduplicated as one int64 key each (``first·n + second``, the same order):
    a 1-D unique is several times cheaper than the row-wise one."""
    if pairs.size == 0 or n == 0 or pairs.min() < 0 or pairs.max() >= n or n > 3_000_000_000:
        return np.unique(pairs, axis=0)
    keys = np.sort(pairs[:, 0] * n + pairs[:, 1])
    keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    first, second = np.divmod(keys, n)
    return np.stack([first, second], axis=1)


#: Temporal pair keys of :class:`_Provenance`: ``low · 2**32 + high`` (independent of n, so a parent's keys compare
#: with a child's; updates need n < 2**31).
_PAIR_SHIFT = 32
_PAIR_LOW = (1 << _PAIR_SHIFT) - 1
_MAX_UPDATE_N = 1 << 31

#: ``Adjacency.derived`` keys of this module: what an update needs of the snapshot the adjacency was derived from
#: (:class:`_Provenance`), and the rows an update replaced.
_PROVENANCE = "diffusion-provenance"
_UPDATED_FROM = "diffusion-updated-from"

#: An update replacing more rows than this share of the graph (and more than the minimum) builds instead: the build
#: is then as cheap.
_MAX_UPDATE_SHARE = 0.25
_MIN_UPDATE_ROWS = 256


def _too_many(rows: int, n: int) -> bool:
    return rows > max(_MIN_UPDATE_ROWS, _MAX_UPDATE_SHARE * 2 * n)


@dataclass(frozen=True, eq=False)
class _Provenance:
    """What :func:`_updated_adjacency` needs of the snapshot a base adjacency was derived from: its node count,
    its active edge count (an appended-only delta appends edges after them), the temporal pairs the build added
    (sorted unique keys, empty when none were added), and with hub damping the counted-neighbour mask (``None``
    for "all") and the per-node factors. Arrays shared, never modified."""

    n: int
    edges: int
    pair_keys: np.ndarray
    counted: np.ndarray | None
    factors: np.ndarray | None


def _pair_keys(pairs: np.ndarray) -> np.ndarray:
    """Sorted unique keys ``low · 2**32 + high`` of (P, 2) pairs sorted within each row (``low <= high``)."""
    return np.unique((pairs[:, 0] << _PAIR_SHIFT) | pairs[:, 1])


def _temporal_keys(snapshot: GraphSnapshot) -> np.ndarray:
    """:func:`_pair_keys` of the snapshot's temporal pairs as the build deduplicates them (each unordered pair
    once). O(t) when the pairs are already sorted and unique with ``low < high`` (as the snapshot keeps them),
    else a sort."""
    pairs = np.asarray(snapshot.temporal_pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.size == 0:
        return np.zeros(0, dtype=np.int64)
    keys = (pairs[:, 0] << _PAIR_SHIFT) | pairs[:, 1]
    if bool((pairs[:, 0] < pairs[:, 1]).all()) and bool((keys[1:] > keys[:-1]).all()):
        return keys
    return _pair_keys(np.sort(pairs, axis=1))


def _sorted_xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.setxor1d`` of two sorted unique arrays: their common prefix and suffix are skipped by an O(len)
    comparison in C, only the windows between are compared as sets (a pair added or dropped here and there: a few
    elements)."""
    m = min(a.size, b.size)
    differ = a[:m] != b[:m]
    head = int(np.argmax(differ)) if differ.any() else m  # equal leading elements
    rest = m - head
    differ = a[a.size - rest :] != b[b.size - rest :]
    tail = int(np.argmax(differ[::-1])) if differ.any() else rest  # equal trailing elements (within the rest)
    return np.setxor1d(a[head : a.size - tail], b[head : b.size - tail], assume_unique=True)


def _temporal_rows(
    keys: np.ndarray, rows: np.ndarray, local: np.ndarray, k: int, n: int, strength: float
) -> sp.csr_array:
    """Rows ``rows`` (sorted; their positions ``local`` among the ``k`` output rows) of the symmetric
    temporal matrix of the pair ``keys``: each pair gives its ``(low, high)`` and ``(high, low)`` entries of
    ``min(1, strength)``, summed like the build's (a ``low == high`` pair twice)."""
    if rows.size == 0:
        return sp.csr_array((k, n), dtype=np.float64)
    low, high = keys >> _PAIR_SHIFT, keys & _PAIR_LOW
    # The pairs with an end among ``rows`` by an (n,) byte mask (a gather per pair), then the ends' positions among
    # the sorted ``rows`` by a search over those few pairs only.
    held = np.zeros(n, dtype=bool)
    held[rows] = True
    lo_in, hi_in = held[low], held[high]
    r = np.concatenate([local[np.searchsorted(rows, low[lo_in])], local[np.searchsorted(rows, high[hi_in])]])
    c = np.concatenate([high[lo_in], low[hi_in]])
    return _temporal_matrix(r, c, k, n, strength)


def _temporal_matrix(r: np.ndarray, c: np.ndarray, k: int, n: int, strength: float) -> sp.csr_array:
    """The ``(k, n)`` matrix of the temporal entries ``(r[i], c[i])``, each ``min(1, strength)``, for the build and
    an update alike, so their index dtypes agree (int32 while the indices fit: the normal matrix it is added to
    keeps the adjacency's int32 then, half the bytes an update copies): rows in order, columns sorted within a
    row, a pair ``low == high`` giving its entry twice, as the build holds it. Straight to CSR: scipy's COO route
    cost more than the rest of an update of a few rows."""
    r, c = np.asarray(r, dtype=np.int64), np.asarray(c, dtype=np.int64)
    order = np.lexsort((c, r))
    index = np.int32 if max(n, r.size) <= np.iinfo(np.int32).max else np.int64
    indptr = np.zeros(k + 1, dtype=index)
    np.cumsum(np.bincount(r, minlength=k), out=indptr[1:])
    return assembled(sp.csr_array, (k, n), np.full(r.size, min(1.0, strength)), c[order].astype(index), indptr)


def _scaled(m: sp.csr_array, left: np.ndarray, right: np.ndarray) -> sp.csr_array | None:
    """``diag(left) · m · diag(right)`` entry by entry when every row of ``m`` is sorted without repeats (``None``
    otherwise): each stored ``a_ij`` becomes ``(left_i · a_ij) · right_j`` and zeros drop, the very values of
    scipy's two sparse products (each of their entries is that one product, nothing summed), without their passes
    over all n columns, which an update of a few rows paid on every event. Canonical, ``m``'s dtypes."""
    indptr, indices = m.indptr, m.indices
    nnz = int(indptr[-1])
    ends = indptr[1:-1]
    if nnz > 1:
        rising = indices[1:nnz] > indices[: nnz - 1]
        inner = ends[(ends > 0) & (ends < nnz)]
        rising[inner - 1] = True  # a row may start below where the previous one ended
        if not bool(rising.all()):
            return None
    counts = np.diff(indptr)
    row_factor = np.repeat(np.asarray(left, dtype=np.float64), counts)
    col_factor = np.asarray(right, dtype=np.float64)[indices[:nnz]]
    data = row_factor * m.data[:nnz] * col_factor
    # The products drop a zero entry, and a row or column whose factor is zero as a whole.
    keep = (data != 0) & (row_factor != 0) & (col_factor != 0)
    if bool(keep.all()):
        out = assembled(sp.csr_array, m.shape, data, indices[:nnz].copy(), indptr.copy())
    else:
        kept = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
        out = assembled(sp.csr_array, m.shape, data[keep], indices[:nnz][keep], kept[indptr].astype(indptr.dtype))
    out.has_canonical_format = True
    return out


def _normal_rows(
    adjacency: sp.csr_array, left: np.ndarray | None, right: np.ndarray | None, temporal: sp.csr_array | None
) -> sp.csr_array:
    """The diffusion's normal matrix from (some rows of) the snapshot's adjacency: real edges damped at hubs
    (``diag(left) · A · diag(right)``, ``left`` the factors of the rows held, ``right`` of every node) when
    ``left`` is given, plus ``temporal`` (the same rows of the temporal matrix) when given, canonical. Each
    output row depends only on the same input row (sparse products and sums are computed row by row), so the
    rows of a full build equal this on those rows alone: builds and updates share it."""
    normal = adjacency
    if left is not None and right is not None:
        scaled = _scaled(normal, left, right)
        normal = scaled if scaled is not None else sp.csr_array(sp.diags_array(left) @ normal @ sp.diags_array(right))
    if temporal is not None:
        normal = sp.csr_array(normal + temporal)
    normal.sum_duplicates()
    normal.sort_indices()
    return normal


def _build_adjacency(
    snapshot: GraphSnapshot, strength: float, hub_threshold: int = 0, hub_exponent: float = 1.0,
    hub_counts: str = "all",
) -> Adjacency:
    """The kernel's :class:`Adjacency` from the snapshot's CSR matrices plus the temporal links
    (reference §1.3: each unordered prev/next pair once, added to any real edge between the same
    nodes), real edges damped at hubs (``D·A·D``, ``D = diag(hub_factors)``). O(E + T). Its ``derived`` holds
    the :class:`_Provenance` an update from it needs."""
    n = snapshot.n
    normal = sp.csr_array(snapshot.adjacency.copy(), dtype=np.float64)
    counted: np.ndarray | None = None
    factors: np.ndarray | None = None
    if hub_threshold > 0 and n:
        # hub_counts "message": only message neighbours count, so an extracted graph (no turns) is never damped.
        counted = snapshot.type_code == MESSAGE_TYPE_CODE if hub_counts == "message" else None
        factors = hub_factors(normal, hub_threshold, hub_exponent, counted)
    synthetic = 0
    temporal: sp.csr_array | None = None
    keys = np.zeros(0, dtype=np.int64)
    pairs = np.asarray(snapshot.temporal_pairs, dtype=np.int64).reshape(-1, 2)
    if strength > 0 and pairs.size:
        pairs = _unique_pairs(np.sort(pairs, axis=1), n)
        synthetic = int(pairs.shape[0])
        temporal = _temporal_matrix(
            np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([pairs[:, 1], pairs[:, 0]]), n, n, strength
        )
        if n < _MAX_UPDATE_N:
            keys = (pairs[:, 0] << _PAIR_SHIFT) | pairs[:, 1]  # sorted and unique already
    normal = _normal_rows(normal, factors, factors, temporal)
    inhibit = sp.csr_array(snapshot.inhibit.copy(), dtype=np.float64)
    inhibit.sum_duplicates()
    inhibit.sort_indices()
    adj = Adjacency(normal=normal, inhibit=inhibit, synthetic_edge_count=synthetic)
    adj.derived[_PROVENANCE] = _Provenance(n, int(snapshot.edge_src.size), keys, counted, factors)
    return adj


def _union(*parts: np.ndarray) -> np.ndarray:
    """Sorted unique int64 union of index arrays."""
    return np.unique(np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]))


def _neighbours(mat: sp.csr_array | sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    """Columns stored in the ``rows`` of ``mat`` (a symmetric matrix: the nodes linked to them)."""
    if rows.size == 0:
        return rows
    indptr, indices = mat.indptr, mat.indices
    if rows.size == 1:
        r = int(rows[0])
        return indices[indptr[r] : indptr[r + 1]].astype(np.int64)
    return np.asarray(rows_of(mat, rows).indices, dtype=np.int64)


def _spliced(old: sp.csr_array, rows: np.ndarray, sub: sp.csr_array, n: int) -> sp.csr_array | None:
    """``old`` (canonical, n_old × n_old) grown to n × n, with its rows at ``rows`` (sorted unique, appended rows
    included when they hold entries) replaced by the rows of ``sub`` (one per entry of ``rows``, in that order;
    canonical): the untouched runs of rows are copied in C, O(len(rows)) Python. ``None`` when the index dtypes
    differ or the result would not fit them (build then). No row changed: ``old`` itself (never modified)."""
    dtype = old.indices.dtype
    n_old = old.shape[0]
    if rows.size == 0 and n == n_old:  # a change no row of this matrix depends on (the vectors of a turn)
        return old
    # A ``sub`` without entries (rows emptied, or none) has the index dtype scipy picks for an empty matrix.
    if old.indptr.dtype != dtype or (
            int(sub.indptr[-1]) and (sub.indices.dtype != dtype or sub.indptr.dtype != dtype)):
        return None
    if rows.size == 0 or rows[0] >= n_old:
        # Only appended rows (a new message linked to new nodes only): the old rows, then the new ones.
        nnz = int(old.indptr[-1])
        if nnz + int(sub.indptr[-1]) > np.iinfo(dtype).max:
            return None
        lengths = np.zeros(n - n_old, dtype=np.int64)
        lengths[rows - n_old] = np.diff(sub.indptr)
        tail = nnz + np.cumsum(lengths)
        parts = (
            np.concatenate([old.data[:nnz], sub.data]), np.concatenate([old.indices[:nnz], sub.indices]),
            np.concatenate([old.indptr, tail.astype(dtype)]),
        )
    else:
        spliced = spliced_rows(old, rows, sub, n)
        if spliced is None:
            return None
        parts = spliced
    data, indices, indptr = parts
    if indices.dtype != dtype or indptr.dtype != dtype or data.dtype != old.data.dtype:
        return None
    out = assembled(sp.csr_array, (n, n), data, indices, indptr)
    out.has_canonical_format = True  # every row is canonical, from one canonical matrix or the other
    return out


def _kept_adjacency(parent: Adjacency, change: StructureChange) -> tuple[Adjacency, np.ndarray] | None:
    """For a change that deleted nodes (``change.kept``): ``parent`` on the kept rows and columns, with its
    provenance moved to them, and the rows it may hold wrongly (kept nodes one of whose active edges or temporal
    links went). Those rows are what the update for ``change.via`` must derive again, beside its own: every other
    row equals the kept graph's build. ``None`` when the parent has no provenance."""
    prov = parent.derived.get(_PROVENANCE)
    take, remap = change.kept, change.remap
    if prov is None or take is None or change.touched is None or change.edges_kept is None or prov.n != parent.n:
        return None
    k = int(take.size)
    keys = prov.pair_keys
    if keys.size:
        lo, hi = remap[keys >> _PAIR_SHIFT], remap[keys & _PAIR_LOW]
        both = (lo >= 0) & (hi >= 0)
        one = lo[(lo >= 0) & (hi < 0)], hi[(hi >= 0) & (lo < 0)]
        keys = (lo[both] << _PAIR_SHIFT) | hi[both]  # a monotone move keeps them sorted
        redo = _union(change.touched, *one)
    else:
        redo = change.touched
    normal = kept_entries(parent.normal, take, remap, k)
    inhibit = kept_entries(parent.inhibit, take, remap, k)
    adj = Adjacency(normal=normal, inhibit=inhibit, synthetic_edge_count=int(keys.size))
    adj.derived[_PROVENANCE] = _Provenance(
        k, change.edges_kept, keys, None if prov.counted is None else prov.counted[take],
        None if prov.factors is None else prov.factors[take],
    )
    return adj, redo


def _updated_adjacency(
    parent: Adjacency, change: StructureChange, snapshot: GraphSnapshot, strength: float, hub_threshold: int,
    hub_exponent: float, hub_counts: str, redo: np.ndarray | None = None,
) -> Adjacency | None:
    """:func:`_build_adjacency` of ``snapshot`` derived from ``parent`` (the parent structure's value) after an
    appended-only delta (``None`` otherwise: build then). Old rows keep their entries, old edges theirs, so the only
    rows that change are those of the endpoints of the appended edges, of the temporal pairs added or dropped, of
    the appended nodes, and with hub damping of the nodes whose factor changed and their neighbours: these are
    computed as the build computes them (:func:`_normal_rows` on those rows alone) and spliced into the parent's
    matrices. O(nnz) in C (one copy of the data), O(changed rows) in Python. After a change that deleted nodes,
    the parent's value on the kept rows (:func:`_kept_adjacency`), then this update for the rest, with the rows
    the deletion touched (``redo``) derived again too."""
    if change.via is not None and redo is None:
        kept = _kept_adjacency(parent, change)
        if kept is None:
            return None
        return _updated_adjacency(kept[0], change.via, snapshot, strength, hub_threshold, hub_exponent, hub_counts,
                                  kept[1])
    prov = parent.derived.get(_PROVENANCE)
    n, n_old = snapshot.n, change.n_old
    if (
        prov is None or not change.appended_only or change.appended != n_old or prov.n != n_old
        or change.n_new != n or n >= _MAX_UPDATE_N or parent.n != n_old
    ):
        return None
    e_old = prov.edges
    if snapshot.edge_src.size < e_old:
        return None
    appended = np.arange(n_old, n, dtype=np.int64)
    src, dst = snapshot.edge_src[e_old:].astype(np.int64), snapshot.edge_dst[e_old:].astype(np.int64)
    inh = np.asarray(snapshot.edge_inhibit[e_old:], dtype=bool)
    extra = np.zeros(0, dtype=np.int64) if redo is None else redo
    changed_normal = _union(src[~inh], dst[~inh], appended, extra)
    changed_inhibit = _union(src[inh], dst[inh], appended, extra)

    keys = np.zeros(0, dtype=np.int64)
    if strength > 0:
        keys = _temporal_keys(snapshot)
        if (keys.size > 0) != (prov.pair_keys.size > 0):
            return None  # the build adds (or stops adding) the temporal matrix: zero entries drop (or stay) anywhere
        moved = _sorted_xor(prov.pair_keys, keys)
        changed_normal = _union(changed_normal, moved >> _PAIR_SHIFT, moved & _PAIR_LOW)
    elif prov.pair_keys.size:
        return None

    adjacency = snapshot.adjacency
    factors: np.ndarray | None = None
    counted: np.ndarray | None = None
    if hub_threshold > 0:
        if prov.factors is None or (hub_counts == "message") != (prov.counted is not None):
            return None
        # A node's degree changes with its edges, or (counting messages only) when a neighbour's type changes.
        candidates = changed_normal
        if hub_counts == "message":
            counted = snapshot.type_code == MESSAGE_TYPE_CODE
            retyped = np.flatnonzero(counted[:n_old] != prov.counted)
            candidates = _union(candidates, retyped, _neighbours(adjacency, retyped))
        rows = sp.csr_array(rows_of(adjacency, candidates), dtype=np.float64)
        damp = _damping(_hub_degree(rows, counted), hub_threshold, hub_exponent)
        factors = np.concatenate([prov.factors, np.ones(n - n_old)])
        before = factors[candidates]
        factors[candidates] = damp
        # Appended rows are replaced anyway; an old row whose factor changed changes its neighbours' rows too.
        moved_f = candidates[damp != before]
        changed_normal = _union(changed_normal, moved_f, _neighbours(adjacency, moved_f))

    if _too_many(changed_normal.size + changed_inhibit.size, n):
        return None
    k = changed_normal.size
    temporal = _temporal_rows(keys, changed_normal, np.arange(k), k, n, strength) if keys.size else None
    normal_rows = _normal_rows(
        sp.csr_array(rows_of(adjacency, changed_normal), dtype=np.float64),
        None if factors is None else factors[changed_normal], factors, temporal,
    )
    inhibit_rows = sp.csr_array(rows_of(snapshot.inhibit, changed_inhibit), dtype=np.float64)
    inhibit_rows.sum_duplicates()
    inhibit_rows.sort_indices()
    normal = _spliced(parent.normal, changed_normal, normal_rows, n)
    inhibit = _spliced(parent.inhibit, changed_inhibit, inhibit_rows, n)
    if normal is None or inhibit is None:
        return None
    adj = Adjacency(normal=normal, inhibit=inhibit, synthetic_edge_count=int(keys.size))
    adj.derived[_PROVENANCE] = _Provenance(n, int(snapshot.edge_src.size), keys, counted, factors)
    adj.derived[_UPDATED_FROM] = (changed_normal, changed_inhibit)  # which rows the update replaced (tests)
    return adj


def diffusion_adjacency(snapshot: GraphSnapshot, settings: DiffusionSettings) -> tuple[Adjacency, bool]:
    """``(adjacency, was_cached)`` for ``snapshot`` under the temporal-link settings. Built once per snapshot
    structure, then served from the per-structure cache (recall-spec departure 11); after an appended-only delta it
    is derived from the parent structure's (:func:`_updated_adjacency`), equal to a build. A visibility mask is not
    part of it: :func:`diffuse` hands the mask to the kernel (one adjacency serves every mask)."""
    strength = _temporal_strength(settings)
    hub = (int(settings.hub_degree_threshold), float(settings.hub_exponent), str(settings.hub_degree_counts))
    return cached(
        snapshot, ("diffusion-adjacency", strength, *hub), lambda: _build_adjacency(snapshot, strength, *hub),
        lambda parent, change: _updated_adjacency(parent, change, snapshot, strength, *hub),
        recipe=functools.partial(diffusion_adjacency, settings=settings),
    )


def diffuse(
    snapshot: GraphSnapshot, seeds: Seeds, settings: DiffusionSettings, hidden: np.ndarray | None = None
) -> DiffusionOutcome:
    """Run ``propagateActivation`` + ``diffuseAndRank`` (reference §3.9) from ``seeds`` on the
    cached adjacency; drop archived and hidden nodes from the ranking.

    The ranking depends only on the adjacency (snapshot, temporal-link settings, mask), the seeds and the
    propagation settings; the last one computed on an adjacency is kept with it, so a cross-recall
    re-diffusion whose seeds equal the first pass's (no event or residual seed added) costs a comparison.
    The returned arrays may thus be shared between calls: never modify them."""
    adj, was_cached = diffusion_adjacency(snapshot, settings)
    if hidden is not None and not hidden.any():
        hidden = None
    params = (
        settings.max_steps, settings.decay, settings.top_k, settings.min_energy, settings.teleport_alpha,
        settings.inhibit_multiplier,
    )
    seed_idx = np.asarray(seeds.index)
    seed_energy = np.asarray(seeds.energy)
    mask = b"" if hidden is None else np.packbits(np.asarray(hidden, dtype=bool)).tobytes()
    key = (params, seed_idx.dtype.str, seed_idx.tobytes(), seed_energy.dtype.str, seed_energy.tobytes(), mask)
    last = adj.derived.get("last-diffusion")
    if last is not None and last[0] == key:
        return DiffusionOutcome(last[1], last[2], adj.synthetic_edge_count, was_cached)
    idx, energy = propagate(
        adj,
        seed_idx,
        seed_energy,
        max_steps=settings.max_steps,
        decay=settings.decay,
        top_k=settings.top_k,
        min_energy=settings.min_energy,
        clamp=ENERGY_CLAMP,
        teleport_alpha=settings.teleport_alpha,
        inhibit_multiplier=settings.inhibit_multiplier,
        hidden=hidden,
    )
    r_idx, r_energy = rank(idx, energy, snapshot.id_rank)
    keep = ~snapshot.archived[r_idx]
    if hidden is not None:
        keep &= ~hidden[r_idx]
    out_idx, out_energy = r_idx[keep], r_energy[keep]
    out_idx.flags.writeable = out_energy.flags.writeable = False  # shared with later calls (above)
    adj.derived["last-diffusion"] = (key, out_idx, out_energy)
    return DiffusionOutcome(out_idx, out_energy, adj.synthetic_edge_count, was_cached)


class DiffusionStage:
    """First spreading activation (reference §3.9); see the module docstring for the contract.

    Usage: ``DiffusionStage(settings.diffusion, settings.anchors).run(state)``.
    """

    name = "diffusion"

    def __init__(self, settings: DiffusionSettings, anchors: AnchorSettings | None = None) -> None:
        self.settings = settings
        self.anchors = anchors

    def run(self, state: RecallState) -> StageResult:
        with timed() as elapsed:
            new_state, fields = self._run(state)
        return StageResult(new_state, StageTrace(name=self.name, elapsed_ms=elapsed[0], **fields))

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        base: dict[str, Any] = {"score_kind": _SCORE_KIND, "score_direction": "higher_is_better"}
        if not self.settings.enabled:
            return self._skip(state, "diffusion-disabled", base, 0)
        anchor_energy = (self.anchors or AnchorSettings()).energy
        hidden = hidden_mask(state)
        seeds = collect_seeds(state, anchor_energy, hidden=hidden)
        if len(seeds) == 0:
            return self._skip(state, "no-seeds", base, 0, seedSources=seeds.sources)
        out = diffuse(state.snapshot, seeds, self.settings, hidden)
        meta = state.with_meta(
            seedCount=len(seeds),
            diffusionHits=int(out.index.size),
            temporalSyntheticEdgeCount=out.synthetic_edge_count,
            teleportAlpha=float(self.settings.teleport_alpha),
        )
        new_state = state.evolve(diffusion=(out.index, out.energy), meta=meta)
        notes = {
            "seedSources": seeds.sources,
            "adjacencyCached": out.adjacency_cached,
            "hiddenNodes": 0 if hidden is None else int(hidden.sum()),
        }
        return new_state, {**base, "count_in": len(seeds), "count_out": int(out.index.size), "notes": notes}

    @staticmethod
    def _skip(
        state: RecallState, reason: str, base: dict[str, Any], count_in: int, **notes: Any
    ) -> tuple[RecallState, dict[str, Any]]:
        # Switched off by settings: trace only (the reference lists no skip reason for it).
        if reason == "diffusion-disabled":
            new_state = state
        else:
            new_state = state.evolve(skip_reasons=state.with_skip(reason))
        return new_state, {
            **base,
            "count_in": count_in,
            "count_out": 0,
            "skipped": True,
            "skip_reason": reason,
            "notes": notes,
        }
