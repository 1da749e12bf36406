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
    * Vectorised over the candidate set. The lexical field match gathers the candidates' fields from a
      per-snapshot packed table (each node normalised once, on first use); scope, region, story-time and
      knowledge lookups are array operations on per-snapshot codes (a node's scope bucket and story-time rule are
      also remembered per scene / active segment), the knowledge gate is O(owners × candidates) (reference §7
      item 22 was O(owners² × N) per call). The only per-candidate Python builds the meta's id lists and maps.
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
    * 4 (as amended) — the rescue rules read the calibrated cosine (:func:`rescue_calibration`: the query's
      cosine measured from its median over the chat's active nodes, so a threshold means the same under any
      embedder), the field match, the exact anchors and graph energy only beside vector evidence; never the
      blend-weighted score nor the raw cosine (§7 item 7). ``knowledgeRescueReasons`` / ``knowledgeRescueOnlyNodes``
      (meta) and ``rescueCalibration`` (trace notes) report them; the late routes refuse rescue-only nodes
      (:func:`~memory_recall.pipeline._admission.admissible` with ``rescued=False``). A ``userPov`` node the
      request's persona anchors is visible (:func:`persona_row`); a ``message`` node is gated only by explicit
      hidden / mistaken entries.
    * 10 — ties break by node id byte order.
    * BM25 channel — ``lexical = max(field match, bm25_score)`` (recall-spec: the BM25 "normalised score feeds
      the lexical weight") for the ranking; the lexical rescue reads the field match alone (BM25 is divided by the
      best hit's score, so the best hit always has 1).
    * 8 — the field match uses the multi-script lexical kernel (the cue mode comes from the context stage,
      which scans only the user message and the newest assistant line).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import threading
import weakref
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from memory_recall.heap import memory_owner
from memory_recall.model.graph import PRIMARY_LEXICAL_FIELDS, SECONDARY_LEXICAL_FIELDS, Node
from memory_recall.pipeline._graph_cache import active_mask, cached, carry_rows, hidden_mask, without_rows
from memory_recall.pipeline.kernels.lexical import PackedFieldTable, PreparedNode, prepare_node, prepare_sources
from memory_recall.pipeline.kind_weights import (
    MESSAGE_TYPE_CODE,
    kind_weights,
    message_rows,
    per_kind_hybrid,
    scale_hybrid,
)
from memory_recall.pipeline.speaker_cue import speaker_cue_weights
from memory_recall.pipeline.state import (
    ContextInfo,
    Explanation,
    ExplanationPart,
    RecallQuery,
    RecallState,
    ScoredTable,
    StageResult,
    StageTrace,
    timed,
)
from memory_recall.pipeline.temporal import time_cue_weights
from memory_recall.pipeline.vector_prefilter import query_similarities
from memory_recall.settings import ContextSettings, LexicalSettings, ScoringSettings
from memory_recall.store.snapshot import (
    TENSE_CODE,
    GraphSnapshot,
    StructureChange,
    appended_rows,
)
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
# Rescue rules on the *calibrated* cosine u = (cos − m) / (1 − m), m = the query's median cosine over the chat's
# active nodes (recall-spec departure 4 as amended; derivation in :func:`rescue_calibration`): u is 0 for what a
# typical node of this chat scores and 1 for an identical text, whatever the embedder's spread.
_RESCUE_VECTOR = 0.82  # global: the reference's 0.82 read on the calibrated scale (a near-duplicate)
_RESCUE_CURRENT_VECTOR = 0.6  # current region: a question about the node itself (measured 0.56–0.68), not its topic
_RESCUE_SUPPORT = 0.6  # lexical and graph evidence rescue only with this much of the node's own vector evidence
_RESCUE_LEXICAL = 0.85  # the field match only (token coverage: embedder-independent); BM25 is best-hit-relative
_RESCUE_GRAPH = 1.1
_RESCUE_CURRENT_GRAPH = 0.82
_RESCUE_VISIBILITY = 0.68
#: Fewer active nodes with a vector than this: no calibration (a median of a handful of cosines says nothing), so
#: no vector-based rescue; at most this many (a deterministic stride through the active set) estimate the median.
RESCUE_MIN_SAMPLE = 8
RESCUE_MAX_SAMPLE = 2048
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
    # The vocabulary's size after each coded column (owner key, owner name, region, tokens), in coding order: a
    # string of a column keeps a build's code when it is below that column's end (the update path).
    vocab_ends: tuple[int, ...]
    owner_key_code: np.ndarray  # (n,) int32: scope owner key ("" when objective)
    owner_name_code: np.ndarray  # (n,) int32: scope owner name (or id), lower-cased
    region_primary_code: np.ndarray  # (n,) int32: primary region, lower-cased
    token_flat_code: np.ndarray  # (T,) int32: every node's region tokens, lower-cased, concatenated
    token_offsets: np.ndarray  # (n + 1,) int64 into token_flat_code
    # The same tokens as an (n, w) matrix padded with −1 (no code) when no node has more than MAX_TOKEN_COLUMNS
    # (one gather for a recall's rows instead of a ragged one), else None.
    token_matrix: np.ndarray | None
    segment_order: dict[str, int]  # story segment id → order
    # Story time (temporal_director), what depends on the node only: the first rule that matches whatever the
    # active segment (0 no story time, 1 point tense future/hypothetical, else _BY_SEGMENT), the start and end
    # segment orders (span, else point) where both are known (NaN otherwise), a flashback tense.
    temporal_rule: np.ndarray  # (n,) int8
    start_order: np.ndarray  # (n,) float64
    end_order: np.ndarray  # (n,) float64
    flashback_tense: np.ndarray  # (n,) bool
    # Knowledge gate: per owner row of ``snapshot.knowledge`` (plus a last row standing for an owner key without
    # an entry) and node, the part of the verdict that does not depend on the scores (_G_* codes).
    # The owners' visibility scores are read from ``snapshot.knowledge.visibility`` where the gate gathers them,
    # rounded there (_rounded_visibility): no (owners, n) copy per snapshot.
    gate_code: np.ndarray  # (owners + 1, n) uint8
    labels: dict[int, str]  # node index → node_label, filled on use (at most MAX_LABELS entries)
    # (active segment order, flashback cue) → temporal rule code of every node classified so far ((n,) int8,
    # −1 = not yet); at most MAX_TEMPORAL_MEMOS entries.
    temporal_memo: dict[tuple[float, bool], np.ndarray]


def _lower_list(values: Sequence[str]) -> list[str]:
    """``np.char.lower(np.array(values, dtype=str)).tolist()``: the strings lower-cased as numpy strings, the form
    the comparisons were defined on. ``np.char.lower`` applies ``str.lower`` per element, but a numpy string drops
    trailing NULs and keeps the array's width, so a string that lower-casing lengthens ("İ" → "i̇") may be cut.
    ``str.lower`` on the list is several times faster and gives the same strings when no string holds a NUL and
    none changes length; otherwise the numpy path runs."""
    try:
        lowered = [v.lower() for v in values]
        exact = "\x00" not in "".join(values) and list(map(len, lowered)) == list(map(len, values))
    except (AttributeError, TypeError):  # not all str: numpy converts them
        exact = False
    if exact:
        return lowered
    arr = np.array(values, dtype=str) if len(values) else np.zeros(0, dtype=str)
    return (np.char.lower(arr) if arr.size else arr).tolist()  # type: ignore[no-any-return]


class _Coder(dict[str, int]):
    """String → code in ``vocab`` of its form (lower-cased by ``str.lower`` when ``lower``); a string met for the
    first time is coded by ``__missing__``, so a column costs one dict lookup per value. ``exact`` turns False when
    ``str.lower`` may differ from numpy's lower-casing (:func:`_lower_list`: a NUL, or a length change)."""

    def __init__(self, vocab: dict[str, int], lower: bool) -> None:
        super().__init__()
        self.vocab = vocab
        self.lower = lower
        self.exact = True

    def __missing__(self, value: str) -> int:
        coded = value
        if self.lower:
            coded = value.lower()
            if len(coded) != len(value) or "\x00" in value:
                self.exact = False
        code = self[value] = self.vocab.setdefault(coded, len(self.vocab))
        return code


def _encode(values: Sequence[str], vocab: dict[str, int], *, lower: bool) -> np.ndarray:
    """Integer code of each string (lower-cased as :func:`_lower_list` does first when ``lower``), new strings
    added to ``vocab`` in first-occurrence order (equal codes ⇔ equal strings). One pass with ``str.lower`` per
    distinct string; where that may differ from numpy's lower-casing, the column is coded again from
    :func:`_lower_list` of its distinct strings (a numpy string array of the distinct strings has the width of one
    of all of them, so the lower-cased strings are the same)."""
    size = len(vocab)
    coder = _Coder(vocab, lower)
    try:
        codes = np.fromiter(map(coder.__getitem__, values), dtype=np.int32, count=len(values))
    except (AttributeError, TypeError):  # not all str: numpy converts them
        coder.exact = False
    if coder.exact:
        return codes
    while len(vocab) > size:  # forget this column's codes (the newest entries)
        vocab.popitem()
    distinct = list(dict.fromkeys(values))
    coded = _lower_list(distinct) if lower else distinct
    code_of = {v: vocab.setdefault(c, len(vocab)) for v, c in zip(distinct, coded, strict=True)}
    return np.fromiter(map(code_of.__getitem__, values), dtype=np.int32, count=len(values))


def _orders(order: dict[str, int], ids: Sequence[str]) -> np.ndarray:
    """Segment order of each id as float64; NaN for an unknown id (or "")."""
    return np.fromiter(map(order.get, ids, itertools.repeat(math.nan)), dtype=np.float64, count=len(ids))


#: Widest token matrix kept (_SnapshotArrays.token_matrix); a graph with a node holding more uses the ragged form.
MAX_TOKEN_COLUMNS = 8


def _token_matrix(flat: np.ndarray, offsets: np.ndarray, lens: np.ndarray) -> np.ndarray | None:
    width = int(lens.max()) if lens.size else 0
    if width > MAX_TOKEN_COLUMNS:
        return None
    matrix = np.full((lens.size, width), -1, dtype=np.int32)
    rows = np.repeat(np.arange(lens.size), lens)
    matrix[rows, np.arange(flat.size) - offsets[rows]] = flat
    return matrix


def _snapshot_arrays(snapshot: GraphSnapshot) -> _SnapshotArrays:
    """The snapshot's :class:`_SnapshotArrays`, built once (O(n) arrays, O(owners × n) bytes for the gate)."""

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
        ends: list[int] = []
        owner_key_code = _encode(list(snapshot.scope_owner_key), vocab, lower=False)
        ends.append(len(vocab))
        owner_name_code = _encode(snapshot.scope_owner_name, vocab, lower=True)
        ends.append(len(vocab))
        region_primary_code = _encode(snapshot.region_primary, vocab, lower=True)
        ends.append(len(vocab))
        token_codes = _encode(tokens, vocab, lower=True)
        ends.append(len(vocab))
        rule, start_order, end_order, flashback = _temporal_parts(snapshot, order, None)
        return _SnapshotArrays(
            ids=ids,
            vocab=vocab,
            vocab_ends=tuple(ends),
            owner_key_code=owner_key_code,
            owner_name_code=owner_name_code,
            region_primary_code=region_primary_code,
            token_flat_code=token_codes,
            token_offsets=offsets,
            token_matrix=_token_matrix(token_codes, offsets, lens),
            segment_order=order,
            temporal_rule=rule,
            start_order=start_order,
            end_order=end_order,
            flashback_tense=flashback,
            gate_code=_gate_codes(snapshot),
            labels={},
            temporal_memo={},
        )

    def update(prev: _SnapshotArrays, change: StructureChange) -> _SnapshotArrays | None:
        if change.via is not None and change.kept is not None and not change.state_changed:
            kept = _kept_arrays(prev, change.kept, change.remap)  # nodes deleted: the kept rows, then the append
            return None if kept is None else update(kept, change.via)
        # Only what the changed rows hold is coded again; the vocabulary must come out as a build's (same strings
        # in the same first-occurrence order), else build.
        if not change.appended_only or change.state_changed:
            return None
        rewritten = change.rewritten
        rows = np.concatenate([rewritten, np.arange(change.appended, change.n_new, dtype=np.int64)])
        rl = rows.tolist()
        vocab = prev.vocab
        # A string of a changed row keeps a build's code when an old row of this column or of an earlier one
        # (_encode order) holds it: below that column's end of the vocabulary.
        ends = prev.vocab_ends  # every vocabulary entry is some row's string: its size after a column is its end
        lens = np.fromiter(map(len, map(snapshot.region_tokens.__getitem__, rl)), dtype=np.int64, count=len(rl))
        columns = (
            ([snapshot.scope_owner_key[i] for i in rl], False),
            (list(map(snapshot.scope_owner_name.__getitem__, rl)), True),
            (list(map(snapshot.region_primary.__getitem__, rl)), True),
            (list(itertools.chain.from_iterable(map(snapshot.region_tokens.__getitem__, rl))), True),
        )
        coded: list[np.ndarray] = []
        for (values, lower), end in zip(columns, ends, strict=True):
            out = np.empty(len(values), dtype=np.int32)
            for j, v in enumerate(values):
                if not isinstance(v, str):
                    return None
                key = v.lower() if lower else v
                code = vocab.get(key)
                if code is None or code >= end or (lower and (len(key) != len(v) or "\x00" in v)):
                    return None
                out[j] = code
            coded.append(out)
        key_c, name_c, region_c, token_c = coded
        k = rewritten.size
        old_lens = prev.token_offsets[rewritten + 1] - prev.token_offsets[rewritten]
        if k and not (
            np.array_equal(key_c[:k], prev.owner_key_code[rewritten])
            and np.array_equal(name_c[:k], prev.owner_name_code[rewritten])
            and np.array_equal(region_c[:k], prev.region_primary_code[rewritten])
            and np.array_equal(lens[:k], old_lens)
        ):
            return None  # a rewritten node's strings changed: one may have left the graph
        split = int(lens[:k].sum())
        if split:  # the rewritten rows' tokens (their counts are equal) against their old tokens, in one gather
            starts = prev.token_offsets[rewritten]
            stops = np.cumsum(lens[:k])
            old_at = np.arange(split, dtype=np.int64) + np.repeat(starts - (stops - lens[:k]), lens[:k])
            if not np.array_equal(token_c[:split], prev.token_flat_code[old_at]):
                return None
        add_lens = lens[k:]
        add_tokens = token_c[split:]
        offsets = appended_rows(prev.token_offsets, prev.token_offsets[-1] + np.cumsum(add_lens))
        flat = appended_rows(prev.token_flat_code, add_tokens)
        if prev.token_matrix is None:
            matrix = None
        else:
            width = max(prev.token_matrix.shape[1], int(add_lens.max()) if add_lens.size else 0)
            if width > MAX_TOKEN_COLUMNS:
                matrix = None
            else:
                tail = _token_matrix(add_tokens, np.concatenate([[0], np.cumsum(add_lens)]), add_lens)
                assert tail is not None
                old = prev.token_matrix
                if old.shape[1] < width:
                    old = np.concatenate([old, np.full((old.shape[0], width - old.shape[1]), -1, np.int32)], axis=1)
                if tail.shape[1] < width:
                    tail = np.concatenate([tail, np.full((tail.shape[0], width - tail.shape[1]), -1, np.int32)], axis=1)
                matrix = appended_rows(old, tail)
        new_ids = np.empty(change.n_new - change.appended, dtype=object)
        new_ids[:] = snapshot.ids[change.appended:]
        order = prev.segment_order
        rule, start_order, end_order, flashback = _temporal_parts(snapshot, order, rows)

        def spliced(old: np.ndarray, part: np.ndarray) -> np.ndarray:
            if not k or old[rewritten].tobytes() == part[:k].tobytes():
                return appended_rows(old, part[k:])  # the rewritten rows hold what they held: share the old rows
            out = np.concatenate([old, part[k:]])
            out[rewritten] = part[:k]
            return out

        # The gate codes of a node read its own knowledge column, type and POV flag, and the knowledge columns of
        # the nodes the delta kept stand (the state was not written): only the changed columns are derived.
        part = _gate_codes(snapshot, rows)
        if part.shape[0] != prev.gate_code.shape[0]:
            return None
        gate_code = np.concatenate([prev.gate_code, part[:, k:]], axis=1)
        gate_code[:, rewritten] = part[:, :k]
        # Labels of the nodes the delta did not rewrite stand (same node, same position).
        labels = without_rows(prev.labels, rewritten)
        return _SnapshotArrays(
            ids=appended_rows(prev.ids, new_ids),
            vocab=vocab,
            vocab_ends=ends,
            owner_key_code=spliced(prev.owner_key_code, key_c),
            owner_name_code=spliced(prev.owner_name_code, name_c),
            region_primary_code=spliced(prev.region_primary_code, region_c),
            token_flat_code=flat,
            token_offsets=offsets,
            token_matrix=matrix,
            segment_order=order,
            temporal_rule=spliced(prev.temporal_rule, rule),
            start_order=spliced(prev.start_order, start_order),
            end_order=spliced(prev.end_order, end_order),
            flashback_tense=spliced(prev.flashback_tense, flashback),
            gate_code=gate_code,
            labels=labels,
            # A node's story-time rule reads only the node and the (unchanged: no state write) timeline.
            temporal_memo={
                key: carry_rows(memo, change, -1)
                for key, memo in list(prev.temporal_memo.items())[-MAX_CARRIED_SCENES:]
            },
        )

    value, _ = cached(snapshot, ("scoring-arrays",), build, update, recipe=_snapshot_arrays)
    return value


def _first_held(codes: np.ndarray, rows: np.ndarray, since: int) -> bool:
    """Whether some entry of ``codes`` at ``rows`` holds a code from ``since`` on (first met in this column) at its
    first occurrence in ``codes``."""
    for row in rows.tolist():
        code = int(codes[row])
        if code >= since and int(np.argmax(codes == code)) == row:
            return True
    return False


def _kept_arrays(prev: _SnapshotArrays, take: np.ndarray, remap: np.ndarray) -> _SnapshotArrays | None:
    """``prev`` for the graph of its rows ``take`` alone (ascending; ``remap``: old row → its place among them, −1
    for a dropped one): what a build on those rows gives, when no dropped row held the first occurrence of a
    string in the coding order (the vocabulary then stands, codes and all); ``None`` otherwise (build). O(n) numpy
    copies, O(dropped rows × n) for the check."""
    dropped = remap < 0
    gone = np.flatnonzero(dropped)
    ends = (0, *prev.vocab_ends)
    for column, since in ((prev.owner_key_code, ends[0]), (prev.owner_name_code, ends[1]),
                          (prev.region_primary_code, ends[2])):
        if _first_held(column, gone, since):
            return None
    offsets = prev.token_offsets
    lens = np.diff(offsets)
    flat_gone = np.repeat(dropped, lens)
    if _first_held(prev.token_flat_code, np.flatnonzero(flat_gone), ends[3]):
        return None
    kept_lens = lens[take]
    new_offsets = np.zeros(take.size + 1, dtype=offsets.dtype)
    np.cumsum(kept_lens, out=new_offsets[1:])
    matrix = prev.token_matrix
    if matrix is not None:
        matrix = matrix[take]
        width = int(kept_lens.max()) if kept_lens.size else 0
        if width < matrix.shape[1]:  # the widest rows went: a build's matrix is narrower
            matrix = np.ascontiguousarray(matrix[:, :width])
    return _SnapshotArrays(
        ids=prev.ids[take], vocab=prev.vocab, vocab_ends=prev.vocab_ends,
        owner_key_code=prev.owner_key_code[take], owner_name_code=prev.owner_name_code[take],
        region_primary_code=prev.region_primary_code[take], token_flat_code=prev.token_flat_code[~flat_gone],
        token_offsets=new_offsets, token_matrix=matrix, segment_order=prev.segment_order,
        temporal_rule=prev.temporal_rule[take], start_order=prev.start_order[take], end_order=prev.end_order[take],
        flashback_tense=prev.flashback_tense[take], gate_code=prev.gate_code[:, take],
        labels={int(remap[p]): v for p, v in list(prev.labels.items()) if remap[p] >= 0},
        temporal_memo={key: memo[take] for key, memo in list(prev.temporal_memo.items())},
    )


def _temporal_parts(
    snapshot: GraphSnapshot, order: dict[str, int], rows: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The story-time columns of :class:`_SnapshotArrays` (``temporal_rule``, ``start_order``, ``end_order``,
    ``flashback_tense``) for the nodes at ``rows`` (every node when None)."""
    segment: Sequence[str]
    span_s: Sequence[str]
    span_e: Sequence[str]
    if rows is None:
        segment, span_s, span_e = snapshot.segment_id, snapshot.span_start_segment, snapshot.span_end_segment
        tense = snapshot.tense_code
        labelled = snapshot.has_story_label | snapshot.has_span_label
    else:
        rl = rows.tolist()
        segment, span_s, span_e = (
            [col[i] for i in rl]
            for col in (snapshot.segment_id, snapshot.span_start_segment, snapshot.span_end_segment)
        )
        tense = snapshot.tense_code[rows]
        labelled = snapshot.has_story_label[rows] | snapshot.has_span_label[rows]
    point = _orders(order, segment)
    span_start = _orders(order, span_s)
    span_end = _orders(order, span_e)
    start = np.where(np.isnan(span_start), point, span_start)
    end = np.where(np.isnan(span_end), point, span_end)
    known = ~np.isnan(start) & ~np.isnan(end)
    rule = np.full(tense.size, _BY_SEGMENT, dtype=np.int8)
    rule[(tense == _TENSE_FUTURE) | (tense == _TENSE_HYPOTHETICAL)] = 1
    rule[~labelled] = 0
    return rule, np.where(known, start, np.nan), np.where(known, end, np.nan), tense == _TENSE_FLASHBACK


#: Node labels kept per snapshot before the label table is emptied.
MAX_LABELS = 50_000


def _label(snapshot: GraphSnapshot, arrays: _SnapshotArrays, i: int) -> str:
    """:func:`node_label` of node ``i``, remembered with the snapshot."""
    label = arrays.labels.get(i)
    if label is None:
        label = node_label(snapshot.node(i, keep=False))  # the label is kept, not the model
        if len(arrays.labels) >= MAX_LABELS:
            arrays.labels.clear()
        arrays.labels[i] = label  # racing threads store equal values: harmless
    return label


#: Prepared lexical fields kept per snapshot before the table is emptied (bounds memory on a huge graph whose
#: recalls keep touching new nodes; emptying only costs re-preparing the fields of the next candidates).
MAX_PREPARED_NODES = 50_000


def _field_table(snapshot: GraphSnapshot) -> PackedFieldTable:
    """The snapshot's :class:`PackedFieldTable`: node ``i``'s lexical fields (name/title primary, the
    :data:`SECONDARY_LEXICAL_FIELDS` secondary) normalised (:func:`prepare_node`) and packed for the field match;
    a node without primary or secondary text matches nothing (score 0).

    Packed lazily, for the candidates a recall actually scores, and kept with the snapshot (departure 11): a
    node's fields only change with a new store version, i.e. a new snapshot, so the table never goes stale. At
    most :data:`MAX_PREPARED_NODES` nodes are kept (about 1.1 kB each on the bench graph: 55 MB at the bound).
    The scores equal what :func:`~memory_recall.pipeline.kernels.lexical.lexical_score` computes from the node's
    fields on every call (tested); only the normalisation work is saved.
    """
    def update(previous: PackedFieldTable, change: StructureChange) -> PackedFieldTable | None:
        # The nodes a delta kept with the same fields (not rewritten, or rewritten with their fields unchanged, as
        # a chat turn rewrites the previous message's link) keep their packed rows, shared: no copy, no scan of the
        # graph's nodes in Python (O(packed slots) in numpy), and no dead slot per turn held until a compaction.
        try:
            return previous.remapped(snapshot.n, change.remap, change.fields_changed)
        except ValueError:  # a table of another graph size than the delta's parent: build
            return None

    table, _ = cached(
        snapshot, ("lexical-fields",), lambda: PackedFieldTable(snapshot.n, MAX_PREPARED_NODES), update,
        recipe=_field_table,
    )
    return table


def _prepared_node(snapshot: GraphSnapshot, i: int) -> PreparedNode | None:
    # Not kept: the field table keeps the prepared fields, the parsed model would only double them in memory.
    raw = snapshot.node(i, keep=False)
    primary = [t for key in PRIMARY_LEXICAL_FIELDS for t in raw.field_text(key)]
    secondary = [t for key in SECONDARY_LEXICAL_FIELDS for t in raw.field_text(key)]
    return prepare_node(primary, secondary) if primary or secondary else None


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
    return _SCOPE_CHOICES[_scope_codes(snapshot, _snapshot_arrays(snapshot), idx, context, cfg)]


def _scope_codes(
    snapshot: GraphSnapshot, arrays: _SnapshotArrays, idx: np.ndarray, context: ContextInfo, cfg: ContextSettings
) -> np.ndarray:
    """:func:`scope_buckets` (scoped memory on, ``idx`` int64) as indices into :data:`_SCOPE_CHOICES` (int8),
    remembered per scene (:attr:`_SceneCodes.memo`): only nodes not classified yet in the scene are computed."""
    scene = _scene_codes(snapshot, arrays, context, cfg.enable_region_scoped_objective)
    memo = scene.memo.get(cfg.enable_pov_memory)
    if memo is None:
        # n bytes per scene and setting (at most MAX_SCENES_PER_SNAPSHOT scenes per snapshot); racing threads
        # may each start one: either is correct.
        memo = scene.memo.setdefault(cfg.enable_pov_memory, np.full(snapshot.n, -1, dtype=np.int8))
    codes = memo[idx]
    missing = codes < 0
    if missing.any():
        todo = idx[missing]
        codes[missing] = memo[todo] = _classify_scope(snapshot, arrays, todo, scene, cfg)
    return codes


def _classify_scope(
    snapshot: GraphSnapshot, arrays: _SnapshotArrays, idx: np.ndarray, scene: _SceneCodes, cfg: ContextSettings
) -> np.ndarray:
    """The :data:`_SCOPE_CHOICES` index of each node of ``idx`` in ``scene`` (first matching condition)."""
    m = idx.size
    pov = snapshot.is_pov[idx]
    # The POV conditions only matter for POV rows and the region ones only when the region is on: the others
    # stay constant (False, or True for "region off").
    pov_off: np.ndarray | bool = False
    char_pov: np.ndarray | bool = False
    user_pov: np.ndarray | bool = False
    user_default: np.ndarray | bool = False
    if not cfg.enable_pov_memory:
        pov_off = pov
    elif pov.any():
        otype = snapshot.owner_type_code[idx]
        keys = arrays.owner_key_code[idx]
        names = arrays.owner_name_code[idx]

        def owned_by(code: int, owners: tuple[list[int], list[int]] | None) -> np.ndarray | bool:
            if owners is None:
                return False
            hit = _equals_any(keys, owners[0]) | _equals_any(names, owners[1])
            return pov & (otype == code) & hit

        char_pov = owned_by(1, scene.chars)
        user_pov = owned_by(2, scene.users)
        if scene.users is None:
            user_default = pov & (otype == 2)

    region_on = scene.region_on
    current: np.ndarray | bool = False
    near: np.ndarray | bool = False
    if region_on:
        primary = arrays.region_primary_code[idx]
        active_codes = scene.active
        adjacent_codes = scene.adjacent
        current = _equals_any(primary, active_codes)
        near = _equals_any(primary, adjacent_codes)
        if arrays.token_matrix is not None:
            if arrays.token_matrix.shape[1]:
                tokens = arrays.token_matrix[idx]
                near |= _equals_any(tokens.ravel(), active_codes + adjacent_codes).reshape(tokens.shape).any(axis=1)
        else:
            tokens, row = _gather_tokens(arrays, idx)
            if tokens.size:
                near[row[_equals_any(tokens, active_codes + adjacent_codes)]] = True

    conditions = [pov_off, char_pov, user_pov, user_default, pov, not region_on, current, near]
    return _first_match(conditions, m)


@dataclass(frozen=True)
class _SceneCodes:
    """Vocabulary codes of what one scene compares against (``scope_buckets``): ``(owner-key codes, owner-name
    codes)`` of the character and user owners (None when the scene has none), whether the region is on, and the
    codes of the active and adjacent regions. ``memo`` keeps, per ``enable_pov_memory`` value, the scope code
    (:data:`_SCOPE_CHOICES` index) of every node classified so far in this scene ((n,) int8, −1 = not yet): a
    node's bucket depends only on the node and the scene, and a recall classifies the same nodes several times
    (scoring, admission, owners, result) and again in the next recall of the scene."""

    chars: tuple[list[int], list[int]] | None
    users: tuple[list[int], list[int]] | None
    region_on: bool
    active: list[int]
    adjacent: list[int]
    memo: dict[bool, np.ndarray] = field(default_factory=dict, compare=False, repr=False)


#: Scene codes kept per snapshot structure; emptied past this many scenes.
MAX_SCENES_PER_SNAPSHOT = 64
#: Guards the structures' scene tables (filled in place by the recalls on a structure).
_SCENES_LOCK = threading.Lock()
#: Scenes a structure a delta updated takes over from its parent (the most recent ones), with their memos.
MAX_CARRIED_SCENES = 8


@dataclass(frozen=True, eq=False)
class _StructureScenes:
    """The scene codes of one structure (``codes``: scene key → :class:`_SceneCodes`, filled in place) and the
    vocabulary (``_SnapshotArrays.vocab``) they were coded with. They read no statistics, so reinforcement writes
    keep them."""

    vocab: dict[str, int]
    codes: dict[Hashable, _SceneCodes]


def _structure_scenes(snapshot: GraphSnapshot, arrays: _SnapshotArrays | None = None) -> _StructureScenes:
    """The scene codes of ``snapshot``'s structure, a per-structure value (:func:`cached`). A structure a delta
    updated starts with its parent's most recent scenes (:func:`_carried_scene_codes`), derived after the write,
    also across a write no recall follows (a turn's background vectors)."""
    vocab = (arrays if arrays is not None else _snapshot_arrays(snapshot)).vocab
    return cached(
        snapshot, ("scoring", "scene-codes"), lambda: _StructureScenes(vocab, {}),
        lambda old, change: _carried_scene_codes(old, change, vocab), recipe=_structure_scenes,
    )[0]


def _carried_scene_codes(old: _StructureScenes, change: StructureChange, vocab: dict[str, int]) -> _StructureScenes:
    """The parent structure's most recent scenes ``old`` when the child's arrays kept the parent's vocabulary
    ``vocab`` (the update path of :func:`_snapshot_arrays` shares it: the same strings have the same codes), their
    memos moved to the new positions (a node's scope code reads only the node and the scene; rewritten and new
    nodes are classified again). An empty table otherwise. O(scenes × n) in numpy."""
    if old.vocab is not vocab:
        return _StructureScenes(vocab, {})
    with _SCENES_LOCK:  # a recall on the parent may still be adding scenes
        scenes = list(old.codes.items())[-MAX_CARRIED_SCENES:]
    return _StructureScenes(vocab, {
        key: dataclasses.replace(scene, memo={pov: carry_rows(m, change, -1) for pov, m in list(scene.memo.items())})
        for key, scene in scenes
    })


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
    per = _structure_scenes(snapshot, arrays).codes
    with _SCENES_LOCK:
        found = per.get(key)
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
#: The :data:`SCOPE_BUCKETS` index of each :data:`_SCOPE_CHOICES` entry.
_CHOICE_BUCKET = np.array([SCOPE_BUCKETS.index(b) for b in _SCOPE_CHOICES.tolist()], dtype=np.intp)
_GLOBAL_CHOICE = len(_SCOPE_CHOICES) - 1  # objectiveGlobal
#: Minus the priority of each :data:`SCOPE_BUCKETS` entry (a sort key: higher priority first).
_NEG_SCOPE_PRIORITY = np.array([-SCOPE_PRIORITY[b] for b in SCOPE_BUCKETS], dtype=np.int64)


def _first_match(conditions: Sequence[np.ndarray | bool], m: int) -> np.ndarray:
    """Per element, the index of the first true condition (``len(conditions)`` when none is): ``np.select``'s
    first-match rule as an integer code, so a caller picks its values from small tables (a few µs for a few
    hundred nodes, where ``np.select`` over object arrays of names costs tens of µs per call). A condition may be
    a plain bool (the same for every element)."""
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
    code, table = _temporal_codes(snapshot, None, idx, context, enabled=enabled)
    return TemporalResult(
        bucket=table.bucket[code],
        weight=table.weight[code],
        suppressed=table.suppressed[code],
        rescued=table.rescued[code],
        reason=table.reason[code],
    )


@dataclass(frozen=True)
class _TemporalTable:
    """The outcome of each temporal rule (index = rule code, the last one: no rule matched) for one cue mode."""

    bucket: np.ndarray  # object: bucket name
    weight: np.ndarray  # float64
    suppressed: np.ndarray  # bool
    rescued: np.ndarray  # bool
    reason: np.ndarray  # object
    bucket_index: np.ndarray  # intp: index into TEMPORAL_BUCKETS
    neg_priority: np.ndarray  # int64: minus the bucket priority (a sort key)


_BY_SEGMENT = 9  # _SnapshotArrays.temporal_rule: decided by the active segment (rules 2 and later)


def _rule_table(rules: Sequence[tuple[str, float, bool, bool, str]]) -> _TemporalTable:
    bucket = [r[0] for r in rules]
    return _TemporalTable(
        bucket=np.array(bucket, dtype=object),
        weight=np.array([r[1] for r in rules], dtype=np.float64),
        suppressed=np.array([r[2] for r in rules], dtype=bool),
        rescued=np.array([r[3] for r in rules], dtype=bool),
        reason=np.array([r[4] for r in rules], dtype=object),
        bucket_index=np.array([TEMPORAL_BUCKETS.index(b) for b in bucket], dtype=np.intp),
        neg_priority=np.array([-TEMPORAL_PRIORITY[b] for b in bucket], dtype=np.int64),
    )


@functools.lru_cache(maxsize=8)
def _temporal_table(flashback_cue: bool, future_cue: bool) -> _TemporalTable:
    # (bucket, weight, suppressed, rescued, reason) of the rules of temporal_director, in order, then the default.
    return _rule_table(
        [
            ("undated", 0.88, False, False, "no-story-time"),
            ("future", 0.72 if future_cue else 0.2, not future_cue, False, "point-future-tense"),
            ("undated", 0.92, False, False, "no-active-segment"),
            ("current", 1.15, False, False, "in-active-segment"),
            (
                "flashback",
                1.02 if flashback_cue else 0.72,
                False,
                flashback_cue,
                "flashback-cue" if flashback_cue else "flashback-tense",
            ),
            ("adjacentPast", 1.0, False, False, "recent-past"),
            ("distantPast", 0.64, False, False, "distant-past"),
            ("future", 0.74 if future_cue else 0.22, not future_cue, False, "after-active-segment"),
            ("undated", 0.9, False, False, "unknown-segment"),
        ]
    )


_DISABLED_TABLE = _rule_table([("undated", 1.0, False, False, "timeline-disabled")])
_EMPTY_TABLE = _rule_table([("undated", 1.0, False, False, "")])  # only indexed by an empty code array


def _temporal_codes(
    snapshot: GraphSnapshot,
    arrays: _SnapshotArrays | None,
    idx: np.ndarray,
    context: ContextInfo,
    *,
    enabled: bool,
) -> tuple[np.ndarray, _TemporalTable]:
    """:func:`temporal_director` of ``idx`` (int64) as ``(code, table)``: each node's outcome is row ``code`` of
    ``table``."""
    m = idx.size
    if not enabled:
        return np.zeros(m, dtype=np.intp), _DISABLED_TABLE
    if m == 0:
        return np.zeros(0, dtype=np.intp), _EMPTY_TABLE
    arrays = arrays or _snapshot_arrays(snapshot)
    active = context.story_segment_order
    if active is None and context.story_segment_id:
        active = arrays.segment_order.get(context.story_segment_id)
    cue = context.cue_mode
    table = _temporal_table(cue == "flashback", cue == "future")
    if active is None:  # rule 2 for every node the node-only rules leave
        return np.minimum(arrays.temporal_rule[idx], 2), table
    # A node's rule depends on the node, the active segment and whether the cue is flashback: remembered per
    # (segment, cue) for the nodes classified so far (n bytes each).
    key = (float(active), cue == "flashback")
    memo = arrays.temporal_memo.get(key)
    if memo is None:
        if len(arrays.temporal_memo) >= MAX_TEMPORAL_MEMOS:
            arrays.temporal_memo.clear()
        memo = arrays.temporal_memo.setdefault(key, np.full(snapshot.n, -1, dtype=np.int8))
    code = memo[idx]
    missing = code < 0
    if missing.any():
        todo = idx[missing]
        code[missing] = memo[todo] = _classify_time(arrays, todo, key[0], key[1])
    return code, table


#: (active segment, cue) pairs whose temporal codes are kept per snapshot before the memo is emptied.
MAX_TEMPORAL_MEMOS = 64


def _classify_time(arrays: _SnapshotArrays, idx: np.ndarray, a: float, flashback_cue: bool) -> np.ndarray:
    """The temporal rule code (row of :func:`_temporal_table`) of each node of ``idx`` for the active segment
    order ``a``."""
    # Orders are NaN unless both ends are known: every comparison below is then False, as the rules require.
    start = arrays.start_order[idx]
    end = arrays.end_order[idx]
    past = end < a
    by_segment = _first_match(
        [
            (start <= a) & (a <= end),
            past if flashback_cue else past & arrays.flashback_tense[idx],
            past & ((a - end) <= 2),
            past,
            start > a,
        ],
        idx.size,
    )
    # The node-only rules (codes 0 and 1) come first; the others are rule 3 onwards (by_segment + 3 ≤ 8 < 9).
    return np.minimum(arrays.temporal_rule[idx], by_segment + 3)


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
    #: Visible only because of a rescue (no owner sees it without one): such a node may be ranked and selected on
    #: its evidence but never enters through the core route, scene reconstruction or the fallback layout.
    rescue_only: np.ndarray
    #: The first rescue rule that holds per node (:data:`RESCUE_RULES` index; 0 = none).
    rescue_rule: np.ndarray

    def __len__(self) -> int:
        return int(self.visible.shape[0])


#: Rescue rules in the order :func:`knowledge_gate` tries them (index 0: no rule holds).
RESCUE_RULES: tuple[str, ...] = ("", "vector", "current-vector", "named", "lexical", "graph", "current-graph")


@dataclass(frozen=True)
class RescueCalibration:
    """The query's own cosine distribution over the chat (:func:`rescue_calibration`): ``median`` per query
    (q,), NaN when fewer than :data:`RESCUE_MIN_SAMPLE` active nodes have a vector; ``sample`` = cosines used."""

    median: np.ndarray
    sample: int

    def calibrated(self, cosines: np.ndarray) -> np.ndarray:
        """u = (cos − m) / (1 − m) per query row of ``cosines`` (q × m); NaN where uncalibrated."""
        m = self.median[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(m < 1.0, (cosines - m) / (1.0 - m), np.nan)


def rescue_calibration(embeddings: np.ndarray, eligible: np.ndarray, queries: np.ndarray | None) -> RescueCalibration:
    """The median cosine of each query (rows of ``queries``, L2-normalised) over the nodes of ``eligible`` (active
    with a vector), from at most :data:`RESCUE_MAX_SAMPLE` of them taken at an even stride (deterministic; the
    median of 2,048 cosines is within ~0.002 of the chat's). O(sample × d × q).

    Derivation (recall-spec departure 4, amended). A rescue says *the query is about this very node*, strongly
    enough to override the owner not knowing it. The raw cosine cannot say that the same way under two embedders:
    multilingual-e5-small scores unrelated texts of a chat 0.75–0.87, an embedder without e5's shared component
    0.3–0.4, and the reference's fixed 0.82 rescued nearly every e5 node. What is comparable is where a cosine
    sits between what a typical node of *this chat* scores for *this query* (the median m: most nodes are
    unrelated to any one query) and an identical text (1): u = (cos − m) / (1 − m). u is exactly invariant
    under any increasing affine map of the cosines that keeps 1 at 1, and measured under two embedders of very
    different spread it agrees within 0.02 (``scripts/pov_stress.py``; docs/reference-differences.md). On the
    project's fixtures u is ≈ 0.45 for the memory a scene asks about, ≤ 0.52 for secrets on the same topic, and
    0.56–0.68 for a question about the node itself; the thresholds (:data:`_RESCUE_VECTOR` …) sit above the
    topic level with margin.
    """
    return calibration_from_sample(*rescue_sample(embeddings, eligible), queries)


def rescue_sample(embeddings: np.ndarray, eligible: np.ndarray) -> tuple[np.ndarray, int]:
    """``(rows, count)``: the rows of ``embeddings`` :func:`rescue_calibration` measures against — the nodes of
    ``eligible``, at most :data:`RESCUE_MAX_SAMPLE` of them at an even stride, as one contiguous float32 matrix (no
    rows when fewer than :data:`RESCUE_MIN_SAMPLE`) — and how many nodes it stands for (the rows, or the eligible
    count when too few). Depends on the structure and the mask only, so the scoring stage keeps it per
    snapshot structure and mask (the gather is most of the calibration's cost at 100k nodes)."""
    at, count = _sample_positions(eligible)
    if at.size < RESCUE_MIN_SAMPLE:
        return np.zeros((0, embeddings.shape[1] if embeddings.ndim == 2 else 0), dtype=np.float32), count
    return np.ascontiguousarray(embeddings[at], dtype=np.float32), count


def _sample_positions(eligible: np.ndarray) -> tuple[np.ndarray, int]:
    """``(positions, count)``: the nodes of ``eligible`` a rescue sample holds (all of them, or at most
    :data:`RESCUE_MAX_SAMPLE` at an even stride) and how many are eligible when fewer than
    :data:`RESCUE_MIN_SAMPLE` (else the positions' count)."""
    at = np.flatnonzero(eligible)
    if at.size > RESCUE_MAX_SAMPLE:
        at = at[:: -(-at.size // RESCUE_MAX_SAMPLE)]
    return at, int(at.size)


#: Rescue samples kept per snapshot structure (one per recent eligible mask, least recently used dropped).
MAX_RESCUE_SAMPLES = 4


@dataclass(frozen=True, eq=False)
class _RescueSample:
    """One :func:`rescue_sample`: its ``rows``, ``at`` the node positions of the rows (ascending), and where they
    were gathered from: the embedding matrix's memory (``owner``, a weak reference to the array that holds it,
    so a kept sample never keeps an old matrix alive), its first byte's ``address``, ``shape`` and ``strides``."""

    at: np.ndarray
    rows: np.ndarray
    owner: weakref.ref[np.ndarray]
    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @classmethod
    def of(cls, at: np.ndarray, rows: np.ndarray, source: np.ndarray) -> _RescueSample:
        return cls(at, rows, weakref.ref(memory_owner(source)), int(source.ctypes.data), source.shape,
                   source.strides)

    def alive(self) -> bool:
        """Whether the memory the rows came from is still held (else it may have been freed and reused)."""
        return self.owner() is not None


class _RescueSamples:
    """Per snapshot structure: the last few rescue samples (most recent last). A structure updated by a delta
    starts from its parent's samples (:meth:`carried`), so the first recall after a write gathers only the rows of
    nodes those samples do not hold."""

    def __init__(self, entries: Sequence[_RescueSample] = ()) -> None:
        self.entries: list[_RescueSample] = list(entries)
        self.lock = threading.Lock()

    def carried(self, change: StructureChange) -> _RescueSamples | None:
        """The parent's samples, for a child after an appended-only delta (kept nodes keep their positions); each
        is used only where its source rows are the child's own (:func:`_same_rows`)."""
        if not change.appended_only:
            return None
        with self.lock:  # a sample whose matrix is gone can serve no later snapshot: dropped
            return _RescueSamples([x for x in self.entries if x.alive()])


def _same_rows(sample: _RescueSample, new: np.ndarray) -> bool:
    """Whether the rows ``sample`` was gathered from are the first rows of ``new`` in the same memory (which is
    still held, so its address is not another matrix's). A delta that writes a row that held a vector copies the
    matrix (:func:`~memory_recall.store.snapshot.apply_delta`; only rows without one are filled in place), and a
    sample holds rows with a vector only, so the same memory means the same rows."""
    shape = sample.shape
    return (len(shape) == new.ndim == 2 and shape[0] <= new.shape[0] and shape[1:] == new.shape[1:]
            and sample.strides == new.strides and sample.rows.dtype == new.dtype
            and (shape[0] == 0 or sample.address == new.ctypes.data) and sample.alive())


def _rescue_samples(snap: GraphSnapshot) -> _RescueSamples:
    return cached(snap, ("rescue-samples",), _RescueSamples, lambda old, change: old.carried(change),
                  recipe=_rescue_samples)[0]


def _rescue_sample(snap: GraphSnapshot, eligible: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`rescue_sample` of ``snap.embeddings`` over ``eligible``, equal to it bit for bit: served from the
    structure's kept samples when one has the same rows (same nodes, same vector memory); otherwise the rows a
    kept sample of the same memory holds are copied from it and only the others gathered from the node matrix.
    O(n) for the positions plus O(sample × d) copied."""
    emb = snap.embeddings
    at, count = _sample_positions(eligible)
    if at.size < RESCUE_MIN_SAMPLE or emb.ndim != 2:
        return rescue_sample(emb, eligible)
    samples = _rescue_samples(snap)
    with samples.lock:
        usable = [x for x in samples.entries if _same_rows(x, emb)]
    for x in reversed(usable):
        if np.array_equal(x.at, at):
            return x.rows, count
    rows = np.empty((at.size, emb.shape[1]), dtype=np.float32)
    missing = np.ones(at.size, dtype=bool)
    if usable:
        best = usable[-1]
        pos = np.minimum(np.searchsorted(best.at, at), max(best.at.size - 1, 0))
        hit = best.at[pos] == at if best.at.size else np.zeros(at.size, dtype=bool)
        rows[hit] = best.rows[pos[hit]]
        missing = ~hit
    rows[missing] = emb[at[missing]]
    with samples.lock:
        samples.entries.append(_RescueSample.of(at, rows, emb))
        del samples.entries[:-MAX_RESCUE_SAMPLES]
    return rows, count


def calibration_from_sample(sample: np.ndarray, count: int, queries: np.ndarray | None) -> RescueCalibration:
    """:func:`rescue_calibration` over a :func:`rescue_sample` ``(sample, count)``."""
    if queries is None or queries.size == 0:
        return RescueCalibration(np.zeros(0), 0)
    if sample.shape[0] == 0:
        return RescueCalibration(np.full(queries.shape[0], np.nan), count)
    # The vector prefilter's product: the same bits whatever the BLAS thread count (departure 10).
    sims = query_similarities(sample, np.ascontiguousarray(queries, dtype=np.float32))
    return RescueCalibration(np.median(sims, axis=1).astype(np.float64), int(sample.shape[0]))


def calibrated_cosine(
    embeddings: np.ndarray, has_vector: np.ndarray, idx: np.ndarray, queries: np.ndarray | None,
    weights: np.ndarray, calibration: RescueCalibration,
) -> np.ndarray:
    """(m,) calibrated cosine u of the nodes ``idx`` for the query whose blend-weighted u is highest (the blend
    weight discounts context queries as the vector merge does; weighing u, not the raw cosine, keeps the choice
    the same under any embedder; the first query on ties); NaN for a node without a vector or an uncalibrated
    query. O(q × m × d)."""
    m = idx.size
    if queries is None or queries.size == 0 or m == 0 or calibration.median.size != queries.shape[0]:
        return np.full(m, np.nan)
    sims = query_similarities(np.ascontiguousarray(embeddings[idx], dtype=np.float32),
                              np.ascontiguousarray(queries, dtype=np.float32)).astype(np.float64)
    per_query = calibration.calibrated(sims)
    scored = np.nan_to_num(per_query * np.asarray(weights, dtype=np.float64)[:, None], nan=-np.inf)
    u = per_query[np.argmax(scored, axis=0), np.arange(m)]
    return np.where(has_vector[idx], u, np.nan)


def persona_row(snapshot: GraphSnapshot, query: RecallQuery) -> int:
    """Knowledge row of the user persona the request names (``query.active_user_pov_owner``: a name, matched as
    ``user:<name>``, or a ``user:`` key), −1 when it names none or it has no ``user`` entry. Only a persona the
    host names explicitly opens the user-POV section past the character owners' knowledge: one taken from the
    history or the host's user name does not (its POV memories would outrank every objective memory of a chat
    whose host never asked for them)."""
    name = query.active_user_pov_owner.strip()
    know = snapshot.knowledge
    if not name or not know.owner_keys:
        return -1
    row = know.row(name if name.lower().startswith("user:") else f"user:{name}")
    return row if row >= 0 and know.owner_types[row] == "user" else -1


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
    user_row: int = -1,
    named: np.ndarray | None = None,
) -> GateResult:
    """Knowledge gate of the nodes ``node_idx`` for the scene owners ``owner_rows`` (rows of
    ``snapshot.knowledge``, −1 = an owner key without an entry), vectorised: O(owners × nodes).

    Per owner (reference §1.5): no entry → visible ``no-owner-state``; manually hidden → invisible; objective
    node the owner is mistaken about → invisible; ``anchored`` = known / manual-known / the owner's own
    character node / the owner's own POV node (``own_pov``: departure 2, §7 item 4); ``base = max(visibility,
    anchored)``; threshold POV 0.18, current region 0.34, adjacent 0.42, global 0.56 (0 with
    ``inject_low_confidence``), other 0.4; an objective, non-anchored node is rescued (visibility ≥ 0.68) by the
    first rule that holds (departure 4 as amended: every rule reads the **calibrated** cosine ``vector_raw`` = u
    of :func:`calibrated_cosine`, NaN when there is none): u ≥ 0.82 (``vector``); in the current region u ≥ 0.6
    (``current-vector``); named in the user message (``named``: an exact anchor of the anchor stage, a name or
    title the user wrote, the same under any embedder); field match ``lexical`` ≥ 0.85 with u ≥ 0.6 or no vector
    (``lexical``); ``graph`` ≥ 1.1
    with u ≥ 0.6 (``graph``); in the current region graph ≥ 0.82 with u ≥ 0.6 (``current-graph``). Graph energy
    alone never rescues: it measures closeness to what the query found (an everyday event a secret hangs off),
    not evidence about the node. ``bucket`` holds scope bucket names.

    ``user_row`` (:func:`persona_row`, −1 = none): a ``userPov`` node the persona's own entry anchors (its own
    POV, or known and not hidden) is visible and ``anchored`` whatever the character owners know — the
    user-POV section prints the persona's view labelled as not character facts (docs/reference-differences.md;
    the reference gated it by the characters, so the section stayed empty).
    """
    index = {b: i for i, b in enumerate(SCOPE_BUCKETS)}
    bucket_idx = np.fromiter(
        (index.get(b, -1) for b in np.asarray(bucket, dtype=object).tolist()), dtype=np.intp, count=len(bucket)
    )
    return _knowledge_gate(
        snapshot,
        None,
        np.asarray(node_idx, dtype=np.int64),
        owner_rows,
        vector_raw,
        graph,
        lexical,
        bucket_idx,
        inject_low_confidence=inject_low_confidence,
        user_row=user_row,
        named=named,
    )


# The score-independent part of one owner's verdict on one node (_SnapshotArrays.gate_code), first match wins:
# no entry for the owner; manually hidden; mistaken about an objective node; manual-known (and anchored);
# anchored (known, own character or own POV node); decided by the scores; decided by the scores but reported as
# manual-known (a manual-known node the arrays do not mark known: the snapshot never builds one).
_G_NO_OWNER, _G_HIDDEN, _G_MISTAKEN, _G_MANUAL, _G_ANCHORED, _G_SCORED, _G_SCORED_MANUAL = range(7)
_G_EARLY = np.array([False, True, True, False, False, False, False])  # invisible whatever the scores
_G_NEUTRAL = np.array([True, True, True, False, False, False, False])  # report visibility and threshold 0
_G_VISIBLE = np.array([True, False, False, True, True, False, False])  # visible whatever the scores
_G_ANCHOR = np.array([False, False, False, True, True, False, False])
_G_BY_SCORES = np.array([False, False, False, False, False, True, True])
_G_FLOOR = np.where(_G_ANCHOR, 1.0, 0.0)  # anchored: visibility at least 1
#: Rank of a visible owner's code when merging owners (× (owners + 1), plus owners − position): manual-known,
#: then anchored, then the first owner.
_G_RANK = np.array([0, 0, 0, 2, 1, 0, 2], dtype=np.int64)
#: The gate mode of each code (for _G_SCORED: rescued, soft-visible or suppressed, from the scores).
_G_MODE = np.array([_NO_OWNER, _HIDDEN, _MISTAKEN, _MANUAL, _ANCHORED, _SUPPRESSED, _MANUAL], dtype=np.intp)
#: Threshold by SCOPE_BUCKETS index (−1: a name outside SCOPE_BUCKETS), before the POV override.
_THRESHOLDS = np.array(
    [_THRESHOLD_OTHER, _THRESHOLD_OTHER, _THRESHOLD_CURRENT, _THRESHOLD_ADJACENT, _THRESHOLD_GLOBAL,
     _THRESHOLD_OTHER, _THRESHOLD_OTHER]
)
_THRESHOLDS_INJECT = np.where(np.arange(7) == SCOPE_BUCKETS.index("objectiveGlobal"), 0.0, _THRESHOLDS)
_CURRENT_BUCKET = SCOPE_BUCKETS.index("objectiveCurrentRegion")
_USER_POV_BUCKET = SCOPE_BUCKETS.index("userPov")


def _gate_codes(snapshot: GraphSnapshot, cols: np.ndarray | None = None) -> np.ndarray:
    """(owners + 1, n) uint8 :data:`_G_NO_OWNER` … codes of every owner row and node (of the nodes ``cols`` only:
    (owners + 1, len(cols))); the last row (an owner key without an entry) is all :data:`_G_NO_OWNER`. Assigned
    from the last rule to the first (first match wins); a node's codes read only its own columns."""
    know = snapshot.knowledge

    def at(a: np.ndarray) -> np.ndarray:
        return a if cols is None else a[..., cols]

    known, own_pov, manual_known = at(know.known), at(know.own_pov), at(know.manual_known)
    mistaken, hidden = at(know.mistaken), at(know.hidden)
    type_code, is_pov = at(snapshot.type_code), at(snapshot.is_pov)
    k, n = known.shape
    codes = np.full((k + 1, n), _G_SCORED, dtype=np.uint8)
    live = codes[:k]
    anchored = known | own_pov
    live[manual_known & ~anchored] = _G_SCORED_MANUAL
    live[anchored] = _G_ANCHORED
    live[manual_known & anchored] = _G_MANUAL
    # A chat turn (``message`` node, a project addition) is what was said in the chat, not a memory extracted
    # for an owner: the knowledge state has no entry for it, so only an explicit hidden / mistaken entry gates
    # it (the reference has no such nodes; its raw-cosine rescue let every one through under e5 by accident).
    live[(live == _G_SCORED) & (type_code == MESSAGE_TYPE_CODE)[None, :]] = _G_NO_OWNER
    live[mistaken & ~is_pov[None, :]] = _G_MISTAKEN
    live[hidden] = _G_HIDDEN
    codes[k] = _G_NO_OWNER
    return codes


def _rounded_visibility(snapshot: GraphSnapshot, at: np.ndarray) -> np.ndarray:
    """``snapshot.knowledge.visibility`` at the flat positions ``at`` (any shape) as float64 rounded to 7
    decimals. Stored as float32 in the snapshot: 7 decimals recover the decimal the owner entry holds (0.6, not
    0.6000000238), so the weight is the reference's 0.55 + 0.6 × 0.6 = 0.91. Element-wise: gathering then
    rounding gives what rounding the whole array then gathering would, bit for bit."""
    vis = np.ascontiguousarray(snapshot.knowledge.visibility)
    return vis.ravel().take(at).astype(np.float64).round(7)  # type: ignore[no-any-return]


def _knowledge_gate(
    snapshot: GraphSnapshot,
    arrays: _SnapshotArrays | None,
    idx: np.ndarray,
    owner_rows: Sequence[int] | np.ndarray,
    vector_raw: np.ndarray,
    graph: np.ndarray,
    lexical: np.ndarray,
    bucket_idx: np.ndarray,
    *,
    inject_low_confidence: bool,
    user_row: int = -1,
    named: np.ndarray | None = None,
) -> GateResult:
    """:func:`knowledge_gate` of ``idx`` (int64) with the scope buckets as :data:`SCOPE_BUCKETS` indices."""
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
            rescue_only=np.zeros(m, dtype=bool),
            rescue_rule=np.zeros(m, dtype=np.int8),
        )
    arrays = arrays or _snapshot_arrays(snapshot)
    raw = np.asarray(vector_raw, dtype=np.float64)
    graph = np.asarray(graph, dtype=np.float64)
    lexical = np.asarray(lexical, dtype=np.float64)
    pov = snapshot.is_pov[idx]
    threshold = (_THRESHOLDS_INJECT if inject_low_confidence else _THRESHOLDS)[bucket_idx]
    threshold[pov] = _THRESHOLD_POV
    current = bucket_idx == _CURRENT_BUCKET
    # NaN (no calibrated cosine) fails every comparison: no vector-based rule holds.
    support = raw >= _RESCUE_SUPPORT
    rule = np.select(
        [raw >= _RESCUE_VECTOR, current & (raw >= _RESCUE_CURRENT_VECTOR),
         np.zeros(m, dtype=bool) if named is None else np.asarray(named, dtype=bool),
         (lexical >= _RESCUE_LEXICAL) & (support | np.isnan(raw)), (graph >= _RESCUE_GRAPH) & support,
         current & (graph >= _RESCUE_CURRENT_GRAPH) & support],
        [1, 2, 3, 4, 5, 6], 0,
    ).astype(np.int8)
    rule[pov] = 0  # only objective nodes are rescued
    strong = rule > 0

    # (k, m) gathers from the flat per-snapshot arrays; an owner key without an entry reads the last code row.
    n_owners, n = arrays.gate_code.shape[0] - 1, arrays.gate_code.shape[1]
    row_list = rows.tolist()
    live = [0 <= r < n_owners for r in row_list]
    at = np.array([r if ok else n_owners for r, ok in zip(row_list, live, strict=True)])[:, None] * n + idx
    code = arrays.gate_code.ravel().take(at)
    if n_owners:
        if not all(live):
            at = np.array([r if ok else 0 for r, ok in zip(row_list, live, strict=True)])[:, None] * n + idx
        vis = _rounded_visibility(snapshot, at)
    else:
        vis = np.zeros((k, m))
    by_scores = _G_BY_SCORES[code]
    rescued = by_scores & strong  # objective, not anchored, strong: visibility at least 0.68
    # base = max(visibility, anchored), raised to 0.68 when rescued.
    vis_o = np.maximum(vis, np.where(rescued, _RESCUE_VISIBILITY, _G_FLOOR[code]))
    plain_o = _G_VISIBLE[code] | (by_scores & (vis >= threshold))  # visible without any rescue
    visible_o = plain_o | rescued | (by_scores & (vis_o >= threshold))
    neutral = _G_NEUTRAL[code]  # early returns and missing entries report visibility 0, threshold 0
    # Per owner: the code's mode; decided by the scores: rescued (always visible), soft-visible or suppressed.
    mode_o = np.where(code == _G_SCORED, _SUPPRESSED - visible_o - rescued, _G_MODE[code])

    visible = visible_o.any(axis=0)
    persona = np.zeros(m, dtype=bool)
    if 0 <= user_row < n_owners:  # the persona's own view: see knowledge_gate
        persona = pov & (bucket_idx == _USER_POV_BUCKET) & _G_ANCHOR[arrays.gate_code[user_row].take(idx)]
        persona &= ~visible
    # The node's mode: manual-known when a visible owner is, else anchored when one is, else the first visible
    # owner's mode (the first owner's when none is visible): the owner with the highest visible rank wins.
    rank = visible_o * ((_G_RANK * (k + 1))[code] + np.arange(k, 0, -1)[:, None])
    mode = mode_o[rank.argmax(axis=0), np.arange(m)]
    if persona.any():
        visible = visible | persona
        mode = np.where(persona, _ANCHORED, mode)
        vis_o = np.where(persona, np.maximum(vis_o, 1.0), vis_o)
    return GateResult(
        visible=visible,
        mode=_MODE_ARRAY[mode],
        reason=_REASON_ARRAY[np.where(visible, _NO_OWNER, mode)],
        anchored=_G_ANCHOR[code].any(axis=0) | persona,
        rescued=rescued.any(axis=0),
        visibility=np.where(neutral, 0.0, vis_o).max(axis=0),
        threshold=np.where(neutral, 0.0, threshold).max(axis=0),
        coverage=visible_o.sum(axis=0) / k,
        owner_visible=visible_o,
        rescue_only=visible & ~plain_o.any(axis=0) & ~persona,
        rescue_rule=np.where(rescued.any(axis=0), rule, 0).astype(np.int8),
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
        if f.name in ("time_cue_weight", "speaker_cue_weight") and col.size == 0:
            values[f.name] = col  # a table built without the time cue: every row's is 1
        elif isinstance(col, np.ndarray):
            values[f.name] = col[rows].copy()
        else:
            values[f.name] = tuple(col[int(r)] for r in rows)
    return ScoredTable(**values)


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
    node_i = int(table.index[row])
    is_message = bool(snapshot.type_code[node_i] == MESSAGE_TYPE_CODE)
    raw_weights = kind_weights(scoring, lexical, message=is_message).raw  # per node kind (pipeline.kind_weights)
    denom = max(1e-6, sum(max(0.0, w) for w in raw_weights))
    multipliers = {
        "decay": float(table.decay[row]),
        "scope": float(table.scope_weight[row]),
        "knowledge": float(table.knowledge_weight[row]),
        "owner_coverage": float(table.owner_coverage_weight[row]),
        "temporal": float(table.temporal_weight[row]),
    }
    # The time cue's own row (pipeline.temporal), listed only where it raised the node (else it is exactly 1).
    time_cue = float(table.time_cue_weight[row]) if table.time_cue_weight.size else 1.0
    if time_cue != 1.0:
        multipliers["time_cue"] = time_cue
    speaker_cue = float(table.speaker_cue_weight[row]) if table.speaker_cue_weight.size else 1.0
    if speaker_cue != 1.0:  # the speaker cue's own row (pipeline.speaker_cue), likewise
        multipliers["speaker_cue"] = speaker_cue
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

    def _lexical(
        self, state: RecallState, idx: np.ndarray, bm25: np.ndarray, is_message: np.ndarray | None = None
    ) -> np.ndarray:
        """Reference field match against the lexical sources, max-combined with the BM25 score; 0 when the
        lexical boost is off (§3.12 step 1). The field match is scaled per row by its kind's field-match weight
        (``is_message`` rows: ``scoring.message_field_match_weight``; pipeline.kind_weights)."""
        m = idx.size
        if not self.lexical.enable_lexical_boost:
            return np.zeros(m)
        weight: float | np.ndarray = float(self.lexical.field_match_weight)
        if is_message is not None and is_message.any():
            weight = np.where(is_message, float(self.settings.message_field_match_weight), weight)
        field_match = np.zeros(m)
        if np.any(weight != 0.0):  # a weight of 0 zeroes every (finite, non-negative) field match
            sources = state.plan.lexical_sources or (normalize_query(state.query.user_message),)
            snap = state.snapshot
            field_match = _field_table(snap).scores(
                idx, prepare_sources(sources), functools.partial(_prepared_node, snap)
            ) * weight
        if self.lexical.enable_bm25:
            return np.maximum(field_match, bm25.clip(0.0, 1.0))
        return field_match

    def _gate_lexical(self, state: RecallState, idx: np.ndarray, lexical: np.ndarray) -> np.ndarray:
        """The lexical evidence the rescue rules read: the reference's field match alone (a token coverage, the
        same under any embedder). The BM25 part is left out: it is divided by the best hit's score, so the best
        hit always has 1 — a rank, not a strength, that would rescue the top lexical hit of every query."""
        if not (self.lexical.enable_lexical_boost and self.lexical.enable_bm25):
            return lexical
        return self._lexical(state, idx, np.zeros(idx.size)) if self.lexical.field_match_weight else np.zeros(idx.size)

    def _calibrated(self, state: RecallState, idx: np.ndarray) -> tuple[np.ndarray, RescueCalibration]:
        """Calibrated cosine of the candidates (:func:`calibrated_cosine`) and the calibration it used."""
        snap = state.snapshot
        queries = state.query_vectors
        if queries is None or not snap.embeddings.shape[0] or queries.shape[-1] != snap.embeddings.shape[1]:
            return np.full(idx.size, np.nan), RescueCalibration(np.zeros(0), 0)
        eligible = active_mask(state) & snap.has_vector
        calibration = calibration_from_sample(*_rescue_sample(snap, eligible), queries)
        weights = np.array([w for _, w in state.plan.vector_queries], dtype=np.float64)
        if weights.size != queries.shape[0]:
            weights = np.ones(queries.shape[0])
        u = calibrated_cosine(snap.embeddings, snap.has_vector, idx, queries, weights, calibration)
        return u, calibration

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        snap = state.snapshot
        cands = state.candidates
        base: dict[str, Any] = {"score_kind": _SCORE_KIND, "score_direction": "higher_is_better"}
        m_in = len(cands)
        if m_in == 0:
            return state, {**base, "skipped": True, "skip_reason": "no-candidates"}

        # Score-map columns (graph score, co-occurrence boost included: module docstring; vector score; raw
        # cosine; BM25); a node listed twice keeps its first entry.
        idx = np.asarray(cands.index, dtype=np.int64)
        cols = _score_columns((cands.graph_score, cands.vector_score, cands.vector_raw, cands.bm25_score), m_in)
        keep = _first_entries(idx, snap.n)
        if keep is not None:
            idx, cols = idx[keep], cols[:, keep]

        # Eligibility (departure 2): archived and inactive nodes never score; hidden or already-gated ones are
        # suppressed for good.
        arrays = _snapshot_arrays(snap)
        prior = {str(x) for x in state.meta.get("gate_suppressed", ())}
        hidden = hidden_mask(state)
        is_hidden = hidden[idx] if hidden is not None else None
        if prior:
            prior_idx = np.array(sorted(snap.index[x] for x in prior if x in snap.index), dtype=np.int64)
            in_prior = np.isin(idx, prior_idx)
            is_hidden = in_prior if is_hidden is None else is_hidden | in_prior
        eligible = active_mask(state)[idx] & ~snap.archived[idx]
        hidden_ids: list[str] = []
        if is_hidden is not None and is_hidden.any():
            eligible &= ~is_hidden
            hidden_ids = arrays.ids[idx[is_hidden]].tolist()
        n_eligible = int(np.count_nonzero(eligible))
        dropped_inactive = idx.size - n_eligible - len(hidden_ids)
        if n_eligible < idx.size:
            idx, cols = idx[eligible], cols[:, eligible]
        graph, vector, raw, bm25 = cols
        m = idx.size

        # Weights per node kind (pipeline.kind_weights): message rows with the message_* values when
        # scoring.message_weights is on, every other row (and all rows when it is off) with the reference's.
        is_message = message_rows(snap, idx, self.settings)
        ref_w = kind_weights(self.settings, self.lexical, message=False)
        msg_w = kind_weights(self.settings, self.lexical, message=True)
        lexical = self._lexical(state, idx, bm25, is_message)
        delta = ref_w.lexical
        fused_vector, fused_lexical = vector, lexical
        for w, rows in ((ref_w, None if is_message is None else ~is_message), (msg_w, is_message)):
            if w.neighbour_carry <= 0.0 or (rows is not None and not rows.any()) or (w is msg_w and rows is None):
                continue
            carried_v = neighbour_carry_values(vector, idx, snap.prev_index, snap.next_index, w.neighbour_carry)
            carried_l = neighbour_carry_values(lexical, idx, snap.prev_index, snap.next_index, w.neighbour_carry)
            fused_vector = carried_v if rows is None else np.where(rows, carried_v, fused_vector)
            fused_lexical = carried_l if rows is None else np.where(rows, carried_l, fused_lexical)
        if self.settings.fusion == "rrf":
            fused_vector = rank_fusion_values(fused_vector, snap.id_rank[idx])
            fused_lexical = rank_fusion_values(fused_lexical, snap.id_rank[idx])
        hp = per_kind_hybrid(
            graph, fused_vector, fused_lexical, snap.importance[idx], snap.created_time[idx],
            float(state.query.now_ms), is_message, ref_w, msg_w,
        )
        # Time cue (pipeline.temporal): when-questions and named dates raise the message turns that fit.
        time_w, time_notes = time_cue_weights(
            snap, idx, is_message if is_message is not None else np.zeros(m, dtype=bool),
            state.query.user_message, float(state.query.now_ms), self.settings,
        )
        if time_notes:
            # Folded into the hybrid score like the time decay (not into the ranking multipliers): the DPP picks by
            # the hybrid score, so a multiplier of the weighted score alone would only move the pool's edge.
            hp = scale_hybrid(hp, time_w)
        # Speaker cue (pipeline.speaker_cue): a question naming a speaker raises that speaker's turns, the same way.
        speaker_w, speaker_notes = speaker_cue_weights(
            snap, idx, is_message if is_message is not None else np.zeros(m, dtype=bool),
            state.query.user_message, self.settings,
        )
        if speaker_notes:
            hp = scale_hybrid(hp, speaker_w)

        # Scope buckets and story time as codes into small tables (names, weights, priorities).
        ctx = state.context
        weights_map = bucket_weights(self.settings)
        if self.context.enable_scoped_memory and m:
            bucket = _CHOICE_BUCKET[_scope_codes(snap, arrays, idx, ctx, self.context)]  # SCOPE_BUCKETS index
            scope_w = np.array([weights_map[b] for b in SCOPE_BUCKETS])[bucket]
        else:
            bucket = np.full(m, _CHOICE_BUCKET[_GLOBAL_CHOICE])
            scope_w = np.ones(m)
        timeline_on = self.context.enable_story_timeline
        soft = timeline_on and self.context.story_time_soft_directing
        t_code, t_table = _temporal_codes(snap, arrays, idx, ctx, enabled=timeline_on)

        owner_keys = tuple(ctx.owner_keys)
        n_owners = len(owner_keys)
        multiplier = scope_w  # (((scope × knowledge) × coverage) × temporal), factors of 1 left out (exact)
        gate: GateResult | None = None
        calibrated = np.full(m, np.nan)
        calibration = RescueCalibration(np.zeros(0), 0)
        if self.context.enable_cognitive_memory:
            owner_rows = resolve_owner_rows(snap, owner_keys)
            if owner_rows.size and m:  # rescue evidence matters only when some owner gates
                calibrated, calibration = self._calibrated(state, idx)
            gate = _knowledge_gate(
                snap,
                arrays,
                idx,
                owner_rows,
                calibrated,
                graph,
                self._gate_lexical(state, idx, lexical) if owner_rows.size else lexical,
                bucket,
                inject_low_confidence=self.settings.inject_low_confidence_objective_memory,
                user_row=persona_row(snap, state.query),
                named=np.isin(idx, np.fromiter((i for i, _ in state.anchors), dtype=np.int64)),
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
            multiplier = (multiplier * know_w) * cover_w
            visible = gate.visible
        else:
            know_w = cover_w = np.ones(m)
            visible = np.ones(m, dtype=bool)
        temporal_w = np.ones(m)
        t_suppressed = np.zeros(m, dtype=bool)
        if soft:
            temporal_w = t_table.weight[t_code]
            multiplier = multiplier * temporal_w
            t_suppressed = visible & t_table.suppressed[t_code]
        stacked = hp.stacked if hp.stacked is not None else np.stack([hp.graph, hp.vector, hp.lexical, hp.importance])
        parts_by_row = stacked * multiplier  # (4, m): graph, vector, lexical, importance
        weighted = ((parts_by_row[0] + parts_by_row[1]) + parts_by_row[2]) + parts_by_row[3]
        parts = parts_by_row.T

        # Rank the gate-visible rows (temporally suppressed ones included: temporalBuckets lists them). The scope
        # priority then the story-time priority (0–5) sort as one key.
        priority = _NEG_SCOPE_PRIORITY[bucket] * len(TEMPORAL_BUCKETS) + t_table.neg_priority[t_code]
        if is_message is not None:
            # Per node kind (departure, docs/reference-differences.md): a raw chat turn without a scope of its own
            # (objectiveGlobal) is the chat itself, not a memory of another place or time; it sorts with the
            # current-region memories of the current story time, by score, instead of below every scoped one.
            turn = is_message & (bucket == _CHOICE_BUCKET[_GLOBAL_CHOICE])
            if turn.any():
                top = _NEG_SCOPE_PRIORITY[SCOPE_BUCKETS.index("objectiveCurrentRegion")] * len(TEMPORAL_BUCKETS) - (
                    len(TEMPORAL_BUCKETS) - 1)
                priority = np.where(turn, top, priority)
        order = np.lexsort((snap.id_rank[idx], -hp.score, -weighted, priority))
        if not visible.all():
            order = order[visible[order]]
        kept = order[~t_suppressed[order]] if t_suppressed.any() else order

        kept_bucket = bucket[kept].tolist()
        table = ScoredTable(
            index=idx[kept],
            final_score=hp.score[kept],
            weighted_score=weighted[kept],
            graph_score=graph[kept],
            vector_score=fused_vector[kept],
            lexical_score=fused_lexical[kept],
            parts=parts[kept],
            decay=hp.decay[kept],
            scope_bucket=tuple(map(SCOPE_BUCKETS.__getitem__, kept_bucket)),
            scope_weight=scope_w[kept],
            knowledge_mode=(tuple(gate.mode[kept].tolist()) if gate is not None else ("disabled",) * kept.size),
            knowledge_weight=know_w[kept],
            knowledge_visibility=(gate.visibility[kept] if gate is not None else np.zeros(kept.size)),
            owner_coverage=(gate.coverage[kept] if gate is not None else np.ones(kept.size)),
            owner_coverage_weight=cover_w[kept],
            temporal_bucket=tuple(t_table.bucket[t_code[kept]].tolist()),
            temporal_weight=temporal_w[kept],
            time_cue_weight=time_w[kept],
            speaker_cue_weight=speaker_w[kept],
        )

        meta = self._meta(
            state, arrays, table, arrays.ids[idx], idx, order, kept, kept_bucket, t_code, t_table, gate,
            owner_keys, t_suppressed, hidden_ids, prior, weights_map,
        )
        if gate is not None:
            meta.update(_rescue_meta(arrays.ids[idx], gate, calibrated, graph, lexical))
        new_state = state.evolve(scored=table, meta=state.with_meta(**meta))
        notes = {
            "owner_keys": list(owner_keys),
            "owner_mode": ctx.owner_mode,
            "cue_mode": ctx.cue_mode,
            "dropped_inactive": dropped_inactive,
            "dropped_hidden": len(hidden_ids),
            "knowledge_suppressed": int(m - np.count_nonzero(visible)),
            "temporal_suppressed": int(np.count_nonzero(t_suppressed)),
            "lexical_weight": delta,
        }
        if is_message is not None:
            notes["message_rows"] = int(np.count_nonzero(is_message))
        if time_notes:
            notes["time_cue"] = time_notes
        if speaker_notes:
            notes["speaker_cue"] = speaker_notes
        if calibration.median.size:
            med = float(calibration.median[0])
            notes["rescueCalibration"] = {
                "median": med, "spread": 1.0 - med, "medians": calibration.median.round(4).tolist(),
                "sample": calibration.sample,
            }
        return new_state, {**base, "count_in": m_in, "count_out": len(table), "notes": notes}

    def _meta(
        self,
        state: RecallState,
        arrays: _SnapshotArrays,
        table: ScoredTable,
        row_ids: np.ndarray,
        idx: np.ndarray,
        order: np.ndarray,
        kept: np.ndarray,
        kept_bucket: list[int],
        t_code: np.ndarray,
        t_table: _TemporalTable,
        gate: GateResult | None,
        owner_keys: tuple[str, ...],
        t_suppressed: np.ndarray,
        hidden_ids: list[str],
        prior: set[str],
        weights_map: dict[str, float],
    ) -> dict[str, Any]:
        """The meta of the module docstring. ``row_ids`` (object array) are the node ids of the score-map rows
        ``idx`` (positions ``p``), ``order`` the gate-visible positions in ranking order, ``kept`` the table's
        positions (the temporally suppressed ones left out) and ``kept_bucket`` their SCOPE_BUCKETS indices.
        Nodes with the same owner verdicts share one list object in the per-node owner maps (nothing mutates the
        meta)."""
        snap = state.snapshot
        n_rows = kept.size
        kept_ids = row_ids[kept].tolist()
        node_at = table.index.tolist()

        def label(row: int) -> str:
            return _label(snap, arrays, node_at[row])

        lex = table.lexical_score
        lex_rows = np.flatnonzero(lex > 0)
        # Lexical then final score, descending; ties keep the row order (lexsort is stable).
        top = lex_rows[np.lexsort((-table.final_score[lex_rows], -lex[lex_rows]))][:5]
        lexical_top = [
            {
                "nodeId": kept_ids[r],
                "type": snap.type_of(node_at[r]),
                "label": label(r),
                "lexicalScore": round(score, 3),
                "finalScore": round(final, 3),
            }
            for r, score, final in zip(
                top.tolist(), lex[top].tolist(), table.final_score[top].tolist(), strict=True
            )
        ]
        visibility = table.knowledge_visibility
        vis_rows = np.flatnonzero(visibility > 0)
        top = vis_rows[np.argsort(-visibility[vis_rows], kind="stable")][:6]
        visibility_top = [
            {
                "nodeId": kept_ids[r],
                "label": label(r),
                "visibilityScore": round(score, 3),
                "knowledgeMode": table.knowledge_mode[r],
            }
            for r, score in zip(top.tolist(), visibility[top].tolist(), strict=True)
        ]
        temporal_top = [
            {
                "nodeId": kept_ids[r],
                "bucket": table.temporal_bucket[r],
                "weight": round(float(t_table.weight[code]), 3),  # the director's weight, soft directing or not
                "label": label(r),
                "reason": t_table.reason[code],
            }
            for r, code in enumerate(t_code[kept[:8]].tolist())
        ]
        # Ids per bucket in ranking order, buckets in priority order (the temporal map lists the gate-visible
        # rows, temporally suppressed ones included: reference).
        scope_buckets_meta = _group(kept_ids, kept_bucket, SCOPE_BUCKETS)
        temporal_buckets_meta = _group(
            row_ids[order].tolist(), t_table.bucket_index[t_code[order]].tolist(), TEMPORAL_BUCKETS
        )

        # Per-node gate lists in score-map order (the reference appends while it loops over the map).
        if gate is not None:
            anchored, rescued, suppressed, reasons, visible_owners, suppressed_owners = _gate_meta(
                gate, row_ids, owner_keys
            )
        else:
            anchored, rescued, suppressed, reasons = [], [], [], {}
            visible_owners, suppressed_owners = {}, {}
        for hid in hidden_ids:
            reasons.setdefault(hid, "visibility-filter" if hid not in prior else "gate-suppressed")
        t_rescued = t_table.rescued[t_code]
        if gate is not None:
            t_rescued = t_rescued & gate.visible
        if prior or hidden_ids:
            gate_suppressed = sorted(prior | set(suppressed) | set(hidden_ids))
        elif gate is not None:  # the suppressed ids in id order: snapshot.id_rank ranks the ids as sorted() does
            out = ~gate.visible
            gate_suppressed = row_ids[out][np.argsort(snap.id_rank[idx[out]])].tolist()
        else:
            gate_suppressed = []
        return {
            "scoredCandidates": n_rows,
            "lexicalBoostedNodes": int(lex_rows.size),
            "lexicalTopHits": lexical_top,
            "visibilityTopHits": visibility_top,
            "temporalTopHits": temporal_top,
            "scopeBuckets": scope_buckets_meta,
            "temporalBuckets": temporal_buckets_meta,
            "bucketWeights": weights_map,
            "knowledgeGateMode": KNOWLEDGE_GATE_MODE if gate is not None else "disabled",
            "knowledgeAnchoredNodes": anchored,
            "knowledgeSuppressedNodes": suppressed,
            "knowledgeRescuedNodes": rescued,
            "knowledgeVisibleOwnersByNode": visible_owners,
            "knowledgeSuppressedOwnersByNode": suppressed_owners,
            "visibilitySuppressedReasons": reasons,
            "temporalSuppressedNodes": row_ids[t_suppressed].tolist(),
            "temporalRescuedNodes": row_ids[t_rescued].tolist(),
            "gate_suppressed": gate_suppressed,
        }


def _rescue_meta(
    ids: np.ndarray, gate: GateResult, calibrated: np.ndarray, graph: np.ndarray, lexical: np.ndarray
) -> dict[str, Any]:
    """``knowledgeRescueOnlyNodes`` (visible only through a rescue: never admitted by the core route, scene
    reconstruction or the fallback layout) and ``knowledgeRescueReasons`` (id → the rule and its evidence), in
    score-map order. ``lexical`` is the recall's lexical score (the reason quotes it; the rule read the field
    match)."""
    at = np.flatnonzero(gate.visible & (gate.rescue_rule > 0))
    reasons = {}
    for i in at.tolist():
        rule = RESCUE_RULES[int(gate.rescue_rule[i])]
        u = float(calibrated[i])
        evidence = f"calibrated cosine {u:.3f}" if np.isfinite(u) else "no calibrated cosine"
        if rule == "lexical":
            evidence = f"lexical {float(lexical[i]):.3f}, {evidence}"
        elif rule == "named":
            evidence = f"named in the user message, {evidence}"
        elif rule in ("graph", "current-graph"):
            evidence = f"graph energy {float(graph[i]):.3f}, {evidence}"
        reasons[str(ids[i])] = f"rescued by rule {rule}: {evidence}"
    return {
        "knowledgeRescueOnlyNodes": ids[gate.rescue_only].tolist(),
        "knowledgeRescueReasons": reasons,
    }


def _gate_meta(
    gate: GateResult, ids: np.ndarray, owner_keys: tuple[str, ...]
) -> tuple[list[str], list[str], list[str], dict[str, str], dict[str, list[str]], dict[str, list[str]]]:
    """The gate's per-node meta in score-map order (``ids``: object array of the gate's node ids): anchored,
    rescued and suppressed ids, the suppressed ones' reasons, and the visible and missing owner keys of each
    visible node (missing: only when some owner does not see it). Nodes with the same verdicts share one owner
    list object."""
    visible = gate.visible
    anchored = ids[visible & gate.anchored].tolist()
    rescued = ids[visible & gate.rescued].tolist()
    hidden = ~visible
    suppressed = ids[hidden].tolist()
    reasons = dict(zip(suppressed, gate.reason[hidden].tolist(), strict=True))
    visible_owners: dict[str, list[str]] = {}
    suppressed_owners: dict[str, list[str]] = {}
    if owner_keys:
        visible_owners, suppressed_owners = _owner_lists(gate.owner_visible[:, visible], ids[visible], owner_keys)
    return anchored, rescued, suppressed, reasons, visible_owners, suppressed_owners


def _owner_lists(
    columns: np.ndarray, ids: np.ndarray, owner_keys: tuple[str, ...]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``({id: owner keys seeing it}, {id: owner keys not seeing it})`` of the nodes ``ids`` (object array) from
    their (owners × nodes) visibility ``columns``; the second map only holds nodes some owner does not see.
    One (seeing, not seeing) pair of lists per distinct column, shared by its nodes: a few owners give a handful
    of patterns for the hundreds of nodes. A column's pattern is its bits as an integer (a tuple past 62)."""
    k = len(owner_keys)
    patterns: list[Any] = (
        (_POWERS_OF_TWO[:k] @ columns).tolist() if k <= 62 else list(map(tuple, columns.T.tolist()))
    )
    seen: dict[Any, list[str]] = {}
    missing: dict[Any, list[str]] = {}
    for pattern in dict.fromkeys(patterns):
        sees, misses = _split_owners(owner_keys, pattern)
        seen[pattern] = list(sees)
        missing[pattern] = list(misses)
    node_ids = ids.tolist()
    node_missing = list(map(missing.__getitem__, patterns))
    return (
        dict(zip(node_ids, map(seen.__getitem__, patterns), strict=True)),
        dict(itertools.compress(zip(node_ids, node_missing, strict=True), node_missing)),
    )


_POWERS_OF_TWO = 1 << np.arange(62, dtype=np.int64)


@functools.lru_cache(maxsize=1024)
def _split_owners(owner_keys: tuple[str, ...], pattern: int | tuple[bool, ...]) -> tuple[tuple[str, ...], ...]:
    """``(owners seeing, owners not seeing)`` of a visibility pattern (:func:`_owner_lists`); a scene's few
    patterns recur from recall to recall."""
    sees = [pattern >> o & 1 for o in range(len(owner_keys))] if isinstance(pattern, int) else pattern
    return (
        tuple(itertools.compress(owner_keys, sees)),
        tuple(itertools.compress(owner_keys, [not v for v in sees])),
    )


def _group(ids: list[str], keys: list[int], names: Sequence[str]) -> dict[str, list[str]]:
    """``{names[k]: [ids with key k, in order]}`` for the keys present, in ``names`` order."""
    groups: dict[int, list[str]] = {}
    for nid, key in zip(ids, keys, strict=True):
        group = groups.get(key)
        if group is None:
            groups[key] = [nid]
        else:
            group.append(nid)
    return {names[k]: groups[k] for k in sorted(groups)}


def _score_columns(columns: Sequence[np.ndarray], m: int) -> np.ndarray:
    """(len(columns), m) float64 of the score-map columns; a column of another shape reads as zeros, non-finite
    values as 0."""
    arrays = [np.asarray(values, dtype=np.float64) for values in columns]
    if all(arr.shape == (m,) for arr in arrays):
        out = np.array(arrays)
    else:
        out = np.zeros((len(columns), m))
        for r, arr in enumerate(arrays):
            if arr.shape == (m,):
                out[r] = arr
    finite = np.isfinite(out)
    if not finite.all():
        out[~finite] = 0.0
    return out


def _first_entries(idx: np.ndarray, n: int) -> np.ndarray | None:
    """Positions of the first entry of each node of ``idx`` that is a node index of the graph (``0 ≤ i < n``),
    in order; None when that is every position (the usual score map: no repeat, nothing out of range)."""
    ordered = np.sort(idx)
    if ordered[0] >= 0 and ordered[-1] < n and (ordered.size < 2 or (ordered[1:] != ordered[:-1]).all()):
        return None
    _, first = np.unique(idx, return_index=True)
    keep = np.sort(first)
    return keep[(idx[keep] >= 0) & (idx[keep] < n)]
