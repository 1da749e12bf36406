"""Types every pipeline stage shares: the query, the state passed from stage to stage, traces and explanations.

Stage contract (every module of ``memory_recall/pipeline`` except this one and ``retrieve.py`` follows it):

* A stage is a small class with a light ``__init__`` that stores its settings section (and the providers it
  needs) unchanged, and one method ``run(state: RecallState) -> StageResult``.
* ``run`` never mutates ``state`` (nor the snapshot it points to): it returns a new state built with
  :meth:`RecallState.evolve` plus a :class:`StageTrace`.
* A stage that has nothing to do (disabled, empty input, missing provider) returns the state unchanged and a
  trace with ``skipped=True`` and a stable ``skip_reason`` code.
* Scores named ``*_score`` are higher-is-better; a ``*_rank`` is a 1-based position; each trace states its
  score kind and direction.
* Arrays of node indices refer to ``state.snapshot`` positions; ties break by ``snapshot.id_rank`` (byte order
  of node ids) unless the reference defines another order.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from memory_recall.store.snapshot import GraphSnapshot

__all__ = [
    "EMPTY_INDEX",
    "BlendPart",
    "Candidates",
    "ContextInfo",
    "Explanation",
    "ExplanationPart",
    "OwnerCandidate",
    "Providers",
    "QueryPlan",
    "RecallQuery",
    "RecallState",
    "ScoredTable",
    "StageResult",
    "StageTrace",
    "VectorStatus",
    "timed",
]

EMPTY_INDEX = np.zeros(0, dtype=np.int64)
ScoreDirection = Literal["higher_is_better", "lower_is_better", "none"]


class _Fresh:
    """Type of :data:`_FRESH`, the "not given" default of the hand-written dataclass ``__init__`` below."""


_FRESH = _Fresh()


@dataclass(frozen=True)
class RecallQuery:
    """What one recall is asked: the user's text, recent context lines and the scene the host reports.

    ``recent_lines`` are ``"[user]: …"`` / ``"[assistant]: …"`` lines (reference §2.2), the current message
    usually last. ``active_owner_keys`` given by the caller are final for this recall (recall-spec departure
    2); ``None`` means "infer them". ``now_ms`` and ``seed`` make the recall deterministic.
    """

    user_message: str
    recent_lines: tuple[str, ...] = ()
    now_ms: int = 0
    seed: int = 0
    chat_id: str = ""
    user_floor: int | None = None
    active_region: str = ""
    active_owner_keys: tuple[str, ...] | None = None
    active_character_pov_owner: str = ""
    active_user_pov_owner: str = ""
    active_story_segment_id: str = ""
    active_story_time_label: str = ""
    visibility_filter: str = ""
    host_character_name: str = ""
    host_user_name: str = ""


@dataclass(frozen=True, init=False)
class StageTrace:
    """What one stage did: counts, time, the kind and direction of the score it produced, why it skipped.

    ``notes`` defaults to a new empty dict per trace.
    """

    name: str
    elapsed_ms: float = 0.0
    count_in: int = 0
    count_out: int = 0
    score_kind: str = "none"
    score_direction: ScoreDirection = "none"
    skipped: bool = False
    skip_reason: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    def __init__(
        self,
        name: str,
        elapsed_ms: float = 0.0,
        count_in: int = 0,
        count_out: int = 0,
        score_kind: str = "none",
        score_direction: ScoreDirection = "none",
        skipped: bool = False,
        skip_reason: str = "",
        notes: dict[str, Any] | _Fresh = _FRESH,
    ) -> None:
        # The dataclass __init__ of a frozen class sets each field through object.__setattr__; every stage builds
        # one trace per recall, so the fields go into the instance dict in one update (same values, same order).
        self.__dict__.update(
            name=name,
            elapsed_ms=elapsed_ms,
            count_in=count_in,
            count_out=count_out,
            score_kind=score_kind,
            score_direction=score_direction,
            skipped=skipped,
            skip_reason=skip_reason,
            notes={} if notes is _FRESH else notes,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ExplanationPart:
    """One additive part of a node's score: ``contribution = value × weight`` (after all multipliers)."""

    name: str
    value: float
    weight: float
    contribution: float


@dataclass(frozen=True)
class Explanation:
    """Why a node was selected: additive parts that sum to ``score``, and the multipliers folded into them."""

    node_id: str
    score: float
    score_kind: str
    parts: tuple[ExplanationPart, ...]
    multipliers: dict[str, float]
    notes: dict[str, Any] = field(default_factory=dict)

    def total(self) -> float:
        return float(sum(p.contribution for p in self.parts))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OwnerCandidate:
    """A scene-owner candidate (reference §3.1, §3.13)."""

    owner_key: str
    owner_name: str
    score: float
    sources: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContextInfo:
    """Resolved scene context (reference §3.1): owners, region, story time, cue mode."""

    owner_catalog: tuple[str, ...] = ()  # knowledge owner keys of type character
    owner_candidates: tuple[OwnerCandidate, ...] = ()
    owner_keys: tuple[str, ...] = ()  # preliminary (or caller-given) scene owners
    owner_scores: tuple[float, ...] = ()
    owner_mode: str = "unresolved"  # heuristic | request | unresolved
    active_character_pov_owner: str = ""
    active_user_pov_owner: str = ""
    active_region: str = ""
    active_region_source: str = ""
    adjacent_regions: tuple[str, ...] = ()
    story_segment_id: str = ""
    story_segment_label: str = ""
    story_segment_order: int | None = None
    story_source: str = ""
    cue_mode: str = "none"  # none | flashback | future


@dataclass(frozen=True)
class BlendPart:
    """One part of the context query blend (reference §3.5)."""

    kind: str  # currentUser | assistantContext | previousUser
    label: str
    text: str
    weight: float


@dataclass(frozen=True)
class QueryPlan:
    """Query blend, vector queries (text, weight) and lexical query sources (reference §3.5–§3.6)."""

    parts: tuple[BlendPart, ...] = ()
    active: bool = False
    combined_text: str = ""
    vector_queries: tuple[tuple[str, float], ...] = ()
    lexical_sources: tuple[str, ...] = ()
    segments: tuple[str, ...] = ()


@dataclass(frozen=True)
class VectorStatus:
    """Whether semantic search ran, and why not (recall-spec departure 3)."""

    retrieval_status: str = "ok"  # ok | lexical_fallback | disabled
    semantic_search_used: bool = False
    failure_category: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Candidates:
    """The score map (reference §3.10): candidate node indices in insertion order with their raw scores.

    ``graph_score`` is the diffusion energy (0..2), ``vector_score`` the blend-weighted similarity,
    ``vector_raw`` the raw cosine similarity (thresholds use it: recall-spec departure 4), ``bm25_score`` the
    normalised BM25 score in [0, 1].
    """

    index: np.ndarray = field(default_factory=lambda: EMPTY_INDEX)
    graph_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    vector_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    vector_raw: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bm25_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cooccurrence_boost: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return int(self.index.shape[0])


@dataclass(frozen=True)
class ScoredTable:
    """Scored, gated and ordered candidates (reference §3.12), one row per surviving node, in ranking order.

    The additive explanation of row ``r`` is ``parts[r]`` (graph, vector, lexical, importance) whose sum equals
    ``weighted_score[r]``.
    """

    index: np.ndarray = field(default_factory=lambda: EMPTY_INDEX)
    final_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    weighted_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    graph_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    vector_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lexical_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    parts: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # graph, vector, lexical, importance
    decay: np.ndarray = field(default_factory=lambda: np.zeros(0))
    scope_bucket: tuple[str, ...] = ()
    scope_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    knowledge_mode: tuple[str, ...] = ()
    knowledge_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    knowledge_visibility: np.ndarray = field(default_factory=lambda: np.zeros(0))
    owner_coverage: np.ndarray = field(default_factory=lambda: np.zeros(0))
    owner_coverage_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    temporal_bucket: tuple[str, ...] = ()
    temporal_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: Time-cue multiplier per row (pipeline.temporal), 1 where the question's time cue did not raise the row;
    #: empty in a table built without it (then every row's is 1).
    time_cue_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: Speaker-cue multiplier per row (pipeline.speaker_cue), likewise.
    speaker_cue_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def row_of(self, node_index: int) -> int:
        hits = np.nonzero(self.index == node_index)[0]
        return int(hits[0]) if hits.size else -1


# The empty defaults of a new RecallState (one per recall), built once: frozen values and zero-length arrays
# (nothing can be written into them), shared like EMPTY_INDEX instead of rebuilt per state.
_EMPTY_FLOAT = np.zeros(0)
_NO_ACTIVE = np.zeros(0, dtype=bool)
_NO_CONTEXT = ContextInfo()
_NO_PLAN = QueryPlan()
_VECTOR_OK = VectorStatus()
_NO_VECTOR_HITS = (EMPTY_INDEX, _EMPTY_FLOAT, _EMPTY_FLOAT)
_NO_HITS = (EMPTY_INDEX, _EMPTY_FLOAT)
_NO_CANDIDATES = Candidates()
_NO_SCORED = ScoredTable()


@dataclass(frozen=True)
class RecallState:
    """Everything the stages hand on. Built fresh by each stage through :meth:`evolve`.

    The defaults of the frozen fields and of the arrays are shared empty values (never written: the state is
    immutable); ``llm`` and ``meta`` default to new dicts.
    """

    snapshot: GraphSnapshot
    query: RecallQuery
    context: ContextInfo = _NO_CONTEXT
    active: np.ndarray = field(default_factory=lambda: _NO_ACTIVE)  # (n,) recall-eligible
    plan: QueryPlan = _NO_PLAN
    query_vectors: np.ndarray | None = None  # (q × d), rows aligned with plan.vector_queries
    vector_status: VectorStatus = _VECTOR_OK
    vector_hits: tuple[np.ndarray, np.ndarray, np.ndarray] = (
        _NO_VECTOR_HITS  # (index, weighted score, raw cosine), merged and ordered (reference §3.7)
    )
    vector_raw_hit_count: int = 0
    bm25_hits: tuple[np.ndarray, np.ndarray] = _NO_HITS
    anchors: tuple[tuple[int, str], ...] = ()  # (node index, matched term), exact anchors
    supplemental_anchors: tuple[int, ...] = ()
    residual_hits: tuple[tuple[int, float], ...] = ()
    diffusion: tuple[np.ndarray, np.ndarray] = _NO_HITS
    candidates: Candidates = _NO_CANDIDATES
    scored: ScoredTable = _NO_SCORED
    pool: tuple[int, ...] = ()  # candidate pool after DPP (node indices, pool order)
    selection: tuple[int, ...] = ()  # current selection (node indices, selection order)
    final_owner_keys: tuple[str, ...] = ()
    final_owner_scores: tuple[float, ...] = ()
    final_owner_mode: str = "unresolved"
    probabilistic: tuple[int, ...] = ()  # indices added by probabilistic recall
    reinforced: tuple[int, ...] = ()  # indices to reinforce (written by the controller with the record)
    llm: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    skip_reasons: tuple[str, ...] = ()
    traces: tuple[StageTrace, ...] = ()

    def evolve(self, **changes: Any) -> RecallState:
        """A new state with ``changes`` applied (the old one is untouched). Unknown field names raise
        ``TypeError`` (as :func:`dataclasses.replace`)."""
        if not changes.keys() <= _STATE_FIELDS:
            return dataclasses.replace(self, **changes)
        # Every stage evolves the state once or twice per recall: a shallow copy of the field values instead of
        # dataclasses.replace (which re-runs __init__ over all fields). The state has no __post_init__.
        new = object.__new__(RecallState)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def with_meta(self, **items: Any) -> dict[str, Any]:
        """A copy of ``meta`` with ``items`` added."""
        merged = dict(self.meta)
        merged.update(items)
        return merged

    def with_skip(self, reason: str) -> tuple[str, ...]:
        """``skip_reasons`` with ``reason`` appended once (ordered, unique)."""
        return self.skip_reasons if reason in self.skip_reasons else (*self.skip_reasons, reason)


_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(RecallState))


@dataclass(frozen=True, init=False)
class StageResult:
    """What ``Stage.run`` returns."""

    state: RecallState
    trace: StageTrace

    def __init__(self, state: RecallState, trace: StageTrace) -> None:
        # One per stage and recall: the instance dict is filled directly (see StageTrace.__init__).
        self.__dict__.update(state=state, trace=trace)


class _Timer:
    """The context manager of :func:`timed` (a plain class: a generator-based one costs a few µs per stage)."""

    __slots__ = ("box", "start")

    def __enter__(self) -> list[float]:
        self.box = [0.0]
        self.start = time.perf_counter()
        return self.box

    def __exit__(self, *exc_info: object) -> None:
        self.box[0] = (time.perf_counter() - self.start) * 1000.0


def timed() -> _Timer:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed time in milliseconds (also when the block
    raises)."""
    return _Timer()


@dataclass(frozen=True)
class Providers:
    """External services a recall may use; each may be ``None`` (the stage then skips with a reason).

    ``embedder`` follows ``memory_recall.providers.embedding.Embedder`` (``embed_query(text) -> (d,)``,
    ``model_id``, ``dim``); ``llm`` follows ``memory_recall.providers.llm.ChatLLM``; ``lexical_index`` is the
    BM25 channel: ``lexical_index(terms, limit) -> [(node_id, score)]`` higher-is-better (the store's FTS5).
    """

    embedder: Any = None
    llm: Any = None
    lexical_index: Any = None
    strict: bool = False


class TimedStage:
    """Base of stages whose ``run`` is "time :meth:`_run`, then wrap the fields it returns in a trace".

    Subclasses set ``name`` and implement ``_run(state) -> (new_state, trace_fields)``; ``trace_fields`` are the
    :class:`StageTrace` keyword arguments other than ``name`` and ``elapsed_ms`` (counts, score kind and
    direction, ``skipped``/``skip_reason``, notes).
    """

    name: str = ""

    def run(self, state: RecallState) -> StageResult:
        start = time.perf_counter()
        new_state, fields = self._run(state)
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        return StageResult(new_state, StageTrace(self.name, elapsed_ms, **fields))

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        raise NotImplementedError
