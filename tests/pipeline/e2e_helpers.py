"""Builders and fakes for the rerank / owners / probabilistic / reinforcement / result / retrieve tests and the
stage contract suite (not a test module).

Imported as ``from e2e_helpers import ...`` (tests/pipeline is on ``sys.path`` under pytest's default "prepend"
import mode; there is no ``__init__.py``). The contract suite in tests/contract loads it by path.

* :class:`ScriptedLLM` — a :class:`~memory_recall.providers.llm.ChatLLM` that answers canned texts (or raises
  :class:`~memory_recall.errors.LLMUnavailable`) and records every call: a unit-test double of the rerank's
  provider (the HTTP client is tested in tests/providers).
* :class:`FakeEmbedder` — an embedder returning fixed query vectors (or raising
  :class:`~memory_recall.errors.EmbeddingUnavailable`), recording the query texts.
* Fixtures of reference §6: :func:`rules_graph` (RULES), plus small builders.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from memory_recall.errors import EmbeddingUnavailable, LLMUnavailable
from memory_recall.model.graph import Edge, MemoryScope, Node, StoryTime
from memory_recall.model.state import KnowledgeOwner, KnowledgeState, MemoryGraph, SummaryEntry, SummaryState
from memory_recall.pipeline.result import RecallResult
from memory_recall.pipeline.retrieve import retrieve, run_pipeline
from memory_recall.pipeline.state import ContextInfo, Providers, RecallQuery, RecallState, ScoredTable, StageTrace
from memory_recall.settings import RecallSettings
from memory_recall.store.snapshot import GraphSnapshot, snapshot_from_graph

NOW = 1_700_000_000_000
MODEL = "fake:test-4d"

__all__ = [
    "MODEL",
    "NOW",
    "OFF",
    "contract_graph",
    "contract_setup",
    "RULES_EMBEDDINGS",
    "RULES_QUERY",
    "FakeEmbedder",
    "FakeLexicalIndex",
    "ScriptedLLM",
    "deep_freeze",
    "edge",
    "graph",
    "ids_of",
    "make_settings",
    "node",
    "owner",
    "pov",
    "recall",
    "rules_graph",
    "rules_snapshot",
    "scored_state",
    "seed_where",
    "run_state",
    "snapshot",
    "summaries",
    "trace_key",
]


# --- fakes ------------------------------------------------------------------------------------------------------


class ScriptedLLM:
    """Answers each ``complete`` call with the next scripted item: a ``str`` (returned), a ``dict`` (returned as
    JSON text) or an :class:`LLMUnavailable` (raised). The last item repeats. ``calls`` records
    ``(messages, deadline_s)``."""

    def __init__(self, *answers: str | Mapping[str, Any] | LLMUnavailable) -> None:
        if not answers:
            raise ValueError("ScriptedLLM needs at least one answer")
        self.answers = list(answers)
        self.calls: list[tuple[list[dict[str, Any]], float]] = []

    def complete(self, messages: list[dict[str, Any]], *, deadline_s: float) -> str:
        self.calls.append((copy.deepcopy(messages), deadline_s))
        item = self.answers[min(len(self.calls) - 1, len(self.answers) - 1)]
        if isinstance(item, LLMUnavailable):
            raise item
        if isinstance(item, Mapping):
            return json.dumps(dict(item), ensure_ascii=False)
        return item

    @property
    def user_prompt(self) -> str:
        """The user message of the last call (where the candidate lines are)."""
        return self.calls[-1][0][-1]["content"]


class FakeEmbedder:
    """Query vectors by text (``vectors``), else ``default``; raises ``fail`` when given. Records the texts."""

    def __init__(
        self,
        default: Sequence[float] | None = None,
        vectors: Mapping[str, Sequence[float]] | None = None,
        *,
        fail: EmbeddingUnavailable | None = None,
        model_id: str = MODEL,
        dim: int = 4,
    ) -> None:
        self.default = None if default is None else np.asarray(default, dtype=np.float32)
        self.vectors = {k: np.asarray(v, dtype=np.float32) for k, v in (vectors or {}).items()}
        self.fail = fail
        self._model_id = model_id
        self._dim = dim
        self.queries: list[str] = []

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim

    def _vector(self, text: str) -> np.ndarray:
        v = self.vectors.get(text, self.default)
        if v is None:
            v = np.zeros(self._dim, dtype=np.float32)
            v[0] = 1.0
        norm = float(np.linalg.norm(v))
        return (v / norm if norm else v).astype(np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        self.queries.append(text)
        if self.fail is not None:
            raise self.fail
        return self._vector(text)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail is not None:
            raise self.fail
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, self._dim), np.float32)


# --- graph builders -------------------------------------------------------------------------------------------


def node(
    node_id: str,
    type_: str = "character",
    *,
    seq: int = 1,
    seq_range: tuple[int, int] | None | str = "default",
    importance: float = 5.0,
    created_time: int = NOW,
    scope: MemoryScope | None = None,
    story_time: StoryTime | None = None,
    archived: bool = False,
    **fields: Any,
) -> Node:
    """A node created at ``NOW`` (time decay 1, as the reference scenarios assume)."""
    kw: dict[str, Any] = {}
    if seq_range != "default":
        kw["seq_range"] = seq_range
    if scope is not None:
        kw["scope"] = scope
    if story_time is not None:
        kw["story_time"] = story_time
    return Node(id=node_id, type=type_, fields=fields, seq=seq, importance=importance, archived=archived,
                created_time=created_time, **kw)


def pov(owner_name: str, owner_type: str = "character", region: str = "") -> MemoryScope:
    return MemoryScope(layer="pov", owner_type=owner_type, owner_name=owner_name, region_primary=region)


_edge_counter = iter(range(10**9))


def edge(a: str, b: str, strength: float = 0.8, *, relation: str = "related", edge_type: int = 0) -> Edge:
    return Edge(id=f"e2e-{next(_edge_counter)}", from_id=a, to_id=b, strength=strength, relation=relation,
                edge_type=edge_type)


def owner(name: str, *, node_id: str = "", known: Sequence[str] = (), visibility: Mapping[str, float] | None = None,
          hidden: Sequence[str] = (), mistaken: Sequence[str] = (), updated_at: int = 0,
          aliases: Sequence[str] = ()) -> KnowledgeOwner:
    key = f"character:{name.lower()}" + (f"#{node_id}" if node_id else "")
    return KnowledgeOwner(owner_type="character", owner_key=key, owner_name=name, node_id=node_id,
                          known_node_ids=tuple(known), visibility_scores=dict(visibility or {}),
                          manual_hidden_node_ids=tuple(hidden), mistaken_node_ids=tuple(mistaken),
                          updated_at=updated_at, aliases=tuple(aliases))


def summaries(*texts: str) -> SummaryState:
    entries = tuple(SummaryEntry(id=f"s{k}", text=t, message_range=(k, k)) for k, t in enumerate(texts))
    return SummaryState(entries=entries, active_entry_ids=tuple(e.id for e in entries))


def graph(
    nodes: Iterable[Node],
    edges: Iterable[Edge] = (),
    *,
    owners: Iterable[KnowledgeOwner] = (),
    summary: SummaryState | None = None,
    **state: Any,
) -> MemoryGraph:
    kw: dict[str, Any] = dict(state)
    if summary is not None:
        kw["summaries"] = summary
    return MemoryGraph(
        nodes=tuple(nodes), edges=tuple(edges),
        knowledge=KnowledgeState(owners={o.owner_key: o for o in owners}), **kw,
    )


def snapshot(g: MemoryGraph, embeddings: Mapping[str, Sequence[float]] | None = None, *,
             version: int = 1, chat_id: str = "chat-e2e") -> GraphSnapshot:
    emb = {k: np.asarray(v, dtype=np.float32) for k, v in (embeddings or {}).items()}
    return snapshot_from_graph(g, now_ms=NOW, embeddings=emb, model_id=MODEL if emb else "", version=version,
                               chat_id=chat_id)


#: Node vectors of RULES (reference §6). The reference stubs the search to return rule-1 0.9, rule-2 0.8,
#: rule-3 0.7 for every query; these 4-d vectors give exactly those cosines against the query ``[1, 0, 0, 0]``
#: and keep the reference's geometry for DPP (rule-2 almost parallel to rule-1, rule-3 far from both).
RULES_EMBEDDINGS: dict[str, tuple[float, ...]] = {
    "rule-1": (0.9, float(np.sqrt(1 - 0.81)), 0.0, 0.0),
    "rule-2": (0.8, 0.6, 0.0, 0.0),
    "rule-3": (0.7, -0.7, float(np.sqrt(0.02)), 0.0),
}
RULES_QUERY = (1.0, 0.0, 0.0, 0.0)


def rules_graph() -> MemoryGraph:
    """RULES (reference §6): three rules with importance 9/7/3, created at ms 1/2/3, seq 1/2/3."""
    return graph([
        node("rule-1", "rule", seq=1, importance=9, created_time=1, title="规则一"),
        node("rule-2", "rule", seq=2, importance=7, created_time=2, title="规则二"),
        node("rule-3", "rule", seq=3, importance=3, created_time=3, title="规则三"),
    ])


def rules_snapshot(with_vectors: bool = True) -> GraphSnapshot:
    return snapshot(rules_graph(), RULES_EMBEDDINGS if with_vectors else None)


# --- settings -----------------------------------------------------------------------------------------------------

#: Reference ``OFF``: no vector prefilter, no graph diffusion, no LLM recall.
OFF: dict[str, dict[str, Any]] = {
    "vector": {"enabled": False},
    "diffusion": {"enabled": False},
    "rerank": {"enabled": False},
}


def make_settings(*overrides: Mapping[str, Mapping[str, Any]], **sections: Mapping[str, Any]) -> RecallSettings:
    """The reference's ``retrieve()`` fallbacks (maxRecallNodes 8, visibility off, cross recall off) with
    section overrides: ``make_settings(OFF, selection={"top_k": 2})``. Built without the environment."""
    merged: dict[str, dict[str, Any]] = {
        "selection": {"max_recall_nodes": 8},
        "visibility": {"enabled": False},
        "cross_recall": {"enabled": False},
    }
    for extra in (*overrides, sections):
        for section, values in extra.items():
            merged.setdefault(section, {}).update(values)
    return RecallSettings().with_overrides(merged)


# --- running --------------------------------------------------------------------------------------------------


def _query(message: str, recent: Sequence[str], **kw: Any) -> RecallQuery:
    kw.setdefault("now_ms", NOW)
    return RecallQuery(user_message=message, recent_lines=tuple(recent), **kw)


def run_state(
    snap: GraphSnapshot,
    message: str,
    settings: RecallSettings,
    *,
    recent: Sequence[str] = (),
    llm: Any = None,
    embedder: Any = None,
    strict: bool = False,
    stop_before: str | None = None,
    ablate: Iterable[str] = (),
    **query_kw: Any,
) -> RecallState:
    """The pipeline's final state (or its state before ``stop_before``)."""
    providers = Providers(embedder=embedder, llm=llm, strict=strict)
    return run_pipeline(snap, _query(message, recent, **query_kw), settings, providers, ablate=ablate,
                        stop_before=stop_before).state


def recall(
    snap: GraphSnapshot,
    message: str,
    settings: RecallSettings,
    *,
    recent: Sequence[str] = (),
    llm: Any = None,
    embedder: Any = None,
    strict: bool = False,
    ablate: Iterable[str] = (),
    **query_kw: Any,
) -> RecallResult:
    """:func:`~memory_recall.pipeline.retrieve.retrieve` with a query built from ``message`` and ``recent``."""
    providers = Providers(embedder=embedder, llm=llm, strict=strict)
    return retrieve(snap, _query(message, recent, **query_kw), settings, providers, ablate=ablate)


def seed_where(pattern: Sequence[bool], p: float = 0.5) -> int:
    """The smallest seed whose first ``len(pattern)`` uniform draws hit (``< p``) / miss as in ``pattern``."""
    for seed in range(100_000):
        draws = np.random.default_rng(seed).random(len(pattern))
        if [bool(d < p) for d in draws] == list(pattern):
            return seed
    raise AssertionError(f"no seed below 100000 draws {pattern}")


# --- comparison helpers ---------------------------------------------------------------------------------------


def deep_freeze(value: Any) -> Any:
    """A hashable, comparable deep copy (arrays as bytes) for before/after and run-to-run comparisons."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, GraphSnapshot):
        parts = []
        for mat in (value.adjacency, value.inhibit, value.incident):
            parts.append((mat.data.tobytes(), mat.indices.tobytes(), mat.indptr.tobytes()))
        for arr in (value.embeddings, value.has_vector, value.importance, value.archived, value.id_rank,
                    value.seq, value.seq_end, value.type_code, value.edge_src, value.edge_dst):
            parts.append(arr.tobytes())
        return ("snapshot", value.chat_id, value.version, tuple(parts))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        is_trace = isinstance(value, StageTrace)
        return (type(value).__name__, tuple(
            (f.name, 0.0 if is_trace and f.name == "elapsed_ms" else deep_freeze(getattr(value, f.name)))
            for f in dataclasses.fields(value)
        ))
    if isinstance(value, Mapping):
        return ("dict", tuple((k, deep_freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(deep_freeze(v) for v in value))
    if isinstance(value, float) and value != value:
        return ("nan",)
    return value


def trace_key(trace: StageTrace) -> Any:
    """A trace without its elapsed time."""
    return deep_freeze(dataclasses.replace(trace, elapsed_ms=0.0))


# --- hand-built states for the unit tests of the late stages ----------------------------------------------------


def scored_state(
    snap: GraphSnapshot,
    rows: Sequence[tuple[Any, ...]],
    *,
    pool: Sequence[str] | None = None,
    selection: Sequence[str] | None = None,
    context: ContextInfo | None = None,
    llm: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    message: str = "hello",
    recent: Sequence[str] = (),
    seed: int = 0,
    probabilistic: Sequence[str] = (),
) -> RecallState:
    """A state as scoring/diversity leave it. ``rows`` are ``(id, weighted_score[, scope_bucket[, temporal_bucket[,
    knowledge_mode[, visibility]]]])`` in ranking order; the whole score is put in the importance part, so each
    row's parts add up to its weighted score. ``pool`` defaults to every row, ``selection`` to empty."""
    full = [tuple(r) + ("objectiveGlobal", "undated", "no-owner-state", 0.0)[len(r) - 2:] for r in rows]
    idx = np.array([snap.index[r[0]] for r in full], dtype=np.int64)
    w = np.array([float(r[1]) for r in full], dtype=np.float64)
    m = idx.size
    table = ScoredTable(
        index=idx,
        final_score=w.copy(),
        weighted_score=w.copy(),
        graph_score=np.zeros(m),
        vector_score=np.zeros(m),
        lexical_score=np.zeros(m),
        parts=np.stack([np.zeros(m), np.zeros(m), np.zeros(m), w], axis=1) if m else np.zeros((0, 4)),
        decay=np.ones(m),
        scope_bucket=tuple(str(r[2]) for r in full),
        scope_weight=np.ones(m),
        knowledge_mode=tuple(str(r[4]) for r in full),
        knowledge_weight=np.ones(m),
        knowledge_visibility=np.array([float(r[5]) for r in full], dtype=np.float64),
        owner_coverage=np.ones(m),
        owner_coverage_weight=np.ones(m),
        temporal_bucket=tuple(str(r[3]) for r in full),
        temporal_weight=np.ones(m),
    )
    pool_ids = [r[0] for r in full] if pool is None else list(pool)
    active = ~snap.archived & snap.finite_range
    return RecallState(
        snapshot=snap,
        query=RecallQuery(user_message=message, recent_lines=tuple(recent), now_ms=NOW, seed=seed),
        context=context or ContextInfo(),
        active=active,
        scored=table,
        pool=tuple(snap.index[i] for i in pool_ids),
        selection=tuple(snap.index[i] for i in (selection or ())),
        probabilistic=tuple(snap.index[i] for i in probabilistic),
        llm=dict(llm or {}),
        meta=dict(meta or {}),
    )


def ids_of(state: RecallState, index: Iterable[int]) -> list[str]:
    return [state.snapshot.ids[int(i)] for i in index]


class FakeLexicalIndex:
    """A BM25 stand-in over a graph: ``(terms, limit) -> [(node_id, score)]``, score = number of the query terms
    among the node's index terms (same tokenizer as the store), best first, ties by node id."""

    def __init__(self, g: MemoryGraph) -> None:
        from memory_recall.model.graph import embedding_text
        from memory_recall.text.tokenize import index_terms

        self.terms = {n.id: frozenset(index_terms(embedding_text(n))) for n in g.nodes if not n.archived}
        self.calls: list[tuple[tuple[str, ...], int]] = []

    def __call__(self, terms: Sequence[str], limit: int) -> list[tuple[str, float]]:
        self.calls.append((tuple(terms), limit))
        wanted = set(terms)
        hits = [(nid, float(len(ts & wanted))) for nid, ts in self.terms.items() if ts & wanted]
        return sorted(hits, key=lambda h: (-h[1], h[0]))[:limit]


def contract_graph() -> MemoryGraph:
    """A small graph that gives every stage something to do: owners and POVs, regions, story time, a future
    event, an inhibit edge, a hidden node, a batch journal, summaries and vectors for all nodes."""
    from memory_recall.model.state import JournalEntry, RegionAdjacency, RegionState, StorySegment, TimelineState

    tower = MemoryScope(region_primary="Tower")
    nodes = [
        node("erin", "character", seq=1, importance=7, name="Erin", state="wary", scope=tower),
        node("bob", "character", seq=2, importance=6, name="Bob", traits=["loud"]),
        node("tower", "location", seq=1, importance=5, name="Tower", scope=tower),
        node("ev1", "event", seq=1, importance=8, title="Erin meets Bob at the Tower",
             participants=["Erin", "Bob"], summary="They argue about the key", scope=tower,
             story_time=StoryTime(segment_id="s2", label="night")),
        node("ev2", "event", seq=3, importance=6, title="The key goes missing", summary="Bob hides the key"),
        node("ev3", "event", seq=4, importance=9, title="Erin will leave", summary="A plan to leave",
             story_time=StoryTime(label="tomorrow", tense="future")),
        node("pov-erin", "pov_memory", seq=3, importance=6, scope=pov("Erin"), summary="Erin suspects Bob",
             belief="Bob has the key"),
        node("pov-bob", "pov_memory", seq=3, importance=6, scope=pov("Bob"), summary="Bob fears Erin"),
        node("r1", "rule", seq=1, importance=8, title="No magic in the Tower", constraint="none"),
        node("syn", "synopsis", seq=2, summary="A story about a key"),
        node("th", "thread", seq=2, title="Find the key", status="open"),
        node("ref", "reflection", seq=3, insight="Bob lies when scared"),
        node("vault", "location", seq=2, importance=9, name="Vault", visibility="Bob"),
        node("old", "character", seq=0, importance=2, name="Old man", archived=True),
    ]
    edges = [
        edge("ev1", "erin", 0.9), edge("ev1", "bob", 0.9), edge("ev1", "tower", 0.8), edge("pov-erin", "ev1", 0.7),
        edge("ev2", "bob", 0.8), edge("ev2", "th", 0.6), edge("ev3", "erin", 0.5), edge("vault", "bob", 0.9),
        edge("ref", "ev2", 0.75, relation="evolves"), edge("r1", "ev3", 0.4, relation="contradicts", edge_type=255),
    ]
    rng = np.random.default_rng(7)
    g = graph(
        nodes,
        edges,
        owners=[owner("Erin", node_id="erin", known=["ev1", "pov-erin"], visibility={"tower": 0.9, "ev2": 0.6},
                      updated_at=5),
                owner("Bob", node_id="bob", known=["ev2", "pov-bob"], updated_at=3)],
        summary=summaries("Erin and Bob search for a key"),
        timeline=TimelineState(segments=(StorySegment(id="s1", order=1, label="day"),
                                         StorySegment(id="s2", order=2, label="night"))),
        regions=RegionState(adjacency_map={"Tower": RegionAdjacency(adjacent=("Market",))}),
        batch_journal=(JournalEntry(processed_range=(1, 3)),),
    )
    global CONTRACT_EMBEDDINGS
    CONTRACT_EMBEDDINGS = {n.id: tuple(float(x) for x in rng.normal(size=4)) for n in nodes}
    return g


CONTRACT_EMBEDDINGS: dict[str, tuple[float, ...]] = {}


def contract_setup(mode: str = "llm") -> tuple[GraphSnapshot, RecallQuery, RecallSettings, Providers]:
    """The contract suite's recall: every optional stage on, one ``mode`` of the providers:
    ``vector`` (embedder + BM25, no LLM), ``lexical_fallback`` (the embedder raises), ``llm`` (scripted LLM with
    a valid answer), ``llm_garbage`` (the LLM answers prose), ``empty`` (empty graph, empty message)."""
    if mode == "empty":
        g = graph([])
        snap = snapshot(g)
    else:
        g = contract_graph()
        snap = snapshot(g, CONTRACT_EMBEDDINGS)
    settings = make_settings(
        selection={"max_recall_nodes": 6, "llm_candidate_pool": 8, "top_k": 6},
        visibility={"enabled": True},
        cross_recall={"enabled": True},
        cooccurrence={"enabled": True},
        residual={"enabled": True, "nmf_novelty_threshold": 0.0, "residual_threshold": 0.0},
        probabilistic={"enabled": True, "chance": 0.5, "min_importance": 5.0},
    )
    embedder: Any = FakeEmbedder(CONTRACT_EMBEDDINGS.get("ev1", RULES_QUERY))
    llm: Any = ScriptedLLM({"selected_keys": ["R2", "R1", "R3"], "active_owner_keys": ["Erin"]})
    if mode == "vector":
        llm = None
    elif mode == "lexical_fallback":
        embedder = FakeEmbedder(fail=EmbeddingUnavailable("timeout", "deadline passed"))
        llm = None
    elif mode == "llm_garbage":
        llm = ScriptedLLM("I would pick the first two, they look relevant.")
    message = "" if mode == "empty" else "Where is Erin? Does Bob have the key"
    query = RecallQuery(
        user_message=message,
        recent_lines=() if mode == "empty" else ("[assistant]: Erin looks at the Tower.", "[user]: " + message),
        now_ms=NOW,
        seed=seed_where([True, True, True]),
        chat_id="chat-e2e",
        user_floor=5,
        visibility_filter="Erin",
        host_character_name="Erin",
    )
    return snap, query, settings, Providers(embedder=embedder, llm=llm, lexical_index=FakeLexicalIndex(g))
