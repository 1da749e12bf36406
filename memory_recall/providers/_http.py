"""The pooled httpx client both OpenAI-compatible providers share (created lazily, closed once)."""

from __future__ import annotations

import threading
from typing import Self

import httpx


class PooledHttpClient:
    """Mixin: a lazily created, lock-guarded ``httpx.Client`` with ``close()`` and context-manager support.

    The class using it sets ``api_key`` (sent as ``Authorization: Bearer``), ``transport`` (``None`` for the
    network), ``_lock`` (a ``threading.Lock``) and ``_client = None`` in its ``__init__``.
    """

    api_key: str | None
    transport: httpx.BaseTransport | None
    _lock: threading.Lock
    _client: httpx.Client | None

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                headers = {"Accept": "application/json"}
                if self.api_key:
                    headers["Authorization"] = f"Bearer {self.api_key}"
                self._client = httpx.Client(headers=headers, transport=self.transport, follow_redirects=False)
            return self._client

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
