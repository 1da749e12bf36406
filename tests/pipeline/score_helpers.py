"""Builders shared by the scoring, dedup and diversity stage tests (not a test module).

Imported as ``from score_helpers import ...`` (tests/pipeline is on ``sys.path`` under pytest's default
"prepend" import mode; there is no ``__init__.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from memory_recall.model.graph import Edge, MemoryScope, Node, StoryTime, StoryTimeSpan
from memory_recall.model.state import (
    KnowledgeOwner,
    KnowledgeState,
    MemoryGraph,
    StorySegment,
    TimelineState,
)
from memory_recall.pipeline.state import (
    Candidates,
    ContextInfo,
    QueryPlan,
    RecallQuery,
    RecallState,
    ScoredTable,
    StageResult,
)
from memory_recall.settings import RecallSettings
from memory_recall.store.snapshot import GraphSnapshot, snapshot_from_graph
from memory_recall.text.intent import lexical_query_sources

NOW = 1_700_000_000_000
DAY_MS = 86_400_000

__all__ = [
    "DAY_MS",
    "NOW",
    "assert_same",
    "candidates_for",
    "freeze",
    "ids_of",
    "make_graph",
    "make_node",
    "make_snapshot",
    "make_state",
    "owner",
    "pov_scope",
    "region_scope",
    "rules_fixture",
    "run_scoring",
    "settings",
    "story",
]


def make_node(
    node_id: str,
    type_: str = "character",
    *,
    seq: int = 1,
    seq_range: tuple[int, int] | None = None,
    importance: float = 5.0,
    created_time: int = NOW,
    scope: MemoryScope | None = None,
    story_time: StoryTime | None = None,
    story_time_span: StoryTimeSpan | None = None,
    archived: bool = False,
    **fields: Any,
) -> Node:
    """A node created at ``NOW`` (time decay 1, as the reference scenarios assume) with the given fields."""
    kw: dict[str, Any] = {}
    if seq_range is not None:
        kw["seq_range"] = seq_range
    return Node(
        id=node_id,
        type=type_,
        fields=fields,
        seq=seq,
        importance=importance,
        created_time=created_time,
        scope=scope or MemoryScope(),
        story_time=story_time or StoryTime(),
        story_time_span=story_time_span or StoryTimeSpan(),
        archived=archived,
        **kw,
    )


def pov_scope(owner_name: str, owner_type: str = "character", owner_id: str = "") -> MemoryScope:
    return MemoryScope(layer="pov", owner_type=owner_type, owner_name=owner_name, owner_id=owner_id)


def region_scope(primary: str = "", secondary: str = "") -> MemoryScope:
    return MemoryScope(region_primary=primary, region_secondary=secondary)


def story(segment_id: str = "", label: str = "", tense: str = "unknown") -> StoryTime:
    return StoryTime(segment_id=segment_id, label=label or segment_id, tense=tense)


def owner(
    name: str,
    *,
    node_id: str = "",
    known: Sequence[str] = (),
    visibility: Mapping[str, float] | None = None,
    mistaken: Sequence[str] = (),
    manual_known: Sequence[str] = (),
    hidden: Sequence[str] = (),
    owner_type: str = "character",
) -> KnowledgeOwner:
    """A knowledge owner entry keyed ``<type>:<lower name>``."""
    return KnowledgeOwner(
        owner_type=owner_type,
        owner_key=f"{owner_type}:{name.lower()}",
        owner_name=name,
        node_id=node_id,
        known_node_ids=tuple(known),
        visibility_scores=dict(visibility or {}),
        mistaken_node_ids=tuple(mistaken),
        manual_known_node_ids=tuple(manual_known),
        manual_hidden_node_ids=tuple(hidden),
    )


def make_graph(
    nodes: Iterable[Node],
    edges: Iterable[Edge] = (),
    *,
    owners: Iterable[KnowledgeOwner] = (),
    segments: Iterable[tuple[str, int]] = (),
) -> MemoryGraph:
    return MemoryGraph(
        nodes=tuple(nodes),
        edges=tuple(edges),
        knowledge=KnowledgeState(owners={o.owner_key: o for o in owners}),
        timeline=TimelineState(segments=tuple(StorySegment(id=s, label=s, order=o) for s, o in segments)),
    )


def make_snapshot(graph: MemoryGraph, embeddings: dict[str, Any] | None = None) -> GraphSnapshot:
    return snapshot_from_graph(
        graph,
        now_ms=NOW,
        embeddings={k: np.asarray(v, dtype=np.float32) for k, v in (embeddings or {}).items()},
    )


def candidates_for(
    snap: GraphSnapshot,
    ids: Sequence[str] | None = None,
    *,
    graph: Mapping[str, float] | None = None,
    vector: Mapping[str, float] | None = None,
    raw: Mapping[str, float] | None = None,
    bm25: Mapping[str, float] | None = None,
    boost: Mapping[str, float] | None = None,
) -> Candidates:
    """A score map over ``ids`` (default: every node in graph order — the reference's empty-map fallback)."""
    ids = list(ids) if ids is not None else list(snap.ids)

    def col(values: Mapping[str, float] | None) -> np.ndarray:
        values = values or {}
        return np.array([float(values.get(i, 0.0)) for i in ids], dtype=np.float64)

    return Candidates(
        index=np.array([snap.index[i] for i in ids], dtype=np.int64),
        graph_score=col(graph),
        vector_score=col(vector),
        vector_raw=col(raw if raw is not None else vector),
        bm25_score=col(bm25),
        cooccurrence_boost=col(boost),
    )


def make_state(
    snap: GraphSnapshot,
    message: str = "hello",
    *,
    candidates: Candidates | None = None,
    context: ContextInfo | None = None,
    scored: ScoredTable | None = None,
    meta: dict[str, Any] | None = None,
    multi_intent: bool = True,
    **query: Any,
) -> RecallState:
    """A state as the stages before scoring leave it: query, lexical sources, context, score map."""
    q = RecallQuery(user_message=message, now_ms=NOW, **query)
    plan = QueryPlan(lexical_sources=tuple(lexical_query_sources(message, multi_intent)))
    return RecallState(
        snapshot=snap,
        query=q,
        context=context or ContextInfo(),
        active=~snap.archived & snap.finite_range,
        plan=plan,
        candidates=candidates if candidates is not None else candidates_for(snap),
        scored=scored if scored is not None else ScoredTable(),
        meta=dict(meta or {}),
    )


def settings(**sections: dict[str, Any]) -> RecallSettings:
    """App-profile settings with ``{"section": {"key": value}}`` overrides (no environment involved)."""
    return RecallSettings().with_overrides(sections)


def run_scoring(state: RecallState, cfg: RecallSettings | None = None) -> StageResult:
    from memory_recall.pipeline.scoring import ScoringStage

    cfg = cfg or settings()
    return ScoringStage(cfg.scoring, cfg.lexical, cfg.context).run(state)


def ids_of(snap: GraphSnapshot, index: Iterable[int]) -> list[str]:
    return [snap.ids[int(i)] for i in index]


def freeze(state: RecallState) -> dict[str, Any]:
    """A deep copy of everything a stage could mutate, for before/after comparisons."""
    snap = state.snapshot
    return {
        "candidates": copy.deepcopy(state.candidates),
        "scored": copy.deepcopy(state.scored),
        "meta": copy.deepcopy(state.meta),
        "pool": state.pool,
        "skip_reasons": state.skip_reasons,
        "active": state.active.copy(),
        "snap_arrays": {
            "importance": snap.importance.copy(),
            "embeddings": snap.embeddings.copy(),
            "known": snap.knowledge.known.copy(),
            "visibility": snap.knowledge.visibility.copy(),
        },
    }


def assert_same(a: Any, b: Any) -> None:
    """Recursive equality that understands numpy arrays and dataclasses."""
    import dataclasses

    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b)
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def rules_fixture() -> tuple[MemoryGraph, dict[str, list[float]]]:
    """Reference §6 fixture RULES: three rule nodes with importance 9/7/3, createdTime 1/2/3, embeddings."""
    nodes = [
        make_node("rule-1", "rule", seq=1, importance=9, created_time=1, title="规则一"),
        make_node("rule-2", "rule", seq=2, importance=7, created_time=2, title="规则二"),
        make_node("rule-3", "rule", seq=3, importance=3, created_time=3, title="规则三"),
    ]
    emb = {"rule-1": [1.0, 0.0, 0.0], "rule-2": [0.9, 0.1, 0.0], "rule-3": [0.0, 0.0, 1.0]}
    return make_graph(nodes), emb
