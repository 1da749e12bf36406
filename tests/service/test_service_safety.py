"""Auth on and off, bind safety, the Host check, the token file, per-chat write serialisation and graceful
shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from service_live import ServeProcess

from memory_recall.errors import ConfigError
from memory_recall.service import create_app, serve
from memory_recall.service.app import _Service
from memory_recall.service.auth import allowed_host_names, host_name, is_loopback, resolve_token, warn_if_shared
from memory_recall.settings import RecallSettings, ServiceSettings, load_settings
from memory_recall.store import Store

TOKEN = "s3cret-token"


class TestAuth:
    def test_token_required_when_configured(self, live_server: Any) -> None:
        server, client = live_server(token=TOKEN, public_docs=False)
        with httpx.Client(base_url=server.url) as anon:
            assert anon.get("/v1/health").status_code == 200  # liveness stays open
            for method, path in [("GET", "/v1/chats"), ("GET", "/v1/version"), ("GET", "/v1/memory"),
                                 ("POST", "/v1/recall"),
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
        add = {"type": "message_added", "messages": [{"floor": 0, "role": "user", "text": "hi"}]}
        assert client.post("/v1/chats/c1/events", json=add).status_code == 200
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


# -- Host header ------------------------------------------------------------------------------------------------

HOST_DETAIL = ("the service answers for 127.0.0.1, localhost, [::1], its bind address and the names in "
               "service.allowed_hosts (MEMORY_RECALL_SERVICE__ALLOWED_HOSTS)")
NODE = {"id": "n1", "type": "event", "fields": {"title": "The brass key"}}


def _raw(url: str, request: bytes) -> tuple[int, dict[str, Any]]:
    """Send ``request`` as is on a new connection; the response's status and JSON body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


class TestHostHeader:
    @pytest.mark.parametrize("forged", ["evil.example", "evil.example:8765", "127.0.0.1.evil.example",
                                        "localhost.evil.example:8765", "127.0.0.2:8765", "[::2]:8765"])
    def test_a_rebound_page_can_neither_read_nor_delete(self, live_server: Any, forged: str) -> None:
        # DNS rebinding: the page's own name now resolves to 127.0.0.1 and the browser sends that name as Host.
        _, client = live_server()
        assert client.post("/v1/chats/c1/nodes", json={"nodes": [NODE]}).status_code == 200
        for method, path in [("GET", "/v1/chats"), ("GET", "/v1/chats/c1/export"), ("DELETE", "/v1/chats/c1"),
                             ("GET", "/v1/health"), ("GET", "/docs")]:
            r = client.request(method, path, headers={"Host": forged})
            assert r.status_code == 421, (method, path)
            assert r.json() == {"error": f"Host {forged!r} is not allowed", "detail": HOST_DETAIL}
        assert [c["chat_id"] for c in client.get("/v1/chats").json()["chats"]] == ["c1"]  # not deleted

    @pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8765", "localhost", "LocalHost:1", "[::1]:8765",
                                      "[::1]"])
    def test_loopback_names_pass_with_any_port(self, live_server: Any, host: str) -> None:
        _, client = live_server()
        r = client.get("/v1/chats", headers={"Host": host})
        assert (r.status_code, r.json()) == (200, {"chats": []})

    def test_the_extensions_host_passes(self, live_server: Any) -> None:
        # What the browser sends for the extension's default URL http://127.0.0.1:8765 and for this server.
        server, client = live_server()
        assert client.get("/v1/chats", headers={"Host": "127.0.0.1:8765"}).status_code == 200
        assert client.get("/v1/chats").request.headers["host"] == f"127.0.0.1:{server.port}"
        assert client.get("/v1/chats").status_code == 200

    def test_host_is_checked_before_the_token(self, live_server: Any) -> None:
        _, client = live_server(token=TOKEN)
        assert client.get("/v1/chats", headers={"Host": "evil.example"}).status_code == 421
        assert client.get("/v1/chats", headers={"Authorization": "Bearer wrong"}).status_code == 401

    def test_bind_host_and_allowed_hosts_pass(self, live_server: Any) -> None:
        _, client = live_server(token=TOKEN, host="192.168.1.20", allowed_hosts=("memory.lan", "[fd00::7]"))
        for host in ("192.168.1.20:8765", "memory.lan", "MEMORY.LAN:80", "[fd00::7]:8765", "localhost:8765"):
            assert client.get("/v1/chats", headers={"Host": host}).status_code == 200, host
        for host in ("evil.example", "192.168.1.21:8765", "sub.memory.lan"):
            assert client.get("/v1/chats", headers={"Host": host}).status_code == 421, host

    def test_wildcard_bind_accepts_any_host_unless_names_are_given(self, live_server: Any) -> None:
        _, client = live_server(token=TOKEN, host="0.0.0.0")
        assert client.get("/v1/chats", headers={"Host": "192.168.1.20:8765"}).status_code == 200
        _, client = live_server(token=TOKEN, host="::", allowed_hosts=("memory.lan",))
        assert client.get("/v1/chats", headers={"Host": "memory.lan:8765"}).status_code == 200
        assert client.get("/v1/chats", headers={"Host": "192.168.1.20:8765"}).status_code == 421

    def test_star_accepts_any_host(self, live_server: Any) -> None:
        _, client = live_server(allowed_hosts=("*",))
        assert client.get("/v1/chats", headers={"Host": "evil.example"}).status_code == 200

    def test_missing_host_is_refused(self, live_server: Any) -> None:
        server, _ = live_server()
        status, body = _raw(server.url, b"GET /v1/chats HTTP/1.0\r\n\r\n")  # HTTP/1.0 may omit Host
        assert (status, body) == (421, {"error": "missing Host header", "detail": HOST_DETAIL})

    def test_the_host_page_can_read_why(self, live_server: Any) -> None:
        # CORS sits outside the Host check, so SillyTavern's page sees the 421 instead of a bare network error.
        _, client = live_server()
        r = client.get("/v1/chats", headers={"Host": "memory.lan:8765", "Origin": "http://127.0.0.1:8000"})
        assert r.status_code == 421
        assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:8000"

    @pytest.mark.parametrize(("value", "name"), [
        ("127.0.0.1:8765", "127.0.0.1"), ("LOCALHOST", "localhost"), ("[::1]:8765", "::1"), ("[::1]", "::1"),
        ("memory.lan:80", "memory.lan"), ("a:b:c", ""), ("host:port", ""), ("[::1]x", ""), ("[::1", ""), ("", ""),
    ])
    def test_host_name(self, value: str, name: str) -> None:
        assert host_name(value) == name

    def test_allowed_host_names(self) -> None:
        assert allowed_host_names("127.0.0.1") == frozenset({"127.0.0.1", "localhost", "::1"})
        assert allowed_host_names("[FD00::7]", ["Memory.LAN"]) == frozenset(
            {"127.0.0.1", "localhost", "::1", "fd00::7", "memory.lan"})
        assert allowed_host_names("0.0.0.0") is None
        assert allowed_host_names("127.0.0.1", ["*"]) is None

    def test_allowed_hosts_from_the_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MEMORY_RECALL_SERVICE__ALLOWED_HOSTS", '["Memory.LAN", "[fd00::7]", "10.0.0.5"]')
        assert load_settings().service.allowed_hosts == ("memory.lan", "[fd00::7]", "10.0.0.5")

    @pytest.mark.parametrize(("value", "reason"), [
        ("memory.lan:8765", "a host name or IP address without a port; got 'memory.lan:8765'"),
        ("http://memory.lan", "a host name or IP address without scheme, port or path; got 'http://memory.lan'"),
        ("", "a host name or IP address without scheme, port or path; got ''"),
        ("[::1]:8765", "a host name or IP address without a port; got '[::1]:8765'"),
    ])
    def test_bad_allowed_hosts_are_refused(self, monkeypatch: pytest.MonkeyPatch, value: str, reason: str) -> None:
        with pytest.raises(ValidationError) as exc:
            ServiceSettings(allowed_hosts=(value,))
        assert [(e["loc"], e["msg"]) for e in exc.value.errors()] == [(("allowed_hosts",), f"Value error, {reason}")]
        monkeypatch.setenv("MEMORY_RECALL_SERVICE__ALLOWED_HOSTS", json.dumps([value]))
        with pytest.raises(ConfigError) as err:
            load_settings()
        assert reason in str(err.value) and "\n" not in str(err.value)


# -- token file -------------------------------------------------------------------------------------------------


def _secret(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


class TestTokenFile:
    def test_the_token_is_the_files_one_line(self, tmp_path: Path) -> None:
        path = _secret(tmp_path / "token", f"  {TOKEN}\n")
        assert resolve_token(ServiceSettings(token_file=str(path))) == TOKEN
        assert resolve_token(ServiceSettings(token=f" {TOKEN} ")) == TOKEN
        assert resolve_token(ServiceSettings()) == ""

    @pytest.mark.parametrize(("text", "message"), [
        ("", "the token file {path} is empty"), (" \n\n", "the token file {path} is empty"),
        ("one\ntwo\n", "the token file {path} holds more than one line"),
        ("x" * 4097, "the token in {path} is longer than 4096 characters"),
    ])
    def test_unusable_file_is_a_one_line_error(self, tmp_path: Path, text: str, message: str) -> None:
        path = _secret(tmp_path / "token", text)
        with pytest.raises(ConfigError) as err:
            resolve_token(ServiceSettings(token_file=str(path)))
        assert str(err.value) == "service.token_file: " + message.format(path=repr(str(path)))

    def test_missing_file_and_both_settings(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError) as err:
            resolve_token(ServiceSettings(token_file=str(tmp_path / "none")))
        assert str(err.value) == (
            f"service.token_file: cannot read the token file {str(tmp_path / 'none')!r}: No such file or directory"
        )
        path = _secret(tmp_path / "token", TOKEN)
        with pytest.raises(ConfigError) as err:
            resolve_token(ServiceSettings(token=TOKEN, token_file=str(path)))
        assert str(err.value) == "service.token_file: set service.token or service.token_file, not both"

    def test_create_app_reads_the_token_file(self, tmp_path: Path) -> None:
        # A public bind with only a token file must count as having a token; one that cannot be read must not.
        path = _secret(tmp_path / "token", TOKEN)
        create_app(RecallSettings(service=ServiceSettings(host="0.0.0.0", token_file=str(path))))
        with pytest.raises(ConfigError, match="is empty"):
            create_app(RecallSettings(service=ServiceSettings(token_file=str(_secret(tmp_path / "e", "")))))

    @pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
    @pytest.mark.parametrize(("mode", "shared"), [(0o600, False), (0o400, False), (0o640, True), (0o604, True),
                                                  (0o620, True)])
    def test_shared_files_are_flagged(self, tmp_path: Path, mode: int, shared: bool) -> None:
        assert warn_if_shared(_secret(tmp_path / "token", TOKEN, mode), "token file") is shared
        assert warn_if_shared(tmp_path / "missing", "token file") is False


# -- the real command -------------------------------------------------------------------------------------------


@pytest.fixture
def serve_process() -> Iterator[list[ServeProcess]]:
    """A list to put started :class:`ServeProcess` objects in; each is stopped after the test."""
    started: list[ServeProcess] = []
    yield started
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.stop()


def _closed_within(url: str, request: bytes, seconds: float) -> bool:
    """True when the server closes a connection that sent ``request`` (and reads what it answers) in time."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=seconds) as sock:
        sock.sendall(request)
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            return False
    return True


class TestServeCommand:
    def test_loopback_serve_checks_host_and_bounds_connections(
        self, tmp_path: Path, serve_process: list[ServeProcess]
    ) -> None:
        # As the end-to-end tests start it: --host 127.0.0.1 --port <free>; deadlines from the environment.
        proc = ServeProcess("--host", "127.0.0.1", "--data-dir", str(tmp_path / "data"), env={
            "MEMORY_RECALL_SERVICE__HEADER_TIMEOUT_S": "1", "MEMORY_RECALL_SERVICE__IDLE_TIMEOUT_S": "1"})
        serve_process.append(proc.start())
        assert httpx.get(f"{proc.url}/v1/chats").json() == {"chats": []}
        assert httpx.get(f"{proc.url}/v1/chats", headers={"Host": "evil.example"}).status_code == 421
        assert _closed_within(proc.url, b"GET /v1/hea", 15)
        # Idle after a response: closed before uvicorn's own 5 s default, so the setting reached the server.
        assert _closed_within(proc.url, b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 4)

    def test_token_file_keeps_the_token_out_of_the_process_list(
        self, tmp_path: Path, serve_process: list[ServeProcess]
    ) -> None:
        path = _secret(tmp_path / "token", f"{TOKEN}\n")
        proc = ServeProcess("--host", "127.0.0.1", "--token-file", str(path), "--data-dir", str(tmp_path / "data"))
        serve_process.append(proc.start())
        assert httpx.get(f"{proc.url}/v1/chats").status_code == 401
        r = httpx.get(f"{proc.url}/v1/chats", headers={"Authorization": f"Bearer {TOKEN}"})
        assert (r.status_code, r.json()) == (200, {"chats": []})
        assert httpx.get(f"{proc.url}/openapi.json").status_code == 200  # public_docs by default
        cmdline = Path(f"/proc/{proc.proc.pid}/cmdline") if proc.proc else None
        if cmdline is not None and cmdline.exists():  # what ps shows (Linux)
            assert TOKEN.encode() not in cmdline.read_bytes() and str(path).encode() in cmdline.read_bytes()
        assert "WARNING" not in proc.stop()

    @pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
    def test_shared_token_and_store_files_are_warned_about(
        self, tmp_path: Path, serve_process: list[ServeProcess]
    ) -> None:
        path = _secret(tmp_path / "token", TOKEN, 0o644)
        data = tmp_path / "data"
        Store.open(data).close()
        store_file = data / "memory-recall.sqlite3"
        store_file.chmod(0o644)  # as releases before 0600 creation left it
        proc = ServeProcess("--token-file", str(path), "--data-dir", str(data))
        serve_process.append(proc.start())
        assert httpx.get(f"{proc.url}/v1/chats", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        lines = proc.stop().splitlines()
        assert lines[:2] == [
            f"WARNING:  token file {path} is accessible by group or others (mode 0644): chmod 600 {path}",
            f"WARNING:  store file {store_file} is accessible by group or others (mode 0644): chmod 600 {store_file}",
        ]
        assert store_file.stat().st_mode & 0o777 == 0o644  # warned about, not changed
