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

Cost: O(len(idx)) numpy work plus one vectorised gate over the unscored part of ``idx`` not yet judged in this
recall. The late stages call :func:`admissible` many times on small index sets (scene reconstruction per
neighbourhood, core nodes, every event), so the per-recall parts — the suppressed mask over all nodes, the
sorted score-table index — are memoised per thread, keyed by the identity of the (immutable) objects they
derive from (a new recall state replaces the entry); the zero-evidence verdict of each node already judged is
kept per snapshot and scene (:func:`_verdicts`), since it depends on nothing else.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import active_mask, cached, carry_rows, hidden_mask
from memory_recall.pipeline.scoring import (
    knowledge_gate,
    persona_row,
    resolve_owner_rows,
    scope_buckets,
    temporal_director,
)
from memory_recall.pipeline.state import ContextInfo, RecallState
from memory_recall.settings import ContextSettings, ScoringSettings

__all__ = ["admissible", "ids_to_index", "rows_of", "suppressed_mask_for", "with_owners"]


def ids_to_index(state: RecallState, ids: Iterable[Any] | None) -> np.ndarray:
    """Snapshot indices of the node ids in ``ids`` (unknown ids and non-strings are ignored), sorted."""
    index = state.snapshot.index
    found = sorted({index[x] for x in (ids or ()) if isinstance(x, str) and x in index})
    return np.array(found, dtype=np.int64)


def _listed_index(state: RecallState, ids: Iterable[Any] | None) -> list[int]:
    """The snapshot indices of the node ids in ``ids``, in any order, repeats kept: what :func:`ids_to_index`
    finds, without its sort (a mask does not need it). The ids the stages record are strings, so one
    ``dict.get`` per id does (a non-string hashable finds nothing either); an unhashable entry falls back to
    :func:`ids_to_index`, which skips it."""
    listed = ids if isinstance(ids, list | tuple) else list(ids or ())
    get = state.snapshot.index.get
    try:
        return [i for i in map(get, listed) if i is not None]
    except TypeError:
        return ids_to_index(state, listed).tolist()


_MEMO = threading.local()


def _held(obj: Any) -> Any:
    """``obj`` as a memo key holds it: weakly when it can be (a memo must not keep a stale snapshot alive: the
    thread that ran a recall would hold that snapshot until its next recall), else ``obj`` itself."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj


def _same(held: Any, obj: Any) -> bool:
    return (held() if type(held) is weakref.ReferenceType else held) is obj


def _memo(slot: str, key: tuple[Any, ...], build: Any) -> Any:
    """One memoised value per ``slot`` and thread, reused while every object of ``key`` is the same object
    (identity, not equality: the keys are immutable per-recall objects). The entry holds the key objects weakly
    where they allow it (:func:`_held`), so it never keeps a snapshot alive; a key object that died never
    matches."""
    entry = getattr(_MEMO, slot, None)
    if entry is not None and len(entry[0]) == len(key) and all(
        _same(a, b) for a, b in zip(entry[0], key, strict=True)
    ):
        return entry[1]
    value = build()
    setattr(_MEMO, slot, (tuple(_held(k) for k in key), value))
    return value


#: Zero-evidence verdict arrays kept per snapshot: one per recent scene (owners, region, story time, settings).
MAX_SCENES_PER_SNAPSHOT = 8

#: Guards the scenes' verdict tables (filled in place by the recalls on a structure).
_VERDICTS_LOCK = threading.Lock()


def _verdicts(snapshot: Any, key: Hashable) -> np.ndarray:
    """(n,) int8 verdicts of one scene on one snapshot: −1 not judged yet, else 0/1.

    The zero-evidence verdict reads only the snapshot, the :class:`ContextInfo` (scene owners, region, story
    time — all frozen and compared by value) and the two settings sections, so a scene that stays the same
    over several turns reuses what earlier recalls judged. The verdict reads none of the statistics overlay
    (scope buckets, the knowledge gate, the temporal director), so the arrays are kept per snapshot structure
    (:func:`_scenes`): they survive reinforcement writes and die with the structure.
    """
    scenes = _scenes(snapshot)
    with _VERDICTS_LOCK:
        arr = scenes.get(key)
        if arr is None:
            arr = np.full(snapshot.n, -1, dtype=np.int8)
            scenes[key] = arr
            while len(scenes) > MAX_SCENES_PER_SNAPSHOT:
                scenes.popitem(last=False)
        else:
            scenes.move_to_end(key)
        return arr


def _scenes(snapshot: Any) -> OrderedDict[Hashable, np.ndarray]:
    """The verdict arrays of the scenes judged on ``snapshot``'s structure (most recent last), a per-structure
    value (:func:`~memory_recall.pipeline._graph_cache.cached`). A structure a delta updated starts with every
    scene its parent held (:func:`_carried_scenes`), derived after the write, so the scenes of the turns before it
    keep their verdicts, also across a write no recall follows (a turn's background vectors)."""
    empty: OrderedDict[Hashable, np.ndarray] = OrderedDict()
    return cached(snapshot, ("admission", "verdicts"), lambda: empty, _carried_scenes, recipe=_scenes)[0]


def _carried_scenes(old: OrderedDict[Hashable, np.ndarray], change: Any) -> OrderedDict[Hashable, np.ndarray]:
    """The parent structure's verdict arrays ``old``, in its order, with the verdicts of the nodes ``change`` left
    unchanged and −1 for the others; none when the chat state was written (the gate and the director read it). A
    node's verdict reads only the node, the scene and the state. O(scenes × n) in numpy, no scan of the nodes in
    Python."""
    out: OrderedDict[Hashable, np.ndarray] = OrderedDict()
    if change.state_changed:
        return out
    with _VERDICTS_LOCK:  # a recall on the parent may still be adding scenes
        scenes = list(old.items())
    for key, arr in scenes:
        out[key] = carry_rows(arr, change, -1)
    return out


def _suppressed_all(state: RecallState) -> np.ndarray:
    """(n,) bool: hidden, gate-suppressed or temporally suppressed (see :func:`suppressed_mask_for`)."""
    snap = state.snapshot
    meta = state.meta
    gate = meta.get("gate_suppressed", ())
    temporal = meta.get("temporalSuppressedNodes", ())
    hidden_raw = meta.get("visibility_hidden_mask")

    def build() -> np.ndarray:
        hidden = hidden_mask(state)
        out = np.zeros(snap.n, dtype=bool) if hidden is None else hidden.copy()
        for listed in (gate, temporal):
            found = _listed_index(state, listed)
            if found:
                out[found] = True
        return out

    return _memo("suppressed", (snap, gate, temporal, hidden_raw), build)


def suppressed_mask_for(state: RecallState, idx: np.ndarray) -> np.ndarray:
    """For each node of ``idx``: hidden by the visibility filter, suppressed by the knowledge gate or
    temporally suppressed, according to what the earlier stages recorded."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return np.zeros(0, dtype=bool)
    return _suppressed_all(state)[idx]


def _sorted_table(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    def build() -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(table, kind="stable")
        return order, table[order]

    return _memo("rows", (table,), build)


def rows_of(state: RecallState, idx: np.ndarray) -> np.ndarray:
    """Row of each node of ``idx`` in ``state.scored`` (−1 when it has none). Vectorised lookup."""
    idx = np.asarray(idx, dtype=np.int64)
    table = state.scored.index
    out = np.full(idx.size, -1, dtype=np.int64)
    if idx.size == 0 or len(table) == 0:
        return out
    order, sorted_idx = _sorted_table(table)
    # searchsorted never returns a negative position: only the upper end needs capping (np.minimum is a ufunc
    # call; np.clip's Python wrapper costs more than the search on these small arrays).
    pos = np.minimum(np.searchsorted(sorted_idx, idx), sorted_idx.size - 1)
    found = sorted_idx[pos] == idx
    out[found] = order[pos[found]]
    return out


def _unscored_verdict(
    state: RecallState, sub: np.ndarray, ctx: ContextInfo, ctx_settings: ContextSettings,
    scoring_settings: ScoringSettings,
) -> np.ndarray:
    """The zero-evidence gate and temporal verdict of the nodes ``sub``; element-wise, so the verdict of each
    node judged earlier in this recall (same snapshot, owners context and settings) is reused."""
    snap = state.snapshot
    known = _verdicts(snap, (ctx, ctx_settings, scoring_settings))
    todo = sub[known[sub] < 0]
    if todo.size:
        todo = np.unique(todo)
        verdict = np.ones(todo.size, dtype=bool)
        if ctx_settings.enable_cognitive_memory:
            buckets = scope_buckets(snap, todo, ctx, settings=ctx_settings)
            zeros = np.zeros(todo.size)
            gate = knowledge_gate(
                snap, todo, resolve_owner_rows(snap, tuple(ctx.owner_keys)), zeros, zeros, zeros, buckets,
                inject_low_confidence=scoring_settings.inject_low_confidence_objective_memory,
                user_row=persona_row(snap, state.query),
            )
            verdict &= gate.visible
        if ctx_settings.enable_story_timeline and ctx_settings.story_time_soft_directing:
            verdict &= ~temporal_director(snap, todo, ctx, enabled=True).suppressed
        known[todo] = verdict
    return known[sub] == 1


def admissible(
    state: RecallState,
    idx: np.ndarray,
    *,
    context: ContextSettings | None = None,
    scoring: ScoringSettings | None = None,
    require_active: bool = True,
    owner_context: ContextInfo | None = None,
    rescued: bool = True,
) -> np.ndarray:
    """(len(idx),) bool: may each node of ``idx`` be added to this recall (see the module docstring)?

    ``require_active`` demands membership of the active set (non-archived, finite ``seqRange``, visible);
    core nodes of the result pass ``False`` (they have no range requirement, reference §3.20) but must still
    be non-archived and visible. ``owner_context`` defaults to ``state.context``: the scene owners the scoring
    gate used (departure 2: the gate's owners are never widened afterwards). ``rescued=False`` also refuses the
    nodes the gate let through only by a rescue (``meta["knowledgeRescueOnlyNodes"]``): the core route and scene
    reconstruction pass it — a rescued node may be ranked and selected on its evidence, never added by a route
    that does not weigh it (departure 4).
    """
    ctx_settings = context or ContextSettings()
    scoring_settings = scoring or ScoringSettings()
    snap = state.snapshot
    idx = np.asarray(idx, dtype=np.int64)
    ok = ~snap.archived[idx]
    if require_active:
        ok &= active_mask(state)[idx]
    ok &= ~suppressed_mask_for(state, idx)
    if not rescued:
        listed = _listed_index(state, state.meta.get("knowledgeRescueOnlyNodes", ()))
        if listed:
            ok &= ~np.isin(idx, np.asarray(listed, dtype=np.int64))
    unscored = ok & (rows_of(state, idx) < 0)
    if not unscored.any():
        return ok
    ctx = owner_context or state.context
    ok[unscored] = _unscored_verdict(state, idx[unscored], ctx, ctx_settings, scoring_settings)
    return ok


def with_owners(context: ContextInfo, keys: tuple[str, ...], mode: str) -> ContextInfo:
    """``context`` with other scene owners (for classifying with the final owners, reference §3.17/§3.20)."""
    return dataclasses.replace(context, owner_keys=tuple(keys), owner_mode=mode)
