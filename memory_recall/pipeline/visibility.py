"""Visibility stage: the active node set and the legacy visibility filter (reference §3.2).

Reads
    ``snapshot.archived``, ``snapshot.seq_end`` (finite range), ``snapshot.visibility`` (node index → names of
    its ``fields.visibility``), ``state.query.visibility_filter`` (a character name; the host's ``name2``).
Writes
    * ``state.active``: (n,) bool — non-archived nodes with a finite ``seqRange[1]`` that pass the filter.
    * ``state.meta["visibility_hidden_mask"]``: (n,) bool — non-archived nodes the filter removes, **whether
      or not they have a finite range** (core nodes have none but must respect the filter too).
    * meta ``visibilityHidden``: the hidden node ids in node-id byte order; ``activeNodeCount`` (reference
      §3.21).
Filter
    Applied when ``VisibilitySettings.enabled`` and the filter name is non-empty: a node without
    ``fields.visibility`` is kept; otherwise it is kept when its names (a list, or a comma-separated string,
    trimmed at snapshot build) contain the filter name or ``"*"`` (exact, case-sensitive, as in the
    reference).
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
    O(n) numpy work per recall; the name → nodes index of ``fields.visibility`` is built once per snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import cached
from memory_recall.pipeline.state import RecallState, TimedStage
from memory_recall.settings import VisibilitySettings
from memory_recall.store.snapshot import GraphSnapshot

__all__ = ["HIDDEN_MASK_KEY", "VisibilityStage", "visibility_hidden"]

#: Meta key of the (n,) bool mask of nodes the visibility filter removed.
HIDDEN_MASK_KEY = "visibility_hidden_mask"

_WILDCARD = "*"


@dataclass(frozen=True)
class _VisibilityIndex:
    """Per snapshot: the nodes eligible before the filter, which nodes carry ``fields.visibility`` and, per
    name, which of them list it."""

    eligible: np.ndarray  # (n,) bool: non-archived with a finite range (read-only)
    restricted: np.ndarray  # (n,) bool
    allowed: dict[str, np.ndarray]  # name → node indices listing it


def _visibility_index(snapshot: GraphSnapshot) -> _VisibilityIndex:
    def build() -> _VisibilityIndex:
        eligible = ~snapshot.archived & snapshot.finite_range
        eligible.flags.writeable = False  # shared by every recall of the snapshot
        restricted = np.zeros(snapshot.n, dtype=bool)
        lists: dict[str, list[int]] = {}
        for i, names in snapshot.visibility.items():
            restricted[i] = True
            for name in names:
                lists.setdefault(name, []).append(i)
        return _VisibilityIndex(eligible, restricted, {k: np.array(v, dtype=np.int64) for k, v in lists.items()})

    value, _ = cached(snapshot, ("visibility", "index"), build)
    return value


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
            active = index.eligible.copy()
            hidden_ids: list[str] = []
        else:
            active = index.eligible & ~hidden
            hidden_idx = np.flatnonzero(hidden)
            hidden_ids = [snap.ids[i] for i in hidden_idx[np.argsort(snap.id_rank[hidden_idx])].tolist()]
        count = int(np.count_nonzero(active))
        meta = state.with_meta(
            activeNodeCount=count,
            visibilityHidden=hidden_ids,
            **{HIDDEN_MASK_KEY: hidden},
        )
        fields: dict[str, Any] = {
            "score_kind": "none",
            "score_direction": "none",
            "count_in": snap.n,
            "count_out": count,
            "notes": {"filter": name, "filterApplied": bool(name), "hiddenCount": len(hidden_ids)},
        }
        new_state = state.evolve(active=active, meta=meta)
        if count == 0:
            new_state = new_state.evolve(skip_reasons=state.with_skip("no-active-nodes"))
            fields.update(skipped=True, skip_reason="no-active-nodes")
        return new_state, fields
