"""Turn context: a chat turn is matched together with the turns around it (not in the reference; issue 17).

Contract of :func:`with_turn_context`
    Takes per-node scores of one channel over the whole snapshot (``(n,)`` or ``(q, n)``: cosines of the vector
    prefilter, best-relative BM25 scores of the lexical channel) and returns new scores of the same shape. For a
    ``message`` node ``i`` whose chain neighbours ``p = prev(i)`` / ``x = next(i)`` are message nodes too::

        s'ᵢ = (sᵢ + previous · s_p + next · s_x) / (1 + previous·[p exists] + next·[x exists])

    i.e. the weighted mean of the turn's own score and its neighbours'. Every other node (extracted events with
    their own ``prev``/``next`` chains, characters, POV memories …) keeps its score bit for bit, and with both
    weights 0 the input is returned unchanged. The input is never mutated.
Why
    Chat turns lean on the turn before them: "I started teaching people how to make this" is about the vegan ice
    cream of the previous turn, "I also like holding them" about the turtles. Scoring a turn with its context lets
    the channel find it at all (the scoring stage's ``neighbour_carry`` only lifts turns that are already
    candidates, by ``max``, not a mean). Measured on the LoCoMo dev split (docs/evaluation.md): vector 0.5 / 0.2
    and BM25 0.5 / 0.2 with the scoring carry 0.8 → 0.7, R@10 0.785 → 0.818, R@5 0.686 → 0.710.
Cost
    Two gathers and adds over the node axis per channel (numpy, no per-node Python); the message-neighbour index
    arrays are built once per snapshot structure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memory_recall.pipeline._graph_cache import cached, changed_rows
from memory_recall.pipeline.kind_weights import MESSAGE_TYPE_CODE
from memory_recall.store.snapshot import GraphSnapshot, StructureChange, inserted

__all__ = ["TurnNeighbours", "turn_neighbours", "with_turn_context"]


@dataclass(frozen=True, slots=True, eq=False)
class TurnNeighbours:
    """Of the message nodes of a snapshot: those with a message ``prev`` and a message ``next``, and which (rows
    ascending)."""

    prev_rows: np.ndarray
    prev_of: np.ndarray
    next_rows: np.ndarray
    next_of: np.ndarray


def _build(snapshot: GraphSnapshot) -> TurnNeighbours:
    is_message = snapshot.type_code == MESSAGE_TYPE_CODE

    def pairs(neighbour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.flatnonzero(is_message & (neighbour >= 0))
        rows = rows[is_message[neighbour[rows]]]
        return rows, neighbour[rows]

    return TurnNeighbours(*pairs(snapshot.prev_index), *pairs(snapshot.next_index))


def _updated(snapshot: GraphSnapshot, old: TurnNeighbours, change: StructureChange) -> TurnNeighbours | None:
    """:func:`_build` of ``snapshot`` from the pairs of its parent structure: after an appended-only change that
    rewrote no node's type, a pair of a row whose links did not move stands (both ends keep their type), so
    only the rewritten, relinked and new rows are paired again. O(pairs) numpy; ``None`` otherwise."""
    redo = changed_rows(change)
    if redo is None or "type_code" in (change.changed_columns or ()):
        return None
    is_message = snapshot.type_code == MESSAGE_TYPE_CODE
    redo = redo[is_message[redo]]
    marked = np.zeros(snapshot.n, dtype=bool)
    marked[redo] = True

    def pairs(rows: np.ndarray, of: np.ndarray, neighbour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = ~marked[rows]
        rows, of = rows[keep], of[keep]
        fresh = redo[neighbour[redo] >= 0]
        fresh = fresh[is_message[neighbour[fresh]]]
        if not rows.size or not fresh.size or fresh[0] > rows[-1]:  # the usual turn: the changed rows are the last
            return np.concatenate([rows, fresh]), np.concatenate([of, neighbour[fresh]])
        at = np.searchsorted(rows, fresh)  # both ascending: the rows stay in order
        return inserted(rows, at, fresh), inserted(of, at, neighbour[fresh])

    return TurnNeighbours(*pairs(old.prev_rows, old.prev_of, snapshot.prev_index),
                          *pairs(old.next_rows, old.next_of, snapshot.next_index))


def turn_neighbours(snapshot: GraphSnapshot) -> TurnNeighbours:
    """The snapshot's message-to-message chain pairs (cached per snapshot structure, updated after a write)."""
    value, _ = cached(snapshot, ("turn-neighbours",), lambda: _build(snapshot),
                      lambda old, change: _updated(snapshot, old, change), recipe=turn_neighbours)
    return value


def with_turn_context(scores: np.ndarray, snapshot: GraphSnapshot, previous: float, next_: float) -> np.ndarray:
    """``scores`` with each message turn's score averaged with its neighbours' (module docstring)."""
    if previous <= 0.0 and next_ <= 0.0:
        return scores
    pairs = turn_neighbours(snapshot)
    base = np.asarray(scores, dtype=np.float64)
    total = base.copy()
    norm = np.ones(base.shape[-1])
    if previous > 0.0 and pairs.prev_rows.size:
        total[..., pairs.prev_rows] += previous * base[..., pairs.prev_of]
        norm[pairs.prev_rows] += previous
    if next_ > 0.0 and pairs.next_rows.size:
        total[..., pairs.next_rows] += next_ * base[..., pairs.next_of]
        norm[pairs.next_rows] += next_
    return (total / norm).astype(np.asarray(scores).dtype, copy=False)
