"""Every chat turn is cheap through the real HTTP service: an event answers after its write (the vectors follow
in the background, recalls count the nodes still without one), its ``version`` is the one its own write
committed, and writes and recalls run in separate lanes (neither waits for the other's slots)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from memory_recall.providers import local_engine_available
from memory_recall.service.app import RECALL_SLOTS, WRITE_SLOTS, Lanes

CHAT = "fair-chat"


class _HeldEmbedder:
    """The local embedder with a gate for passages and one for queries (each waits until its event is set), so
    a test can hold the background embedding or the recalls at a known point."""

    def __init__(self) -> None:
        from memory_recall.providers import LocalEmbedder

        self.inner = LocalEmbedder()
        self.model_id = self.inner.model_id
        self.dim = self.inner.dim
        self.passages_open = threading.Event()
        self.queries_open = threading.Event()
        self.queries_open.set()
        self.queries_held = 0
        self._count = threading.Lock()

    def embed_query(self, text: str) -> np.ndarray:
        with self._count:
            self.queries_held += 1
        if not self.queries_open.wait(timeout=60):
            raise AssertionError("the test never let the queries go")
        return self.inner.embed_query(text)

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        if not self.passages_open.wait(timeout=60):
            raise AssertionError("the test never let the passages go")
        return self.inner.embed_passages(texts)


needs_engine = pytest.mark.skipif(not local_engine_available(), reason="the local embedding engine is not installed")


def _event(client: httpx.Client, body: dict[str, Any], query: str = "") -> dict[str, Any]:
    r = client.post(f"/v1/chats/{CHAT}/events{query}", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _recall(client: httpx.Client, floor: int, text: str) -> dict[str, Any]:
    msg = {"floor": floor, "role": "user", "speaker": "Wren", "text": text}
    r = client.post("/v1/recall", json={"chat_id": CHAT, "messages": [msg], "target_user_floor": floor})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _version(client: httpx.Client) -> int:
    return int(client.get(f"/v1/chats/{CHAT}/stats").json()["version"])


@needs_engine
class TestBackgroundEmbedding:
    def test_an_event_answers_before_its_vectors_and_recall_counts_the_missing(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        embedder = _HeldEmbedder()
        _, client = live_server(embedder=embedder)
        embedder.passages_open.set()
        first = _event(client, {"type": "message_added", "messages": chat_messages[:6]}, "?embed=inline")
        assert first["embedding"]["status"] == "ok"
        embedder.passages_open.clear()  # from here the background worker's passages wait
        new = {**chat_messages[6], "floor": 6}
        body = _event(client, {"type": "message_added", "message": new})
        # Answered while no passage can be embedded: the write did not wait for its vectors.
        assert body["embedding"] == {"status": "queued", "model_id": embedder.model_id, "embedded": 0,
                                     "failure_category": ""}
        assert body["nodes_added"] >= 1
        stats = client.get(f"/v1/chats/{CHAT}/stats").json()
        active = stats["node_count"] - stats["archived_count"]
        assert stats["embedded"][embedder.model_id] < active
        early = _recall(client, 7, "Who found the locket?")
        assert early["status"] == "completed"
        assert early["vectors_missing"] == active - stats["embedded"][embedder.model_id] >= 1
        embedder.passages_open.set()
        deadline = time.monotonic() + 60
        while client.get(f"/v1/chats/{CHAT}/stats").json()["embedded"][embedder.model_id] < active:
            assert time.monotonic() < deadline, "the background worker never embedded the new nodes"
            time.sleep(0.05)
        late = _recall(client, 9, "Who found the locket?")
        assert (late["status"], late["vectors_missing"]) == ("completed", 0)


class TestEventVersion:
    def test_the_version_is_the_one_of_the_events_own_write(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        _, client = live_server()  # no embedder: nothing writes vectors behind the test's back
        a = _event(client, {"type": "message_added", "messages": chat_messages[:6]})
        assert a["version"] == _version(client)
        out = _recall(client, 6, "Who found the locket?")  # its reinforcement and record: a later version
        assert out["status"] == "completed"
        after_recall = _version(client)
        assert after_recall > a["version"]
        b = _event(client, {"type": "message_added", "message": {**chat_messages[6], "floor": 6}})
        assert b["version"] > after_recall and b["version"] == _version(client)
        # An event that changes nothing writes nothing: its version is the chat's version as it found it.
        same = _event(client, {"type": "message_added", "message": {**chat_messages[6], "floor": 6}})
        assert (same["version"], same["nodes_added"], same["nodes_updated"]) == (b["version"], 0, 0)
        edited = _event(client, {"type": "message_edited",
                                 "message": {**chat_messages[6], "floor": 6, "text": "The locket was in the well."}})
        assert edited["version"] > b["version"] and edited["version"] == _version(client)

    @needs_engine
    def test_vectors_written_after_the_event_do_not_change_its_version(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        from memory_recall.providers import LocalEmbedder

        embedder = LocalEmbedder()
        _, client = live_server(embedder=embedder)
        before = _event(client, {"type": "message_added", "messages": chat_messages[:4]}, "?embed=inline")
        inline = _event(client, {"type": "message_added", "message": {**chat_messages[4], "floor": 4}},
                        "?embed=inline")
        assert inline["embedding"]["status"] == "ok" and inline["embedding"]["embedded"] >= 1
        # The vectors were written after the event's own transaction: the chat is past the event's version (the
        # service used to answer the version read after the event, which was already stale by then), and the
        # event's version is still after everything written before it.
        assert before["version"] < inline["version"] < _version(client)


class TestLanes:
    def test_a_write_does_not_wait_for_held_recalls(
        self, live_server: Any, chat_messages: list[dict[str, Any]]
    ) -> None:
        if not local_engine_available():
            pytest.skip("the local embedding engine is not installed")
        embedder = _HeldEmbedder()
        embedder.passages_open.set()
        _, client = live_server(embedder=embedder)
        _event(client, {"type": "message_added", "messages": chat_messages[:6]}, "?embed=inline")
        embedder.queries_open.clear()  # every recall now holds its recall slot in its query embedding
        held = RECALL_SLOTS + 2  # every slot taken, two more queued behind them
        done: list[str] = []
        lock = threading.Lock()

        def recall(i: int) -> None:
            with httpx.Client(base_url=client.base_url, timeout=60) as c:
                _recall(c, 100 + 2 * i, "Who found the locket?")
            with lock:
                done.append(f"recall-{i}")

        threads = [threading.Thread(target=recall, args=(i,)) for i in range(held)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while embedder.queries_held < RECALL_SLOTS:
            assert time.monotonic() < deadline, "the recalls never reached their query embedding"
            time.sleep(0.01)
        body = _event(client, {"type": "message_added", "message": {**chat_messages[6], "floor": 6}})
        with lock:
            done.append("event")
        assert body["nodes_added"] >= 1
        embedder.queries_open.set()
        for t in threads:
            t.join(timeout=60)
        assert done[0] == "event"
        assert sorted(done[1:]) == sorted(f"recall-{i}" for i in range(held))


class TestLanesUnit:
    def test_each_lane_bounds_its_own_work_and_the_other_lane_still_runs(self) -> None:
        release = threading.Event()
        order: list[str] = []

        async def main() -> None:
            lanes = Lanes(recall_slots=RECALL_SLOTS, write_slots=WRITE_SLOTS)

            def blocked_write() -> None:
                assert release.wait(timeout=30)
                order.append("write")

            def recall() -> None:
                order.append("recall")

            writes = [asyncio.create_task(lanes.run("write", blocked_write)) for _ in range(WRITE_SLOTS + 1)]
            while lanes.running("write") < WRITE_SLOTS:
                await asyncio.sleep(0.01)
            assert (lanes.running("write"), lanes.waiting("write")) == (WRITE_SLOTS, 1)
            await lanes.run("recall", recall)  # runs while every write slot is held and a write waits
            assert order == ["recall"]
            release.set()
            await asyncio.gather(*writes)
            assert order == ["recall"] + ["write"] * (WRITE_SLOTS + 1)
            assert (lanes.running("write"), lanes.waiting("write")) == (0, 0)

        asyncio.run(main())
