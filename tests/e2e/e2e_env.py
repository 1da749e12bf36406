"""What the end-to-end tests need from the machine, and the process plumbing they share.

Not a test module: the e2e modules import it as ``e2e_env`` (pytest puts ``tests/e2e`` on ``sys.path``).

* Paths: :data:`REPO_ROOT`, :func:`cache_dir` (``$MEMORY_RECALL_E2E_CACHE``, default ``<repo>/.cache/e2e``).
* Requirements: :func:`missing` raises ``pytest.skip`` with the reason, or ``pytest.fail`` when
  ``MEMORY_RECALL_E2E=require`` (CI sets it, so a missing browser or runtime fails instead of passing green).
* Processes: :class:`ManagedProcess` runs one command in its own process group with its output in a log file,
  and :func:`wait_until` / :func:`wait_http` poll for readiness with the log tail in the failure message.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn, TypeVar

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

ENV_MODE = "MEMORY_RECALL_E2E"  # "require": a missing prerequisite fails the test instead of skipping it
ENV_CACHE = "MEMORY_RECALL_E2E_CACHE"
ENV_TARBALL = "MEMORY_RECALL_E2E_SILLYTAVERN_TARBALL"
ENV_CHROMIUM = "MEMORY_RECALL_E2E_CHROMIUM"  # path of a Chromium binary when it is not `chromium` on PATH

T = TypeVar("T")


class E2EError(RuntimeError):
    """A harness step failed (a process did not start, a page did not get ready...). The message says which and
    carries the relevant log tail."""


def required() -> bool:
    """True when missing prerequisites must fail the run (``MEMORY_RECALL_E2E=require``)."""
    return os.environ.get(ENV_MODE, "").strip().lower() == "require"


def missing(reason: str) -> NoReturn:
    """Skip the current test (or fixture) because ``reason`` is missing; fail instead under ``require``."""
    if required():
        pytest.fail(f"e2e prerequisite missing ({ENV_MODE}=require): {reason}", pytrace=False)
    pytest.skip(f"e2e prerequisite missing: {reason}")


def cache_dir() -> Path:
    """Where installed SillyTavern trees are kept between runs (created on demand)."""
    raw = os.environ.get(ENV_CACHE, "").strip()
    path = Path(raw).expanduser() if raw else REPO_ROOT / ".cache" / "e2e"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def find_chromium() -> str | None:
    """The Chromium executable: ``$MEMORY_RECALL_E2E_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH."""
    override = os.environ.get(ENV_CHROMIUM, "").strip()
    if override:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (bound, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist), for failure messages."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    details: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns a truthy value, which is returned.

    Raises :class:`E2EError` naming ``what`` after ``timeout`` seconds, with ``details()`` appended (e.g. a
    log tail). Exceptions of the predicate propagate: callers catch what they expect while things start.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = details() if details else ""
            raise E2EError(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{extra}" if extra else ""))
        time.sleep(interval)


class ManagedProcess:
    """One long-running command in its own process group; stdout and stderr go to ``log_path``.

    ``stop()`` signals the whole group (SIGTERM, then SIGKILL after ``grace`` seconds), so helpers the command
    spawned (npm → node, a CGI child) die with it. Safe to call twice.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.name = name or Path(self.argv[0]).name
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        """Start the command (appending to the log, so a restart keeps the earlier output)."""
        if self.running:
            raise E2EError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n--- start {' '.join(self.argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def log_tail(self, lines: int = 40) -> str:
        return f"--- last lines of {self.log_path}:\n{tail(self.log_path, lines)}"

    def check_alive(self) -> None:
        """Raise :class:`E2EError` with the log tail when the process has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            raise E2EError(f"{self.name} exited with status {self._proc.returncode}\n{self.log_tail()}")

    def stop(self, grace: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
        # The leader is gone; children that ignored SIGTERM must not outlive the test session.
        self._signal_group(proc.pid, signal.SIGKILL)

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_http(url: str, *, timeout: float, process: ManagedProcess | None = None, what: str | None = None) -> None:
    """Wait until ``GET url`` answers with a status below 500; fail early if ``process`` exits meanwhile."""

    def answered() -> bool:
        if process is not None:
            process.check_alive()
        try:
            return httpx.get(url, timeout=2.0).status_code < 500
        except httpx.HTTPError:
            return False

    wait_until(
        answered,
        timeout=timeout,
        interval=0.2,
        what=what or f"{url} to answer",
        details=process.log_tail if process is not None else None,
    )


def run(
    argv: Sequence[str], *, cwd: Path, log_path: Path, timeout: float, env: Mapping[str, str] | None = None
) -> None:
    """Run a setup command to completion, its output appended to ``log_path``; raise with the tail on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n--- run {' '.join(argv)} (in {cwd})\n".encode())
        log.flush()
        try:
            done = subprocess.run(
                list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired:
            raise E2EError(f"{' '.join(argv)} timed out after {timeout:.0f}s\n{tail(log_path)}") from None
    if done.returncode != 0:
        raise E2EError(f"{' '.join(argv)} failed with status {done.returncode}\n{tail(log_path)}")


class ThreadedServer:
    """A ``ThreadingHTTPServer`` for ``handler`` on 127.0.0.1 (free port) serving in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
