"""Owner stage: post-scoring scene-owner candidates, final scene owners, owner-POV augmentation and scene
reconstruction (reference §3.13, §3.16, §3.17).

Runs after the rerank (``llm_rerank``) and before probabilistic recall.

Reads
    ``state.selection`` (the rerank's choice: the LLM's picks, its fallback, or the whole candidate pool when
    no LLM is used), ``state.scored`` (ranking order, weighted scores, knowledge and temporal columns),
    ``state.context`` (preliminary or request owners, owner catalog, preliminary owner candidates),
    ``state.llm`` (status, resolved ``activeOwnerKeys`` / ``activeOwnerScores``), ``state.active``, meta
    ``visibility_hidden_mask`` / ``gate_suppressed`` / ``temporalSuppressedNodes`` /
    ``knowledgeVisibleOwnersByNode`` / ``knowledgeSuppressedOwnersByNode``, the snapshot's incident-edge CSR,
    edge arrays, types, ``seq``, ``seq_end``, importance and knowledge arrays.
Writes
    ``state.selection`` (final order, at most ``max_recall_nodes``), ``state.final_owner_keys`` /
    ``final_owner_scores`` / ``final_owner_mode``; meta (reference §3.21): ``sceneOwnerCandidates`` (merged,
    top 8), ``activeRecallOwnerKey`` (first final owner or ``""``), ``activeRecallOwnerKeys``,
    ``activeRecallOwnerScores`` (key → score), ``sceneOwnerResolutionMode``, ``activeCharacterPovOwners`` (final
    owners' names), ``selectedByBucket`` (bucket → ids, classified with the final owners), ``selectedByKnowledgeState``
    (id → gate verdict of its scored row, mode ``selected`` for an added unscored node), ``selectedByStoryTime``
    (id → label, temporal bucket and weight), ``selectedByOwner`` (owner key → ids, from the node's POV owner and
    its visible owners); this project's ``selectionOrigins`` (id → ``llm`` | ``score`` | ``owner-pov`` |
    ``scene-reconstruction``), ``ownerPovAugmented`` and ``sceneReconstructionAdded`` (id lists).
Scene-owner candidates (§3.13, :func:`scene_owner_candidates`)
    From the top ``max(llmPool, 12)`` scored rows (``llmPool = max(maxRecallNodes, llmCandidatePool)``): a
    ``pov_memory`` node of a character owner → that owner (resolved against the knowledge catalog by key with
    or without ``#nodeId``, by name/alias, or by the owner's node id; else the scope's own key and name) with
    ``1.0 + min(0.8, w/8)``, source ``candidate-pov-owner``; any other node → every catalog owner whose longest
    alias (JS length ≥ 2) occurs in its participants/summary/state/title/name/status text with ``0.9 + min(0.6,
    w/10)``, source ``objective-participant`` (``w`` = weighted score). Merged into the preliminary candidates of
    the context stage (scores summed, sources/reasons accumulated), ordered by score desc, name, key; top 8.
    The rerank stage calls the same function for its prompt and to resolve the LLM's owner keys.
Final owners (§3.16 step 1)
    Owners named in the request (``context.owner_mode == "request"``) are final: mode ``request``. Otherwise
    the LLM's resolved owners when the rerank succeeded with at least one (≤ 4, its scores or the candidate's
    score capped at 1; mode ``llm``), else the candidates with score ≥ 0.55, first 4, scores ``min(1, s)`` to 3
    decimals: mode ``fallback`` when an LLM answered or failed, ``heuristic`` without LLM, ``unresolved`` when
    nobody qualifies.
Owner-POV augmentation (§3.16 step 2)
    For each final owner, its best-ranked scored ``pov_memory`` node is put in front (in owner order), also when
    it is already selected; the list is de-duplicated and cut to ``max_recall_nodes``.
Top-ranked rows kept (``OwnerSettings.keep_top_ranked``, default 5; 0 = the reference)
    After scene reconstruction, each of the first ``keep_top_ranked`` rows of the ranking (``state.scored``
    order) that is in the selection but was crowded out of the cap by reconstructed neighbours takes the place
    of the last reconstruction addition (appended at the end, in ranking order). Reconstruction then never
    costs the recall its best-ranked memories.
Scene reconstruction (§3.16 step 3; ``OwnerSettings.enable_scene_reconstruction``)
    For each selected node in order, add it, then: an **event** adds its neighbours (active edges, edge order)
    of type character, location, thread, reflection or pov_memory, then the 2 events nearest in ``seq``
    (``|seq − s|``, ties → higher seq first, then node id; the event itself excluded; not expanded further);
    a **pov_memory** adds its 2 most recent neighbours (recency = ``seqRange[1]``, then importance, then id),
    expanding an event as above; a **character/location** adds its 2 most recent neighbouring events, each
    expanded. Stops at ``max_recall_nodes``; duplicates are skipped. Nearest events are found by one
    ``lexsort`` over the admissible events (no Python loop over nodes).
Settings
    ``OwnerSettings.enable_scene_reconstruction``; ``SelectionSettings`` (``max_recall_nodes``,
    ``llm_candidate_pool``); ``ContextSettings`` and ``ScoringSettings`` for the gate of nodes the score map
    never held (:mod:`memory_recall.pipeline._admission`) and the bucket classification.
Skip reasons
    ``empty-selection`` (no selection and no scored row: nothing to finalise; trace only, the state is returned
    unchanged).
Departures (recall-spec)
    * 2 (§7 items 5 and 9) — the knowledge gate, the visibility filter and the temporal suppression ran during
      scoring with the preliminary (or request) owners, and that verdict is final: the final owners chosen here
      only pick among nodes that passed it (augmentation takes scored rows only), and scene reconstruction adds
      only nodes that are active, visible, not in ``gate_suppressed``, not temporally suppressed and — when
      the score map never held them — pass the same gate with zero evidence. The reference adds neighbours and
      "nearest events" unchecked, so future-tense or suppressed nodes re-entered. Request-named owners are
      never replaced by inferred ones. Owner keys match with or without ``#nodeId`` (item 4).
    * §7 item 6 — an owner POV that is already in the selection **is** moved forward; the reference counted it
      as "already selected", and it was then cut when it sat beyond ``max_recall_nodes`` (only possible without
      LLM, where the selection is the whole ``topK`` pool) or when scene reconstruction filled the cap with the
      neighbours of the nodes before it. Scenario 36 therefore selects ``[char-pov]`` instead of
      ``[obj-global]``.
    * §3.16 step 3 design — the reference's reconstruction walks the selection in order and adds each node's
      neighbours right after it, so two or three events with many neighbours fill all ``max_recall_nodes``
      slots and the rest of the selection is cut, however well it ranked (on the fixture chats: Wren's note on
      the latch, ranked 2nd; the fox's hiding place, ranked 4th). ``keep_top_ranked`` restores the best-ranked
      selected rows (fixture chats: required memories recalled 41 → 43 of 49, expected 79 → 85 of 108).
    * 8 — owner aliases are matched with :func:`memory_recall.text.mentions.term_occurs` (word boundaries for
      Latin, case/accent-insensitive; substring for CJK) instead of raw case-insensitive substrings.
    * 10 — ties break by node id (nearest events, recency ties, candidate names then keys).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_recall.pipeline._admission import admissible, rows_of, with_owners
from memory_recall.pipeline._graph_cache import cached
from memory_recall.pipeline.scoring import scope_buckets, temporal_director
from memory_recall.pipeline.state import (
    ContextInfo,
    OwnerCandidate,
    RecallState,
    TimedStage,
)
from memory_recall.settings import ContextSettings, OwnerSettings, ScoringSettings, SelectionSettings
from memory_recall.store.snapshot import TYPE_CODE, GraphSnapshot
from memory_recall.text.mentions import fold, term_occurs
from memory_recall.text.normalize import js_len

__all__ = [
    "OwnerStage",
    "final_owners",
    "llm_pool_size",
    "owner_base_key",
    "resolve_pov_owner",
    "scene_context",
    "scene_owner_candidates",
]

# Reference §5.3 constants.
OWNER_MIN_SCORE = 0.55
MAX_OWNERS = 4
MAX_CANDIDATES = 8
CANDIDATE_SCAN_MIN = 12  # "top max(llmPool, 12) scored nodes" (§3.13)
POV_BASE, POV_CAP, POV_DIVISOR = 1.0, 0.8, 8.0
PARTICIPANT_BASE, PARTICIPANT_CAP, PARTICIPANT_DIVISOR = 0.9, 0.6, 10.0
PARTICIPANT_FIELDS = ("participants", "summary", "state", "title", "name", "status")
#: Neighbour types an expanded event pulls in (§3.16 step 3; rules are not).
EVENT_NEIGHBOR_TYPES = ("character", "location", "thread", "reflection", "pov_memory")
NEAREST_EVENTS = 2
#: Events admitted per step when looking for the nearest admissible events.
_EVENT_BLOCK = 64
POV_NEIGHBORS = 2
ENTITY_EVENTS = 2

_EVENT = TYPE_CODE["event"]
_POV = TYPE_CODE["pov_memory"]
_CHARACTER = TYPE_CODE["character"]
_LOCATION = TYPE_CODE["location"]
#: Type code → is an event neighbour type (a table gather instead of np.isin on a handful of neighbours). One
#: extra False slot at the end: the snapshot codes an unknown type −1, which indexes it.
_EVENT_NEIGHBOR_MASK = np.zeros(max(TYPE_CODE.values()) + 2, dtype=bool)
_EVENT_NEIGHBOR_MASK[[TYPE_CODE[t] for t in EVENT_NEIGHBOR_TYPES]] = True


def scene_context(context: ContextInfo) -> ContextInfo:
    """``context`` reduced to the scene that decides the zero-evidence admission verdict of a node: the scene
    owners (keys, mode, active POV owners), the region and its neighbours, the story segment and the cue mode —
    every field :func:`~memory_recall.pipeline.scoring.scope_buckets`,
    :func:`~memory_recall.pipeline.scoring.knowledge_gate` (through the owner keys) and
    :func:`~memory_recall.pipeline.scoring.temporal_director` read. The owner candidates and scores, sources and
    labels are dropped.

    The late stages pass it as ``owner_context`` to :func:`~memory_recall.pipeline._admission.admissible`, which
    keeps its verdicts per snapshot and context: recalls of one scene then share them (the owner candidates
    differ with every message, the scene does not). The verdicts are the same as with ``context`` itself.
    """
    return ContextInfo(
        owner_keys=tuple(context.owner_keys),
        owner_mode=context.owner_mode,
        active_character_pov_owner=context.active_character_pov_owner,
        active_user_pov_owner=context.active_user_pov_owner,
        active_region=context.active_region,
        adjacent_regions=tuple(context.adjacent_regions),
        story_segment_id=context.story_segment_id,
        story_segment_order=context.story_segment_order,
        cue_mode=context.cue_mode,
    )


def llm_pool_size(selection: SelectionSettings) -> int:
    """``llmPool = max(maxRecallNodes, llmCandidatePool)`` (reference §3 preamble)."""
    return max(int(selection.max_recall_nodes), int(selection.llm_candidate_pool))


def owner_base_key(key: str) -> str:
    """Lower-cased owner key without ``#nodeId`` (keys match with or without it: departure 2)."""
    return key.strip().lower().split("#", 1)[0]


def resolve_pov_owner(snapshot: GraphSnapshot, i: int) -> tuple[str, str]:
    """``(owner key, owner name)`` of the POV node ``i``: the catalog owner it belongs to (matched by key with or
    without ``#nodeId``, then by name or alias, then by the owner's character node id), else the scope's own
    key and name. ``("", "")`` for an objective node or a POV node without owner.

    It reads only the (immutable) snapshot, so each node is resolved once per snapshot."""
    memo: dict[int, tuple[str, str]] = cached(snapshot, ("owners", "pov-owner"), dict)[0]
    found = memo.get(i)
    if found is None:
        found = memo[i] = _resolve_pov_owner(snapshot, i)
    return found


def _participant_text(snapshot: GraphSnapshot, i: int) -> str:
    """Folded participants/summary/state/title/name/status text of node ``i`` (once per snapshot)."""
    memo: dict[int, str] = cached(snapshot, ("owners", "participant-text"), dict)[0]
    text = memo.get(i)
    if text is None:
        node = snapshot.node(i)
        text = memo[i] = fold("\n".join(t for k in PARTICIPANT_FIELDS for t in node.field_text(k)))
    return text


def _resolve_pov_owner(snapshot: GraphSnapshot, i: int) -> tuple[str, str]:
    base = str(snapshot.scope_owner_key[i])
    if not base:
        return "", ""
    name = snapshot.scope_owner_name[i] or base.split(":", 1)[-1]
    ka = snapshot.knowledge
    kind = base.split(":", 1)[0]
    row = ka.row(base) if ka.owner_keys else -1
    if row >= 0 and ka.owner_types[row] == kind:
        return ka.owner_keys[row], ka.owner_names[row] or name
    if kind == "character":
        folded = fold(name.strip())
        for o, aliases in enumerate(ka.aliases):
            if ka.owner_types[o] == "character" and any(fold(a.strip()) == folded for a in aliases):
                return ka.owner_keys[o], ka.owner_names[o] or name
        owner_id = base.split(":", 1)[-1]
        for o in range(len(ka.owner_keys)):
            node_i = int(ka.owner_node_index[o])
            if ka.owner_types[o] == "character" and node_i >= 0 and snapshot.ids[node_i].lower() == owner_id:
                return ka.owner_keys[o], ka.owner_names[o] or name
    return base, name


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
        if reason and reason not in self.reasons:
            self.reasons.append(reason)

    def frozen(self) -> OwnerCandidate:
        return OwnerCandidate(self.key, self.name, self.score, tuple(self.sources), tuple(self.reasons))


def _catalog_aliases(state: RecallState) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """``(key, name, [(alias, folded alias), …] longest first)`` for every catalog owner (reference §3.1)."""
    ka = state.snapshot.knowledge
    out = []
    for key in state.context.owner_catalog:
        row = ka.row(key) if ka.owner_keys else -1
        if row < 0:
            continue
        aliases = sorted((a for a in ka.aliases[row] if js_len(a.strip()) >= 2), key=js_len, reverse=True)
        out.append((ka.owner_keys[row], ka.owner_names[row], [(a, fold(a.strip())) for a in aliases]))
    return out


#: Catalog aliases and participant matches kept per snapshot (weak keys); emptied past this many entries.
MAX_PARTICIPANT_MEMO = 50_000
_PARTICIPANTS: weakref.WeakKeyDictionary[GraphSnapshot, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
_PARTICIPANTS_LOCK = threading.Lock()


def _participant_memo(snapshot: GraphSnapshot) -> dict[Hashable, Any]:
    """Per snapshot: ``("catalog", owner_catalog)`` → :func:`_catalog_aliases`, ``(owner_catalog, i)`` →
    :func:`_participant_matches`. Both read only the snapshot and the catalog, so the top scored nodes a scene
    keeps finding are matched once (racing threads store equal values)."""
    with _PARTICIPANTS_LOCK:
        memo = _PARTICIPANTS.get(snapshot)
        if memo is None or len(memo) >= MAX_PARTICIPANT_MEMO:
            memo = _PARTICIPANTS[snapshot] = {}
        return memo


def _participant_matches(
    snapshot: GraphSnapshot, i: int, catalog: list[tuple[str, str, list[tuple[str, str]]]]
) -> tuple[tuple[str, str, str], ...]:
    """``(owner key, owner name, alias)`` of each catalog owner named in node ``i``'s participant text, by its
    first (longest) alias that occurs, in catalog order."""
    text = _participant_text(snapshot, i)
    if not text:
        return ()
    found = []
    for key, name, aliases in catalog:
        for alias, folded in aliases:
            if term_occurs(text, folded):
                found.append((key, name, alias))
                break
    return tuple(found)


def scene_owner_candidates(state: RecallState, selection: SelectionSettings) -> tuple[OwnerCandidate, ...]:
    """Preliminary candidates merged with those derived from the top scored rows (see the module docstring).
    O(min(len(scored), max(llmPool, 12)) × catalog owners)."""
    merged: dict[str, _Candidate] = {}
    for c in state.context.owner_candidates:
        cand = merged.setdefault(c.owner_key, _Candidate(c.owner_key, c.owner_name))
        cand.score += float(c.score)
        cand.sources.extend(s for s in c.sources if s not in cand.sources)
        cand.reasons.extend(r for r in c.reasons if r not in cand.reasons)

    def add(key: str, name: str, score: float, source: str, reason: str) -> None:
        merged.setdefault(key, _Candidate(key, name)).add(score, source, reason)

    snap = state.snapshot
    table = state.scored
    limit = min(len(table), max(llm_pool_size(selection), CANDIDATE_SCAN_MIN))
    memo = _participant_memo(snap)
    catalog_key = ("catalog", state.context.owner_catalog)
    catalog = (memo[catalog_key] if catalog_key in memo else memo.setdefault(catalog_key, _catalog_aliases(state))) \
        if limit else []
    for r in range(limit):
        i = int(table.index[r])
        w = float(table.weighted_score[r])
        if int(snap.type_code[i]) == _POV and int(snap.owner_type_code[i]) == 1:
            key, name = resolve_pov_owner(snap, i)
            if key:
                add(key, name, POV_BASE + min(POV_CAP, w / POV_DIVISOR), "candidate-pov-owner", "pov-memory")
            continue
        if not catalog:
            continue
        match_key = (state.context.owner_catalog, i)
        matches = memo.get(match_key)
        if matches is None:
            matches = memo[match_key] = _participant_matches(snap, i, catalog)
        for key, name, alias in matches:
            score = PARTICIPANT_BASE + min(PARTICIPANT_CAP, w / PARTICIPANT_DIVISOR)
            add(key, name, score, "objective-participant", f"participant:{alias}")
    for cand in merged.values():
        cand.score = round(cand.score, 9)  # sums of reference constants without binary noise
    ordered = sorted(merged.values(), key=lambda c: (-c.score, c.name, c.key))
    return tuple(c.frozen() for c in ordered[:MAX_CANDIDATES])


def final_owners(
    state: RecallState, candidates: Sequence[OwnerCandidate]
) -> tuple[tuple[str, ...], tuple[float, ...], str]:
    """``(keys, scores, mode)`` of the final scene owners (reference §3.16 step 1 with departure 2)."""
    ctx = state.context
    if ctx.owner_mode == "request":
        return tuple(ctx.owner_keys), tuple(float(s) for s in ctx.owner_scores), "request"
    llm = state.llm or {}
    status = llm.get("status")
    llm_keys = [k for k in (llm.get("activeOwnerKeys") or ()) if isinstance(k, str) and k]
    if status == "llm" and llm_keys:
        by_key = {c.owner_key: c for c in candidates}
        given: dict[str, float] = {}
        for e in llm.get("activeOwnerScores") or ():
            score = e.get("score") if isinstance(e, dict) else None
            if isinstance(score, int | float):
                given.setdefault(str(e.get("ownerKey")), float(score))
        keys = tuple(llm_keys[:MAX_OWNERS])
        scores = tuple(
            round(given[k], 3) if k in given else round(min(1.0, by_key[k].score), 3) if k in by_key else 1.0
            for k in keys
        )
        return keys, scores, "llm"
    chosen = [c for c in candidates if c.score >= OWNER_MIN_SCORE][:MAX_OWNERS]
    if not chosen:
        return (), (), "unresolved"
    mode = "fallback" if status in ("llm", "fallback") else "heuristic"
    return tuple(c.owner_key for c in chosen), tuple(round(min(1.0, c.score), 3) for c in chosen), mode


def _unique(seq: Sequence[int]) -> list[int]:
    seen: set[int] = set()
    out: list[int] = []
    for i in seq:
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


class OwnerStage(TimedStage):
    """Final scene owners, owner-POV augmentation and scene reconstruction (see the module docstring).

    Usage: ``OwnerStage(settings.owners, settings.selection, settings.context, settings.scoring).run(state)``.
    """

    name = "owners"

    def __init__(
        self,
        settings: OwnerSettings,
        selection: SelectionSettings,
        context: ContextSettings | None = None,
        scoring: ScoringSettings | None = None,
    ) -> None:
        self.settings = settings
        self.selection = selection
        self.context = context
        self.scoring = scoring

    # -- helpers ---------------------------------------------------------------------------------------------

    def _admit(self, state: RecallState, idx: np.ndarray) -> np.ndarray:
        # The scoring gate's owners (state.context), as a scene: verdicts are shared by recalls of one scene.
        return admissible(state, idx, context=self.context, scoring=self.scoring, require_active=True,
                          owner_context=scene_context(state.context))

    @staticmethod
    def _recency(snap: GraphSnapshot, idx: np.ndarray) -> np.ndarray:
        end = snap.seq_end[idx]
        return np.where(np.isnan(end), snap.seq[idx].astype(np.float64), end)

    @staticmethod
    def _neighbours(snap: GraphSnapshot, i: int) -> np.ndarray:
        """Other endpoints of node ``i``'s active edges, in edge-list order, unique."""
        pos = np.asarray(snap.active_edges_of(i), dtype=np.int64)
        if pos.size == 0:
            return np.zeros(0, dtype=np.int64)
        src, dst = snap.edge_src[pos], snap.edge_dst[pos]
        other = np.where(src == i, dst, src)
        # A node has a handful of edges: an ordered dict dedupes them faster than np.unique + sort.
        return np.array(list(dict.fromkeys(other.tolist())), dtype=np.int64)

    @staticmethod
    def _neighbourhood(snap: GraphSnapshot, idx: np.ndarray) -> np.ndarray:
        """Sorted unique other endpoints of the active edges of the nodes ``idx`` (a gather of their CSR rows)."""
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        indptr = snap.incident.indptr
        starts = indptr[idx].astype(np.int64)
        lens = indptr[idx + 1].astype(np.int64) - starts
        total = int(lens.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64)
        offsets = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total, dtype=np.int64)
        pos = snap.incident.data[offsets].astype(np.int64) - 1
        return np.union1d(snap.edge_src[pos], snap.edge_dst[pos])

    def _owner_pov_rows(self, state: RecallState, keys: Sequence[str]) -> dict[str, int]:
        """Best-ranked scored pov_memory node index of each owner key (base-key comparison)."""
        snap = state.snapshot
        table = state.scored
        wanted = {owner_base_key(k) for k in keys}
        found: dict[str, int] = {}
        if not wanted or len(table) == 0:
            return found
        pov_rows = np.flatnonzero(snap.type_code[table.index] == _POV)
        for r in pov_rows.tolist():  # scored rows only, in ranking order; stops once every owner is found
            i = int(table.index[r])
            base = owner_base_key(resolve_pov_owner(snap, i)[0])
            if base in wanted and base not in found:
                found[base] = i
                if len(found) == len(wanted):
                    break
        return found

    # -- run -------------------------------------------------------------------------------------------------

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        base_fields: dict[str, Any] = {"score_kind": "selection_rank", "score_direction": "lower_is_better"}
        selection = list(state.selection)
        if not selection and len(state.scored) == 0:
            return state, {**base_fields, "skipped": True, "skip_reason": "empty-selection"}
        snap = state.snapshot
        limit = int(self.selection.max_recall_nodes)

        candidates = scene_owner_candidates(state, self.selection)
        keys, scores, mode = final_owners(state, candidates)

        # Owner-POV augmentation (departure §7 item 6: "selected" means within the first max_recall_nodes).
        best = self._owner_pov_rows(state, keys)
        front: list[int] = []
        for key in keys:
            i = best.get(owner_base_key(key))
            if i is not None and i not in front:
                front.append(i)
        augmented = _unique(front + selection)[:limit]

        origin_default = "llm" if (state.llm or {}).get("status") == "llm" else "score"
        origins: dict[int, str] = {i: ("owner-pov" if i in front else origin_default) for i in augmented}
        final = (
            self._keep_top_ranked(state, selection, self._reconstruct(state, augmented, limit, origins), limit,
                                  origins, origin_default)
            if self.settings.enable_scene_reconstruction
            else augmented
        )

        owner_ctx = with_owners(state.context, keys, mode)
        names = {c.owner_key: c.owner_name for c in candidates}
        meta = state.with_meta(
            sceneOwnerCandidates=[
                {
                    "ownerKey": c.owner_key,
                    "ownerName": c.owner_name,
                    "score": round(c.score, 3),
                    "sources": list(c.sources),
                    "reasons": list(c.reasons),
                }
                for c in candidates
            ],
            activeRecallOwnerKey=keys[0] if keys else "",
            activeRecallOwnerKeys=list(keys),
            activeRecallOwnerScores=dict(zip(keys, scores, strict=True)),
            sceneOwnerResolutionMode=mode,
            activeCharacterPovOwners=[
                names.get(k) or k.split(":", 1)[-1].split("#", 1)[0] for k in keys if k.startswith("character:")
            ],
            **self._selected_meta(state, final, owner_ctx),
            selectionOrigins={snap.ids[i]: origins[i] for i in final},
            ownerPovAugmented=[snap.ids[i] for i in front if i in final],
            sceneReconstructionAdded=[snap.ids[i] for i in final if origins[i] == "scene-reconstruction"],
        )
        new_state = state.evolve(
            selection=tuple(final),
            final_owner_keys=tuple(keys),
            final_owner_scores=tuple(scores),
            final_owner_mode=mode,
            meta=meta,
        )
        notes = {
            "owner_mode": mode,
            "owner_keys": list(keys),
            "owner_pov_added": len([i for i in front if i in final]),
            "reconstructed": sum(1 for i in final if origins[i] == "scene-reconstruction"),
            "reconstruction": self.settings.enable_scene_reconstruction,
        }
        return new_state, {**base_fields, "count_in": len(selection), "count_out": len(final), "notes": notes}

    def _keep_top_ranked(
        self, state: RecallState, selection: Sequence[int], final: list[int], limit: int, origins: dict[int, str],
        origin_default: str,
    ) -> list[int]:
        """Put back the first ``keep_top_ranked`` ranked rows of ``selection`` that reconstruction crowded out."""
        keep = int(self.settings.keep_top_ranked)
        if keep <= 0:
            return final
        chosen = set(selection)
        top = [int(i) for i in state.scored.index[:keep].tolist() if int(i) in chosen]
        out = list(final)
        present = set(out)
        for i in top:
            if i in present:
                continue
            if len(out) >= limit:
                # the last reconstruction addition gives way; nothing to give → the cap holds
                drop = next((k for k in range(len(out) - 1, -1, -1)
                             if origins.get(out[k]) == "scene-reconstruction"), None)
                if drop is None:
                    break
                present.discard(out.pop(drop))
            out.append(i)
            present.add(i)
            origins[i] = "owner-pov" if origins.get(i) == "owner-pov" else origin_default
        return out

    def _reconstruct(
        self, state: RecallState, selected: list[int], limit: int, origins: dict[int, str]
    ) -> list[int]:
        """Scene reconstruction (§3.16 step 3) restricted to admissible nodes (departure 2)."""
        snap = state.snapshot
        out: list[int] = []
        seen: set[int] = set()
        # Verdict of each node judged in this reconstruction: -1 not judged yet, else 0/1. Admission is per node,
        # so an array indexed by node (vectorised gathers) gives the same verdicts as judging every call afresh.
        admit_cache = np.full(snap.n, -1, dtype=np.int8)

        def admit(idx: np.ndarray) -> np.ndarray:
            todo = idx[admit_cache[idx] < 0]
            if todo.size:
                admit_cache[todo] = self._admit(state, todo)
            return admit_cache[idx] == 1

        def add(i: int, origin: str) -> bool:
            if len(out) >= limit or i in seen or bool(snap.archived[i]):
                return False
            seen.add(i)
            out.append(i)
            origins.setdefault(i, origin)
            return True

        def events_by_seq() -> tuple[np.ndarray, np.ndarray]:
            # Every event of the chat sorted by seq, and their seq: once per snapshot, not per recall.
            def build() -> tuple[np.ndarray, np.ndarray]:
                ev = np.flatnonzero(snap.type_code == _EVENT)
                ev = ev[np.argsort(snap.seq[ev], kind="stable")]
                return ev, snap.seq[ev]

            return cached(snap, ("owners", "events-by-seq"), build)[0]

        def nearest_events(e: int) -> list[int]:
            found = ranked_events(e, window=True)
            return found if found is not None else ranked_events(e, window=False) or []

        def ranked_events(e: int, *, window: bool) -> list[int] | None:
            ev, ev_seq = events_by_seq()
            s = snap.seq[e]
            if window and ev.size > 2 * _EVENT_BLOCK:
                # Every event within seq distance d of e, d set by the _EVENT_BLOCK-th neighbour on each side:
                # ranked among themselves they are a prefix of the full nearest-first order.
                p = int(np.searchsorted(ev_seq, s))
                left = int(s - ev_seq[p - _EVENT_BLOCK]) if p >= _EVENT_BLOCK else None
                right = int(ev_seq[p + _EVENT_BLOCK] - s) if p + _EVENT_BLOCK < ev.size else None
                d = min(x for x in (left, right) if x is not None)
                first = int(np.searchsorted(ev_seq, s - d, side="left"))
                last = int(np.searchsorted(ev_seq, s + d, side="right"))
                ev = ev[first:last]
            else:
                window = False
            ev = ev[ev != e]
            if ev.size == 0:
                return None if window else []
            seq = snap.seq[ev]
            dist = np.abs(seq - snap.seq[e])
            order = np.lexsort((snap.id_rank[ev], -seq, dist))  # nearest, then higher seq, then node id
            # Admission is per node, so walking the nearest-first order in blocks and stopping once enough are
            # admitted picks the same events as admitting every event first (a long chat has thousands).
            found: list[int] = []
            for lo in range(0, order.size, _EVENT_BLOCK):
                block = ev[order[lo:lo + _EVENT_BLOCK]]
                found.extend(block[admit(block)].tolist())
                if len(found) >= NEAREST_EVENTS:
                    break
            if window and len(found) < NEAREST_EVENTS:
                return None
            return found[:NEAREST_EVENTS]

        def by_recency(idx: np.ndarray, k: int) -> list[int]:
            if idx.size == 0:
                return []
            order = np.lexsort((snap.id_rank[idx], -snap.importance[idx], -self._recency(snap, idx)))
            return idx[order[:k]].tolist()

        def expand_event(e: int) -> None:
            nb = self._neighbours(snap, e)
            nb = nb[_EVENT_NEIGHBOR_MASK[snap.type_code[nb]]]
            for j in nb[admit(nb)].tolist():
                add(j, "scene-reconstruction")
            for j in nearest_events(e):
                add(j, "scene-reconstruction")

        def expand_pov(p: int) -> None:
            nb = self._neighbours(snap, p)
            for j in by_recency(nb[admit(nb)], POV_NEIGHBORS):
                if add(j, "scene-reconstruction") and int(snap.type_code[j]) == _EVENT:
                    expand_event(j)

        def expand_entity(c: int) -> None:
            nb = self._neighbours(snap, c)
            nb = nb[snap.type_code[nb] == _EVENT]
            for j in by_recency(nb[admit(nb)], ENTITY_EVENTS):
                if add(j, "scene-reconstruction"):
                    expand_event(j)

        expanders: dict[int, Callable[[int], None]] = {
            _EVENT: expand_event, _POV: expand_pov, _CHARACTER: expand_entity, _LOCATION: expand_entity,
        }
        # Each admission call has a fixed cost of a few vectorised passes: judge the two-hop neighbourhood of
        # the selection in one call up front (admission is per node, so the verdicts are the same).
        if selected:
            near = self._neighbourhood(snap, np.asarray(selected, dtype=np.int64))
            admit(np.union1d(near, self._neighbourhood(snap, near[snap.type_code[near] == _EVENT])))
        for i in selected:
            if len(out) >= limit:
                break
            add(i, origins.get(i, "score"))
            expander = expanders.get(int(snap.type_code[i]))
            if expander is not None:
                expander(i)
        return out

    def _selected_meta(self, state: RecallState, final: list[int], owner_ctx: Any) -> dict[str, Any]:
        """``selectedByBucket/KnowledgeState/StoryTime/Owner`` of reference §3.17."""
        snap = state.snapshot
        idx = np.array(final, dtype=np.int64)
        ids = [snap.ids[i] for i in final]
        by_bucket: dict[str, list[str]] = {}
        if idx.size:
            for nid, bucket in zip(ids, scope_buckets(snap, idx, owner_ctx, settings=self.context).tolist(),
                                   strict=True):
                by_bucket.setdefault(str(bucket), []).append(nid)
        rows = rows_of(state, idx)
        table = state.scored
        visible_owners = state.meta.get("knowledgeVisibleOwnersByNode") or {}
        suppressed_owners = state.meta.get("knowledgeSuppressedOwnersByNode") or {}
        timeline_on = self.context.enable_story_timeline if self.context is not None else True
        # Scored rows carry their story-time verdict; the director (element-wise) runs for the others only.
        unscored = np.flatnonzero(rows < 0)
        temporal = temporal_director(snap, idx[unscored], state.context, enabled=timeline_on)
        temporal_row = dict(zip(unscored.tolist(), range(unscored.size), strict=True))
        knowledge: dict[str, dict[str, Any]] = {}
        story: dict[str, dict[str, Any]] = {}
        by_owner: dict[str, list[str]] = {}
        for p, (i, nid) in enumerate(zip(final, ids, strict=True)):
            r = int(rows[p])
            if r >= 0:
                mode = table.knowledge_mode[r]
                knowledge[nid] = {
                    "mode": mode,
                    "anchored": mode in ("anchored", "manual-known"),
                    "rescued": mode == "rescued",
                    "ownerCoverage": round(float(table.owner_coverage[r]), 3),
                    "visibilityScore": round(float(table.knowledge_visibility[r]), 3),
                    "visibleOwnerKeys": list(visible_owners.get(nid, [])),
                    "suppressedOwnerKeys": list(suppressed_owners.get(nid, [])),
                }
                bucket, weight = table.temporal_bucket[r], float(table.temporal_weight[r])
            else:
                knowledge[nid] = {
                    "mode": "selected", "anchored": False, "rescued": False, "ownerCoverage": 0.0,
                    "visibilityScore": 0.0, "visibleOwnerKeys": [], "suppressedOwnerKeys": [],
                }
                t = temporal_row[p]
                bucket, weight = str(temporal.bucket[t]), float(temporal.weight[t])
            node = snap.node(i)
            story[nid] = {
                "storyTimeLabel": node.story_time.describe() or node.story_time_span.describe(),
                "temporalBucket": bucket,
                "temporalWeight": round(weight, 3),
            }
            owner_keys = []
            if snap.is_pov[i]:
                owner_keys.append(resolve_pov_owner(snap, i)[0])
            owner_keys.extend(visible_owners.get(nid, []))
            for key in _unique_str(owner_keys):
                by_owner.setdefault(key, []).append(nid)
        return {
            "selectedByBucket": by_bucket,
            "selectedByKnowledgeState": knowledge,
            "selectedByStoryTime": story,
            "selectedByOwner": by_owner,
        }


def _unique_str(values: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for v in values:
        if v and v not in seen:
            seen.add(v)
            out.append(v)
    return out
