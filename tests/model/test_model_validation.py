"""The data model: normalisation rules of the reference and typed errors that name the field."""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_recall.errors import InputError
from memory_recall.model import (
    ChatMessage,
    Edge,
    KnowledgeOwner,
    KnowledgeState,
    MemoryGraph,
    MemoryScope,
    Node,
    PersistedRecall,
    SummaryEntry,
    SummaryState,
    parse_edge,
    parse_node,
)
from memory_recall.model.graph import describe_memory_scope, embedding_text, split_region_tokens
from memory_recall.model.records import estimate_tokens


class TestMemoryScope:
    def test_reference_region_example(self) -> None:
        """Reference §1.4: primary "王都/钟楼", secondary "旧城区, 集市 / 下水道 / 钟楼"."""
        scope = MemoryScope(region_primary="王都/钟楼", region_secondary="旧城区, 集市 / 下水道 / 钟楼")
        assert scope.region_primary == "钟楼"
        assert scope.region_path == ("王都", "钟楼")
        assert scope.region_secondary == ("旧城区", "集市", "下水道")
        assert scope.region_tokens() == ["钟楼", "王都", "旧城区", "集市", "下水道"]

    def test_arrows_objects_and_case_insensitive_dedupe(self) -> None:
        assert split_region_tokens("王都 → 钟楼 > 顶层") == ["王都", "钟楼", "顶层"]
        assert split_region_tokens([{"name": "Harbor"}, "harbor", {"label": "Pier"}, None]) == ["Harbor", "Pier"]

    def test_nested_lists_flatten_in_order_at_any_depth(self) -> None:
        value = [("Harbor, Pier", [{"title": "Market"}, ["Docks"]]), {"name": " "}, {"text": "Gate"}, 7]
        assert split_region_tokens(value) == ["Harbor", "Pier", "Market", "Docks", "Gate", "7"]
        deep: list[Any] = ["Tower"]
        for _ in range(5000):  # deeper than Python's recursion limit
            deep = [deep, "Keep"]
        assert split_region_tokens(deep) == ["Tower", "Keep"]

    def test_parsing_a_scope_leaves_no_reference_cycle(self) -> None:
        """Every node parse builds a scope: garbage only the cyclic collector frees would pile up between its
        passes (under load it was 43,000 objects a second)."""
        gc.collect()
        gc.disable()
        try:
            for _ in range(50):
                split_region_tokens([{"name": "Harbor"}, "王都 → 钟楼", ("a", ["b"])])
                MemoryScope.model_validate({"layer": "pov", "owner_type": "character", "owner_name": "Erin",
                                            "region_primary": "王都/钟楼", "region_secondary": ["集市", "下水道"]})
            assert gc.collect() == 0
        finally:
            gc.enable()

    def test_owner_fields_only_on_pov(self) -> None:
        objective = MemoryScope(layer="objective", owner_type="character", owner_name="Erin")
        assert (objective.owner_type, objective.owner_name, objective.owner_key) == ("", "", "")
        pov = MemoryScope(layer="pov", owner_type="character", owner_name="Erin")
        assert (pov.owner_id, pov.owner_key) == ("Erin", "character:erin")
        assert MemoryScope(layer="POV").layer == "objective"  # only exactly "pov"
        assert MemoryScope(layer="pov", owner_type="npc", owner_name="X").owner_type == ""

    def test_describe(self) -> None:
        scope = MemoryScope(layer="pov", owner_type="user", owner_name="玩家", region_primary="钟楼")
        assert describe_memory_scope(scope) == "POV | user:玩家 | 地区:钟楼"
        assert describe_memory_scope(MemoryScope()) == "客观"


class TestNode:
    def test_defaults(self) -> None:
        node = Node(id="n1", type="event", seq=4)
        assert node.seq_range == (4, 4) and node.importance == 5.0 and node.recency == 4
        assert Node(id="n2", type="rule", seq_range=None).seq_range is None

    def test_embedding_text_order(self) -> None:
        """Preferred keys first, then the other fields as "key: value", then the scope lines."""
        node = Node(
            id="n", type="event",
            fields={
                "status": "open", "title": "Key", "summary": "Found it", "mood": "tense", "participants": ["A", "B"]
            },
            scope={"region_primary": "王都/钟楼", "region_secondary": "集市"},
        )
        assert embedding_text(node) == (
            "Found it | Key | A, B | open | mood: tense | memory_scope: 客观 | 地区:钟楼 | "
            "memory_region_path: 王都 / 钟楼 | memory_region_secondary: 集市"
        )

    @pytest.mark.parametrize(
        ("data", "field", "reason"),
        [
            ({"id": "a", "type": "evnt"}, "nodes[3].type", "unknown node type 'evnt'"),
            ({"id": "a", "type": "event", "importance": 11}, "nodes[3].importance", "less than or equal to 10"),
            ({"id": "a", "type": "event", "importance": math.nan}, "nodes[3].importance", "finite number"),
            ({"id": "", "type": "event"}, "nodes[3].id", "must not be empty"),
            ({"id": "a\x00", "type": "event"}, "nodes[3].id", "control characters"),
            ({"id": "x" * 129, "type": "event"}, "nodes[3].id", "at most 128 characters"),
            ({"id": "a", "type": "event", "seq_range": [5, 2]}, "nodes[3]", "seq_range start 5 is after its end 2"),
            ({"id": "a", "type": "event", "fields": {"w": math.inf}}, "nodes[3].fields", "w: must be a finite"),
            ({"id": "a", "type": "event", "bogus": 1}, "nodes[3].bogus", "Extra inputs are not permitted"),
            ({"id": "a", "type": "event", "created_time": -1}, "nodes[3].created_time", "greater than or equal"),
        ],
    )
    def test_invalid_nodes_name_the_field(self, data: dict[str, Any], field: str, reason: str) -> None:
        with pytest.raises(InputError) as info:
            parse_node(data, "nodes[3]")
        assert info.value.field == field
        assert reason in info.value.reason

    @settings(max_examples=150, deadline=None)
    @given(importance=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-100, 100)))
    def test_importance_is_in_range_or_rejected(self, importance: float) -> None:
        ok = isinstance(importance, int | float) and math.isfinite(importance) and 0 <= importance <= 10
        if ok:
            assert parse_node({"id": "a", "type": "event", "importance": importance}).importance == importance
        else:
            with pytest.raises(InputError) as info:
                parse_node({"id": "a", "type": "event", "importance": importance}, "n")
            assert info.value.field == "n.importance"

    @settings(max_examples=150, deadline=None)
    @given(type_=st.text(max_size=12))
    def test_only_schema_types(self, type_: str) -> None:
        known = {"event", "character", "location", "rule", "thread", "synopsis", "reflection", "pov_memory",
                 "message", "entity"}
        if type_ in known:
            assert parse_node({"id": "a", "type": type_}).type == type_
        else:
            with pytest.raises(InputError) as info:
                parse_node({"id": "a", "type": type_}, "n")
            assert info.value.field == "n.type"


class TestEdge:
    def test_activity(self) -> None:
        edge = Edge(id="e", from_id="a", to_id="b", invalid_at=100)
        assert edge.active(99) and not edge.active(100)
        assert Edge(id="f", from_id="a", to_id="b", edge_type=255).inhibit

    @pytest.mark.parametrize(
        ("data", "field"),
        [
            ({"id": "e", "from_id": "a", "to_id": "a"}, "edges[0]"),
            ({"id": "e", "from_id": "a", "to_id": "b", "strength": 1.5}, "edges[0].strength"),
            ({"id": "e", "from_id": "a", "to_id": "b", "edge_type": 256}, "edges[0].edge_type"),
            ({"id": "e", "from_id": "a", "to_id": ""}, "edges[0].to_id"),
        ],
    )
    def test_invalid_edges_name_the_field(self, data: dict[str, Any], field: str) -> None:
        with pytest.raises(InputError) as info:
            parse_edge(data, "edges[0]")
        assert info.value.field == field


class TestStateModels:
    def test_knowledge_owner_caps_and_key_check(self) -> None:
        owner = KnowledgeOwner(
            owner_type="character", owner_key="character:erin", known_node_ids=[f"n{i % 600}" for i in range(2000)]
        )
        assert len(owner.known_node_ids) == 512 and owner.known_node_ids[:2] == ("n0", "n1")
        with pytest.raises(ValueError, match="must start with 'user:'"):
            KnowledgeOwner(owner_type="user", owner_key="character:erin")
        with pytest.raises(ValueError, match="holds an entry keyed"):
            KnowledgeState(owners={"character:x": KnowledgeOwner(owner_type="character", owner_key="character:y")})

    def test_active_summary_order(self) -> None:
        state = SummaryState(
            entries=(
                SummaryEntry(id="b", level=0, message_range=(10, 12), text="T"),
                SummaryEntry(id="a", level=1, kind="rollup", message_range=(0, 9), text="R"),
                SummaryEntry(id="c", status="folded", message_range=(0, 3)),
                SummaryEntry(id="d", message_range=(20, 21)),
            ),
            active_entry_ids=("a", "b", "c"),
        )
        assert [e.id for e in state.active_entries()] == ["a", "b"]

    def test_graph_consistency(self) -> None:
        with pytest.raises(ValueError, match="points at missing node 'b'"):
            MemoryGraph(nodes=(Node(id="a", type="event"),), edges=(Edge(id="e", from_id="a", to_id="b"),))
        with pytest.raises(ValueError, match="duplicated"):
            MemoryGraph(nodes=(Node(id="a", type="event"), Node(id="a", type="rule")))


class TestChatAndRecords:
    def test_message_limits(self) -> None:
        with pytest.raises(ValueError, match="NUL"):
            ChatMessage(floor=0, role="user", text="a\x00b")
        with pytest.raises(ValueError, match="at most 200000 characters"):
            ChatMessage(floor=0, role="user", text="x" * 200_001)

    def test_record_text_and_ids(self) -> None:
        rec = PersistedRecall(chat_id="c", user_floor=2, injection_text="  block \n", selected_node_ids=[" a", "a", ""])
        assert rec.injection_text == "block" and rec.selected_node_ids == ("a",)
        with pytest.raises(ValueError, match="must not be blank"):
            PersistedRecall(chat_id="c", user_floor=2, injection_text="   ")

    def test_token_estimate(self) -> None:
        """Reference §2.4: ceil(cjk/2 + other/4)."""
        assert estimate_tokens("钟楼ab") == 2  # 2/2 + 2/4 = 1.5 → 2
        assert estimate_tokens("abcd") == 1 and estimate_tokens("") == 0
