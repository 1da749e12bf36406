"""Reinforcement stage: which nodes the controller access-reinforces after this recall (reference §1.9,
§3.17).

Runs last.

Reads
    ``state.selection`` (final selection) and ``state.probabilistic`` (the probabilistic additions).
Writes
    ``state.reinforced``: the selected node indices minus the probabilistic additions, in selection order; meta
    ``reinforcement``: ``{"ids": [...], "importance_step": 0.1}``.
Contract with the controller
    This stage does **not** write the store, and the snapshot stays read-only. The controller applies
    ``accessCount += 1``, ``importance = min(10, importance + importance_step)`` and ``lastAccessTime = now`` to
    ``reinforced`` in the same transaction that stores the recall record (issue 4), and only for a fresh
    retrieval: a replayed (persisted) recall reinforces nothing (reference §1.9, scenario 39).
Settings
    ``ReinforcementSettings``: ``enabled`` (True), ``importance_step`` (0.1, reference §5.3).
Skip reasons
    ``reinforcement-disabled`` (settings), ``empty-selection`` — trace only; ``reinforced`` stays empty.
Departures
    * §7 item 18 (the read path mutated the graph): the read path is pure; the write moves to the controller's
      record transaction.
"""

from __future__ import annotations

from typing import Any

from memory_recall.pipeline.state import RecallState, TimedStage
from memory_recall.settings import ReinforcementSettings

__all__ = ["ReinforcementStage"]


class ReinforcementStage(TimedStage):
    """Name the nodes to reinforce (see the module docstring).

    Usage: ``ReinforcementStage(settings.reinforcement).run(state)``.
    """

    name = "reinforcement"

    def __init__(self, settings: ReinforcementSettings) -> None:
        self.settings = settings

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        base: dict[str, Any] = {"score_kind": "none", "score_direction": "none", "count_in": len(state.selection)}
        if not self.settings.enabled:
            return state, {**base, "skipped": True, "skip_reason": "reinforcement-disabled"}
        if not state.selection:
            return state, {**base, "skipped": True, "skip_reason": "empty-selection"}
        extra = set(state.probabilistic)
        if extra:
            reinforced = tuple(dict.fromkeys(i for i in state.selection if i not in extra))
            excluded = sum(1 for i in state.selection if i in extra)
        else:  # the usual case: no probabilistic addition
            reinforced = tuple(dict.fromkeys(state.selection))
            excluded = 0
        ids = state.snapshot.ids
        meta = state.with_meta(
            reinforcement={
                "ids": [ids[i] for i in reinforced],
                "importance_step": float(self.settings.importance_step),
            }
        )
        notes = {"excluded_probabilistic": excluded}
        return state.evolve(reinforced=reinforced, meta=meta), {**base, "count_out": len(reinforced),
                                                                "notes": notes}
