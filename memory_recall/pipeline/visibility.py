"""Visibility stage: the active node set and the legacy visibility filter (reference §3.2).

Reads
    ``snapshot.archived``, ``snapshot.seq_end`` (finite range), ``snapshot.visibility`` (node index → names of
    its ``fields.visibility``), ``snapshot.type_code`` and ``snapshot.seq`` (message nodes and their floors),
    ``state.query.visibility_filter`` (a character name; the host's ``name2``), ``state.query.user_floor``.
Writes
    * ``state.active``: (n,) bool — non-archived nodes with a finite ``seqRange[1]`` that pass the filter and
      the current-turn rule.
    * ``state.meta["visibility_hidden_mask"]``: (n,) bool — non-archived nodes the filter or the current-turn
      rule removes, **whether or not they have a finite range** (core nodes have none but must respect the
      filter too).
    * meta ``visibilityHidden``: the ids the filter hid, in node-id byte order; ``currentTurnExcluded``: the ids
      the current-turn rule removed, in floor order (ties by node-id byte order), ``[]`` when none or when
      ``user_floor`` is None; ``activeNodeCount`` (reference §3.21).
Filter
    Applied when ``VisibilitySettings.enabled`` and the filter name is non-empty: a node without
    ``fields.visibility`` is kept; otherwise it is kept when its names (a list, or a comma-separated string,
    trimmed at snapshot build) contain the filter name or ``"*"`` (exact, case-sensitive, as in the
    reference).
Current-turn rule (a departure: ``docs/reference-differences.md``, visibility stage)
    In a recall for user floor ``N`` (``state.query.user_floor``), every non-archived ``message`` node whose
    floor (``seq``) is ≥ ``N`` is removed: the turn being answered — its text *is* the query, so it would be
    its own best match and be injected back as a "memory" — and anything after it (the assistant reply a swipe
    replaces). Only raw chat turns (type ``message``) are concerned; extracted memories are not. ``user_floor``
    None removes nothing. The rule does not depend on ``VisibilitySettings.enabled`` (it is not the legacy
    filter) and its nodes join ``visibility_hidden_mask``, so every route that honours the filter's verdict
    honours this one too. Trace notes: ``userFloor``, ``currentTurnExcludedCount``.
Contract for later stages (recall-spec departure 2, fixing §7 item 2)
    The verdict is final. Every later stage that can touch a node outside the candidate list must exclude the
    hidden ones: diffusion, cross recall and residual seeds/results mask with ``state.active`` (or at least
    with ``visibility_hidden_mask``), and core (always-inject) nodes — which lack the finite-range requirement
    and are therefore not in ``state.active`` — are filtered with ``visibility_hidden_mask``. Scenario 38: the
    hidden Vault never comes back through its edge to Alice.
Settings
    ``VisibilitySettings.enabled`` (app default on; the ``fallback`` profile turns it off, reference §5.1).
Skip reasons
    ``no-active-nodes`` when no node is active (reference §3.4's empty short-circuit: the runner ends the
    recall with ``当前没有可参与召回的活跃节点``). The trace is marked skipped, but ``active`` (all false),
    the hidden mask and ``activeNodeCount`` 0 are still written so later stages see arrays of the right
    length.
Cost
    O(n) numpy work per recall; the name → nodes index of ``fields.visibility`` and the floor-sorted message
    nodes are built once per snapshot, so the current-turn rule costs one binary search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import cached, changed_rows
from memory_recall.pipeline.state import RecallState, TimedStage
from memory_recall.settings import VisibilitySettings
from memory_recall.store.snapshot import TYPE_CODE, GraphSnapshot, StructureChange, inserted

__all__ = ["CURRENT_TURN_KEY", "HIDDEN_MASK_KEY", "VisibilityStage", "current_turn_excluded", "visibility_hidden"]

#: Meta key of the (n,) bool mask of nodes the visibility filter or the current-turn rule removed.
HIDDEN_MASK_KEY = "visibility_hidden_mask"
#: Meta key of the ids the current-turn rule removed (floor order).
CURRENT_TURN_KEY = "currentTurnExcluded"

_WILDCARD = "*"


@dataclass(frozen=True)
class _VisibilityIndex:
    """Per snapshot: the nodes eligible before the filter, which nodes carry ``fields.visibility`` and, per
    name, which of them list it."""

    eligible: np.ndarray  # (n,) bool: non-archived with a finite range (read-only)
    restricted: np.ndarray  # (n,) bool
    allowed: dict[str, np.ndarray]  # name → node indices listing it
    message_index: np.ndarray  # non-archived message nodes by floor, ties by node-id byte order (read-only)
    message_floor: np.ndarray  # their floors (``seq``), ascending (read-only)


def _visibility_lists(snapshot: GraphSnapshot) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Which nodes carry ``fields.visibility`` ((n,) bool) and, per name, the nodes listing it (in the order of
    ``snapshot.visibility``)."""
    restricted = np.zeros(snapshot.n, dtype=bool)
    lists: dict[str, list[int]] = {}
    for i, names in snapshot.visibility.items():
        restricted[i] = True
        for name in names:
            lists.setdefault(name, []).append(i)
    return restricted, {k: np.array(v, dtype=np.int64) for k, v in lists.items()}


def _visibility_index(snapshot: GraphSnapshot) -> _VisibilityIndex:
    def build() -> _VisibilityIndex:
        eligible = ~snapshot.archived & snapshot.finite_range
        eligible.flags.writeable = False  # shared by every recall of the snapshot
        restricted, allowed = _visibility_lists(snapshot)
        messages = np.flatnonzero((snapshot.type_code == TYPE_CODE["message"]) & ~snapshot.archived)
        order = np.lexsort((snapshot.id_rank[messages], snapshot.seq[messages]))
        message_index, message_floor = messages[order], snapshot.seq[messages][order].astype(np.int64)
        message_index.flags.writeable = message_floor.flags.writeable = False
        return _VisibilityIndex(eligible, restricted, allowed, message_index, message_floor)

    value, _ = cached(snapshot, ("visibility", "index"), build,
                      lambda old, change: _updated_index(snapshot, old, change), recipe=_visibility_index)
    return value


#: More messages than this to place into a carried floor order: build the index instead.
_MAX_MESSAGES_PLACED = 64


def _updated_index(snapshot: GraphSnapshot, old: _VisibilityIndex, change: StructureChange) -> _VisibilityIndex | None:
    """The index of ``snapshot`` from its parent structure's (:func:`_visibility_index` builds the same): after an
    appended-only change the old rows keep their positions, so only the rewritten, relinked and new rows are
    derived again — their eligibility and restriction set, the new ones' visibility names appended to the lists,
    and the messages among them placed into the kept floor order by binary search (node-id ranks shift with new
    ids but keep their order). O(n) copies in C plus O(changed rows · log n); when a rewritten node lists
    visibility names or did (they may have changed), the per-name lists are made again, O(restricted nodes).
    ``None`` (build) for any other change, or when too many messages move."""
    redo = changed_rows(change)
    if redo is None:
        return None
    vis = snapshot.visibility
    added = change.n_new - change.appended
    eligible = np.concatenate([old.eligible, np.zeros(added, dtype=bool)])
    eligible[redo] = ~snapshot.archived[redo] & ~np.isnan(snapshot.seq_end[redo])
    eligible.flags.writeable = False
    kept_rewritten = change.rewritten[change.rewritten < change.appended].tolist()
    new_listed = [i for i in range(change.appended, change.n_new) if i in vis]
    if any(p in vis or old.restricted[p] for p in kept_rewritten):
        # A rewritten node lists visibility names, or did: they may have changed, so the lists are made again
        # as the build makes them (O(restricted nodes), no message order rebuilt).
        restricted, allowed = _visibility_lists(snapshot)
    elif new_listed:
        restricted = np.concatenate([old.restricted, np.zeros(added, dtype=bool)])
        restricted[new_listed] = True
        lists = {name: list(rows) for name, rows in old.allowed.items()}
        for i in new_listed:
            for name in vis[i]:
                lists.setdefault(name, []).append(i)
        allowed = {k: np.array(v, dtype=np.int64) for k, v in lists.items()}
    else:
        restricted, allowed = np.concatenate([old.restricted, np.zeros(added, dtype=bool)]), old.allowed
    # The messages whose floor, type, archived flag or id rank may have changed leave the order and are placed again.
    is_message = (snapshot.type_code[redo] == TYPE_CODE["message"]) & ~snapshot.archived[redo]
    place = redo[is_message]
    if place.size > _MAX_MESSAGES_PLACED:
        return None
    marked = np.zeros(snapshot.n, dtype=bool)
    marked[redo] = True
    keep = ~marked[old.message_index]
    order, floors = old.message_index[keep], old.message_floor[keep]
    if place.size:
        rank = snapshot.id_rank
        seq = snapshot.seq[place].astype(np.int64)
        by_key = np.lexsort((rank[place], seq))
        place, seq = place[by_key], seq[by_key]
        order_rank = rank[order]
        at = []
        for i, s in zip(place.tolist(), seq.tolist(), strict=True):
            lo, hi = int(np.searchsorted(floors, s, "left")), int(np.searchsorted(floors, s, "right"))
            at.append(lo + int(np.searchsorted(order_rank[lo:hi], rank[i], "left")))
        order = inserted(order, np.asarray(at, dtype=np.int64), place)
        floors = inserted(floors, np.asarray(at, dtype=np.int64), seq)
    order.flags.writeable = floors.flags.writeable = False
    return _VisibilityIndex(eligible, restricted, allowed, order, floors)


def _hidden_or_none(snapshot: GraphSnapshot, index: _VisibilityIndex, name: str) -> np.ndarray | None:
    """:func:`visibility_hidden`, or None when no filter applies (blank name or no node has a visibility)."""
    name = (name or "").strip()
    if not name or not snapshot.visibility:
        return None
    allowed = np.zeros(snapshot.n, dtype=bool)
    for key in (name, _WILDCARD):
        members = index.allowed.get(key)
        if members is not None:
            allowed[members] = True
    return index.restricted & ~allowed & ~snapshot.archived


def visibility_hidden(snapshot: GraphSnapshot, name: str) -> np.ndarray:
    """(n,) bool: non-archived nodes whose ``fields.visibility`` lists neither ``name`` nor ``"*"``.

    All false when ``name`` is blank (no filter).
    """
    hidden = _hidden_or_none(snapshot, _visibility_index(snapshot), name)
    return np.zeros(snapshot.n, dtype=bool) if hidden is None else hidden


def _current_turn(index: _VisibilityIndex, user_floor: int | None) -> np.ndarray:
    """Indices of the message nodes the current-turn rule removes (floor order); read-only, may be shared."""
    if user_floor is None:
        return index.message_index[:0]
    start = int(np.searchsorted(index.message_floor, int(user_floor), side="left"))
    return index.message_index[start:]


def current_turn_excluded(snapshot: GraphSnapshot, user_floor: int | None) -> list[str]:
    """Ids of the non-archived ``message`` nodes at floors ≥ ``user_floor``, in floor order (ties by node-id
    byte order): what a recall for that user floor never returns (see the module docstring). ``[]`` for None."""
    return [snapshot.ids[i] for i in _current_turn(_visibility_index(snapshot), user_floor).tolist()]


class VisibilityStage(TimedStage):
    """Compute the active node set of one recall (see the module docstring)."""

    name = "visibility"

    def __init__(self, settings: VisibilitySettings) -> None:
        self.settings = settings

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        snap = state.snapshot
        name = state.query.visibility_filter.strip() if self.settings.enabled else ""
        index = _visibility_index(snap)
        hidden = _hidden_or_none(snap, index, name)
        if hidden is None:
            # No filter: nothing hidden (the mask is still written for later stages).
            hidden = np.zeros(snap.n, dtype=bool)
            hidden_ids: list[str] = []
        else:
            hidden_idx = np.flatnonzero(hidden)
            hidden_ids = [snap.ids[i] for i in hidden_idx[np.argsort(snap.id_rank[hidden_idx])].tolist()]
        user_floor = state.query.user_floor
        current = _current_turn(index, user_floor)
        if current.size:
            # One mask for both verdicts: every later stage already honours it (departure 2).
            hidden[current] = True
        active = index.eligible & ~hidden
        count = int(np.count_nonzero(active))
        meta = state.with_meta(
            activeNodeCount=count,
            visibilityHidden=hidden_ids,
            **{CURRENT_TURN_KEY: [snap.ids[i] for i in current.tolist()], HIDDEN_MASK_KEY: hidden},
        )
        fields: dict[str, Any] = {
            "score_kind": "none",
            "score_direction": "none",
            "count_in": snap.n,
            "count_out": count,
            "notes": {
                "filter": name, "filterApplied": bool(name), "hiddenCount": len(hidden_ids),
                "userFloor": user_floor, "currentTurnExcludedCount": int(current.size),
            },
        }
        new_state = state.evolve(active=active, meta=meta)
        if count == 0:
            new_state = new_state.evolve(skip_reasons=state.with_skip("no-active-nodes"))
            fields.update(skipped=True, skip_reason="no-active-nodes")
        return new_state, fields
