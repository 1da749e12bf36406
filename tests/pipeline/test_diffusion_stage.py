"""DiffusionStage (reference §3.9): scenarios 11–14, 12/21 (duplicate seeds), 38 (visibility departure),
the per-snapshot adjacency cache, seeds from every channel, a differential test against the plain-Python
reference transliteration, and the stage contract (skip, no mutation, determinism)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from graph_helpers import (
    NOW,
    assert_ranked,
    diffusion_of,
    edge,
    graph,
    make_state,
    node,
    plan,
    result_fingerprint,
    snapshot,
    state_fingerprint,
)

from memory_recall.pipeline import _graph_cache
from memory_recall.pipeline.diffusion import DiffusionStage, Seeds, collect_seeds, diffuse, diffusion_adjacency
from memory_recall.pipeline.kernels.diffusion import (
    _reference_build_adjacency,
    _reference_propagate,
    _reference_rank,
    build_adjacency,
    propagate,
)
from memory_recall.pipeline.state import BlendPart, QueryPlan
from memory_recall.settings import AnchorSettings, DiffusionSettings

NO_TEMPORAL = DiffusionSettings(enable_temporal_links=False)


def _example_graph():
    # Reference §3.9 worked example / scenario 11: A–B 1.0, B–C 0.5, C–D 1.0, A–X 0.8 inhibit.
    nodes = [node(i, "location", name=f"Place {i}") for i in ("A", "B", "C", "D", "X")]
    edges = [edge("A", "B", 1.0), edge("B", "C", 0.5), edge("C", "D", 1.0), edge("A", "X", 0.8, inhibit=True)]
    return graph(nodes, edges)


def _run(state, settings=NO_TEMPORAL, anchors=None):
    return DiffusionStage(settings, anchors).run(state)


class TestScenario11WorkedExample:
    """Exact energies of the reference worked example, through the stage on a snapshot."""

    def test_scenario_11_alpha_0(self) -> None:
        state = make_state(_example_graph(), "q", vector_hits=[("A", 1.0, 1.0)])
        out = _run(state, DiffusionSettings(enable_temporal_links=False, teleport_alpha=0.0)).state
        assert_ranked(diffusion_of(out), [("A", 1.0), ("B", 0.6), ("C", 0.18)])
        assert out.meta["diffusionHits"] == 3  # X inhibited (−0.96, dropped), D unreached
        assert out.meta["teleportAlpha"] == 0.0

    def test_scenario_11_alpha_015(self) -> None:
        state = make_state(_example_graph(), "q", vector_hits=[("A", 1.0, 1.0)])
        out = _run(state).state
        got = diffusion_of(out)
        assert [g[0] for g in got] == ["A", "B", "C"]
        assert [g[1] for g in got] == pytest.approx([1.0, 0.51, 0.13005], abs=1e-12)
        assert out.meta["teleportAlpha"] == 0.15

    def test_scenario_11_anchor_seed_2_alpha_015(self) -> None:
        state = make_state(_example_graph(), "Place A", anchors=["A"])
        out = _run(state, anchors=AnchorSettings()).state
        got = dict(diffusion_of(out))
        assert got == pytest.approx({"A": 2.0, "B": 1.02, "C": 0.2601}, abs=1e-12)
        assert "X" not in got  # −1.92: inhibited nodes vanish from the ranking
        assert out.meta["seedCount"] == 1


class TestScenario12And21DuplicateSeeds:
    def _graph(self):
        nodes = [node("E2", "event", title="E two"), node("C", "character", name="Cara")]
        return graph(nodes, [edge("E2", "C", 1.0)])

    def test_scenario_21_stage_deduplicates_by_max(self) -> None:
        """The retriever max-deduplicates seeds before diffusion (Appendix A): vector 1.0 + BM25 0.5 on the
        same node seed it with 1.0, so one step gives E2 1.0, C 0.6 (not the kernel's summed 1.5 / 0.9)."""
        state = make_state(self._graph(), "q", vector_hits=[("E2", 1.0, 1.0)], bm25=[("E2", 0.5)])
        settings = DiffusionSettings(enable_temporal_links=False, teleport_alpha=0.0, max_steps=1)
        out = _run(state, settings).state
        assert_ranked(diffusion_of(out), [("E2", 1.0), ("C", 0.6)])
        assert out.meta["seedCount"] == 1

    def test_scenario_12_21_kernel_sums_duplicates(self) -> None:
        """Scenarios 12/21 at kernel level, on the stage's cached adjacency: seeds [(E2, 1.0), (E2, 0.5)]
        behave like E2 = 1.5; one step over E2–C 1.0 with α 0 → E2 1.5, C 0.9."""
        snap = snapshot(self._graph())
        adj, _ = diffusion_adjacency(snap, NO_TEMPORAL)
        e2, c = snap.index["E2"], snap.index["C"]
        idx, energy = propagate(adj, [e2, e2], [1.0, 0.5], max_steps=1, teleport_alpha=0.0)
        assert dict(zip(idx.tolist(), energy.tolist(), strict=True)) == pytest.approx({e2: 1.5, c: 0.9})


class TestScenario13TemporalAdjacency:
    def _graph(self):
        nodes = [
            node("E1", "event", seq=1, title="First", next_id="E2"),
            node("E2", "event", seq=2, title="Second", prev_id="E1"),
            node("C", "character", name="Cara"),
        ]
        edges = [
            edge("E2", "C", 0.9),
            edge("E1", "C", 0.4, invalid_at=NOW - 1),  # invalidated
            edge("E1", "C", 0.7),
        ]
        return graph(nodes, edges)

    def test_scenario_13_adjacency_row_and_synthetic_count(self) -> None:
        snap = snapshot(self._graph())
        adj, _ = diffusion_adjacency(snap, DiffusionSettings())
        row = adj.normal[[snap.index["E1"]], :].toarray()[0]
        assert {snap.ids[j]: row[j] for j in np.flatnonzero(row)} == pytest.approx({"C": 0.7, "E2": 0.2})
        assert adj.synthetic_edge_count == 1

    def test_scenario_13_diffusion_from_e2_reaches_c_and_e1(self) -> None:
        out = _run(make_state(self._graph(), "q", vector_hits=[("E2", 1.0, 1.0)]), DiffusionSettings()).state
        # Step 1: C 0.9·0.6·0.85 = 0.459, E1 0.2·0.51 = 0.102; step 2: E1 0.459·0.7·0.51 + 0.15·0.2·0.51.
        assert_ranked(diffusion_of(out), [("E2", 1.0), ("C", 0.459), ("E1", 0.179163)])
        assert out.meta["temporalSyntheticEdgeCount"] == 1


class TestScenario14TemporalStrength:
    def _graph(self):
        return graph(
            [node("E1", "event", seq=1, title="One", next_id="E2"), node("E2", "event", seq=2, title="Two")]
        )

    def test_scenario_14_strength_0_means_no_links(self) -> None:
        """Departure (§7 item 13): the reference turns strength 0 into 0.2; here 0 adds no temporal link."""
        out = _run(
            make_state(self._graph(), "q", vector_hits=[("E1", 1.0, 1.0)]),
            DiffusionSettings(temporal_link_strength=0.0),
        ).state
        assert diffusion_of(out) == [("E1", 1.0)]
        assert out.meta["temporalSyntheticEdgeCount"] == 0

    def test_scenario_14_links_disabled(self) -> None:
        out = _run(make_state(self._graph(), "q", vector_hits=[("E1", 1.0, 1.0)]), NO_TEMPORAL).state
        assert diffusion_of(out) == [("E1", 1.0)]
        assert out.meta["temporalSyntheticEdgeCount"] == 0

    def test_scenario_14_default_strength_links(self) -> None:
        out = _run(make_state(self._graph(), "q", vector_hits=[("E1", 1.0, 1.0)]), DiffusionSettings()).state
        assert_ranked(diffusion_of(out), [("E1", 1.0), ("E2", 0.2 * 0.6 * 0.85)])
        assert out.meta["temporalSyntheticEdgeCount"] == 1


class TestSeeds:
    def _graph(self):
        nodes = [node(i, "character", name=f"Person {i}") for i in ("a", "b", "c", "d")]
        return graph(nodes)

    def test_bm25_seeds_scaled_by_current_user_weight(self) -> None:
        """BM25 hits join the seeds (recall-spec "BM25 channel") with energy = normalised score × the
        current-user blend weight (0.7 here), like vector scores."""
        qp = QueryPlan(
            parts=(
                BlendPart("currentUser", "当前用户消息", "q", 0.7),
                BlendPart("assistantContext", "最近 assistant 回复", "r", 0.3),
            ),
            active=True,
        )
        state = make_state(self._graph(), "q", bm25=[("a", 1.0), ("b", 0.5)], query_plan=qp)
        out = _run(state).state
        assert_ranked(diffusion_of(out), [("a", 0.7), ("b", 0.35)])

    def test_bm25_weight_1_without_plan(self) -> None:
        state = make_state(self._graph(), "", bm25=[("a", 0.8)])
        assert_ranked(diffusion_of(_run(state).state), [("a", 0.8)])

    def test_all_channels_deduplicated_by_max(self) -> None:
        state = make_state(
            self._graph(),
            "q",
            vector_hits=[("a", 0.4, 0.5), ("b", 0.9, 0.9)],
            anchors=["a"],
            bm25=[("b", 0.3), ("c", 0.6), ("d", 0.0)],
        )
        seeds = collect_seeds(state, AnchorSettings(energy=1.5).energy)
        assert [state.snapshot.ids[i] for i in seeds.index] == ["a", "b", "c"]  # first-occurrence order; d: 0
        assert seeds.energy.tolist() == pytest.approx([1.5, 0.9, 0.6])
        assert seeds.sources == {"vector": 2, "anchor": 1, "bm25": 3}
        out = _run(state, anchors=AnchorSettings(energy=1.5))
        assert out.state.meta["seedCount"] == 3
        assert out.trace.count_in == 3

    def test_anchor_energy_from_settings(self) -> None:
        state = make_state(self._graph(), "Person a", anchors=["a"])
        assert diffusion_of(_run(state, anchors=AnchorSettings(energy=1.25)).state) == [("a", 1.25)]
        assert diffusion_of(_run(state).state) == [("a", 2.0)]  # default AnchorSettings

    def test_archived_seed_dropped(self) -> None:
        g = graph([node("a", name="Alpha"), node("z", name="Zeta", archived=True)], [edge("a", "z", 1.0)])
        out = _run(make_state(g, "q", vector_hits=[("z", 0.9, 0.9)]))
        assert out.trace.skip_reason == "no-seeds"


class TestScenario38Visibility:
    """Departure 2 (§7 item 2): the reference selects [Alice, Vault] because diffusion re-introduces the
    hidden Vault; here a hidden node never receives energy, never relays it, never appears."""

    def _graph(self):
        nodes = [
            node("Alice", "character", name="Alice"),
            node("Vault", "location", name="Vault", visibility="Bob"),
            node("Beyond", "location", name="Beyond"),
        ]
        return graph(nodes, [edge("Alice", "Vault", 0.9), edge("Vault", "Beyond", 1.0)])

    def test_scenario_38_hidden_node_not_reintroduced(self) -> None:
        state = make_state(self._graph(), "Where is Alice", anchors=["Alice"], hidden=["Vault"])
        out = _run(state)
        assert diffusion_of(out.state) == [("Alice", 2.0)]  # Vault hidden, Beyond only reachable through it
        assert out.trace.notes["hiddenNodes"] == 1

    def test_reference_behaviour_without_mask(self) -> None:
        out = _run(make_state(self._graph(), "Where is Alice", anchors=["Alice"])).state
        assert [d[0] for d in diffusion_of(out)] == ["Alice", "Vault", "Beyond"]

    def test_hidden_seed_is_dropped(self) -> None:
        state = make_state(self._graph(), "q", vector_hits=[("Vault", 0.9, 0.9)], hidden=["Vault"])
        assert _run(state).trace.skip_reason == "no-seeds"


class TestAdjacencyCache:
    """Recall-spec departure 11 (§7 item 25): adjacency built once per graph version."""

    def test_second_run_reuses_adjacency(self) -> None:
        snap = snapshot(_example_graph())
        state = make_state(snap, "q", vector_hits=[("A", 1.0, 1.0)])
        first = _run(state, DiffusionSettings())
        second = _run(state, DiffusionSettings())
        assert first.trace.notes["adjacencyCached"] is False
        assert second.trace.notes["adjacencyCached"] is True
        a1, _ = diffusion_adjacency(snap, DiffusionSettings())
        a2, hit = diffusion_adjacency(snap, DiffusionSettings())
        assert a1 is a2 and hit

    def test_keyed_by_temporal_settings_and_shared_by_masks(self) -> None:
        snap = snapshot(_example_graph())
        with_links, _ = diffusion_adjacency(snap, DiffusionSettings())
        without, _ = diffusion_adjacency(snap, NO_TEMPORAL)
        zero, _ = diffusion_adjacency(snap, DiffusionSettings(temporal_link_strength=0.0))
        assert with_links is not without
        assert without is zero  # both mean "no temporal links"
        # A mask is the kernel's business: a masked diffusion reads the one adjacency and leaves it untouched.
        mask = np.zeros(snap.n, dtype=bool)
        mask[snap.index["B"]] = True
        seeds = Seeds(np.array([snap.index["A"]], dtype=np.int64), np.array([1.0]), {})
        out = diffuse(snap, seeds, NO_TEMPORAL, mask)
        assert out.adjacency_cached and snap.index["B"] not in out.index.tolist()
        assert diffusion_adjacency(snap, NO_TEMPORAL)[0] is without
        assert without.normal[[snap.index["B"]], :].nnz == 2

    def test_cache_dies_with_the_snapshot(self) -> None:
        snap = snapshot(_example_graph())
        diffusion_adjacency(snap, NO_TEMPORAL)
        before = len(_graph_cache._CACHE)
        del snap
        gc.collect()
        assert len(_graph_cache._CACHE) == before - 1

    def test_matches_kernel_build_from_edge_arrays(self) -> None:
        nodes = [
            node("E1", "event", seq=1, title="One", next_id="E2"),
            node("E2", "event", seq=2, title="Two", prev_id="E1", next_id="E3"),
            node("E3", "event", seq=3, title="Three"),
        ]
        edges = [edge("E1", "E2", 0.5), edge("E2", "E1", 0.25), edge("E2", "E3", 0.6, inhibit=True)]
        snap = snapshot(graph(nodes, edges))
        adj, _ = diffusion_adjacency(snap, DiffusionSettings())
        ref = build_adjacency(
            snap.n, snap.edge_src, snap.edge_dst, snap.edge_strength, snap.edge_inhibit, snap.temporal_pairs,
            0.2,
        )
        assert np.allclose(adj.normal.toarray(), ref.normal.toarray())
        assert np.allclose(adj.inhibit.toarray(), ref.inhibit.toarray())
        assert adj.synthetic_edge_count == ref.synthetic_edge_count == 2


class TestLastRunMemo:
    """``diffuse`` keeps its last ranking per adjacency (a cross-recall re-diffusion with unchanged seeds costs a
    comparison); any other input is recomputed."""

    def _seeds(self, snap, pairs):
        return Seeds(
            np.array([snap.index[i] for i, _ in pairs], dtype=np.int64), np.array([e for _, e in pairs]), {}
        )

    def _fresh(self, pairs, settings, hidden_ids=()):
        # The same graph in a new snapshot: nothing remembered.
        snap = snapshot(_example_graph())
        hidden = None
        if hidden_ids:
            hidden = np.zeros(snap.n, dtype=bool)
            hidden[[snap.index[i] for i in hidden_ids]] = True
        out = diffuse(snap, self._seeds(snap, pairs), settings, hidden)
        return [(snap.ids[i], e) for i, e in zip(out.index.tolist(), out.energy.tolist(), strict=True)]

    def test_same_seeds_reuse_the_ranking_other_inputs_recompute(self) -> None:
        snap = snapshot(_example_graph())
        seeds = [("A", 1.0), ("C", 0.5)]
        first = diffuse(snap, self._seeds(snap, seeds), NO_TEMPORAL)
        again = diffuse(snap, self._seeds(snap, seeds), NO_TEMPORAL)
        assert again.index is first.index and again.energy is first.energy and again.adjacency_cached

        def listed(out):
            return [(snap.ids[i], e) for i, e in zip(out.index.tolist(), out.energy.tolist(), strict=True)]

        for pairs, settings in [
            ([("A", 1.0), ("C", 0.6)], NO_TEMPORAL),  # another energy
            ([("C", 0.5), ("A", 1.0)], NO_TEMPORAL),  # same seeds, another order
            ([("A", 1.0), ("C", 0.5)], NO_TEMPORAL.model_copy(update={"decay": 0.5})),
            ([("A", 1.0), ("C", 0.5)], NO_TEMPORAL.model_copy(update={"teleport_alpha": 0.0})),
            ([("A", 1.0), ("C", 0.5)], DiffusionSettings()),  # temporal links: another adjacency
        ]:
            assert listed(diffuse(snap, self._seeds(snap, pairs), settings)) == self._fresh(pairs, settings)
        assert listed(diffuse(snap, self._seeds(snap, seeds), NO_TEMPORAL)) == listed(first)

    def test_masks_in_turn_each_give_their_own_ranking(self) -> None:
        snap = snapshot(_example_graph())
        seeds = [("A", 1.0)]
        for hidden_ids in (("B",), ("C",), ("B",), (), ("C",)):
            hidden = np.zeros(snap.n, dtype=bool)
            hidden[[snap.index[i] for i in hidden_ids]] = True
            out = diffuse(snap, self._seeds(snap, seeds), NO_TEMPORAL, hidden)
            got = [(snap.ids[i], e) for i, e in zip(out.index.tolist(), out.energy.tolist(), strict=True)]
            assert got == self._fresh(seeds, NO_TEMPORAL, hidden_ids), hidden_ids
            assert not set(hidden_ids) & {i for i, _ in got}

    def test_caller_supplied_hidden_mask_equals_the_state_one(self) -> None:
        snap = snapshot(_example_graph())
        state = make_state(snap, "q", vector_hits=[("A", 0.9, 0.9), ("B", 0.4, 0.4)], hidden=["B"])
        from_state = collect_seeds(state, 2.0)
        given = collect_seeds(state, 2.0, hidden=state.meta["visibility_hidden_mask"])
        assert from_state.index.tolist() == given.index.tolist() == [snap.index["A"]]
        assert collect_seeds(state, 2.0, hidden=None).index.tolist() == [snap.index["A"], snap.index["B"]]


def _random_case(rng: np.random.Generator):
    n = int(rng.integers(4, 14))
    names = [f"n{int(v):02d}" for v in rng.permutation(60)[:n]]  # graph order ≠ id byte order
    archived = rng.random(n) < 0.15
    types = rng.choice(["event", "character", "location"], size=n)
    nodes, chain = [], {}
    for i, name in enumerate(names):
        prev_id = names[i - 1] if i > 0 and rng.random() < 0.4 else None
        nxt = names[i + 1] if i + 1 < n and rng.random() < 0.3 else None
        chain[name] = (prev_id, nxt)
        nodes.append(
            node(name, str(types[i]), seq=i, archived=bool(archived[i]), prev_id=prev_id, next_id=nxt,
                 name=name)
        )
    edges = []
    for _ in range(int(rng.integers(0, 3 * n))):
        a, b = rng.choice(n, size=2, replace=False)
        strength = float(rng.choice([0.25, 0.5, 0.8, 1.0]))
        edges.append(
            edge(
                names[a],
                names[b],
                strength,
                inhibit=bool(rng.random() < 0.15),
                invalid_at=NOW - 5 if rng.random() < 0.1 else None,
            )
        )
    hidden = [nm for nm, ar in zip(names, archived, strict=True) if not ar and rng.random() < 0.15]
    live = [nm for nm, ar in zip(names, archived, strict=True) if not ar and nm not in hidden]
    k = int(rng.integers(1, max(2, len(live)))) if live else 0
    seed_names = list(rng.choice(live, size=min(k, len(live)), replace=False)) if live else []
    vector = [(s, float(rng.choice([0.3, 0.5, 0.9])), 0.9) for s in seed_names]
    settings = DiffusionSettings(
        teleport_alpha=float(rng.choice([0.0, 0.15, 0.5])),
        top_k=int(rng.choice([1, 2, 3, 100])),
        max_steps=int(rng.integers(1, 4)),
        enable_temporal_links=bool(rng.random() < 0.7),
        temporal_link_strength=float(rng.choice([0.0, 0.2, 0.6])),
    )
    return names, archived, chain, edges, hidden, vector, settings, graph(nodes, edges)


class TestDifferentialAgainstReference:
    """The stage's result equals the plain-Python reference (``_reference_propagate`` on adjacency lists built
    from the same edges, with hidden nodes' edges removed) on random small graphs."""

    @pytest.mark.parametrize("seed", range(60))
    def test_random_graph(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        names, archived, chain, edges, hidden, vector, settings, g = _random_case(rng)
        state = make_state(g, "q", vector_hits=vector, hidden=hidden)
        out = DiffusionStage(settings).run(state)
        if not vector:
            assert out.trace.skip_reason == "no-seeds"
            return
        snap = state.snapshot
        dead = {nm for nm, ar in zip(names, archived, strict=True) if ar} | set(hidden)
        ref_edges = [
            (e.from_id, e.to_id, e.strength, e.edge_type)
            for e in edges
            if e.active(NOW) and e.from_id not in dead and e.to_id not in dead
        ]
        pairs = []
        if settings.enable_temporal_links:
            for nm in names:
                for other in chain[nm]:
                    if other is not None and nm not in dead and other not in dead:
                        pairs.append((nm, other))
        strength = settings.temporal_link_strength if settings.enable_temporal_links else 0.0
        lists, synthetic = _reference_build_adjacency(
            [nm for nm in names if nm not in dead], ref_edges, pairs, strength
        )
        raw = _reference_propagate(
            lists,
            [(s, w) for s, w, _ in vector],
            max_steps=settings.max_steps,
            top_k=settings.top_k,
            teleport_alpha=settings.teleport_alpha,
            tie_key=lambda nid: snap.index[nid],
        )
        expected = _reference_rank(raw)
        got = diffusion_of(out.state)
        assert [g_[0] for g_ in got] == [e[0] for e in expected]
        assert [g_[1] for g_ in got] == pytest.approx([e[1] for e in expected], abs=1e-12)
        if not hidden:
            assert out.state.meta["temporalSyntheticEdgeCount"] == synthetic


class TestContract:
    def test_disabled_skip_leaves_state_unchanged(self) -> None:
        state = make_state(_example_graph(), "q", vector_hits=[("A", 1.0, 1.0)])
        out = DiffusionStage(DiffusionSettings(enabled=False)).run(state)
        assert out.state is state
        assert out.trace.skipped and out.trace.skip_reason == "diffusion-disabled"

    def test_empty_input_skips_with_reason(self) -> None:
        state = make_state(_example_graph(), "q")
        out = _run(state)
        assert out.trace.skipped and out.trace.skip_reason == "no-seeds"
        assert out.state.skip_reasons == ("no-seeds",)
        assert len(out.state.diffusion[0]) == 0
        assert out.trace.score_kind == "diffusion_energy" and out.trace.score_direction == "higher_is_better"

    def test_empty_graph(self) -> None:
        out = _run(make_state(graph([]), "q"))
        assert out.trace.skip_reason == "no-seeds"

    def test_input_not_mutated(self) -> None:
        g = graph(
            [node("E1", "event", seq=1, title="One", next_id="E2"), node("E2", "event", seq=2, title="Two")],
            [edge("E1", "E2", 0.5)],
        )
        state = make_state(g, "q", vector_hits=[("E1", 0.9, 0.9)], anchors=["E2"], bm25=[("E1", 1.0)],
                           hidden=["E2"])
        before = state_fingerprint(state)
        _run(state, DiffusionSettings())
        _run(make_state(state.snapshot, "q", vector_hits=[("E1", 0.9, 0.9)]), DiffusionSettings())
        assert state_fingerprint(state) == before

    def test_deterministic(self) -> None:
        state = make_state(_example_graph(), "q", vector_hits=[("A", 1.0, 1.0), ("C", 0.5, 0.5)])
        a, b = _run(state), _run(state)
        assert result_fingerprint(a.state) == result_fingerprint(b.state)
        assert a.trace.count_out == b.trace.count_out == 4

    def test_trace_fields(self) -> None:
        out = _run(make_state(_example_graph(), "q", vector_hits=[("A", 1.0, 1.0)], query_plan=plan("q")))
        assert out.trace.name == "diffusion"
        assert out.trace.elapsed_ms >= 0
        assert (out.trace.count_in, out.trace.count_out) == (1, 3)


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_unique_pairs_is_numpy_row_unique(n: int) -> None:
    from memory_recall.pipeline.diffusion import _unique_pairs

    rng = np.random.default_rng(n)
    for size in (0, 1, 5, 400):
        pairs = np.sort(rng.integers(0, n, (size, 2)), axis=1)
        expected = np.unique(pairs, axis=0)
        got = _unique_pairs(pairs, n)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert np.array_equal(got, expected)
    # Indices outside [0, n) take numpy's row-wise path (same answer).
    odd = np.array([[-1, 3], [-1, 3], [0, n + 5]], dtype=np.int64)
    assert np.array_equal(_unique_pairs(odd, n), np.unique(odd, axis=0))


def test_hub_factors_count_only_marked_neighbours_with_empty_rows_anywhere() -> None:
    """Degree over the ``counted`` neighbours only (the default profile counts chat turns); a node without edges
    in the middle or at the end has degree 0 (a trailing empty row once raised from ``np.add.reduceat``)."""
    import scipy.sparse as sp

    from memory_recall.pipeline.diffusion import hub_factors

    rows, cols = np.array([0, 1, 0, 3, 1, 3]), np.array([1, 0, 3, 0, 3, 1])
    adjacency = sp.csr_array((np.ones(6), (rows, cols)), shape=(5, 5))
    counted = np.array([True, True, False, False, False])
    # Counted degrees [1, 1, 0, 2, 0] (node 3's neighbours 0 and 1 are both counted); threshold 1.
    assert hub_factors(adjacency, 1, 1.0, counted).tolist() == [1.0, 1.0, 1.0, 0.5, 1.0]
    # Every neighbour: degrees [2, 2, 0, 2, 0].
    assert hub_factors(adjacency, 1, 1.0).tolist() == [0.5, 0.5, 1.0, 0.5, 1.0]
    # The exponent applies to the ratio: 0.5 ** 2.
    assert hub_factors(adjacency, 1, 2.0, counted).tolist() == [1.0, 1.0, 1.0, 0.25, 1.0]


@pytest.mark.parametrize("seed", range(6))
def test_scaled_equals_scipys_products_bit_for_bit(seed: int) -> None:
    """``_scaled`` (hub damping entry by entry) gives the very arrays of ``diag(left) @ m @ diag(right)`` in scipy,
    canonical: explicit zeros, a product that underflows to zero and a zero factor drop there as here; the rows
    of a larger matrix (an update's) and the whole of it (a build's) alike."""
    import scipy.sparse as sp

    from memory_recall.pipeline.diffusion import _scaled
    from memory_recall.store.csr import rows_of

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 80))
    m = sp.random(n, n, density=float(rng.uniform(0.02, 0.3)), random_state=seed, format="csr")
    full = sp.csr_array(m + m.T)
    full.sum_duplicates()
    full.data[rng.integers(0, full.nnz, size=max(1, full.nnz // 6))] = 0.0  # stored zeros
    full.data[0] = 1e-300  # times a tiny factor: zero
    factors = rng.uniform(0.01, 1.0, n)
    factors[int(rng.integers(0, n))] = 0.0
    factors[int(rng.integers(0, n))] = 1e-300
    for rows in (np.arange(n), np.sort(rng.choice(n, int(rng.integers(0, n)), replace=False))):
        sub = sp.csr_array(rows_of(full, rows.astype(np.int64)), dtype=np.float64)
        expected = sp.csr_array(sp.diags_array(factors[rows]) @ sub @ sp.diags_array(factors))
        expected.sum_duplicates()
        expected.sort_indices()
        got = _scaled(sub, factors[rows], factors)
        assert got is not None and got.has_canonical_format
        assert got.shape == expected.shape
        assert got.indptr.tolist() == expected.indptr.tolist()
        assert got.indices.tolist() == expected.indices.tolist()
        assert got.data.tobytes() == expected.data.tobytes()
        if rows.size == n:
            assert got.nnz < sub.nnz  # the zeros did drop


def test_scaled_declines_a_repeated_or_unsorted_row() -> None:
    """A row with a repeated column would be summed before its column factor by scipy (another rounding), and an
    unsorted row is not checked for repeats: ``None``, so the caller takes scipy's products."""
    import scipy.sparse as sp

    from memory_recall.pipeline.diffusion import _scaled

    ones = np.ones(3)
    repeated = sp.csr_array((np.array([1.0, 2.0]), np.array([1, 1]), np.array([0, 0, 2, 2])), shape=(3, 3))
    unsorted = sp.csr_array((np.array([1.0, 2.0]), np.array([2, 1]), np.array([0, 2, 2, 2])), shape=(3, 3))
    boundary = sp.csr_array((np.array([1.0, 2.0]), np.array([2, 0]), np.array([0, 1, 2, 2])), shape=(3, 3))
    assert _scaled(repeated, ones, ones) is None
    assert _scaled(unsorted, ones, ones) is None
    kept = _scaled(boundary, ones, ones)  # a lower column at the start of the next row is fine
    assert kept is not None and kept.indices.tolist() == [2, 0] and kept.data.tolist() == [1.0, 2.0]


def test_temporal_matrix_holds_scipys_entries_rows_in_order() -> None:
    """``_temporal_matrix`` holds what scipy's COO route holds (the same sums once canonical), rows in order and
    columns sorted, a ``low == high`` pair's entry twice; its rows added to a matrix give scipy's sum bit for bit."""
    import scipy.sparse as sp

    from memory_recall.pipeline.diffusion import _temporal_matrix

    r = np.array([3, 0, 2, 0, 2, 1], dtype=np.int64)
    c = np.array([1, 4, 2, 2, 2, 0], dtype=np.int64)  # (2, 2) twice: a pair of a node with itself
    got = _temporal_matrix(r, c, 4, 5, 0.3)
    assert got.indptr.tolist() == [0, 2, 3, 5, 6]
    assert got.indices.tolist() == [2, 4, 0, 2, 2, 1]
    assert got.data.tolist() == [0.3] * 6 and got.indices.dtype == got.indptr.dtype == np.int32
    coo = sp.csr_array((np.full(6, 0.3), (r, c)), shape=(4, 5))
    other = sp.csr_array(np.array([[0, 0, 0.7, 0, 0], [0.1, 0, 0, 0, 0], [0, 0, 0.2, 0, 0], [0, 0, 0, 0, 0.9]]))
    for x, y in ((coo, got), (other + coo, other + got)):
        x, y = sp.csr_array(x), sp.csr_array(y)
        for m in (x, y):
            m.sum_duplicates()
            m.sort_indices()
        assert (x.indptr.tolist(), x.indices.tolist(), x.data.tobytes()) == (
            y.indptr.tolist(), y.indices.tolist(), y.data.tobytes())
    assert _temporal_matrix(np.zeros(0), np.zeros(0), 2, 3, 2.0).indptr.tolist() == [0, 0, 0]


# -- updates after a delta ---------------------------------------------------------------------------------------

_CHAT = "upd"
_MODEL = "test-model"
#: Base settings the update must reproduce: the app's, hub damping counting messages or every neighbour (an
#: exponent other than 1), no temporal links.
_UPDATE_SETTINGS = (
    DiffusionSettings(),
    DiffusionSettings(hub_degree_threshold=2, hub_degree_counts="message"),
    DiffusionSettings(hub_degree_threshold=3, hub_exponent=2.0),
    NO_TEMPORAL,
)


def _store_node(i: int, *, prev: str | None = None, kind: str | None = None):
    from memory_recall.model.graph import Node

    kind = kind or ("message", "character", "event", "message", "location")[i % 5]
    return Node(
        id=f"n{i:03d}", type=kind, seq=i, importance=float(1 + i % 7), prev_id=prev,
        fields={"title": f"scene {i}", "name": f"Name{i % 4}"}, seq_range=(i, i + 1),
    )


def _store_edge(k: int, a: str, b: str, strength: float, *, inhibit: bool = False):
    from memory_recall.model.graph import Edge

    return Edge(id=f"e{k:03d}", from_id=a, to_id=b, strength=strength, edge_type=255 if inhibit else 0)


class _Chat:
    """A chat in a real store on a temporary SQLite file, its snapshots kept up to date by a ``SnapshotCache``."""

    def __init__(self, path) -> None:
        from memory_recall.store import Store
        from memory_recall.store.snapshot import SnapshotCache

        self.store = Store(path)
        self.cache = SnapshotCache()
        self.next = 0
        rng = np.random.default_rng(3)
        nodes = [self._new_node() for _ in range(16)]
        edges = []
        for k in range(30):
            a, b = rng.choice(16, size=2, replace=False).tolist()
            edges.append(_store_edge(k, nodes[a].id, nodes[b].id, float(rng.uniform(0.1, 1.0)), inhibit=k % 9 == 0))
        edges.append(_store_edge(30, nodes[0].id, nodes[1].id, 0.25))  # a parallel edge: summed
        with self.store.write(_CHAT) as w:
            w.upsert_nodes(nodes)
            w.upsert_edges(edges)

    def _new_node(self, kind: str | None = None):
        i, self.next = self.next, self.next + 1
        return _store_node(i, prev=f"n{i - 1:03d}" if i else None, kind=kind)

    def snapshot(self):
        return self.cache.get(self.store, _CHAT, _MODEL, now_ms=NOW)

    def fresh(self):
        from memory_recall.store.snapshot import build_snapshot

        return build_snapshot(self.store.snapshot_source(_CHAT, _MODEL), now_ms=NOW)

    def message(self, links: list[str], *, kind: str = "message") -> None:
        node = self._new_node(kind)
        with self.store.write(_CHAT) as w:
            w.upsert_nodes([node])
            w.upsert_edges([_store_edge(100 + self.next * 4 + j, node.id, other, 0.6, inhibit=j == 2)
                            for j, other in enumerate(links)])


def _same_adjacency(a, b) -> bool:
    return (
        a.synthetic_edge_count == b.synthetic_edge_count
        and all(
            type(x) is type(y) and x.shape == y.shape
            and all(getattr(x, k).dtype == getattr(y, k).dtype and getattr(x, k).tobytes() == getattr(y, k).tobytes()
                    for k in ("indptr", "indices", "data"))
            for x, y in ((a.normal, b.normal), (a.inhibit, b.inhibit))
        )
    )


def _check_against_fresh(chat: _Chat, hidden_of) -> list[bool]:
    """The adjacency of the chat's current snapshot (updated when possible) and a masked diffusion on it against a
    fresh build's, for every setting; returns whether each adjacency came from an update."""
    from memory_recall.pipeline.diffusion import _UPDATED_FROM

    snap, fresh = chat.snapshot(), chat.fresh()
    updated = []
    for s in _UPDATE_SETTINGS:
        base, _ = diffusion_adjacency(snap, s)
        built, _ = diffusion_adjacency(fresh, s)
        assert _same_adjacency(base, built), s
        updated.append(_UPDATED_FROM in base.derived)
        # A masked diffusion on the updated snapshot gives the fresh build's, bit for bit.
        hidden = hidden_of(snap)
        visible = np.flatnonzero(~hidden)[:3]
        seeds = Seeds(visible, np.linspace(1.0, 0.5, visible.size), {})
        got, want = diffuse(snap, seeds, s, hidden), diffuse(fresh, seeds, s, hidden.copy())
        assert got.index.tolist() == want.index.tolist() and got.energy.tobytes() == want.energy.tobytes(), s
    return updated


class TestAdjacencyUpdate:
    """After an appended-only delta the adjacency is derived from the parent structure's, equal to a fresh build
    array by array; any other delta builds it."""

    def test_new_messages_update_and_equal_a_build(self, tmp_path) -> None:
        chat = _Chat(tmp_path / "store.sqlite3")

        def hidden_of(snap):
            mask = np.zeros(snap.n, dtype=bool)
            mask[[snap.index["n002"], snap.index["n007"]]] = True
            mask[snap.n - 1] = snap.n > 16  # the newest node too (it flips from visible to hidden and back)
            return mask

        assert _check_against_fresh(chat, hidden_of) == [False] * 4  # nothing to update from yet
        links = ([], ["n003"], ["n001", "n004", "n009"], ["n000"], ["n001", "n002"])
        for step, targets in enumerate(links):
            chat.message(targets, kind="message" if step % 2 else "event")
            change = chat.snapshot().structure.change
            assert change is not None and change.appended_only
            assert _check_against_fresh(chat, hidden_of) == [True] * 4, step
        # Edges alone (between old nodes, one of them inhibit): no node appended, old rows change.
        with chat.store.write(_CHAT) as w:
            w.upsert_edges([_store_edge(900, "n002", "n011", 0.7), _store_edge(901, "n005", "n013", 0.4, inhibit=True)])
        change = chat.snapshot().structure.change
        assert change is not None and change.appended_only and change.n_new == change.n_old
        assert _check_against_fresh(chat, hidden_of) == [True] * 4

    def test_updated_rows_only_are_new(self, tmp_path) -> None:
        chat = _Chat(tmp_path / "store.sqlite3")
        before, _ = diffusion_adjacency(chat.snapshot(), DiffusionSettings())
        chat.message(["n005"])
        after, _ = diffusion_adjacency(chat.snapshot(), DiffusionSettings())
        from memory_recall.pipeline.diffusion import _UPDATED_FROM

        rows, _ = after.derived[_UPDATED_FROM]
        snap = chat.snapshot()
        assert set(rows.tolist()) >= {snap.index["n005"], snap.index[f"n{chat.next - 1:03d}"]}
        assert rows.size < snap.n // 2

    def test_a_delete_drops_the_rows_and_updates_and_an_archive_builds(self, tmp_path) -> None:
        """A deleted node: the parent's adjacency on the kept rows, with the rows of its neighbours (their hub
        factors move with their degree, and with them their neighbours' rows) and temporal partners derived again,
        equals a fresh build for every setting; so does a deletion in the middle with a parallel edge's end. An
        archived node's edges leave the adjacency: that builds."""
        from memory_recall.pipeline.diffusion import _UPDATED_FROM

        chat = _Chat(tmp_path / "store.sqlite3")

        def hidden_of(snap):
            mask = np.zeros(snap.n, dtype=bool)
            mask[0] = True
            return mask

        _check_against_fresh(chat, hidden_of)
        for gone in ("n004", "n015", "n008"):
            with chat.store.write(_CHAT) as w:
                w.delete_nodes([gone])
            change = chat.snapshot().structure.change
            assert change is not None and not change.appended_only and change.via is not None, gone
            assert _check_against_fresh(chat, hidden_of) == [True] * 4, gone
        old = chat.store.get_node(_CHAT, "n006")
        assert old is not None
        with chat.store.write(_CHAT) as w:
            w.upsert_nodes([old.model_copy(update={"archived": True})])  # its edges leave the adjacency
        assert _check_against_fresh(chat, hidden_of) == [False] * 4
        chat.message(["n001"])
        assert _check_against_fresh(chat, hidden_of) == [True] * 4
        assert all(_UPDATED_FROM in diffusion_adjacency(chat.snapshot(), s)[0].derived for s in _UPDATE_SETTINGS)

    def test_a_retyped_node_changes_its_neighbours_hub_factors(self, tmp_path) -> None:
        chat = _Chat(tmp_path / "store.sqlite3")
        hub = DiffusionSettings(hub_degree_threshold=1, hub_degree_counts="message")
        snap = chat.snapshot()
        diffusion_adjacency(snap, hub)
        old = chat.store.get_node(_CHAT, "n003")  # a message linked to others
        assert old is not None and old.type == "message"
        with chat.store.write(_CHAT) as w:
            w.upsert_nodes([old.model_copy(update={"type": "event"})])
        new = chat.snapshot()
        change = new.structure.change
        assert change is not None
        adj, _ = diffusion_adjacency(new, hub)
        built, _ = diffusion_adjacency(chat.fresh(), hub)
        assert _same_adjacency(adj, built)
