"""``memory-recall serve`` logs one line per recall on stderr, in uvicorn's format, at the server's log level, and
never the query text below DEBUG (:func:`memory_recall.service.app.log_config`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn.config
from service_live import free_port

from memory_recall import heap
from memory_recall.errors import ConfigError
from memory_recall.service.app import log_config

CLI = Path(sys.executable).with_name("memory-recall")
QUERY = "Where did Marcus hide the brass key?"
RECALL_LINE = re.compile(
    r"INFO:     recall chat='log-chat' type=normal floor=0 -> completed/recall-completed source=fresh \d+\.\d ms"
)


def _user_arena_cap() -> bool:
    return "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", "")


@contextmanager
def _serve(tmp_path: Path, *extra: str) -> Iterator[tuple[httpx.Client, int, list[str]]]:
    """A running ``memory-recall serve`` on a free port: a client for it, the port, and a list that holds the
    server's whole stderr once the block has left (the server is stopped with SIGINT: graceful shutdown)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_RECALL_")}
    env["MEMORY_RECALL_EMBEDDING__PROVIDER"] = "none"  # no model to load: the test is about the log line
    assert CLI.is_file(), f"console script not installed next to {sys.executable}"
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    stderr: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"serve exited with {proc.returncode}"
            try:
                if client.get("/v1/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not answer within 60 s"
            time.sleep(0.1)
        yield client, port, stderr
    finally:
        client.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        stderr.append(err)


def _recall_and_stop(tmp_path: Path, *extra: str) -> tuple[dict[str, object], str, int]:
    """One recall through a real ``memory-recall serve``; the response, the whole stderr and the port."""
    body = {
        "chat_id": "log-chat",
        "messages": [{"floor": 0, "role": "user", "speaker": "Wren", "text": QUERY}],
        "target_user_floor": 0,
    }
    with _serve(tmp_path, *extra) as (client, port, stderr):
        # The host sends the message first (a recall for a chat the service does not hold is a 404).
        added = client.post("/v1/chats/log-chat/events", json={"type": "message_added", "messages": body["messages"]})
        assert added.status_code == 200
        response = client.post("/v1/recall", json=body)
        assert response.status_code == 200
    return response.json(), stderr[0], port


class TestServeLogs:
    def test_one_recall_line_in_uvicorn_format(self, tmp_path: Path) -> None:
        data, stderr, port = _recall_and_stop(tmp_path)
        assert (data["status"], data["reason"], data["source"]) == ("completed", "recall-completed", "fresh")
        lines = stderr.splitlines()
        recall_lines = [line for line in lines if " recall chat=" in line]
        assert len(recall_lines) == 1 and RECALL_LINE.fullmatch(recall_lines[0]), recall_lines
        # Same family as uvicorn's own lines: "INFO:" padded to 9 characters, then the message.
        assert f"INFO:     Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)" in lines
        assert QUERY not in stderr and "brass key" not in stderr
        # The service caps glibc's arenas at start (service.malloc_arenas; memory_recall.heap).
        assert ("INFO:     malloc arenas limited to 2" in lines) is bool(heap._glibc() and not _user_arena_cap())

    def test_log_level_is_honoured(self, tmp_path: Path) -> None:
        data, stderr, _ = _recall_and_stop(tmp_path, "--log-level", "warning")
        assert data["status"] == "completed"
        assert [line for line in stderr.splitlines() if " recall chat=" in line] == []
        assert "Uvicorn running" not in stderr


class TestLogConfig:
    def test_memory_recall_logger_on_uvicorn_default_handler(self) -> None:
        config = log_config("debug")
        assert config["loggers"]["memory_recall"] == {"handlers": ["default"], "level": 10, "propagate": False}
        assert config["handlers"]["default"] == {
            "formatter": "default", "class": "logging.StreamHandler", "stream": "ext://sys.stderr",
        }
        assert config["formatters"]["default"]["fmt"] == "%(levelprefix)s %(message)s"
        assert "memory_recall" not in uvicorn.config.LOGGING_CONFIG["loggers"]  # a copy: uvicorn's dict untouched

    @pytest.mark.parametrize(("name", "level"), [("info", 20), ("WARNING", 30), ("trace", 5), ("critical", 50)])
    def test_levels(self, name: str, level: int) -> None:
        assert log_config(name)["loggers"]["memory_recall"]["level"] == level

    def test_unknown_level(self) -> None:
        with pytest.raises(ConfigError) as err:
            log_config("verbose")
        assert str(err.value) == (
            "log_level: unknown log level 'verbose'; expected one of critical, error, warning, info, debug, trace"
        )


def test_port_0_serves_on_a_free_port_and_says_which(tmp_path: Path) -> None:
    """``serve --port 0`` binds any free port (not the default 8765) and names it in the start-up line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_RECALL_")}
    env["MEMORY_RECALL_EMBEDDING__PROVIDER"] = "none"
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stderr is not None
        started = re.compile(r"INFO:     Uvicorn running on http://127\.0\.0\.1:(\d+) \(Press CTRL\+C to quit\)")
        deadline = time.monotonic() + 60
        match = None
        while match is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, f"serve exited with {proc.wait()}"
            match = started.fullmatch(line.rstrip("\n"))
        assert match is not None
        port = int(match.group(1))
        assert port not in (0, 8765)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=30).json() == {"status": "ok"}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
