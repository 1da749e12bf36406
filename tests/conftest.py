"""Fixtures every test directory may use: a real SQLite store file in the test's temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memory_recall.store import Store


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite3"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    s = Store(db_path)
    yield s
    s.close()
