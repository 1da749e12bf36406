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


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store per module for hypothesis tests (function-scoped fixtures do not mix with @given)."""
    s = Store(tmp_path_factory.mktemp("shared") / "store.sqlite3")
    yield s
    s.close()
