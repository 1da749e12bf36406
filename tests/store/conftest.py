from __future__ import annotations

from collections.abc import Iterator

import pytest

from memory_recall.store import Store


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store per module for hypothesis tests (function-scoped fixtures do not mix with @given)."""
    s = Store(tmp_path_factory.mktemp("shared") / "store.sqlite3")
    yield s
    s.close()
