"""Scoring stage: lexical, hybrid, scope, story time and knowledge gate, then the ranking (reference §3.12).

Runs after the score map (``cross_recall``, then ``cooccurrence``) and before dedup, diversity and rerank.

Reads
    ``state.candidates`` (score map: node index in insertion order, ``graph_score``, ``vector_score`` =
    blend-weighted similarity, ``vector_raw`` = raw cosine, ``bm25_score`` in [0, 1], ``cooccurrence_boost``),
    ``state.context`` (``owner_keys``, ``owner_mode``, ``active_character_pov_owner``,
    ``active_user_pov_owner``, ``active_region``, ``adjacent_regions``, ``story_segment_id`` /
    ``story_segment_order``, ``cue_mode``), ``state.plan.lexical_sources`` (``NQ(user_message)`` when the
    plan has none), ``state.query.now_ms``, ``state.active`` / ``state.meta["visibility_hidden_mask"]`` /
    ``state.meta["gate_suppressed"]``, and the snapshot arrays (importance, created time, scope codes, region
    strings, story-time codes, knowledge arrays).
Writes
    * ``state.scored``: one row per surviving candidate in ranking order, every :class:`ScoredTable` column
      filled. ``graph_score`` is the score map's graph score, which already includes the co-occurrence boost
      (the co-occurrence stage adds it, as the reference does to ``graphScore``, §3.11; ``cooccurrence_boost``
      is informational and not added again); ``parts`` are the graph/vector/lexical/importance
      parts of the hybrid score multiplied by every weight (scope × knowledge × owner coverage × temporal),
      and ``weighted_score`` is *defined* as their sum ``((graph + vector) + lexical) + importance``, so an
      explanation adds up exactly; it equals the reference's ``finalScore × weights`` within a few ulps.
    * meta (reference §3.21): ``scoredCandidates``, ``lexicalBoostedNodes``, ``lexicalTopHits`` (top 5 with
      lexical > 0 by lexical then final score), ``visibilityTopHits`` (top 6 with visibility > 0),
      ``temporalTopHits`` (first 8 rows), ``scopeBuckets`` / ``temporalBuckets`` (ids per bucket in ranking
      order; the temporal map also lists temporally suppressed nodes), ``bucketWeights``,
      ``knowledgeGateMode`` (``anchored-soft-visibility`` / ``disabled``), ``knowledgeAnchoredNodes``,
      ``knowledgeSuppressedNodes``, ``knowledgeRescuedNodes``, ``knowledgeVisibleOwnersByNode``,
      ``knowledgeSuppressedOwnersByNode``, ``visibilitySuppressedReasons``, ``temporalSuppressedNodes``,
      ``temporalRescuedNodes`` (id lists in score map order, as the reference), plus ``gate_suppressed``: the
      sorted ids the gate removed (knowledge gate and visibility filter, merged with any earlier value), final
      for this recall.
Invariants
    * Ranking = scope-bucket priority desc, temporal-bucket priority desc, ``weighted_score`` desc,
      ``final_score`` desc, then ``snapshot.id_rank`` (departure 10; the reference falls back to score-map
      insertion order).
    * ``parts[r].sum() == weighted_score[r]`` (bit-exact when summed in column order).
    * No node removed by the gate appears in ``state.scored``; the gate runs once per node with all of its
      scores (departure 2).
    * Vectorised over the candidate set; the only per-candidate Python is the lexical field match (it needs
      the node's fields). Scope, region, story-time and knowledge lookups are array operations, the knowledge
      gate is O(owners × candidates) (reference §7 item 22 was O(owners² × N) per call).
Settings
    ``ScoringSettings`` (graph/vector/importance weights, bucket weights, ``inject_low_confidence_objective_
    memory``, ``fusion``: ``"rrf"`` feeds the hybrid score the reciprocal-rank values of the vector and lexical
    scores, :func:`rank_fusion_values`, instead of the scores; ``neighbour_carry`` > 0 first raises each
    candidate's vector and lexical scores to that share of its prev/next chain neighbours',
    :func:`neighbour_carry_values`; with either on, the table's ``vector_score`` / ``lexical_score`` (and the
    lexical meta) hold the values the hybrid score used, while the knowledge gate still sees the scores),
    ``LexicalSettings`` (``enable_lexical_boost``, ``lexical_weight``, ``enable_bm25``),
    ``ContextSettings`` (``enable_scoped_memory``, ``enable_pov_memory``, ``enable_region_scoped_objective``,
    ``enable_cognitive_memory``, ``enable_story_timeline``, ``story_time_soft_directing``).
Skip reasons
    ``no-candidates`` (empty score map; the state is returned unchanged).
Departures (recall-spec)
    * 2 — scene owners are ``state.context.owner_keys`` (final when the request named them, preliminary
      otherwise; nothing recalled widens them); owner keys compare with or without ``#nodeId``; an owner's own
      POV nodes are anchored (``KnowledgeArrays.own_pov``, §7 item 4); candidates outside the active set,
      hidden by the visibility filter or listed in an earlier ``gate_suppressed`` are dropped; the verdict is
      recorded in ``meta["gate_suppressed"]``.
    * 4 — rescue thresholds compare the raw cosine ``vector_raw``, not the blend-weighted score (§7 item 7).
    * 10 — ties break by node id byte order.
    * BM25 channel — ``lexical = max(field match, bm25_score)`` (recall-spec: the BM25 "normalised score feeds
      the lexical weight"), so a strong BM25 hit can also rescue through the lexical ≥ 0.85 rule.
    * 8 — the field match uses the multi-script lexical kernel (the cue mode comes from the context stage,
      which scans only the user message and the newest assistant line).
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from memory_recall.model.graph import PRIMARY_LEXICAL_FIELDS, SECONDARY_LEXICAL_FIELDS, Node
from memory_recall.pipeline._graph_cache import active_mask, cached, hidden_mask
from memory_recall.pipeline.kernels.lexical import (
    PackedNode,
    UnitVocab,
    batch_lexical_scores,
    pack_node,
    prepare_node,
    prepare_sources,
)
from memory_recall.pipeline.kernels.scoring import hybrid_score
from memory_recall.pipeline.state import (
    ContextInfo,
    Explanation,
    ExplanationPart,
    RecallState,
    ScoredTable,
    StageResult,
    StageTrace,
    timed,
)
from memory_recall.settings import ContextSettings, LexicalSettings, ScoringSettings
from memory_recall.store.snapshot import TENSE_CODE, GraphSnapshot
from memory_recall.text.normalize import normalize_query

__all__ = [
    "GATE_MODES",
    "KNOWLEDGE_GATE_MODE",
    "OTHER_POV_WEIGHT",
    "RRF_K",
    "SCOPE_BUCKETS",
    "SCOPE_PRIORITY",
    "TEMPORAL_BUCKETS",
    "TEMPORAL_PRIORITY",
    "GateResult",
    "ScoringStage",
    "TemporalResult",
    "bucket_weights",
    "explain_row",
    "knowledge_gate",
    "node_label",
    "neighbour_carry_values",
    "rank_fusion_values",
    "resolve_owner_rows",
    "scope_buckets",
    "take_rows",
    "temporal_director",
]

# --- constants (reference §1.4, §1.5, §3.12, §5.3) ---------------------------------------------------------

SCOPE_BUCKETS: tuple[str, ...] = (
    "characterPov",
    "userPov",
    "objectiveCurrentRegion",
    "objectiveAdjacentRegion",
    "objectiveGlobal",
    "otherPov",
)
SCOPE_PRIORITY: dict[str, int] = {b: 5 - i for i, b in enumerate(SCOPE_BUCKETS)}
OTHER_POV_WEIGHT = 0.6  # fixed in the reference (§1.4)

TEMPORAL_BUCKETS: tuple[str, ...] = (
    "current",
    "adjacentPast",
    "undated",
    "flashback",
    "distantPast",
    "future",
)
TEMPORAL_PRIORITY: dict[str, int] = {b: 5 - i for i, b in enumerate(TEMPORAL_BUCKETS)}

#: Knowledge gate modes, in code order (index = code used inside :func:`knowledge_gate`).
GATE_MODES: tuple[str, ...] = (
    "no-owner-state",
    "manual-hidden",
    "mistaken-objective",
    "manual-known",
    "anchored",
    "rescued",
    "soft-visible",
    "suppressed",
)
_NO_OWNER, _HIDDEN, _MISTAKEN, _MANUAL, _ANCHORED, _RESCUED, _SOFT, _SUPPRESSED = range(8)
_MODE_ARRAY = np.array(GATE_MODES, dtype=object)
_REASON_ARRAY = np.array(
    ["", "manual-hidden", "mistaken-objective", "", "", "", "", "low-visibility"], dtype=object
)
KNOWLEDGE_GATE_MODE = "anchored-soft-visibility"

# Gate thresholds (§1.5 step 6) and rescue rules (step 7).
_THRESHOLD_POV = 0.18
_THRESHOLD_CURRENT = 0.34
_THRESHOLD_ADJACENT = 0.42
_THRESHOLD_GLOBAL = 0.56
_THRESHOLD_OTHER = 0.4
_RESCUE_VECTOR = 0.82
_RESCUE_LEXICAL = 0.85
_RESCUE_GRAPH = 1.1
_RESCUE_CURRENT_VECTOR = 0.48
_RESCUE_CURRENT_GRAPH = 0.82
_RESCUE_VISIBILITY = 0.68
# Knowledge weights (§3.12 step 7).
_WEIGHT_ANCHORED = 1.18
_WEIGHT_RESCUED = 0.92
_WEIGHT_SOFT_FLOOR = 0.35
_WEIGHT_SOFT_BASE = 0.55
_WEIGHT_SOFT_SLOPE = 0.6
_COVERAGE_BONUS = 0.08

_TENSE_FUTURE = TENSE_CODE["future"]
_TENSE_HYPOTHETICAL = TENSE_CODE["hypothetical"]
_TENSE_FLASHBACK = TENSE_CODE["flashback"]

_SCORE_KIND = "weighted_score"
_PART_NAMES = ("graph", "vector", "lexical", "importance")
#: Reciprocal-rank constant of ``ScoringSettings.fusion = "rrf"`` (the usual k = 60).
RRF_K = 60


# --- per-snapshot arrays (built once per snapshot, cached with it: departure 11) ----------------------------


@dataclass(frozen=True)
class _SnapshotArrays:
    ids: np.ndarray  # (n,) object: node ids
    # The strings the scope buckets compare, as integer codes of ``vocab`` (equal codes ⇔ equal strings), so a
    # recall compares a few hundred integers instead of strings:
    vocab: dict[str, int]
    owner_key_code: np.ndarray  # (n,) int32: scope owner key ("" when objective)
    owner_name_code: np.ndarray  # (n,) int32: scope owner name (or id), lower-cased
    region_primary_code: np.ndarray  # (n,) int32: primary region, lower-cased
    token_flat_code: np.ndarray  # (T,) int32: every node's region tokens, lower-cased, concatenated
    token_offsets: np.ndarray  # (n + 1,) int64 into token_flat_code
    segment_order: dict[str, int]  # story segment id → order
    point_order: np.ndarray  # (n,) float: order of storyTime.segmentId, NaN when unknown
    span_start_order: np.ndarray
    span_end_order: np.ndarray


def _lower_array(values: Sequence[str]) -> np.ndarray:
    arr = np.array(values, dtype=str) if len(values) else np.zeros(0, dtype=str)
    return np.char.lower(arr) if arr.size else arr


def _encode(values: Sequence[str], vocab: dict[str, int]) -> np.ndarray:
    """Integer code of each string, new strings added to ``vocab``."""
    return np.fromiter((vocab.setdefault(v, len(vocab)) for v in values), dtype=np.int32, count=len(values))


def _orders(order: dict[str, int], ids: Sequence[str]) -> np.ndarray:
    # dict.get in C via map; None (unknown id or "") becomes NaN.
    return np.array(list(map(order.get, ids)), dtype=np.float64) if len(ids) else np.zeros(0)


def _snapshot_arrays(snapshot: GraphSnapshot) -> _SnapshotArrays:
    def build() -> _SnapshotArrays:
        lens = np.fromiter(map(len, snapshot.region_tokens), dtype=np.int64, count=snapshot.n)
        offsets = np.zeros(snapshot.n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        order = {seg.id: int(seg.order) for seg in snapshot.timeline.segments}
        ids = np.empty(snapshot.n, dtype=object)
        ids[:] = snapshot.ids
        # Lower-cased as numpy strings (``np.char.lower``), the form the comparisons were defined on.
        vocab: dict[str, int] = {}
        tokens = list(itertools.chain.from_iterable(snapshot.region_tokens))
        return _SnapshotArrays(
            ids=ids,
            vocab=vocab,
            owner_key_code=_encode(list(snapshot.scope_owner_key), vocab),
            owner_name_code=_encode(_lower_array(snapshot.scope_owner_name).tolist(), vocab),
            region_primary_code=_encode(_lower_array(snapshot.region_primary).tolist(), vocab),
            token_flat_code=_encode(_lower_array(tokens).tolist(), vocab),
            token_offsets=offsets,
            segment_order=order,
            point_order=_orders(order, snapshot.segment_id),
            span_start_order=_orders(order, snapshot.span_start_segment),
            span_end_order=_orders(order, snapshot.span_end_segment),
        )

    value, _ = cached(snapshot, ("scoring-arrays",), build)
    return value


#: Prepared lexical fields kept per snapshot before the table is emptied (bounds memory on a huge graph whose
#: recalls keep touching new nodes; emptying only costs re-preparing the fields of the next candidates).
MAX_PREPARED_NODES = 50_000


def _packed_fields(snapshot: GraphSnapshot) -> tuple[Callable[[int], PackedNode | None], UnitVocab]:
    """``(fields_of, vocab)``: ``fields_of(i)`` is node ``i``'s lexical fields normalised (:func:`prepare_node`)
    and packed for :func:`batch_lexical_scores` with the snapshot's unit vocabulary ``vocab``; None when the node
    has no primary or secondary text (its field match is 0).

    Prepared lazily, for the candidates a recall actually scores, and kept with the snapshot (departure 11):
    a node's fields only change with a new store version, i.e. a new snapshot, so the table never goes stale.
    The scores equal what :func:`~memory_recall.pipeline.kernels.lexical.lexical_score` computes from the node's
    fields on every call (tested); only the normalisation work is saved.
    """
    def build() -> tuple[dict[int, PackedNode | None], UnitVocab]:
        return {}, UnitVocab()

    (table, vocab), _ = cached(snapshot, ("lexical-fields",), build)

    def fields_of(i: int) -> PackedNode | None:
        if i in table:
            return table[i]
        raw = snapshot.node(i)
        primary = [t for key in PRIMARY_LEXICAL_FIELDS for t in raw.field_text(key)]
        secondary = [t for key in SECONDARY_LEXICAL_FIELDS for t in raw.field_text(key)]
        node = pack_node(prepare_node(primary, secondary), vocab) if primary or secondary else None
        if len(table) >= MAX_PREPARED_NODES:
            table.clear()  # the vocabulary stays: ids only need to be consistent, not dense
        table[i] = node  # racing threads store equal values: harmless
        return node

    return fields_of, vocab


# --- scope buckets (§1.4) -----------------------------------------------------------------------------------


def _owner_names(context: ContextInfo) -> tuple[list[str], list[str]]:
    """Lower-cased character and user owner names (and owner node ids) of the scene.

    Owner keys are ``type:name`` or ``type:name#nodeId``; both the name and the node id identify the owner
    (departure 2, §7 item 4). The legacy ``active_character_pov_owner`` joins them unless the request named
    the owners (then they are final); the active user owner always does (§3.12 step 3).
    """
    chars: list[str] = []
    users: list[str] = []
    for key in context.owner_keys:
        kind, _, rest = key.strip().lower().partition(":")
        name, _, node_id = rest.partition("#")
        target = chars if kind == "character" else users if kind == "user" else None
        if target is None:
            continue
        target.extend(x for x in (name.strip(), node_id.strip()) if x)
    if context.owner_mode != "request" and context.active_character_pov_owner.strip():
        chars.append(context.active_character_pov_owner.strip().lower())
    if context.active_user_pov_owner.strip():
        users.append(context.active_user_pov_owner.strip().lower())
    return sorted(set(chars)), sorted(set(users))


def _gather_tokens(arrays: _SnapshotArrays, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Region tokens of the rows ``idx`` (flat) and the row position each token belongs to."""
    starts = arrays.token_offsets[idx]
    lens = arrays.token_offsets[idx + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
    row = np.repeat(np.arange(idx.size, dtype=np.int64), lens)
    pos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(starts, lens)
    return arrays.token_flat_code[pos], row


def scope_buckets(
    snapshot: GraphSnapshot,
    node_idx: np.ndarray,
    context: ContextInfo,
    *,
    settings: ContextSettings | None = None,
) -> np.ndarray:
    """Scope bucket of each node of ``node_idx`` (reference §1.4 ``classifyNodeScopeBucket``), as an object
    array of bucket names. Owner and region comparisons are case-insensitive; region tokens are only looked at
    for the given rows. ``settings`` supplies ``enable_scoped_memory`` (off → all ``objectiveGlobal``),
    ``enable_pov_memory`` and ``enable_region_scoped_objective`` (defaults: on). O(len(node_idx) + owners).

    The implicit character-POV fallback never fires in recall (the reference passes
    ``allowImplicitCharacterPovFallback=false``): a character POV of an owner outside the scene is
    ``otherPov``.
    """
    cfg = settings or ContextSettings()
    idx = np.asarray(node_idx, dtype=np.int64)
    m = idx.size
    if not cfg.enable_scoped_memory:
        return np.full(m, "objectiveGlobal", dtype=object)
    if m == 0:
        return np.zeros(0, dtype=object)
    arrays = _snapshot_arrays(snapshot)
    scene = _scene_codes(snapshot, arrays, context, cfg.enable_region_scoped_objective)
    pov = snapshot.is_pov[idx]
    otype = snapshot.owner_type_code[idx]
    keys = arrays.owner_key_code[idx]
    names = arrays.owner_name_code[idx]

    def owned_by(code: int, owners: tuple[list[int], list[int]] | None) -> np.ndarray:
        if owners is None:
            return np.zeros(m, dtype=bool)
        hit = _equals_any(keys, owners[0]) | _equals_any(names, owners[1])
        return (otype == code) & hit

    char_pov = owned_by(1, scene.chars)
    user_pov = owned_by(2, scene.users)

    region_on = scene.region_on
    current = np.zeros(m, dtype=bool)
    near = np.zeros(m, dtype=bool)
    if region_on:
        primary = arrays.region_primary_code[idx]
        active_codes = scene.active
        adjacent_codes = scene.adjacent
        current = _equals_any(primary, active_codes)
        near = _equals_any(primary, adjacent_codes)
        tokens, row = _gather_tokens(arrays, idx)
        if tokens.size:
            near[row[_equals_any(tokens, active_codes + adjacent_codes)]] = True

    conditions = [
        pov & (not cfg.enable_pov_memory),
        pov & char_pov,
        pov & user_pov,
        pov & (otype == 2) & (scene.users is None),
        pov,
        np.full(m, not region_on),
        current,
        near,
    ]
    return _SCOPE_CHOICES[_first_match(conditions, m)]


@dataclass(frozen=True)
class _SceneCodes:
    """Vocabulary codes of what one scene compares against (``scope_buckets``): ``(owner-key codes, owner-name
    codes)`` of the character and user owners (None when the scene has none), whether the region is on, and the
    codes of the active and adjacent regions."""

    chars: tuple[list[int], list[int]] | None
    users: tuple[list[int], list[int]] | None
    region_on: bool
    active: list[int]
    adjacent: list[int]


#: Scene codes kept per snapshot (weak keys: they die with it); emptied past this many scenes.
MAX_SCENES_PER_SNAPSHOT = 64
_SCENES: weakref.WeakKeyDictionary[GraphSnapshot, dict[Hashable, _SceneCodes]] = weakref.WeakKeyDictionary()
_SCENES_LOCK = threading.Lock()


def _scene_codes(
    snapshot: GraphSnapshot, arrays: _SnapshotArrays, context: ContextInfo, region_scoped: bool
) -> _SceneCodes:
    """The :class:`_SceneCodes` of ``context`` on ``snapshot``. A recall classifies several node sets of one scene
    (scoring, admission, owners, result): the owner names and their codes are derived once per scene (the
    fields read here, compared by value) instead of once per call."""
    key = (
        context.owner_keys, context.owner_mode, context.active_character_pov_owner, context.active_user_pov_owner,
        context.active_region, tuple(context.adjacent_regions), bool(region_scoped),
    )
    with _SCENES_LOCK:
        found = _SCENES.get(snapshot, {}).get(key)
    if found is not None:
        return found
    vocab = arrays.vocab

    def codes(values: Sequence[str]) -> list[int]:
        # Codes of the strings numpy would compare (converted to a numpy string array); a string no node holds
        # has no code and matches nothing.
        return sorted(vocab[v] for v in set(np.asarray(values, dtype=str).tolist()) if v in vocab)

    def owner_codes(kind: str, owners: list[str]) -> tuple[list[int], list[int]] | None:
        return (codes([f"{kind}:{o}" for o in owners]), codes(owners)) if owners else None

    chars, users = _owner_names(context)
    active = context.active_region.strip().lower()
    adjacent = sorted({a.strip().lower() for a in context.adjacent_regions} - {""})
    region_on = region_scoped and bool(active)
    scene = _SceneCodes(
        chars=owner_codes("character", chars),
        users=owner_codes("user", users),
        region_on=region_on,
        active=codes([active]) if region_on else [],
        adjacent=codes(adjacent) if region_on and adjacent else [],
    )
    with _SCENES_LOCK:
        per = _SCENES.get(snapshot)
        if per is None:
            per = _SCENES[snapshot] = {}
        if len(per) >= MAX_SCENES_PER_SNAPSHOT:
            per.clear()
        per[key] = scene
    return scene


#: ``scope_buckets``' bucket per condition, then the default (index ``len(conditions)``).
_SCOPE_CHOICES = np.array(
    [
        "otherPov",
        "characterPov",
        "userPov",
        "userPov",
        "otherPov",
        "objectiveGlobal",
        "objectiveCurrentRegion",
        "objectiveAdjacentRegion",
        "objectiveGlobal",
    ],
    dtype=object,
)


def _first_match(conditions: Sequence[np.ndarray], m: int) -> np.ndarray:
    """Per element, the index of the first true condition (``len(conditions)`` when none is): ``np.select``'s
    first-match rule as an integer code, so a caller picks its values from small tables (a few µs for a few
    hundred nodes, where ``np.select`` over object arrays of names costs tens of µs per call)."""
    stacked = np.empty((len(conditions) + 1, m), dtype=bool)
    for row, cond in enumerate(conditions):
        stacked[row] = cond
    stacked[-1] = True
    return stacked.argmax(axis=0)


def _equals_any(values: np.ndarray, codes: Sequence[int]) -> np.ndarray:
    """``np.isin(values, codes)`` for the handful of codes a scene names: one comparison per code."""
    out = np.zeros(values.shape[0], dtype=bool)
    for c in codes:
        out |= values == c
    return out


def _lookup_names(names: np.ndarray, table: dict[str, float], default: float) -> np.ndarray:
    """``table[name]`` for each entry of an object array of names (one vectorised comparison per key)."""
    out = np.full(names.shape[0], default, dtype=np.float64)
    for key, value in table.items():
        out[names == key] = value
    return out


def bucket_weights(scoring: ScoringSettings) -> dict[str, float]:
    """Bucket → weight (reference §1.4; ``otherPov`` fixed at 0.6), in bucket priority order."""
    return {
        "characterPov": float(scoring.character_pov_weight),
        "userPov": float(scoring.user_pov_weight),
        "objectiveCurrentRegion": float(scoring.objective_current_region_weight),
        "objectiveAdjacentRegion": float(scoring.objective_adjacent_region_weight),
        "objectiveGlobal": float(scoring.objective_global_weight),
        "otherPov": OTHER_POV_WEIGHT,
    }


# --- story time (§3.12 step 4) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemporalResult:
    """Temporal director verdict per node: bucket, weight, suppressed, rescued (flashback cue), reason."""

    bucket: np.ndarray
    weight: np.ndarray
    suppressed: np.ndarray
    rescued: np.ndarray
    reason: np.ndarray


def temporal_director(
    snapshot: GraphSnapshot, node_idx: np.ndarray, context: ContextInfo, *, enabled: bool = True
) -> TemporalResult:
    """Reference ``classifyStoryTemporalBucket`` for each node of ``node_idx``, vectorised.

    Rules in order: no story time at all → ``undated`` 0.88; point tense future/hypothetical → ``future``
    (0.72 with a future cue, else 0.2 and suppressed); no resolvable active segment → ``undated`` 0.92; with
    span (else point) start and end orders known: ``start ≤ active ≤ end`` → ``current`` 1.15; ``end <
    active`` → ``flashback`` when the tense or the cue is flashback (1.02 and rescued with the cue, else
    0.72), else ``adjacentPast`` 1.0 within 2 segments, else ``distantPast`` 0.64; ``start > active`` →
    ``future`` (0.74 with a future cue, else 0.22 and suppressed); otherwise ``undated`` 0.9.
    ``enabled=False`` → ``undated``, weight 1. Segment orders come from a per-snapshot id → order map.
    """
    idx = np.asarray(node_idx, dtype=np.int64)
    m = idx.size
    if not enabled or m == 0:
        return TemporalResult(
            bucket=np.full(m, "undated", dtype=object),
            weight=np.ones(m),
            suppressed=np.zeros(m, dtype=bool),
            rescued=np.zeros(m, dtype=bool),
            reason=np.full(m, "timeline-disabled" if not enabled else "", object),
        )
    arrays = _snapshot_arrays(snapshot)
    active = context.story_segment_order
    if active is None and context.story_segment_id:
        active = arrays.segment_order.get(context.story_segment_id)
    cue = context.cue_mode
    tense = snapshot.tense_code[idx]
    has_time = snapshot.has_story_label[idx] | snapshot.has_span_label[idx]
    point_future = (tense == _TENSE_FUTURE) | (tense == _TENSE_HYPOTHETICAL)
    point = arrays.point_order[idx]
    start = np.where(np.isnan(arrays.span_start_order[idx]), point, arrays.span_start_order[idx])
    end = np.where(np.isnan(arrays.span_end_order[idx]), point, arrays.span_end_order[idx])
    known = ~np.isnan(start) & ~np.isnan(end)
    has_active = active is not None
    a = float(active) if active is not None else np.nan
    with np.errstate(invalid="ignore"):
        inside = known & (start <= a) & (a <= end)
        past = known & (end < a)
        after = known & (start > a)
        near = (a - end) <= 2
    flash = (tense == _TENSE_FLASHBACK) | (cue == "flashback")
    future_cue = cue == "future"
    rules: list[tuple[np.ndarray, str, float, bool, bool, str]] = [
        # (condition, bucket, weight, suppressed, rescued, reason) — first match wins
        (~has_time, "undated", 0.88, False, False, "no-story-time"),
        (point_future, "future", 0.72 if future_cue else 0.2, not future_cue, False, "point-future-tense"),
        (np.full(m, not has_active), "undated", 0.92, False, False, "no-active-segment"),
        (inside, "current", 1.15, False, False, "in-active-segment"),
        (
            past & flash,
            "flashback",
            1.02 if cue == "flashback" else 0.72,
            False,
            cue == "flashback",
            "flashback-cue" if cue == "flashback" else "flashback-tense",
        ),
        (past & near, "adjacentPast", 1.0, False, False, "recent-past"),
        (past, "distantPast", 0.64, False, False, "distant-past"),
        (after, "future", 0.74 if future_cue else 0.22, not future_cue, False, "after-active-segment"),
    ]
    # One first-match code per node, then each output read from a table (last entry: no rule matched).
    code = _first_match([r[0] for r in rules], m)
    bucket = np.array([*(r[1] for r in rules), "undated"], dtype=object)[code]
    weight = np.array([*(r[2] for r in rules), 0.9], dtype=np.float64)[code]
    suppressed = np.array([*(r[3] for r in rules), False], dtype=bool)[code]
    rescued = np.array([*(r[4] for r in rules), False], dtype=bool)[code]
    reason = np.array([*(r[5] for r in rules), "unknown-segment"], dtype=object)[code]
    return TemporalResult(bucket, weight, suppressed, rescued, reason)


# --- knowledge gate (§1.5) ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateResult:
    """Multi-owner knowledge gate verdict for ``m`` nodes and ``k`` owners (reference §1.5).

    ``visibility`` and ``threshold`` are maxima over all owners, ``anchored``/``rescued`` OR-ed over the
    visible owners, ``coverage`` = visible owners / owners (1 when there is no owner), ``mode`` the first
    visible owner's mode upgraded to ``anchored`` / ``manual-known`` when a visible owner is; for an invisible
    node ``mode`` and ``reason`` are the first owner's. ``owner_visible`` is (k × m).
    """

    visible: np.ndarray
    mode: np.ndarray
    reason: np.ndarray
    anchored: np.ndarray
    rescued: np.ndarray
    visibility: np.ndarray
    threshold: np.ndarray
    coverage: np.ndarray
    owner_visible: np.ndarray

    def __len__(self) -> int:
        return int(self.visible.shape[0])


def resolve_owner_rows(snapshot: GraphSnapshot, owner_keys: Sequence[str]) -> np.ndarray:
    """Knowledge rows of ``owner_keys`` (−1 for a key without an entry); keys match with or without
    ``#nodeId`` (departure 2). O(keys × owners)."""
    return np.array([snapshot.knowledge.row(k) for k in owner_keys], dtype=np.int64)


def knowledge_gate(
    snapshot: GraphSnapshot,
    node_idx: np.ndarray,
    owner_rows: Sequence[int] | np.ndarray,
    vector_raw: np.ndarray,
    graph: np.ndarray,
    lexical: np.ndarray,
    bucket: np.ndarray,
    *,
    inject_low_confidence: bool = False,
) -> GateResult:
    """Knowledge gate of the nodes ``node_idx`` for the scene owners ``owner_rows`` (rows of
    ``snapshot.knowledge``, −1 = an owner key without an entry), vectorised: O(owners × nodes).

    Per owner (reference §1.5): no entry → visible ``no-owner-state``; manually hidden → invisible; objective
    node the owner is mistaken about → invisible; ``anchored`` = known / manual-known / the owner's own
    character node / the owner's own POV node (``own_pov``: departure 2, §7 item 4); ``base = max(visibility,
    anchored)``; threshold POV 0.18, current region 0.34, adjacent 0.42, global 0.56 (0 with
    ``inject_low_confidence``), other 0.4; an objective, non-anchored node is rescued (visibility ≥ 0.68) when
    the **raw cosine** ``vector_raw`` ≥ 0.82 (departure 4), ``lexical`` ≥ 0.85, ``graph`` ≥ 1.1, or in the
    current region with raw cosine ≥ 0.48 or graph ≥ 0.82. ``bucket`` holds scope bucket names.
    """
    idx = np.asarray(node_idx, dtype=np.int64)
    m = idx.size
    rows = np.asarray(owner_rows, dtype=np.int64).reshape(-1)
    k = rows.size
    if k == 0:
        return GateResult(
            visible=np.ones(m, dtype=bool),
            mode=np.full(m, GATE_MODES[_NO_OWNER], dtype=object),
            reason=np.full(m, "", dtype=object),
            anchored=np.zeros(m, dtype=bool),
            rescued=np.zeros(m, dtype=bool),
            visibility=np.zeros(m),
            threshold=np.zeros(m),
            coverage=np.ones(m),
            owner_visible=np.zeros((0, m), dtype=bool),
        )
    bucket = np.asarray(bucket, dtype=object)
    raw = np.asarray(vector_raw, dtype=np.float64)
    graph = np.asarray(graph, dtype=np.float64)
    lexical = np.asarray(lexical, dtype=np.float64)
    pov = snapshot.is_pov[idx]
    objective = ~pov
    current = bucket == "objectiveCurrentRegion"
    # First matching condition wins (as np.select, whose fixed cost dominates for the few hundred nodes of a
    # recall): assign from the last condition to the first.
    threshold = np.full(m, _THRESHOLD_OTHER)
    threshold[bucket == "objectiveGlobal"] = 0.0 if inject_low_confidence else _THRESHOLD_GLOBAL
    threshold[bucket == "objectiveAdjacentRegion"] = _THRESHOLD_ADJACENT
    threshold[current] = _THRESHOLD_CURRENT
    threshold[pov] = _THRESHOLD_POV
    strong = (
        (raw >= _RESCUE_VECTOR)
        | (lexical >= _RESCUE_LEXICAL)
        | (graph >= _RESCUE_GRAPH)
        | (current & ((raw >= _RESCUE_CURRENT_VECTOR) | (graph >= _RESCUE_CURRENT_GRAPH)))
    )

    know = snapshot.knowledge
    n_owners = know.known.shape[0]
    has = (rows >= 0) & (rows < n_owners)
    if n_owners:
        grid = np.ix_(np.where(has, rows, 0), idx)
        live = has[:, None]
        hidden = know.hidden[grid] & live
        mistaken = know.mistaken[grid] & live & objective[None, :]
        manual = know.manual_known[grid] & live
        anchored = (know.known[grid] | know.own_pov[grid]) & live
        # Stored as float32 in the snapshot: 7 decimals recover the decimal the owner entry holds (0.6, not
        # 0.6000000238), so the weight is the reference's 0.55 + 0.6 × 0.6 = 0.91.
        vis = np.where(live, np.round(know.visibility[grid].astype(np.float64), 7), 0.0)
    else:
        hidden = mistaken = manual = anchored = np.zeros((k, m), dtype=bool)
        vis = np.zeros((k, m))
    early = hidden | mistaken
    anchored &= ~early
    manual &= ~early
    base = np.maximum(vis, anchored.astype(np.float64))
    rescued = has[:, None] & ~early & ~anchored & (objective & strong)[None, :]
    vis_o = np.where(rescued, np.maximum(base, _RESCUE_VISIBILITY), base)
    thr_o = np.broadcast_to(threshold, (k, m))
    gated = has[:, None] & ~early
    visible_o = ~has[:, None] | (gated & (anchored | (vis_o >= thr_o) | rescued))
    neutral = early | ~has[:, None]  # early returns and missing entries report visibility 0, threshold 0
    vis_o = np.where(neutral, 0.0, vis_o)
    thr_o = np.where(neutral, 0.0, thr_o)
    # First matching condition wins: no entry, hidden, mistaken, manual, anchored, rescued, soft, else suppressed.
    mode_o = np.full((k, m), _SUPPRESSED, dtype=np.int64)
    for cond, code in ((visible_o, _SOFT), (rescued, _RESCUED), (anchored, _ANCHORED), (manual, _MANUAL),
                       (mistaken, _MISTAKEN), (hidden, _HIDDEN)):
        mode_o[cond] = code
    mode_o[~has] = _NO_OWNER

    visible = visible_o.any(axis=0)
    cols = np.arange(m)
    first = np.argmax(visible_o, axis=0)  # first visible owner; 0 (first owner) when none is visible
    mode = mode_o[first, cols]
    vis_anchor = visible_o & ((mode_o == _ANCHORED) | (mode_o == _MANUAL))
    upgrade = visible & vis_anchor.any(axis=0) & (mode != _ANCHORED) & (mode != _MANUAL)
    mode = np.where(upgrade, _ANCHORED, mode)
    mode = np.where(visible & (visible_o & (mode_o == _MANUAL)).any(axis=0), _MANUAL, mode)
    return GateResult(
        visible=visible,
        mode=_MODE_ARRAY[mode],
        reason=np.where(visible, "", _REASON_ARRAY[mode]).astype(object),
        anchored=(anchored & visible_o).any(axis=0),
        rescued=(rescued & visible_o).any(axis=0),
        visibility=vis_o.max(axis=0),
        threshold=thr_o.max(axis=0),
        coverage=visible_o.sum(axis=0) / k,
        owner_visible=visible_o,
    )


# --- helpers ------------------------------------------------------------------------------------------------


def node_label(node: Node) -> str:
    """Reference diagnostics label: name, title, summary, else the id."""
    for key in ("name", "title", "summary"):
        texts = node.field_text(key)
        if texts:
            return texts[0]
    return node.id


def take_rows(table: ScoredTable, rows: np.ndarray) -> ScoredTable:
    """The rows ``rows`` of ``table`` (in that order), every column taken alike."""
    rows = np.asarray(rows, dtype=np.int64)
    values: dict[str, Any] = {}
    for f in fields(table):
        col = getattr(table, f.name)
        if isinstance(col, np.ndarray):
            values[f.name] = col[rows].copy()
        else:
            values[f.name] = tuple(col[int(r)] for r in rows)
    return ScoredTable(**values)


def _column(values: np.ndarray, m: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (m,):
        return np.zeros(m)
    return np.where(np.isfinite(arr), arr, 0.0)


def rank_fusion_values(scores: np.ndarray, id_rank: np.ndarray, k: int = RRF_K) -> np.ndarray:
    """Reciprocal-rank values ``(k + 1) / (k + rank)`` of ``scores`` (rank 1 = the highest score, ties by
    ``id_rank``), so the best row gets 1; rows with a score ≤ 0 (or non-finite) get 0.

    >>> rank_fusion_values(np.array([0.2, 0.9, 0.0, 0.5]), np.arange(4)).round(4).tolist()
    [0.9683, 1.0, 0.0, 0.9839]
    """
    s = np.where(np.isfinite(scores), scores, 0.0)
    out = np.zeros(s.size)
    order = np.lexsort((id_rank, -s))
    order = order[s[order] > 0]
    out[order] = (k + 1) / (k + np.arange(1, order.size + 1, dtype=np.float64))
    return out


def neighbour_carry_values(
    scores: np.ndarray, idx: np.ndarray, prev_index: np.ndarray, next_index: np.ndarray, carry: float
) -> np.ndarray:
    """``max(score, carry × score of the prev/next chain neighbour)`` per candidate row (neighbours outside
    the candidates count as 0; non-finite scores as 0).

    >>> neighbour_carry_values(np.array([0.8, 0.1, 0.4]), np.array([0, 1, 5]),
    ...                        np.array([-1, 0, 1, 2, 3, 4]), np.array([1, 2, 3, 4, 5, -1]), 0.5).tolist()
    [0.8, 0.4, 0.4]
    """
    s = np.where(np.isfinite(scores), scores, 0.0)
    n = prev_index.size
    full = np.zeros(n + 1)  # slot n = "no neighbour"
    full[idx] = s
    out = s.copy()
    for neighbour in (prev_index, next_index):
        nb = neighbour[idx]
        nb = np.where((nb >= 0) & (nb < n), nb, n)
        out = np.maximum(out, carry * full[nb])
    return out


def explain_row(
    snapshot: GraphSnapshot,
    table: ScoredTable,
    row: int,
    scoring: ScoringSettings,
    lexical: LexicalSettings,
) -> Explanation:
    """The :class:`Explanation` of one scored row: the four weighted parts (their contributions sum to
    ``weighted_score``), each with its normalised input as ``value`` and the effective weight (hybrid weight /
    weight sum × decay × every multiplier) as ``weight``."""
    delta = float(lexical.lexical_weight) if lexical.enable_lexical_boost else 0.0
    raw_weights = (scoring.graph_weight, scoring.vector_weight, delta, scoring.importance_weight)
    denom = max(1e-6, sum(max(0.0, w) for w in raw_weights))
    node_i = int(table.index[row])
    multipliers = {
        "decay": float(table.decay[row]),
        "scope": float(table.scope_weight[row]),
        "knowledge": float(table.knowledge_weight[row]),
        "owner_coverage": float(table.owner_coverage_weight[row]),
        "temporal": float(table.temporal_weight[row]),
    }
    values = (
        min(1.0, max(0.0, float(table.graph_score[row]) / 2.0)),
        min(1.0, max(0.0, float(table.vector_score[row]))),
        min(1.0, max(0.0, float(table.lexical_score[row]))),
        min(1.0, max(0.0, float(snapshot.importance[node_i]) / 10.0)),
    )
    # The multiplier product is only needed for a part whose value is 0 (its weight cannot be read off the
    # contribution): computed then, once.
    # math.prod multiplies left to right like np.prod's reduce over five floats (same result), without its
    # array round trip (a few µs per selected node).
    scale = math.prod(multipliers.values()) if min(values) <= 0 else 1.0
    parts = []
    for name, value, w, contribution in zip(_PART_NAMES, values, raw_weights, table.parts[row].tolist(),
                                            strict=True):
        weight = float(contribution) / value if value > 0 else w / denom * scale
        parts.append(ExplanationPart(name, value, weight, float(contribution)))
    return Explanation(
        node_id=snapshot.ids[node_i],
        score=float(table.weighted_score[row]),
        score_kind=_SCORE_KIND,
        parts=tuple(parts),
        multipliers=multipliers,
        notes={
            "final_score": float(table.final_score[row]),
            "scope_bucket": table.scope_bucket[row],
            "knowledge_mode": table.knowledge_mode[row],
            "temporal_bucket": table.temporal_bucket[row],
        },
    )


# --- the stage ----------------------------------------------------------------------------------------------


class ScoringStage:
    """Lexical, hybrid, scope, story-time and knowledge scoring plus ranking (reference §3.12); see the module
    docstring for the contract.

    Usage: ``ScoringStage(settings.scoring, settings.lexical, settings.context).run(state)``.
    """

    name = "scoring"

    def __init__(self, settings: ScoringSettings, lexical: LexicalSettings, context: ContextSettings) -> None:
        self.settings = settings
        self.lexical = lexical
        self.context = context

    def run(self, state: RecallState) -> StageResult:
        with timed() as elapsed:
            new_state, trace_fields = self._run(state)
        return StageResult(new_state, StageTrace(name=self.name, elapsed_ms=elapsed[0], **trace_fields))

    # -- steps ---------------------------------------------------------------------------------------------

    def _lexical(self, state: RecallState, idx: np.ndarray, bm25: np.ndarray) -> np.ndarray:
        """Reference field match against the lexical sources, max-combined with the BM25 score; 0 when the
        lexical boost is off (§3.12 step 1)."""
        m = idx.size
        if not self.lexical.enable_lexical_boost:
            return np.zeros(m)
        sources = state.plan.lexical_sources or (normalize_query(state.query.user_message),)
        prepared = prepare_sources(sources)
        field_match = np.zeros(m)
        if prepared.items:
            fields_of, vocab = _packed_fields(state.snapshot)
            field_match = batch_lexical_scores([fields_of(i) for i in idx.tolist()], prepared, vocab)
        field_match = field_match * float(self.lexical.field_match_weight)
        if self.lexical.enable_bm25:
            return np.maximum(field_match, np.clip(bm25, 0.0, 1.0))
        return field_match

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        snap = state.snapshot
        cands = state.candidates
        base: dict[str, Any] = {"score_kind": _SCORE_KIND, "score_direction": "higher_is_better"}
        m_in = len(cands)
        if m_in == 0:
            return state, {**base, "skipped": True, "skip_reason": "no-candidates"}

        # Score-map columns; a node listed twice keeps its first entry.
        idx_all = np.asarray(cands.index, dtype=np.int64)
        _, first = np.unique(idx_all, return_index=True)
        keep_pos = np.sort(first)
        keep_pos = keep_pos[(idx_all[keep_pos] >= 0) & (idx_all[keep_pos] < snap.n)]
        graph = _column(cands.graph_score, m_in)[keep_pos]  # co-occurrence boost included (module docstring)
        vector = _column(cands.vector_score, m_in)[keep_pos]
        raw = _column(cands.vector_raw, m_in)[keep_pos]
        bm25 = _column(cands.bm25_score, m_in)[keep_pos]
        idx = idx_all[keep_pos]

        # Eligibility (departure 2): archived and inactive nodes never score; hidden or already-gated ones are
        # suppressed for good.
        arrays = _snapshot_arrays(snap)
        prior = {str(x) for x in state.meta.get("gate_suppressed", ())}
        hidden = hidden_mask(state)
        is_hidden = hidden[idx] if hidden is not None else np.zeros(idx.size, dtype=bool)
        if prior:
            prior_idx = np.array(sorted(snap.index[x] for x in prior if x in snap.index), dtype=np.int64)
            is_hidden |= np.isin(idx, prior_idx)
        eligible = active_mask(state)[idx] & ~snap.archived[idx] & ~is_hidden
        hidden_ids = arrays.ids[idx[is_hidden]].tolist()
        dropped_inactive = int((~eligible & ~is_hidden).sum())
        idx, graph, vector, raw, bm25 = (a[eligible] for a in (idx, graph, vector, raw, bm25))
        m = idx.size

        lexical = self._lexical(state, idx, bm25)
        delta = float(self.lexical.lexical_weight) if self.lexical.enable_lexical_boost else 0.0
        fused_vector, fused_lexical = vector, lexical
        carry = float(self.settings.neighbour_carry)
        if carry > 0.0:
            fused_vector = neighbour_carry_values(fused_vector, idx, snap.prev_index, snap.next_index, carry)
            fused_lexical = neighbour_carry_values(fused_lexical, idx, snap.prev_index, snap.next_index, carry)
        if self.settings.fusion == "rrf":
            fused_vector = rank_fusion_values(fused_vector, snap.id_rank[idx])
            fused_lexical = rank_fusion_values(fused_lexical, snap.id_rank[idx])
        hp = hybrid_score(
            graph,
            fused_vector,
            fused_lexical,
            snap.importance[idx],
            snap.created_time[idx] if self.settings.time_decay else np.full(m, np.nan),  # NaN → decay 1.0
            float(state.query.now_ms),
            graph_weight=self.settings.graph_weight,
            vector_weight=self.settings.vector_weight,
            importance_weight=self.settings.importance_weight,
            lexical_weight=delta,
        )

        ctx = state.context
        buckets = scope_buckets(snap, idx, ctx, settings=self.context)
        weights_map = bucket_weights(self.settings)
        scope_w = (
            _lookup_names(buckets, weights_map, 1.0) if self.context.enable_scoped_memory else np.ones(m)
        )

        timeline_on = self.context.enable_story_timeline
        soft = timeline_on and self.context.story_time_soft_directing
        tr = temporal_director(snap, idx, ctx, enabled=timeline_on)

        gate_on = self.context.enable_cognitive_memory
        owner_keys = tuple(ctx.owner_keys)
        n_owners = len(owner_keys)
        if gate_on:
            gate = knowledge_gate(
                snap,
                idx,
                resolve_owner_rows(snap, owner_keys),
                raw,
                graph,
                lexical,
                buckets,
                inject_low_confidence=self.settings.inject_low_confidence_objective_memory,
            )
            know_w = np.where(
                gate.anchored,
                _WEIGHT_ANCHORED,
                np.where(
                    gate.rescued,
                    _WEIGHT_RESCUED,
                    np.maximum(_WEIGHT_SOFT_FLOOR, _WEIGHT_SOFT_BASE + _WEIGHT_SOFT_SLOPE * gate.visibility),
                ),
            )
            cover_w = 1.0 + np.maximum(0.0, gate.coverage - 1.0 / max(1, n_owners)) * _COVERAGE_BONUS
            visible = gate.visible
            modes = gate.mode
        else:
            gate = None
            know_w = np.ones(m)
            cover_w = np.ones(m)
            visible = np.ones(m, dtype=bool)
            modes = np.full(m, "disabled", dtype=object)
        temporal_w = tr.weight if soft else np.ones(m)
        t_suppressed = visible & tr.suppressed if soft else np.zeros(m, dtype=bool)

        multiplier = ((scope_w * know_w) * cover_w) * temporal_w
        parts = np.stack([hp.graph, hp.vector, hp.lexical, hp.importance], axis=1) * multiplier[:, None]
        weighted = ((parts[:, 0] + parts[:, 1]) + parts[:, 2]) + parts[:, 3]

        # Rank the gate-visible rows (temporally suppressed ones included: temporalBuckets lists them).
        s_prio = _lookup_names(buckets, {b: float(p) for b, p in SCOPE_PRIORITY.items()}, 0.0)
        t_prio = _lookup_names(tr.bucket, {b: float(p) for b, p in TEMPORAL_PRIORITY.items()}, 0.0)
        order = np.lexsort((snap.id_rank[idx], -hp.score, -weighted, -t_prio, -s_prio))
        order = order[visible[order]]
        kept = order[~t_suppressed[order]]

        table = ScoredTable(
            index=idx[kept].copy(),
            final_score=hp.score[kept].copy(),
            weighted_score=weighted[kept].copy(),
            graph_score=graph[kept].copy(),
            vector_score=fused_vector[kept].copy(),
            lexical_score=fused_lexical[kept].copy(),
            parts=parts[kept].copy(),
            decay=hp.decay[kept].copy(),
            scope_bucket=tuple(buckets[kept].tolist()),
            scope_weight=scope_w[kept].copy(),
            knowledge_mode=tuple(modes[kept].tolist()),
            knowledge_weight=know_w[kept].copy(),
            knowledge_visibility=(gate.visibility[kept].copy() if gate is not None else np.zeros(kept.size)),
            owner_coverage=(gate.coverage[kept].copy() if gate is not None else np.ones(kept.size)),
            owner_coverage_weight=cover_w[kept].copy(),
            temporal_bucket=tuple(tr.bucket[kept].tolist()),
            temporal_weight=temporal_w[kept].copy(),
        )

        ids = arrays.ids[idx].tolist()
        meta = self._meta(
            state, table, ids, idx, order, buckets, tr, gate, owner_keys, t_suppressed, hidden_ids, prior
        )
        new_state = state.evolve(scored=table, meta=state.with_meta(**meta))
        notes = {
            "owner_keys": list(owner_keys),
            "owner_mode": ctx.owner_mode,
            "cue_mode": ctx.cue_mode,
            "dropped_inactive": dropped_inactive,
            "dropped_hidden": len(hidden_ids),
            "knowledge_suppressed": int((~visible).sum()),
            "temporal_suppressed": int(t_suppressed.sum()),
            "lexical_weight": delta,
        }
        return new_state, {**base, "count_in": m_in, "count_out": len(table), "notes": notes}

    def _meta(
        self,
        state: RecallState,
        table: ScoredTable,
        ids: list[str],
        idx: np.ndarray,
        order: np.ndarray,
        buckets: np.ndarray,
        tr: TemporalResult,
        gate: GateResult | None,
        owner_keys: tuple[str, ...],
        t_suppressed: np.ndarray,
        hidden_ids: list[str],
        prior: set[str],
    ) -> dict[str, Any]:
        snap = state.snapshot
        kept_ids = _snapshot_arrays(snap).ids[table.index].tolist()
        n_rows = len(table)
        rows = np.arange(n_rows)

        def label(i: int) -> str:
            return node_label(snap.node(int(i)))

        lex_rows = rows[table.lexical_score > 0]
        lex_rows = lex_rows[
            np.lexsort((lex_rows, -table.final_score[lex_rows], -table.lexical_score[lex_rows]))
        ]
        lexical_top = [
            {
                "nodeId": kept_ids[r],
                "type": snap.type_of(int(table.index[r])),
                "label": label(table.index[r]),
                "lexicalScore": round(float(table.lexical_score[r]), 3),
                "finalScore": round(float(table.final_score[r]), 3),
            }
            for r in lex_rows[:5].tolist()
        ]
        vis_rows = rows[table.knowledge_visibility > 0]
        vis_rows = vis_rows[np.lexsort((vis_rows, -table.knowledge_visibility[vis_rows]))]
        visibility_top = [
            {
                "nodeId": kept_ids[r],
                "label": label(table.index[r]),
                "visibilityScore": round(float(table.knowledge_visibility[r]), 3),
                "knowledgeMode": table.knowledge_mode[r],
            }
            for r in vis_rows[:6].tolist()
        ]
        kept_pos = order[~t_suppressed[order]]
        temporal_top = [
            {
                "nodeId": ids[p],
                "bucket": tr.bucket[p],
                "weight": round(float(tr.weight[p]), 3),
                "label": label(idx[p]),
                "reason": tr.reason[p],
            }
            for p in kept_pos[:8].tolist()
        ]
        scope_map: dict[str, list[str]] = {}
        for p in kept_pos.tolist():
            scope_map.setdefault(buckets[p], []).append(ids[p])
        temporal_map: dict[str, list[str]] = {}
        for p in order.tolist():  # gate-visible rows, temporally suppressed ones included (reference)
            temporal_map.setdefault(tr.bucket[p], []).append(ids[p])
        scope_buckets_meta = {b: scope_map[b] for b in SCOPE_BUCKETS if b in scope_map}
        temporal_buckets_meta = {b: temporal_map[b] for b in TEMPORAL_BUCKETS if b in temporal_map}

        # Per-node gate lists in score-map order (the reference appends while it loops over the map).
        if gate is not None:
            anchored = [ids[p] for p in np.flatnonzero(gate.visible & gate.anchored).tolist()]
            rescued = [ids[p] for p in np.flatnonzero(gate.visible & gate.rescued).tolist()]
            suppressed_pos = np.flatnonzero(~gate.visible)
            suppressed = [ids[p] for p in suppressed_pos.tolist()]
            reasons = {ids[p]: str(gate.reason[p]) for p in suppressed_pos.tolist()}
            visible_owners: dict[str, list[str]] = {}
            suppressed_owners: dict[str, list[str]] = {}
            if owner_keys:
                # The (visible, missing) owner lists are built once per distinct visibility column: a few owners
                # give a handful of patterns for the hundreds of rows. Every node gets its own copies.
                columns = gate.owner_visible.T.tolist()
                split: dict[tuple[bool, ...], tuple[list[str], list[str]]] = {}
                for p in np.flatnonzero(gate.visible).tolist():
                    col = tuple(columns[p])
                    lists = split.get(col)
                    if lists is None:
                        lists = split[col] = (
                            [k for k, v in zip(owner_keys, col, strict=True) if v],
                            [k for k, v in zip(owner_keys, col, strict=True) if not v],
                        )
                    visible_owners[ids[p]] = lists[0].copy()
                    if lists[1]:
                        suppressed_owners[ids[p]] = lists[1].copy()
        else:
            anchored, rescued, suppressed, reasons = [], [], [], {}
            visible_owners, suppressed_owners = {}, {}
        for hid in hidden_ids:
            reasons.setdefault(hid, "visibility-filter" if hid not in prior else "gate-suppressed")
        t_rescued_pos = np.flatnonzero(tr.rescued & (gate.visible if gate is not None else True))
        gate_suppressed = sorted(prior | set(suppressed) | set(hidden_ids))
        return {
            "scoredCandidates": n_rows,
            "lexicalBoostedNodes": int((table.lexical_score > 0).sum()),
            "lexicalTopHits": lexical_top,
            "visibilityTopHits": visibility_top,
            "temporalTopHits": temporal_top,
            "scopeBuckets": scope_buckets_meta,
            "temporalBuckets": temporal_buckets_meta,
            "bucketWeights": bucket_weights(self.settings),
            "knowledgeGateMode": KNOWLEDGE_GATE_MODE if gate is not None else "disabled",
            "knowledgeAnchoredNodes": anchored,
            "knowledgeSuppressedNodes": suppressed,
            "knowledgeRescuedNodes": rescued,
            "knowledgeVisibleOwnersByNode": visible_owners,
            "knowledgeSuppressedOwnersByNode": suppressed_owners,
            "visibilitySuppressedReasons": reasons,
            "temporalSuppressedNodes": [ids[p] for p in np.flatnonzero(t_suppressed).tolist()],
            "temporalRescuedNodes": [ids[p] for p in t_rescued_pos.tolist()],
            "gate_suppressed": gate_suppressed,
        }
