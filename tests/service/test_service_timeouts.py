"""Slow clients cannot hold connections: raw sockets against a real uvicorn server run with ``serve``'s options
(:func:`memory_recall.service.connections.server_options`) and short deadlines. Each test asserts that the server
closed the connection (EOF) within a generous bound, not the exact time; the lower bounds only show that the
configured deadline, not an error, closed it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from service_live import LiveServer

from memory_recall.service import create_app
from memory_recall.service.connections import server_options
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

HEADER_S = 1.0
BODY_S = 1.5
SYNC_BODY_S = 3.0
IDLE_S = 1
#: How long a test waits for the server to close before it calls the connection held (generous: 2 shared cores).
BOUND_S = 15.0
TOKEN = "s3cret-token"
HOST = b"Host: 127.0.0.1\r\n"
Start = Callable[..., LiveServer]
Connect = Callable[[LiveServer], socket.socket]


def _post_head(path: str, length: int, *extra: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\n".encode() + HOST + b"Content-Type: application/json\r\n"
            + f"Content-Length: {length}\r\n".encode() + b"".join(extra) + b"\r\n")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Start]:
    """``start(**service)`` → a running server with the test deadlines plus ``service`` overrides."""
    started: list[tuple[LiveServer, Store]] = []

    def start(**service: Any) -> LiveServer:
        settings = RecallSettings()
        limits = {"header_timeout_s": HEADER_S, "body_timeout_s": BODY_S, "sync_body_timeout_s": SYNC_BODY_S,
                  "idle_timeout_s": IDLE_S, **service}
        settings = settings.model_copy(update={"service": settings.service.model_copy(update=limits)})
        store = Store.open(tmp_path / f"store{len(started)}")
        live = LiveServer(create_app(settings, store=store), **server_options(settings.service)).start()
        started.append((live, store))
        return live

    yield start
    for live, store in started:
        live.stop()
        store.close()


@pytest.fixture
def connect() -> Iterator[Connect]:
    """``connect(server)`` → a raw socket to it (every one closed after the test, whatever happened)."""
    sockets: list[socket.socket] = []

    def open_(live: LiveServer) -> socket.socket:
        sockets.append(socket.create_connection(("127.0.0.1", live.port), timeout=BOUND_S))
        return sockets[-1]

    yield open_
    for sock in sockets:
        sock.close()


def _until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Every byte the server sends until it closes, and the seconds that took; fails if it is still open after
    :data:`BOUND_S`."""
    start = time.monotonic()
    received = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {BOUND_S} s; received {received[:80]!r}")
    except ConnectionResetError:
        pass  # closed with unread bytes of ours in its buffer: closed all the same
    finally:
        sock.close()
    return received, time.monotonic() - start


def _one_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one response ``data`` holds whole."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    assert len(body) == int(headers["content-length"]), data
    return int(status_line.split()[1]), headers, body


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The next whole response on an open connection (a response may arrive in several segments)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        body += chunk
    return _one_response(head + b"\r\n\r\n" + body)


class TestRequestHead:
    @pytest.mark.parametrize("sent", [b"", b"GET /v1/hea", b"GET /v1/health HTTP/1.1\r\n" + HOST],
                             ids=["nothing", "half a request line", "half the headers"])
    def test_incomplete_head_is_closed(self, server: Start, connect: Connect, sent: bytes) -> None:
        sock = connect(server())
        sock.sendall(sent)
        received, seconds = _until_closed(sock)
        assert received == b""  # nothing was parsed, so nothing is answered
        assert seconds >= HEADER_S * 0.9

    def test_half_a_head_after_a_response_is_closed(self, server: Start, connect: Connect) -> None:
        # uvicorn cancels its keep-alive timer on the first byte of the next request: before the head deadline
        # such a connection stayed open.
        sock = connect(server())
        sock.sendall(b"GET /v1/health HTTP/1.1\r\n" + HOST + b"\r\n")
        assert _read_response(sock)[0] == 200
        sock.sendall(b"GET /v1/hea")
        received, _ = _until_closed(sock)
        assert received == b""

    def test_slow_body_after_a_prompt_head_is_not_cut_by_the_head_deadline(
        self, server: Start, connect: Connect
    ) -> None:
        live = server(body_timeout_s=HEADER_S * 3)
        body = json.dumps({"nodes": [{"id": "n1", "type": "event", "fields": {"title": "t"}}]}).encode()
        sock = connect(live)
        sock.sendall(_post_head("/v1/chats/c1/nodes", len(body)))
        time.sleep(HEADER_S * 1.5)  # past the head deadline, within the body's
        sock.sendall(body[:5])
        time.sleep(0.2)
        sock.sendall(body[5:])
        status, _, answer = _read_response(sock)
        assert (status, json.loads(answer)["count"]) == (200, 1)


class TestBody:
    def test_half_a_body_gets_408_and_is_closed(self, server: Start, connect: Connect) -> None:
        sock = connect(server())
        sock.sendall(_post_head("/v1/recall", 100) + b'{"chat')
        received, seconds = _until_closed(sock)
        status, headers, body = _one_response(received)
        assert (status, headers["connection"], headers["content-type"]) == (408, "close", "application/json")
        assert json.loads(body) == {"error": "request body not received within 1.5 s", "detail": None}
        assert seconds >= BODY_S * 0.9

    def test_a_sync_body_has_its_own_longer_deadline(self, server: Start, connect: Connect) -> None:
        sock = connect(server())
        sock.sendall(_post_head("/v1/chats/c1/sync", 100) + b'{"messa')
        received, seconds = _until_closed(sock)
        status, _, body = _one_response(received)
        assert status == 408
        assert json.loads(body) == {"error": "request body not received within 3 s", "detail": None}
        assert seconds >= SYNC_BODY_S * 0.9

    def test_trickling_an_answered_body_is_closed(self, server: Start, connect: Connect) -> None:
        # 401 before the body is read; h11 then discards each byte that arrives, and each used to cancel
        # uvicorn's keep-alive timer again.
        sock = connect(server(token=TOKEN))
        sock.sendall(_post_head("/v1/recall", 1_000_000) + b"{")
        status, _, _ = _read_response(sock)
        assert status == 401
        sock.settimeout(0.2)
        start = time.monotonic()
        closed = False
        while not closed and time.monotonic() - start < BOUND_S:
            try:
                sock.sendall(b" ")
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, f"the server kept reading the answered body for {BOUND_S} s"
        assert time.monotonic() - start >= BODY_S * 0.9


class TestIdle:
    def test_idle_keep_alive_connection_is_closed(self, server: Start, connect: Connect) -> None:
        sock = connect(server())
        sock.sendall(b"GET /v1/health HTTP/1.1\r\n" + HOST + b"\r\n")
        received, seconds = _until_closed(sock)
        status, headers, body = _one_response(received)
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        assert "connection" not in headers  # kept alive, then closed for idleness
        # Below uvicorn's own default of 5 s, so the setting is what closed it.
        assert IDLE_S * 0.9 <= seconds < 4.0

    def test_a_connection_in_use_is_kept(self, server: Start, connect: Connect) -> None:
        # Open 2 s in all, longer than the head and the idle deadline, but never idle or mid-head that long.
        sock = connect(server())
        for _ in range(5):
            sock.sendall(b"GET /v1/health HTTP/1.1\r\n" + HOST + b"\r\n")
            status, _, _ = _read_response(sock)
            assert status == 200
            time.sleep(IDLE_S / 2)
