"""VisibilityStage: active node set and the legacy visibility filter (reference §3.2, recall-spec departure
2)."""

from __future__ import annotations

import numpy as np
import pytest
from ctx_helpers import (
    MODEL,
    NOW,
    CountingEmbedder,
    assert_not_mutated,
    edge,
    make_state,
    node,
    result_image,
    snapshot,
)

from memory_recall.pipeline.visibility import HIDDEN_MASK_KEY, VisibilityStage, current_turn_excluded, visibility_hidden
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


def _chat_nodes():
    """Message nodes at floors 1, 2, 3 and 10 (``msg:10`` sorts before ``msg:2`` in byte order), an archived
    message at floor 4, and extracted memories at later floors (an event with a range, a core event without)."""
    return [
        node("msg:1", "message", seq=1, seq_range=(1, 1), summary="one"),
        node("msg:10", "message", seq=10, seq_range=(10, 10), summary="ten"),
        node("msg:2", "message", seq=2, seq_range=(2, 2), summary="two"),
        node("msg:3", "message", seq=3, seq_range=(3, 3), summary="three"),
        node("msg:4", "message", seq=4, seq_range=(4, 4), archived=True, summary="four"),
        node("ev", "event", seq=3, seq_range=(3, 3), title="later event"),
        node("core", "event", seq=12, seq_range=None, title="core event"),
    ]


class TestCurrentTurn:
    """The current-turn rule: message nodes at floors ≥ the recall's user floor are removed for good (a
    departure, docs/reference-differences.md "Visibility stage")."""

    @pytest.mark.parametrize(
        ("user_floor", "excluded", "active"),
        [
            (None, [], [True, True, True, True, False, True, False]),
            (0, ["msg:1", "msg:2", "msg:3", "msg:10"], [False, False, False, False, False, True, False]),
            (2, ["msg:2", "msg:3", "msg:10"], [True, False, False, False, False, True, False]),
            (3, ["msg:3", "msg:10"], [True, False, True, False, False, True, False]),
            (10, ["msg:10"], [True, False, True, True, False, True, False]),
            (11, [], [True, True, True, True, False, True, False]),
        ],
    )
    def test_messages_from_the_user_floor_on_are_excluded(self, user_floor, excluded, active):
        res = STAGE.run(make_state(snapshot(_chat_nodes()), "x", user_floor=user_floor))
        assert res.state.meta["currentTurnExcluded"] == excluded  # floor order, not byte order
        assert res.state.active.tolist() == active
        mask = [i in excluded for i in res.state.snapshot.ids]
        assert res.state.meta[HIDDEN_MASK_KEY].tolist() == mask
        assert res.state.meta["visibilityHidden"] == []  # the filter's own list is unchanged
        assert res.state.meta["activeNodeCount"] == sum(active)
        assert res.trace.notes == {
            "filter": "", "filterApplied": False, "hiddenCount": 0,
            "userFloor": user_floor, "currentTurnExcludedCount": len(excluded),
        }
        assert res.trace.count_out == sum(active)
        assert current_turn_excluded(res.state.snapshot, user_floor) == excluded

    def test_same_floor_ties_break_by_node_id(self):
        snap = snapshot([node("m-b", "message", seq=5), node("m-a", "message", seq=5), node("m-c", "message", seq=4)])
        res = STAGE.run(make_state(snap, "x", user_floor=4))
        assert res.state.meta["currentTurnExcluded"] == ["m-c", "m-a", "m-b"]

    def test_applies_with_the_filter_disabled_and_combines_with_it(self):
        nodes = [*_chat_nodes(), node("secret", "location", seq=1, visibility="Bob")]
        off = VisibilityStage(VisibilitySettings(enabled=False)).run(
            make_state(snapshot(nodes), "x", user_floor=3, visibility_filter="Alice")
        )
        assert off.state.meta["currentTurnExcluded"] == ["msg:3", "msg:10"]
        assert off.state.meta["visibilityHidden"] == []
        assert off.state.active.tolist() == [True, False, True, False, False, True, False, True]
        both = STAGE.run(make_state(snapshot(nodes), "x", user_floor=3, visibility_filter="Alice"))
        assert both.state.meta["currentTurnExcluded"] == ["msg:3", "msg:10"]
        assert both.state.meta["visibilityHidden"] == ["secret"]
        assert both.state.active.tolist() == [True, False, True, False, False, True, False, False]
        assert both.state.meta[HIDDEN_MASK_KEY].tolist() == [False, True, False, True, False, False, False, True]
        assert (both.trace.notes["hiddenCount"], both.trace.notes["currentTurnExcludedCount"]) == (1, 2)

    def test_every_message_excluded_short_circuits(self):
        snap = snapshot([node("msg:0", "message", seq=0), node("msg:1", "message", seq=1)])
        res = STAGE.run(make_state(snap, "x", user_floor=0))
        assert res.state.active.tolist() == [False, False]
        assert (res.trace.skipped, res.trace.skip_reason) == (True, "no-active-nodes")

    def test_input_not_mutated(self):
        assert_not_mutated(make_state(snapshot(_chat_nodes()), "x", user_floor=2), STAGE.run)


_QUERY = "Where did Marcus leave the study key?"


def _route_snapshot():
    """A chat whose current turn (floor 4, the query itself) and the assistant reply after it (floor 5) are
    the best vector matches, tied to Marcus by a strong edge, next to an earlier message and an extracted event
    that answer the question."""
    texts = {
        "msg:1": ("Wren", "Marcus said he left the study key in the pantry."),
        "msg:2": ("Narrator", "The rain keeps falling on the manor roof."),
        "msg:3": ("Wren", "I will ask Lady Agnes about the library later."),
        "msg:4": ("Wren", _QUERY),
        "msg:5": ("Narrator", "Marcus looks away and mentions the study key again."),
    }
    chain = list(texts)
    nodes = [
        node(
            nid, "message", seq=int(nid[4:]), seq_range=(int(nid[4:]), int(nid[4:])), speaker=speaker,
            summary=text, prev_id=chain[k - 1] if k else None, next_id=chain[k + 1] if k + 1 < len(chain) else None,
        )
        for k, (nid, (speaker, text)) in enumerate(texts.items())
    ]
    nodes += [
        node("char:marcus", "character", seq=1, seq_range=(1, 5), name="Marcus"),
        node("ev:key", "event", seq=5, seq_range=(1, 5), title="The study key", summary="Marcus lost the study key."),
    ]
    embeddings = {
        "msg:1": [0.8, 0.6, 0.0], "msg:2": [0.0, 0.0, 1.0], "msg:3": [0.1, 0.0, 1.0], "msg:4": [1.0, 0.0, 0.0],
        "msg:5": [0.99, 0.1, 0.0], "char:marcus": [0.5, 0.5, 0.7], "ev:key": [0.7, 0.7, 0.1],
    }
    edges = [edge("msg:4", "char:marcus", 0.9), edge("msg:5", "ev:key", 0.9), edge("msg:1", "char:marcus", 0.6)]
    return snapshot(nodes, edges, embeddings=embeddings, model_id=MODEL)


class TestCurrentTurnThroughThePipeline:
    """The excluded turns reach no route: vector hits, anchors, diffusion, the score map, the pool, the selection,
    the result's lists and the injected text (departure 2: the verdict is final)."""

    @staticmethod
    def _run(user_floor):
        from injector.render import render
        from memory_recall.pipeline.result import build_result
        from memory_recall.pipeline.retrieve import run_pipeline
        from memory_recall.pipeline.state import Providers, RecallQuery
        from memory_recall.settings import RecallSettings

        settings = RecallSettings()
        query = RecallQuery(
            user_message=_QUERY, recent_lines=(f"[user]: {_QUERY}",), now_ms=NOW, chat_id="c", user_floor=user_floor,
        )
        run = run_pipeline(_route_snapshot(), query, settings, Providers(embedder=CountingEmbedder((1.0, 0.0, 0.0))))
        result = build_result(run.state, run.settings, timings=run.timings)
        return run.state, result, render(result, settings.injector)

    def test_without_a_user_floor_the_current_turn_is_recalled(self):
        state, result, injection = self._run(None)
        # The defect the rule fixes: the query's own turn and the reply after it are recalled and injected.
        assert result.selected_node_ids == ["ev:key", "char:marcus", "msg:4", "msg:5", "msg:1", "msg:3", "msg:2"]
        assert f"| Wren | {_QUERY} |" in injection.text.splitlines()

    def test_excluded_everywhere(self):
        state, result, injection = self._run(4)
        ids = state.snapshot.ids
        routes = {
            "vector": state.vector_hits[0], "anchors": [i for i, _ in state.anchors], "diffusion": state.diffusion[0],
            "candidates": state.candidates.index, "scored": state.scored.index, "pool": state.pool,
            "selection": state.selection,
        }
        for route, index in routes.items():
            assert not {"msg:4", "msg:5"} & {ids[i] for i in np.asarray(index, dtype=np.int64).tolist()}, route
        assert result.selected_node_ids == ["ev:key", "char:marcus", "msg:1", "msg:3", "msg:2"]
        assert result.recall_node_ids == ["char:marcus", "msg:3", "msg:2", "msg:1"]
        assert result.core_node_ids == ["ev:key"]
        assert result.meta["retrieval"]["currentTurnExcluded"] == ["msg:4", "msg:5"]
        assert _QUERY not in injection.text and "mentions the study key again" not in injection.text
        assert "| Wren | Marcus said he left the study key in the pantry. |" in injection.text.splitlines()
