"""Connection deadlines of the uvicorn server that :func:`memory_recall.service.serve` runs.

uvicorn bounds only the idle time after a response (``timeout_keep_alive``, armed when a response ends and
cancelled by the next byte). Measured on uvicorn 0.54 with h11 and raw sockets, before this module: a connection
that sent nothing, half a request line, half the headers, half a body, or half a request line after a
response stayed open for as long as the client wished (only the idle case closed, after 5 s). So a few slow
clients could hold the server's sockets forever. This module closes that gap:

* :class:`DeadlineH11Protocol` (uvicorn's h11 protocol plus one timer) closes a connection whose request head
  (request line and headers) is not complete ``header_timeout_s`` after the connection opened or after the
  first byte following a response, and one that is still sending a body the service already answered
  (401, 413, 421 sent before reading it) ``body_timeout_s`` after that response. It closes without a response:
  no request was parsed to answer, or the answer is already out.
* The body of a request being read is bounded in the app (:class:`memory_recall.service.auth.BodyLimit`, 408).
* :func:`server_options` gives uvicorn's keyword arguments for a :class:`~memory_recall.settings.ServiceSettings`:
  this protocol and ``timeout_keep_alive=idle_timeout_s``.

Usage::

    uvicorn.run(app, host=host, port=port, **server_options(settings.service))
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from memory_recall.settings import ServiceSettings

__all__ = ["DeadlineH11Protocol", "deadline_protocol", "server_options"]


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and a deadline for the rest of an answered body.

    ``head_timeout_s`` and ``drain_timeout_s`` are class attributes: uvicorn builds one protocol object per
    connection from a class (:func:`deadline_protocol` makes a configured subclass).
    """

    head_timeout_s: ClassVar[float] = 10.0
    drain_timeout_s: ClassVar[float] = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_kind: Literal["head", "drain"] | None = None
        self._drained: object = None  # the request cycle whose answered body the drain deadline bounds

    def _arm(self, kind: Literal["head", "drain"]) -> None:
        self._disarm()
        delay = self.head_timeout_s if kind == "head" else self.drain_timeout_s
        self._deadline = self.loop.call_later(delay, self._expired)
        self._deadline_kind = kind

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._deadline_kind = None

    def _expired(self) -> None:
        self._deadline = None
        self._deadline_kind = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            # The first byte of the next request head: uvicorn's keep-alive timer stops here (its own
            # data_received cancels it), so from now on nothing but this deadline bounds the head.
            self._arm("head")
        super().data_received(data)
        state = self.conn.their_state
        if self._deadline_kind == "head" and state is not h11.IDLE:
            self._disarm()  # head parsed: the body is the app's to bound (BodyLimit)
        elif self._deadline_kind == "drain" and state is h11.IDLE:
            # The answered body is through and the next cycle began; uvicorn's keep-alive timer was cancelled by
            # this data, so the next head (or idleness) is bounded like a fresh connection's.
            self._arm("head")
        elif self._deadline_kind == "drain" and self.cycle is not self._drained:
            self._disarm()  # the answered body ended and the next request's head arrived with it

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered before the body was read: h11 discards the rest, and every discarded byte would cancel
            # uvicorn's keep-alive timer again, so a trickling client could stay forever.
            self._arm("drain")
            self._drained = self.cycle


def deadline_protocol(header_timeout_s: float, body_timeout_s: float) -> type[DeadlineH11Protocol]:
    """A :class:`DeadlineH11Protocol` subclass with these deadlines (seconds, > 0)."""

    class _Configured(DeadlineH11Protocol):
        head_timeout_s = header_timeout_s
        drain_timeout_s = body_timeout_s

    return _Configured


def server_options(service: ServiceSettings) -> dict[str, Any]:
    """uvicorn's keyword arguments (``uvicorn.run``, ``uvicorn.Config``) for the connection limits of ``service``:
    ``http`` (:func:`deadline_protocol` of ``header_timeout_s``, ``body_timeout_s``) and ``timeout_keep_alive``
    (``idle_timeout_s``)."""
    return {
        "http": deadline_protocol(service.header_timeout_s, service.body_timeout_s),
        "timeout_keep_alive": service.idle_timeout_s,
    }
