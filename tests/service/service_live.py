"""A real uvicorn server on 127.0.0.1 in a background thread, and a real ``memory-recall serve`` subprocess (not a
test module; imported by the service tests as ``from service_live import LiveServer``: pytest puts tests/service
on sys.path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """One uvicorn server running ``app`` in a background thread; ``url`` is its base URL. ``options`` go to
    ``uvicorn.Config`` (e.g. ``memory_recall.service.connections.server_options(...)``, as ``serve`` runs it)."""

    def __init__(self, app: Any, **options: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", **options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "uvicorn did not stop"


class ServeProcess:
    """``python -m memory_recall.cli serve --port <free> ARGS`` with no ``MEMORY_RECALL_*`` variable of the test
    environment but ``env``, and no embedder (nothing to load). ``start()`` waits for ``GET /v1/health``;
    ``stop()`` sends SIGINT (graceful shutdown) and returns the whole stderr."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "memory_recall.cli", "serve", "--port", str(self.port), *args]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_RECALL_")}
        self.env.update({"MEMORY_RECALL_EMBEDDING__PROVIDER": "none", **(env or {})})
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 60.0) -> ServeProcess:
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.stop()}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve did not answer within {timeout} s: {self.stop()}")
            time.sleep(0.1)

    def stop(self) -> str:
        assert self.proc is not None, "not started"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err
