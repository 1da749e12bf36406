"""ST-BME graph export import/export (``memory_recall.ingest.stbme``)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from memory_recall.errors import InputError
from memory_recall.ingest.stbme import (
    GRAPH_VERSION,
    ImportReport,
    export_stbme,
    import_stbme,
    import_stbme_report,
)
from memory_recall.model import INHIBIT_EDGE_TYPE, MemoryGraph

NOW = 1_767_225_600_000
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "chats"
GRAPH_FILES = sorted(FIXTURES.glob("*/graph.json"))

NODE_KEYS = {
    "id",
    "type",
    "level",
    "parentId",
    "childIds",
    "seq",
    "seqRange",
    "archived",
    "fields",
    "embedding",
    "importance",
    "accessCount",
    "lastAccessTime",
    "createdTime",
    "updatedAt",
    "prevId",
    "nextId",
    "clusters",
    "scope",
    "storyTime",
    "storyTimeSpan",
}
EDGE_KEYS = {
    "id",
    "fromId",
    "toId",
    "relation",
    "strength",
    "edgeType",
    "validAt",
    "invalidAt",
    "expiredAt",
    "createdTime",
    "updatedAt",
    "scope",
}


def _node(node_id: str | int | None = "n1", type_: str = "event", **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": type_, "fields": {"title": f"title of {node_id}"}, "seq": 3}
    if node_id is not None:
        node["id"] = node_id
    node.update(extra)
    return node


def _graph(*nodes: dict[str, Any], edges: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"version": 9, "nodes": list(nodes), "edges": edges or [], **extra}


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, sort_keys=True)


def _rich_raw() -> dict[str, Any]:
    """A hand-written, non-canonical reference graph touching every import rule."""
    return {
        "version": 9,
        "nodes": [
            {
                "id": "ev-1",
                "type": "event",
                "fields": {"title": "艾琳在钟楼发现了地下入口", "summary": "地下入口"},
                "seq": 4,
                "seqRange": [2, 7],
                "importance": 12,
                "embedding": [0.1, 0.2],
                "clusters": ["c1"],
                "customFlag": {"a": [1, 2]},
                "createdTime": 1_700_000_000_000,
                "updatedAt": 1_700_000_000_500,
                "lastAccessTime": 1_700_000_000_900,
                "accessCount": 2,
                "scope": {
                    "layer": "objective",
                    "regionPrimary": "王都/钟楼",
                    "regionSecondary": "旧城区, 集市 / 钟楼",
                },
                "storyTime": {
                    "segmentId": "s-now",
                    "label": "第二天清晨",
                    "tense": "ongoing",
                    "relation": "same",
                    "confidence": "high",
                    "source": "extract",
                },
            },
            {
                "id": "pov-1",
                "type": "pov_memory",
                "seq": 7,
                "fields": {
                    "summary": "艾琳觉得地下室入口说明钟楼里有人长期活动",
                    "belief": "这里藏着失踪案线索",
                },
                "scope": {"layer": "pov", "ownerType": "character", "ownerName": "艾琳"},
            },
            {
                "id": "pov-u",
                "type": "pov_memory",
                "seq": 7,
                "fields": {"summary": "玩家把钟楼和失踪案绑在一起"},
                "scope": {"layer": "pov", "ownerType": "user", "ownerName": "玩家"},
            },
            {"id": "old", "type": "event", "archived": True, "seq": 1, "fields": {"title": "旧传言"}},
            {"id": "char-erin", "type": "character", "seq": 0, "fields": {"name": "艾琳"}},
            {"type": "rule", "fields": {"title": "入夜后钟楼禁入"}, "seq": 1, "importance": -2},
            {
                "id": "broken",
                "type": "thread",
                "fields": {"title": "no range"},
                "seqRange": None,
                "storyTimeSpan": {
                    "startSegmentId": "s-prev",
                    "endSegmentId": "s-now",
                    "startLabel": "昨夜冲突之后",
                    "endLabel": "第二天清晨",
                    "mixed": True,
                },
            },
        ],
        "edges": [
            {"id": "e1", "fromId": "ev-1", "toId": "pov-1", "relation": "related", "strength": 1.7},
            {
                "id": "e2",
                "fromId": "ev-1",
                "toId": "old",
                "relation": "contradicts",
                "edgeType": 255,
                "strength": 0.9,
                "note": "kept",
            },
            {
                "id": "e3",
                "fromId": "ev-1",
                "toId": "char-erin",
                "relation": "involved_in",
                "invalidAt": 1_700_000_100_000,
                "validAt": 1_600_000_000_000,
            },
            {"fromId": "pov-u", "toId": "ev-1", "relation": "related"},
        ],
        "historyState": {
            "activeRegion": "钟楼",
            "activeCharacterPovOwner": "艾琳",
            "activeUserPovOwner": "玩家",
            "activeStorySegmentId": "s-now",
            "recentRecallOwnerKeys": ["character:艾琳"],
        },
        "knowledgeState": {
            "owners": {
                "character:艾琳": {
                    "ownerType": "character",
                    "ownerKey": "character:艾琳",
                    "ownerName": "艾琳",
                    "nodeId": "char-erin",
                    "aliases": ["Erin"],
                    "knownNodeIds": ["pov-1", "ev-1"],
                    "mistakenNodeIds": ["old"],
                    "visibilityScores": {"ev-1": 1, "broken": 0.4},
                    "manualKnownNodeIds": ["ev-1"],
                    "manualHiddenNodeIds": ["pov-u"],
                    "updatedAt": 1_700_000_000_000,
                    "lastSource": "extract",
                },
                "user:玩家": {
                    "ownerType": "user",
                    "ownerKey": "user:玩家",
                    "ownerName": "玩家",
                    "knownNodeIds": ["pov-u"],
                    "visibilityScores": {"ev-1": 0.7},
                },
            }
        },
        "regionState": {
            "adjacencyMap": {
                "钟楼": {"adjacent": ["旧城区"], "aliases": ["王都钟楼"], "source": "extract"},
                "旧城区": ["钟楼", "集市"],
            },
            "manualActiveRegion": "",
            "recentRegions": ["钟楼", "旧城区"],
        },
        "timelineState": {
            "segments": [
                {"id": "s-prev", "label": "昨夜冲突之后", "order": 4},
                {"id": "s-now", "label": "第二天清晨", "order": 5, "aliases": ["清晨"]},
            ],
            "nextOrder": 6,
            "manualActiveSegmentId": "",
            "recentSegmentIds": ["s-now"],
        },
        "summaryState": {
            "entries": [
                {
                    "id": "sum-1",
                    "level": 0,
                    "kind": "small",
                    "status": "active",
                    "text": "艾琳回到钟楼。",
                    "messageRange": [2, 7],
                    "storyTimeSpan": {"startLabel": "昨夜冲突之后", "endLabel": "第二天清晨"},
                },
                {
                    "id": "sum-0",
                    "level": 0,
                    "kind": "small",
                    "status": "folded",
                    "text": "旧的。",
                    "messageRange": [0, 1],
                },
            ],
            "activeEntryIds": ["sum-1"],
        },
        "batchJournal": [{"processedRange": [2, 7], "extra": 1}],
        "lastProcessedSeq": 7,
        "lastRecallResult": ["ev-1"],
        "vectorIndexState": {"dirty": False, "hashToNodeId": {"x": "ev-1"}},
        "maintenanceJournal": [],
    }


# ------------------------------------------------------------------------------------------------------------
# Input forms and wrappers
# ------------------------------------------------------------------------------------------------------------


class TestInputForms:
    def test_dict_text_bytes_and_path_agree(self, tmp_path: Path) -> None:
        raw = _rich_raw()
        text = json.dumps(raw, ensure_ascii=False)
        path = tmp_path / "graph.json"
        path.write_text(text, "utf-8")
        expected = import_stbme(raw, now_ms=NOW)
        assert import_stbme(text, now_ms=NOW) == expected
        assert import_stbme(text.encode("utf-8"), now_ms=NOW) == expected
        assert import_stbme("\ufeff".encode() + text.encode("utf-8"), now_ms=NOW) == expected
        assert import_stbme(path, now_ms=NOW) == expected

    @pytest.mark.parametrize(
        "wrap",
        [
            lambda g: {"graph": g},
            lambda g: {"data": g, "meta": {"exportedBy": "st-bme"}},
            lambda g: {"chat_metadata": {"st_bme": {"graph": g}}},
            lambda g: {"graph": json.dumps(g)},
        ],
        ids=["graph-key", "data-key", "nested", "json-string"],
    )
    def test_wrapper_is_detected(self, wrap: Any) -> None:
        raw = _rich_raw()
        assert import_stbme(wrap(raw), now_ms=NOW) == import_stbme(raw, now_ms=NOW)

    def test_two_wrapped_graphs_are_ambiguous(self) -> None:
        with pytest.raises(InputError, match="several graph objects"):
            import_stbme({"a": _graph(_node()), "b": _graph(_node())}, now_ms=NOW)

    def test_input_is_not_mutated(self) -> None:
        raw = _rich_raw()
        before = copy.deepcopy(raw)
        graph = import_stbme(raw, now_ms=NOW)
        assert raw == before
        exported = export_stbme(graph)
        exported["nodes"][0]["fields"]["title"] = "changed"
        exported["nodes"][0]["customFlag"]["a"].append(3)
        assert graph.nodes[0].fields["title"] == "艾琳在钟楼发现了地下入口"
        assert graph.nodes[0].extra["customFlag"] == {"a": [1, 2]}


class TestBrokenInput:
    @pytest.mark.parametrize(
        ("data", "field", "reason"),
        [
            ("{not json", "data", "not valid JSON"),
            (b"\xff\xfe\x00", "data", "not UTF-8"),
            ("[1, 2]", "graph", "must be a JSON object"),
            ({"hello": 1}, "graph", "no 'nodes' list"),
            ({"nodes": {"a": 1}}, "nodes", "must be an array"),
            ({"nodes": [{"id": "a", "type": "event"}, 3]}, "nodes[1]", "must be an object"),
            ({"nodes": [], "edges": "x"}, "edges", "must be an array"),
            (
                {"nodes": [{"id": "a", "type": "event", "fields": [1]}]},
                "nodes[0].fields",
                "must be an object",
            ),
            ({"nodes": [{"id": ["a"], "type": "event"}]}, "nodes[0].id", "must be a string"),
            ({"nodes": [{"id": "a", "type": "event", "level": 999}]}, "nodes[0].level", "less than or equal"),
            ({"nodes": [{"id": "x" * 200, "type": "event"}]}, "nodes[0].id", "at most 128"),
        ],
    )
    def test_structural_errors(self, data: Any, field: str, reason: str) -> None:
        with pytest.raises(InputError) as info:
            import_stbme(data, now_ms=NOW)
        assert info.value.field == field
        assert reason in info.value.reason

    def test_unknown_node_type_names_the_field(self) -> None:
        with pytest.raises(InputError) as info:
            import_stbme(_graph(_node("a"), _node("b", type_="quest")), now_ms=NOW)
        assert info.value.field == "nodes[1].type"
        assert "quest" in info.value.reason

    def test_duplicate_node_id(self) -> None:
        with pytest.raises(InputError) as info:
            import_stbme(_graph(_node("a"), _node("a")), now_ms=NOW)
        assert info.value.field == "nodes[1].id"

    def test_missing_path(self, tmp_path: Path) -> None:
        with pytest.raises(InputError) as info:
            import_stbme(tmp_path / "nope.json", now_ms=NOW)
        assert info.value.field == "path"

    @pytest.mark.parametrize("now_ms", [-1, 1.5, True, None])
    def test_now_ms_is_validated(self, now_ms: Any) -> None:
        with pytest.raises(InputError) as info:
            import_stbme(_graph(_node()), now_ms=now_ms)
        assert info.value.field == "now_ms"


# ------------------------------------------------------------------------------------------------------------
# Node, edge and state rules
# ------------------------------------------------------------------------------------------------------------


class TestNodeRules:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [(99, 10.0), (-3, 0.0), (7.5, 7.5), ("high", 5.0), (None, 5.0), (float("nan"), 5.0), (True, 5.0)],
    )
    def test_importance_clamped(self, value: Any, expected: float) -> None:
        graph = import_stbme(_graph(_node(importance=value)), now_ms=NOW)
        assert graph.nodes[0].importance == expected

    @pytest.mark.parametrize(
        ("extra", "expected"),
        [
            ({}, (3, 3)),
            ({"seqRange": [1, 5]}, (1, 5)),
            ({"seqRange": [5, 1]}, (1, 5)),
            ({"seqRange": [1.9, 4.2]}, (1, 4)),
            ({"seqRange": None}, None),
            ({"seqRange": [1, "x"]}, None),
            ({"seqRange": [1, float("inf")]}, None),
            ({"seqRange": [2]}, None),
        ],
    )
    def test_seq_range(self, extra: dict[str, Any], expected: tuple[int, int] | None) -> None:
        graph = import_stbme(_graph(_node(**extra)), now_ms=NOW)
        assert graph.nodes[0].seq_range == expected

    def test_seq_defaults_to_zero(self) -> None:
        node = {"id": "a", "type": "event"}
        graph = import_stbme(_graph(node), now_ms=NOW)
        assert (graph.nodes[0].seq, graph.nodes[0].seq_range) == (0, (0, 0))

    def test_derived_id_is_deterministic(self) -> None:
        raw = _node(None, fields={"title": "x"})
        raw["embedding"] = [1.0, 2.0]
        canonical = json.dumps(
            {k: v for k, v in raw.items() if k != "embedding"},
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )
        expected = "imp:" + hashlib.sha1(canonical.encode()).hexdigest()[:16]
        first = import_stbme(_graph(raw), now_ms=NOW)
        second = import_stbme(_graph(copy.deepcopy(raw)), now_ms=NOW + 1)
        assert first.nodes[0].id == second.nodes[0].id == expected

    def test_identical_nodes_without_id_get_distinct_ids(self) -> None:
        graph = import_stbme(_graph(_node(None), _node(None), _node(None)), now_ms=NOW)
        ids = [n.id for n in graph.nodes]
        assert len(set(ids)) == 3
        assert all(i.startswith("imp:") and len(i) == 20 for i in ids)
        assert ids == [
            n.id for n in import_stbme(_graph(_node(None), _node(None), _node(None)), now_ms=0).nodes
        ]

    def test_numeric_id_becomes_string(self) -> None:
        graph = import_stbme(_graph(_node(17), _node("b"), edges=[{"fromId": 17, "toId": "b"}]), now_ms=NOW)
        assert graph.nodes[0].id == "17"
        assert graph.edges[0].from_id == "17"

    def test_embedding_dropped_and_exported_as_null(self) -> None:
        graph = import_stbme(_graph(_node(embedding=[0.5, 0.5])), now_ms=NOW)
        assert "embedding" not in graph.nodes[0].extra
        assert export_stbme(graph)["nodes"][0]["embedding"] is None

    def test_unknown_keys_survive_export(self) -> None:
        graph = import_stbme(_graph(_node(customFlag={"a": 1}, clusters=["c1"])), now_ms=NOW)
        node = graph.nodes[0]
        assert node.extra == {"customFlag": {"a": 1}, "clusters": ["c1"]}
        exported = export_stbme(graph)["nodes"][0]
        assert exported["customFlag"] == {"a": 1}
        assert exported["clusters"] == ["c1"]

    def test_empty_clusters_are_not_extra(self) -> None:
        graph = import_stbme(_graph(_node(clusters=[])), now_ms=NOW)
        assert graph.nodes[0].extra == {}

    def test_missing_timestamps_become_now(self) -> None:
        node = import_stbme(_graph(_node()), now_ms=NOW).nodes[0]
        assert (node.created_time, node.updated_at, node.last_access_time) == (NOW, NOW, NOW)

    def test_iso_and_unreadable_timestamps(self) -> None:
        report = import_stbme_report(
            _graph(_node(createdTime="2026-01-01T00:00:00Z", updatedAt="soon", lastAccessTime=-5)), now_ms=NOW
        )
        node = report.graph.nodes[0]
        assert node.created_time == 1_767_225_600_000
        assert (node.updated_at, node.last_access_time) == (NOW, NOW)
        assert [w.split(":")[0] for w in report.warnings] == ["nodes[0].lastAccessTime", "nodes[0].updatedAt"]

    def test_scope_is_normalised(self) -> None:
        raw = _node(
            scope={
                "layer": "objective",
                "regionPrimary": "王都/钟楼",
                "regionSecondary": "旧城区, 集市 / 下水道 / 钟楼",
                "ownerType": "character",
            }
        )
        scope = import_stbme(_graph(raw), now_ms=NOW).nodes[0].scope
        assert scope.region_primary == "钟楼"
        assert scope.region_path == ("王都", "钟楼")
        assert scope.region_secondary == ("旧城区", "集市", "下水道")
        assert scope.owner_type == ""

    def test_pov_owner_key(self) -> None:
        raw = _node(type_="pov_memory", scope={"layer": "pov", "ownerType": "character", "ownerName": "Erin"})
        assert import_stbme(_graph(raw), now_ms=NOW).nodes[0].scope.owner_key == "character:erin"

    def test_story_time_out_of_vocabulary_values(self) -> None:
        raw = _node(
            storyTime={
                "label": "dawn",
                "tense": "later",
                "relation": 3,
                "confidence": "sure",
                "source": "llm",
                "mood": "x",
            }
        )
        report = import_stbme_report(_graph(raw), now_ms=NOW)
        st = report.graph.nodes[0].story_time
        assert (st.label, st.tense, st.relation, st.confidence, st.source) == (
            "dawn",
            "unknown",
            "unknown",
            "medium",
            "derived",
        )
        # An unknown key is kept (Node.extra under the object's key) and written back into the object.
        assert report.warnings == []
        assert report.graph.nodes[0].extra == {"storyTime": {"mood": "x"}}
        assert export_stbme(report.graph)["nodes"][0]["storyTime"]["mood"] == "x"

    def test_non_finite_importance_is_reported(self) -> None:
        """``Infinity``/``NaN`` (Python's json reads them) fall back to 5 — and the import says so."""
        raw = json.loads('{"nodes": [{"id": "n1", "type": "event", "importance": Infinity}], "edges": []}')
        report = import_stbme_report(raw, now_ms=NOW)
        assert report.graph.nodes[0].importance == 5.0
        assert report.warnings == ["nodes[0].importance: inf is not a finite number; 5 used"]

    def test_dangling_prev_id_warns_and_is_kept(self) -> None:
        report = import_stbme_report(_graph(_node(prevId="ghost")), now_ms=NOW)
        assert report.graph.nodes[0].prev_id == "ghost"
        assert "nodes[0].prevId" in report.warnings[0]


class TestEdgeRules:
    @pytest.mark.parametrize(
        ("value", "expected"), [(1.7, 1.0), (-1, 0.0), (0.25, 0.25), (None, 0.8), ("x", 0.8)]
    )
    def test_strength_clamped(self, value: Any, expected: float) -> None:
        edge = {"id": "e", "fromId": "a", "toId": "b", "strength": value}
        graph = import_stbme(_graph(_node("a"), _node("b"), edges=[edge]), now_ms=NOW)
        assert graph.edges[0].strength == expected

    def test_inhibit_and_invalidated_edges_kept(self) -> None:
        graph = import_stbme(_rich_raw(), now_ms=NOW)
        by_id = {e.id: e for e in graph.edges}
        assert by_id["e2"].edge_type == INHIBIT_EDGE_TYPE and by_id["e2"].inhibit
        assert by_id["e2"].extra == {"note": "kept"}
        assert by_id["e3"].invalid_at == 1_700_000_100_000
        assert not by_id["e3"].active(NOW)
        assert by_id["e1"].active(NOW)

    def test_skipped_edges_are_reported(self) -> None:
        edges = [
            {"id": "ok", "fromId": "a", "toId": "b"},
            {"id": "dangling", "fromId": "a", "toId": "ghost"},
            {"id": "loop", "fromId": "a", "toId": "a"},
            {"id": "ok", "fromId": "b", "toId": "a"},
            {"id": "no-ends", "toId": "a"},
        ]
        report = import_stbme_report(_graph(_node("a"), _node("b"), edges=edges), now_ms=NOW)
        assert [e.id for e in report.graph.edges] == ["ok"]
        assert report.warnings == [
            "edges[1]: points at missing node 'ghost'; skipped",
            "edges[2]: fromId equals toId ('a'); skipped",
            "edges[3]: duplicate edge id 'ok' skipped",
            "edges[4]: missing fromId/toId; skipped",
        ]

    def test_non_finite_strength_is_reported(self) -> None:
        raw = _graph(_node("a"), _node("b"), edges=[{"id": "e", "fromId": "a", "toId": "b", "strength": float("nan")}])
        report = import_stbme_report(raw, now_ms=NOW)
        assert report.graph.edges[0].strength == 0.8
        assert report.warnings == ["edges[0].strength: nan is not a finite number; 0.8 used"]

    def test_import_stbme_keeps_going_on_warnings(self) -> None:
        edges = [{"id": "dangling", "fromId": "a", "toId": "ghost"}]
        graph = import_stbme(_graph(_node("a"), edges=edges), now_ms=NOW)
        assert graph.edges == ()

    def test_edge_defaults(self) -> None:
        graph = import_stbme(_graph(_node("a"), _node("b"), edges=[{"fromId": "a", "toId": "b"}]), now_ms=NOW)
        edge = graph.edges[0]
        assert edge.id.startswith("imp:")
        assert (edge.relation, edge.strength, edge.edge_type) == ("related", 0.8, 0)
        assert (edge.valid_at, edge.invalid_at, edge.expired_at) == (None, None, None)
        assert (edge.created_time, edge.updated_at) == (NOW, NOW)

    @pytest.mark.parametrize("edge_type", [256, -1, 2.5, "inhibit"])
    def test_bad_edge_type_falls_back_to_zero(self, edge_type: Any) -> None:
        edge = {"id": "e", "fromId": "a", "toId": "b", "edgeType": edge_type}
        report = import_stbme_report(_graph(_node("a"), _node("b"), edges=[edge]), now_ms=NOW)
        assert report.graph.edges[0].edge_type == 0
        assert report.warnings[0].startswith("edges[0].edgeType")


class TestStateRules:
    def test_knowledge_ids_of_missing_nodes_are_pruned(self) -> None:
        owners = {
            "character:a": {
                "ownerType": "character",
                "ownerKey": "character:a",
                "ownerName": "A",
                "knownNodeIds": ["n1", "ghost"],
                "visibilityScores": {"n1": 3, "ghost": 1},
            }
        }
        report = import_stbme_report(_graph(_node("n1"), knowledgeState={"owners": owners}), now_ms=NOW)
        owner = report.graph.knowledge.owners["character:a"]
        assert owner.known_node_ids == ("n1",)
        assert owner.visibility_scores == {"n1": 1.0}
        assert report.warnings == [
            "knowledgeState.owners['character:a']: 2 reference(s) to missing nodes pruned"
        ]

    def test_owner_id_lists_capped_at_512(self) -> None:
        nodes = [_node(f"n{i}") for i in range(600)]
        owners = {
            "user:me": {
                "ownerType": "user",
                "ownerKey": "user:me",
                "ownerName": "me",
                "knownNodeIds": [f"n{i}" for i in range(600)],
            }
        }
        graph = import_stbme(_graph(*nodes, knowledgeState={"owners": owners}), now_ms=NOW)
        assert graph.knowledge.owners["user:me"].known_node_ids == tuple(f"n{i}" for i in range(512))

    def test_owner_type_inferred_or_skipped(self) -> None:
        owners = {
            "character:b": {"ownerName": "B"},
            "nobody": {"ownerName": "?"},
        }
        report = import_stbme_report(_graph(_node(), knowledgeState={"owners": owners}), now_ms=NOW)
        assert list(report.graph.knowledge.owners) == ["character:b"]
        assert report.graph.knowledge.owners["character:b"].updated_at == NOW
        assert "skipped" in report.warnings[0]

    def test_rich_state(self) -> None:
        graph = import_stbme(_rich_raw(), now_ms=NOW)
        erin = graph.knowledge.owners["character:艾琳"]
        assert erin.mistaken_node_ids == ("old",)
        assert erin.manual_hidden_node_ids == ("pov-u",)
        assert erin.visibility_scores == {"ev-1": 1.0, "broken": 0.4}
        assert graph.regions.adjacency_map["旧城区"].adjacent == ("钟楼", "集市")
        assert graph.regions.canonical("王都钟楼") == "钟楼"
        assert [s.order for s in graph.timeline.segments] == [4, 5]
        assert graph.timeline.next_order == 6
        assert [e.id for e in graph.summaries.active_entries()] == ["sum-1"]
        assert graph.summaries.entries[1].status == "folded"
        assert graph.history.active_region == "钟楼"
        assert graph.history.last_processed_assistant_floor == 7
        assert [j.processed_range for j in graph.batch_journal] == [(2, 7)]

    def test_segment_without_order_is_appended(self) -> None:
        timeline = {
            "segments": [{"id": "a", "order": 3}, {"id": "b"}, {"id": "a", "order": 9}],
            "nextOrder": 2,
        }
        report = import_stbme_report(_graph(_node(), timelineState=timeline), now_ms=NOW)
        assert [(s.id, s.order) for s in report.graph.timeline.segments] == [("a", 3), ("b", 4)]
        assert report.graph.timeline.next_order == 5
        assert len(report.warnings) == 2

    def test_summary_vocabulary_falls_back(self) -> None:
        summaries = {"entries": [{"text": "t", "kind": "huge", "status": "gone", "messageRange": [3, "x"]}]}
        entry = import_stbme(_graph(_node(), summaryState=summaries), now_ms=NOW).summaries.entries[0]
        assert (entry.kind, entry.status, entry.message_range, entry.created_at) == (
            "small",
            "active",
            None,
            NOW,
        )
        assert entry.id.startswith("imp:")

    def test_last_processed_seq_fills_history(self) -> None:
        graph = import_stbme(_graph(_node(), lastProcessedSeq=12), now_ms=NOW)
        assert graph.history.last_processed_assistant_floor == 12
        assert export_stbme(graph)["lastProcessedSeq"] == 12


# ------------------------------------------------------------------------------------------------------------
# Export and round trips
# ------------------------------------------------------------------------------------------------------------


class TestExport:
    def test_shape(self) -> None:
        data = export_stbme(import_stbme(_rich_raw(), now_ms=NOW))
        assert data["version"] == GRAPH_VERSION == 9
        assert {
            "nodes",
            "edges",
            "historyState",
            "knowledgeState",
            "regionState",
            "timelineState",
            "summaryState",
            "batchJournal",
            "lastProcessedSeq",
            "lastRecallResult",
            "vectorIndexState",
            "maintenanceJournal",
        } <= set(data)
        assert data["lastRecallResult"] is None
        assert data["vectorIndexState"] == {"dirty": True}
        for node in data["nodes"]:
            assert NODE_KEYS <= set(node)
            assert node["embedding"] is None
        for edge in data["edges"]:
            assert EDGE_KEYS <= set(edge)
        assert set(data["nodes"][0]["scope"]) == {
            "layer",
            "ownerType",
            "ownerId",
            "ownerName",
            "regionPrimary",
            "regionPath",
            "regionSecondary",
        }
        json.dumps(data, allow_nan=False)

    def test_empty_graph(self) -> None:
        data = export_stbme(MemoryGraph())
        assert data["nodes"] == [] and data["lastProcessedSeq"] == -1
        assert import_stbme(data, now_ms=NOW) == MemoryGraph()

    def test_report_type(self) -> None:
        report = import_stbme_report(_rich_raw(), now_ms=NOW)
        assert isinstance(report, ImportReport)
        assert report.warnings == []


class TestRoundTrip:
    def test_rich_raw_round_trip(self) -> None:
        first = import_stbme(_rich_raw(), now_ms=NOW)
        exported = export_stbme(first)
        again = import_stbme(json.loads(_dumps(exported)), now_ms=NOW + 99)
        assert again == first
        assert _dumps(export_stbme(again)) == _dumps(exported)

    @pytest.mark.parametrize("path", GRAPH_FILES, ids=[p.parent.name for p in GRAPH_FILES])
    def test_fixture_round_trip(self, path: Path) -> None:
        raw = json.loads(path.read_text("utf-8"))
        first = import_stbme(raw, now_ms=NOW)
        exported = export_stbme(first)
        second = import_stbme(exported, now_ms=NOW + 1)
        assert second == first
        assert _dumps(export_stbme(second)) == _dumps(exported)
        # The fixture files are stored in canonical export form.
        assert _dumps(exported) == _dumps(raw)

    def test_fixture_corpus_covers_the_format(self) -> None:
        assert GRAPH_FILES, "no fixture graphs found"
        graph = import_stbme(FIXTURES / "zh-bell-tower" / "graph.json", now_ms=NOW)
        owners = graph.knowledge.owners.values()
        pov_types = {n.scope.owner_type for n in graph.nodes if n.type == "pov_memory"}
        assert pov_types == {"character", "user"}
        assert any(o.known_node_ids for o in owners)
        assert any(o.mistaken_node_ids for o in owners)
        assert any(o.visibility_scores for o in owners)
        assert any(o.manual_hidden_node_ids for o in owners)
        assert any(o.manual_known_node_ids for o in owners)
        assert any(a.adjacent and a.aliases for a in graph.regions.adjacency_map.values())
        assert graph.timeline.segments
        assert {e.status for e in graph.summaries.entries} == {"active", "folded"}
        assert any(e.inhibit and e.relation == "contradicts" for e in graph.edges)
        assert any(e.invalid_at is not None for e in graph.edges)
        assert any(n.archived for n in graph.nodes)
        assert any("\u4e00" <= ch <= "\u9fff" for n in graph.nodes for ch in n.label())


def test_timeline_segment_keys_the_model_does_not_read_are_kept_and_written_back() -> None:
    """A real ST-BME export's segments carry ``confidence``, ``matcherKey``, ``source`` and ``updatedAt``: kept in
    ``StorySegment.extra`` without a warning and exported again, so a round trip loses nothing."""
    data = json.loads((FIXTURES / "en-thornwick-manor" / "graph.json").read_text(encoding="utf-8"))
    extra = {"confidence": "high", "matcherKey": "thursday-night", "source": "extract", "updatedAt": 1767298710000,
             "nested": {"a": [1, 2]}}
    data["timelineState"]["segments"][0].update(extra)
    report = import_stbme_report(data, now_ms=0)
    assert report.warnings == []
    segment = report.graph.timeline.segments[0]
    assert segment.id == "seg-thu-night" and segment.extra == extra
    exported = export_stbme(report.graph)
    assert exported["timelineState"]["segments"][0] == data["timelineState"]["segments"][0]
    assert export_stbme(import_stbme(exported, now_ms=0)) == exported
    # A key the model maps is never shadowed by an extra one of the same name.
    assert [k for k in exported["timelineState"]["segments"][0]][:8] == [
        "id", "label", "normalizedKey", "order", "aliases", "parentId", "relationToParent", "anchorLabel"]


def test_unknown_keys_of_nested_node_and_edge_objects_survive_a_round_trip() -> None:
    """Keys the model does not read inside a node's ``scope``/``storyTime``/``storyTimeSpan`` and an edge's ``scope``
    are written back into the same object; a key the model maps keeps the model's value."""
    data = json.loads((FIXTURES / "en-thornwick-manor" / "graph.json").read_text(encoding="utf-8"))
    node, edge = data["nodes"][0], data["edges"][0]
    node["scope"]["regionConfidence"] = 0.7
    node["storyTime"]["matcherKey"] = "thu"
    node["storyTimeSpan"]["note"] = {"x": [1]}
    edge["scope"]["regionConfidence"] = 0.4
    report = import_stbme_report(data, now_ms=0)
    assert report.warnings == []
    exported = export_stbme(report.graph)
    assert exported["nodes"][0] == node and exported["edges"][0] == edge
    assert export_stbme(import_stbme(exported, now_ms=0)) == exported
