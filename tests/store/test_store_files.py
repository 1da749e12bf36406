"""A store this code creates is private: the SQLite file and its ``-wal``/``-shm`` files mode 0600, a data directory
:meth:`Store.open` creates 0700; existing files and directories keep their modes."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory_recall.errors import StoreError
from memory_recall.store import Store

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")

NODE = {"id": "n1", "type": "event", "fields": {"title": "The brass key"}}
SUFFIXES = ("", "-wal", "-shm")


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """umask 022, the common default, under which SQLite alone creates 0644 files and mkdir 0755 directories."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


class TestNewStore:
    def test_files_and_directory_are_private(self, tmp_path: Path) -> None:
        data = tmp_path / "parent" / "data"
        store = Store.open(data)
        try:
            store.upsert_nodes("c1", [NODE])
            db = data / "memory-recall.sqlite3"
            # The write connection is open, so the WAL and the shared-memory file exist now.
            assert {f"memory-recall.sqlite3{s}": _mode(Path(f"{db}{s}")) for s in SUFFIXES} == {
                "memory-recall.sqlite3": 0o600, "memory-recall.sqlite3-wal": 0o600, "memory-recall.sqlite3-shm": 0o600,
            }
            assert _mode(data) == 0o700
            assert _mode(data.parent) == 0o755  # a parent made on the way: the default mode, as with mkdir -p
        finally:
            store.close()
        with Store.open(data) as again:
            assert again.get_node("c1", "n1") is not None  # the pre-created empty file became a working store

    def test_store_by_path_is_private(self, tmp_path: Path) -> None:
        path = tmp_path / "chats.sqlite3"
        with Store(path) as store:
            store.upsert_nodes("c1", [NODE])
            assert [_mode(Path(f"{path}{s}")) for s in SUFFIXES] == [0o600, 0o600, 0o600]

    def test_missing_parent_directory_is_a_store_error(self, tmp_path: Path) -> None:
        with pytest.raises(StoreError, match=r"^cannot open the store .*missing.*No such file or directory"):
            Store(tmp_path / "missing" / "chats.sqlite3")


class TestExistingStore:
    def test_modes_are_kept(self, tmp_path: Path) -> None:
        data = tmp_path / "data"
        Store.open(data).close()
        db = data / "memory-recall.sqlite3"
        db.chmod(0o644)  # as a release before 0600 creation left it, or as an operator opened it to a group
        data.chmod(0o750)
        with Store.open(data) as store:
            store.upsert_nodes("c1", [NODE])
            assert [_mode(Path(f"{db}{s}")) for s in SUFFIXES] == [0o644, 0o644, 0o644]  # SQLite copies the mode
        assert _mode(data) == 0o750
