"""Which nodes may still enter a recall after scoring (recall-spec departure 2). Private to the pipeline.

The late stages can add nodes the ranking did not choose: owner-POV augmentation and scene reconstruction
(``owners``), probabilistic recall (``probabilistic``) and the always-inject core nodes of the result
(``result``). Reference §7 items 2, 3 and 9: in ST-BME these additions bypass the visibility filter, the
knowledge gate and the temporal suppression. Here every addition goes through :func:`admissible`, which
reuses the verdict of the scoring stage and never re-decides it:

* a node the visibility filter hid (``meta["visibility_hidden_mask"]``), the knowledge gate suppressed
  (``meta["gate_suppressed"]``) or the story-time director suppressed (``meta["temporalSuppressedNodes"]``) is
  never admitted;
* a node with a scored row passed all of them (the row exists only for survivors);
* a node the score map never held had no verdict yet: it gets the same gate the scoring stage runs
  (:func:`~memory_recall.pipeline.scoring.knowledge_gate` with the same scene owners and **zero** vector,
  graph and lexical evidence — its real evidence in this recall — so no rescue, and the temporal director's
  suppression). That is still "once per node per recall with all of its scores".

Cost: O(len(idx)) numpy work plus one vectorised gate over the unscored part of ``idx``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import active_mask, hidden_mask
from memory_recall.pipeline.scoring import knowledge_gate, resolve_owner_rows, scope_buckets, temporal_director
from memory_recall.pipeline.state import ContextInfo, RecallState
from memory_recall.settings import ContextSettings, ScoringSettings

__all__ = ["admissible", "ids_to_index", "rows_of", "suppressed_mask_for", "with_owners"]


def ids_to_index(state: RecallState, ids: Iterable[Any] | None) -> np.ndarray:
    """Snapshot indices of the node ids in ``ids`` (unknown ids and non-strings are ignored), sorted."""
    index = state.snapshot.index
    found = sorted({index[x] for x in (ids or ()) if isinstance(x, str) and x in index})
    return np.array(found, dtype=np.int64)


def suppressed_mask_for(state: RecallState, idx: np.ndarray) -> np.ndarray:
    """For each node of ``idx``: hidden by the visibility filter, suppressed by the knowledge gate or
    temporally suppressed, according to what the earlier stages recorded."""
    idx = np.asarray(idx, dtype=np.int64)
    out = np.zeros(idx.size, dtype=bool)
    if idx.size == 0:
        return out
    hidden = hidden_mask(state)
    if hidden is not None:
        out |= hidden[idx]
    for key in ("gate_suppressed", "temporalSuppressedNodes"):
        listed = ids_to_index(state, state.meta.get(key, ()))
        if listed.size:
            out |= np.isin(idx, listed)
    return out


def rows_of(state: RecallState, idx: np.ndarray) -> np.ndarray:
    """Row of each node of ``idx`` in ``state.scored`` (−1 when it has none). Vectorised lookup."""
    idx = np.asarray(idx, dtype=np.int64)
    table = state.scored.index
    out = np.full(idx.size, -1, dtype=np.int64)
    if idx.size == 0 or len(table) == 0:
        return out
    order = np.argsort(table, kind="stable")
    sorted_idx = table[order]
    pos = np.clip(np.searchsorted(sorted_idx, idx), 0, sorted_idx.size - 1)
    found = sorted_idx[pos] == idx
    out[found] = order[pos[found]]
    return out


def admissible(
    state: RecallState,
    idx: np.ndarray,
    *,
    context: ContextSettings | None = None,
    scoring: ScoringSettings | None = None,
    require_active: bool = True,
    owner_context: ContextInfo | None = None,
) -> np.ndarray:
    """(len(idx),) bool: may each node of ``idx`` be added to this recall (see the module docstring)?

    ``require_active`` demands membership of the active set (non-archived, finite ``seqRange``, visible);
    core nodes of the result pass ``False`` (they have no range requirement, reference §3.20) but must still
    be non-archived and visible. ``owner_context`` defaults to ``state.context``: the scene owners the scoring
    gate used (departure 2: the gate's owners are never widened afterwards).
    """
    ctx_settings = context or ContextSettings()
    scoring_settings = scoring or ScoringSettings()
    snap = state.snapshot
    idx = np.asarray(idx, dtype=np.int64)
    ok = ~snap.archived[idx]
    if require_active:
        ok &= active_mask(state)[idx]
    ok &= ~suppressed_mask_for(state, idx)
    unscored = ok & (rows_of(state, idx) < 0)
    if not unscored.any():
        return ok
    sub = idx[unscored]
    ctx = owner_context or state.context
    verdict = np.ones(sub.size, dtype=bool)
    if ctx_settings.enable_cognitive_memory:
        buckets = scope_buckets(snap, sub, ctx, settings=ctx_settings)
        zeros = np.zeros(sub.size)
        gate = knowledge_gate(
            snap, sub, resolve_owner_rows(snap, tuple(ctx.owner_keys)), zeros, zeros, zeros, buckets,
            inject_low_confidence=scoring_settings.inject_low_confidence_objective_memory,
        )
        verdict &= gate.visible
    if ctx_settings.enable_story_timeline and ctx_settings.story_time_soft_directing:
        verdict &= ~temporal_director(snap, sub, ctx, enabled=True).suppressed
    ok[unscored] = verdict
    return ok


def with_owners(context: ContextInfo, keys: tuple[str, ...], mode: str) -> ContextInfo:
    """``context`` with other scene owners (for classifying with the final owners, reference §3.17/§3.20)."""
    return dataclasses.replace(context, owner_keys=tuple(keys), owner_mode=mode)
