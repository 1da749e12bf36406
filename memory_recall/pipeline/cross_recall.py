"""Cross-recall stage: supplemental anchors, cross-recall re-diffusion and the score map (reference §3.10).

Runs after diffusion and residual, before co-occurrence and scoring.

Reads
    ``state.vector_hits`` (index, weighted score, raw cosine), ``state.anchors``, ``state.bm25_hits``
    (normalised), ``state.diffusion`` (first pass), ``state.residual_hits`` and
    ``state.meta["residualTriggered"]``, ``state.plan`` (current-user weight of the BM25 seeds),
    ``state.active``, ``state.meta["visibility_hidden_mask"]``, the snapshot's incident-edge CSR
    and edge arrays.
Writes
    * ``state.supplemental_anchors``: up to ``supplemental_anchors`` (5) vector-hit nodes, in
      vector order, that are co-occurrence-eligible (non-archived, type not
      event/synopsis/reflection, has an anchor term), visible and not exact anchors (used only by
      co-occurrence, reference §3.11).
    * ``state.diffusion`` replaced by the re-diffusion when diffusion is on and (cross recall is on
      or residual recall triggered). Seeds (max-deduplicated): vector hits (weighted score), exact anchors
      (``AnchorSettings.energy``, 2.0), BM25 hits (normalised score × current-user weight, as in the diffusion
      stage), residual hits (cosine) and — with cross recall on — for every exact anchor each active incident
      edge whose other endpoint is a non-archived, visible **event**: ``event_energy_factor ×
      strength`` (1.5 ×). Meta ``seedCount``, ``diffusionHits``, ``temporalSyntheticEdgeCount``,
      ``teleportAlpha`` are overwritten.
    * ``state.candidates`` (the score map): insertion order = vector hits (their order), then diffusion-only
      nodes (diffusion rank order), then BM25-only nodes (BM25 order); ``vector_score`` = weighted
      vector score, ``vector_raw`` = raw cosine, ``graph_score`` = diffusion energy (0 when not
      reached), ``bm25_score`` = normalised BM25 score, ``cooccurrence_boost`` = 0. Only active,
      visible nodes enter.
    * Meta ``scoreMapFallback``: ``""``, ``"whole-active-set"`` or ``"importance-recency"`` (this
      project's key).
Empty score map (no vector hit, no diffusion result, no BM25 hit)
    The reference adds every active node with zero scores (§3.10) — the no-vector path then scores the whole
    graph lexically (§7 item 24). Here: up to ``whole_set_fallback_max_nodes`` (2,000) active
    visible nodes the reference behaviour is kept (graph order; scenarios 25, 32, 33 "nobody", 34
    rely on it). Above it only the top ``selection.top_k × 3`` active visible nodes by importance
    desc, then recency (``seqRange[1]``) desc, then node id enter. Why this is honest: the BM25
    channel indexes every node with the same tokenizer as the lexical score, so when it found
    nothing, every remaining node's lexical score is (all but) 0 and the hybrid score reduces to
    importance × time decay × bucket weights; importance then recency is the cheap proxy for that.
    Known gap: a low-importance node of a high-priority scope/time bucket can be missed on such graphs.
Settings
    ``CrossRecallSettings``: ``enabled`` (app True / fallback False), ``event_energy_factor`` (1.5),
    ``supplemental_anchors`` (5), ``whole_set_fallback_max_nodes`` (2,000); ``DiffusionSettings``
    (re-diffusion parameters, ``enabled``); ``AnchorSettings.energy``; ``SelectionSettings.top_k``
    (fallback size).
Skip reasons
    ``no-active-nodes`` (nothing can become a candidate).
Departures (recall-spec)
    * 2 — hidden and inactive nodes never enter the score map, never seed (as event or residual seeds) and
      receive no energy (reference §7 item 2: the score map never checked membership).
    * 11 — the no-vector fallback is bounded on large graphs (above); adjacency comes from the
      per-snapshot cache.
    * BM25 hits are seeds and candidates (recall-spec "BM25 channel").
    * Event seeds use the snapshot's active edges (``invalid_at`` and ``expired_at`` both checked;
      the reference checks only ``invalidAt``); inhibit edges are kept as the reference does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from memory_recall.pipeline._graph_cache import (
    active_mask,
    cached,
    cooccurrence_eligible,
    has_anchor_term_mask,
    hidden_mask,
)
from memory_recall.pipeline.diffusion import collect_seeds, diffuse
from memory_recall.pipeline.state import (
    EMPTY_INDEX,
    Candidates,
    RecallState,
    StageResult,
    StageTrace,
    timed,
)
from memory_recall.settings import AnchorSettings, CrossRecallSettings, DiffusionSettings, SelectionSettings
from memory_recall.store.snapshot import TYPE_CODE, GraphSnapshot

if TYPE_CHECKING:
    from memory_recall.store.snapshot import StructureChange

__all__ = ["CrossRecallStage"]

_SCORE_KIND = "raw_candidate_scores"
_EVENT = TYPE_CODE["event"]
_PART_CODES = np.array([1, 2, 3], dtype=np.int8)  # score-map parts: vector, diffusion, BM25


def _first_occurrence(idx: np.ndarray) -> np.ndarray | None:
    """Positions of the first occurrence of each value of ``idx``, in order; None when no value repeats."""
    values = idx.tolist()
    if len(set(values)) == len(values):
        return None
    first: dict[Any, int] = {}
    for pos, value in enumerate(values):
        first.setdefault(value, pos)
    return np.fromiter(first.values(), dtype=np.int64, count=len(first))


def _cooccurrence_eligible_mask(snapshot: GraphSnapshot) -> np.ndarray:
    """(n,) bool: :func:`cooccurrence_eligible` of every node, built once per snapshot (n bytes: 100 kB at 100k
    nodes). Only nodes of the anchor index (the non-archived nodes with an anchor term) can be eligible, so only
    they are tested. After a delta it is updated from the parent structure's mask (:func:`_updated_eligible`)."""

    def build() -> np.ndarray:
        mask = np.zeros(snapshot.n, dtype=bool)
        with_term = np.flatnonzero(has_anchor_term_mask(snapshot))
        mask[with_term] = cooccurrence_eligible(snapshot, with_term)
        return mask

    def update(previous: np.ndarray, change: StructureChange) -> np.ndarray | None:
        return _updated_eligible(snapshot, previous, change)

    return cached(snapshot, "cross-recall-cooccurrence-eligible", build, update,
                  recipe=_cooccurrence_eligible_mask)[0]


def _updated_eligible(snapshot: GraphSnapshot, previous: np.ndarray, change: StructureChange) -> np.ndarray | None:
    """The eligibility mask of ``snapshot`` from the parent structure's (``previous``) after any delta: a node's
    eligibility derives from its own row only (archived flag, type, anchor terms; a node is in the anchor index
    exactly when it is non-archived with a term), so the carried rows keep theirs and only the rewritten and
    appended rows are tested again. O(n) in C, O(changed) Python. ``None`` (build) when the parent's mask does not
    have the parent's node count."""
    n = snapshot.n
    if previous.shape != (change.n_old,) or change.n_new != n:
        return None
    if change.appended_only and change.appended == change.n_old:
        # The identity remap: the old rows stay in place, the new ones follow.
        mask = np.concatenate([previous, np.zeros(n - change.n_old, dtype=bool)])
        todo = np.concatenate([change.rewritten, np.arange(change.n_old, n, dtype=np.int64)])
    else:
        old, new = change.carried()
        mask = np.zeros(n, dtype=bool)
        mask[new] = previous[old]
        redo = np.ones(n, dtype=bool)
        redo[new] = False
        todo = np.flatnonzero(redo)
    if todo.size:
        mask[todo] = cooccurrence_eligible(snapshot, todo)
    return mask


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values`` (as float64) of the first ``keys`` entry equal to each ``query`` entry, 0 when absent."""
    out = np.zeros(query.size)
    if keys.size == 0 or query.size == 0:
        return out
    order = keys.argsort(kind="stable")
    sorted_keys = keys[order]
    pos = np.minimum(sorted_keys.searchsorted(query), keys.size - 1)
    found = sorted_keys[pos] == query
    out[found] = values[order[pos[found]]]
    return out


class CrossRecallStage:
    """Supplemental anchors, cross-recall re-diffusion and the score map (reference §3.10); see the module
    docstring for the contract.

    Usage: ``CrossRecallStage(settings.cross_recall, settings.diffusion, settings.anchors,
    settings.selection).run(state)``.
    """

    name = "cross_recall"

    def __init__(
        self,
        settings: CrossRecallSettings,
        diffusion: DiffusionSettings,
        anchors: AnchorSettings | None = None,
        selection: SelectionSettings | None = None,
    ) -> None:
        self.settings = settings
        self.diffusion = diffusion
        self.anchors = anchors
        self.selection = selection

    def run(self, state: RecallState) -> StageResult:
        with timed() as elapsed:
            new_state, fields = self._run(state)
        return StageResult(new_state, StageTrace(name=self.name, elapsed_ms=elapsed[0], **fields))

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        snap = state.snapshot
        base: dict[str, Any] = {"score_kind": _SCORE_KIND, "score_direction": "higher_is_better"}
        hidden = hidden_mask(state)
        eligible = active_mask(state).copy()
        if hidden is not None:
            eligible &= ~hidden
        count_in = int(state.vector_hits[0].size + state.diffusion[0].size + state.bm25_hits[0].size)
        if snap.n == 0 or not eligible.any():
            new_state = state.evolve(skip_reasons=state.with_skip("no-active-nodes"))
            skip = {"skipped": True, "skip_reason": "no-active-nodes"}
            return new_state, {**base, "count_in": count_in, **skip}

        supplemental = self._supplemental(state, hidden)
        notes: dict[str, Any] = {"supplementalAnchors": len(supplemental)}
        meta_items: dict[str, Any] = {}
        diffusion = state.diffusion
        triggered = bool(state.meta.get("residualTriggered", False))
        if self.diffusion.enabled and (self.settings.enabled or triggered):
            res_idx = np.fromiter((i for i, _ in state.residual_hits), np.int64, len(state.residual_hits))
            res_e = np.fromiter((c for _, c in state.residual_hits), np.float64, len(state.residual_hits))
            extra: list[tuple[str, np.ndarray, np.ndarray]] = [("residual", res_idx, res_e)]
            if self.settings.enabled:
                extra.append(("event", *self._event_seeds(state, hidden)))
            seeds = collect_seeds(state, (self.anchors or AnchorSettings()).energy, tuple(extra), hidden=hidden)
            notes["seedSources"] = seeds.sources
            notes["reDiffusion"] = len(seeds) > 0
            if len(seeds):
                out = diffuse(snap, seeds, self.diffusion, hidden)
                diffusion = (out.index, out.energy)
                notes["adjacencyCached"] = out.adjacency_cached
                meta_items.update(
                    seedCount=len(seeds),
                    diffusionHits=int(out.index.size),
                    temporalSyntheticEdgeCount=out.synthetic_edge_count,
                    teleportAlpha=float(self.diffusion.teleport_alpha),
                )
        else:
            notes["reDiffusion"] = False

        candidates, parts = self._score_map(state, diffusion, eligible)
        fallback = ""
        if len(candidates) == 0:
            candidates, fallback = self._fallback(state, eligible)
        notes.update(parts)
        notes["fallback"] = fallback
        meta_items["scoreMapFallback"] = fallback
        new_state = state.evolve(
            supplemental_anchors=supplemental,
            diffusion=diffusion,
            candidates=candidates,
            meta=state.with_meta(**meta_items),
        )
        return new_state, {**base, "count_in": count_in, "count_out": len(candidates), "notes": notes}

    # -- parts ---------------------------------------------------------------------------------------------

    def _supplemental(self, state: RecallState, hidden: np.ndarray | None) -> tuple[int, ...]:
        """Up to ``supplemental_anchors`` co-occurrence-eligible, visible vector hits that are not
        exact anchors, in vector-hit order (reference §3.10 first bullet)."""
        snap = state.snapshot
        limit = self.settings.supplemental_anchors
        if limit <= 0:
            return ()
        eligible = _cooccurrence_eligible_mask(snap)
        exact = {i for i, _ in state.anchors}
        out: list[int] = []
        # A few dozen hits, usually only the first few are visited: a plain loop (first occurrences only).
        for i in dict.fromkeys(np.asarray(state.vector_hits[0], dtype=np.int64).tolist()):
            if 0 <= i < snap.n and eligible[i] and i not in exact and (hidden is None or not hidden[i]):
                out.append(i)
                if len(out) == limit:
                    break
        return tuple(out)

    def _event_seeds(self, state: RecallState, hidden: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """For every exact anchor, each active incident edge (edge-list order) whose other end is a
        non-archived, visible event: energy ``event_energy_factor × strength`` (reference §3.10
        "Cross-recall")."""
        snap = state.snapshot
        inc = snap.incident
        idx_parts: list[np.ndarray] = []
        energy_parts: list[np.ndarray] = []
        for a, _ in state.anchors:
         # a handful of anchors per recall
            if not 0 <= a < snap.n:
                continue
            epos = np.sort(inc.data[inc.indptr[a] : inc.indptr[a + 1]].astype(np.int64) - 1)
            if epos.size == 0:
                continue
            src, dst = snap.edge_src[epos], snap.edge_dst[epos]
            other = np.where(src == a, dst, src)
            ok = (snap.type_code[other] == _EVENT) & ~snap.archived[other]
            if hidden is not None:
                ok &= ~hidden[other]
            idx_parts.append(other[ok])
            energy_parts.append(self.settings.event_energy_factor * snap.edge_strength[epos][ok])
        if not idx_parts:
            return EMPTY_INDEX, np.zeros(0)
        return np.concatenate(idx_parts), np.concatenate(energy_parts)

    @staticmethod
    def _score_map(
        state: RecallState, diffusion: tuple[np.ndarray, np.ndarray], eligible: np.ndarray
    ) -> tuple[Candidates, dict[str, int]]:
        """Vector hits, then diffusion-only nodes, then BM25-only nodes (reference §3.10 "Score map" plus the
        BM25 channel), restricted to ``eligible`` (active and visible) nodes."""
        n = state.snapshot.n
        vec_idx, vec_w, vec_raw = (np.asarray(a) for a in state.vector_hits)
        first = _first_occurrence(vec_idx)
        if first is not None:
            vec_idx, vec_w, vec_raw = vec_idx[first], vec_w[first], vec_raw[first]
        dif_idx, dif_e = (np.asarray(a) for a in diffusion)
        bm_idx, bm_s = (np.asarray(a) for a in state.bm25_hits)
        first = _first_occurrence(bm_idx)
        if first is not None:
            bm_idx, bm_s = bm_idx[first], bm_s[first]
        vec_idx, dif_idx, bm_idx = (a.astype(np.int64, copy=False) for a in (vec_idx, dif_idx, bm_idx))
        entries = np.concatenate([vec_idx, dif_idx, bm_idx])
        if entries.size and (entries.min() < 0 or entries.max() >= n):
            # Out-of-range entries never enter, and can never equal an in-range node: drop them.
            vec_ok, dif_ok, bm_ok = ((a >= 0) & (a < n) for a in (vec_idx, dif_idx, bm_idx))
            vec_idx, vec_w, vec_raw = vec_idx[vec_ok], vec_w[vec_ok], vec_raw[vec_ok]
            dif_idx, dif_e = dif_idx[dif_ok], dif_e[dif_ok]
            bm_idx, bm_s = bm_idx[bm_ok], bm_s[bm_ok]
            entries = np.concatenate([vec_idx, dif_idx, bm_idx])
        n_v, n_d = vec_idx.size, dif_idx.size
        # The first part holding each node (1 vector, 2 diffusion, 3 BM25), as an (n,) map written from the
        # last part to the first; an entry enters when its node is eligible and in no earlier part.
        part = np.zeros(n, dtype=np.int8)
        part[bm_idx] = 3
        part[dif_idx] = 2
        part[vec_idx] = 1
        own = np.repeat(_PART_CODES, (n_v, n_d, bm_idx.size))
        enter = eligible[entries] & (part[entries] == own)
        index = entries[enter]
        from_vec = int(np.count_nonzero(enter[:n_v]))
        from_dif = int(np.count_nonzero(enter[n_v : n_v + n_d]))
        from_bm = index.size - from_vec - from_dif
        # A node of one part is in no earlier part: its vector scores are 0 unless it is a vector hit, and the
        # BM25 hits that enter keep their own scores (both channels are deduplicated); the rest is looked up.
        head = index[: from_vec + from_dif]
        vector_score = np.zeros(index.size)
        vector_score[:from_vec] = vec_w[enter[:n_v]]
        vector_raw = np.zeros(index.size)
        vector_raw[:from_vec] = vec_raw[enter[:n_v]]
        graph_score = np.zeros(index.size)
        graph_score[: head.size] = _lookup(dif_idx, dif_e, head)
        bm25_score = np.zeros(index.size)
        bm25_score[: head.size] = _lookup(bm_idx, bm_s, head)
        bm25_score[head.size :] = bm_s[enter[n_v + n_d :]]
        candidates = Candidates(
            index=index,
            graph_score=graph_score,
            vector_score=vector_score,
            vector_raw=vector_raw,
            bm25_score=bm25_score,
            cooccurrence_boost=np.zeros(index.size),
        )
        parts = {"fromVector": from_vec, "fromDiffusion": from_dif, "fromBm25": from_bm}
        return candidates, parts

    def _fallback(self, state: RecallState, eligible: np.ndarray) -> tuple[Candidates, str]:
        """Empty score map: every active visible node on small graphs (reference), else the top
        ``top_k × 3`` by importance, recency, node id (module docstring)."""
        snap = state.snapshot
        cand = np.flatnonzero(eligible)
        if cand.size <= self.settings.whole_set_fallback_max_nodes:
            index, mode = cand, "whole-active-set"
        else:
            k = (self.selection or SelectionSettings()).top_k * 3
            order = np.lexsort((snap.id_rank[cand], -snap.recency(cand), -snap.importance[cand]))[:k]
            index, mode = cand[order], "importance-recency"
        zeros = np.zeros(index.size)
        candidates = Candidates(
            index=index.astype(np.int64),
            graph_score=zeros,
            vector_score=zeros.copy(),
            vector_raw=zeros.copy(),
            bm25_score=zeros.copy(),
            cooccurrence_boost=zeros.copy(),
        )
        return candidates, mode
