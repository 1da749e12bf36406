"""VisibilityStage: active node set and the legacy visibility filter (reference §3.2, recall-spec departure
2)."""

from __future__ import annotations

import numpy as np
import pytest
from ctx_helpers import assert_not_mutated, edge, make_state, node, result_image, snapshot

from memory_recall.pipeline.visibility import HIDDEN_MASK_KEY, VisibilityStage, visibility_hidden
from memory_recall.settings import VisibilitySettings

STAGE = VisibilityStage(VisibilitySettings())


class TestActiveSet:
    def test_non_archived_with_finite_range(self):
        snap = snapshot(
            [
                node("a"),
                node("b", archived=True),
                node("c", "event", seq_range=None),  # core node without a range: never a candidate
                node("d", seq=4, seq_range=(2, 4)),
            ]
        )
        res = STAGE.run(make_state(snap, "x"))
        assert res.state.active.tolist() == [True, False, False, True]
        assert res.state.meta["activeNodeCount"] == 2
        assert res.state.meta["visibilityHidden"] == []
        assert not res.state.meta[HIDDEN_MASK_KEY].any()
        assert (res.trace.count_in, res.trace.count_out, res.trace.skipped) == (4, 2, False)


class TestScenario38:
    def test_scenario_38_hidden_vault_is_excluded(self):
        """Scenario 38 with departure 2: ``activeNodeCount 1`` and the hidden Vault is marked hidden so
        diffusion
        cannot bring it back (the reference selected ``[Alice, Vault]``; the fixed port filters it)."""
        snap = snapshot(
            [node("alice", name="Alice"), node("vault", "location", name="Vault", visibility="Bob")],
            [edge("alice", "vault", 0.9)],
        )
        res = STAGE.run(make_state(snap, "Where is Alice", visibility_filter="Alice"))
        assert res.state.active.tolist() == [True, False]
        assert res.state.meta["activeNodeCount"] == 1
        assert res.state.meta["visibilityHidden"] == ["vault"]
        assert res.state.meta[HIDDEN_MASK_KEY].tolist() == [False, True]


class TestFilter:
    @pytest.mark.parametrize(
        ("visibility", "kept"),
        [
            (["Alice", "Bob"], True),
            (["*"], True),
            (["Bob"], False),
            ("Bob, Alice", True),
            ("Bob,Carol", False),
            ("alice", False),  # exact, case-sensitive (reference)
            ([], False),  # a list naming nobody (JS: ``[]`` is truthy, so it is a list that lacks the name)
            ("", True),  # an empty string is "no visibility field"
        ],
    )
    def test_names(self, visibility, kept):
        snap = snapshot([node("n", visibility=visibility)])
        res = STAGE.run(make_state(snap, "x", visibility_filter="Alice"))
        assert bool(res.state.active[0]) is kept

    def test_disabled_or_no_filter_keeps_everything(self):
        snap = snapshot([node("n", visibility="Bob")])
        off = VisibilityStage(VisibilitySettings(enabled=False)).run(
            make_state(snap, "x", visibility_filter="A")
        )
        assert off.state.active.tolist() == [True]
        blank = STAGE.run(make_state(snap, "x", visibility_filter="  "))
        assert blank.state.active.tolist() == [True]
        assert blank.trace.notes["filterApplied"] is False

    def test_hidden_mask_covers_core_nodes_without_range(self):
        """Core nodes are not in ``active`` (no finite range) but must still obey the filter (departure 2)."""
        snap = snapshot(
            [
                node("ev", "event", seq_range=None, visibility="Bob"),
                node("ev2", "event", seq_range=None),
                node("old", archived=True, visibility="Bob"),
            ]
        )
        res = STAGE.run(make_state(snap, "x", visibility_filter="Alice"))
        assert res.state.meta[HIDDEN_MASK_KEY].tolist() == [True, False, False]  # archived: invisible anyway
        assert res.state.meta["visibilityHidden"] == ["ev"]

    def test_hidden_ids_in_byte_order(self):
        ids = ["b", "a", "Z", "é"]
        snap = snapshot([node(i, visibility="Bob") for i in ids])
        res = STAGE.run(make_state(snap, "x", visibility_filter="Alice"))
        assert res.state.meta["visibilityHidden"] == sorted(ids, key=lambda s: s.encode())

    def test_helper_matches_stage(self):
        snap = snapshot([node("a", visibility="Bob"), node("b"), node("c", visibility=["Alice"])])
        assert visibility_hidden(snap, "Alice").tolist() == [True, False, False]
        assert not visibility_hidden(snap, "").any()


class TestEmpty:
    def test_scenario_24_empty_graph_no_active_nodes(self):
        res = STAGE.run(make_state(snapshot(), "x"))
        assert res.trace.skipped and res.trace.skip_reason == "no-active-nodes"
        assert res.state.skip_reasons == ("no-active-nodes",)
        assert res.state.meta["activeNodeCount"] == 0
        assert res.state.active.shape == (0,)

    def test_scenario_24_no_finite_range_writes_a_full_length_mask(self):
        snap = snapshot([node("a", archived=True), node("b", seq_range=None)])
        res = STAGE.run(make_state(snap, "x"))
        assert res.trace.skip_reason == "no-active-nodes"
        assert res.state.active.tolist() == [False, False]


class TestContract:
    def test_input_not_mutated(self):
        snap = snapshot([node("a", visibility="Bob"), node("b")])
        assert_not_mutated(make_state(snap, "x", visibility_filter="Alice"), STAGE.run)

    def test_deterministic(self):
        snap = snapshot([node(f"n{i}", visibility="Bob" if i % 2 else "*") for i in range(20)])
        state = make_state(snap, "x", visibility_filter="Alice")
        assert result_image(STAGE.run(state)) == result_image(STAGE.run(state))

    def test_mask_is_a_new_array(self):
        snap = snapshot([node("a")])
        res = STAGE.run(make_state(snap, "x"))
        assert not np.shares_memory(res.state.active, snap.archived)
