"""Owner stage (reference §3.13, §3.16, §3.17 with recall-spec departure 2 and §7 items 6 and 9).

States are hand-built with ``scored_state``; scenarios 35–37 also run end to end in test_retrieve.py.
"""

from __future__ import annotations

import pytest
from e2e_helpers import (
    deep_freeze,
    edge,
    graph,
    ids_of,
    node,
    owner,
    pov,
    scored_state,
    snapshot,
    trace_key,
)

from memory_recall.model.graph import StoryTime
from memory_recall.model.state import StorySegment, TimelineState
from memory_recall.pipeline.owners import OwnerStage, final_owners, scene_owner_candidates
from memory_recall.pipeline.state import ContextInfo, OwnerCandidate
from memory_recall.settings import ContextSettings, OwnerSettings, ScoringSettings, SelectionSettings


def stage(max_nodes=8, pool=30, reconstruction=True, keep_top_ranked=5):
    return OwnerStage(
        OwnerSettings(enable_scene_reconstruction=reconstruction, keep_top_ranked=keep_top_ranked),
        SelectionSettings(max_recall_nodes=max_nodes, llm_candidate_pool=pool, top_k=20),
        ContextSettings(),
        ScoringSettings(),
    )


def sel(result):
    return ids_of(result.state, result.state.selection)


# --- scenario 35 fixture: scene reconstruction ------------------------------------------------------------------


def scene_graph(**kw):
    return graph(
        [
            node("ev-0", "event", seq=0, title="E0"),
            node("ev-4", "event", seq=4, title="E4"),
            node("ev-5", "event", seq=5, title="E5"),
            node("ev-9", "event", seq=9, title="E9"),
            node("loc-1", "location", seq=4, name="Tower"),
            node("char-a", "character", seq=4, name="Ann"),
            node("rule-x", "rule", seq=4, title="No magic"),
        ],
        [edge("ev-4", "loc-1"), edge("char-a", "ev-4"), edge("ev-4", "rule-x")],
        **kw,
    )


def scene_state(selection=("ev-4",), meta=None, g=None, context=None):
    snap = snapshot(g or scene_graph())
    rows = [(i, 0.5 - 0.01 * k) for k, i in enumerate(snap.ids)]
    return scored_state(snap, rows, selection=list(selection), llm={"status": "llm"}, meta=meta, context=context)


class TestSceneReconstruction:
    def test_scenario_35_neighbours_then_nearest_events(self):
        """Reference order: neighbours of ev-4 in edge order (the rule is not pulled in), then the 2 events nearest
        in seq. Departure 2 only restricts *what* may be added (see the gated tests below)."""
        r = stage().run(scene_state())
        assert sel(r) == ["ev-4", "loc-1", "char-a", "ev-5", "ev-0"]
        assert r.state.meta["sceneReconstructionAdded"] == ["loc-1", "char-a", "ev-5", "ev-0"]
        assert r.state.meta["selectionOrigins"]["ev-4"] == "llm"
        assert r.state.meta["selectionOrigins"]["ev-5"] == "scene-reconstruction"

    def test_scenario_35_limit_two(self):
        assert sel(stage(max_nodes=2).run(scene_state())) == ["ev-4", "loc-1"]

    def crowded_state(self):
        """ev-a (ranked 1st) has two character neighbours; ev-c (ranked 2nd) and ev-b (3rd) are selected too."""
        g = graph(
            [node("ev-a", "event", seq=10), node("ev-b", "event", seq=30), node("ev-c", "event", seq=50),
             node("c-1", "character", seq=10), node("c-2", "character", seq=10)],
            [edge("ev-a", "c-1"), edge("ev-a", "c-2")],
        )
        snap = snapshot(g)
        rows = [("ev-a", 0.5), ("ev-c", 0.4), ("ev-b", 0.3), ("c-1", 0.1), ("c-2", 0.1)]
        return scored_state(snap, rows, selection=["ev-a", "ev-c", "ev-b"])

    def test_reference_crowding_without_keep_top_ranked(self):
        """§3.16 step 3 as the reference: ev-a's neighbours fill the cap, the 2nd-ranked ev-c is cut."""
        r = stage(max_nodes=3, keep_top_ranked=0).run(self.crowded_state())
        assert sel(r) == ["ev-a", "c-1", "c-2"]

    def test_keep_top_ranked_puts_back_a_crowded_out_row(self):
        """owners.py departure: the 2nd-ranked selected row replaces the last reconstruction addition."""
        r = stage(max_nodes=3, keep_top_ranked=2).run(self.crowded_state())
        assert sel(r) == ["ev-a", "c-1", "ev-c"]
        assert r.state.meta["selectionOrigins"] == {"ev-a": "score", "c-1": "scene-reconstruction", "ev-c": "score"}
        assert r.state.meta["sceneReconstructionAdded"] == ["c-1"]

    def test_keep_top_ranked_gives_way_only_to_reconstruction(self):
        """Rows in ranking order up to the limit; selected rows are never dropped for them."""
        r = stage(max_nodes=3, keep_top_ranked=5).run(self.crowded_state())
        assert sel(r) == ["ev-a", "ev-c", "ev-b"]

    def test_disabled_keeps_the_selection(self):
        assert sel(stage(reconstruction=False).run(scene_state())) == ["ev-4"]

    def test_nearest_event_ties_prefer_higher_seq(self):
        g = graph([node("a", "event", seq=5), node("b", "event", seq=3), node("c", "event", seq=7),
                   node("d", "event", seq=1)])
        snap = snapshot(g)
        state = scored_state(snap, [(i, 0.1) for i in snap.ids], selection=["a"])
        assert sel(stage().run(state)) == ["a", "c", "b"]

    def test_gate_suppressed_and_temporally_suppressed_nodes_never_added(self):
        """Departure 2 / §7 item 9: the reference pulled such nodes back in through edges and seq distance."""
        state = scene_state(meta={"gate_suppressed": ["loc-1"], "temporalSuppressedNodes": ["ev-5"]})
        assert sel(stage().run(state)) == ["ev-4", "char-a", "ev-0", "ev-9"]

    def test_hidden_nodes_never_added(self):
        snap = snapshot(scene_graph())
        import numpy as np

        mask = np.zeros(snap.n, dtype=bool)
        mask[snap.index["char-a"]] = True
        rows = [(i, 0.5) for i in snap.ids if i != "char-a"]
        state = scored_state(snap, rows, selection=["ev-4"], meta={"visibility_hidden_mask": mask})
        assert sel(stage().run(state)) == ["ev-4", "loc-1", "ev-5", "ev-0"]

    def test_unscored_neighbour_must_pass_the_knowledge_gate(self):
        """A node the score map never held gets the scoring gate with zero evidence: erin is mistaken about
        loc-1 (objective) → suppressed; the temporal director suppresses a future-tense event; the others are
        visible to erin (visibility 1; without a score an objective node needs 0.56)."""
        seen = {"char-a": 1.0, "ev-0": 1.0, "ev-9": 1.0, "ev-5": 1.0, "loc-1": 1.0}
        g = scene_graph(owners=[owner("Erin", mistaken=["loc-1"], visibility=seen)])
        g = g.model_copy(update={"nodes": tuple(
            n.model_copy(update={"story_time": StoryTime(label="later", tense="future")}) if n.id == "ev-5" else n
            for n in g.nodes
        )})
        snap = snapshot(g)
        ctx = ContextInfo(owner_keys=("character:erin",), owner_scores=(1.0,), owner_mode="request")
        state = scored_state(snap, [("ev-4", 0.5)], selection=["ev-4"], context=ctx)
        assert sel(stage().run(state)) == ["ev-4", "char-a", "ev-0", "ev-9"]
        unseen = scene_graph(owners=[owner("Erin")])  # no visibility at all: every unscored node stays out
        state = scored_state(snapshot(unseen), [("ev-4", 0.5)], selection=["ev-4"], context=ctx)
        assert sel(stage().run(state)) == ["ev-4"]

    def test_pov_expands_recent_neighbours_and_their_events(self):
        g = graph(
            [
                node("p", "pov_memory", seq=3, scope=pov("Ann"), summary="s"),
                node("old", "location", seq=1, name="Old"),
                node("ev", "event", seq=6, title="E"),
                node("ev2", "event", seq=8, title="E2"),
                node("loc", "location", seq=5, name="L"),
            ],
            [edge("p", "old"), edge("p", "ev"), edge("p", "loc"), edge("ev", "loc")],
        )
        snap = snapshot(g)
        state = scored_state(snap, [(i, 0.1) for i in snap.ids], selection=["p"])
        # p's two most recent neighbours: ev (6), loc (5); ev expands to loc (dup) and nearest events ev2.
        assert sel(stage().run(state)) == ["p", "ev", "loc", "ev2"]

    def test_character_expands_recent_events(self):
        g = graph(
            [node("c", "character", seq=1, name="C"), node("e1", "event", seq=2), node("e2", "event", seq=9),
             node("e3", "event", seq=5), node("t", "thread", seq=5, title="T")],
            [edge("c", "e1"), edge("c", "e2"), edge("c", "e3"), edge("e2", "t")],
        )
        snap = snapshot(g)
        state = scored_state(snap, [(i, 0.1) for i in snap.ids], selection=["c"])
        # most recent events e2 (9) then e3 (5); e2 expands: thread t, nearest events e3 (dup), e1.
        assert sel(stage().run(state)) == ["c", "e2", "t", "e3", "e1"]


#: A long chat for the nearest-event search: 301 events at seq 0..300, one snapshot shared by the recalls below
#: (the stage keeps per-snapshot lists; the verdicts must still be each recall's own).
_LONG_CHAT: list = []


def long_chat_state(suppressed=(), selection=("ev-150",)):
    if not _LONG_CHAT:
        _LONG_CHAT.append(snapshot(graph([node(f"ev-{k}", "event", seq=k) for k in range(301)])))
    snap = _LONG_CHAT[0]
    gate = [f"ev-{k}" for k in suppressed if k != 150]
    return scored_state(snap, [(i, 0.1) for i in snap.ids], selection=list(selection),
                        meta={"gate_suppressed": gate})


class TestNearestEventsInALongChat:
    @pytest.mark.parametrize(("suppressed", "expected"), [
        ((), ["ev-151", "ev-149"]),  # distance 1 each: the higher seq first
        (range(135, 166), ["ev-166", "ev-134"]),  # past the first nearest events, inside the ±64-event window
        (range(100, 171), ["ev-171", "ev-172"]),
        (range(60, 241), ["ev-241", "ev-59"]),  # nothing admissible inside the window: the whole order
        (range(1, 301), ["ev-0"]),  # one admissible event in the whole chat
        ((), ["ev-151", "ev-149"]),  # the same snapshot again, nothing suppressed
    ])
    def test_first_two_admissible_events_nearest_first(self, suppressed, expected):
        assert sel(stage().run(long_chat_state(suppressed))) == ["ev-150", *expected]

    def test_every_selected_event_is_expanded_up_to_the_cap(self):
        """Ten selected events, room for all their nearest events: the walk reads past the first few selected
        nodes (the stage judges admission a few selected nodes at a time). ev-91…ev-120 are suppressed: ev-90
        falls back to the older side, ev-120 (selected, so kept) to the newer one."""
        selection = [f"ev-{k}" for k in range(0, 300, 30)]
        expected = ["ev-0", "ev-1", "ev-2", "ev-30", "ev-31", "ev-29", "ev-60", "ev-61", "ev-59",
                    "ev-90", "ev-89", "ev-88", "ev-120", "ev-121", "ev-122"]
        for k in range(150, 300, 30):
            expected += [f"ev-{k}", f"ev-{k + 1}", f"ev-{k - 1}"]
        r = stage(max_nodes=40).run(long_chat_state(range(91, 121), selection))
        assert sel(r) == expected
        assert sel(stage(max_nodes=10).run(long_chat_state(range(91, 121), selection))) == expected[:10]

    def test_chat_edges(self):
        assert sel(stage().run(long_chat_state(selection=("ev-0",)))) == ["ev-0", "ev-1", "ev-2"]
        assert sel(stage().run(long_chat_state(range(250, 300), ("ev-300",)))) == ["ev-300", "ev-249", "ev-248"]

    def test_bounded_walk_memo_gives_the_same_selection(self, monkeypatch):
        """Emptying the per-snapshot lists at every insertion changes nothing but the cost."""
        import memory_recall.pipeline.owners as owners_module

        expected = sel(stage().run(scene_state()))
        monkeypatch.setattr(owners_module, "MAX_WALK_MEMO", 1)
        assert sel(stage().run(scene_state())) == expected == ["ev-4", "loc-1", "char-a", "ev-5", "ev-0"]
        assert sel(stage().run(long_chat_state(range(135, 166)))) == ["ev-150", "ev-166", "ev-134"]


# --- scene-owner candidates and final owners ----------------------------------------------------------------------


def owners_graph():
    return graph(
        [
            node("pov-a", "pov_memory", seq=5, importance=8, scope=pov("艾琳"), summary="a"),
            node("pov-b", "pov_memory", seq=6, importance=7, scope=pov("露西亚"), summary="b"),
            node("ev-1", "event", seq=1, title="Ann and Bob", participants=["Ann"]),
            node("ev-2", "event", seq=2, title="The Announcement"),
            node("ev-3", "event", seq=3, title="x"),
            node("ev-4", "event", seq=4, title="y"),
            node("upov", "pov_memory", seq=7, scope=pov("玩家", "user"), summary="Ann is kind"),
        ],
        owners=[owner("Ann", updated_at=5)],
    )


def owners_state(rows, selection, llm=None, context=None, **kw):
    snap = snapshot(owners_graph())
    ctx = context or ContextInfo(owner_catalog=("character:ann",))
    return scored_state(snap, rows, selection=selection, llm=llm, context=ctx, **kw)


class TestSceneOwnerCandidates:
    def test_pov_and_participant_scores(self):
        state = owners_state(
            [("ev-1", 4.0), ("ev-2", 3.0), ("pov-a", 0.8), ("pov-b", 16.0), ("upov", 2.0)], ["ev-1"],
        )
        cands = scene_owner_candidates(state, SelectionSettings())
        got = [(c.owner_key, round(c.score, 6), c.sources, c.reasons) for c in cands]
        assert got == [
            # ev-1 mentions Ann (0.9 + min(0.6, 0.4)); the user POV "Ann is kind" too (0.9 + 0.2); ev-2's
            # "Announcement" does not (word boundary, departure 8).
            ("character:ann", 2.4, ("objective-participant",), ("participant:Ann",)),
            ("character:露西亚", 1.8, ("candidate-pov-owner",), ("pov-memory",)),  # 1 + min(0.8, 16/8)
            ("character:艾琳", 1.1, ("candidate-pov-owner",), ("pov-memory",)),  # 1 + 0.8/8
        ]

    def test_merged_with_preliminary_candidates(self):
        ctx = ContextInfo(owner_catalog=("character:ann",), owner_candidates=(
            OwnerCandidate("character:ann", "Ann", 0.35, ("recent-active",), ("recent-active",)),
            OwnerCandidate("character:zed", "Zed", 0.6, ("legacy-unique-match",), ("legacy:Zed",)),
        ))
        state = owners_state([("ev-1", 1.0)], ["ev-1"], context=ctx)
        cands = scene_owner_candidates(state, SelectionSettings())
        assert [(c.owner_key, round(c.score, 6), c.sources) for c in cands] == [
            ("character:ann", 1.35, ("recent-active", "objective-participant")),
            ("character:zed", 0.6, ("legacy-unique-match",)),
        ]

    def test_participant_matches_follow_the_catalog_and_the_weights_on_one_snapshot(self):
        """The participant matches are kept per snapshot and catalog; the scores still come from each recall's
        weights, and a scene without the owner in its catalog gets no participant candidate."""
        snap = snapshot(owners_graph())
        with_ann = ContextInfo(owner_catalog=("character:ann",))

        def participants(rows, ctx):
            cands = scene_owner_candidates(scored_state(snap, rows, selection=["ev-1"], context=ctx),
                                           SelectionSettings())
            return [(c.owner_key, round(c.score, 6), c.reasons) for c in cands if "objective-participant" in c.sources]

        for _ in range(2):
            assert participants([("ev-1", 4.0)], with_ann) == [("character:ann", 1.3, ("participant:Ann",))]
            assert participants([("ev-1", 4.0)], ContextInfo()) == []
            # 0.9 + min(0.6, 1.0 / 10) for ev-1, + 0.9 + 0.2 for the user POV naming Ann
            assert participants([("ev-1", 1.0), ("upov", 2.0)], with_ann) == [
                ("character:ann", 2.1, ("participant:Ann",))]

    def test_only_the_top_rows_are_scanned(self):
        rows = [(f"ev-{k}", 1.0) for k in (3, 4)] + [("pov-a", 0.5)]
        state = owners_state(rows, [], pool=None)
        small = SelectionSettings(max_recall_nodes=1, llm_candidate_pool=1)
        # max(llmPool 1, 12) = 12 rows: pov-a (row 3) is scanned
        assert [c.owner_key for c in scene_owner_candidates(state, small)] == ["character:艾琳"]


class TestFinalOwners:
    def cands(self):
        return (
            OwnerCandidate("character:a", "A", 1.4), OwnerCandidate("character:b", "B", 0.6),
            OwnerCandidate("character:c", "C", 0.55), OwnerCandidate("character:d", "D", 0.9),
            OwnerCandidate("character:e", "E", 0.7), OwnerCandidate("character:f", "F", 0.5),
        )

    def state(self, llm=None, context=None):
        return owners_state([("ev-1", 0.1)], ["ev-1"], llm=llm, context=context)

    def test_heuristic_without_llm(self):
        keys, scores, mode = final_owners(self.state(), self.cands())
        assert keys == ("character:a", "character:b", "character:c", "character:d")  # ≥ 0.55, first 4
        assert scores == (1.0, 0.6, 0.55, 0.9)
        assert mode == "heuristic"

    def test_fallback_mode_on_the_llm_path(self):
        assert final_owners(self.state(llm={"status": "fallback"}), self.cands())[2] == "fallback"
        assert final_owners(self.state(llm={"status": "llm"}), self.cands())[2] == "fallback"

    def test_llm_owners(self):
        llm = {"status": "llm", "activeOwnerKeys": ["character:d", "character:b"],
               "activeOwnerScores": [{"ownerKey": "character:b", "score": 0.3, "reason": ""}]}
        assert final_owners(self.state(llm=llm), self.cands()) == (
            ("character:d", "character:b"), (0.9, 0.3), "llm")

    def test_unresolved(self):
        assert final_owners(self.state(), (OwnerCandidate("character:a", "A", 0.5),)) == ((), (), "unresolved")

    def test_request_owners_are_final(self):
        """Departure 2: owners named in the request are never replaced by inferred or LLM owners."""
        ctx = ContextInfo(owner_keys=("character:zed",), owner_scores=(1.0,), owner_mode="request")
        llm = {"status": "llm", "activeOwnerKeys": ["character:a"]}
        assert final_owners(self.state(llm=llm, context=ctx), self.cands()) == (
            ("character:zed",), (1.0,), "request")


class TestOwnerPovAugmentation:
    def test_scenario_36_pov_beyond_max_nodes_is_moved_forward(self):
        """Departure §7 item 6: without LLM the selection is the top-K pool; the owner's POV ranked second
        with maxRecallNodes 1 is moved forward (the reference cut it and selected [obj-global])."""
        g = graph([
            node("obj-global", "event", seq=1, importance=8, scope=pov("x").model_copy(
                update={"layer": "objective", "owner_type": "", "owner_id": "", "owner_name": "",
                        "region_primary": "旧城区"}), title="G"),
            node("char-pov", "pov_memory", seq=1, importance=4, scope=pov("艾琳"), summary="P"),
        ])
        snap = snapshot(g)
        state = scored_state(snap, [("obj-global", 0.4, "objectiveGlobal"), ("char-pov", 0.2, "otherPov")],
                             selection=["obj-global", "char-pov"], llm={"status": "disabled"})
        r = stage(max_nodes=1).run(state)
        assert sel(r) == ["char-pov"]
        assert r.state.final_owner_keys == ("character:艾琳",)
        assert r.state.final_owner_mode == "heuristic"
        assert r.state.meta["ownerPovAugmented"] == ["char-pov"]
        assert r.state.meta["selectionOrigins"] == {"char-pov": "owner-pov"}

    def test_scenario_37_two_owner_povs_in_owner_order(self):
        """Reference outcome (departure 2 leaves it unchanged: both POVs are scored rows, i.e. passed the gate):
        the rejected LLM answer gives mode ``fallback`` and the POV owners; augmentation puts both POVs in front."""
        rows = [("ev-1", 0.5), ("ev-2", 0.4), ("ev-3", 0.3), ("ev-4", 0.2),
                ("pov-a", 0.15, "otherPov"), ("pov-b", 0.1, "otherPov")]
        state = owners_state(rows, ["ev-1", "ev-2"], llm={"status": "fallback"},
                             context=ContextInfo())
        r = stage(max_nodes=2, pool=4).run(state)
        assert r.state.final_owner_keys == ("character:艾琳", "character:露西亚")
        assert r.state.final_owner_mode == "fallback"
        assert sel(r) == ["pov-a", "pov-b"]

    def test_pov_already_selected_is_moved_to_the_front(self):
        """Departure §7 item 6: the reference left a selected POV where it was, where scene reconstruction or the
        cap could still cut it; it goes first."""
        rows = [("ev-1", 0.5), ("pov-a", 0.4), ("ev-2", 0.3)]
        state = owners_state(rows, ["ev-1", "pov-a", "ev-2"], context=ContextInfo())
        r = stage(max_nodes=2, reconstruction=False).run(state)
        assert sel(r) == ["pov-a", "ev-1"]

    def test_request_owner_gets_only_its_own_pov(self):
        """Departure 2: pov-b's owner was not named, so pov-b is not pulled in although it is scored."""
        ctx = ContextInfo(owner_keys=("character:艾琳",), owner_scores=(1.0,), owner_mode="request")
        rows = [("ev-1", 0.5), ("pov-b", 0.4), ("pov-a", 0.1)]
        r = stage(max_nodes=2, reconstruction=False).run(owners_state(rows, ["ev-1", "ev-2"], context=ctx))
        assert sel(r) == ["pov-a", "ev-1"]
        assert r.state.final_owner_mode == "request"

    def test_unscored_pov_is_never_augmented(self):
        """Only scored rows (which passed the gate) can be augmented."""
        ctx = ContextInfo(owner_keys=("character:艾琳",), owner_scores=(1.0,), owner_mode="request")
        r = stage(max_nodes=2, reconstruction=False).run(owners_state([("ev-1", 0.5)], ["ev-1"], context=ctx))
        assert sel(r) == ["ev-1"]


class TestMeta:
    def test_selected_meta(self):
        ctx = ContextInfo(owner_keys=("character:艾琳",), owner_scores=(1.0,), owner_mode="request")
        rows = [("ev-1", 0.5, "objectiveGlobal", "undated", "soft-visible", 0.6), ("pov-a", 0.4, "otherPov")]
        state = owners_state(rows, ["ev-1", "pov-a"], context=ctx,
                             meta={"knowledgeVisibleOwnersByNode": {"ev-1": ["character:艾琳"]}})
        r = stage(max_nodes=3, reconstruction=False).run(state)
        meta = r.state.meta
        assert sel(r) == ["pov-a", "ev-1"]  # the owner's POV goes first (owners.py, departure §7 item 6)
        assert meta["selectedByBucket"] == {"objectiveGlobal": ["ev-1"], "characterPov": ["pov-a"]}
        assert meta["selectedByKnowledgeState"]["ev-1"] == {
            "mode": "soft-visible", "anchored": False, "rescued": False, "ownerCoverage": 1.0,
            "visibilityScore": 0.6, "visibleOwnerKeys": ["character:艾琳"], "suppressedOwnerKeys": [],
        }
        assert meta["selectedByOwner"] == {"character:艾琳": ["pov-a", "ev-1"]}
        assert meta["selectedByStoryTime"]["ev-1"] == {"storyTimeLabel": "", "temporalBucket": "undated",
                                                      "temporalWeight": 1.0}
        assert meta["activeRecallOwnerKey"] == "character:艾琳"
        assert meta["activeRecallOwnerScores"] == {"character:艾琳": 1.0}
        assert meta["sceneOwnerResolutionMode"] == "request"

    def test_story_time_of_an_unscored_addition(self):
        timeline = TimelineState(segments=(StorySegment(id="s1", order=1), StorySegment(id="s2", order=2)))
        g = graph([node("c", "character", seq=1), node("e", "event", seq=2, story_time=StoryTime(segment_id="s1"))],
                  [edge("c", "e")], timeline=timeline)
        snap = snapshot(g)
        ctx = ContextInfo(story_segment_id="s2", story_segment_order=2)
        state = scored_state(snap, [("c", 0.5)], selection=["c"], context=ctx)
        r = stage().run(state)
        assert sel(r) == ["c", "e"]
        assert r.state.meta["selectedByKnowledgeState"]["e"]["mode"] == "selected"
        assert r.state.meta["selectedByStoryTime"]["e"]["temporalBucket"] == "adjacentPast"

    def test_classifications_follow_each_recalls_scene_on_one_snapshot(self):
        """Buckets and story time are kept per snapshot and scene: recalls of other owners or another story
        segment on the same snapshot get their own, and coming back to a scene gives its verdicts again."""
        snap = snapshot(owners_graph())

        def buckets(owner_key):
            ctx = ContextInfo(owner_keys=(owner_key,), owner_scores=(1.0,), owner_mode="request")
            state = scored_state(snap, [("ev-1", 0.5), ("pov-a", 0.4), ("pov-b", 0.3)],
                                 selection=["ev-1", "pov-a", "pov-b"], context=ctx)
            return stage(reconstruction=False).run(state).state.meta["selectedByBucket"]

        for _ in range(2):
            assert buckets("character:艾琳") == {"characterPov": ["pov-a"], "objectiveGlobal": ["ev-1"],
                                                "otherPov": ["pov-b"]}
            assert buckets("character:露西亚") == {"characterPov": ["pov-b"], "objectiveGlobal": ["ev-1"],
                                                  "otherPov": ["pov-a"]}

        timeline = TimelineState(segments=(StorySegment(id="s1", order=1), StorySegment(id="s2", order=2)))
        g = graph([node("c", "character", seq=1), node("e", "event", seq=2, story_time=StoryTime(segment_id="s1"))],
                  [edge("c", "e")], timeline=timeline)
        snap = snapshot(g)

        def story(segment, order):
            ctx = ContextInfo(story_segment_id=segment, story_segment_order=order)
            r = stage().run(scored_state(snap, [("c", 0.5)], selection=["c"], context=ctx))
            return r.state.meta["selectedByStoryTime"]["e"]["temporalBucket"]

        for _ in range(2):
            assert (story("s2", 2), story("s1", 1)) == ("adjacentPast", "current")


class TestContract:
    def test_empty_input_skips(self):
        snap = snapshot(owners_graph())
        state = scored_state(snap, [], pool=[])
        r = stage().run(state)
        assert r.trace.skipped and r.trace.skip_reason == "empty-selection"
        assert r.state is state

    def test_input_not_mutated(self):
        state = scene_state()
        before = deep_freeze(state)
        stage().run(state)
        assert deep_freeze(state) == before

    def test_deterministic(self):
        a, b = stage().run(scene_state()), stage().run(scene_state())
        assert deep_freeze(a.state) == deep_freeze(b.state)
        assert trace_key(a.trace) == trace_key(b.trace)

    @pytest.mark.parametrize("reconstruction", [True, False])
    def test_trace_filled(self, reconstruction):
        t = stage(reconstruction=reconstruction).run(scene_state()).trace
        assert t.name == "owners" and t.count_in == 1 and t.count_out >= 1
        assert (t.score_kind, t.score_direction) == ("selection_rank", "lower_is_better")
