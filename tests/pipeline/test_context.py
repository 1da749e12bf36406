"""ContextStage: owners, region, story context and cue mode (reference §3.1, §1.6, §1.7, §3.12 step 4)."""

from __future__ import annotations

import pytest
from ctx_helpers import assert_not_mutated, make_state, node, pov, result_image, snapshot

from memory_recall.model.graph import MemoryScope
from memory_recall.model.state import (
    HistoryState,
    KnowledgeOwner,
    KnowledgeState,
    RegionAdjacency,
    RegionState,
    StorySegment,
    TimelineState,
)
from memory_recall.pipeline.context import ContextStage, detect_cue_mode
from memory_recall.settings import ContextSettings

STAGE = ContextStage(ContextSettings())


def owner(
    name: str, updated_at: int = 0, node_id: str = "", aliases: tuple[str, ...] = (), key: str = ""
) -> KnowledgeOwner:
    return KnowledgeOwner(
        owner_type="character",
        owner_key=key or f"character:{name.lower()}",
        owner_name=name,
        node_id=node_id,
        aliases=aliases,
        updated_at=updated_at,
    )


def knowledge(*owners: KnowledgeOwner) -> KnowledgeState:
    return KnowledgeState(owners={o.owner_key: o for o in owners})


def run(snap, message: str = "", recent=(), **kw):
    return STAGE.run(make_state(snap, message, recent, **kw))


class TestOwnerCatalog:
    def test_character_owners_by_updated_at_then_name(self):
        user = KnowledgeOwner(owner_type="user", owner_key="user:玩家", owner_name="玩家", updated_at=99)
        snap = snapshot(knowledge=knowledge(owner("Bob", 5), owner("Alice", 5), owner("Zed", 9), user))
        ctx = run(snap).state.context
        assert ctx.owner_catalog == ("character:zed", "character:alice", "character:bob")


class TestSceneOwnerCandidates:
    def test_text_mention_plus_recent_active(self):
        snap = snapshot(knowledge=knowledge(owner("艾琳", 1), owner("露西亚", 2)))
        res = run(snap, "艾琳在钟楼")
        ctx = res.state.context
        # 艾琳: mention 0.8 + recent-active 0.35; 露西亚: recent-active 0.35 only.
        assert [(c.owner_key, c.score) for c in ctx.owner_candidates] == [
            ("character:艾琳", 1.15),
            ("character:露西亚", 0.35),
        ]
        assert ctx.owner_candidates[0].sources == ("recent-message", "recent-active")
        assert ctx.owner_keys == ("character:艾琳",)
        assert ctx.owner_scores == (1.0,)
        assert ctx.owner_mode == "heuristic"
        assert res.state.meta["activeRecallOwnerScores"] == {"character:艾琳": 1.0}
        assert res.state.meta["activeCharacterPovOwners"] == ["艾琳"]

    def test_mention_in_recent_line(self):
        snap = snapshot(knowledge=knowledge(owner("Alice")))
        ctx = run(snap, "what now", ["[assistant]: ALICE waves", "[user]: what now"]).state.context
        assert ctx.owner_keys == ("character:alice",)

    def test_mention_on_boundaries_in_another_text(self):
        # "Ann" occurs in the message only inside "Announcement"; the recent line has it as a word.
        snap = snapshot(knowledge=knowledge(owner("Ann")))
        ctx = run(snap, "The Announcement", ["[user]: Joanna", "[assistant]: Ann nods"]).state.context
        assert ctx.owner_candidates[0].reasons == ("mentioned:Ann", "recent-active")
        ctx = run(snap, "The Announcement", ["[user]: Joanna"]).state.context
        assert ctx.owner_candidates[0].reasons == ("recent-active",)

    def test_longest_alias_is_the_reason(self):
        snap = snapshot(knowledge=knowledge(owner("Liz", aliases=("Elizabeth", "Liz Bennet"))))
        ctx = run(snap, "Liz Bennet arrives").state.context
        assert ctx.owner_candidates[0].reasons[0] == "mentioned:Liz Bennet"

    def test_only_recent_active_is_unresolved(self):
        snap = snapshot(knowledge=knowledge(owner("Alice", 3)))
        res = run(snap, "nothing here")
        assert res.state.context.owner_keys == ()
        assert res.state.context.owner_mode == "unresolved"
        assert res.state.meta["sceneOwnerResolutionMode"] == "unresolved"
        assert res.state.meta["activeRecallOwnerKey"] == ""

    def test_recent_active_top_four_by_updated_at_then_node_recency(self):
        nodes = [node(f"n{i}", seq=i) for i in range(6)]
        owners = [owner(f"O{i}", updated_at=10 if i < 3 else 5, node_id=f"n{i}") for i in range(6)]
        snap = snapshot(nodes, knowledge=knowledge(*owners))
        cands = run(snap, "x").state.context.owner_candidates
        # updated_at 10: O2, O1, O0 (more recent owner node first); then O5 (updated 5, most recent node).
        assert [c.owner_name for c in cands] == ["O0", "O1", "O2", "O5"]  # equal scores: by name
        assert {c.owner_name for c in cands} == {"O2", "O1", "O0", "O5"}

    def test_at_most_eight_candidates_and_four_owners(self):
        owners = [owner(f"N{i:02d}") for i in range(10)]
        snap = snapshot(knowledge=knowledge(*owners))
        msg = " ".join(f"N{i:02d}" for i in range(10))
        ctx = run(snap, msg).state.context
        assert len(ctx.owner_candidates) == 8
        assert len(ctx.owner_keys) == 4
        # N00..N03 also got recent-active 0.35 (updated_at ties → name order), so they lead.
        assert ctx.owner_keys == ("character:n00", "character:n01", "character:n02", "character:n03")

    def test_legacy_unique_owner_with_node_id(self):
        snap = snapshot(
            [node("erin", name="Erin")],
            knowledge=knowledge(
                owner("Erin", node_id="erin"), owner("Bob"), owner("Cy"), owner("Di"), owner("Ed")
            ),
        )
        res = run(snap, "hello", active_character_pov_owner="Erin")
        erin = next(c for c in res.state.context.owner_candidates if c.owner_name == "Erin")
        assert "legacy-unique-match" in erin.sources
        assert res.state.context.active_character_pov_owner == "Erin"
        assert res.state.meta["activeCharacterPovOwner"] == "Erin"

    def test_legacy_needs_node_id_and_a_unique_name(self):
        snap = snapshot(knowledge=knowledge(owner("Erin")))  # no node id
        assert (
            run(snap, "x", active_character_pov_owner="Erin").state.context.active_character_pov_owner == ""
        )
        twins = knowledge(
            owner("Erin", node_id="a", key="character:erin#a"),
            owner("Erin", node_id="b", key="character:erin#b"),
        )
        snap = snapshot([node("a"), node("b")], knowledge=twins)
        assert run(snap, "x", host_character_name="Erin").state.context.active_character_pov_owner == ""

    def test_legacy_from_history_then_host_name(self):
        snap = snapshot(
            [node("erin")],
            knowledge=knowledge(owner("Erin", node_id="erin")),
            history=HistoryState(active_character_pov_owner="Erin"),
        )
        assert (
            run(snap, "x", active_character_pov_owner="Nobody").state.context.active_character_pov_owner
            == "Erin"
        )


class TestWordBoundaryMentions:
    """Departure 8 (§7 item 16): Latin aliases on word boundaries, case-insensitive; CJK by substring."""

    @pytest.mark.parametrize(
        ("message", "found"),
        [
            ("The Announcement was made", False),
            ("Joanna left", False),
            ("ann's hat", True),
            ("Ann-Marie and ANN", True),
            ("我和Ann去钟楼", True),
        ],
    )
    def test_latin_alias(self, message, found):
        snap = snapshot(
            knowledge=knowledge(owner("Ann", 0), owner("Zz1"), owner("Zz2"), owner("Zz3"), owner("Zz4"))
        )
        ctx = run(snap, message).state.context
        assert ("character:ann" in ctx.owner_keys) is found

    def test_accent_insensitive(self):
        snap = snapshot(knowledge=knowledge(owner("Renée")))
        assert run(snap, "renee is here").state.context.owner_keys == ("character:renée",)

    def test_cjk_substring(self):
        snap = snapshot(knowledge=knowledge(owner("艾琳")))
        assert run(snap, "昨天艾琳说").state.context.owner_keys == ("character:艾琳",)

    def test_role_prefix_is_not_a_mention(self):
        snap = snapshot(knowledge=knowledge(owner("AI")))  # alias of JS length 2
        assert run(snap, "hello", ["ai: hi there"]).state.context.owner_keys == ()


class TestRequestOwners:
    """Departure 2: caller-named owners are final; keys match with or without ``#nodeId`` (§7 item 4)."""

    def test_request_keys_are_final(self):
        snap = snapshot(knowledge=knowledge(owner("艾琳"), owner("露西亚")))
        res = run(snap, "艾琳在钟楼", active_owner_keys=("character:露西亚",))
        ctx = res.state.context
        assert ctx.owner_keys == ("character:露西亚",)
        assert ctx.owner_mode == "request"
        assert ctx.owner_scores == (1.0,)
        assert res.state.meta["sceneOwnerResolutionMode"] == "request"
        assert res.state.meta["activeCharacterPovOwners"] == ["露西亚"]
        # The candidates are still computed (published for diagnostics).
        assert ctx.owner_candidates[0].owner_key == "character:艾琳"

    def test_key_without_node_id_resolves_to_catalog_key(self):
        snap = snapshot(
            [node("erin")], knowledge=knowledge(owner("Erin", node_id="erin", key="character:erin#erin"))
        )
        ctx = run(snap, "x", active_owner_keys=("character:Erin",)).state.context
        assert ctx.owner_keys == ("character:erin#erin",)

    def test_key_with_node_id_resolves_to_plain_catalog_key(self):
        snap = snapshot(knowledge=knowledge(owner("Erin")))
        ctx = run(snap, "x", active_owner_keys=("character:erin#n1",)).state.context
        assert ctx.owner_keys == ("character:erin",)

    def test_unknown_keys_kept_and_deduplicated(self):
        ctx = run(snapshot(), "x", active_owner_keys=("character:艾琳", "Character:艾琳", " ")).state.context
        assert ctx.owner_keys == ("character:艾琳",)
        assert ctx.owner_mode == "request"

    def test_empty_request_means_no_owners(self):
        snap = snapshot(knowledge=knowledge(owner("Alice")))
        ctx = run(snap, "Alice", active_owner_keys=()).state.context
        assert ctx.owner_keys == ()
        assert ctx.owner_mode == "request"


class TestActiveRegion:
    ADJ = RegionState(
        adjacency_map={"钟楼": RegionAdjacency(adjacent=("旧城区",), aliases=("Bell Tower",))},
        recent_regions=("集市",),
    )

    def test_runtime_region_canonicalised_with_adjacency(self):
        res = run(snapshot(regions=self.ADJ), "x", active_region="bell tower")
        assert (res.state.context.active_region, res.state.context.active_region_source) == (
            "钟楼",
            "runtime",
        )
        assert res.state.context.adjacent_regions == ("旧城区",)
        assert res.state.meta["adjacentRegions"] == ["旧城区"]

    def test_spatial_adjacency_off(self):
        stage = ContextStage(ContextSettings(enable_spatial_adjacency=False))
        ctx = stage.run(make_state(snapshot(regions=self.ADJ), "x", active_region="钟楼")).state.context
        assert ctx.adjacent_regions == ()

    @pytest.mark.parametrize(
        ("regions", "history", "runtime", "expected"),
        [
            (
                RegionState(manual_active_region="王都"),
                HistoryState(active_region="钟楼"),
                "集市",
                ("王都", "manual"),
            ),
            (RegionState(), HistoryState(active_region_source="extract"), "集市", ("集市", "extract")),
            (
                RegionState(),
                HistoryState(active_region="钟楼", last_extracted_region="X"),
                "",
                ("钟楼", "history"),
            ),
            (RegionState(), HistoryState(last_extracted_region="X"), "", ("X", "extract")),
            (RegionState(recent_regions=("R",)), HistoryState(), "", ("R", "recent")),
        ],
    )
    def test_source_order(self, regions, history, runtime, expected):
        ctx = run(snapshot(regions=regions, history=history), "x", active_region=runtime).state.context
        assert (ctx.active_region, ctx.active_region_source) == expected

    def test_graph_fallback_first_non_archived_node_with_region(self):
        nodes = [
            node("a", seq=9),
            node("b", seq=1, archived=True, scope=MemoryScope(region_primary="废墟")),
            node("c", seq=2, scope=MemoryScope(region_primary="王都/钟楼")),
            node("d", seq=8, scope=MemoryScope(region_primary="集市")),
        ]
        ctx = run(snapshot(nodes), "x").state.context
        assert (ctx.active_region, ctx.active_region_source) == ("钟楼", "graph")

    def test_no_region(self):
        ctx = run(snapshot([node("a")]), "x").state.context
        assert (ctx.active_region, ctx.active_region_source) == ("", "")


class TestStoryContext:
    TIMELINE = TimelineState(
        segments=(
            StorySegment(id="old", label="旧时", order=1),
            StorySegment(id="now", label="现在", order=5, aliases=("present",)),
        ),
        recent_segment_ids=("gone", "old"),
    )

    def test_runtime_segment_id(self):
        res = run(snapshot(timeline=self.TIMELINE), "x", active_story_segment_id="now")
        ctx = res.state.context
        assert (ctx.story_segment_id, ctx.story_segment_label, ctx.story_segment_order, ctx.story_source) == (
            "now",
            "现在",
            5,
            "runtime",
        )
        assert res.state.meta["activeStorySegmentId"] == "now"
        assert res.state.meta["activeStoryTimeLabel"] == "现在"
        assert res.state.meta["activeStoryTimeSource"] == "runtime"

    def test_runtime_label_by_alias(self):
        ctx = run(snapshot(timeline=self.TIMELINE), "x", active_story_time_label="Present").state.context
        assert (ctx.story_segment_id, ctx.story_source) == ("now", "runtime")

    def test_manual_beats_runtime(self):
        timeline = self.TIMELINE.model_copy(update={"manual_active_segment_id": "old"})
        ctx = run(snapshot(timeline=timeline), "x", active_story_segment_id="now").state.context
        assert (ctx.story_segment_id, ctx.story_source) == ("old", "manual")

    def test_history_with_its_source(self):
        history = HistoryState(active_story_segment_id="now", active_story_time_source="extract-llm")
        ctx = run(snapshot(timeline=self.TIMELINE, history=history), "x").state.context
        assert (ctx.story_segment_id, ctx.story_source) == ("now", "extract-llm")

    def test_last_extracted_then_recent_skipping_unknown_ids(self):
        history = HistoryState(last_extracted_story_segment_id="now")
        ctx = run(snapshot(timeline=self.TIMELINE, history=history), "x").state.context
        assert (ctx.story_segment_id, ctx.story_source) == ("now", "extract")
        ctx = run(snapshot(timeline=self.TIMELINE), "x", active_story_segment_id="missing").state.context
        assert (ctx.story_segment_id, ctx.story_segment_order, ctx.story_source) == ("old", 1, "recent")

    def test_timeline_off(self):
        stage = ContextStage(ContextSettings(enable_story_timeline=False))
        ctx = stage.run(
            make_state(snapshot(timeline=self.TIMELINE), "x", active_story_segment_id="now")
        ).state.context
        assert (ctx.story_segment_id, ctx.story_segment_order, ctx.story_source) == ("", None, "")


class TestCueMode:
    @pytest.mark.parametrize(
        ("message", "mode"),
        [("现场怎么样", "none"), ("以前发生过什么", "flashback"), ("明天打算做什么", "future")],
    )
    def test_scenario_23_cue_modes(self, message, mode):
        """Scenario 23's three messages (the temporal buckets themselves are the scoring stage's)."""
        assert run(snapshot(), message).state.context.cue_mode == mode

    @pytest.mark.parametrize(
        ("message", "mode"),
        [
            ("以前的计划", "flashback"),  # flashback wins
            ("Do you remember the tavern?", "flashback"),
            ("We used to live here", "flashback"),
            ("What will you do tomorrow?", "future"),
            ("I'm going to the market", "future"),
            ("Willow trees on the planet", "none"),  # word boundaries
        ],
    )
    def test_message(self, message, mode):
        assert run(snapshot(), message).state.context.cue_mode == mode
        assert detect_cue_mode([message]) == mode

    def test_cue_on_boundaries_in_the_second_text(self):
        assert detect_cue_mode(["Willow trees", "I will go"]) == "future"
        assert detect_cue_mode(["Willow trees", "the planet"]) == "none"
        assert detect_cue_mode(["", "remember me", "明天"]) == "flashback"

    def test_only_newest_assistant_line_and_message_are_scanned(self):
        """Departure 8 (§7 item 16): an old 明天 in the context no longer enables future nodes."""
        recent = ["[user]: 明天去哪", "[assistant]: 明天去钟楼", "[assistant]: 好的", "[user]: 现场怎么样"]
        assert run(snapshot(), "现场怎么样", recent).state.context.cue_mode == "none"
        recent = ["[assistant]: 我们以前来过这里", "[user]: 现场怎么样"]
        assert run(snapshot(), "现场怎么样", recent).state.context.cue_mode == "flashback"


class TestScenario19Context:
    def test_scenario_19_region_owner_and_user_owner(self):
        """Scenario 19's context: active region 钟楼, adjacent [旧城区], character owners [艾琳], user owner
        玩家 (the buckets themselves are the scoring stage's)."""
        snap = snapshot(
            [pov("pov-1", "艾琳"), node("x", "location", name="钟楼")],
            regions=RegionState(adjacency_map={"钟楼": RegionAdjacency(adjacent=("旧城区",))}),
            knowledge=knowledge(owner("艾琳"), owner("露西亚")),
            history=HistoryState(active_user_pov_owner="玩家"),
        )
        res = run(snap, "艾琳在做什么", active_region="钟楼")
        ctx = res.state.context
        assert (ctx.active_region, ctx.adjacent_regions) == ("钟楼", ("旧城区",))
        assert ctx.owner_keys == ("character:艾琳",)
        assert ctx.active_user_pov_owner == "玩家"
        assert res.state.meta["activeUserPovOwner"] == "玩家"

    def test_user_owner_order(self):
        snap = snapshot(history=HistoryState(active_user_pov_owner="H"))
        assert run(snap, "x", active_user_pov_owner="Q").state.context.active_user_pov_owner == "Q"
        assert run(snap, "x", host_user_name="U").state.context.active_user_pov_owner == "H"
        assert run(snapshot(), "x", host_user_name="U").state.context.active_user_pov_owner == "U"


class TestContract:
    def test_empty_input_skips_with_a_reason(self):
        res = run(snapshot(), "")
        assert res.trace.skipped and res.trace.skip_reason == "empty-input"
        assert res.state.context.owner_mode == "unresolved"
        assert res.trace.name == "context"

    def test_empty_graph_with_text_resolves_a_default_context(self):
        res = run(snapshot(), "where now?")
        assert not res.trace.skipped
        assert res.state.context.owner_mode == "unresolved"
        assert res.state.meta["activeRecallOwnerKeys"] == []
        assert res.trace.score_direction == "higher_is_better"

    def test_input_not_mutated(self):
        snap = snapshot([node("erin", name="Erin")], knowledge=knowledge(owner("Erin", node_id="erin")))
        state = make_state(snap, "Erin?", ["[assistant]: 明天见"], active_region="钟楼")
        assert_not_mutated(state, STAGE.run)

    def test_deterministic(self):
        snap = snapshot(knowledge=knowledge(*(owner(f"O{i}", updated_at=i % 2) for i in range(9))))
        state = make_state(snap, "O1 O2 O3 O4 O5")
        assert result_image(STAGE.run(state)) == result_image(STAGE.run(state))
