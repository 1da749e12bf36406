"""Diffusion kernel: reference §3.9 worked example, scenarios 11–14 and 21 (duplicate seeds), inhibit,
top-k pruning and ties, determinism, and a differential test against the plain-Python transliteration."""

from __future__ import annotations

import numpy as np
import pytest

from memory_recall.pipeline.kernels import INHIBIT_EDGE_TYPE, build_adjacency, propagate, rank
from memory_recall.pipeline.kernels.diffusion import (
    _reference_build_adjacency,
    _reference_propagate,
    _reference_rank,
)

A, B, C, D, X = range(5)
NAMES = ["A", "B", "C", "D", "X"]


def _example_adjacency():
    # Reference §3.9 worked example / scenario 11: A–B 1.0, B–C 0.5, C–D 1.0, A–X 0.8 inhibit.
    return build_adjacency(5, [A, B, C, A], [B, C, D, X], [1.0, 0.5, 1.0, 0.8], [False, False, False, True])


def _as_dict(idx: np.ndarray, energy: np.ndarray, names: list[str] | None = None) -> dict:
    return {(names[i] if names else int(i)): float(e) for i, e in zip(idx, energy, strict=True)}


class TestWorkedExample:
    def test_scenario_11_alpha_0_raw_map_and_ranking(self) -> None:
        idx, energy = propagate(_example_adjacency(), [A], [1.0])
        expected = {"A": 1.0, "B": 0.6, "C": 0.18, "X": -0.96}
        assert _as_dict(idx, energy, NAMES) == pytest.approx(expected, abs=1e-12)
        r_idx, r_energy = rank(idx, energy)
        assert r_idx.tolist() == [A, B, C]  # X inhibited (dropped), D unreached in 2 steps
        assert r_energy.tolist() == pytest.approx([1.0, 0.6, 0.18], abs=1e-12)

    def test_scenario_11_alpha_015(self) -> None:
        idx, energy = propagate(_example_adjacency(), [A], [1.0], teleport_alpha=0.15)
        assert _as_dict(idx, energy, NAMES) == pytest.approx(
            {"A": 1.0, "B": 0.51, "C": 0.13005, "X": -0.96}, abs=1e-12
        )
        assert rank(idx, energy)[0].tolist() == [A, B, C]

    def test_scenario_11_seed_2_alpha_015(self) -> None:
        idx, energy = propagate(_example_adjacency(), [A], [2.0], teleport_alpha=0.15)
        got = _as_dict(idx, energy, NAMES)
        assert got == pytest.approx({"A": 2.0, "B": 1.02, "C": 0.2601, "X": -1.92}, abs=1e-12)

    def test_scenario_11_matches_reference_transliteration(self) -> None:
        inhibit = INHIBIT_EDGE_TYPE
        edges = [("A", "B", 1.0, 0), ("B", "C", 0.5, 0), ("C", "D", 1.0, 0), ("A", "X", 0.8, inhibit)]
        lists, _ = _reference_build_adjacency(NAMES, edges)
        for alpha, seed in ((0.0, 1.0), (0.15, 1.0), (0.15, 2.0)):
            ref = _reference_propagate(lists, [("A", seed)], teleport_alpha=alpha)
            idx, energy = propagate(_example_adjacency(), [A], [seed], teleport_alpha=alpha)
            assert _as_dict(idx, energy, NAMES) == pytest.approx(ref, abs=1e-12)


class TestSeeds:
    def test_scenario_21_duplicate_seeds_one_step(self) -> None:
        # One step from [(E2, 1.0), (E2, 0.5)] over E2–C 1.0, α 0 → E2 1.5, C 0.9.
        e2, c = 0, 1
        adj = build_adjacency(2, [e2], [c], [1.0])
        got = _as_dict(*propagate(adj, [e2, e2], [1.0, 0.5], max_steps=1))
        assert got == pytest.approx({e2: 1.5, c: 0.9}, abs=1e-15)
        ref = _reference_propagate({"E2": [("C", 1.0, 0)], "C": [("E2", 1.0, 0)]}, [("E2", 1.0), ("E2", 0.5)],
                                   max_steps=1)
        assert ref == pytest.approx({"E2": 1.5, "C": 0.9}, abs=1e-15)

    def test_scenario_12_duplicate_seeds_are_summed(self) -> None:
        adj = _example_adjacency()
        dup = propagate(adj, [B, B], [1.0, 0.5], teleport_alpha=0.15)
        single = propagate(adj, [B], [1.5], teleport_alpha=0.15)
        assert dup[0].tolist() == single[0].tolist()
        assert dup[1].tolist() == single[1].tolist()

    def test_seed_sum_clamps_after_each_addition(self) -> None:
        # 2 + 2 clamps to 2, then −2 gives 0 (incremental clamp, reference step 1), not clamp(2) = 2.
        adj = build_adjacency(2, [0], [1], [1.0])
        idx, energy = propagate(adj, [0, 0, 0], [2.0, 2.0, -2.0], max_steps=0)
        assert _as_dict(idx, energy) == {0: 0.0}
        lists = {"0": [("1", 1.0, 0)], "1": [("0", 1.0, 0)]}
        ref = _reference_propagate(lists, [("0", 2.0), ("0", 2.0), ("0", -2.0)])
        assert ref == {"0": 0.0}

    def test_tiny_seeds_are_ignored_and_large_ones_clamped(self) -> None:
        adj = build_adjacency(3, [0, 1], [1, 2], [1.0, 1.0])
        idx, energy = propagate(adj, [0, 2], [5.0, 0.005], max_steps=0)
        assert _as_dict(idx, energy) == {0: 2.0}

    def test_no_seeds_gives_empty_result(self) -> None:
        idx, energy = propagate(_example_adjacency(), [], [])
        assert idx.size == 0 and energy.size == 0

    def test_seed_out_of_range_raises(self) -> None:
        with pytest.raises(ValueError, match="seed_idx"):
            propagate(_example_adjacency(), [7], [1.0])


class TestInhibit:
    def test_inhibit_ignores_teleport_factor_and_uses_abs_energy(self) -> None:
        adj = build_adjacency(2, [0], [1], [0.5], [True])
        for alpha in (0.0, 0.5, 1.0):
            idx, energy = propagate(adj, [0], [-1.0], max_steps=1, teleport_alpha=alpha)
            # −|e|·w·decay·multiplier = −1·0.5·0.6·2, whatever α and the seed's sign.
            assert _as_dict(idx, energy)[1] == pytest.approx(-0.6, abs=1e-15)

    def test_inhibited_node_vanishes_from_ranking(self) -> None:
        idx, energy = propagate(_example_adjacency(), [A], [1.0])
        assert X in idx.tolist()
        assert X not in rank(idx, energy)[0].tolist()

    def test_strongest_value_over_steps_keeps_negative_when_larger(self) -> None:
        # Node 1 gets +0.3 at step 1 (0.5·0.6), then −0.72 at step 2 via the inhibit edge 2–1 (0.6·1·0.6·2).
        adj = build_adjacency(3, [0, 0, 2], [1, 2, 1], [0.5, 1.0, 1.0], [False, False, True])
        idx, energy = propagate(adj, [0], [1.0])
        assert _as_dict(idx, energy)[1] == pytest.approx(-0.72, abs=1e-12)


class TestAdjacency:
    def test_scenario_13_temporal_adjacency(self) -> None:
        e1, e2, c = 0, 1, 2
        # Active edges only (the invalidated E1–C 0.4 is filtered by the caller): E2–C 0.9, E1–C 0.7.
        adj = build_adjacency(3, [e2, e1], [c, c], [0.9, 0.7], temporal_pairs=[(e1, e2), (e2, e1)])
        row = adj.normal.toarray()[e1]
        assert row[c] == pytest.approx(0.7) and row[e2] == pytest.approx(0.2)
        assert adj.synthetic_edge_count == 1
        idx, energy = rank(*propagate(adj, [e2], [1.0], teleport_alpha=0.15))
        assert set(idx.tolist()) == {e1, e2, c}
        assert energy.min() > 0

    def test_scenario_14_departure_zero_temporal_strength_adds_no_links(self) -> None:
        # Reference quirk (§7 item 13): 0 became 0.2. Here 0 means no links.
        adj = build_adjacency(2, [], [], [], [], temporal_pairs=[(0, 1)], temporal_strength=0.0)
        assert adj.synthetic_edge_count == 0 and adj.normal.nnz == 0
        none = build_adjacency(2, [], [], [], [], temporal_pairs=None)
        assert none.synthetic_edge_count == 0 and none.normal.nnz == 0

    def test_temporal_strength_clamped_to_one(self) -> None:
        adj = build_adjacency(2, [], [], [], [], temporal_pairs=[(0, 1)], temporal_strength=3.0)
        assert adj.normal.toarray()[0, 1] == 1.0

    def test_parallel_edges_both_contribute(self) -> None:
        adj = build_adjacency(2, [0, 1], [1, 0], [0.5, 0.3], [False, False])
        assert adj.normal.toarray()[0, 1] == pytest.approx(0.8)
        idx, energy = propagate(adj, [0], [1.0], max_steps=1)
        assert _as_dict(idx, energy)[1] == pytest.approx(0.48, abs=1e-15)

    def test_inhibit_and_normal_matrices_are_separate_and_symmetric(self) -> None:
        adj = _example_adjacency()
        assert adj.inhibit.toarray()[A, X] == adj.inhibit.toarray()[X, A] == pytest.approx(0.8)
        assert adj.normal.toarray()[A, X] == 0.0
        assert (adj.normal != adj.normal.T).nnz == 0

    def test_bad_lengths_and_indices_raise(self) -> None:
        with pytest.raises(ValueError, match="same length"):
            build_adjacency(3, [0, 1], [1], [1.0], [False])
        with pytest.raises(ValueError, match="'dst'"):
            build_adjacency(3, [0], [3], [1.0], [False])


class TestTopK:
    def test_pruning_keeps_strongest_and_stops_their_spread(self) -> None:
        # Star 0 → leaves 1..5 with weights .1 .. .5; each leaf i has a private tail node 5+i.
        leaves = [1, 2, 3, 4, 5]
        src = [0] * 5 + leaves
        dst = leaves + [6, 7, 8, 9, 10]
        w = [0.1, 0.2, 0.3, 0.4, 0.5] + [1.0] * 5
        adj = build_adjacency(11, src, dst, w)
        got = _as_dict(*propagate(adj, [0], [1.0], top_k=2))
        # Step 1 keeps leaves 5 (0.3) and 4 (0.24); step 2 keeps tail 10 (0.18) and the echo back to the
        # seed (0.09 + 0.0576), so tail 9 (0.144) is pruned as well.
        assert set(got) == {0, 4, 5, 10}
        assert [got[5], got[4], got[10]] == pytest.approx([0.3, 0.24, 0.18])

    def test_ties_at_cut_break_by_index_not_insertion(self) -> None:
        # Equal weights; edges inserted leaf 3 first. Reference stable sort keeps insertion order (3, 2);
        # the kernel keeps the lowest indices (1, 2): documented departure (ties by node id).
        adj = build_adjacency(4, [0, 0, 0], [3, 2, 1], [0.5, 0.5, 0.5])
        got = _as_dict(*propagate(adj, [0], [1.0], max_steps=1, top_k=2))
        assert sorted(got) == [0, 1, 2]
        lists, _ = _reference_build_adjacency(["0", "1", "2", "3"], [("0", "3", 0.5, 0), ("0", "2", 0.5, 0),
                                                                       ("0", "1", 0.5, 0)])
        ref = _reference_propagate(lists, [("0", 1.0)], max_steps=1, top_k=2)
        assert sorted(ref) == ["0", "2", "3"]
        ref_by_id = _reference_propagate(lists, [("0", 1.0)], max_steps=1, top_k=2, tie_key=int)
        assert sorted(ref_by_id) == ["0", "1", "2"]

    def test_ties_straddling_the_cut_keep_the_lowest_indices_above_stronger_ones(self) -> None:
        # Step 1 reaches 1 (0.6·0.9), 2..4 (0.6·0.5 each) and 5 (0.6·0.1): top_k=3 keeps 1, then the two
        # lowest-index nodes of the tie at the cut (2, 3); 4 and 5 are pruned.
        adj = build_adjacency(6, [0, 0, 0, 0, 0], [4, 3, 1, 2, 5], [0.5, 0.5, 0.9, 0.5, 0.1])
        got = _as_dict(*propagate(adj, [0], [1.0], max_steps=1, top_k=3))
        assert sorted(got) == [0, 1, 2, 3]

    def test_top_k_zero_keeps_only_the_seeds(self) -> None:
        adj = build_adjacency(3, [0, 1], [1, 2], [1.0, 0.5])
        idx, energy = propagate(adj, [0], [1.0], top_k=0, teleport_alpha=0.15)
        assert idx.tolist() == [0] and energy.tolist() == [1.0]

    def test_clamp_limits_energy(self) -> None:
        adj = build_adjacency(3, [0, 1], [2, 2], [1.0, 1.0])
        got = _as_dict(*propagate(adj, [0, 1], [2.0, 2.0], max_steps=1, decay=1.0))
        assert got[2] == 2.0


class TestTeleportAndStackedRows:
    def test_unreached_seed_is_reinjected_with_min_energy_zero(self) -> None:
        # Seed 2 has no edge, so no step reaches it: with min_energy 0 its re-injected value α·e0 is kept at
        # every step (the reference blends "next.get(s, 0)"), and zero-valued nodes never count as touched.
        adj = build_adjacency(4, [0], [1], [0.5], [False])
        idx, energy = propagate(adj, [0, 2], [1.0, 0.8], teleport_alpha=0.25, min_energy=0.0, max_steps=2)
        lists, _ = _reference_build_adjacency(["0", "1", "2", "3"], [("0", "1", 0.5, 0)])
        ref = _reference_propagate(lists, [("0", 1.0), ("2", 0.8)], teleport_alpha=0.25, min_energy=0.0,
                                   max_steps=2, tie_key=int)
        assert _as_dict(idx, energy) == pytest.approx({int(k): v for k, v in ref.items()}, abs=0)
        assert idx.tolist() == [0, 1, 2]
        # Step 1: node 1 = 0.6·0.75·0.5 = 0.225; seed 0 re-injected as 0.25 (weaker than its 1.0); seed 2
        # as 0.2 (weaker than 0.8). Step 2: node 1 echoes nothing new above 0.225.
        assert energy.tolist() == pytest.approx([1.0, 0.225, 0.8])

    def test_stacked_rows_hold_the_normal_then_the_inhibit_rows(self) -> None:
        adj = build_adjacency(4, [0, 1, 0, 2], [1, 2, 3, 3], [0.5, 0.25, 0.75, 0.4], [False, False, True, False])
        propagate(adj, [0], [1.0])
        rows = adj.derived["propagate-stacked-rows"]
        propagate(adj, [1], [1.0])
        assert adj.derived["propagate-stacked-rows"] is rows  # built once per adjacency
        for r in range(8):
            mat, row = (adj.normal, r) if r < 4 else (adj.inhibit, r - 4)
            lo, hi = int(rows.starts[r]), int(rows.starts[r] + rows.lengths[r])
            assert rows.indices[lo:hi].tolist() == mat.indices[mat.indptr[row] : mat.indptr[row + 1]].tolist()
            assert rows.data[lo:hi].tolist() == mat.data[mat.indptr[row] : mat.indptr[row + 1]].tolist()

    def test_unsorted_duplicated_seeds_match_sorted_input(self) -> None:
        rng = np.random.default_rng(3)
        n = 60
        src, dst = rng.integers(0, n, 200), rng.integers(0, n, 200)
        adj = build_adjacency(n, src, dst, rng.uniform(0.1, 1, 200), rng.random(200) < 0.2)
        seeds = np.array([7, 3, 7, 50, 3, 7])
        energies = np.array([0.9, 0.4, 1.5, 0.3, -0.1, 0.2])
        # Per node, in input order with a clamp after each addition: 7 → 0.9+1.5 → 2 → 2.2 → 2; 3 → 0.3.
        order = np.argsort(seeds, kind="stable")
        a = propagate(adj, seeds, energies, teleport_alpha=0.15, top_k=10)
        b = propagate(adj, seeds[order], energies[order], teleport_alpha=0.15, top_k=10)
        assert a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes()
        assert _as_dict(*propagate(adj, seeds, energies, max_steps=0)) == pytest.approx({3: 0.3, 7: 2.0, 50: 0.3})


class TestRankAndDeterminism:
    def test_rank_ties_break_by_order_key(self) -> None:
        idx = np.array([0, 1, 2, 3])
        energy = np.array([0.5, 0.5, -1.0, 0.7])
        order_key = np.array([3, 1, 0, 2])  # node 1's id sorts before node 0's
        r_idx, r_e = rank(idx, energy, order_key)
        assert r_idx.tolist() == [3, 1, 0] and r_e.tolist() == [0.7, 0.5, 0.5]
        ref = _reference_rank({"n0": 0.5, "n1": 0.5, "n2": -1.0, "n3": 0.7},
                              tie_key=lambda s: int(order_key[int(s[1:])]))
        assert [k for k, _ in ref] == ["n3", "n1", "n0"]

    def test_reference_rank_default_is_byte_order(self) -> None:
        assert [k for k, _ in _reference_rank({"é": 0.5, "z": 0.5, "a": 0.5})] == ["a", "z", "é"]

    def test_deterministic_and_inputs_not_mutated(self) -> None:
        rng = np.random.default_rng(7)
        n = 200
        src, dst = rng.integers(0, n, 800), rng.integers(0, n, 800)
        strength, inh = rng.uniform(0.05, 1, 800), rng.random(800) < 0.1
        copies = [a.copy() for a in (src, dst, strength, inh)]
        adj = build_adjacency(n, src, dst, strength, inh)
        seeds, energies = rng.integers(0, n, 10), rng.uniform(0, 2, 10)
        seeds_copy, energies_copy = seeds.copy(), energies.copy()
        first = propagate(adj, seeds, energies, teleport_alpha=0.15, top_k=20)
        second = propagate(adj, seeds, energies, teleport_alpha=0.15, top_k=20)
        assert first[0].tolist() == second[0].tolist() and first[1].tolist() == second[1].tolist()
        for orig, copy in zip((src, dst, strength, inh), copies, strict=True):
            assert np.array_equal(orig, copy)
        assert np.array_equal(seeds, seeds_copy) and np.array_equal(energies, energies_copy)


def _random_case(rng: np.random.Generator):
    n = int(rng.integers(2, 40))
    m = int(rng.integers(0, 3 * n + 1))
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    keep = src != dst  # the reference graph never holds self-loops
    src, dst = src[keep], dst[keep]
    if src.size and rng.random() < 0.5:  # parallel edges, sometimes reversed
        dup = rng.integers(0, src.size, max(1, src.size // 4))
        flip = rng.random(dup.size) < 0.5
        src, dst = (np.concatenate([src, np.where(flip, dst[dup], src[dup])]),
                    np.concatenate([dst, np.where(flip, src[dup], dst[dup])]))
    strength = rng.uniform(0.05, 1.0, src.size)
    inhibit = rng.random(src.size) < 0.2
    pairs = None
    if rng.random() < 0.6:
        chain = rng.permutation(n)
        pairs = np.stack([chain[:-1], chain[1:]], axis=1)
        pairs = np.concatenate([pairs, pairs[:, ::-1]])  # prev and next both list the pair
    t_strength = float(rng.choice([0.0, 0.2, 0.5, rng.uniform(0, 1)]))
    n_seeds = int(rng.integers(1, 7))
    seeds = rng.integers(0, n, n_seeds)
    energies = np.where(rng.random(n_seeds) < 0.3, 2.0, rng.uniform(-0.5, 1.5, n_seeds))
    if rng.random() < 0.2:
        energies[0] = 0.004  # below min energy: ignored
    alpha = float(rng.choice([0.0, 0.15, 1.0, rng.uniform(0, 1)]))
    top_k = int(rng.integers(1, 8))
    steps = int(rng.integers(1, 5))
    return n, src, dst, strength, inhibit, pairs, t_strength, seeds, energies, alpha, top_k, steps


def test_differential_random_graphs_match_reference_transliteration() -> None:
    """240 random graphs (inhibit edges, temporal pairs, parallel edges, α ∈ [0, 1], small top_k).

    The kernel is compared with the transliteration using the same tie-break (node index) within 1e-9 on
    every case. Against the reference's own stable insertion-order tie-break it is compared only where the
    two tie-breaks give the same map, i.e. no |value| tie straddles a top-k cut (ties do happen: energies
    clamp to exactly ±2); at least half of the cases must be such unambiguous ones.
    """
    rng = np.random.default_rng(20240611)
    unambiguous = 0
    cases = 240
    for case in range(cases):
        (n, src, dst, strength, inhibit, pairs, t_strength, seeds, energies, alpha, top_k,
         steps) = _random_case(rng)
        ids = [f"n{i:03d}" for i in range(n)]
        adj = build_adjacency(n, src, dst, strength, inhibit, pairs, t_strength)
        edges = [
            (ids[s], ids[d], float(w), INHIBIT_EDGE_TYPE if inh else 0)
            for s, d, w, inh in zip(src, dst, strength, inhibit, strict=True)
        ]
        tpairs = [] if pairs is None else [(ids[a], ids[b]) for a, b in pairs]
        lists, synthetic = _reference_build_adjacency(ids, edges, tpairs, t_strength)
        assert synthetic == adj.synthetic_edge_count, case
        seed_list = [(ids[s], float(e)) for s, e in zip(seeds, energies, strict=True)]
        kwargs = dict(max_steps=steps, top_k=top_k, teleport_alpha=alpha)
        idx, energy = propagate(adj, seeds, energies, **kwargs)
        got = {ids[i]: float(e) for i, e in zip(idx, energy, strict=True)}
        ref_by_id = _reference_propagate(lists, seed_list, tie_key=lambda s: int(s[1:]), **kwargs)
        assert got.keys() == ref_by_id.keys(), case
        assert got == pytest.approx(ref_by_id, abs=1e-9), case
        ref = _reference_propagate(lists, seed_list, **kwargs)
        if ref.keys() == ref_by_id.keys() and ref == pytest.approx(ref_by_id, abs=1e-12):
            unambiguous += 1
            assert got == pytest.approx(ref, abs=1e-9), case
        order_key = np.arange(n)
        assert [ids[i] for i in rank(idx, energy, order_key)[0]] == [
            k for k, _ in _reference_rank(ref_by_id, tie_key=lambda s: int(s[1:]))
        ], case
    assert unambiguous >= cases // 2


def test_differential_min_energy_and_duplicate_seeds_match_reference_transliteration() -> None:
    """120 more random graphs with ``min_energy`` ∈ {0, 0.01, 0.2} and repeated, unsorted seeds (same
    node-index tie-break as the kernel), within 1e-9."""
    rng = np.random.default_rng(20261201)
    for case in range(120):
        (n, src, dst, strength, inhibit, pairs, t_strength, seeds, energies, alpha, top_k,
         steps) = _random_case(rng)
        seeds = np.concatenate([seeds, seeds[::-1]])
        energies = np.concatenate([energies, rng.uniform(-0.5, 1.0, energies.size)])
        min_energy = float(rng.choice([0.0, 0.01, 0.2]))
        ids = [f"n{i:03d}" for i in range(n)]
        adj = build_adjacency(n, src, dst, strength, inhibit, pairs, t_strength)
        edges = [
            (ids[s], ids[d], float(w), INHIBIT_EDGE_TYPE if inh else 0)
            for s, d, w, inh in zip(src, dst, strength, inhibit, strict=True)
        ]
        tpairs = [] if pairs is None else [(ids[a], ids[b]) for a, b in pairs]
        lists, _ = _reference_build_adjacency(ids, edges, tpairs, t_strength)
        kwargs = dict(max_steps=steps, top_k=top_k, teleport_alpha=alpha, min_energy=min_energy)
        idx, energy = propagate(adj, seeds, energies, **kwargs)
        got = {ids[i]: float(e) for i, e in zip(idx, energy, strict=True)}
        seed_list = [(ids[s], float(e)) for s, e in zip(seeds, energies, strict=True)]
        ref = _reference_propagate(lists, seed_list, tie_key=lambda s: int(s[1:]), **kwargs)
        assert got.keys() == ref.keys(), case
        assert got == pytest.approx(ref, abs=1e-9), case


def _zeroed(mat, keep: np.ndarray):
    """``D·mat·D`` with ``D = diag(keep)``, stored zeros dropped: the matrix a hidden mask stands for."""
    import scipy.sparse as sp

    d = sp.diags_array(keep.astype(np.float64))
    out = sp.csr_array(d @ mat @ d)
    out.eliminate_zeros()
    out.sort_indices()
    return out


def test_hidden_mask_equals_propagating_on_the_zeroed_matrix_bit_for_bit() -> None:
    """240 random graphs and masks (stored zero weights included): ``propagate(adj, hidden=mask)`` gives exactly,
    bit for bit and in the same order, what propagating on the adjacency with the hidden rows and columns zeroed
    gives (the matrix the diffusion stage built per mask before). Seeds are visible (the stage drops hidden ones);
    a hidden seed relays nothing either."""
    from memory_recall.pipeline.kernels.diffusion import Adjacency

    rng = np.random.default_rng(20261202)
    differs = 0
    for case in range(240):
        (n, src, dst, strength, inhibit, pairs, t_strength, seeds, energies, alpha, top_k,
         steps) = _random_case(rng)
        if strength.size and rng.random() < 0.3:
            strength[rng.integers(0, strength.size, max(1, strength.size // 5))] = 0.0  # stored zeros
        adj = build_adjacency(n, src, dst, strength, inhibit, pairs, t_strength)
        hidden = rng.random(n) < rng.choice([0.0, 0.1, 0.3, 0.6])
        if rng.random() < 0.8:
            hidden[seeds] = False
        kwargs = dict(max_steps=steps, top_k=top_k, teleport_alpha=alpha, min_energy=float(rng.choice([0.01, 0.0])))
        idx, energy = propagate(adj, seeds, energies, hidden=hidden, **kwargs)
        if hidden.any():
            keep = ~hidden
            zeroed = Adjacency(_zeroed(adj.normal, keep), _zeroed(adj.inhibit, keep), adj.synthetic_edge_count)
        else:
            zeroed = adj
        ref_idx, ref_energy = propagate(zeroed, seeds, energies, **kwargs)
        assert idx.tolist() == ref_idx.tolist(), case
        assert energy.tobytes() == ref_energy.tobytes(), case
        plain_idx, _ = propagate(adj, seeds, energies, **kwargs)
        differs += plain_idx.tolist() != idx.tolist()
    assert differs >= 40  # the masks did change results


def test_hidden_mask_shape_is_checked() -> None:
    with pytest.raises(ValueError, match=r"hidden must have shape \(5,\)"):
        propagate(_example_adjacency(), [A], [1.0], hidden=np.zeros(4, dtype=bool))
