"""An OpenAI-compatible LLM on 127.0.0.1 that records every prompt and answers deterministic text.

Not a test module (imported as ``e2e_llm``). Routes:

* ``GET  /v1/models``: one model, :data:`MODEL_ID` (what SillyTavern's *Connect* lists);
* ``POST /v1/chat/completions``: Chat Completion, JSON or ``stream: true`` server-sent events;
* ``POST /v1/completions``: Text Completion, JSON or ``stream: true`` server-sent events;
* ``POST /tokenize``: a vLLM-style token count (one token per word), for SillyTavern's vLLM type.

Every request is kept as a :class:`Recorded` (path, parsed JSON body, ``time.monotonic()`` receive time).
Generation requests (the two POST routes) are numbered 1, 2, ... in arrival order; request ``n`` is answered
``"Reply n."`` unless the test queued answers with :meth:`LLMRecorder.script` (consumed first, one per
request) or set a :meth:`LLMRecorder.respond_with` function.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from e2e_env import ThreadedServer

MODEL_ID = "e2e-recorder"
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


@dataclass
class Recorded:
    """One received request. ``number`` counts generation requests only (0 for ``GET /v1/models``)."""

    method: str
    path: str
    body: Any
    received_at: float  # time.monotonic() when the request line was read
    number: int = 0
    reply: str = ""  # what was answered (generation requests)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return self.path == "/v1/chat/completions"

    @property
    def stream(self) -> bool:
        return bool(isinstance(self.body, dict) and self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages of a Chat Completion request ([] for Text Completion)."""
        if self.is_chat and isinstance(self.body, dict):
            return list(self.body.get("messages") or [])
        return []

    @property
    def prompt(self) -> str:
        """The whole prompt as one text: the ``prompt`` of a Text Completion, the message contents of a Chat one
        joined by newlines (to search for an injected block in either API)."""
        if not isinstance(self.body, dict):
            return ""
        if self.is_chat:
            return "\n".join(_content_text(m.get("content")) for m in self.messages)
        prompt = self.body.get("prompt", "")
        return "\n".join(prompt) if isinstance(prompt, list) else str(prompt)

    def last_user_text(self) -> str | None:
        """Content of the last ``role: user`` message of a Chat Completion request (None when there is none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _content_text(message.get("content"))
        return None


def _content_text(content: Any) -> str:
    # OpenAI content may be a list of parts ({"type": "text", "text": ...}) as well as a string.
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


class LLMRecorder:
    """The server. ``start()`` binds a free port; ``url`` is ``http://127.0.0.1:<port>/v1``.

    Thread-safe: handlers run on server threads, tests read :attr:`prompts` and wait with :meth:`wait_for`.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._requests: list[Recorded] = []
        self._count = 0  # generation requests so far (the reply number), not reset by clear()
        self._script: deque[str] = deque()
        self._responder: Callable[[Recorded], str] | None = None
        self.delay_s = 0.0  # wait this long before answering a generation (to catch a generation in flight)
        self.chunk_delay_s = 0.0  # between streamed chunks
        self._server: ThreadedServer | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> LLMRecorder:
        recorder = self

        class Handler(_Handler):
            owner = recorder

        self._server = ThreadedServer(Handler, "e2e-llm")
        self.port = self._server.port
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (what Text Completion hosts take: they append ``/v1/...`` themselves)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (the Chat Completion *Custom* endpoint URL)."""
        return f"{self.base_url}/v1"

    # -- what the test reads and sets -----------------------------------------------------------------------

    @property
    def requests(self) -> list[Recorded]:
        """Every recorded request since the last :meth:`clear`, model listings included."""
        with self._lock:
            return list(self._requests)

    @property
    def prompts(self) -> list[Recorded]:
        """The recorded generation requests (chat and text completions) since the last :meth:`clear`."""
        with self._lock:
            return [r for r in self._requests if r.path in GENERATION_PATHS]

    @property
    def generation_count(self) -> int:
        """Generation requests received since start (never reset; the number of the next reply minus one)."""
        with self._lock:
            return self._count

    def clear(self) -> None:
        """Forget recorded requests and queued answers (numbering of ``"Reply n."`` goes on)."""
        with self._lock:
            self._requests.clear()
            self._script.clear()

    def script(self, replies: Iterable[str]) -> None:
        """Queue answers: the next generation requests get these texts, in order, before the default ones."""
        with self._lock:
            self._script.extend(replies)

    def respond_with(self, responder: Callable[[Recorded], str] | None) -> None:
        """Answer each generation with ``responder(request)`` (after the queued script); None restores
        ``"Reply n."``."""
        with self._lock:
            self._responder = responder

    def mark(self) -> int:
        """A position to wait from: the number of generation requests received so far."""
        return self.generation_count

    def wait_for(self, count: int = 1, *, after: int | None = None, timeout: float = 30.0) -> list[Recorded]:
        """Wait until ``count`` generation requests numbered above ``after`` (default: :meth:`mark` now) have
        arrived; return those ``count`` requests, oldest first. Raises ``TimeoutError`` with what did arrive."""
        start = self.generation_count if after is None else after
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                got = [r for r in self._requests if r.path in GENERATION_PATHS and r.number > start]
                if len(got) >= count:
                    return got[:count]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"expected {count} LLM request(s) after #{start}, got {len(got)} in {timeout:.0f}s"
                    )
                self._lock.wait(remaining)

    def assert_quiet(self, *, after: int, for_s: float = 0.5) -> None:
        """Fail if any generation request numbered above ``after`` arrives within ``for_s`` seconds."""
        time.sleep(for_s)
        extra = [r for r in self.prompts if r.number > after]
        if extra:
            raise AssertionError(f"unexpected LLM request(s): {[r.number for r in extra]}")

    # -- used by the handler ---------------------------------------------------------------------------------

    def _record(self, method: str, path: str, body: Any, headers: dict[str, str], received_at: float) -> Recorded:
        with self._lock:
            rec = Recorded(method=method, path=path, body=body, received_at=received_at, headers=headers)
            if path in GENERATION_PATHS:
                self._count += 1
                rec.number = self._count
                if self._script:
                    rec.reply = self._script.popleft()
                elif self._responder is not None:
                    rec.reply = self._responder(rec)
                else:
                    rec.reply = f"Reply {rec.number}."
            self._requests.append(rec)
            self._lock.notify_all()
            return rec


class _Handler(BaseHTTPRequestHandler):
    owner: LLMRecorder
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class names it so
        pass  # the recording is the log

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        received = time.monotonic()
        path = self.path.split("?", 1)[0].rstrip("/")
        self.owner._record("GET", path, None, dict(self.headers), received)
        if path.endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "e2e"}]})
        else:
            self._json(404, {"error": {"message": f"no route {path}"}})

    def do_POST(self) -> None:  # noqa: N802
        received = time.monotonic()
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode("utf-8", errors="replace")
        if path not in GENERATION_PATHS:
            self.owner._record("POST", path, body, dict(self.headers), received)
            if path == "/tokenize":
                # vLLM's tokenizer route, which SillyTavern's vLLM Text Completion type uses to count tokens.
                text = str(body.get("prompt", "")) if isinstance(body, dict) else ""
                tokens = list(range(len(text.split())))
                self._json(200, {"tokens": tokens, "count": len(tokens), "max_model_len": 8192})
            else:
                self._json(404, {"error": {"message": f"no route {path}"}})
            return
        rec = self.owner._record("POST", path, body, dict(self.headers), received)
        if self.owner.delay_s:
            time.sleep(self.owner.delay_s)
        if rec.stream:
            self._stream(rec)
        else:
            self._json(200, _completion(rec))

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, rec: Recorded) -> None:
        # Close-delimited SSE (no Content-Length, no chunked encoding): every OpenAI client reads it.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        pieces = _split_words(rec.reply)
        try:
            for index, piece in enumerate(pieces):
                last = index == len(pieces) - 1
                self._event(_chunk(rec, piece, finish="stop" if last else None))
                if self.owner.chunk_delay_s and not last:
                    time.sleep(self.owner.chunk_delay_s)
            if not pieces:
                self._event(_chunk(rec, "", finish="stop"))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the host stopped the generation

    def _event(self, payload: Any) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()


def _split_words(text: str) -> list[str]:
    # Word-sized chunks with their following space, so the concatenation is the reply exactly.
    pieces: list[str] = []
    current = ""
    for ch in text:
        current += ch
        if ch == " ":
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


def _completion(rec: Recorded) -> dict[str, Any]:
    base = {"id": f"e2e-{rec.number}", "created": int(time.time()), "model": MODEL_ID, "usage": _usage()}
    if rec.is_chat:
        message = {"role": "assistant", "content": rec.reply}
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    return {**base, "object": "text_completion",
            "choices": [{"index": 0, "text": rec.reply, "finish_reason": "stop", "logprobs": None}]}


def _chunk(rec: Recorded, piece: str, *, finish: str | None) -> dict[str, Any]:
    base = {"id": f"e2e-{rec.number}", "created": int(time.time()), "model": MODEL_ID}
    if rec.is_chat:
        return {**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": finish}]}
    return {**base, "object": "text_completion",
            "choices": [{"index": 0, "text": piece, "finish_reason": finish, "logprobs": None}]}
