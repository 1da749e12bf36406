"""Builders for the controller tests (not a test module; imported as ``from controller_helpers import ...``).

The chat is the packaged demo chat (English roleplay, Thornwick Manor), ingested without an LLM; recalls are
lexical (``embedder=None``) unless a test says otherwise, so they are fast and deterministic.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from memory_recall.controller import RecallRequest
from memory_recall.model.chat import ChatMessage
from memory_recall.pipeline.result import RecallResult
from memory_recall.pipeline.retrieve import retrieve

NOW = 1_700_000_000_000
CHAT = "demo"
#: The benchmark graph (owners, knowledge, regions, timeline, embeddings) at a size that keeps the tests fast.
BENCH_NODES = 600
#: Floors 0–11 of the demo chat (user floors 0, 2, 4, 6, 8, 10 alternate with the narrator).
N_MESSAGES = 12


def demo_messages(n: int = N_MESSAGES) -> list[ChatMessage]:
    data = json.loads(resources.files("memory_recall.data").joinpath("demo_chat.json").read_text("utf-8"))
    return [ChatMessage(**m) for m in data["messages"][:n]]


def user_floors(messages: list[ChatMessage]) -> list[int]:
    return [m.floor for m in messages if m.role == "user"]


def upto(messages: list[ChatMessage], floor: int) -> list[ChatMessage]:
    """The chat as the host sees it when ``floor`` is the newest message."""
    return [m for m in messages if m.floor <= floor]


def request(messages: list[ChatMessage], *, t: int = 0, **kw: Any) -> RecallRequest:
    return RecallRequest(chat_id=kw.pop("chat_id", CHAT), messages=messages, now_ms=NOW + t, **kw)


class CountingPipeline:
    """A pipeline that counts its runs and delegates to the real ``retrieve``."""

    def __init__(self) -> None:
        self.calls = 0
        self.queries: list[str] = []

    def __call__(self, snapshot: Any, query: Any, settings: Any, providers: Any = None) -> RecallResult:
        self.calls += 1
        self.queries.append(query.user_message)
        return retrieve(snapshot, query, settings, providers)
