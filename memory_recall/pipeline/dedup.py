"""Dedup stage: collapse duplicate candidates before DPP and rerank (recall-spec "Dedup before rerank").

Runs after scoring and before diversity; not part of the reference (its source is the seed
``retrieval-and-evidence.md``: "Exact text duplicates and >=80% overlapping source ranges are collapsed before
optional rerank").

Reads
    ``state.scored`` (ranking order), node fields of the rows inside the window (``snapshot.node``), the
    snapshot's ``type_code``, ``seq_start``/``seq_end`` and ``scope_owner_key`` arrays.
Writes
    * ``state.scored`` without the collapsed rows (every column filtered alike, order kept). Only the first
      ``window = max(max(max_recall_nodes, llm_candidate_pool), top_k) × candidate_multiplier`` rows are
      examined — the rows DPP and the rerank can ever see; rows below the window are never touched.
    * meta ``dedupCollapsed``: ``{kept id: [dropped ids]}`` (kept rows in ranking order, dropped ones in
      ranking order) and ``dedupReasons``: ``{dropped id: "exact-text" | "range-overlap"}``.
Rules (a row collapses into the best-ranked *kept* row it duplicates; rows are visited in ranking order)
    * **Exact text**: equal non-empty text key, where the key is the node's summary, insight, title and name
      values (each whitespace-collapsed and lower-cased like ``NL``, without NL's 600-unit cut, joined by
      ``" | "``) — the leading keys of the reference's embedding text. Two decisions keep distinct memories
      apart: the scope owner key is part of the key (the same sentence in Alice's and Bob's POV is two
      memories, injected in two owner sections), and a node whose only text is a name does not take part
      (two character nodes named "Alice" are the ``#nodeId`` case of reference §1.5: different characters).
    * **Range overlap**: both rows have a finite message range, the same type in :data:`RANGE_TYPES`, the same
      scope owner key, at least one of the two ranges spans more than one floor, and ``overlap / min(length) ≥
      0.8`` with inclusive floors (``overlap = min(end) − max(start) + 1``). Only summaries (``synopsis``) and
      ``message`` nodes take part: their range *is* their content, so two summaries of the same floors say the
      same thing. For every other type the range is provenance — ST-BME extracts events, threads, characters,
      rules and POV memories in batches, and every node of a batch carries the batch's range — so a range overlap
      says nothing about the content. Collapsing events by range erased distinct memories (on the fixture chats:
      the will reading collapsed into Tobias's alibi, the plan to free the fox into its contest, dropping 3 of the
      49 required memories); those types only collapse by exact text. Same type only: a summary of floors 10–20
      and the message at floor 15 are different granularities. Messages have one-floor ranges and one message per
      floor, so in practice this rule merges overlapping summaries.
Invariants
    Never adds or reorders rows; the best-ranked row of each duplicate group survives; deterministic.
Settings
    ``SelectionSettings`` (``top_k``, ``max_recall_nodes``, ``llm_candidate_pool``) and
    ``DiversitySettings.candidate_multiplier`` for the window; the 0.8 overlap ratio and :data:`RANGE_TYPES`
    are constructor arguments (defaults from the recall-spec).
Skip reasons
    ``no-candidates`` (empty scored table; state returned unchanged).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from memory_recall.model.graph import Node
from memory_recall.pipeline._graph_cache import cached
from memory_recall.pipeline.scoring import take_rows
from memory_recall.pipeline.state import RecallState, StageResult, StageTrace, timed
from memory_recall.settings import DiversitySettings, SelectionSettings
from memory_recall.store.snapshot import TYPE_CODE, GraphSnapshot

__all__ = ["DEDUP_TEXT_FIELDS", "OVERLAP_RATIO", "RANGE_TYPES", "DedupStage", "dedup_text_key"]

#: Fields whose values form the exact-duplicate text (leading keys of the reference's embedding text).
DEDUP_TEXT_FIELDS: tuple[str, ...] = ("summary", "insight", "title", "name")
#: Recall-spec "Dedup before rerank": ≥ 80 % of the same message range.
OVERLAP_RATIO = 0.8
#: Types whose message range is their content (see the module docstring).
RANGE_TYPES: frozenset[str] = frozenset({"synopsis", "message"})

_WS = re.compile(r"\s+")
_SCORE_KIND = "weighted_score"


def _norm(text: str) -> str:
    # NL without the 600-unit cut: two long texts sharing their first 600 characters are not duplicates.
    return _WS.sub(" ", text.replace("\r\n", "\n")).strip().lower()


def dedup_text_key(node: Node) -> str:
    """The exact-duplicate text of ``node``: ``""`` when it has no summary, insight or title (a bare name
    never collapses).

    >>> dedup_text_key(Node(id="e", type="event", fields={"title": "Dragon  Attack", "summary": "It burned"}))
    'it burned | dragon attack'
    """
    parts: list[str] = []
    content = False
    for key in DEDUP_TEXT_FIELDS:
        for value in node.field_text(key):
            norm = _norm(value)
            if norm:
                parts.append(norm)
                content = content or key != "name"
    return " | ".join(parts) if content else ""


def _text_keys(snapshot: GraphSnapshot, idx: list[int]) -> list[tuple[str, str] | None]:
    """``(scope owner key, dedup_text_key)`` of each node of ``idx`` (``None`` without text). Each node's key is
    computed once per snapshot (nodes never change inside one) and kept in the per-snapshot cache."""
    known: dict[int, tuple[str, str] | None]
    known, _ = cached(snapshot, ("dedup-text-keys",), dict)
    out: list[tuple[str, str] | None] = []
    for i in idx:
        if i in known:
            out.append(known[i])
            continue
        text = dedup_text_key(snapshot.node(i))
        key = (str(snapshot.scope_owner_key[i]), text) if text else None
        known[i] = key
        out.append(key)
    return out


class DedupStage:
    """Collapse exact-text and overlapping-range duplicates among the top scored rows; see the module
    docstring for the contract.

    Usage: ``DedupStage(settings.selection, settings.diversity).run(state)`` (``DedupStage()`` uses the
    default sizes).
    """

    name = "dedup"

    def __init__(
        self,
        selection: SelectionSettings | None = None,
        diversity: DiversitySettings | None = None,
        *,
        overlap_ratio: float = OVERLAP_RATIO,
        range_types: frozenset[str] = RANGE_TYPES,
    ) -> None:
        self.selection = selection
        self.diversity = diversity
        self.overlap_ratio = overlap_ratio
        self.range_types = range_types

    def window(self) -> int:
        """How many leading rows are examined: every row DPP or the rerank can see."""
        sel = self.selection or SelectionSettings()
        div = self.diversity or DiversitySettings()
        llm_pool = max(sel.max_recall_nodes, sel.llm_candidate_pool)
        return max(llm_pool, sel.top_k) * max(1, div.candidate_multiplier)

    def run(self, state: RecallState) -> StageResult:
        with timed() as elapsed:
            new_state, trace_fields = self._run(state)
        return StageResult(new_state, StageTrace(name=self.name, elapsed_ms=elapsed[0], **trace_fields))

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        if not 0 < self.overlap_ratio <= 1:
            raise ValueError(
                f"The 'overlap_ratio' parameter must be in (0, 1]. Got {self.overlap_ratio} instead."
            )
        base: dict[str, Any] = {"score_kind": _SCORE_KIND, "score_direction": "higher_is_better"}
        table = state.scored
        total = len(table)
        if total == 0:
            return state, {**base, "skipped": True, "skip_reason": "no-candidates"}
        snap = state.snapshot
        w = min(total, self.window())
        idx = np.asarray(table.index[:w], dtype=np.int64)

        # Exact text: one key id per row (−1 = no key); the owner key keeps different owners' POVs apart.
        key_ids: dict[tuple[str, str], int] = {}
        kid = np.full(w, -1, dtype=np.int64)
        for r, key in enumerate(_text_keys(snap, idx.tolist())):  # the window rows only (≤ a few hundred)
            if key is not None:
                kid[r] = key_ids.setdefault(key, len(key_ids))
        same_text = (kid[:, None] == kid[None, :]) & (kid[:, None] >= 0)

        # Range overlap among same-type, same-owner rows of a content-range type.
        start, end = snap.seq_start[idx], snap.seq_end[idx]
        codes = snap.type_code[idx]
        range_codes = [TYPE_CODE[t] for t in sorted(self.range_types) if t in TYPE_CODE]
        ok = ~np.isnan(start) & ~np.isnan(end) & np.isin(codes, range_codes)
        # Only rows of a content-range type with a finite range can overlap: the pairwise terms are computed on
        # those rows alone (often a fraction of the window) and scattered into the (w × w) matrix.
        sub = np.flatnonzero(ok)
        same_range = np.zeros((w, w), dtype=bool)
        if sub.size > 1:
            s_start, s_end, s_codes = start[sub], end[sub], codes[sub]
            wide = s_end > s_start
            # Owner keys as integer codes (first-seen order; only equality is used): one comparison of codes
            # instead of a quadratic number of string comparisons.
            owner_ids: dict[str, int] = {}
            owners = np.array(
                [owner_ids.setdefault(str(k), len(owner_ids)) for k in snap.scope_owner_key[idx[sub]].tolist()],
                dtype=np.int64,
            )
            overlap = np.minimum(s_end[:, None], s_end[None, :]) - np.maximum(s_start[:, None], s_start[None, :]) + 1
            length = s_end - s_start + 1
            shorter = np.minimum(length[:, None], length[None, :])
            ratio = np.where(shorter > 0, overlap / np.where(shorter > 0, shorter, 1), 0.0)
            same_range[np.ix_(sub, sub)] = (
                (wide[:, None] | wide[None, :])
                & (s_codes[:, None] == s_codes[None, :])
                & (owners[:, None] == owners[None, :])
                & (ratio >= self.overlap_ratio)
            )

        dup = same_text | same_range
        kept = np.ones(w, dtype=bool)
        collapsed: dict[int, list[int]] = {}
        reasons: dict[int, str] = {}
        # Only a row with a duplicate above it can collapse: visit those in ranking order (usually none or few).
        for r in np.flatnonzero(np.tril(dup, -1).any(axis=1)).tolist():
            prior = np.flatnonzero(kept[:r] & dup[r, :r])
            if prior.size:
                j = int(prior[0])
                kept[r] = False
                collapsed.setdefault(j, []).append(r)
                reasons[r] = "exact-text" if same_text[r, j] else "range-overlap"

        ids = snap.ids
        notes = {
            "window": w,
            "exact_text": sum(1 for v in reasons.values() if v == "exact-text"),
            "range_overlap": sum(1 for v in reasons.values() if v == "range-overlap"),
        }
        meta = {
            "dedupCollapsed": {
                ids[int(idx[j])]: [ids[int(idx[r])] for r in rows] for j, rows in sorted(collapsed.items())
            },
            "dedupReasons": {ids[int(idx[r])]: reason for r, reason in sorted(reasons.items())},
        }
        if not reasons:
            new_state = state.evolve(meta=state.with_meta(**meta))
            return new_state, {**base, "count_in": total, "count_out": total, "notes": notes}
        keep_rows = np.concatenate([np.flatnonzero(kept), np.arange(w, total, dtype=np.int64)])
        new_table = take_rows(table, keep_rows)
        new_state = state.evolve(scored=new_table, meta=state.with_meta(**meta))
        return new_state, {**base, "count_in": total, "count_out": len(new_table), "notes": notes}
