"""Builders shared by the diffusion, residual, cross-recall and co-occurrence stage tests (not a test module).

Graphs are built with the real models and :func:`snapshot_from_graph`; states are hand-built as the earlier
stages (context, visibility, query plan, vector prefilter, lexical, anchors) would leave them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from memory_recall.model.graph import INHIBIT_EDGE_TYPE, Edge, Node
from memory_recall.model.state import JournalEntry, MemoryGraph
from memory_recall.pipeline.state import (
    BlendPart,
    Candidates,
    QueryPlan,
    RecallQuery,
    RecallState,
)
from memory_recall.store.snapshot import GraphSnapshot, snapshot_from_graph

NOW = 1_700_000_000_000


def node(
    node_id: str,
    type_: str = "character",
    *,
    seq: int = 1,
    seq_range: tuple[int, int] | None | str = "default",
    importance: float = 5.0,
    archived: bool = False,
    prev_id: str | None = None,
    next_id: str | None = None,
    **fields: Any,
) -> Node:
    """A node; ``seq_range=None`` makes it inactive (no finite range), the default is ``(seq, seq)``."""
    kw: dict[str, Any] = {}
    if seq_range != "default":
        kw["seq_range"] = seq_range
    return Node(
        id=node_id,
        type=type_,
        fields=fields,
        seq=seq,
        importance=importance,
        archived=archived,
        prev_id=prev_id,
        next_id=next_id,
        created_time=NOW,
        **kw,
    )


_edge_ids = iter(range(10**9))


def edge(
    a: str,
    b: str,
    strength: float = 0.8,
    *,
    inhibit: bool = False,
    invalid_at: int | None = None,
    relation: str = "related",
    edge_id: str | None = None,
) -> Edge:
    return Edge(
        id=edge_id or f"e{next(_edge_ids)}",
        from_id=a,
        to_id=b,
        strength=strength,
        edge_type=INHIBIT_EDGE_TYPE if inhibit else 0,
        invalid_at=invalid_at,
        relation=relation,
    )


def graph(
    nodes: Iterable[Node], edges: Iterable[Edge] = (), journal: Iterable[tuple[int, int]] = ()
) -> MemoryGraph:
    return MemoryGraph(
        nodes=tuple(nodes),
        edges=tuple(edges),
        batch_journal=tuple(JournalEntry(processed_range=r) for r in journal),
    )


def snapshot(g: MemoryGraph, embeddings: dict[str, Sequence[float]] | None = None) -> GraphSnapshot:
    emb = {k: np.asarray(v, dtype=np.float32) for k, v in (embeddings or {}).items()}
    return snapshot_from_graph(g, now_ms=NOW, embeddings=emb)


def plan(text: str, weight: float = 1.0) -> QueryPlan:
    """A one-part query plan (blend inactive) for ``text``."""
    return QueryPlan(
        parts=(BlendPart("currentUser", "当前用户消息", text, weight),),
        active=False,
        combined_text=text,
        vector_queries=((text, weight),),
        lexical_sources=(text,),
    )


def make_state(
    g: MemoryGraph | GraphSnapshot,
    query: str = "",
    *,
    embeddings: dict[str, Sequence[float]] | None = None,
    vector_hits: Sequence[tuple[str, float, float]] = (),
    anchors: Sequence[str] = (),
    bm25: Sequence[tuple[str, float]] = (),
    hidden: Sequence[str] = (),
    residual_hits: Sequence[tuple[str, float]] = (),
    diffusion: Sequence[tuple[str, float]] = (),
    supplemental: Sequence[str] = (),
    candidates: Sequence[tuple[str, float, float]] | None = None,
    query_plan: QueryPlan | None = None,
    query_vectors: np.ndarray | None = None,
    active: Sequence[str] | None = None,
    meta: dict[str, Any] | None = None,
) -> RecallState:
    """A state as the stages before diffusion leave it. Ids are node ids; ``vector_hits`` are
    ``(id, weighted, raw)``, ``candidates`` ``(id, graph_score, vector_score)``."""
    snap = g if isinstance(g, GraphSnapshot) else snapshot(g, embeddings)

    def idx(ids: Iterable[str]) -> np.ndarray:
        return np.array([snap.index[i] for i in ids], dtype=np.int64)

    m = dict(meta or {})
    if hidden:
        mask = np.zeros(snap.n, dtype=bool)
        mask[idx(hidden)] = True
        m["visibility_hidden_mask"] = mask
    kw: dict[str, Any] = {}
    if active is not None:
        act = np.zeros(snap.n, dtype=bool)
        act[idx(active)] = True
        kw["active"] = act
    if candidates is not None:
        k = len(candidates)
        kw["candidates"] = Candidates(
            index=idx(c[0] for c in candidates),
            graph_score=np.array([c[1] for c in candidates], dtype=np.float64),
            vector_score=np.array([c[2] for c in candidates], dtype=np.float64),
            vector_raw=np.array([c[2] for c in candidates], dtype=np.float64),
            bm25_score=np.zeros(k),
            cooccurrence_boost=np.zeros(k),
        )
    return RecallState(
        snapshot=snap,
        query=RecallQuery(user_message=query, now_ms=NOW),
        plan=query_plan if query_plan is not None else (plan(query) if query else QueryPlan()),
        query_vectors=query_vectors,
        vector_hits=(
            idx(h[0] for h in vector_hits),
            np.array([h[1] for h in vector_hits], dtype=np.float64),
            np.array([h[2] for h in vector_hits], dtype=np.float64),
        ),
        bm25_hits=(idx(b[0] for b in bm25), np.array([b[1] for b in bm25], dtype=np.float64)),
        anchors=tuple((snap.index[a], a) for a in anchors),
        supplemental_anchors=tuple(snap.index[s] for s in supplemental),
        residual_hits=tuple((snap.index[i], c) for i, c in residual_hits),
        diffusion=(idx(d[0] for d in diffusion), np.array([d[1] for d in diffusion], dtype=np.float64)),
        meta=m,
        **kw,
    )


def ids(state_or_snapshot: RecallState | GraphSnapshot, index: Iterable[int]) -> list[str]:
    snap = state_or_snapshot.snapshot if isinstance(state_or_snapshot, RecallState) else state_or_snapshot
    return [snap.ids[int(i)] for i in index]


def scores(state: RecallState, index: np.ndarray, values: np.ndarray) -> dict[str, float]:
    """``{node id: value}`` of an (index, value) pair of arrays."""
    return {state.snapshot.ids[int(i)]: float(v) for i, v in zip(index, values, strict=True)}


def diffusion_of(state: RecallState) -> list[tuple[str, float]]:
    idx, energy = state.diffusion
    return [(state.snapshot.ids[int(i)], float(e)) for i, e in zip(idx, energy, strict=True)]


def candidate_table(state: RecallState) -> list[tuple[str, float, float, float, float, float]]:
    """Rows ``(id, graph, vector, vector_raw, bm25, cooccurrence_boost)`` in insertion order."""
    c = state.candidates
    return [
        (
            state.snapshot.ids[int(i)],
            float(c.graph_score[r]),
            float(c.vector_score[r]),
            float(c.vector_raw[r]),
            float(c.bm25_score[r]),
            float(c.cooccurrence_boost[r]),
        )
        for r, i in enumerate(c.index)
    ]


# -- contract checks ---------------------------------------------------------------------------------------


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, GraphSnapshot):
        return snapshot_fingerprint(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value).__name__, tuple((f.name, _freeze(getattr(value, f.name))) for f in fields))
    if isinstance(value, dict):
        return ("dict", tuple((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    return value


def snapshot_fingerprint(snap: GraphSnapshot) -> Any:
    """The snapshot arrays stages could be tempted to touch, as bytes."""
    parts = []
    for mat in (snap.adjacency, snap.inhibit, snap.incident):
        parts.append((mat.data.tobytes(), mat.indices.tobytes(), mat.indptr.tobytes()))
    for arr in (snap.temporal_pairs, snap.embeddings, snap.has_vector, snap.importance, snap.archived,
                snap.edge_src, snap.edge_dst, snap.edge_strength, snap.id_rank, snap.seq_end):
        parts.append(arr.tobytes())
    return tuple(parts)


def state_fingerprint(state: RecallState) -> Any:
    """Everything in ``state`` (arrays as bytes, the snapshot's arrays included), for before/after checks."""
    return _freeze(state)


def result_fingerprint(state: RecallState) -> Any:
    """Like :func:`state_fingerprint` but without timings (for determinism checks)."""
    return _freeze(dataclasses.replace(state, traces=()))


def assert_ranked(
    got: Sequence[tuple[str, float]], expected: Sequence[tuple[str, float]], tol: float = 1e-12
) -> None:
    """Same ids in the same order, values equal within ``tol``."""
    assert [g[0] for g in got] == [e[0] for e in expected]
    for (name, value), (_, want) in zip(got, expected, strict=True):
        assert abs(value - want) <= tol, f"{name}: {value} != {want}"
