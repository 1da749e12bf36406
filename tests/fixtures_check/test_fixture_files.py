"""Consistency checks of the roleplay fixtures in ``fixtures/chats/`` (layout: its ``README.md``)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from memory_recall.ingest.stbme import import_stbme_report
from memory_recall.model import ChatMessage, KnowledgeOwner, MemoryGraph

NOW = 1_767_225_600_000
ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "chats"
NAMES = sorted(p.name for p in ROOT.iterdir() if p.is_dir()) if ROOT.is_dir() else []
READABLE_ID = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)+$")
RECENT_LINE = re.compile(r"^\[(user|assistant)\]: \S")
QUESTION_KEYS = {
    "id",
    "input",
    "recent",
    "active_region",
    "active_owners",
    "exercises",
    "required",
    "expected",
    "why",
    "must_not",
    "must_not_why",
}


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf"


@cache
def _chat(name: str) -> dict[str, Any]:
    return json.loads((ROOT / name / "chat.json").read_text("utf-8"))


@cache
def _questions(name: str) -> list[dict[str, Any]]:
    return json.loads((ROOT / name / "questions.json").read_text("utf-8"))


@cache
def _graph(name: str) -> MemoryGraph:
    report = import_stbme_report(ROOT / name / "graph.json", now_ms=NOW)
    assert report.warnings == [], report.warnings
    return report.graph


def _bucket(graph: MemoryGraph, primary: str, tokens: list[str], active: str) -> str:
    """Objective region bucket of a scope relative to ``active`` (stbme-reference §1.4)."""
    adjacent = {a.lower() for a in graph.regions.adjacency_map[active].adjacent}
    if not primary:
        return "none"
    if primary.lower() == active.lower():
        return "current"
    if primary.lower() in adjacent or any(t.lower() in adjacent | {active.lower()} for t in tokens):
        return "adjacent"
    return "other"


def test_fixtures_exist() -> None:
    assert len(NAMES) >= 4


@pytest.mark.parametrize("name", NAMES)
class TestFixture:
    def test_files_present(self, name: str) -> None:
        assert {p.name for p in (ROOT / name).iterdir()} >= {"chat.json", "graph.json", "questions.json"}

    def test_chat_parses(self, name: str) -> None:
        chat = _chat(name)
        assert set(chat) == {"chat_id", "title", "language", "messages"}
        assert chat["chat_id"] == name
        assert chat["title"].strip()
        assert chat["language"] in ("en", "zh")
        messages = [ChatMessage.model_validate(m) for m in chat["messages"]]
        assert 20 <= len(messages) <= 40
        assert [m.floor for m in messages] == list(range(len(messages)))
        assert {m.role for m in messages} == {"user", "assistant"}
        assert all(m.text.strip() and m.speaker.strip() for m in messages)
        assert len({m.speaker for m in messages if m.role == "user"}) == 1

    def test_language_matches_text(self, name: str) -> None:
        chat = _chat(name)
        texts = [m["text"] for m in chat["messages"]] + [n.label() for n in _graph(name).nodes]
        for text in texts:
            letters = [ch for ch in text if ch.isalpha()]
            cjk = sum(1 for ch in letters if _is_cjk(ch))
            if chat["language"] == "zh":
                assert cjk >= 0.5 * len(letters), text
            else:
                assert cjk == 0, text
                assert sum(1 for ch in letters if ch.isascii()) >= 0.95 * len(letters), text

    def test_graph_imports_cleanly(self, name: str) -> None:
        graph = _graph(name)
        last_floor = len(_chat(name)["messages"]) - 1
        assert 25 <= len(graph.nodes) <= 60
        assert graph.edges
        segments = {s.id for s in graph.timeline.segments}
        for node in graph.nodes:
            assert READABLE_ID.match(node.id), node.id
            assert node.seq_range is not None and 0 <= node.seq_range[0] <= node.seq_range[1] <= last_floor, (
                node.id
            )
            for seg in (
                node.story_time.segment_id,
                node.story_time_span.start_segment_id,
                node.story_time_span.end_segment_id,
            ):
                assert not seg or seg in segments, (node.id, seg)
        for entry in graph.summaries.entries:
            assert entry.message_range is not None and entry.message_range[1] <= last_floor
        assert set(graph.summaries.active_entry_ids) <= {e.id for e in graph.summaries.entries}
        for owner in graph.knowledge.owners.values():
            assert not owner.node_id or owner.node_id in {n.id for n in graph.nodes}

    def test_questions(self, name: str) -> None:
        graph = _graph(name)
        nodes = {n.id: n for n in graph.nodes}
        questions = _questions(name)
        assert 4 <= len(questions) <= 6
        assert len({q["id"] for q in questions}) == len(questions)
        for q in questions:
            assert set(q) <= QUESTION_KEYS, q["id"]
            assert q["input"].strip()
            expected, must_not = q["expected"], q.get("must_not", [])
            assert expected, q["id"]
            # required: the memories the question cannot be answered without, a non-empty subset of expected
            required = q["required"]
            assert required and len(set(required)) == len(required) and set(required) <= set(expected), q["id"]
            assert len(set(expected)) == len(expected) and len(set(must_not)) == len(must_not)
            assert not set(expected) & set(must_not), q["id"]
            for node_id in expected + must_not:
                assert node_id in nodes, (q["id"], node_id)
            assert not any(nodes[i].archived for i in expected), q["id"]
            assert set(q["why"]) == set(expected) and all(w.strip() for w in q["why"].values())
            assert set(q.get("must_not_why", {})) == set(must_not)
            for line in q.get("recent", []):
                assert RECENT_LINE.match(line), line
            for key in q.get("active_owners", []):
                assert key in graph.knowledge.owners, (q["id"], key)
            if "active_region" in q:
                assert q["active_region"] in graph.regions.adjacency_map, (q["id"], q["active_region"])


@pytest.mark.parametrize("name", NAMES)
def test_labels_agree_with_the_knowledge_state(name: str) -> None:
    """Expected memories are visible to the scene's owners; every must-not memory has a reason to be gone."""
    graph = _graph(name)
    nodes = {n.id: n for n in graph.nodes}
    for q in _questions(name):
        owners = [graph.knowledge.owners[k] for k in q.get("active_owners", [])]
        keys = {o.owner_key for o in owners}

        for node_id in q["expected"]:
            node = nodes[node_id]
            assert not _hidden_from_all(owners, node_id), (q["id"], node_id)
            if owners:
                assert any(
                    node_id in o.known_node_ids
                    or node_id in o.manual_known_node_ids
                    or o.visibility_scores.get(node_id, 0.0) >= 0.5
                    for o in owners
                ), (q["id"], node_id)
                if node.type == "pov_memory":
                    assert node.scope.owner_key in keys, (q["id"], node_id)
        for node_id in q.get("must_not", []):
            node = nodes[node_id]
            other_pov = node.type == "pov_memory" and bool(owners) and node.scope.owner_key not in keys
            assert (
                node.archived
                or node.story_time.tense == "future"
                or _hidden_from_all(owners, node_id)
                or other_pov
            ), (q["id"], node_id)


def _hidden_from_all(owners: list[KnowledgeOwner], node_id: str) -> bool:
    return bool(owners) and all(
        node_id in o.manual_hidden_node_ids or node_id in o.mistaken_node_ids for o in owners
    )


def test_readme_describes_every_fixture() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    for name in NAMES:
        assert f"`{name}`" in readme, name


def test_coverage() -> None:
    languages = [_chat(n)["language"] for n in NAMES]
    assert languages.count("en") >= 2 and languages.count("zh") >= 2

    def multi_pov(name: str) -> bool:
        graph = _graph(name)
        pov_keys = {n.scope.owner_key for n in graph.nodes if n.type == "pov_memory"}
        characters = {k for k in pov_keys if k.startswith("character:") and k in graph.knowledge.owners}
        users = {k for k in pov_keys if k.startswith("user:") and k in graph.knowledge.owners}
        if len(characters) < 2 or not users:
            return False
        owners = [graph.knowledge.owners[k] for k in sorted(characters)]
        known = [set(o.known_node_ids) | set(o.manual_known_node_ids) for o in owners]
        differ = any(a != b for a in known for b in known)
        # A secret: something one character knows that another must not see (hidden or mistaken).
        secret = any(
            (set(o.manual_hidden_node_ids) | set(o.mistaken_node_ids)) & k for o in owners for k in known
        )
        return differ and secret

    def regions(name: str) -> bool:
        graph = _graph(name)
        active = graph.regions.manual_active_region or graph.history.active_region
        if not graph.regions.adjacency_map or active not in graph.regions.adjacency_map:
            return False
        buckets = {
            _bucket(graph, n.scope.region_primary, n.scope.region_tokens(), active)
            for n in graph.nodes
            if n.scope.layer == "objective"
        }
        return {"current", "adjacent", "other"} <= buckets

    def timeline(name: str) -> bool:
        graph = _graph(name)
        dated = {n.story_time.segment_id for n in graph.nodes if n.story_time.segment_id}
        return len(graph.timeline.segments) >= 2 and len(dated) >= 2

    assert any(multi_pov(n) for n in NAMES)
    assert any(regions(n) for n in NAMES)
    assert any(timeline(n) for n in NAMES)


def test_questions_exercise_gating_and_regions() -> None:
    questions = [q for n in NAMES for q in _questions(n)]
    assert any(q.get("active_owners") and q.get("must_not") for q in questions)
    assert any(q.get("active_region") for q in questions)
    assert any(any(k.startswith("user:") for k in q.get("active_owners", [])) for q in questions)
