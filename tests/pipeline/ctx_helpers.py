"""Builders shared by the tests of the context, visibility, query-plan, vector, lexical and anchor stages.

Not a test module (no ``test_`` prefix); imported as ``from ctx_helpers import ...`` (tests/pipeline is on
``sys.path`` under pytest's default "prepend" import mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memory_recall.errors import EmbeddingFailure, EmbeddingUnavailable
from memory_recall.model.graph import Edge, MemoryScope, Node
from memory_recall.model.state import MemoryGraph
from memory_recall.pipeline.state import RecallQuery, RecallState, StageResult
from memory_recall.store.snapshot import GraphSnapshot, snapshot_from_graph

NOW = 1_700_000_000_000
MODEL = "test:fixed-3d"


def node(node_id: str, type_: str = "character", seq: int = 1, **kw: Any) -> Node:
    """A node; keyword arguments that are Node fields go to the node, the rest into ``fields``."""
    node_keys = set(Node.model_fields)
    fields = {k: v for k, v in kw.items() if k not in node_keys}
    extra = {k: v for k, v in kw.items() if k in node_keys}
    extra.setdefault("created_time", NOW)
    return Node(id=node_id, type=type_, seq=seq, fields=fields, **extra)


def pov(node_id: str, owner: str, owner_type: str = "character", seq: int = 1, **fields: Any) -> Node:
    scope = MemoryScope(layer="pov", owner_type=owner_type, owner_name=owner)
    return node(node_id, "pov_memory", seq, scope=scope, **fields)


def edge(a: str, b: str, strength: float = 0.8, **kw: Any) -> Edge:
    return Edge(id=f"e-{a}-{b}", from_id=a, to_id=b, strength=strength, **kw)


def snapshot(
    nodes: Sequence[Node] = (),
    edges: Sequence[Edge] = (),
    *,
    embeddings: dict[str, Sequence[float]] | None = None,
    model_id: str = "",
    **graph_kw: Any,
) -> GraphSnapshot:
    graph = MemoryGraph(nodes=tuple(nodes), edges=tuple(edges), **graph_kw)
    vectors = {k: np.asarray(v, dtype=np.float32) for k, v in (embeddings or {}).items()}
    return snapshot_from_graph(graph, now_ms=NOW, embeddings=vectors, model_id=model_id)


def make_state(
    snap: GraphSnapshot, user_message: str = "", recent: Sequence[str] = (), **kw: Any
) -> RecallState:
    """A state over ``snap``: ``RecallQuery`` fields from ``kw`` go to the query, the rest to the state."""
    query_keys = {f.name for f in dataclasses.fields(RecallQuery)}
    query = RecallQuery(
        user_message=user_message,
        recent_lines=tuple(recent),
        now_ms=NOW,
        **{k: v for k, v in kw.items() if k in query_keys},
    )
    return RecallState(snapshot=snap, query=query, **{k: v for k, v in kw.items() if k not in query_keys})


def run_all(state: RecallState, *stages: Any) -> tuple[RecallState, list[StageResult]]:
    """Run stages in order; the final state and every result."""
    results = []
    for stage in stages:
        result = stage.run(state)
        results.append(result)
        state = result.state
    return state, results


# -- RULES fixture (reference §6 conventions) ----------------------------------------------------------------


def rules_snapshot(model_id: str = MODEL) -> GraphSnapshot:
    """Fixture RULES: three rule nodes with 3-d embeddings (reference §6)."""
    rows = [
        ("rule-1", 9, 1, "规则一", 1, [1.0, 0.0, 0.0]),
        ("rule-2", 7, 2, "规则二", 2, [0.9, 0.1, 0.0]),
        ("rule-3", 3, 3, "规则三", 3, [0.0, 0.0, 1.0]),
    ]
    nodes = [
        node(i, "rule", seq, importance=imp, created_time=created, title=title, seq_range=(seq, seq))
        for i, imp, created, title, seq, _ in rows
    ]
    return snapshot(nodes, embeddings={i: v for i, *_, v in rows}, model_id=model_id)


# -- fake providers for unit tests ------------------------------------------------------------------------


class CountingEmbedder:
    """Embedder test double: records the query texts; returns ``vectors[text]`` or ``default``."""

    def __init__(
        self,
        default: Sequence[float] = (1.0, 1.0, 1.0),
        vectors: dict[str, Sequence[float]] | None = None,
        model_id: str = MODEL,
        fail_on: dict[str, EmbeddingFailure] | None = None,
    ) -> None:
        self.default = np.asarray(default, dtype=np.float32)
        self.vectors = {k: np.asarray(v, dtype=np.float32) for k, v in (vectors or {}).items()}
        self._model_id = model_id
        self.fail_on = dict(fail_on or {})
        self.calls: list[str] = []

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return int(self.default.shape[0])

    def embed_query(self, text: str) -> np.ndarray:
        self.calls.append(text)
        if text in self.fail_on or "*" in self.fail_on:
            raise EmbeddingUnavailable(self.fail_on.get(text) or self.fail_on["*"], "test failure")
        vec = self.vectors.get(text, self.default)
        return vec / np.linalg.norm(vec)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return (
            np.stack([self.embed_query(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
        )


# -- "input not mutated" checks ---------------------------------------------------------------------------


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return ("dict", tuple((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple((f.name, _freeze(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    return value


_SNAPSHOT_ARRAYS = ("archived", "seq_end", "embeddings", "has_vector", "importance", "id_rank")


def fingerprint(state: RecallState) -> Any:
    """A hashable deep image of every state field and the snapshot's arrays/indexes a stage could touch."""
    snap = state.snapshot
    fields = tuple(
        (f.name, _freeze(getattr(state, f.name))) for f in dataclasses.fields(state) if f.name != "snapshot"
    )
    snap_image = (
        tuple(_freeze(getattr(snap, name)) for name in _SNAPSHOT_ARRAYS),
        _freeze(dict(snap.anchor_index)),
        _freeze(dict(snap.visibility)),
        snap.anchor_lengths,
        snap.ids,
    )
    return fields, snap_image


def assert_not_mutated(state: RecallState, run: Callable[[RecallState], Any]) -> None:
    before = fingerprint(state)
    run(state)
    assert fingerprint(state) == before


def result_image(result: StageResult) -> Any:
    """Everything of a stage result except timings (for determinism checks)."""
    trace = dataclasses.replace(result.trace, elapsed_ms=0.0)
    return fingerprint(result.state), _freeze(trace)
