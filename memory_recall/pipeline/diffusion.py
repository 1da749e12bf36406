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
    (:func:`diffusion_adjacency`); a visibility mask is applied by zeroing the rows and columns of
    hidden nodes (cached per mask digest), so no hidden node receives energy or relays it. The last
    ranking computed on an adjacency is kept with it (:func:`diffuse`): the cross-recall stage's
    re-diffusion with unchanged seeds reuses it. No Python loop over nodes.
Departures (recall-spec)
    * 2 — hidden nodes never receive energy and never appear in the result (reference §7 item 2: diffusion
      re-introduced them; scenario 38).
    * 11 — adjacency built once per graph version, not per recall (§7 item 25).
    * Temporal link strength 0 means no temporal links (§7 item 13; the reference turns 0 into 0.2).
    * Top-k pruning ties break by node index (the diffusion kernel's documented departure 10).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from memory_recall.pipeline._graph_cache import cached, hidden_mask, mask_digest
from memory_recall.pipeline.kernels.diffusion import Adjacency, propagate, rank
from memory_recall.pipeline.kind_weights import MESSAGE_TYPE_CODE
from memory_recall.pipeline.state import QueryPlan, RecallState, StageResult, StageTrace, timed
from memory_recall.settings import AnchorSettings, DiffusionSettings
from memory_recall.store.snapshot import GraphSnapshot

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


def hub_factors(
    adjacency: sp.csr_matrix | sp.csr_array, threshold: int, exponent: float, counted: np.ndarray | None = None
) -> np.ndarray:
    """Per-node damping ``min(1, threshold / degree) ** exponent`` (degree = distinct neighbours over real
    edges; with ``counted``, a boolean mask, only the neighbours it marks); all ones when ``threshold`` is 0.
    O(n + nnz)."""
    n = adjacency.shape[0]
    if threshold <= 0 or n == 0:
        return np.ones(n)
    csr = sp.csr_array(adjacency)
    if counted is not None:
        # Row sums of the counted neighbours by differences of one prefix sum (exact: 0/1 values), which also holds
        # for empty rows at the end (``np.add.reduceat`` rejects a start offset equal to nnz).
        prefix = np.concatenate(([0.0], np.cumsum(np.asarray(counted, dtype=np.float64)[csr.indices])))
        degree = prefix[csr.indptr[1:]] - prefix[csr.indptr[:-1]]
    else:
        degree = np.diff(csr.indptr).astype(np.float64)
    return np.minimum(1.0, threshold / np.maximum(degree, 1.0)) ** float(exponent)


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


def _build_adjacency(
    snapshot: GraphSnapshot, strength: float, hub_threshold: int = 0, hub_exponent: float = 1.0,
    hub_counts: str = "all",
) -> Adjacency:
    """The kernel's :class:`Adjacency` from the snapshot's CSR matrices plus the temporal links
    (reference §1.3: each unordered prev/next pair once, added to any real edge between the same
    nodes), real edges damped at hubs (``D·A·D``, ``D = diag(hub_factors)``). O(E + T)."""
    n = snapshot.n
    normal = sp.csr_array(snapshot.adjacency.copy(), dtype=np.float64)
    if hub_threshold > 0 and n:
        # hub_counts "message": only message neighbours count, so an extracted graph (no turns) is never damped.
        counted = snapshot.type_code == MESSAGE_TYPE_CODE if hub_counts == "message" else None
        damp = sp.diags_array(hub_factors(normal, hub_threshold, hub_exponent, counted))
        normal = sp.csr_array(damp @ normal @ damp)
    synthetic = 0
    pairs = np.asarray(snapshot.temporal_pairs, dtype=np.int64).reshape(-1, 2)
    if strength > 0 and pairs.size:
        pairs = _unique_pairs(np.sort(pairs, axis=1), n)
        synthetic = int(pairs.shape[0])
        w = np.full(2 * synthetic, min(1.0, strength))
        temporal = sp.csr_array(
            (w, (np.concatenate([pairs[:, 0], pairs[:, 1]]), np.concatenate([pairs[:, 1], pairs[:, 0]]))),
            shape=(n, n),
        )
        normal = sp.csr_array(normal + temporal)
    normal.sum_duplicates()
    normal.sort_indices()
    inhibit = sp.csr_array(snapshot.inhibit.copy(), dtype=np.float64)
    inhibit.sum_duplicates()
    inhibit.sort_indices()
    return Adjacency(normal=normal, inhibit=inhibit, synthetic_edge_count=synthetic)


def _mask_csr(mat: sp.csr_array, keep: np.ndarray) -> sp.csr_array:
    """``D·mat·D`` with ``D = diag(keep)``: entries whose row or column is dropped become structural zeros.
    O(n + nnz), no copy of the structure beyond one array each."""
    n = mat.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(mat.indptr))
    data = mat.data * (keep[rows] & keep[mat.indices])
    out = sp.csr_array((data, mat.indices.copy(), mat.indptr.copy()), shape=mat.shape)
    out.eliminate_zeros()
    return out


def diffusion_adjacency(
    snapshot: GraphSnapshot, settings: DiffusionSettings, hidden: np.ndarray | None = None
) -> tuple[Adjacency, bool]:
    """``(adjacency, was_cached)`` for ``snapshot`` under the temporal-link settings, with the rows/columns of
    ``hidden`` nodes zeroed when a mask is given. Built once per snapshot (and once per distinct mask), then
    served from the per-snapshot cache (recall-spec departure 11)."""
    strength = _temporal_strength(settings)
    hub = (int(settings.hub_degree_threshold), float(settings.hub_exponent), str(settings.hub_degree_counts))
    base, hit = cached(
        snapshot, ("diffusion-adjacency", strength, *hub), lambda: _build_adjacency(snapshot, strength, *hub)
    )
    if hidden is None or not hidden.any():
        return base, hit
    hidden = np.asarray(hidden, dtype=bool)
    # Both diffusions of a recall use the same mask: the last masked variant is remembered on the base (with a
    # copy of its mask, compared in O(n / 8)-ish time instead of hashing the mask again).
    last = base.derived.get("last-masked")
    if last is not None and np.array_equal(last[0], hidden):
        return last[1], True
    keep = ~hidden
    masked, hit = cached(
        snapshot,
        ("diffusion-adjacency-masked", strength, *hub, mask_digest(hidden)),
        lambda: Adjacency(
            _mask_csr(base.normal, keep), _mask_csr(base.inhibit, keep), base.synthetic_edge_count
        ),
    )
    base.derived["last-masked"] = (hidden.copy(), masked)
    return masked, hit


def diffuse(
    snapshot: GraphSnapshot, seeds: Seeds, settings: DiffusionSettings, hidden: np.ndarray | None = None
) -> DiffusionOutcome:
    """Run ``propagateActivation`` + ``diffuseAndRank`` (reference §3.9) from ``seeds`` on the
    cached adjacency; drop archived and hidden nodes from the ranking.

    The ranking depends only on the adjacency (snapshot, temporal-link settings, mask), the seeds and the
    propagation settings; the last one computed on an adjacency is kept with it, so a cross-recall
    re-diffusion whose seeds equal the first pass's (no event or residual seed added) costs a comparison.
    The returned arrays may thus be shared between calls: never modify them."""
    adj, was_cached = diffusion_adjacency(snapshot, settings, hidden)
    params = (
        settings.max_steps, settings.decay, settings.top_k, settings.min_energy, settings.teleport_alpha,
        settings.inhibit_multiplier,
    )
    seed_idx = np.asarray(seeds.index)
    seed_energy = np.asarray(seeds.energy)
    key = (params, seed_idx.dtype.str, seed_idx.tobytes(), seed_energy.dtype.str, seed_energy.tobytes())
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
