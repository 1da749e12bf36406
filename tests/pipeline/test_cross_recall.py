"""CrossRecallStage (reference §3.10): supplemental anchors, cross-recall re-diffusion (event seeds, residual
seeds), the score map (order, values, visibility/activity filter), the empty-map fallback (scenarios 25, 32,
33, 34 and the bounded large-graph variant), scenarios 33 and 38 end to end through diffusion → cross recall,
and the stage contract."""

from __future__ import annotations

import numpy as np
import pytest
from graph_helpers import (
    assert_ranked,
    candidate_table,
    diffusion_of,
    edge,
    graph,
    make_state,
    node,
    result_fingerprint,
    snapshot,
    state_fingerprint,
)

from memory_recall.pipeline._graph_cache import cooccurrence_eligible
from memory_recall.pipeline.cooccurrence import CooccurrenceStage
from memory_recall.pipeline.cross_recall import CrossRecallStage
from memory_recall.pipeline.diffusion import DiffusionStage
from memory_recall.pipeline.kernels.diffusion import (
    _reference_build_adjacency,
    _reference_propagate,
    _reference_rank,
)
from memory_recall.pipeline.residual import ResidualStage
from memory_recall.pipeline.state import Providers
from memory_recall.settings import (
    AnchorSettings,
    CooccurrenceSettings,
    CrossRecallSettings,
    DiffusionSettings,
    ResidualSettings,
    SelectionSettings,
)

DIFF = DiffusionSettings(enable_temporal_links=False)


def _stage(settings: CrossRecallSettings | None = None, diffusion: DiffusionSettings = DIFF, **kw):
    return CrossRecallStage(settings or CrossRecallSettings(), diffusion, AnchorSettings(), **kw)


def ids_of_candidates(state) -> list[str]:
    return [row[0] for row in candidate_table(state)]


class TestSupplementalAnchors:
    def _graph(self):
        nodes = [
            node("ev", "event", title="Battle"),  # events are never eligible
            node("a", "character", name="Alice"),
            node("l", "location"),  # no anchor term
            node("b", "character", name="Bob"),  # exact anchor
            node("h", "character", name="Hidden"),  # hidden
            node("r", "reflection", insight="x", title="Thought"),
            node("c1", "character", name="C one"),
            node("c2", "location", name="C two"),
            node("c3", "thread", title="C three"),
            node("c4", "rule", title="C four"),
            node("c5", "character", name="C five"),
        ]
        return graph(nodes)

    def test_up_to_five_eligible_in_vector_order(self) -> None:
        order = ["ev", "a", "l", "b", "h", "r", "c1", "c2", "c3", "c4", "c5"]
        hits = [(i, 0.9 - 0.01 * k, 0.9) for k, i in enumerate(order)]
        state = make_state(self._graph(), "Bob", vector_hits=hits, anchors=["b"], hidden=["h"])
        out = _stage().run(state).state
        assert [state.snapshot.ids[i] for i in out.supplemental_anchors] == ["a", "c1", "c2", "c3", "c4"]

    def test_limit_from_settings(self) -> None:
        hits = [("a", 0.9, 0.9), ("c1", 0.8, 0.8), ("c2", 0.7, 0.7)]
        stage = _stage(CrossRecallSettings(supplemental_anchors=1))
        out = stage.run(make_state(self._graph(), "q", vector_hits=hits))
        assert [out.state.snapshot.ids[i] for i in out.state.supplemental_anchors] == ["a"]


class TestReDiffusion:
    def _graph(self):
        nodes = [
            node("alice", "character", name="Alice"),
            node("ev", "event", title="The duel"),
            node("old", "event", title="Old news", archived=True),
            node("sec", "event", title="Secret meeting"),
            node("loc", "location", name="Harbor"),
            node("far", "location", name="Far"),
        ]
        edges = [
            edge("alice", "ev", 0.8),
            edge("loc", "alice", 0.9),
            edge("alice", "old", 1.0),
            edge("sec", "alice", 0.6),
            edge("ev", "far", 0.5),
        ]
        return graph(nodes, edges)

    def _reference(self, state, seeds):
        snap = state.snapshot
        es = [
            (snap.ids[a], snap.ids[b], float(w), 0)
            for a, b, w in zip(snap.edge_src, snap.edge_dst, snap.edge_strength, strict=True)
        ]
        lists, _ = _reference_build_adjacency([i for i in snap.ids if i != "old"], es)
        return _reference_rank(_reference_propagate(lists, seeds, teleport_alpha=0.15))

    def test_event_neighbours_of_exact_anchors_are_seeded(self) -> None:
        """Cross recall on: each active edge from an exact anchor to a non-archived, visible event seeds the
        event with 1.5 × strength (ev 1.2); the archived event and the hidden one are not seeded."""
        state = make_state(self._graph(), "Alice", anchors=["alice"], hidden=["sec"])
        out = _stage().run(state)
        expected = self._reference(
            make_state(self._graph(), "Alice"), [("alice", 2.0), ("ev", 1.2)]
        )
        expected = [e for e in expected if e[0] != "sec"]
        assert_ranked(diffusion_of(out.state), expected, 1e-12)
        assert dict(diffusion_of(out.state))["ev"] == pytest.approx(1.2)
        assert out.state.meta["seedCount"] == 2
        assert out.trace.notes["seedSources"]["event"] == 1

    def test_hidden_event_excluded_from_reference_result_only_through_mask(self) -> None:
        out = _stage().run(make_state(self._graph(), "Alice", anchors=["alice"])).state
        assert dict(diffusion_of(out))["sec"] == pytest.approx(0.6 * 1.5)
        assert out.meta["seedCount"] == 3

    def test_cross_recall_off_keeps_first_diffusion(self) -> None:
        first = [("alice", 2.0), ("loc", 0.918)]
        state = make_state(self._graph(), "Alice", anchors=["alice"], diffusion=first)
        out = _stage(CrossRecallSettings(enabled=False)).run(state)
        assert diffusion_of(out.state) == first
        assert out.trace.notes["reDiffusion"] is False
        assert "seedCount" not in out.state.meta

    def test_residual_trigger_rediffuses_without_event_seeds(self) -> None:
        """Cross recall off but residual triggered: re-diffusion with residual hits (cosine) as extra seeds,
        and no event seeds (reference §3.10)."""
        state = make_state(
            self._graph(),
            "Alice",
            anchors=["alice"],
            residual_hits=[("far", 0.3)],
            meta={"residualTriggered": True},
        )
        out = _stage(CrossRecallSettings(enabled=False)).run(state)
        expected = self._reference(make_state(self._graph(), "Alice"), [("alice", 2.0), ("far", 0.3)])
        assert_ranked(diffusion_of(out.state), expected, 1e-12)
        assert out.state.meta["seedCount"] == 2
        assert "event" not in out.trace.notes["seedSources"]

    def test_residual_hits_ignored_without_diffusion(self) -> None:
        state = make_state(
            self._graph(), "q", residual_hits=[("far", 0.4)], meta={"residualTriggered": True}
        )
        out = _stage(diffusion=DiffusionSettings(enabled=False)).run(state).state
        assert diffusion_of(out) == []
        assert "seedCount" not in out.meta
        assert all(row[1] == 0.0 for row in candidate_table(out))  # no graph score anywhere
        assert out.meta["scoreMapFallback"] == "whole-active-set"

    def test_hidden_residual_hit_not_seeded(self) -> None:
        state = make_state(
            self._graph(), "q", residual_hits=[("far", 0.4)], hidden=["far"], meta={"residualTriggered": True}
        )
        out = _stage(CrossRecallSettings(enabled=False)).run(state).state
        assert diffusion_of(out) == []


class TestScoreMap:
    def _graph(self):
        nodes = [
            node("v1", "character", name="V one"),
            node("v2", "character", name="V two"),
            node("d1", "location", name="D one"),
            node("d2", "location", name="D two"),
            node("b1", "rule", title="B one"),
            node("b2", "rule", title="B two"),
            node("gone", "location", name="Gone", seq_range=None),  # no finite range: inactive
            node("hid", "location", name="Hid"),
        ]
        return graph(nodes)

    def test_order_and_values(self) -> None:
        """Vector hits (their order), then diffusion-only nodes (rank order), then BM25-only nodes (BM25
        order); inactive and hidden nodes never enter (departure 2)."""
        state = make_state(
            self._graph(),
            "q",
            vector_hits=[("v2", 0.63, 0.9), ("v1", 0.35, 0.5), ("hid", 0.3, 0.4)],
            bm25=[("b2", 1.0), ("v1", 0.8), ("d1", 0.6), ("b1", 0.2), ("gone", 0.1)],
            diffusion=[("d2", 1.5), ("v2", 0.9), ("gone", 0.5), ("d1", 0.4), ("hid", 0.3)],
            hidden=["hid"],
        )
        out = _stage(CrossRecallSettings(enabled=False)).run(state)
        assert candidate_table(out.state) == [
            ("v2", 0.9, 0.63, 0.9, 0.0, 0.0),
            ("v1", 0.0, 0.35, 0.5, 0.8, 0.0),
            ("d2", 1.5, 0.0, 0.0, 0.0, 0.0),
            ("d1", 0.4, 0.0, 0.0, 0.6, 0.0),
            ("b2", 0.0, 0.0, 0.0, 1.0, 0.0),
            ("b1", 0.0, 0.0, 0.0, 0.2, 0.0),
        ]
        assert out.trace.notes["fromVector"] == 2
        assert out.trace.notes["fromDiffusion"] == 2
        assert out.trace.notes["fromBm25"] == 2
        assert out.state.meta["scoreMapFallback"] == ""
        assert out.trace.count_out == 6

    def test_state_active_mask_is_respected(self) -> None:
        state = make_state(
            self._graph(), "q", vector_hits=[("v1", 0.5, 0.5), ("v2", 0.4, 0.4)], active=["v2", "d1"]
        )
        out = _stage(CrossRecallSettings(enabled=False)).run(state).state
        assert ids_of_candidates(out) == ["v2"]


def _scenario_33_graph():
    nodes = [
        node("a", "character", name="Alice"),
        node("b", "location", name="Garden"),
        node("c", "location", name="Tower"),
    ]
    return graph(nodes, [edge("a", "b", 0.5)])


def _pipeline(state, cross: CrossRecallSettings | None = None):
    """diffusion → cross recall, as the retrieve runner orders them (residual off)."""
    r1 = DiffusionStage(DIFF, AnchorSettings()).run(state)
    r2 = _stage(cross).run(r1.state)
    return r1, r2


class TestScenario33AnchorRestriction:
    def test_scenario_33_alice(self) -> None:
        """Vector off, diffusion on, temporal links off: seeds 1, diffusion hits 2, only [a, b] are
        candidates; c is never considered."""
        r1, r2 = _pipeline(make_state(_scenario_33_graph(), "Alice?", anchors=["a"]))
        assert r1.state.meta["seedCount"] == 1 and r1.state.meta["diffusionHits"] == 2
        assert r2.state.meta["seedCount"] == 1 and r2.state.meta["diffusionHits"] == 2
        table = candidate_table(r2.state)
        assert [row[0] for row in table] == ["a", "b"]
        assert [row[1] for row in table] == pytest.approx([2.0, 2.0 * 0.5 * 0.6 * 0.85])

    def test_scenario_33_nobody_falls_back_to_whole_set(self) -> None:
        r1, r2 = _pipeline(make_state(_scenario_33_graph(), "nobody"))
        assert r1.trace.skip_reason == "no-seeds"
        assert ids_of_candidates(r2.state) == ["a", "b", "c"]
        assert all(row[1:] == (0.0, 0.0, 0.0, 0.0, 0.0) for row in candidate_table(r2.state))
        assert r2.state.meta["scoreMapFallback"] == "whole-active-set"


class TestScenario38Visibility:
    def test_scenario_38_vault_not_reintroduced(self) -> None:
        """Departure 2: the reference selects [Alice, Vault] (diffusion re-introduces the hidden Vault); here
        Vault is neither diffused to nor a candidate."""
        nodes = [
            node("Alice", "character", name="Alice"),
            node("Vault", "location", name="Vault", visibility="Bob"),
        ]
        g = graph(nodes, [edge("Alice", "Vault", 0.9)])
        state = make_state(g, "Where is Alice", anchors=["Alice"], hidden=["Vault"])
        _, r2 = _pipeline(state)
        assert ids_of_candidates(r2.state) == ["Alice"]
        assert diffusion_of(r2.state) == [("Alice", 2.0)]


class TestFallback:
    def _rules(self):
        # Fixture RULES (reference §6): rule-1 (importance 9), rule-2 (7), rule-3 (3).
        return graph(
            [
                node("rule-1", "rule", seq=1, importance=9, title="规则一"),
                node("rule-2", "rule", seq=2, importance=7, title="规则二"),
                node("rule-3", "rule", seq=3, importance=3, title="规则三"),
            ]
        )

    def test_scenario_25_rules_all_scored(self) -> None:
        """Scenario 25: no vector, no anchor → every active node is a candidate (graph order)."""
        _, r2 = _pipeline(make_state(self._rules(), "他后来怎么做？"))
        assert ids_of_candidates(r2.state) == ["rule-1", "rule-2", "rule-3"]

    def test_scenario_32_lexical_only_pair(self) -> None:
        g = graph(
            [node("char-1", name="Alice", summary="常驻角色", importance=1), node("char-2", name="Bob")]
        )
        _, r2 = _pipeline(make_state(g, "Alice 现在怎么样了"))
        assert ids_of_candidates(r2.state) == ["char-1", "char-2"]

    def test_scenario_34_ten_characters(self) -> None:
        g = graph([node(f"Char{i}", name=f"Char{i}", seq=i, importance=i) for i in range(10)])
        _, r2 = _pipeline(make_state(g, "hello"))
        assert ids_of_candidates(r2.state) == [f"Char{i}" for i in range(10)]

    def test_hidden_and_inactive_not_in_fallback(self) -> None:
        g = graph([node("a", name="Aa"), node("b", name="Bb", seq_range=None), node("c", name="Cc")])
        _, r2 = _pipeline(make_state(g, "q", hidden=["c"]))
        assert ids_of_candidates(r2.state) == ["a"]

    def test_large_graph_takes_top_k_times_3_by_importance_then_recency(self) -> None:
        """Departure 11 (§7 item 24): above ``whole_set_fallback_max_nodes`` only ``top_k × 3`` nodes enter,
        by importance desc, then recency desc, then node id."""
        spec = [("n0", 5, 1), ("n1", 9, 2), ("n2", 7, 3), ("n3", 7, 8), ("n4", 1, 9), ("n5", 9, 2)]
        spec.append(("n6", 2, 4))
        g = graph([node(i, name=f"Node {i}", importance=imp, seq=seq) for i, imp, seq in spec])
        stage = CrossRecallStage(
            CrossRecallSettings(whole_set_fallback_max_nodes=5),
            DIFF,
            AnchorSettings(),
            SelectionSettings(top_k=1),
        )
        out = stage.run(make_state(g, "q"))
        assert ids_of_candidates(out.state) == ["n1", "n5", "n3"]
        assert out.state.meta["scoreMapFallback"] == "importance-recency"

    def test_bm25_hit_prevents_fallback(self) -> None:
        _, r2 = _pipeline(make_state(self._rules(), "规则二", bm25=[("rule-2", 1.0)]))
        assert ids_of_candidates(r2.state) == ["rule-2"]
        assert candidate_table(r2.state)[0][1] == pytest.approx(1.0)  # BM25 seed energy 1.0 × weight 1


class TestPipelineOrder:
    def test_diffusion_residual_cross_recall_cooccurrence(self) -> None:
        """The four stages chained in pipeline order on one snapshot (residual and co-occurrence enabled)."""
        nodes = [
            node("a", "character", name="Alice", seq=1, seq_range=(1, 2)),
            node("b", "character", name="Bob", seq=2),
            node("ev", "event", title="Duel", seq=2),
            node("x", "location", name="Cave", seq=2),
        ]
        g = graph(nodes, [edge("a", "ev", 0.8)], journal=[(2, 2)])
        emb = {"a": [1, 0, 0, 0], "b": [0, 1, 0, 0], "ev": [0, 0, 1, 0], "x": [0.1, 0.1, 0.2, 1]}
        q = np.array([0.3, 0.3, 0.1, 0.9])
        q = q / np.linalg.norm(q)
        state = make_state(
            g, "Alice meets Bob", embeddings=emb, vector_hits=[("a", 0.8, 0.8), ("b", 0.7, 0.7)],
            anchors=["a"], query_vectors=q[None, :],
        )
        s1 = DiffusionStage(DIFF, AnchorSettings()).run(state).state
        s2 = ResidualStage(ResidualSettings(enabled=True), Providers()).run(s1).state
        assert s2.meta["residualTriggered"] is True
        assert [s2.snapshot.ids[i] for i, _ in s2.residual_hits][0] == "x"
        s3 = _stage().run(s2).state
        assert [s3.snapshot.ids[i] for i in s3.supplemental_anchors] == ["b"]
        assert ids_of_candidates(s3)[:2] == ["a", "b"]
        assert {"ev", "x"} <= set(ids_of_candidates(s3))
        s4 = CooccurrenceStage(CooccurrenceSettings(enabled=True)).run(s3).state
        boost = {row[0]: row[5] for row in candidate_table(s4)}
        # a (exact, 2.0) and b (supplemental, vector score 0.7) co-occur with x in batch [2, 2].
        assert boost["b"] == pytest.approx(2.0 * np.log(2) * 0.1)
        assert boost["x"] == pytest.approx((2.0 + 0.7) * np.log(2) * 0.1)
        assert boost["a"] == pytest.approx(0.7 * np.log(2) * 0.1)


def _random_score_map_state(rng: np.random.Generator):
    """A state with random vector / diffusion / BM25 hits over a small graph: repeated nodes within a channel,
    nodes in several channels, out-of-range indices, archived, inactive, hidden and ineligible nodes."""
    n = int(rng.integers(3, 25))
    types = ["character", "location", "event", "reflection", "rule"]
    nodes = [
        node(
            f"n{i:02d}", str(rng.choice(types)), seq=i, archived=bool(rng.random() < 0.1),
            seq_range=None if rng.random() < 0.1 else "default",
            **({"name": f"Name {i}"} if rng.random() < 0.7 else {}),
        )
        for i in range(n)
    ]
    ids = [f"n{i:02d}" for i in range(n)]
    hidden = [i for i in ids if rng.random() < 0.15]
    state = make_state(graph(nodes), "q", hidden=hidden, anchors=[i for i in ids if rng.random() < 0.1])

    def picks(size: int) -> np.ndarray:
        idx = rng.integers(0, n, size)
        if size and rng.random() < 0.3:
            idx[int(rng.integers(0, size))] = int(rng.choice([-1, n, n + 5]))
        return idx

    nv, nd, nb = (int(v) for v in rng.integers(0, 12, 3)) if rng.random() < 0.9 else (0, 0, 0)
    return state.evolve(
        vector_hits=(picks(nv), rng.uniform(0, 1, nv), rng.uniform(0, 1, nv)),
        diffusion=(picks(nd), rng.uniform(0, 2, nd)),
        bm25_hits=(picks(nb), rng.uniform(0, 1, nb)),
    )


def _reference_score_map(state) -> list[tuple[int, float, float, float, float]]:
    """The score-map contract as plain Python: (node, graph, vector, raw, bm25) rows in insertion order."""
    snap = state.snapshot
    hidden = state.meta.get("visibility_hidden_mask")
    active = ~snap.archived & snap.finite_range

    def eligible(i: int) -> bool:
        return 0 <= i < snap.n and bool(active[i]) and not (hidden is not None and hidden[i])

    vec: dict[int, tuple[float, float]] = {}
    for i, w, r in zip(*(a.tolist() for a in state.vector_hits), strict=True):
        vec.setdefault(i, (w, r))
    dif_idx, dif_e = (a.tolist() for a in state.diffusion)
    dif: dict[int, float] = {}
    for i, e in zip(dif_idx, dif_e, strict=True):
        dif.setdefault(i, e)
    bm: dict[int, float] = {}
    for i, b in zip(*(a.tolist() for a in state.bm25_hits), strict=True):
        bm.setdefault(i, b)
    index = [i for i in vec if eligible(i)]
    index += [i for i in dif_idx if eligible(i) and i not in vec]
    index += [i for i in bm if eligible(i) and i not in vec and i not in dif]
    return [(i, dif.get(i, 0.0), vec.get(i, (0.0, 0.0))[0], vec.get(i, (0.0, 0.0))[1], bm.get(i, 0.0)) for i in index]


def _reference_supplemental(state, limit: int) -> list[int]:
    snap = state.snapshot
    hidden = state.meta.get("visibility_hidden_mask")
    exact = {a for a, _ in state.anchors}
    out: list[int] = []
    for i in dict.fromkeys(state.vector_hits[0].tolist()):
        if 0 <= i < snap.n and cooccurrence_eligible(snap, np.array([i]))[0] and i not in exact:
            if not (hidden is not None and hidden[i]):
                out.append(i)
    return out[:limit]


def test_differential_score_map_and_supplemental_match_plain_python() -> None:
    """200 random states: the score map (order and every score, bit for bit) and the supplemental anchors equal
    a plain-Python transliteration of the contract."""
    rng = np.random.default_rng(20261201)
    stage = _stage(CrossRecallSettings(enabled=False, supplemental_anchors=3), DiffusionSettings(enabled=False))
    fallbacks = 0
    for case in range(200):
        state = _random_score_map_state(rng)
        out = stage.run(state).state
        c = out.candidates
        got = list(zip(c.index.tolist(), c.graph_score.tolist(), c.vector_score.tolist(), c.vector_raw.tolist(),
                       c.bm25_score.tolist(), strict=True))
        if out.meta["scoreMapFallback"] == "":
            assert got == _reference_score_map(state), case
        else:  # nothing entered: the empty-map fallback took over
            assert _reference_score_map(state) == [], case
            fallbacks += 1
        assert c.index.dtype == np.int64 and c.cooccurrence_boost.tolist() == [0.0] * len(c)
        assert list(out.supplemental_anchors) == _reference_supplemental(state, 3), case
    assert 0 < fallbacks < 50


class TestContract:
    def test_empty_graph_skips(self) -> None:
        state = make_state(graph([]), "q")
        out = _stage().run(state)
        assert out.trace.skipped and out.trace.skip_reason == "no-active-nodes"
        assert out.state.skip_reasons == ("no-active-nodes",)
        assert len(out.state.candidates) == 0

    def test_no_active_node_skips(self) -> None:
        out = _stage().run(make_state(graph([node("a", name="Aa", seq_range=None)]), "q"))
        assert out.trace.skip_reason == "no-active-nodes"

    def test_input_not_mutated(self) -> None:
        nodes = [node("a", "character", name="Alice"), node("e", "event", title="Duel"), node("h", name="Hh")]
        g = graph(nodes, [edge("a", "e", 0.8), edge("e", "h", 0.5)])
        state = make_state(
            g, "Alice", vector_hits=[("a", 0.5, 0.6)], anchors=["a"], bm25=[("h", 0.5)],
            diffusion=[("a", 2.0)], hidden=["h"], residual_hits=[("e", 0.3)],
            meta={"residualTriggered": True},
        )
        before = state_fingerprint(state)
        _stage().run(state)
        assert state_fingerprint(state) == before

    def test_deterministic(self) -> None:
        snap = snapshot(_scenario_33_graph())
        state = make_state(snap, "Alice", anchors=["a"], vector_hits=[("c", 0.4, 0.5)])
        a, b = _stage().run(state), _stage().run(state)
        assert result_fingerprint(a.state) == result_fingerprint(b.state)

    def test_trace_fields(self) -> None:
        out = _stage().run(make_state(_scenario_33_graph(), "Alice", anchors=["a"]))
        assert out.trace.name == "cross_recall"
        assert out.trace.score_direction == "higher_is_better"
        assert out.trace.count_out == 2


def test_eligible_mask_is_cooccurrence_eligible_of_every_node() -> None:
    from memory_recall.pipeline.cross_recall import _cooccurrence_eligible_mask

    nodes = [
        node("a", name="Alice"),
        node("b", name="Bram", archived=True),
        node("e", "event", title="Harvest Fair"),
        node("l", "location", name="Tower"),
        node("s", "synopsis", title="Old Story"),
        node("x", "location"),
        node("c", name="Cora", title="Captain"),
    ]
    snap = snapshot(graph(nodes))
    expected = cooccurrence_eligible(snap, np.arange(snap.n))
    assert expected.tolist() == [True, False, False, True, False, False, True]
    assert _cooccurrence_eligible_mask(snap).tolist() == expected.tolist()


# -- the eligibility mask after a delta ----------------------------------------------------------------------------

_CHAT = "upd"
_MODEL = "test-model"
_NOW = 1_700_000_000_000


class _Chat:
    """A chat in a real store on a temporary SQLite file, its snapshots kept up to date by a ``SnapshotCache``."""

    def __init__(self, path) -> None:
        from memory_recall.store import Store
        from memory_recall.store.snapshot import SnapshotCache

        self.store = Store(path)
        self.cache = SnapshotCache()
        self.next = 0
        with self.store.write(_CHAT) as w:
            w.upsert_nodes([self._node() for _ in range(15)])

    def _node(self, kind: str | None = None):
        from memory_recall.model.graph import Node

        i, self.next = self.next, self.next + 1
        kind = kind or ("character", "event", "location", "synopsis", "message")[i % 5]
        fields = {"title": f"Scene {i}"} | ({"name": f"Name{i}"} if i % 3 else {})
        return Node(id=f"n{i:03d}", type=kind, seq=i, fields=fields, archived=i % 7 == 5,
                    prev_id=f"n{i - 1:03d}" if i else None, seq_range=(i, i + 1))

    def snapshot(self):
        return self.cache.get(self.store, _CHAT, _MODEL, now_ms=_NOW)

    def fresh(self):
        from memory_recall.store.snapshot import build_snapshot

        return build_snapshot(self.store.snapshot_source(_CHAT, _MODEL), now_ms=_NOW)

    def add(self, kind: str) -> None:
        with self.store.write(_CHAT) as w:
            w.upsert_nodes([self._node(kind)])


def _eligible_of_both(chat: _Chat) -> tuple[np.ndarray, np.ndarray]:
    from memory_recall.pipeline.cross_recall import _cooccurrence_eligible_mask

    return _cooccurrence_eligible_mask(chat.snapshot()), _cooccurrence_eligible_mask(chat.fresh())


def _exactly(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_eligible_mask_is_updated_after_new_nodes(tmp_path, monkeypatch) -> None:
    """Appended nodes: the mask is the parent's plus the new rows, tested alone (no pass over the anchor index),
    equal to a fresh build."""
    from memory_recall.pipeline import cross_recall

    chat = _Chat(tmp_path / "store.sqlite3")
    first, built = _eligible_of_both(chat)
    assert _exactly(first, built) and first.any() and not first.all()
    for kind in ("character", "event", "location", "message"):
        chat.add(kind)
        snap = chat.snapshot()
        assert snap.structure.change is not None and snap.structure.change.appended_only

        def no_build(_snapshot):
            raise AssertionError("built instead of updated")

        with monkeypatch.context() as m:
            m.setattr(cross_recall, "has_anchor_term_mask", no_build)
            updated = cross_recall._cooccurrence_eligible_mask(snap)
        fresh = cross_recall._cooccurrence_eligible_mask(chat.fresh())
        assert _exactly(updated, fresh), kind
        assert _exactly(updated[: first.size], first)
        first = updated


def test_eligible_mask_after_a_delete_an_archive_and_a_retype(tmp_path) -> None:
    """Deltas that are not appends: a delete moves rows, an archive or a new type changes a row's eligibility;
    the carried rows keep theirs, the changed ones are tested again, equal to a fresh build."""
    chat = _Chat(tmp_path / "store.sqlite3")
    _eligible_of_both(chat)
    with chat.store.write(_CHAT) as w:
        w.delete_nodes(["n001"])
    snap = chat.snapshot()
    assert snap.structure.change is not None and not snap.structure.change.appended_only
    updated, fresh = _eligible_of_both(chat)
    assert _exactly(updated, fresh)
    for node_id, update in (("n002", {"archived": True}), ("n004", {"type": "event"}), ("n005", {"archived": False})):
        old = chat.store.get_node(_CHAT, node_id)
        assert old is not None
        with chat.store.write(_CHAT) as w:
            w.upsert_nodes([old.model_copy(update=update)])
        before = updated
        updated, fresh = _eligible_of_both(chat)
        assert _exactly(updated, fresh), node_id
        i = chat.snapshot().index[node_id]
        assert updated[i] != before[i], node_id  # the change mattered
