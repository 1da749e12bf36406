from __future__ import annotations

import pytest
from controller_helpers import CHAT, NOW, CountingPipeline, demo_messages

from memory_recall.controller import RecallController
from memory_recall.ingest.messages import ingest_messages
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import SnapshotCache


@pytest.fixture
def messages() -> list[ChatMessage]:
    return demo_messages()


@pytest.fixture
def chat(store: Store, messages: list[ChatMessage]) -> str:
    ingest_messages(store, CHAT, messages, now_ms=NOW - 1000)
    return CHAT


@pytest.fixture
def counting() -> CountingPipeline:
    return CountingPipeline()


@pytest.fixture
def cache() -> SnapshotCache:
    return SnapshotCache()


@pytest.fixture
def controller(store: Store, chat: str, counting: CountingPipeline, cache: SnapshotCache) -> RecallController:
    return RecallController(store, RecallSettings(), pipeline=counting, snapshot_cache=cache)
