"""Auth on and off, bind safety, per-chat write serialisation and graceful shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from memory_recall.errors import ConfigError
from memory_recall.service import create_app, serve
from memory_recall.service.app import _Service
from memory_recall.service.auth import is_loopback
from memory_recall.settings import RecallSettings, load_settings
from memory_recall.store import Store

TOKEN = "s3cret-token"


class TestAuth:
    def test_token_required_when_configured(self, live_server: Any) -> None:
        server, client = live_server(token=TOKEN)
        with httpx.Client(base_url=server.url) as anon:
            assert anon.get("/v1/health").status_code == 200  # liveness stays open
            for method, path in [("GET", "/v1/chats"), ("GET", "/v1/version"), ("POST", "/v1/recall"),
                                 ("GET", "/openapi.json"), ("DELETE", "/v1/chats/c1")]:
                r = anon.request(method, path, json={"chat_id": "c1"})
                assert r.status_code == 401, (method, path)
                assert r.headers["www-authenticate"] == "Bearer"
            bad = {"Authorization": f"Bearer {TOKEN}x"}
            assert anon.get("/v1/chats", headers=bad).status_code == 401
            assert anon.get("/v1/chats", headers={"Authorization": TOKEN}).status_code == 401
            # An unauthenticated client cannot make the server read a large body either.
            assert anon.post("/v1/recall", content=b"x" * 5_000_000).status_code == 401
        assert client.get("/v1/chats").status_code == 200
        assert client.post("/v1/recall", json={"chat_id": "c1"}).status_code == 200

    def test_open_without_token(self, live_server: Any) -> None:
        _, client = live_server()
        assert client.get("/v1/chats").status_code == 200
        assert client.get("/v1/chats", headers={"Authorization": "Bearer anything"}).status_code == 200

    def test_cors_preflight_for_the_host_origin(self, live_server: Any) -> None:
        server, _ = live_server(token=TOKEN)
        headers = {
            "Origin": "http://127.0.0.1:8000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        r = httpx.options(f"{server.url}/v1/recall", headers=headers)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:8000"
        r = httpx.options(f"{server.url}/v1/recall", headers={**headers, "Origin": "http://evil.example"})
        assert r.status_code == 400


class TestBind:
    @pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.8.9.10", "[::1]"])
    def test_loopback(self, host: str) -> None:
        assert is_loopback(host)

    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.com", ""])
    def test_not_loopback(self, host: str) -> None:
        assert not is_loopback(host)

    def test_public_bind_without_token_refuses_to_start(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError) as err:
            serve("0.0.0.0", 0, str(tmp_path), None, RecallSettings())
        assert "MEMORY_RECALL_SERVICE__TOKEN" in str(err.value) and "\n" not in str(err.value)
        assert not (tmp_path / "memory-recall.sqlite3").exists()
        settings = RecallSettings().model_copy(
            update={"service": RecallSettings().service.model_copy(update={"host": "0.0.0.0"})}
        )
        with pytest.raises(ConfigError):
            create_app(settings)

    def test_token_from_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MEMORY_RECALL_SERVICE__TOKEN", TOKEN)
        monkeypatch.setenv("MEMORY_RECALL_SERVICE__HOST", "0.0.0.0")
        settings = load_settings()
        assert settings.service.token == TOKEN
        create_app(settings)  # a token makes a public bind acceptable


class TestWrites:
    def test_writes_to_one_chat_are_serialised(self, tmp_path: Path) -> None:
        store = Store.open(tmp_path)
        svc = _Service(RecallSettings(), store, None, None, owns_store=False)
        active: list[str] = []
        overlaps: list[tuple[str, ...]] = []
        guard = threading.Lock()

        def slow(tag: str) -> Any:
            def run() -> str:
                with guard:
                    active.append(tag)
                    overlaps.append(tuple(active))
                time.sleep(0.05)
                with guard:
                    active.remove(tag)
                return tag

            return run

        async def main() -> list[Any]:
            jobs = [svc.write("a", slow(f"a{i}"), embed=False) for i in range(4)]
            jobs += [svc.write("b", slow(f"b{i}"), embed=False) for i in range(4)]
            return await asyncio.gather(*jobs)

        asyncio.run(main())
        # Never two writes of one chat at once; writes of different chats may overlap.
        for snapshot in overlaps:
            assert sum(t.startswith("a") for t in snapshot) <= 1 and sum(t.startswith("b") for t in snapshot) <= 1
        assert any(len(s) == 2 for s in overlaps)
        assert svc._locks == {}  # no lock outlives its writes
        store.close()

    def test_shutdown_waits_for_in_flight_writes(self, tmp_path: Path) -> None:
        store = Store.open(tmp_path)
        svc = _Service(RecallSettings(), store, None, None, owns_store=True)
        done: list[bool] = []

        def write() -> None:
            time.sleep(0.2)
            store.upsert_nodes("c1", [{"id": "n1", "type": "event", "fields": {"title": "t"}}])
            done.append(True)

        async def main() -> None:
            task = asyncio.create_task(svc.write("c1", write, embed=False))
            await asyncio.sleep(0.02)
            await svc.close(timeout_s=10)
            assert done == [True]
            await task

        asyncio.run(main())
        with pytest.raises(Exception, match="closed"):
            store.list_chats()
        with Store.open(tmp_path) as again:
            assert again.get_node("c1", "n1") is not None
