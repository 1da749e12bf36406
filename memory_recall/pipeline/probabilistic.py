"""Probabilistic stage: occasionally recall an important memory the ranking did not choose (reference §3.18,
reworked by recall-spec departure 6).

Runs after the owner stage (final selection) and before reinforcement.

Reads
    ``state.selection``, ``state.active``, ``state.query.seed``, meta ``visibility_hidden_mask`` /
    ``gate_suppressed`` / ``temporalSuppressedNodes``, ``state.scored`` (nodes it holds passed the gate), the
    snapshot's importance, type codes and ``id_rank``.
Writes
    ``state.probabilistic`` (the added node indices, in addition order) and ``state.selection`` (the selection
    with the additions appended, at most ``max_recall_nodes``); meta ``probabilisticRecall``: ``{enabled,
    chance, reservedSlots, slots, candidates, draws, added}`` (ids; draws rounded to 6 decimals) and
    ``selectionOrigins`` (the additions get ``probabilistic``).
Rule
    ``p = clamp(chance, 0.01, 0.5)``. Candidates: active, visible, ungated (:func:`~memory_recall.pipeline.
    _admission.admissible`: not hidden, not suppressed by the knowledge gate or the story-time director, the
    same gate for nodes the score map never held) nodes that are not selected, ``importance ≥ min_importance``
    (6) and of a type other than ``synopsis``/``rule``; the first 3 by importance desc, then node id. One
    uniform draw per candidate, in that order, from ``np.random.default_rng(state.query.seed)``; a candidate is
    added when its draw is ``< p``. ``slots = max(reserved_slots, max_recall_nodes − len(selection))``: the
    additions take at most ``slots`` places and the deterministic selection keeps the first
    ``max_recall_nodes − len(additions)`` of its entries (a reserved slot nothing was drawn for stays with the
    ranking).
Seed (how the controller must build ``RecallQuery.seed``)
    :func:`recall_seed` ``(chat_id, user_floor, graph_version)`` — the first 8 bytes (big endian) of
    ``sha256(f"{chat_id}:{user_floor}:{graph_version}")`` as an unsigned int. A replay of the same floor on the
    same graph version draws the same nodes; a new floor or a changed graph draws anew.
Settings
    ``ProbabilisticSettings``: ``enabled`` (False), ``chance`` (0.15), ``reserved_slots`` (1), ``min_importance``
    (6); ``SelectionSettings.max_recall_nodes``; ``ContextSettings`` / ``ScoringSettings`` for the gate.
Skip reasons
    ``probabilistic-disabled`` (settings, or ``chance`` 0: trace only), ``no-probabilistic-candidates`` (trace
    only: nothing eligible). Neither changes the state.
Departures (recall-spec)
    * 6 (§7 item 10) — the reference appends its additions after a selection that already holds
      ``maxRecallNodes`` ids and then cuts them, so they almost never survive; here up to ``reserved_slots``
      places inside ``max_recall_nodes`` are reserved for them (more when the selection is shorter). Its
      ``Math.random()`` is replaced by the seeded generator (departure 10). Scenario 40: with twelve importance-9
      characters and ``maxRecallNodes`` 8, a run whose draws succeed selects 7 ranked nodes + 1 addition
      (reference: 8 ranked, the additions cut); with ``topK`` 2 it selects the 2 ranked + 3 additions, as in
      the reference.
    * 2 — an addition must pass the gates the ranking applied (the reference drew from all active nodes).
    * 10 — ties in importance break by node id.
    * Additions are never access-reinforced, as in the reference (the reinforcement stage leaves them out).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from memory_recall.pipeline._admission import admissible
from memory_recall.pipeline._graph_cache import active_mask, hidden_mask
from memory_recall.pipeline.state import RecallState, TimedStage
from memory_recall.settings import ContextSettings, ProbabilisticSettings, ScoringSettings, SelectionSettings

__all__ = ["ProbabilisticStage", "recall_seed"]

MAX_CANDIDATES = 3  # reference §5.3 "probabilistic recall top 3"
P_MIN, P_MAX = 0.01, 0.5  # reference §3.18 clamp
EXCLUDED_TYPES = ("synopsis", "rule")
_CHUNK = 64  # candidates gated per vectorised admission call


def recall_seed(chat_id: str, user_floor: int | None, graph_version: int) -> int:
    """The seed of one recall: ``sha256(f"{chat_id}:{user_floor}:{graph_version}")``, first 8 bytes, big endian.

    >>> seed = recall_seed("chat-1", 4, 17)
    >>> seed == recall_seed("chat-1", 4, 17), seed != recall_seed("chat-1", 5, 17)
    (True, True)
    """
    digest = hashlib.sha256(f"{chat_id}:{user_floor}:{graph_version}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class ProbabilisticStage(TimedStage):
    """Seeded probabilistic recall inside reserved slots (see the module docstring).

    Usage: ``ProbabilisticStage(settings.probabilistic, settings.selection, settings.context,
    settings.scoring).run(state)``.
    """

    name = "probabilistic"

    def __init__(
        self,
        settings: ProbabilisticSettings,
        selection: SelectionSettings,
        context: ContextSettings | None = None,
        scoring: ScoringSettings | None = None,
    ) -> None:
        self.settings = settings
        self.selection = selection
        self.context = context
        self.scoring = scoring

    def _candidates(self, state: RecallState) -> np.ndarray:
        """Up to 3 eligible node indices, importance desc then node id."""
        snap = state.snapshot
        mask = active_mask(state) & ~snap.archived
        hidden = hidden_mask(state)
        if hidden is not None:
            mask &= ~hidden
        mask &= snap.importance >= float(self.settings.min_importance)
        mask &= ~snap.mask_types(EXCLUDED_TYPES)
        if state.selection:
            mask[np.asarray(state.selection, dtype=np.int64)] = False
        pool = np.flatnonzero(mask)
        if pool.size == 0:
            return pool
        pool = pool[np.lexsort((snap.id_rank[pool], -snap.importance[pool]))]
        chosen: list[int] = []
        for start in range(0, pool.size, _CHUNK):  # gate the best-ranked chunk first; usually one chunk
            chunk = pool[start:start + _CHUNK]
            ok = admissible(state, chunk, context=self.context, scoring=self.scoring, require_active=True)
            chosen.extend(chunk[ok].tolist())
            if len(chosen) >= MAX_CANDIDATES:
                break
        return np.array(chosen[:MAX_CANDIDATES], dtype=np.int64)

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        base: dict[str, Any] = {"score_kind": "importance", "score_direction": "higher_is_better"}
        if not self.settings.enabled or self.settings.chance <= 0:
            count = len(state.selection)
            return state, {**base, "count_in": count, "count_out": count, "skipped": True,
                           "skip_reason": "probabilistic-disabled"}
        selection = list(state.selection)
        cands = self._candidates(state)
        if cands.size == 0:
            return state, {**base, "count_in": len(selection), "count_out": len(selection), "skipped": True,
                           "skip_reason": "no-probabilistic-candidates"}
        limit = int(self.selection.max_recall_nodes)
        p = min(P_MAX, max(P_MIN, float(self.settings.chance)))
        draws = np.random.default_rng(int(state.query.seed) % 2**64).random(cands.size)
        slots = min(limit, max(int(self.settings.reserved_slots), limit - len(selection)))
        added = cands[draws < p][:slots].tolist()
        final = selection[: limit - len(added)] + added
        snap = state.snapshot
        kept = {snap.ids[i] for i in final}
        origins = {k: v for k, v in (state.meta.get("selectionOrigins") or {}).items() if k in kept}
        origins.update({snap.ids[i]: "probabilistic" for i in added})
        meta = state.with_meta(
            probabilisticRecall={
                "enabled": True,
                "chance": p,
                "reservedSlots": int(self.settings.reserved_slots),
                "slots": slots,
                "candidates": [snap.ids[i] for i in cands.tolist()],
                "draws": [round(float(d), 6) for d in draws],
                "added": [snap.ids[i] for i in added],
            },
            selectionOrigins=origins,
        )
        new_state = state.evolve(selection=tuple(final), probabilistic=tuple(added), meta=meta)
        notes = {"p": p, "slots": slots, "candidates": int(cands.size), "added": len(added)}
        return new_state, {**base, "count_in": len(selection), "count_out": len(final), "notes": notes}
