"""Whole-chat sync through the real HTTP service: answers at once, embeds in the background, recall meanwhile;
mid-chat deletions that move later floors down; writes embed only what they wrote."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from memory_recall.providers import local_engine_available

pytestmark = pytest.mark.skipif(not local_engine_available(), reason="the local embedding engine is not installed")

CHAT = "sync-chat"


class _GatedEmbedder:
    """The local embedder whose passage batches wait until ``gate`` is set (queries never wait): the
    background embedding of a sync can be held at a known point while the test recalls."""

    def __init__(self) -> None:
        from memory_recall.providers import LocalEmbedder

        self.inner = LocalEmbedder()
        self.model_id = self.inner.model_id
        self.dim = self.inner.dim
        self.gate = threading.Event()
        self.passages = 0

    def embed_query(self, text: str) -> np.ndarray:
        return self.inner.embed_query(text)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        if not self.gate.wait(timeout=60):
            raise AssertionError("the test never opened the gate")
        self.passages += len(texts)
        return self.inner.embed_passages(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _poll(client: httpx.Client, until: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/chats/{CHAT}/sync")
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        if until(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def _recall(client: httpx.Client, msgs: list[dict[str, Any]], floor: int, text: str) -> dict[str, Any]:
    r = client.post("/v1/recall", json={"chat_id": CHAT, "messages": msgs[-8:], "target_user_floor": floor,
                                        "query_text": text, "generation_type": "normal"})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


class TestSync:
    def test_answers_at_once_recalls_lexically_meanwhile_then_embeds(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        embedder = _GatedEmbedder()
        _, client = live_server(embedder=embedder)
        r = client.post(f"/v1/chats/{CHAT}/sync", json={"messages": chat_messages})
        assert r.status_code == 202, r.text
        job = r.json()
        assert (job["state"], job["messages"], job["chat_id"]) == ("ingesting", len(chat_messages), CHAT)
        job = _poll(client, lambda j: j["state"] == "embedding")
        stats = client.get(f"/v1/chats/{CHAT}/stats").json()
        active = stats["node_count"] - stats["archived_count"]
        assert (job["vectors_done"], job["nodes_added"], job["version"]) == (0, stats["node_count"], stats["version"])
        assert stats["embedded"] == {}

        # Recall works before any vector arrived, and says how many nodes it could only find lexically.
        question = "Where did Erin hide the silver locket?"
        early = _recall(client, chat_messages, len(chat_messages), question)
        # No vector at all yet: the query is not even embedded (nothing to compare it with).
        assert (early["status"], early["vectors_missing"], early["semantic_search_used"]) == (
            "completed", active, False)
        assert early["selected_node_ids"]

        embedder.gate.set()
        job = _poll(client, lambda j: j["state"] == "done")
        assert job["vectors_done"] == job["vectors_total"] == active
        assert job["embedding_model"] == embedder.model_id and job["finished_at"] >= job["ingested_at"]
        stats = client.get(f"/v1/chats/{CHAT}/stats").json()
        assert stats["embedded"] == {embedder.model_id: active}
        late = _recall(client, chat_messages, len(chat_messages) + 2, question)
        assert (late["status"], late["vectors_missing"]) == ("completed", 0)

        # Re-sending the unchanged chat writes nothing and embeds nothing.
        version, passages = client.get(f"/v1/chats/{CHAT}/stats").json()["version"], embedder.passages
        r = client.post(f"/v1/chats/{CHAT}/sync", json={"messages": chat_messages})
        assert r.status_code == 202
        job = _poll(client, lambda j: j["state"] == "done" and j["job_id"] == r.json()["job_id"])
        assert (job["nodes_added"], job["nodes_updated"], job["nodes_retired"], job["version"]) == (0, 0, 0, version)
        assert client.get(f"/v1/chats/{CHAT}/stats").json()["version"] == version
        assert embedder.passages == passages

    def test_a_shorter_chat_retires_the_tail(self, live_server: Any, chat_messages: list[dict[str, Any]]) -> None:
        _, client = live_server()
        r = client.post(f"/v1/chats/{CHAT}/sync", json={"messages": chat_messages})
        assert r.status_code == 202
        _poll(client, lambda j: j["state"] == "done")
        r = client.post(f"/v1/chats/{CHAT}/sync", json={"messages": chat_messages[:10]})
        job = _poll(client, lambda j: j["state"] == "done" and j["job_id"] == r.json()["job_id"])
        assert (job["embedding_model"], job["vectors_total"]) == ("", 0)  # no embedder: done after the ingest
        nodes = {n["id"]: n for n in client.get(f"/v1/chats/{CHAT}/export").json()["nodes"]}
        assert [f for f in range(len(chat_messages)) if nodes[f"msg:{f}"]["archived"]] == list(
            range(10, len(chat_messages)))

    def test_bad_bodies_are_named_and_nothing_starts(self, live_server: Any,
                                                     chat_messages: list[dict[str, Any]]) -> None:
        _, client = live_server()
        gap = [m for m in chat_messages[:5] if m["floor"] != 2]
        r = client.post(f"/v1/chats/{CHAT}/sync", json={"messages": gap})
        assert r.status_code == 422
        assert r.json()["error"] == (
            "body.messages.3.floor: a whole chat of 4 message(s) holds floors 0 to 3; got 4 (floor 2 is missing)")
        twice = [*chat_messages[:3], chat_messages[1]]
        r = client.post(f"/v1/chats/{CHAT}/sync", json={"messages": twice})
        assert r.status_code == 422 and r.json()["error"] == "body.messages.3.floor: floor 1 repeats messages[1]"
        assert client.get(f"/v1/chats/{CHAT}/sync").status_code == 404
        assert client.get(f"/v1/chats/{CHAT}/stats").status_code == 404

    def test_a_long_chat_fits_the_sync_limit_not_the_event_limit(self, live_server: Any) -> None:
        _, client = live_server(max_body_bytes=64 * 1024, max_sync_body_bytes=4 * 1024 * 1024)
        msgs = [{"floor": i, "role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bo",
                 "text": f"Turn {i}: the lantern and the harbor bell, again and again. " * 4} for i in range(1200)]
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "messages": msgs[:600]})
        assert r.status_code == 413
        r = client.post(f"/v1/chats/{CHAT}/sync", json={"messages": msgs})
        assert r.status_code == 202
        job = _poll(client, lambda j: j["state"] == "done")
        assert job["messages"] == 1200 and job["nodes_added"] >= 1200

    def test_deleting_the_chat_during_the_embedding_leaves_no_chat(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        embedder = _GatedEmbedder()
        _, client = live_server(embedder=embedder)
        client.post(f"/v1/chats/{CHAT}/sync", json={"messages": chat_messages})
        _poll(client, lambda j: j["state"] == "embedding")
        assert client.delete(f"/v1/chats/{CHAT}").status_code == 200
        embedder.gate.set()
        time.sleep(1.0)  # the worker finishes its chunk and finds the chat gone
        assert client.get(f"/v1/chats/{CHAT}/stats").status_code == 404
        assert client.get(f"/v1/chats/{CHAT}/sync").status_code == 404
        assert [c["chat_id"] for c in client.get("/v1/chats").json()["chats"]] == []


class TestEvents:
    def test_mid_chat_deletion_moves_later_floors_and_records(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        _, client = live_server()
        msgs = chat_messages[:12]
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "messages": msgs})
        assert r.status_code == 200
        user_floors = [m["floor"] for m in msgs if m["role"] == "user"]
        last_user = user_floors[-1]
        out = _recall(client, msgs, last_user, msgs[last_user]["text"])
        assert out["record_persisted"] is True
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_deleted", "floor": 3, "shift": True})
        assert r.status_code == 200, r.text
        assert r.json()["nodes_retired"] >= 1
        nodes = {n["id"]: n for n in client.get(f"/v1/chats/{CHAT}/export").json()["nodes"]}
        texts = [nodes[f"msg:{f}"]["fields"]["summary"] for f in range(len(msgs) - 1)]
        assert texts == [m["text"] for m in msgs if m["floor"] != 3]
        assert f"msg:{len(msgs) - 1}" not in nodes
        # The record moved with its floor and still replays on a regenerate of the same turn.
        assert client.get(f"/v1/chats/{CHAT}/records/{last_user}").status_code == 404
        moved = client.get(f"/v1/chats/{CHAT}/records/{last_user - 1}")
        assert moved.status_code == 200 and moved.json()["record"]["injection_text"] == out["injection_text"]
        rest = [{**m, "floor": i} for i, m in enumerate(m for m in msgs if m["floor"] != 3)]
        again = client.post("/v1/recall", json={"chat_id": CHAT, "messages": rest[-8:],
                                                "target_user_floor": last_user - 1, "generation_type": "regenerate"})
        assert again.status_code == 200
        assert (again.json()["source"], again.json()["injection_text"]) == ("persisted", out["injection_text"])

    def test_an_event_embeds_what_it_wrote_not_the_backlog(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        embedder = _GatedEmbedder()
        _, client = live_server(embedder=embedder)
        client.post(f"/v1/chats/{CHAT}/sync", json={"messages": chat_messages[:20]})
        _poll(client, lambda j: j["state"] == "embedding")
        new = {**chat_messages[20], "floor": 20}
        result: dict[str, Any] = {}

        def post() -> None:
            result["r"] = client.post(f"/v1/chats/{CHAT}/events?embed=inline",
                                      json={"type": "message_added", "message": new})

        t = threading.Thread(target=post)
        t.start()
        time.sleep(0.3)
        embedder.gate.set()  # the event's own passages and the backlog's first chunk may now run
        t.join(timeout=60)
        body = result["r"].json()
        assert result["r"].status_code == 200, body
        # The message node and its speaker's character node changed (a mention may add an entity): never the
        # twenty-odd nodes of the sync's backlog.
        assert body["embedding"]["status"] == "ok" and 1 <= body["embedding"]["embedded"] <= 4
