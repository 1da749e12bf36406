"""Anchor stage: entity anchors — active nodes whose name or title occurs in the user message (reference
§3.8).

Reads
    ``state.query.user_message``, ``state.active`` (the ranking set; falls back to non-archived nodes with a
    finite range when unset), ``snapshot.anchor_index`` (anchor term → node indices),
    ``snapshot.anchor_lengths`` and ``snapshot.anchor_terms`` (per node: name then title values of JS length ≥
    2, reference §1.2).
Writes
    ``state.anchors``: ``(node index, term)`` pairs, one per node, in node graph order (the order the
    reference walks its candidates); ``term`` is the node's own anchor term as stored (not the message's
    spelling). Meta ``anchorCount``.
Matching
    A node anchors with the **first** of its anchor terms that occurs in ``NQ(userMessage)``. Latin and other
    spaced scripts match case- and accent-insensitively on word boundaries; CJK ideographs, kana and Hangul by
    substring (:mod:`memory_recall.text.mentions`). Scenario 7: ``艾琳在钟楼`` over ``{a: name 艾琳}``,
    ``{b: title 钟楼, name X}``, ``{c: name A}`` → ``[(a, 艾琳), (b, 钟楼)]`` (one-character names never
    anchor).
Cost
    Never a loop over all nodes or all terms per recall: the folded term → nodes index is built once per
    snapshot (cached), then every substring of the message with one of the snapshot's distinct term lengths is
    looked up — O(len(message) × #distinct lengths) dict lookups — and only the hit nodes are examined.
Settings
    ``AnchorSettings.enabled`` (``energy``, 2.0, is the diffusion stage's seed energy).
Skip reasons
    ``anchors-disabled`` (settings; trace only), ``empty-message``, ``no-anchor-terms`` (the graph has no name
    or title of length ≥ 2).
Departures
    * recall-spec 8 (§7 item 16): the reference matches case-sensitive raw substrings, so ``Ann`` anchored on
      ``Announcement`` and ``alice`` never anchored ``Alice``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import active_mask, cached
from memory_recall.pipeline.state import RecallState, TimedStage
from memory_recall.settings import AnchorSettings
from memory_recall.store.snapshot import GraphSnapshot, StructureChange
from memory_recall.text.mentions import fold, term_at_boundaries
from memory_recall.text.normalize import normalize_query

__all__ = ["AnchorStage", "find_anchors"]


@dataclass(frozen=True)
class _FoldedAnchors:
    """Per snapshot: folded anchor term → node indices (graph order, unique); for each two-character prefix of
    a folded term, the lengths of the folded terms starting with it (descending); the one-character terms
    (an astral character has JS length 2)."""

    index: dict[str, tuple[int, ...]]
    lengths_by_prefix: dict[str, tuple[int, ...]]
    single: frozenset[str]
    #: The snapshot's raw index this was folded from (its lists are shared along deltas: an unchanged term's list is
    #: the same object in the next snapshot), and whether two of its terms fold alike.
    raw: dict[str, tuple[int, ...]]
    merged: bool


def _folded_anchors(snapshot: GraphSnapshot) -> _FoldedAnchors:
    """The snapshot's :class:`_FoldedAnchors`, built once per snapshot (one pass over the distinct terms)."""

    def build() -> _FoldedAnchors:
        terms = snapshot.anchor_index
        folded = list(map(fold, terms))
        if len(set(folded)) == len(folded):
            # The usual case: no two terms fold alike, so only node lists of several entries need sorting.
            index = {
                k: v if len(v) < 2 else tuple(sorted(set(v))) for k, v in zip(folded, terms.values(), strict=True)
            }
        else:
            merged: dict[str, set[int]] = {}
            for term, nodes in zip(folded, terms.values(), strict=True):
                merged.setdefault(term, set()).update(nodes)
            index = {k: tuple(sorted(v)) for k, v in merged.items()}
        lengths_by_prefix, single = _lengths(index)
        return _FoldedAnchors(index=index, lengths_by_prefix=lengths_by_prefix, single=single, raw=terms,
                              merged=len(index) != len(terms))

    def update(previous: _FoldedAnchors, change: StructureChange) -> _FoldedAnchors | None:
        if not change.appended_only:
            return _refolded(previous, snapshot.anchor_index)
        # An append only adds the new nodes (last in graph order) to their terms' lists, and new terms last.
        added: dict[str, list[int]] = {}
        for i in range(change.appended, change.n_new):
            if not snapshot.archived[i]:
                for term in snapshot.anchor_terms[i]:
                    added.setdefault(fold(term), []).append(i)
        if not added:
            return _FoldedAnchors(previous.index, previous.lengths_by_prefix, previous.single,
                                  snapshot.anchor_index, previous.merged)
        index = dict(previous.index)
        lengths = {k: set(v) for k, v in previous.lengths_by_prefix.items() if k in {t[:2] for t in added}}
        prefixes = dict(previous.lengths_by_prefix)
        single = set(previous.single)
        for term, nodes in added.items():
            index[term] = tuple(sorted({*index.get(term, ()), *nodes}))
            if len(term) > 1:
                lengths.setdefault(term[:2], set()).add(len(term))
            elif len(term) == 1:
                single.add(term)
        for k, v in lengths.items():
            prefixes[k] = tuple(sorted(v, reverse=True))
        # The raw index's new terms fold to keys of their own only when the folded index grew by as many.
        grew = len(index) - len(previous.index) == len(snapshot.anchor_index) - len(previous.raw)
        return _FoldedAnchors(index=index, lengths_by_prefix=prefixes, single=frozenset(single),
                              raw=snapshot.anchor_index, merged=previous.merged or not grew)

    value, _ = cached(snapshot, ("anchors", "folded-index"), build, update, recipe=_folded_anchors)
    return value


def _lengths(index: dict[str, tuple[int, ...]]) -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
    """For each two-character prefix of the folded terms, their lengths (descending), and the one-character
    terms. fold() keeps lengths, so these are the snapshot's anchor_lengths restricted to each prefix's terms."""
    lengths: dict[str, set[int]] = {}
    single: list[str] = []
    for term in index:
        if len(term) > 1:
            lengths.setdefault(term[:2], set()).add(len(term))
        elif len(term) == 1:
            single.append(term)
    return {k: tuple(sorted(v, reverse=True)) for k, v in lengths.items()}, frozenset(single)


def _refolded(previous: _FoldedAnchors, raw: dict[str, tuple[int, ...]]) -> _FoldedAnchors | None:
    """``previous`` for the snapshot whose raw anchor index is ``raw``, after any change (nodes deleted, moved or
    rewritten): only the terms whose node list is not the very list ``previous`` was folded from are folded
    again, so a delta that kept most lists (they are shared along deltas) costs one identity test per term.
    ``None`` (build) when two terms fold alike, or when the kept terms' order changed (a build's key order
    follows the raw index's)."""
    old = previous.raw
    if raw is old:
        return previous
    if previous.merged:
        return None
    gone = [t for t in old if t not in raw]
    changed = [t for t, v in raw.items() if old.get(t) is not v]
    if not gone and not changed:
        return _FoldedAnchors(previous.index, previous.lengths_by_prefix, previous.single, raw, False)
    if 2 * (len(gone) + len(changed)) > len(raw):
        return None  # most terms changed: a build is as cheap
    added = [t for t in changed if t not in old]
    kept = len(raw) - len(added)
    if added and next(itertools.islice(raw, kept, None)) != added[0]:
        return None  # a new term before an old one: the build's order differs
    if gone and [t for t in raw if t in old] != [t for t in old if t in raw]:
        return None
    index = dict(previous.index)
    for term in gone:
        del index[fold(term)]
    for term in changed:
        key = fold(term)
        if term not in old and key in index:
            return None  # a new term folds like an old one: their lists merge
        v = raw[term]
        index[key] = v if len(v) < 2 else tuple(sorted(set(v)))
    if len(index) != len(raw):
        return None
    if gone or added:
        lengths_by_prefix, single = _lengths(index)
    else:
        lengths_by_prefix, single = previous.lengths_by_prefix, previous.single
    return _FoldedAnchors(index, lengths_by_prefix, single, raw, False)


def find_anchors(snapshot: GraphSnapshot, message: str, active: np.ndarray) -> list[tuple[int, str]]:
    """``(node index, term)`` anchors of ``message`` among the ``active`` nodes, in node order."""
    text = fold(normalize_query(message))
    if not text or not snapshot.anchor_index:
        return []
    folded = _folded_anchors(snapshot)
    index, lengths_by_prefix, single = folded.index, folded.lengths_by_prefix, folded.single
    matched: set[str] = set()
    size = len(text)
    # Only the lengths of the terms sharing the two characters at ``start`` can match there, so each position
    # costs one prefix lookup plus one lookup per such length (not one per distinct term length).
    for start in range(size):
        lengths = lengths_by_prefix.get(text[start : start + 2], ())
        if single and text[start] in single:
            lengths = (*lengths, 1)
        for length in lengths:
            end = start + length
            if end > size:
                continue
            piece = text[start:end]
            if piece in index and piece not in matched and term_at_boundaries(text, start, end):
                matched.add(piece)
    if not matched:
        return []
    nodes = sorted({i for term in matched for i in index[term] if active[i]})
    anchors: list[tuple[int, str]] = []
    for i in nodes:
        for term in snapshot.anchor_terms[i]:
            if fold(term) in matched:
                anchors.append((i, term))
                break
    return anchors


class AnchorStage(TimedStage):
    """Find the entity anchors of the user message (see the module docstring)."""

    name = "anchors"

    def __init__(self, settings: AnchorSettings) -> None:
        self.settings = settings

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        base: dict[str, Any] = {"score_kind": "none", "score_direction": "none"}
        snap = state.snapshot
        reason = ""
        if not self.settings.enabled:
            reason = "anchors-disabled"
        elif not normalize_query(state.query.user_message):
            reason = "empty-message"
        elif not snap.anchor_index:
            reason = "no-anchor-terms"
        if reason:
            new_state = (
                state if reason == "anchors-disabled" else state.evolve(skip_reasons=state.with_skip(reason))
            )
            return new_state, {**base, "count_in": 0, "count_out": 0, "skipped": True, "skip_reason": reason}
        act = active_mask(state)
        anchors = find_anchors(snap, state.query.user_message, act)
        meta = state.with_meta(anchorCount=len(anchors))
        notes = {"terms": sorted({term for _, term in anchors})}
        return state.evolve(anchors=tuple(anchors), meta=meta), {
            **base,
            "count_in": int(np.count_nonzero(act)),
            "count_out": len(anchors),
            "notes": notes,
        }
