"""Bind safety, the Host check, bearer-token auth, the request body limit and deadline, and the token file (pure
ASGI middleware, no body parsing).

* :func:`check_bind` refuses a non-loopback bind address without a token (raises :class:`ConfigError`).
* :class:`HostCheck`: the ``Host`` header must name the service (:func:`allowed_host_names`: ``127.0.0.1``,
  ``localhost`` or ``[::1]`` with any port, the bind host, or a name of ``service.allowed_hosts``), else 421
  ``{"error", "detail"}``. Without it a page of any web site could read and delete every chat of a token-less
  loopback service through DNS rebinding: its own host name re-pointed at 127.0.0.1, the browser treats the
  service as that site's origin, but still sends the site's name as ``Host``. A wildcard bind (``0.0.0.0``,
  ``::``) without ``allowed_hosts`` accepts any ``Host``: such a bind needs the token, which is what guards it.
* :class:`TokenAuth`: with a token configured, every HTTP request except ``/v1/health`` and the public paths
  (the API docs under ``service.public_docs``; CORS preflights, which the CORS layer outside answers) needs
  ``Authorization: Bearer <token>``; compared with :func:`hmac.compare_digest` so the time taken says nothing
  about the token. Otherwise 401.
* :class:`BodyLimit`: 413 when ``Content-Length`` exceeds the limit, and when the streamed body does (chunked
  uploads or a lying header), before the application reads a byte of JSON; 408 (connection closed) when the
  whole body has not arrived within the deadline. The request head's deadline is the server's
  (:mod:`memory_recall.service.connections`).
* :func:`resolve_token` reads ``service.token`` or the one-line ``service.token_file`` (:func:`read_token_file`);
  :func:`warn_if_shared` logs a warning for a secret file that group or others may access (``serve`` calls it
  for the token file and the store files; the file is read anyway: a secret mounted by a container runtime is
  often ``0644``).

In :func:`memory_recall.service.create_app` the order is, outermost first: CORS, :class:`HostCheck`,
:class:`TokenAuth`, :class:`BodyLimit`.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Collection, Iterable, MutableMapping
from pathlib import Path
from typing import Any

import anyio

from memory_recall.errors import ConfigError
from memory_recall.settings import ServiceSettings

__all__ = [
    "LOOPBACK_NAMES",
    "OPEN_PATHS",
    "BodyLimit",
    "HostCheck",
    "TokenAuth",
    "allowed_host_names",
    "check_bind",
    "host_name",
    "is_loopback",
    "read_token_file",
    "resolve_token",
    "warn_if_shared",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("memory_recall.service")

#: Paths reachable without the token (liveness probes must not need a secret).
OPEN_PATHS = frozenset({"/v1/health"})
#: Host names every service accepts in the ``Host`` header, with any port: what a client on the same machine uses.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
_MAX_TOKEN_CHARS = 4096  # ServiceSettings.token's limit


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
            f"refusing to bind {host!r} without a token: pass --token-file PATH or set "
            "MEMORY_RECALL_SERVICE__TOKEN",
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


# ---------------------------------------------------------------------------------------------------------------
# Host check
# ---------------------------------------------------------------------------------------------------------------


def _bare(name: str) -> str:
    """A configured host name lower-cased, an IPv6 literal without brackets."""
    n = name.strip().lower()
    return n[1:-1] if n.startswith("[") and n.endswith("]") else n


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(_bare(host)).is_unspecified
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The host of a ``Host`` header value, lower-cased, without port or IPv6 brackets (``"[::1]:8765"`` →
    ``"::1"``, ``"LocalHost"`` → ``"localhost"``); ``""`` when the value is not ``host[:port]``."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        rest = v[end + 1:]
        if end < 0 or (rest and not (rest[:1] == ":" and rest[1:].isdigit())):
            return ""
        return v[1:end]
    name, colon, port = v.rpartition(":")
    if not colon:
        return v
    return name if port.isdigit() and ":" not in name else ""


def allowed_host_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The host names :class:`HostCheck` accepts: :data:`LOOPBACK_NAMES`, ``bind_host`` (unless it is a wildcard
    address) and ``extra`` (``service.allowed_hosts``), in :func:`host_name` form. ``None`` (any host) when
    ``extra`` holds ``"*"``, or is empty and ``bind_host`` is a wildcard address (``0.0.0.0``, ``::``)."""
    names = {_bare(n) for n in extra}
    if "*" in names or (not names and _is_wildcard(bind_host)):
        return None
    if not _is_wildcard(bind_host):
        names.add(_bare(bind_host))
    return frozenset(LOOPBACK_NAMES | names)


class HostCheck:
    """421 for an HTTP request whose single ``Host`` header does not name an allowed host (``allowed=None``: any
    host, a no-op). The service has no WebSocket routes; other scope types pass."""

    def __init__(self, app: ASGIApp, allowed: Collection[str] | None) -> None:
        self.app = app
        self.allowed = None if allowed is None else frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed is None:
            await self.app(scope, receive, send)
            return
        values = [value for name, value in scope.get("headers", ()) if name.lower() == b"host"]
        if len(values) == 1 and host_name(values[0].decode("latin-1")) in self.allowed:
            await self.app(scope, receive, send)
            return
        if not values:
            error = "missing Host header"
        elif len(values) > 1:
            error = "more than one Host header"
        else:
            error = f"Host {values[0].decode('latin-1')[:200]!r} is not allowed"
        detail = ("the service answers for 127.0.0.1, localhost, [::1], its bind address and the names in "
                  "service.allowed_hosts (MEMORY_RECALL_SERVICE__ALLOWED_HOSTS)")
        await _send_json(send, 421, {"error": error, "detail": detail}, [])


# ---------------------------------------------------------------------------------------------------------------
# Token
# ---------------------------------------------------------------------------------------------------------------


class TokenAuth:
    """Bearer-token check in front of the app (a no-op without a token). ``public_paths`` (default
    :data:`OPEN_PATHS`) and paths starting with one of ``public_prefixes`` need no token."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        public_paths: Collection[str] = OPEN_PATHS,
        public_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.token = (token or "").strip().encode()
        self.public_paths = frozenset(public_paths)
        self.public_prefixes = public_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if (
            scope["type"] != "http" or not self.token or path in self.public_paths
            or path.startswith(self.public_prefixes)
        ):
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


def warn_if_shared(path: str | os.PathLike[str], what: str) -> bool:
    """Log a warning (``memory_recall.service``) and return True when group or others have any permission on the
    existing file ``path`` (POSIX only; False elsewhere and for a file that cannot be stat'ed, e.g. missing).
    ``what`` names it in the line."""
    if os.name != "posix":
        return False
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return False
    if not mode & 0o077:
        return False
    log.warning("%s %s is accessible by group or others (mode %04o): chmod 600 %s", what, path, mode, path)
    return True


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token held by the file ``path``: its text without surrounding whitespace, one line. Raises
    :class:`ConfigError` (one line) when the file cannot be read, is empty, holds more than one line or more
    than 4096 characters. Its mode is not checked here (:func:`warn_if_shared`)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the token file {str(p)!r}: {reason}", field="service.token_file") from None
    token = text.strip()
    if not token:
        raise ConfigError(f"the token file {str(p)!r} is empty", field="service.token_file")
    if "\n" in token or "\r" in token:
        raise ConfigError(f"the token file {str(p)!r} holds more than one line", field="service.token_file")
    if len(token) > _MAX_TOKEN_CHARS:
        raise ConfigError(
            f"the token in {str(p)!r} is longer than {_MAX_TOKEN_CHARS} characters", field="service.token_file"
        )
    return token


def resolve_token(service: ServiceSettings) -> str:
    """The service's token: ``service.token`` stripped, or the content of ``service.token_file``
    (:func:`read_token_file`), or ``""`` for none. Raises :class:`ConfigError` when both are set."""
    if service.token.strip() and service.token_file.strip():
        raise ConfigError("set service.token or service.token_file, not both", field="service.token_file")
    if service.token_file.strip():
        return read_token_file(service.token_file.strip())
    return service.token.strip()


# ---------------------------------------------------------------------------------------------------------------
# Body limit and deadline
# ---------------------------------------------------------------------------------------------------------------


class BodyLimit:
    """Reject bodies over ``max_bytes`` with 413 (header check first, then the streamed byte count), and bodies
    that have not arrived whole within ``timeout_s`` seconds with 408 and ``Connection: close`` (``None``: no
    deadline); a whole-chat sync (``POST …/sync``) may send up to ``sync_max_bytes`` within ``sync_timeout_s``.

    The body is buffered here (at most the limit) and replayed to the app, so a 413 or 408 is always a clean
    response and never a half-read request inside a route.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        sync_max_bytes: int | None = None,
        *,
        timeout_s: float | None = None,
        sync_timeout_s: float | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.sync_max_bytes = max(sync_max_bytes or max_bytes, max_bytes)
        self.timeout_s = timeout_s
        self.sync_timeout_s = sync_timeout_s if sync_timeout_s is not None else timeout_s

    async def _reject(self, send: Send, limit: int) -> None:
        await _send_json(
            send, 413, {"error": f"request body larger than {limit} bytes", "detail": None},
            [(b"connection", b"close")],
        )

    @staticmethod
    def _is_sync(scope: Scope) -> bool:
        return scope.get("method") == "POST" and str(scope.get("path", "")).endswith("/sync")

    def limit_for(self, scope: Scope) -> int:
        """The byte limit of one request."""
        return self.sync_max_bytes if self._is_sync(scope) else self.max_bytes

    def timeout_for(self, scope: Scope) -> float | None:
        """The seconds one request has to deliver its whole body (``None``: no deadline)."""
        return self.sync_timeout_s if self._is_sync(scope) else self.timeout_s

    @staticmethod
    async def _read(receive: Receive, limit: int) -> tuple[list[bytes], list[Message]] | None:
        """The body's chunks and what followed them (an ``http.disconnect``), or None once over ``limit``."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return chunks, [message]  # http.disconnect: hand it on, the app sees the client left
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return None
            chunks.append(body)
            if not message.get("more_body", False):
                return chunks, []

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
        timeout = self.timeout_for(scope)
        read: tuple[list[bytes], list[Message]] | None = None
        with anyio.move_on_after(timeout) as deadline:
            read = await self._read(receive, limit)
        if deadline.cancelled_caught:
            await _send_json(
                send, 408, {"error": f"request body not received within {timeout:g} s", "detail": None},
                [(b"connection", b"close")],
            )
            return
        if read is None:
            await self._reject(send, limit)
            return
        chunks, extra = read
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}, *extra]

        async def replay_receive() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        await self.app(scope, replay_receive, send)
