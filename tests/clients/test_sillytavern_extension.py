"""The SillyTavern extension's logic under Node (no browser): ``node --test clients/sillytavern/test/``, its
service-backed tests against a real ``memory-recall serve`` app on 127.0.0.1 (lexical: no embedder)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from service_live import LiveServer

from memory_recall.service import create_app
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "sillytavern"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("MEMORY_RECALL_E2E") == "require":
            pytest.fail("node is not installed (MEMORY_RECALL_E2E=require)")
        pytest.skip("node is not installed")
    return node


def test_extension_logic_under_node(tmp_path: Path) -> None:
    node = _node()
    store = Store.open(tmp_path / "store")
    server = LiveServer(create_app(RecallSettings(), store=store)).start()
    try:
        proc = subprocess.run(
            [node, "--test", "--test-reporter=tap", *sorted(str(p) for p in (CLIENT / "test").glob("*.test.mjs"))],
            cwd=CLIENT, env={**os.environ, "MEMORY_RECALL_URL": server.url}, capture_output=True, text=True,
            timeout=300,
        )
    finally:
        server.stop()
        store.close()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    counts = dict(re.findall(r"^# (tests|pass|fail|skipped|cancelled) (\d+)$", proc.stdout, re.MULTILINE))
    # Every test ran (the service-backed ones skip only without MEMORY_RECALL_URL) and passed.
    assert counts["fail"] == counts["skipped"] == counts["cancelled"] == "0", out[-3000:]
    assert int(counts["pass"]) == int(counts["tests"]) >= 29, counts
