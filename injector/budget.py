"""Caps and character budget of the injection block (recall-spec departure 5, fixing reference §7 item 15).

The reference has no budget: every always-inject node is a candidate for every block and the global cap is
filled by recency. Here:

* **Caps** (:func:`fill_cap`): ``core_cap`` on always-inject nodes and ``objective_global_cap`` on the
  objective-global section are filled by score — selected nodes (those with a score) first, by score desc, then
  the rest in their given (recall) order — instead of by recency alone. Nodes left out are reported as
  ``core-cap`` / ``objective-global-cap``. For results built by :func:`memory_recall.pipeline.result.build_result`
  the caps are already applied and these are no-ops.
* **Row budget**: a table row longer than ``max_row_chars`` characters is dropped whole (``budget-row``), never
  cut. Summary entries are not table rows and only count against the block budget.
* **Block budget** (:func:`fit`): while the block is longer than ``max_chars`` characters, whole rows are dropped
  (``budget-block``) — lowest-priority section first (:data:`injector.buckets.SECTION_PRIORITY`), within a section
  the lowest-scored row first, unscored rows before scored ones, later rows (recall order) before earlier ones;
  summary entries oldest first. A table, legacy group heading or section header disappears with its last row, so
  no header is kept without a row. The block never exceeds ``max_chars``; if even the headers of row-less
  sections do not fit, the block is empty.

Characters are Unicode code points (``len``) of the final, trimmed text. Dropping a row never lengthens the
block (columns are recomputed and can only disappear), so the fewest drops are found by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .tables import node_id

__all__ = ["DropCandidate", "fill_cap", "fit"]


def fill_cap(
    nodes: Sequence[dict[str, Any]], scores: Mapping[str, float], cap: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(kept, left_out)``: the ``cap`` best nodes by fill order (scored first by score desc, then given order),
    ``kept`` in the given order and ``left_out`` in fill order."""
    order = sorted(
        range(len(nodes)),
        key=lambda i: (0, -scores[node_id(nodes[i])], i) if node_id(nodes[i]) in scores else (1, 0.0, i),
    )
    chosen = set(order[: max(0, cap)])
    return [n for i, n in enumerate(nodes) if i in chosen], [nodes[i] for i in order[max(0, cap):]]


@dataclass(frozen=True)
class DropCandidate:
    """A droppable row: a table row (``node_id``) or a summary entry (its id), with its section."""

    key: str
    section: str
    #: Sort key, lowest dropped first.
    rank: tuple[Any, ...]


def row_rank(priority: int, section_index: int, position: int, score: float | None) -> tuple[Any, ...]:
    """Drop rank of a table row: section priority, then score (unscored lowest), then later rows first."""
    return (priority, -math.inf if score is None else score, -position, -section_index)


def summary_rank(priority: int, section_index: int, position: int) -> tuple[Any, ...]:
    """Drop rank of a summary entry: oldest first."""
    return (priority, -math.inf, position, -section_index)


def fit(candidates: Sequence[DropCandidate], length: Callable[[frozenset[str]], int], max_chars: int) -> list[str]:
    """Keys to drop, in drop order: the shortest prefix of ``candidates`` sorted by rank whose removal brings
    ``length(dropped)`` to at most ``max_chars`` (all of them when none does; the caller then empties the block).
    ``length`` must be non-increasing as keys are added."""
    order = [c.key for c in sorted(candidates, key=lambda c: c.rank)]
    if length(frozenset()) <= max_chars:
        return []
    lo, hi = 1, len(order)
    if length(frozenset(order)) > max_chars:
        return order
    while lo < hi:
        mid = (lo + hi) // 2
        if length(frozenset(order[:mid])) <= max_chars:
            hi = mid
        else:
            lo = mid + 1
    return order[:lo]
