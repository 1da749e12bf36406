"""``eval fixtures`` leaves the user's store and the working directory alone: the chats go into a temporary
store, and report files are written only into ``--out``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from memory_recall.eval.runner import run_fixtures

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "chats"


class HashEmbedder:
    """Deterministic 16-d vectors from a text's SHA-256 (no model: the test is about files, not quality)."""

    model_id = "test:hash"
    dim = 16

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        rows = np.asarray([np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], np.uint8) for t in texts],
                          np.float32) + 1.0
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]


@pytest.fixture()
def user_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty working directory and the user's data directory (``$MEMORY_RECALL_DATA_DIR``)."""
    cwd, data = tmp_path / "cwd", tmp_path / "user-store"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("MEMORY_RECALL_DATA_DIR", str(data))
    return cwd, data


def test_default_writes_nothing(user_dirs: tuple[Path, Path]) -> None:
    cwd, data = user_dirs
    metrics = run_fixtures(FIXTURES, embedder=HashEmbedder(), quiet=True)
    assert metrics["questions"] == 24 and metrics["dataset"] == "fixtures"
    assert os.listdir(cwd) == [] and not data.exists()


def test_reports_only_into_out(user_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    cwd, data = user_dirs
    run_fixtures(FIXTURES, out=tmp_path / "reports", embedder=HashEmbedder(), quiet=True)
    assert sorted(os.listdir(tmp_path / "reports")) == ["details.json", "metrics.json", "report.md"]
    assert os.listdir(cwd) == [] and not data.exists()


def test_a_named_store_keeps_the_chats(user_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    from memory_recall.store import Store

    run_fixtures(FIXTURES, data_dir=tmp_path / "kept", embedder=HashEmbedder(), quiet=True)
    with Store.open(tmp_path / "kept") as store:
        assert [c.chat_id for c in store.list_chats()] == sorted(f"fixture-{p.parent.name}"
                                                                for p in FIXTURES.glob("*/questions.json"))
