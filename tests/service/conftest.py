"""Fixtures of the service tests: a real uvicorn server on 127.0.0.1 (random free port) in a thread."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_live import LiveServer

from memory_recall.service import create_app
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

FIXTURE_CHAT = Path(__file__).resolve().parents[2] / "fixtures" / "chats" / "en-thornwick-manor" / "chat.json"


@pytest.fixture
def chat_messages() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(FIXTURE_CHAT.read_text(encoding="utf-8"))["messages"]
    return messages


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[Callable[..., tuple[LiveServer, httpx.Client]]]:
    """``start(settings=None, *, embedder=None, token=None, **service)`` → (server, client); all torn down after.

    ``token`` is configured on the service and sent by the client; ``service`` overrides ``ServiceSettings``.
    """
    started: list[tuple[LiveServer, httpx.Client, Store]] = []

    def start(
        settings: RecallSettings | None = None, *, embedder: Any = None, token: str | None = None, **service: Any
    ) -> tuple[LiveServer, httpx.Client]:
        settings = settings or RecallSettings()
        if token:
            service["token"] = token
        if service:
            settings = settings.model_copy(update={"service": settings.service.model_copy(update=service)})
        store = Store.open(tmp_path / f"store{len(started)}")
        server = LiveServer(create_app(settings, store=store, embedder=embedder)).start()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=server.url, headers=headers, timeout=60)
        started.append((server, client, store))
        return server, client

    yield start
    for server, client, store in started:
        client.close()
        server.stop()
        store.close()
