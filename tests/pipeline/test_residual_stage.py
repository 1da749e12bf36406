"""ResidualStage (reference §3.10 residual recall, recall-spec departures 9, 2, 3): basis selection, query
embedding and its failures (degrade / strict), novelty and norm thresholds, the residual search, every skip
reason, and the stage contract."""

from __future__ import annotations

import numpy as np
import pytest
from graph_helpers import graph, make_state, node, plan, result_fingerprint, state_fingerprint

from memory_recall.errors import EmbeddingUnavailable, StrictModeViolation
from memory_recall.pipeline.residual import ResidualStage
from memory_recall.pipeline.state import Providers
from memory_recall.settings import ResidualSettings

ON = ResidualSettings(enabled=True)
Q = np.array([0.3, 0.3, 0.9, 0.1])  # unit norm: 0.09 + 0.09 + 0.81 + 0.01 = 1


class FakeEmbedder:
    """Returns a fixed vector (or raises) and records the texts it was asked for."""

    model_id = "test:fake"

    def __init__(self, vector=None, error: EmbeddingUnavailable | None = None) -> None:
        self.vector = None if vector is None else np.asarray(vector, dtype=np.float32)
        self.error = error
        self.calls: list[str] = []

    @property
    def dim(self) -> int:
        return 4

    def embed_query(self, text: str) -> np.ndarray:
        self.calls.append(text)
        if self.error is not None:
            raise self.error
        assert self.vector is not None
        return self.vector


def _nodes():
    return [
        node("a", "character", name="Alice"),
        node("b", "character", name="Bob"),
        node("ev", "event", title="Duel"),
        node("c", "location", name="Cave"),
        node("d", "location", name="Dock"),
        node("z", "location", name="Zenith"),
        node("h", "location", name="Hidden"),
        node("nv", "location", name="No vector"),
    ]


EMB = {
    "a": [1, 0, 0, 0],
    "b": [0, 1, 0, 0],
    "ev": [0, 0, 1, 0],
    "c": [0, 0.2, 1, 0],
    "d": [0, 0, 0, 1],
    "z": [0, 0, -1, 0],
    "h": [0, 0, 1, 0],
}


def _state(embeddings=EMB, **kw):
    kw.setdefault("vector_hits", [("a", 0.8, 0.8), ("ev", 0.7, 0.7), ("b", 0.6, 0.6)])
    kw.setdefault("hidden", ["h"])
    return make_state(graph(_nodes()), "Alice and Bob", embeddings=embeddings, **kw)


def _run(state, vector=Q, settings=ON, strict=False, embedder=None):
    emb = embedder if embedder is not None else FakeEmbedder(vector)
    return ResidualStage(settings, Providers(embedder=emb, strict=strict)).run(state), emb


def _ids(state):
    return [(state.snapshot.ids[i], c) for i, c in state.residual_hits]


class TestResidualSearch:
    def test_hits_exact(self) -> None:
        """Basis a, b (the event vector hit is not co-occurrence-eligible); the sparse code of q over e0, e1
        is α = (0.2, 0.2) (soft threshold 0.1), residual r = (0.1, 0.1, 0.9, 0.1); hits = cosine(r, ·) > 0
        among visible non-basis nodes with vectors: c, ev, d (z negative, h hidden, nv no vector)."""
        out, emb = _run(_state())
        r = np.array([0.1, 0.1, 0.9, 0.1])
        r /= np.linalg.norm(r)
        c = np.array([0, 0.2, 1, 0]) / np.linalg.norm([0, 0.2, 1, 0])
        expected = [("c", float(c @ r)), ("ev", float(r[2])), ("d", float(r[3]))]
        got = _ids(out.state)
        assert [g[0] for g in got] == [e[0] for e in expected]
        assert [g[1] for g in got] == pytest.approx([e[1] for e in expected], abs=1e-6)
        assert out.state.meta["residualTriggered"] is True
        assert out.state.meta["residualHits"] == 3
        assert out.trace.notes["basisSize"] == 2
        assert out.trace.notes["novelty"] == pytest.approx(np.sqrt(0.82), abs=1e-6)
        assert out.trace.notes["residualNorm"] == pytest.approx(np.sqrt(0.84), abs=1e-6)
        assert emb.calls == ["Alice and Bob"]
        assert out.trace.score_kind == "residual_cosine" and out.trace.count_out == 3

    def test_top_k(self) -> None:
        out, _ = _run(_state(), settings=ResidualSettings(enabled=True, top_k=1))
        assert [g[0] for g in _ids(out.state)] == ["c"]

    def test_basis_anchors_first_and_capped(self) -> None:
        """Basis = exact anchors with vectors, then eligible vector hits; cut to ``basis_max_nodes``: with
        anchor d and cap 2 the basis is [d, a], so b becomes searchable and d is not."""
        out, _ = _run(_state(anchors=["d"]), settings=ResidualSettings(enabled=True, basis_max_nodes=2))
        got = [g[0] for g in _ids(out.state)]
        assert "d" not in got and "b" in got

    def test_query_vector_reused_from_vector_stage(self) -> None:
        """When a vector query has exactly the combined text, its vector is reused (no extra embedding call,
        reference §7 item 28)."""
        state = _state(query_plan=plan("Alice and Bob"), query_vectors=Q[None, :].astype(np.float32))
        out, emb = _run(state, vector=[0, 0, 0, 1])
        assert emb.calls == []
        assert out.trace.notes["queryReused"] is True
        assert [g[0] for g in _ids(out.state)] == ["c", "ev", "d"]

    def test_no_embedder_needed_when_reused(self) -> None:
        state = _state(query_plan=plan("Alice and Bob"), query_vectors=Q[None, :])
        out = ResidualStage(ON, Providers()).run(state)
        assert out.state.meta["residualHits"] == 3


class TestSkips:
    def test_disabled_leaves_state_unchanged(self) -> None:
        state = _state()
        out, emb = _run(state, settings=ResidualSettings())
        assert out.state is state
        assert out.trace.skip_reason == "residual-disabled" and emb.calls == []

    def test_basis_insufficient(self) -> None:
        out, emb = _run(_state(vector_hits=[("a", 0.8, 0.8), ("ev", 0.7, 0.7)]))
        assert out.trace.skip_reason == "residual-basis-insufficient"
        assert out.state.skip_reasons == ("residual-basis-insufficient",)
        assert out.state.meta["residualTriggered"] is False
        assert emb.calls == []

    def test_hidden_node_not_in_basis(self) -> None:
        out, _ = _run(_state(hidden=["b"]))
        assert out.trace.skip_reason == "residual-basis-insufficient"

    def test_no_embedder(self) -> None:
        out = ResidualStage(ON, Providers()).run(_state())
        assert out.trace.skip_reason == "residual-query-embedding-missing"
        assert out.trace.notes["failureCategory"] == "not_configured"

    def test_embedding_failure_degrades_with_category(self) -> None:
        failing = FakeEmbedder(error=EmbeddingUnavailable("timeout", "took too long"))
        out, _ = _run(_state(), embedder=failing)
        assert out.trace.skip_reason == "residual-query-embedding-missing"
        assert out.trace.notes["failureCategory"] == "timeout"
        assert out.state.skip_reasons == ("residual-query-embedding-missing",)

    def test_embedding_failure_strict_raises(self) -> None:
        failing = FakeEmbedder(error=EmbeddingUnavailable("http_status", "503"))
        with pytest.raises(StrictModeViolation) as info:
            _run(_state(), embedder=failing, strict=True)
        assert info.value.cause.category == "http_status"

    def test_wrong_dimension(self) -> None:
        out, _ = _run(_state(), vector=[1.0, 0.0, 0.0])
        assert out.trace.skip_reason == "residual-query-embedding-missing"
        assert out.trace.notes["failureCategory"] == "dimension_mismatch"
        with pytest.raises(StrictModeViolation):
            _run(_state(), vector=[1.0, 0.0, 0.0], strict=True)

    def test_empty_query_text(self) -> None:
        hits = [("a", 0.8, 0.8), ("b", 0.6, 0.6)]
        state = make_state(graph(_nodes()), "", embeddings=EMB, vector_hits=hits)
        out, emb = _run(state)
        assert out.trace.skip_reason == "residual-query-embedding-missing" and emb.calls == []

    def test_novelty_below_threshold(self) -> None:
        """Departure 9: novelty in [0, 1]; a query inside the cone of the basis has novelty 0."""
        out, _ = _run(_state(), vector=[0.6, 0.8, 0, 0])
        assert out.trace.skip_reason == "residual-novelty-below-threshold"
        assert out.trace.notes["novelty"] == pytest.approx(0.0, abs=1e-9)

    def test_norm_below_threshold(self) -> None:
        out, _ = _run(_state(), settings=ResidualSettings(enabled=True, residual_threshold=1.0))
        assert out.trace.skip_reason == "residual-norm-below-threshold"

    def test_no_hit(self) -> None:
        q = np.array([0.3, 0.3, 0.0, -0.9])
        # c would catch the small b-component of the residual; hidden here, every other cosine is ≤ 0.
        out, _ = _run(_state(hidden=["h", "c"]), vector=q / np.linalg.norm(q))
        assert out.trace.skip_reason == "residual-no-hit"
        assert out.state.meta["residualTriggered"] is False

    def test_search_space_empty_still_triggers(self) -> None:
        emb = {"a": EMB["a"], "b": EMB["b"]}
        out, _ = _run(_state(embeddings=emb))
        assert out.trace.skip_reason == "residual-search-space-empty"
        assert out.state.meta["residualTriggered"] is True
        assert out.state.residual_hits == ()


class TestContract:
    def test_empty_graph(self) -> None:
        out, _ = _run(make_state(graph([]), "q"))
        assert out.trace.skipped and out.trace.skip_reason == "residual-basis-insufficient"

    def test_input_not_mutated(self) -> None:
        state = _state(anchors=["d"])
        before = state_fingerprint(state)
        _run(state)
        assert state_fingerprint(state) == before

    def test_deterministic(self) -> None:
        state = _state()
        (a, _), (b, _) = _run(state), _run(state)
        assert result_fingerprint(a.state) == result_fingerprint(b.state)
