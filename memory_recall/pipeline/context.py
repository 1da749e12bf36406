"""Context stage: scene owners, active region, story context and cue mode before any scoring (reference §3.1).

Reads
    ``state.query`` (user message, recent lines, the host's owner/region/story hints, ``active_owner_keys``)
    and the snapshot's ``knowledge`` / ``knowledge_state`` (owners), ``history``, ``regions``, ``timeline``,
    ``region_primary``, ``archived``, ``seq_end``.
Writes
    ``state.context`` (:class:`~memory_recall.pipeline.state.ContextInfo`) and meta (reference §3.21):
    ``activeRegion``, ``activeRegionSource``, ``adjacentRegions``, ``activeStorySegmentId``,
    ``activeStoryTimeLabel``, ``activeStoryTimeSource``, ``activeCharacterPovOwner``, ``activeUserPovOwner``,
    ``activeRecallOwnerKey`` (first owner or ``""``), ``activeRecallOwnerKeys``, ``activeRecallOwnerScores``
    (key → score), ``sceneOwnerResolutionMode``, ``sceneOwnerCandidates`` (ownerKey, ownerName, score (3 dp),
    sources, reasons); plus ``activeCharacterPovOwners``, the owners' names (the reference's scope context
    field of that name, §3.20), which the scope buckets compare with.
Owner catalog (§1.5)
    Knowledge owners of type character with a key and a name, ordered by ``updated_at`` desc then name (code
    point order instead of the reference's zh collation: departure 10), aliases ``[ownerName, *aliases]``.
Legacy single owner
    The first of ``query.active_character_pov_owner``, ``history.active_character_pov_owner``,
    ``query.host_character_name`` that names exactly one catalog owner (exact ``ownerName``) whose entry has a
    ``node_id``: it is ``activeCharacterPovOwner`` and a candidate with 0.6 (``legacy-unique-match``).
Scene-owner candidates
    legacy 0.6; text mention 0.8 (``recent-message``: the longest alias of JS length ≥ 2 found in
    ``NQ(userMessage, 800)`` or any ``NQ(recent line, 800)``); recently active 0.35 (``recent-active``:
    catalog by ``updated_at`` desc, then owner node recency desc, first 4). Merged per owner key (scores
    summed, sources and reasons accumulated), ordered by score desc then name then key, at most 8.
Preliminary owners
    Candidates with score ≥ 0.55, first 4, scores ``min(1, s)`` rounded to 3 decimals, mode ``heuristic``
    (``unresolved`` when none qualifies). Caller-given ``query.active_owner_keys`` (not None) are final
    instead: mode ``request``, score 1 each; a key resolves to the catalog owner with or without ``#nodeId``.
Active region (§1.6)
    First non-empty of: ``regions.manual_active_region`` (``manual``); ``query.active_region``
    (``history.active_region_source`` or ``runtime``); ``history.active_region`` (``history``);
    ``history.last_extracted_region`` (``extract``); ``regions.recent_regions[0]`` (``recent``); the primary
    region of the first non-archived node in graph order (``graph``); each canonicalised through the adjacency
    map (exact or alias, case-insensitive). The reference's last fallback ("the most recent node that has a
    region") is subsumed by the ``graph`` step, which already finds a region whenever any node has one, so it
    is not repeated. Adjacent regions: the active region's adjacency list when ``enable_spatial_adjacency``.
Story context (§1.7, only when ``enable_story_timeline``)
    First hit of: ``timeline.manual_active_segment_id`` (``manual``); ``query.active_story_segment_id`` then
    ``query.active_story_time_label`` (label/alias/key match, case-insensitive; ``runtime``);
    ``history.active_story_segment_id`` then ``history.active_story_time_label``
    (``history.active_story_time_source`` or ``history``); ``history.last_extracted_story_segment_id``
    (``extract``); the first existing id of ``timeline.recent_segment_ids`` (``recent``). Ids must name an
    existing segment (its ``order`` is what scoring compares); otherwise unresolved.
Cue mode (§3.12 step 4)
    ``flashback`` if a flashback cue occurs, else ``future`` if a future cue occurs, else ``none``.
Settings
    ``ContextSettings``: ``enable_spatial_adjacency``, ``enable_story_timeline`` (the scope/knowledge switches
    are read by the scoring stage).
Skip reasons
    ``empty-input``: no node, owner, region or story segment and no text: nothing to resolve.
Departures
    * recall-spec 2 / §7 items 4–5: caller-named owners are final; owner keys match with or without
      ``#nodeId``.
    * recall-spec 8 / §7 item 16: aliases and cues are matched by :mod:`memory_recall.text.mentions` — Latin
      (and other spaced scripts) case- and accent-insensitively on word boundaries (``Ann`` no longer matches
      ``Announcement``), CJK/kana/Hangul by substring. Cues include a short English list
      (:data:`FLASHBACK_CUES_EN`, :data:`FUTURE_CUES_EN`) and are scanned in the user message and the newest
      assistant line only (an old ``明天`` in the context no longer switches future nodes on).
    * Recent lines that parse as ``role: text`` are matched without their role prefix (an alias ``AI`` is not
      "mentioned" by every ``ai:`` line).
    * recall-spec 10: ties by code point order of names, then owner key.
    * recall-spec 11: no Python loop over nodes; the per-snapshot "has a primary region" mask is cached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_recall.model.state import HistoryState, RegionState, StorySegment, TimelineState
from memory_recall.pipeline._graph_cache import cached
from memory_recall.pipeline.query_plan import parse_context_line
from memory_recall.pipeline.state import (
    ContextInfo,
    OwnerCandidate,
    RecallQuery,
    RecallState,
    TimedStage,
)
from memory_recall.settings import ContextSettings
from memory_recall.store.snapshot import GraphSnapshot, StructureChange
from memory_recall.text.mentions import fold, term_occurs
from memory_recall.text.normalize import js_len, normalize_query

__all__ = [
    "FLASHBACK_CUES",
    "FLASHBACK_CUES_EN",
    "FUTURE_CUES",
    "FUTURE_CUES_EN",
    "ContextStage",
    "detect_cue_mode",
    "resolve_active_region",
    "resolve_story_context",
]

# Scene-owner constants (reference §5.3).
LEGACY_SCORE = 0.6
MENTION_SCORE = 0.8
RECENT_ACTIVE_SCORE = 0.35
RECENT_ACTIVE_COUNT = 4
OWNER_MIN_SCORE = 0.55
MAX_OWNERS = 4
MAX_CANDIDATES = 8
OWNER_TEXT_LIMIT = 800  # "owner text 800"

#: Chinese story cues of the reference (§3.12 step 4), in its order.
FLASHBACK_CUES_ZH = ("曾经", "以前", "当年", "从前", "回忆", "过去", "背景", "来历", "小时候", "往事")
FUTURE_CUES_ZH = ("未来", "以后", "之后会", "将要", "明天", "预告", "计划", "打算", "准备", "承诺")
#: English cues added by departure 8 (matched as whole words/phrases, case-insensitively). Kept short on
#: purpose: every entry also fires on unrelated uses ("Will" the name, "plan" as a noun), and a future cue
#: only un-suppresses future-tense nodes (weight 0.74) while a flashback cue rescues past ones.
FLASHBACK_CUES_EN = tuple(
    "remember|remembered|recall|back when|back then|used to|years ago|long ago|as a child|childhood|"
    "originally|in the past".split("|")
)
FUTURE_CUES_EN = tuple(
    "tomorrow|next week|next month|next year|will|going to|gonna|plan|plans|planning|promise|promised|"
    "someday|in the future".split("|")
)
FLASHBACK_CUES = FLASHBACK_CUES_ZH + FLASHBACK_CUES_EN
FUTURE_CUES = FUTURE_CUES_ZH + FUTURE_CUES_EN


def detect_cue_mode(texts: Sequence[str]) -> str:
    """``"flashback"``, ``"future"`` or ``"none"`` for the given texts (flashback wins, as in the reference).

    >>> detect_cue_mode(["以前发生过什么"]), detect_cue_mode(["What will you do?"])
    ('flashback', 'future')
    >>> detect_cue_mode(["Willow and Planet"])
    'none'
    """
    folded = [fold(t) for t in texts if t]
    # No cue holds a line break, so a cue occurs in one of the texts iff it occurs in their join: one plain
    # substring test per cue rules most of them out before the boundary-aware test.
    joined = "\n".join(folded)
    for mode, cues in (("flashback", FLASHBACK_CUES), ("future", FUTURE_CUES)):
        present = [cue for cue in cues if cue in joined]
        if any(term_occurs(t, cue) for cue in present for t in folded):
            return mode
    return "none"


def _has_primary_region(snapshot: GraphSnapshot) -> np.ndarray:
    """(n,) bool: nodes with a primary region; built once per snapshot (one pass over a tuple of strings)."""
    value, _ = cached(
        snapshot,
        ("context", "has-primary-region"),
        lambda: np.fromiter((bool(r) for r in snapshot.region_primary), dtype=bool, count=snapshot.n),
    )
    return value


def resolve_active_region(snapshot: GraphSnapshot, preferred: str = "") -> tuple[str, str]:
    """``(region, source)`` of reference §1.6 (see the module docstring); ``("", "")`` when none is known."""
    regions: RegionState = snapshot.regions
    history: HistoryState = snapshot.history
    steps = (
        (regions.manual_active_region, "manual"),
        (preferred, history.active_region_source or "runtime"),
        (history.active_region, "history"),
        (history.last_extracted_region, "extract"),
        (regions.recent_regions[0] if regions.recent_regions else "", "recent"),
    )
    for value, source in steps:
        region = regions.canonical(value or "")
        if region:
            return region, source
    if snapshot.n:
        mask = _has_primary_region(snapshot) & ~snapshot.archived
        if mask.any():
            return regions.canonical(snapshot.region_primary[int(np.argmax(mask))]), "graph"
    return "", ""


@dataclass(frozen=True)
class StoryContext:
    """The active story segment (reference §1.7)."""

    segment_id: str = ""
    label: str = ""
    order: int | None = None
    source: str = ""


def resolve_story_context(
    timeline: TimelineState,
    history: HistoryState,
    segment_id: str = "",
    label: str = "",
    *,
    by_id: Mapping[str, StorySegment] | None = None,
) -> StoryContext:
    """The active story segment from the timeline, the caller's hints and the history (reference §1.7).

    ``by_id``, when given, must be ``{segment.id: segment}`` of ``timeline`` (the stage passes a per-snapshot
    copy instead of rebuilding it every recall).
    """
    if by_id is None:
        by_id = {s.id: s for s in timeline.segments}

    def from_id(sid: str, source: str) -> StoryContext | None:
        seg = by_id.get(sid.strip()) if sid else None
        return None if seg is None else StoryContext(seg.id, seg.label, seg.order, source)

    def from_label(text: str, source: str) -> StoryContext | None:
        key = text.strip().lower()
        if not key:
            return None
        for seg in timeline.segments:
            names = (seg.label, seg.normalized_key, *seg.aliases)
            if any(n and n.strip().lower() == key for n in names):
                return StoryContext(seg.id, seg.label, seg.order, source)
        return None

    history_source = history.active_story_time_source or "history"
    attempts = (
        lambda: from_id(timeline.manual_active_segment_id, "manual"),
        lambda: from_id(segment_id, "runtime"),
        lambda: from_label(label, "runtime"),
        lambda: from_id(history.active_story_segment_id, history_source),
        lambda: from_label(history.active_story_time_label, history_source),
        lambda: from_id(history.last_extracted_story_segment_id, "extract"),
        *(lambda sid=sid: from_id(sid, "recent") for sid in timeline.recent_segment_ids),
    )
    for attempt in attempts:
        found = attempt()
        if found is not None:
            return found
    return StoryContext()


@dataclass
class _Candidate:
    key: str
    name: str
    score: float = 0.0
    sources: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def add(self, score: float, source: str, reason: str) -> None:
        self.score += score
        if source not in self.sources:
            self.sources.append(source)
        if reason not in self.reasons:
            self.reasons.append(reason)


def _newest_assistant_text(parsed_lines: Sequence[tuple[str, str] | None]) -> str:
    """The newest non-empty assistant text among the :func:`parse_context_line` results of the recent lines."""
    for parsed in reversed(parsed_lines):
        if parsed is not None and parsed[0] == "assistant" and parsed[1]:
            return parsed[1]
    return ""


def _owner_text(line: str, parsed: tuple[str, str] | None) -> str:
    """The text of a recent line an owner mention is looked for in (``parsed`` = ``parse_context_line(line)``)."""
    return parsed[1] if parsed is not None else line


@dataclass(frozen=True)
class _OwnerIndex:
    """What the context stage derives from the snapshot alone (built once per snapshot).

    ``catalog``: the owner catalog's knowledge rows (:meth:`ContextStage._catalog`); ``mention_terms[p]``: the
    ``(NQ(alias, 800), folded)`` pairs of ``catalog[p]`` of JS length ≥ 2, longest first (stable among equals);
    ``recent_active``: the first :data:`RECENT_ACTIVE_COUNT` catalog rows by ``updated_at`` desc, then owner node
    recency desc; ``segments_by_id``: the timeline's segments by id; ``row_by_key`` / ``row_by_base``: the first
    knowledge row of each lower-cased owner key / key without ``#nodeId`` (what ``KnowledgeArrays.row`` finds).
    """

    catalog: tuple[int, ...]
    mention_terms: tuple[tuple[tuple[str, str], ...], ...]
    recent_active: tuple[int, ...]
    segments_by_id: dict[str, StorySegment]
    row_by_key: dict[str, int]
    row_by_base: dict[str, int]

    def row(self, owner_key: str) -> int:
        """``KnowledgeArrays.row(owner_key)`` by two dict lookups: exact key first, then without ``#nodeId``."""
        key = owner_key.lower()
        row = self.row_by_key.get(key)
        return self.row_by_base.get(key.split("#", 1)[0], -1) if row is None else row


def _recent_active(snap: GraphSnapshot, catalog: Sequence[int]) -> tuple[int, ...]:
    """The first :data:`RECENT_ACTIVE_COUNT` catalog rows by ``updated_at`` desc, then owner node recency desc."""
    ka = snap.knowledge

    def recency(o: int) -> float:
        i = int(ka.owner_node_index[o])
        if i < 0:
            return 0.0
        end = float(snap.seq_end[i])
        return float(snap.seq[i]) if np.isnan(end) else end

    recent = sorted(catalog, key=lambda o: (-int(ka.updated_at[o]), -recency(o)))
    return tuple(recent[:RECENT_ACTIVE_COUNT])


def _owner_index(snap: GraphSnapshot) -> _OwnerIndex:
    def build() -> _OwnerIndex:
        ka = snap.knowledge
        catalog = ContextStage._catalog(snap)
        mention_terms = []
        for o in catalog:
            aliases = [normalize_query(a, OWNER_TEXT_LIMIT) for a in ka.aliases[o]]
            # Longest alias first (JS length); the stable sort keeps alias order among equals.
            aliases = sorted((a for a in aliases if js_len(a) >= 2), key=js_len, reverse=True)
            mention_terms.append(tuple((alias, fold(alias)) for alias in aliases))
        row_by_key: dict[str, int] = {}
        row_by_base: dict[str, int] = {}
        for o, key in enumerate(ka.owner_keys):
            row_by_key.setdefault(key.lower(), o)
            row_by_base.setdefault(key.lower().split("#", 1)[0], o)
        return _OwnerIndex(
            catalog=tuple(catalog),
            mention_terms=tuple(mention_terms),
            recent_active=_recent_active(snap, catalog),
            segments_by_id={seg.id: seg for seg in snap.timeline.segments},
            row_by_key=row_by_key,
            row_by_base=row_by_base,
        )

    def update(old: _OwnerIndex, change: StructureChange) -> _OwnerIndex | None:
        # A write that left the chat state alone leaves the knowledge rows, their aliases and the timeline as
        # they were; only the owner nodes' recency (their node may be new or rewritten) is read again.
        if change.state_changed:
            return None
        return dataclasses.replace(old, recent_active=_recent_active(snap, old.catalog))

    value, _ = cached(snap, ("context", "owner-index"), build, update, recipe=_owner_index)
    return value


class ContextStage(TimedStage):
    """Resolve the scene context of one recall (see the module docstring)."""

    name = "context"

    def __init__(self, settings: ContextSettings) -> None:
        self.settings = settings

    # -- owners ----------------------------------------------------------------------------------------------

    @staticmethod
    def _catalog(snap: GraphSnapshot) -> list[int]:
        """Rows of ``snap.knowledge`` that are character owners, in ``listKnowledgeOwners`` order."""
        ka = snap.knowledge
        rows = [
            o
            for o in range(len(ka.owner_keys))
            if ka.owner_types[o] == "character" and ka.owner_keys[o] and ka.owner_names[o]
        ]
        rows.sort(key=lambda o: (-int(ka.updated_at[o]), ka.owner_names[o], ka.owner_keys[o]))
        return rows

    @staticmethod
    def _legacy_owner(snap: GraphSnapshot, catalog: Sequence[int], q: RecallQuery) -> int | None:
        ka = snap.knowledge
        entries = snap.knowledge_state.owners
        for name in (
            q.active_character_pov_owner,
            snap.history.active_character_pov_owner,
            q.host_character_name,
        ):
            name = (name or "").strip()
            if not name:
                continue
            matches = [o for o in catalog if ka.owner_names[o] == name]
            if len(matches) == 1:
                entry = entries.get(ka.owner_keys[matches[0]])
                if entry is not None and entry.node_id:
                    return matches[0]
        return None

    @staticmethod
    def _candidates(
        snap: GraphSnapshot,
        owners: _OwnerIndex,
        legacy: int | None,
        q: RecallQuery,
        parsed_lines: Sequence[tuple[str, str] | None],
    ) -> list[_Candidate]:
        ka = snap.knowledge
        merged: dict[str, _Candidate] = {}

        def add(o: int, score: float, source: str, reason: str) -> None:
            key = ka.owner_keys[o]
            cand = merged.get(key)
            if cand is None:
                cand = merged[key] = _Candidate(key, ka.owner_names[o])
            cand.add(score, source, reason)

        if legacy is not None:
            add(legacy, LEGACY_SCORE, "legacy-unique-match", f"legacy:{ka.owner_names[legacy]}")

        texts = [fold(normalize_query(q.user_message, OWNER_TEXT_LIMIT))]
        texts.extend(
            fold(normalize_query(_owner_text(line, parsed), OWNER_TEXT_LIMIT))
            for line, parsed in zip(q.recent_lines, parsed_lines, strict=True)
        )
        texts = [t for t in texts if t]
        if texts:
            # Texts and aliases are NQ-normalised (no line breaks), so an alias occurs in a text iff it occurs in
            # their join: one plain substring test rules most aliases out before the boundary-aware test.
            joined = "\n".join(texts)
            for o, terms in zip(owners.catalog, owners.mention_terms, strict=True):
                for alias, term in terms:
                    if term in joined and any(term_occurs(t, term) for t in texts):
                        add(o, MENTION_SCORE, "recent-message", f"mentioned:{alias}")
                        break

        for o in owners.recent_active:
            add(o, RECENT_ACTIVE_SCORE, "recent-active", "recent-active")

        for cand in merged.values():
            cand.score = round(cand.score, 9)  # 0.6 + 0.8 + 0.35 without binary noise
        ordered = sorted(merged.values(), key=lambda c: (-c.score, c.name, c.key))
        return ordered[:MAX_CANDIDATES]

    @staticmethod
    def _request_owners(snap: GraphSnapshot, owners: _OwnerIndex, keys: Sequence[str]) -> tuple[list[str], list[str]]:
        """Caller-named owner keys resolved to catalog keys (with or without ``#nodeId``) and their names."""
        ka = snap.knowledge
        out_keys: list[str] = []
        out_names: list[str] = []
        for raw in keys:
            raw = (raw or "").strip()
            if not raw:
                continue
            row = owners.row(raw)
            if row >= 0:
                key, name = ka.owner_keys[row], ka.owner_names[row]
            else:
                base, sep, node_id = raw.partition("#")
                key = base.lower() + sep + node_id
                name = base.split(":", 1)[-1]
            if key not in out_keys:
                out_keys.append(key)
                out_names.append(name)
        return out_keys, out_names

    # -- run -------------------------------------------------------------------------------------------------

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        snap = state.snapshot
        q = state.query
        if (
            snap.n == 0
            and not snap.knowledge.owner_keys
            and not snap.regions.adjacency_map
            and not snap.timeline.segments
            and not q.user_message.strip()
            and not q.recent_lines
        ):
            # Nothing at all to resolve against: no graph, no state, no text (the runner returns §3.4's result).
            return state, {"skipped": True, "skip_reason": "empty-input"}
        ka = snap.knowledge
        history = snap.history

        owners = _owner_index(snap)
        catalog = owners.catalog
        legacy = self._legacy_owner(snap, catalog, q)
        # Each recent line is parsed once, for the owner mentions and the newest assistant text.
        parsed_lines = [parse_context_line(line) for line in q.recent_lines]
        candidates = self._candidates(snap, owners, legacy, q, parsed_lines)
        if q.active_owner_keys is not None:
            owner_keys, owner_names = self._request_owners(snap, owners, q.active_owner_keys)
            owner_scores = [1.0] * len(owner_keys)
            mode = "request"
        else:
            chosen = [c for c in candidates if c.score >= OWNER_MIN_SCORE][:MAX_OWNERS]
            owner_keys = [c.key for c in chosen]
            owner_names = [c.name for c in chosen]
            owner_scores = [round(min(1.0, c.score), 3) for c in chosen]
            mode = "heuristic" if chosen else "unresolved"

        region, region_source = resolve_active_region(snap, q.active_region)
        adjacent: tuple[str, ...] = ()
        if region and self.settings.enable_spatial_adjacency:
            entry = snap.regions.adjacency_map.get(region)
            adjacent = tuple(entry.adjacent) if entry is not None else ()

        story = (
            resolve_story_context(
                snap.timeline,
                history,
                q.active_story_segment_id,
                q.active_story_time_label,
                by_id=owners.segments_by_id,
            )
            if self.settings.enable_story_timeline
            else StoryContext()
        )
        cue_mode = detect_cue_mode([q.user_message, _newest_assistant_text(parsed_lines)])

        legacy_name = ka.owner_names[legacy] if legacy is not None else ""
        user_owner = (q.active_user_pov_owner or history.active_user_pov_owner or q.host_user_name).strip()
        context = ContextInfo(
            owner_catalog=tuple(ka.owner_keys[o] for o in catalog),
            owner_candidates=tuple(
                OwnerCandidate(c.key, c.name, c.score, tuple(c.sources), tuple(c.reasons)) for c in candidates
            ),
            owner_keys=tuple(owner_keys),
            owner_scores=tuple(owner_scores),
            owner_mode=mode,
            active_character_pov_owner=legacy_name,
            active_user_pov_owner=user_owner,
            active_region=region,
            active_region_source=region_source,
            adjacent_regions=adjacent,
            story_segment_id=story.segment_id,
            story_segment_label=story.label,
            story_segment_order=story.order,
            story_source=story.source,
            cue_mode=cue_mode,
        )
        meta = state.with_meta(
            activeRegion=region,
            activeRegionSource=region_source,
            adjacentRegions=list(adjacent),
            activeStorySegmentId=story.segment_id,
            activeStoryTimeLabel=story.label,
            activeStoryTimeSource=story.source,
            activeCharacterPovOwner=legacy_name,
            activeCharacterPovOwners=list(owner_names),
            activeUserPovOwner=user_owner,
            activeRecallOwnerKey=owner_keys[0] if owner_keys else "",
            activeRecallOwnerKeys=list(owner_keys),
            activeRecallOwnerScores=dict(zip(owner_keys, owner_scores, strict=True)),
            sceneOwnerResolutionMode=mode,
            sceneOwnerCandidates=[
                {
                    "ownerKey": c.key,
                    "ownerName": c.name,
                    "score": round(c.score, 3),
                    "sources": list(c.sources),
                    "reasons": list(c.reasons),
                }
                for c in candidates
            ],
        )
        notes = {"cueMode": cue_mode, "catalogSize": len(catalog), "candidates": len(candidates)}
        return state.evolve(context=context, meta=meta), {
            "score_kind": "owner_score",
            "score_direction": "higher_is_better",
            "count_in": len(catalog),
            "count_out": len(owner_keys),
            "notes": notes,
        }
