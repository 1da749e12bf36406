"""The service's memory keeping: while requests come, the heap trimmer gives glibc's free heap pages back
(``service.heap_trim_s``); it stops with the service."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from service_live import LiveServer

from memory_recall import heap
from memory_recall.service import create_app
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

CHAT = "trim-chat"


def _settings(heap_trim_s: float) -> RecallSettings:
    settings = RecallSettings()
    return settings.model_copy(update={"service": settings.service.model_copy(update={"heap_trim_s": heap_trim_s})})


def _trimmers() -> int:
    return sum(t.name == "heap-trimmer" for t in threading.enumerate())


@pytest.mark.skipif(not heap._glibc(), reason="glibc only (malloc_trim)")
def test_requests_are_followed_by_a_trim_and_the_trimmer_stops_with_the_service(tmp_path: Path) -> None:
    before = _trimmers()
    with Store.open(tmp_path / "store") as store:
        app = create_app(_settings(0.05), store=store)
        server = LiveServer(app).start()
        try:
            trimmer = app.state.service.trimmer
            assert isinstance(trimmer, heap.HeapTrimmer) and trimmer.interval_s == 0.05
            assert _trimmers() == before + 1
            time.sleep(0.3)
            assert trimmer.trims == 0  # no request yet: nothing to give back
            message = {"floor": 0, "role": "user", "speaker": "Ash", "text": "The brass key is under the mat."}
            event = httpx.post(f"{server.url}/v1/chats/{CHAT}/events",
                               json={"type": "message_added", "message": message}, timeout=60)
            assert event.status_code == 200, event.text
            deadline = time.monotonic() + 20
            while trimmer.trims == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert trimmer.trims >= 1 and trimmer.seconds > 0
            # GET /v1/memory reports the trims, the anonymous RSS and the allocator's figures of this process.
            body = httpx.get(f"{server.url}/v1/memory", timeout=30).json()
            assert body["heap_trims"] >= 1 and body["heap_trim_seconds"] > 0
            assert body["anonymous_rss_bytes"] > 20 << 20
            if hasattr(heap._glibc(), "mallinfo2"):
                h = body["heap"]
                assert set(h) == {"in_use_bytes", "free_bytes", "heaps_bytes", "mapped_bytes"}
                assert 0 < h["in_use_bytes"] < body["anonymous_rss_bytes"]
                assert 0 <= h["free_bytes"] <= h["heaps_bytes"] and h["mapped_bytes"] <= h["in_use_bytes"]
            else:
                assert body["heap"] is None
        finally:
            server.stop()
        assert _trimmers() == before


def test_zero_keeps_the_heaps_as_glibc_leaves_them(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        app = create_app(_settings(0), store=store)
        server = LiveServer(app).start()
        try:
            assert httpx.get(f"{server.url}/v1/health", timeout=30).status_code == 200
            assert app.state.service.trimmer is None
            body = httpx.get(f"{server.url}/v1/memory", timeout=30).json()
            assert (body["heap_trims"], body["heap_trim_seconds"]) == (0, 0.0)
        finally:
            server.stop()


def test_deleting_a_chat_drops_what_the_snapshot_cache_kept_for_it(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        app = create_app(RecallSettings(), store=store)
        server = LiveServer(app).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                for chat in ("gone", "kept"):
                    message = {"floor": 0, "role": "user", "speaker": "Ash", "text": f"The key of {chat} is here."}
                    r = client.post(f"/v1/chats/{chat}/events", json={"type": "message_added", "message": message})
                    assert r.status_code == 200, r.text
                    r = client.post("/v1/recall", json={"chat_id": chat, "messages": [message]})
                    assert r.status_code == 200, r.text
                cache = app.state.service.snapshots
                assert sorted({k[0] for k in cache._items}) == sorted({k[0] for k in cache._updating}) == [
                    "gone", "kept"]
                assert sorted(cache.last_update) == ["gone", "kept"]
                assert client.delete("/v1/chats/gone").status_code == 200
                assert sorted({k[0] for k in cache._items}) == sorted({k[0] for k in cache._updating}) == ["kept"]
                assert sorted(cache.last_update) == ["kept"]
        finally:
            server.stop()
