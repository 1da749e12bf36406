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
import threading
from typing import Any

import numpy as np

from memory_recall.model.graph import Node
from memory_recall.pipeline._graph_cache import cached, carry_rows
from memory_recall.pipeline.scoring import take_rows
from memory_recall.pipeline.state import RecallState, TimedStage
from memory_recall.settings import DiversitySettings, SelectionSettings
from memory_recall.store.snapshot import TYPE_CODE, GraphSnapshot, StructureChange

__all__ = ["DEDUP_TEXT_FIELDS", "OVERLAP_RATIO", "RANGE_TYPES", "DedupStage", "dedup_text_key"]

#: Fields whose values form the exact-duplicate text (leading keys of the reference's embedding text).
DEDUP_TEXT_FIELDS: tuple[str, ...] = ("summary", "insight", "title", "name")
#: Recall-spec "Dedup before rerank": ≥ 80 % of the same message range.
OVERLAP_RATIO = 0.8
#: Types whose message range is their content (see the module docstring).
RANGE_TYPES: frozenset[str] = frozenset({"synopsis", "message"})

_WS = re.compile(r"\s+")
_SCORE_KIND = "weighted_score"
_NO_KEY, _UNKNOWN = -1, -2  # text-key numbers: no key (never collapses by text), not computed yet


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


class _SnapshotKeys:
    """What dedup derives from one snapshot, in one per-snapshot cache entry.

    ``text_id[i]`` numbers node ``i``'s ``(scope owner key, dedup_text_key)`` (equal keys, equal numbers; ``-1``:
    no key), computed the first time the node is examined (nodes never change inside a snapshot), ``-2`` before;
    4 bytes per node plus the keys seen so far. ``ranges`` holds two (n,) masks per range-type set (2 bytes per
    node). ``numbers`` (the key → number table) and ``lock`` are shared by the entries a chain of deltas derived
    from one another (:func:`_updated_keys`): a number only has to mean the same key within one entry, and a shared
    table numbers a key once for all of them.
    """

    def __init__(self, n: int, numbers: dict[tuple[str, str], int] | None = None,
                 lock: threading.Lock | None = None) -> None:
        self.text_id = np.full(n, _UNKNOWN, dtype=np.int32)
        self.numbers: dict[tuple[str, str], int] = {} if numbers is None else numbers
        self.ranges: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}
        self.lock = threading.Lock() if lock is None else lock  # numbering new keys (recalls may share them)


#: A chain of deltas shares one key → number table (:class:`_SnapshotKeys`), and each edited text adds a key that
#: stays after the node is rewritten again. Past this many keys per node of the graph (and
#: :data:`MIN_KEYS_KEPT`), the next structure starts a table of its own, numbering only what its recalls examine.
MAX_KEYS_PER_NODE = 2
MIN_KEYS_KEPT = 4096


def _snapshot_keys(snapshot: GraphSnapshot) -> _SnapshotKeys:
    def update(old: _SnapshotKeys, change: StructureChange) -> _SnapshotKeys | None:
        if len(old.numbers) > max(MAX_KEYS_PER_NODE * change.n_new, MIN_KEYS_KEPT):
            return None  # built: a fresh table (a number only has to mean the same key within one entry)
        return _updated_keys(snapshot, old, change)

    value, _ = cached(snapshot, ("dedup-keys",), lambda: _SnapshotKeys(snapshot.n), update, recipe=_snapshot_keys)
    return value


def _updated_keys(snapshot: GraphSnapshot, old: _SnapshotKeys, change: StructureChange) -> _SnapshotKeys:
    """The parent structure's text-key numbers for the nodes a delta left unchanged (a node's number reads only
    its own owner key and fields); the new and rewritten nodes are numbered when first examined. The range masks
    read only each node's own type and range: carried likewise, the rewritten and new nodes' entries derived
    again. O(n) in numpy, O(changed) in Python; the number table is shared, not copied."""
    out = _SnapshotKeys(change.n_new, old.numbers, old.lock)
    out.text_id = carry_rows(old.text_id, change, _UNKNOWN)
    rows = np.concatenate([np.asarray(change.rewritten, dtype=np.int64),
                           np.arange(change.appended, change.n_new, dtype=np.int64)])
    for types, (eligible, wide) in list(old.ranges.items()):
        new_eligible, new_wide = carry_rows(eligible, change, False), carry_rows(wide, change, False)
        new_eligible[rows], new_wide[rows] = _range_masks(snapshot, types, rows)
        out.ranges[types] = (new_eligible, new_wide)
    return out


def _text_ids(snapshot: GraphSnapshot, keys: _SnapshotKeys, idx: np.ndarray) -> np.ndarray:
    """The text-key number of each node of ``idx`` (``-1``: no key); see :class:`_SnapshotKeys`."""
    ids = keys.text_id[idx]
    new = ids == _UNKNOWN
    if bool(new.any()):  # nodes examined for the first time in this snapshot
        with keys.lock:
            for i in idx[new].tolist():
                if keys.text_id[i] == _UNKNOWN:
                    text = dedup_text_key(snapshot.node(i, keep=False))  # the number is kept, not the model
                    key = (str(snapshot.scope_owner_key[i]), text)
                    keys.text_id[i] = keys.numbers.setdefault(key, len(keys.numbers)) if text else _NO_KEY
        ids = keys.text_id[idx]
    return ids


def _range_masks(
    snapshot: GraphSnapshot, types: tuple[str, ...], rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(eligible, wide)`` of the nodes at ``rows`` (every node when None): see :func:`_range_rows`."""
    start, end, type_code = snapshot.seq_start, snapshot.seq_end, snapshot.type_code
    if rows is not None:
        start, end, type_code = start[rows], end[rows], type_code[rows]
    # Type code → in ``types``, as a table (codes are NODE_TYPES indices, −1 for an unknown type: the last entry).
    member = np.zeros(len(TYPE_CODE) + 1, dtype=bool)
    member[[TYPE_CODE[t] for t in types if t in TYPE_CODE]] = True
    eligible = ~np.isnan(start) & ~np.isnan(end) & member[type_code]
    return eligible, eligible & (end > start)


def _range_rows(
    snapshot: GraphSnapshot, keys: _SnapshotKeys, range_types: frozenset[str]
) -> tuple[np.ndarray, np.ndarray]:
    """``(eligible, wide)``: (n,) masks of the nodes of a type of ``range_types`` with a finite message range,
    and of those whose range spans more than one floor; built once per snapshot and type set (kept in
    ``keys``)."""
    ranges = keys.ranges
    types = tuple(sorted(range_types))
    masks = ranges.get(types)
    if masks is None:
        masks = ranges[types] = _range_masks(snapshot, types)
    return masks


class DedupStage(TimedStage):
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
        rows = idx.tolist()
        cache = _snapshot_keys(snap)
        # Exact text: equal key numbers (the owner key keeps different owners' POVs apart); -1 = no key.
        keys = _text_ids(snap, cache, idx).tolist()  # the window rows only (≤ a few hundred)
        range_prior = self._range_prior(snap, cache, idx)
        texts = [k for k in keys if k >= 0]
        kept = [True] * w
        collapsed: dict[int, list[int]] = {}
        reasons: dict[int, str] = {}
        if range_prior or len(set(texts)) < len(texts):  # else no row has a duplicate: nothing collapses
            # Rows in ranking order; a row collapses into the best-ranked kept row it duplicates. Kept rows never
            # change afterwards, so the best kept row of a text is the first kept one.
            first_kept: dict[int, int] = {}
            for r, key in enumerate(keys):
                j = first_kept.get(key, w) if key >= 0 else w
                for p in range_prior.get(r, ()):
                    if p >= j:
                        break
                    if kept[p]:
                        j = p
                        break
                if j < w:
                    kept[r] = False
                    collapsed.setdefault(j, []).append(r)
                    reasons[r] = "exact-text" if key >= 0 and keys[j] == key else "range-overlap"
                elif key >= 0:
                    first_kept[key] = r

        ids = snap.ids
        notes = {
            "window": w,
            "exact_text": sum(1 for v in reasons.values() if v == "exact-text"),
            "range_overlap": sum(1 for v in reasons.values() if v == "range-overlap"),
        }
        meta = {
            "dedupCollapsed": {
                ids[rows[j]]: [ids[rows[r]] for r in dropped] for j, dropped in sorted(collapsed.items())
            },
            "dedupReasons": {ids[rows[r]]: reason for r, reason in sorted(reasons.items())},
        }
        if not reasons:
            new_state = state.evolve(meta=state.with_meta(**meta))
            return new_state, {**base, "count_in": total, "count_out": total, "notes": notes}
        keep_rows = np.concatenate([np.flatnonzero(kept), np.arange(w, total, dtype=np.int64)])
        new_table = take_rows(table, keep_rows)
        new_state = state.evolve(scored=new_table, meta=state.with_meta(**meta))
        return new_state, {**base, "count_in": total, "count_out": len(new_table), "notes": notes}

    def _range_prior(self, snap: GraphSnapshot, cache: _SnapshotKeys, idx: np.ndarray) -> dict[int, list[int]]:
        """``{window row: [better-ranked window rows it range-overlaps, ascending]}`` for the rows with such a
        duplicate (usually none). A pair needs a row spanning more than one floor, so only those rows are
        compared (with every row of a content-range type)."""
        eligible, wide = _range_rows(snap, cache, self.range_types)
        if not bool(wide[idx].any()):
            return {}
        sub = np.flatnonzero(eligible[idx])
        nodes = idx[sub]
        start, end, codes = snap.seq_start[nodes], snap.seq_end[nodes], snap.type_code[nodes]
        # Owner keys as integer codes (first-seen order; only equality is used).
        owner_ids: dict[str, int] = {}
        owners = np.array(
            [owner_ids.setdefault(str(k), len(owner_ids)) for k in snap.scope_owner_key[nodes].tolist()],
            dtype=np.int64,
        )
        a = np.flatnonzero(wide[nodes])  # positions (in ``sub``) of the multi-floor rows
        overlap = np.minimum(end[a, None], end[None, :]) - np.maximum(start[a, None], start[None, :]) + 1
        length = end - start + 1
        shorter = np.minimum(length[a, None], length[None, :])
        ratio = np.where(shorter > 0, overlap / np.where(shorter > 0, shorter, 1), 0.0)
        same = (codes[a, None] == codes[None, :]) & (owners[a, None] == owners[None, :]) & (ratio >= self.overlap_ratio)
        prior: dict[int, set[int]] = {}
        for x, y in np.argwhere(same).tolist():
            r1, r2 = int(sub[a[x]]), int(sub[y])
            if r1 != r2:
                prior.setdefault(max(r1, r2), set()).add(min(r1, r2))
        return {r: sorted(js) for r, js in prior.items()}
