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
    expanded. Stops at ``max_recall_nodes``; duplicates are skipped. The walk is plain Python over the few
    dozen nodes it touches: each node's expansion list (neighbours filtered and ordered as above) and each
    event's first nearest events (one ``lexsort`` over the events within a seq window) are built once per
    snapshot; a recall only judges admission, in one batch for what the walk most likely reads. After a write
    (a chat turn's append) the new structure's memo and participant table are derived from the parent's in time
    proportional to the change (:func:`_updated_memo`, :func:`_updated_participants`), equal to fresh builds.
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
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_recall.pipeline._admission import admissible, rows_of
from memory_recall.pipeline._graph_cache import cached, cached_stats
from memory_recall.pipeline.scoring import scope_buckets, temporal_director
from memory_recall.pipeline.state import (
    ContextInfo,
    OwnerCandidate,
    RecallState,
    TimedStage,
)
from memory_recall.settings import ContextSettings, OwnerSettings, ScoringSettings, SelectionSettings
from memory_recall.store.snapshot import TYPE_CODE, GraphSnapshot, StructureChange, inserted
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
#: Nearest-first events kept per event (its first 2 admissible ones are almost always among them; else the
#: whole order is ranked again).
_NEAREST_PREFIX = 16
#: Reconstruction lists kept per snapshot (see :class:`_SnapshotMemo`); emptied past this many entries.
MAX_WALK_MEMO = 20_000
#: Scenes whose per-node classifications (buckets, story time) are kept per snapshot.
MAX_SCENES = 16
#: What :func:`_likely_judged` takes: the head of a recency list, how many of it may be expanded events, and
#: how many of an event's nearest events.
_LIKELY_HEAD, _LIKELY_EXPANDED, _LIKELY_NEAREST = 16, 8, 8
#: Selected nodes whose likely reads are judged together (the walk usually fills the cap within 3–6).
_LOOKAHEAD = 6
POV_NEIGHBORS = 2
ENTITY_EVENTS = 2

_EVENT = TYPE_CODE["event"]
_POV = TYPE_CODE["pov_memory"]
_CHARACTER = TYPE_CODE["character"]
_LOCATION = TYPE_CODE["location"]
#: Type codes of the event neighbour types.
_EVENT_NEIGHBOR_CODES = frozenset(TYPE_CODE[t] for t in EVENT_NEIGHBOR_TYPES)


def scene_context(
    context: ContextInfo, owner_keys: Sequence[str] | None = None, owner_mode: str | None = None
) -> ContextInfo:
    """``context`` reduced to the scene that decides the zero-evidence admission verdict of a node: the scene
    owners (keys, mode, active POV owners), the region and its neighbours, the story segment and the cue mode —
    every field :func:`~memory_recall.pipeline.scoring.scope_buckets`,
    :func:`~memory_recall.pipeline.scoring.knowledge_gate` (through the owner keys) and
    :func:`~memory_recall.pipeline.scoring.temporal_director` read. The owner candidates and scores, sources and
    labels are dropped. ``owner_keys`` / ``owner_mode`` replace the context's owners (the final owners).

    The late stages pass it as ``owner_context`` to :func:`~memory_recall.pipeline._admission.admissible`, which
    keeps its verdicts per snapshot and context: recalls of one scene then share them (the owner candidates
    differ with every message, the scene does not). The verdicts are the same as with ``context`` itself.
    """
    return ContextInfo(
        owner_keys=tuple(context.owner_keys if owner_keys is None else owner_keys),
        owner_mode=context.owner_mode if owner_mode is None else owner_mode,
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


class _SnapshotMemo:
    """What the owner stage derives from one snapshot structure (none of it reads the statistics overlay), kept
    in one :func:`cached` entry (it must not reference the snapshot: the cache is weakly keyed by its structure).

    * ``pov_owner`` / ``pov_base`` (its base key) / ``participant_text`` / ``story_label``: per node, filled on
      first use (at most one entry per node);
    * ``codes`` / ``flags``: the type codes and archived flags (0/1), one byte per node (scene reconstruction
      reads a few dozen of them per recall: a ``bytearray`` index costs what a list index does, less than a numpy
      scalar read, and a write extends them by copying n bytes, not n pointers); :attr:`types` / :attr:`archived`
      give them as lists;
    * ``events``: every event sorted by ``seq``, and their ``seq`` (built on first use; 16 bytes per event);
    * ``walk``: the reconstruction's lists of the kinds that do not read importance (:func:`_walk_list`; the
      others are kept per snapshot, :func:`_stats_walks`, under the same bound), at most one per node (its
      neighbours: as many ints as its degree) plus the first 16 nearest events of an event; at most
      :data:`MAX_WALK_MEMO` lists (emptied past it): ~0.3–1 KB each at typical degrees, so ≤ ~20 MB whatever the graph;
    * ``scenes``: per-node classifications of the :data:`MAX_SCENES` most recent scenes (:meth:`scene`): at
      most two small entries per selected node and scene;
    * ``n_edges`` / ``seq`` / ``type_code`` / ``signature``: what :func:`_updated_memo` compares a child
      structure with — the active edge count, the ``seq`` and ``type_code`` arrays (the snapshot's own, shared:
      snapshot arrays are never mutated) and :func:`_owner_signature`;
    * ``stats``: ``(importance, lists)`` — the importance-ordered walk lists (:func:`_stats_walks`) of the latest
      snapshot of this structure that built them, with that snapshot's importance array; :func:`_updated_memo`
      carries them to the child's first snapshot as ``(its importance, lists still valid)``.

    ``codes`` / ``flags`` may be given (:func:`_updated_memo`: the parent's extended); they must equal the
    snapshot's ``type_code`` / ``archived`` as bytes. Never mutated once built (a child copies them).
    """

    __slots__ = (
        "codes", "events", "flags", "n_edges", "participant_text", "pov_base", "pov_owner", "scenes", "seq",
        "signature", "stats", "story_label", "type_code", "walk",
    )

    def __init__(
        self, snapshot: GraphSnapshot, *, codes: bytearray | None = None, flags: bytearray | None = None
    ) -> None:
        self.pov_owner: dict[int, tuple[str, str]] = {}
        self.pov_base: dict[int, str] = {}
        self.participant_text: dict[int, str] = {}
        self.story_label: dict[int, str] = {}
        self.codes = _bytes_of(snapshot.type_code) if codes is None else codes
        self.flags = _bytes_of(snapshot.archived) if flags is None else flags
        self.events: tuple[np.ndarray, np.ndarray] | None = None
        self.n_edges = int(snapshot.edge_src.size)
        self.seq: np.ndarray = snapshot.seq
        self.type_code: np.ndarray = snapshot.type_code
        self.stats: tuple[np.ndarray, dict[tuple[str, int], Any]] | None = None
        self.signature = _owner_signature(snapshot)
        self.walk: dict[tuple[str, int], Any] = {}
        self.scenes: OrderedDict[Hashable, tuple[dict[int, str], dict[int, tuple[str, float]]]] = OrderedDict()

    @property
    def types(self) -> list[int]:
        """The type codes as a list (a copy: O(n))."""
        return list(self.codes)

    @property
    def archived(self) -> list[bool]:
        """The archived flags as a list (a copy: O(n))."""
        return np.frombuffer(bytes(self.flags), dtype=np.uint8).astype(bool).tolist()

    def scene(self, key: Hashable) -> tuple[dict[int, str], dict[int, tuple[str, float]]]:
        """Node → scope bucket and node → (story-time bucket, weight to 3 decimals) of one scene (``key``: all
        the two classifications read besides the snapshot); the least recently used scene goes past
        :data:`MAX_SCENES`. Racing threads store equal values."""
        with _SCENES_LOCK:  # an eviction between the look-up and the move would fail the move
            found = self.scenes.get(key)
            if found is None:
                found = self.scenes[key] = ({}, {})
                while len(self.scenes) > MAX_SCENES:
                    self.scenes.popitem(last=False)
            else:
                self.scenes.move_to_end(key)
            return found


#: The walk list kinds (:func:`_walk_list`) whose order does not read ``importance``: kept in the structure's
#: memo; the others ("pov", "entity": recency, then importance) per snapshot (:func:`_stats_walks`).
_IMPORTANCE_FREE_WALKS = frozenset({"event", "near"})
_SCENES_LOCK = threading.Lock()


def _memo(snapshot: GraphSnapshot) -> _SnapshotMemo:
    return cached(
        snapshot, ("owners", "snapshot"), lambda: _SnapshotMemo(snapshot),
        lambda old, change: _updated_memo(snapshot, old, change), recipe=_memo,
    )[0]


def _updated_memo(snapshot: GraphSnapshot, old: _SnapshotMemo, change: StructureChange) -> _SnapshotMemo | None:
    """The parent structure's memo moved to the positions of ``snapshot`` after a delta, equal to what the
    recalls on ``snapshot`` would have filled a fresh memo with:

    * the per-node entries of the nodes the delta left unchanged: participant texts and story-time labels read
      only the node; POV owners (and their base keys) also the owner catalog, so they are kept while
      :func:`_owner_signature` is the same; the per-scene verdicts also the chat state: kept only when the state
      was not written and every owner node is where it was;
    * for an appended-only delta (no node moved, old active edges kept, new ones after them): the type and
      archived bytes extended (O(n) byte copies in C, no per-node Python), the walk lists and the events by seq
      (:func:`_carry_walks`), in time proportional to the change. Other deltas build those again.
    """
    if not isinstance(old, _SnapshotMemo):
        return None
    n_old = change.n_old
    rewritten = change.rewritten.tolist()
    identity = (
        change.appended_only and change.appended == n_old and len(old.codes) == n_old
        and int(snapshot.edge_src.size) >= old.n_edges
    )
    if identity:
        codes = old.codes + _bytes_of(snapshot.type_code[n_old:])
        flags = old.flags + _bytes_of(snapshot.archived[n_old:])
        if rewritten:
            at = change.rewritten
            for r, t, a in zip(rewritten, snapshot.type_code[at].tolist(), snapshot.archived[at].tolist(),
                               strict=True):
                codes[r] = t
                flags[r] = a
        out = _SnapshotMemo(snapshot, codes=codes, flags=flags)
    else:
        out = _SnapshotMemo(snapshot)

    dropped = frozenset(rewritten)

    def move(table: dict[int, Any]) -> dict[int, Any]:
        if not identity:
            return _moved(table, change)
        # Positions stand: a C-level copy, then the rewritten nodes out (or the table filtered, when it is the
        # shorter of the two: the first write after a long session may rewrite more nodes than a table holds).
        if len(table) <= len(rewritten):
            return {i: v for i, v in list(table.items()) if i not in dropped}
        moved = dict(table)
        for r in rewritten:
            moved.pop(r, None)
        return moved

    out.participant_text = move(old.participant_text)
    out.story_label = move(old.story_label)
    if out.signature == old.signature:
        out.pov_owner = move(old.pov_owner)
        out.pov_base = move(old.pov_base)
    # The scope buckets and story-time verdicts read the chat state and the owners' nodes: kept only when the
    # state was not written, no node was deleted and no owner's node is new or rewritten.
    owners_same = (identity or not bool((change.remap < 0).any())) and not any(
        k >= change.appended or k in dropped for k in snapshot.knowledge.owner_node_index.tolist()
    )
    if not change.state_changed and owners_same:
        with _SCENES_LOCK:
            scenes = list(old.scenes.items())
        for key, (buckets, temporal) in scenes:
            out.scenes[key] = (move(buckets), move(temporal))
    if identity:
        _carry_walks(snapshot, old, out, change)
    return out


def _bytes_of(values: np.ndarray) -> bytearray:
    """Small non-negative ints (type codes < 256, flags) one byte each."""
    return bytearray(values.astype(np.uint8).tobytes())


def _moved(table: dict[int, Any], change: StructureChange) -> dict[int, Any]:
    """``table`` (parent position → value) at the new positions of the nodes ``change`` left unchanged."""
    items = list(table.items())  # one C-level snapshot: other threads may be filling the parent's table
    if not items:
        return {}
    keys = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
    new = change.remap[keys]
    keep = new >= 0
    if change.rewritten.size:
        keep &= ~np.isin(new, change.rewritten)
    return {j: items[p][1] for p, j in zip(np.flatnonzero(keep).tolist(), new[keep].tolist(), strict=True)}


def _owner_signature(snapshot: GraphSnapshot) -> tuple[Any, ...]:
    """Everything of the owner catalog that :func:`_resolve_pov_owner` and :func:`_catalog_aliases` read besides
    the node itself: the owners' keys, types, names and aliases and the ids of their character nodes.
    O(owners)."""
    ka = snapshot.knowledge
    ids = snapshot.ids
    nodes = tuple(ids[k] if 0 <= k < len(ids) else None for k in ka.owner_node_index.tolist())
    return (tuple(ka.owner_keys), tuple(ka.owner_types), tuple(ka.owner_names), tuple(map(tuple, ka.aliases)), nodes)


def _carry_walks(snapshot: GraphSnapshot, old: _SnapshotMemo, out: _SnapshotMemo, change: StructureChange) -> None:
    """The parent's walk lists (``walk``, and ``stats`` when it holds some), and ``events``, into ``out`` after an
    appended-only delta (positions stand, the old active edges are the first ``old.n_edges`` and the new ones
    follow), equal to fresh builds:

    * an ``"event"`` list (neighbours in edge order, filtered by type) changes when the node gained an edge or a
      neighbour's type changed: those are dropped (built again on use);
    * a ``"pov"`` / ``"entity"`` list (neighbours by recency, importance, id) also when a neighbour was rewritten
      or its importance differs from the overlay the lists were built with (compared in C: O(n));
    * a ``"near"`` list (the first :data:`_NEAREST_PREFIX` events of the nearest-first order) changes only when
      a new event ranks before its last entry: with more than ``2 × _EVENT_BLOCK`` events only the events with
      fewer than :data:`_NEAREST_PREFIX` events between them and the new one in ``seq`` can be concerned, and
      those lists get the new event merged in (:func:`_merge_nearest`); in a shorter chat (prefixes may hold the
      whole order) they are dropped. A rewritten node that was or became an event, or an event whose ``seq``
      changed, drops them all;
    * ``events``: the new events inserted after the old ones of equal ``seq`` (a stable sort puts them there).
    """
    n_old = change.n_old
    gained = np.concatenate([snapshot.edge_src[old.n_edges:], snapshot.edge_dst[old.n_edges:]])
    rw = change.rewritten
    events_moved = False
    retyped = rw[:0]
    if rw.size:
        new_t, old_t = snapshot.type_code[rw], old.type_code[rw]
        retyped = rw[new_t != old_t]
        events_moved = bool(((new_t == _EVENT) != (old_t == _EVENT)).any()) or bool(
            ((new_t == _EVENT) & (snapshot.seq[rw] != old.seq[rw])).any()
        )
    walk = _without_lists(old.walk, np.concatenate([gained, _around(snapshot, retyped)]), ("event",))
    events = old.events
    new_events = n_old + np.flatnonzero(snapshot.type_code[n_old:] == _EVENT)
    if events_moved:
        walk = {k: v for k, v in walk.items() if k[0] != "near"}  # rare (an event rewritten into another kind)
        events = None
    elif events is not None and new_events.size:
        ev, ev_seq = events
        if ev.size <= 2 * _EVENT_BLOCK:
            walk = _without_lists(walk, ev, ("near",))
        else:
            for j in new_events.tolist():
                if not _merge_nearest(snapshot, walk, ev, ev_seq, j):
                    walk = {k: v for k, v in walk.items() if k[0] != "near"}
                    break
        seq = snapshot.seq[new_events]
        order = np.argsort(seq, kind="stable")
        at = np.searchsorted(ev_seq, seq[order], side="right")
        events = (inserted(ev, at, new_events[order]), inserted(ev_seq, at, seq[order]))
    out.walk = walk
    out.events = events

    previous = old.stats
    if previous is None or not previous[1]:
        return
    importance = snapshot.importance
    if previous[0].shape != (n_old,) or importance.shape[0] < n_old:
        return
    reordered = np.flatnonzero(importance[:n_old] != previous[0])
    if reordered.size > _STATS_CARRY_MAX:
        return  # a large reinforcement since: the lists are built again
    moved = np.concatenate([rw, reordered])
    out.stats = (importance, _without_lists(previous[1], np.concatenate([gained, _around(snapshot, moved)]),
                                            ("pov", "entity")))


#: Nodes whose importance changed since the importance-ordered lists were built beyond which they are not carried.
_STATS_CARRY_MAX = 4096


def _around(snapshot: GraphSnapshot, nodes: np.ndarray) -> np.ndarray:
    """``nodes`` and the other endpoints of their active edges (repeats possible), from the incident-edge CSR in
    C: O(their degrees)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if nodes.size == 0:
        return nodes
    inc = snapshot.incident
    starts = inc.indptr[nodes].astype(np.int64)
    lengths = inc.indptr[nodes + 1].astype(np.int64) - starts
    total = int(lengths.sum())
    if total == 0:
        return nodes
    # Positions starts[k] + 0 … lengths[k] − 1 of every node k, in one gather.
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total, dtype=np.int64)
    pos = inc.data[offsets].astype(np.int64) - 1
    return np.concatenate([nodes, snapshot.edge_src[pos], snapshot.edge_dst[pos]])


def _without_lists(
    walks: dict[tuple[str, int], Any], nodes: np.ndarray, kinds: tuple[str, ...]
) -> dict[tuple[str, int], Any]:
    """A copy of ``walks`` without the lists of the ``kinds`` at ``nodes``: a C-level copy and a pop per node, or
    a filtered copy when ``nodes`` outnumber the lists."""
    if nodes.size * len(kinds) <= len(walks):
        out = dict(walks)
        for i in set(nodes.tolist()):
            for kind in kinds:
                out.pop((kind, i), None)
        return out
    gone = set(nodes.tolist())
    return {k: v for k, v in list(walks.items()) if not (k[0] in kinds and k[1] in gone)}


#: Old events whose nearest-event lists :func:`_merge_nearest` checks one by one, at most (ties on ``seq``
#: beyond it: the lists are dropped instead).
_MERGE_SCAN_MAX = 4096


def _merge_nearest(
    snapshot: GraphSnapshot, walk: dict[tuple[str, int], Any], ev: np.ndarray, ev_seq: np.ndarray, j: int
) -> bool:
    """Merge the new event ``j`` into the ``"near"`` lists of ``walk`` it enters (``ev`` / ``ev_seq``: the old
    events by seq, more than ``2 × _EVENT_BLOCK`` of them, so every list is an incomplete prefix of
    :data:`_NEAREST_PREFIX`). Only an event ``e`` with fewer than that many old events strictly between ``e``
    and ``j`` in ``seq`` can rank ``j`` in its prefix (each of those is nearer than ``j``): a contiguous slice of
    ``ev``. False when the slice is too long (many ties): the caller drops the lists."""
    size = int(ev.size)
    s_j = int(snapshot.seq[j])
    lo = int(np.searchsorted(ev_seq, s_j, side="left"))
    hi = int(np.searchsorted(ev_seq, s_j, side="right"))
    a = int(np.searchsorted(ev_seq, ev_seq[lo - _NEAREST_PREFIX], side="left")) if lo >= _NEAREST_PREFIX else 0
    last = hi + _NEAREST_PREFIX - 1
    b = int(np.searchsorted(ev_seq, ev_seq[last], side="right")) if last < size else size
    if b - a > _MERGE_SCAN_MAX:
        return False
    seq, rank = snapshot.seq, snapshot.id_rank
    for e in ev[a:b].tolist():
        found = walk.get(("near", e))
        if found is None:
            continue
        prefix, complete = found
        if complete or len(prefix) < _NEAREST_PREFIX:  # cannot happen past 2 × _EVENT_BLOCK events; be safe
            del walk[("near", e)]
            continue
        cand = np.array((*prefix, j), dtype=np.int64)
        s = seq[e]
        cs = seq[cand]
        order = np.lexsort((rank[cand], -cs, np.abs(cs - s)))
        if order[-1] != cand.size - 1:  # j ranks before the old last entry
            walk[("near", e)] = (tuple(cand[order][:_NEAREST_PREFIX].tolist()), False)
    return True


def _stats_walks(snapshot: GraphSnapshot) -> dict[tuple[str, int], Any]:
    """The walk lists ordered by importance (the "pov" and "entity" kinds), per snapshot: they read the statistics
    overlay, which a reinforcement write replaces."""
    def build() -> dict[tuple[str, int], Any]:
        memo = _memo(snapshot)
        seed = memo.stats
        # Seeded by _updated_memo for this very overlay (the lists the delta left valid), else empty.
        walks: dict[tuple[str, int], Any] = seed[1] if seed is not None and seed[0] is snapshot.importance else {}
        memo.stats = (snapshot.importance, walks)
        return walks

    return cached_stats(snapshot, ("owners", "stats-walks"), build, recipe=_stats_walks)[0]


def resolve_pov_owner(snapshot: GraphSnapshot, i: int) -> tuple[str, str]:
    """``(owner key, owner name)`` of the POV node ``i``: the catalog owner it belongs to (matched by key with or
    without ``#nodeId``, then by name or alias, then by the owner's character node id), else the scope's own
    key and name. ``("", "")`` for an objective node or a POV node without owner.

    It reads only the (immutable) snapshot, so each node is resolved once per snapshot."""
    return _pov_owner(snapshot, _memo(snapshot), i)


def _pov_owner(snapshot: GraphSnapshot, memo: _SnapshotMemo, i: int) -> tuple[str, str]:
    """:func:`resolve_pov_owner` with the snapshot's memo already at hand (the stage resolves dozens per recall)."""
    found = memo.pov_owner.get(i)
    if found is None:
        found = memo.pov_owner[i] = _resolve_pov_owner(snapshot, i)
    return found


def _participant_text(snapshot: GraphSnapshot, i: int) -> str:
    """Folded participants/summary/state/title/name/status text of node ``i`` (once per snapshot)."""
    memo = _memo(snapshot).participant_text
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


#: Catalog aliases and row contributions kept per snapshot (weak keys); emptied past this many entries.
MAX_PARTICIPANT_MEMO = 50_000


class _ParticipantTable(dict[Hashable, Any]):
    """The participant memo of one structure (:func:`_participant_memo`): a dict, plus what
    :func:`_updated_participants` needs to carry it to a child structure — the :func:`_owner_signature` it was
    filled under and the owner catalogs it holds entries of (``("catalog", c)`` and ``(c, i)`` keys)."""

    __slots__ = ("catalogs", "signature")

    def __init__(self, signature: tuple[Any, ...], entries: dict[Hashable, Any] | None = None,
                 catalogs: set[Any] | None = None) -> None:
        super().__init__(entries or {})
        self.signature = signature
        self.catalogs: set[Any] = set() if catalogs is None else catalogs


#: Guards the participant tables (filled in place by the recalls on a structure).
_PARTICIPANTS_LOCK = threading.Lock()


def _participant_memo(snapshot: GraphSnapshot) -> _ParticipantTable:
    """Per structure (:func:`cached`: the memo reads no statistics): ``("catalog", owner_catalog)`` →
    :func:`_catalog_aliases`, ``(owner_catalog, i)`` → :func:`_contributions`. Both read only the snapshot and the
    catalog, so the top scored nodes a scene keeps finding are matched once (racing threads store equal values). A
    structure updated by a delta starts from its parent's table (:func:`_updated_participants`), derived after
    the write. Emptied in place past :data:`MAX_PARTICIPANT_MEMO` entries."""
    memo = cached(
        snapshot, ("owners", "participants"), lambda: _ParticipantTable(_owner_signature(snapshot)),
        lambda old, change: _updated_participants(snapshot, old, change), recipe=_participant_memo,
    )[0]
    if len(memo) >= MAX_PARTICIPANT_MEMO:
        with _PARTICIPANTS_LOCK:  # a racing recall finds an entry gone and computes it again
            if len(memo) >= MAX_PARTICIPANT_MEMO:
                memo.clear()
                memo.catalogs.clear()
    return memo


def _updated_participants(
    snapshot: GraphSnapshot, old: _ParticipantTable, change: StructureChange
) -> _ParticipantTable | None:
    """The parent's participant table for ``snapshot``: the catalog aliases and the contributions of the nodes
    ``change`` left unchanged, when the owner catalog (:func:`_owner_signature`) is the same — a contribution
    reads only its node and the catalog. An appended-only delta copies the table (in C) and drops the rewritten
    nodes' rows; another moves the rows to their new positions. None (build anew) when the catalog changed."""
    signature = _owner_signature(snapshot)
    if signature != old.signature or len(old) >= MAX_PARTICIPANT_MEMO:
        return None
    with _PARTICIPANTS_LOCK:
        catalogs = set(old.catalogs)
        entries = dict(old)
    rewritten = change.rewritten.tolist()
    if change.appended_only and change.appended == change.n_old:
        for c in catalogs:
            for r in rewritten:
                entries.pop((c, r), None)
        return _ParticipantTable(signature, entries, catalogs)
    kept: dict[Hashable, Any] = {("catalog", c): entries[("catalog", c)] for c in catalogs if ("catalog", c) in entries}
    rows: dict[Any, dict[int, Any]] = {c: {} for c in catalogs}
    for k, v in entries.items():  # O(entries): a delete or a move is rarer than an append
        if isinstance(k, tuple) and len(k) == 2 and isinstance(k[1], int) and k[0] in rows:
            rows[k[0]][k[1]] = v
    for c, table in rows.items():
        kept.update(((c, i), v) for i, v in _moved(table, change).items())
    return _ParticipantTable(signature, kept, catalogs)


#: What one scored row adds to an owner candidate: ``(owner key, owner name, base, cap, divisor, source,
#: reason)``, the score being ``base + min(cap, w / divisor)`` for the row's weighted score ``w``.
_Contribution = tuple[str, str, float, float, float, str, str]


def _contributions(
    snapshot: GraphSnapshot, i: int, catalog: list[tuple[str, str, list[tuple[str, str]]]]
) -> tuple[_Contribution, ...]:
    """What node ``i`` adds to the scene-owner candidates as a scored row (see the module docstring): a
    character POV → its owner; any other node → each catalog owner named in its participant text, by its first
    (longest) alias that occurs, in catalog order."""
    if int(snapshot.type_code[i]) == _POV and int(snapshot.owner_type_code[i]) == 1:
        key, name = resolve_pov_owner(snapshot, i)
        return ((key, name, POV_BASE, POV_CAP, POV_DIVISOR, "candidate-pov-owner", "pov-memory"),) if key else ()
    text = _participant_text(snapshot, i) if catalog else ""
    if not text:
        return ()
    found = []
    for key, name, aliases in catalog:
        for alias, folded in aliases:
            if term_occurs(text, folded):
                found.append((key, name, PARTICIPANT_BASE, PARTICIPANT_CAP, PARTICIPANT_DIVISOR,
                              "objective-participant", f"participant:{alias}"))
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

    snap = state.snapshot
    table = state.scored
    limit = min(len(table), max(llm_pool_size(selection), CANDIDATE_SCAN_MIN))
    if not limit:
        return _ordered(merged)
    memo = _participant_memo(snap)
    catalog_key = ("catalog", state.context.owner_catalog)
    catalog = memo.get(catalog_key)
    if catalog is None:
        built = _catalog_aliases(state)
        with _PARTICIPANTS_LOCK:  # the key and the catalog set together: what a child's update copies
            catalog = memo.setdefault(catalog_key, built)
            memo.catalogs.add(state.context.owner_catalog)
    for i, w in zip(table.index[:limit].tolist(), table.weighted_score[:limit].tolist(), strict=True):
        row_key = (state.context.owner_catalog, i)
        contributions = memo.get(row_key)
        if contributions is None:
            contributions = memo[row_key] = _contributions(snap, i, catalog)
        for key, name, base, cap, divisor, source, reason in contributions:
            target = merged.get(key)
            if target is None:
                target = merged[key] = _Candidate(key, name)
            target.add(base + min(cap, w / divisor), source, reason)
    return _ordered(merged)


def _ordered(merged: dict[str, _Candidate]) -> tuple[OwnerCandidate, ...]:
    """The merged candidates by score desc, name, key; the first :data:`MAX_CANDIDATES`."""
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

    def _admit(self, state: RecallState, idx: Sequence[int], scene: ContextInfo) -> list[bool]:
        # ``scene``: the scoring gate's owners (state.context) as a scene: verdicts are shared by its recalls.
        # Scene reconstruction (the only caller) weighs no evidence: a node visible only by a rescue stays out.
        return admissible(state, np.array(idx, dtype=np.int64), context=self.context, scoring=self.scoring,
                          require_active=True, owner_context=scene, rescued=False).tolist()

    def _owner_pov_rows(self, state: RecallState, keys: Sequence[str]) -> dict[str, int]:
        """Best-ranked scored pov_memory node index of each owner key (base-key comparison)."""
        snap = state.snapshot
        table = state.scored
        wanted = {owner_base_key(k) for k in keys}
        found: dict[str, int] = {}
        if not wanted or len(table) == 0:
            return found
        memo = _memo(snap)
        types = memo.codes
        for i in table.index.tolist():  # scored rows only, in ranking order; stops once every owner is found
            if types[i] != _POV:
                continue
            base = memo.pov_base.get(i)
            if base is None:
                base = memo.pov_base[i] = owner_base_key(_pov_owner(snap, memo, i)[0])
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
        # The scoring gate's scene (state.context's owners): what admission and the story-time verdicts read.
        scene = scene_context(state.context)
        final = (
            self._keep_top_ranked(state, selection, self._reconstruct(state, augmented, limit, origins, scene),
                                  limit, origins, origin_default)
            if self.settings.enable_scene_reconstruction
            else augmented
        )

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
            **self._selected_meta(state, final, scene, scene_context(scene, keys, mode)),
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
        self, state: RecallState, selected: list[int], limit: int, origins: dict[int, str], scene: ContextInfo
    ) -> list[int]:
        """Scene reconstruction (§3.16 step 3) restricted to admissible nodes (departure 2).

        Plain Python over the few dozen nodes involved: each node's neighbour lists (already filtered by type
        and ordered as the expansion reads them) and each event's nearest-first events come from the snapshot's
        memo (:func:`_walk_list`), so a walk only reads lists and the verdicts of this recall's admission.
        """
        snap = state.snapshot
        memo = _memo(snap)
        types, archived = memo.codes, memo.flags
        out: list[int] = []
        seen: set[int] = set()
        # Verdict of each node judged in this reconstruction. Admission is per node, so judging a node once, in
        # any batch, gives the verdict every call would have given.
        verdict: dict[int, bool] = {}

        def judge(nodes: Sequence[int]) -> None:
            todo = [j for j in nodes if j not in verdict]
            if todo:
                verdict.update(zip(todo, self._admit(state, todo, scene), strict=True))

        def first_admitted(order: Sequence[int], k: int) -> list[int]:
            """The first ``k`` admissible nodes of ``order`` (all when fewer); unjudged nodes are judged a block
            at a time."""
            found: list[int] = []
            for pos, j in enumerate(order):
                ok = verdict.get(j)
                if ok is None:
                    judge(order[pos:pos + _EVENT_BLOCK])
                    ok = verdict[j]
                if ok:
                    found.append(j)
                    if len(found) >= k:
                        break
            return found

        def nearest_events(e: int) -> list[int]:
            prefix, complete = _walk_list(snap, memo, "near", e)
            found = first_admitted(prefix, NEAREST_EVENTS)
            if len(found) >= NEAREST_EVENTS or complete:
                return found
            # Rare: fewer than 2 of the nearest events are admissible; rank on (window, then every event).
            order, whole = _nearest_order(snap, memo, e, window=True)
            found = first_admitted(order.tolist(), NEAREST_EVENTS)
            if len(found) >= NEAREST_EVENTS or whole:
                return found
            order, _ = _nearest_order(snap, memo, e, window=False)
            found = []
            for lo in range(0, order.size, _EVENT_BLOCK):  # a long chat has thousands: a block at a time
                found.extend(first_admitted(order[lo:lo + _EVENT_BLOCK].tolist(), NEAREST_EVENTS - len(found)))
                if len(found) >= NEAREST_EVENTS:
                    break
            return found

        def add(i: int, origin: str) -> bool:
            if len(out) >= limit or i in seen or archived[i]:
                return False
            seen.add(i)
            out.append(i)
            origins.setdefault(i, origin)
            return True

        def expand_event(e: int) -> None:
            neighbours = _walk_list(snap, memo, "event", e)
            for j in first_admitted(neighbours, len(neighbours)):
                add(j, "scene-reconstruction")
            for j in nearest_events(e):
                add(j, "scene-reconstruction")

        def expand_pov(p: int) -> None:
            for j in first_admitted(_walk_list(snap, memo, "pov", p), POV_NEIGHBORS):
                if add(j, "scene-reconstruction") and types[j] == _EVENT:
                    expand_event(j)

        def expand_entity(c: int) -> None:
            for j in first_admitted(_walk_list(snap, memo, "entity", c), ENTITY_EVENTS):
                if add(j, "scene-reconstruction"):
                    expand_event(j)

        expanders: dict[int, Callable[[int], None]] = {
            _EVENT: expand_event, _POV: expand_pov, _CHARACTER: expand_entity, _LOCATION: expand_entity,
        }
        # Each admission call has a fixed cost of a few vectorised passes, and the walk usually fills the cap
        # within the first few selected nodes: judge in one call what it most likely reads for the next
        # _LOOKAHEAD of them (the verdicts are per node, so this only saves calls).
        judged_upto = 0
        for pos, i in enumerate(selected):
            if len(out) >= limit:
                break
            if pos >= judged_upto:
                judged_upto = pos + _LOOKAHEAD
                judge(_likely_judged(snap, memo, selected[pos:judged_upto]))
            add(i, origins.get(i, "score"))
            expander = expanders.get(types[i])
            if expander is not None:
                expander(i)
        return out

    def _selected_meta(
        self, state: RecallState, final: list[int], scene: ContextInfo, owner_scene: ContextInfo
    ) -> dict[str, Any]:
        """``selectedByBucket/KnowledgeState/StoryTime/Owner`` of reference §3.17: buckets classified with the
        final owners (``owner_scene``), story time of unscored nodes with the scoring's ``scene``."""
        snap = state.snapshot
        memo = _memo(snap)
        idx = np.array(final, dtype=np.int64)
        ids = [snap.ids[i] for i in final]
        timeline_on = self.context.enable_story_timeline if self.context is not None else True
        # Both classifications are per node and read only the snapshot, the scene and the settings: each node's
        # verdicts are kept per scene (:meth:`_SnapshotMemo.scene`).
        buckets, temporal = memo.scene((owner_scene, scene, self.context, timeline_on))
        missing = [i for i in final if i not in buckets]
        if missing:
            found = scope_buckets(snap, np.array(missing, dtype=np.int64), owner_scene, settings=self.context)
            buckets.update(zip(missing, found.tolist(), strict=True))
        by_bucket: dict[str, list[str]] = {}
        for nid, i in zip(ids, final, strict=True):
            by_bucket.setdefault(str(buckets[i]), []).append(nid)
        rows = rows_of(state, idx).tolist()
        table = state.scored
        visible_owners = state.meta.get("knowledgeVisibleOwnersByNode") or {}
        suppressed_owners = state.meta.get("knowledgeSuppressedOwnersByNode") or {}
        # Scored rows carry their story-time verdict; the director runs for the others only.
        missing = [i for i, r in zip(final, rows, strict=True) if r < 0 and i not in temporal]
        if missing:
            director = temporal_director(snap, np.array(missing, dtype=np.int64), scene, enabled=timeline_on)
            verdicts = zip(map(str, director.bucket.tolist()), (round(w, 3) for w in director.weight.tolist()),
                           strict=True)
            temporal.update(zip(missing, verdicts, strict=True))
        labels = memo.story_label
        is_pov = snap.is_pov[idx].tolist()
        knowledge: dict[str, dict[str, Any]] = {}
        story: dict[str, dict[str, Any]] = {}
        by_owner: dict[str, list[str]] = {}
        for p, (i, nid, r) in enumerate(zip(final, ids, rows, strict=True)):
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
                bucket, weight = table.temporal_bucket[r], round(float(table.temporal_weight[r]), 3)
            else:
                knowledge[nid] = {
                    "mode": "selected", "anchored": False, "rescued": False, "ownerCoverage": 0.0,
                    "visibilityScore": 0.0, "visibleOwnerKeys": [], "suppressedOwnerKeys": [],
                }
                bucket, weight = temporal[i]
            label = labels.get(i)
            if label is None:
                node = snap.node(i)
                label = labels[i] = node.story_time.describe() or node.story_time_span.describe()
            story[nid] = {
                "storyTimeLabel": label,
                "temporalBucket": bucket,
                "temporalWeight": weight,
            }
            visible = visible_owners.get(nid, ())
            for key in _unique_str([_pov_owner(snap, memo, i)[0], *visible] if is_pov[p] else visible):
                by_owner.setdefault(key, []).append(nid)
        return {
            "selectedByBucket": by_bucket,
            "selectedByKnowledgeState": knowledge,
            "selectedByStoryTime": story,
            "selectedByOwner": by_owner,
        }


def _events_by_seq(snap: GraphSnapshot, memo: _SnapshotMemo) -> tuple[np.ndarray, np.ndarray]:
    """Every event of the chat sorted by seq (stable), and their seq: once per snapshot, not per recall."""
    if memo.events is None:
        ev = np.flatnonzero(snap.type_code == _EVENT)
        ev = ev[np.argsort(snap.seq[ev], kind="stable")]
        memo.events = (ev, snap.seq[ev])
    return memo.events


def _nearest_order(snap: GraphSnapshot, memo: _SnapshotMemo, e: int, *, window: bool) -> tuple[np.ndarray, bool]:
    """``(events, whole)``: the events other than ``e`` nearest-first (``|seq − s|``, then higher seq, then node
    id). With ``window`` and a long chat only those within seq distance d of ``e``, d set by the
    :data:`_EVENT_BLOCK`-th event on each side: ranked among themselves they are a prefix of the whole order
    (``whole`` False)."""
    ev, ev_seq = _events_by_seq(snap, memo)
    s = snap.seq[e]
    whole = True
    if window and ev.size > 2 * _EVENT_BLOCK:
        p = int(np.searchsorted(ev_seq, s))
        left = int(s - ev_seq[p - _EVENT_BLOCK]) if p >= _EVENT_BLOCK else None
        right = int(ev_seq[p + _EVENT_BLOCK] - s) if p + _EVENT_BLOCK < ev.size else None
        d = min(x for x in (left, right) if x is not None)
        first = int(np.searchsorted(ev_seq, s - d, side="left"))
        last = int(np.searchsorted(ev_seq, s + d, side="right"))
        ev = ev[first:last]
        whole = False
    ev = ev[ev != e]
    if ev.size == 0:
        return ev, whole
    seq = snap.seq[ev]
    return ev[np.lexsort((snap.id_rank[ev], -seq, np.abs(seq - s)))], whole


def _neighbours(snap: GraphSnapshot, i: int) -> np.ndarray:
    """Other endpoints of node ``i``'s active edges, in edge-list order, unique (``i`` itself for a self-loop)."""
    pos = np.asarray(snap.active_edges_of(i), dtype=np.int64)
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    src, dst = snap.edge_src[pos], snap.edge_dst[pos]
    other = np.where(src == i, dst, src)
    # A node has a handful of edges: an ordered dict dedupes them faster than np.unique + sort.
    return np.array(list(dict.fromkeys(other.tolist())), dtype=np.int64)


def _by_recency(snap: GraphSnapshot, idx: np.ndarray) -> tuple[int, ...]:
    """``idx`` most recent first (recency = ``seqRange[1]``, else ``seq``), then importance, then node id."""
    return tuple(idx[np.lexsort((snap.id_rank[idx], -snap.importance[idx], -snap.recency(idx)))].tolist())


def _walk_list(snap: GraphSnapshot, memo: _SnapshotMemo, kind: str, i: int) -> Any:
    """What scene reconstruction reads about node ``i``, built once per snapshot (the walk then keeps the
    admissible entries, in order):

    * ``"event"``: its neighbours of the event-neighbour types, in edge order;
    * ``"pov"``: all its neighbours, most recent first (:func:`_by_recency`);
    * ``"entity"``: its event neighbours, most recent first;
    * ``"near"``: ``(first events of its nearest-first order, complete)``, at most :data:`_NEAREST_PREFIX`;
      ``complete`` when that is the whole order.
    """
    key = (kind, i)
    walks = memo.walk if kind in _IMPORTANCE_FREE_WALKS else _stats_walks(snap)
    found = walks.get(key)
    if found is not None:
        return found
    if kind == "near":
        order, whole = _nearest_order(snap, memo, i, window=True)
        found = (tuple(order[:_NEAREST_PREFIX].tolist()), whole and order.size <= _NEAREST_PREFIX)
    else:
        nb = _neighbours(snap, i)
        if kind == "event":
            found = tuple(j for j in nb.tolist() if memo.codes[j] in _EVENT_NEIGHBOR_CODES)
        elif kind == "pov":
            found = _by_recency(snap, nb)
        else:
            found = _by_recency(snap, nb[snap.type_code[nb] == _EVENT])
    if len(walks) >= MAX_WALK_MEMO:
        walks.clear()
    walks[key] = found
    return found


def _likely_judged(snap: GraphSnapshot, memo: _SnapshotMemo, selected: Sequence[int]) -> list[int]:
    """The nodes scene reconstruction of ``selected`` most likely reads the verdict of: the expansion lists of
    the selected nodes (the first few of the recency-ordered ones) and, for the events among them or likely
    chosen by them, their event-neighbour lists and first nearest events."""
    types = memo.codes
    out: list[int] = []
    events: list[int] = []
    for i in selected:
        t = types[i]
        if t == _EVENT:
            events.append(i)
        elif t == _POV or t == _CHARACTER or t == _LOCATION:
            head = _walk_list(snap, memo, "pov" if t == _POV else "entity", i)[:_LIKELY_HEAD]
            out.extend(head)
            events.extend(j for j in head[:_LIKELY_EXPANDED] if types[j] == _EVENT)
    for e in events:
        out.extend(_walk_list(snap, memo, "event", e))
        out.extend(_walk_list(snap, memo, "near", e)[0][:_LIKELY_NEAREST])
    return out


def _unique_str(values: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for v in values:
        if v and v not in seen:
            seen.add(v)
            out.append(v)
    return out
