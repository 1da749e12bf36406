"""A real ``memory-recall serve`` as a subprocess, for the browser to call. Not a test module (``e2e_service``).

The service runs with the interpreter running pytest (``sys.executable -m memory_recall.cli serve``), so it is
the code of this work tree. Its CORS origins are the SillyTavern page origins given at construction.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from e2e_env import E2EError, ManagedProcess, free_port, tail, wait_http


class RecallService:
    """``memory-recall serve --data-dir <data_dir> --port <port>`` on 127.0.0.1.

    ``start()`` waits for ``GET /v1/health``; ``stop()`` ends it (an outage for the page); ``start()`` again
    brings it back on the same port and data directory. ``url`` is ``http://127.0.0.1:<port>``.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        cors_origins: Sequence[str],
        log_path: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.cors_origins = list(cors_origins)
        self.log_path = log_path
        self.extra_env = dict(env or {})
        self._process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    def start(self, timeout: float = 60.0, *, wait: bool = True) -> RecallService:
        """Run the service; with ``wait``, return once ``GET /v1/health`` answers (else call :meth:`wait_ready`).
        A no-op while it runs."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.extra_env,
               "MEMORY_RECALL_SERVICE__CORS_ORIGINS": json.dumps(self.cors_origins)}
        argv = [sys.executable, "-m", "memory_recall.cli", "serve",
                "--data-dir", str(self.data_dir), "--host", "127.0.0.1", "--port", str(self.port)]
        self._process = ManagedProcess(argv, log_path=self.log_path, env=env, name="memory-recall serve").start()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until ``GET /v1/health`` answers; raise with the log tail if the process exits first."""
        if self._process is None:
            raise E2EError("memory-recall serve is not started")
        wait_http(f"{self.url}/v1/health", timeout=timeout, process=self._process, what="memory-recall /v1/health")

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def restart(self) -> RecallService:
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        return f"--- last lines of {self.log_path}:\n{tail(self.log_path, lines)}"

    def get(self, path: str, **params: Any) -> Any:
        """``GET <path>`` on the service, JSON decoded (raises on an HTTP error status)."""
        response = httpx.get(f"{self.url}{path}", params=params or None, timeout=30.0)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: Any) -> Any:
        """``POST <path>`` with a JSON body, JSON decoded (raises on an HTTP error status)."""
        response = httpx.post(f"{self.url}{path}", json=body, timeout=60.0)
        response.raise_for_status()
        return response.json()
