"""Persisted-record reuse (reference §2.3, with recall-spec departures 1 and 7).

:func:`reuse_decision` says whether the record of the target user floor is replayed instead of retrieving:

* no target floor, no record, or an explicit re-recall → no reuse (departure 1: no scan for "some floor whose
  text matches"; departure 7: ``rerecall`` always retrieves, fixing §7 item 11);
* **staleness by edit** (reference step 4): the floor's text is known and the record is bound to another text
  → no reuse (the user edited the message);
* ``normal`` sends (departure 1): reuse only when the floor's text equals the record's bound text (both
  non-empty) **and** the recall text is that floor text or the record's recall input — a host that targets
  the floor but sends a different query gets a fresh recall, so the §7 item 1 mix-up cannot replay the
  previous turn's block;
* history types (``continue``/``regenerate``/``swipe``): the reference's rule — reuse when the bound text
  matches, when the recall text equals the record's input, or when the record has no bound text and the
  source is not an active (typed-now) source;
* departure 7: with ``controller.replay_stale_records`` a record whose graph version is behind the chat's
  current version is re-recalled instead.

A replay never runs the pipeline, never reinforces, returns the stored injection text byte for byte (including a
manual edit) and bumps ``generation_count`` without a version bump (records are not graph content:
:meth:`Store.set_record_unversioned`).
"""

from __future__ import annotations

from dataclasses import dataclass

from memory_recall.controller.inputs import HISTORY_TYPES, RecallRequest, ResolvedInput
from memory_recall.model.records import PersistedRecall
from memory_recall.text.normalize import normalize_recall_input

__all__ = ["ReuseDecision", "is_stale", "reuse_decision"]


@dataclass(frozen=True)
class ReuseDecision:
    """Whether to replay ``record``; ``why`` is a kebab-case code for the trace."""

    reuse: bool
    why: str
    record: PersistedRecall | None = None


def is_stale(record: PersistedRecall, current_version: int) -> bool:
    """The record was computed on another graph version than the chat's current one."""
    return record.graph_version != current_version


def reuse_decision(
    request: RecallRequest,
    resolved: ResolvedInput,
    record: PersistedRecall | None,
    *,
    current_version: int,
    replay_stale: bool,
) -> ReuseDecision:
    """Decide whether the target floor's record is replayed (see the module docstring)."""
    if request.rerecall:
        return ReuseDecision(False, "explicit-rerecall", record)
    if resolved.target_user_floor is None:
        return ReuseDecision(False, "no-target-floor")
    if record is None or not record.injection_text.strip():
        return ReuseDecision(False, "no-record")
    floor = resolved.floor_text
    bound = normalize_recall_input(record.bound_user_floor_text)
    rec_in = normalize_recall_input(record.recall_input)
    current = normalize_recall_input(resolved.text)
    if floor and bound and floor != bound:
        return ReuseDecision(False, "floor-edited", record)
    if replay_stale and is_stale(record, current_version):
        return ReuseDecision(False, "stale-graph-version", record)
    bound_match = bool(floor) and floor == bound
    input_match = bool(current) and current == rec_in
    if request.generation_type not in HISTORY_TYPES:
        if bound_match and (current == floor or input_match):
            return ReuseDecision(True, "bound-text-match", record)
        return ReuseDecision(False, "normal-send-not-bound" if not bound_match else "query-differs", record)
    if bound_match:
        return ReuseDecision(True, "bound-text-match", record)
    # Reference step 5: an authoritative record matches on its bound floor text only.
    if input_match and not record.authoritative_input_used:
        return ReuseDecision(True, "recall-input-match", record)
    if not bound and not resolved.active:
        return ReuseDecision(True, "unbound-record-trusted", record)
    return ReuseDecision(False, "no-match", record)
