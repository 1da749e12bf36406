"""Bind safety, bearer-token auth and the request body limit (pure ASGI middleware, no body parsing).

* :func:`check_bind` refuses a non-loopback bind address without a token (raises :class:`ConfigError`).
* :class:`TokenAuth`: with a token configured, every HTTP request except ``GET /v1/health`` (and CORS
  preflights, which the CORS layer outside answers) needs ``Authorization: Bearer <token>``; compared with
  :func:`hmac.compare_digest` so the time taken says nothing about the token. Otherwise 401.
* :class:`BodyLimit`: 413 when ``Content-Length`` exceeds the limit, and when the streamed body does (chunked
  uploads or a lying header), before the application reads a byte of JSON.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from memory_recall.errors import ConfigError

__all__ = ["OPEN_PATHS", "BodyLimit", "TokenAuth", "check_bind", "is_loopback"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Paths reachable without the token (liveness probes must not need a secret).
OPEN_PATHS = frozenset({"/v1/health"})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Raise :class:`ConfigError` when ``host`` is not loopback and no token is set."""
    if not is_loopback(host) and not (token or "").strip():
        raise ConfigError(
            f"refusing to bind {host!r} without a token: set MEMORY_RECALL_SERVICE__TOKEN or pass --token",
            field="service.token",
        )


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                        *headers],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class TokenAuth:
    """Bearer-token check in front of the app (a no-op without a token)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = (token or "").strip().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.token or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, rest = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = rest.strip()
                break
        if not hmac.compare_digest(given, self.token):
            await _send_json(
                send,
                401,
                {"error": "missing or wrong bearer token", "detail": "send 'Authorization: Bearer <token>'"},
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Reject bodies over ``max_bytes`` with 413 (header check first, then the streamed byte count); a
    whole-chat sync (``POST …/sync``) may send up to ``sync_max_bytes``.

    The body is buffered here (at most the limit) and replayed to the app, so a 413 is always a clean
    response and never a half-read request inside a route.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, sync_max_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.sync_max_bytes = max(sync_max_bytes or max_bytes, max_bytes)

    async def _reject(self, send: Send, limit: int) -> None:
        await _send_json(
            send, 413, {"error": f"request body larger than {limit} bytes", "detail": None},
            [(b"connection", b"close")],
        )

    def limit_for(self, scope: Scope) -> int:
        """The byte limit of one request."""
        if scope.get("method") == "POST" and str(scope.get("path", "")).endswith("/sync"):
            return self.sync_max_bytes
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await self._reject(send, limit)
                    return
        chunks: list[bytes] = []
        size = 0
        extra: list[Message] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                extra.append(message)  # http.disconnect: hand it on, the app sees the client left
                break
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await self._reject(send, limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}, *extra]

        async def replay_receive() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        await self.app(scope, replay_receive, send)
