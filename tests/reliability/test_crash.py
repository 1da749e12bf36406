"""Crash safety, fast variant of ``scripts/crash_test.py``: a few SIGKILLs of a writer process and of the running
service (real uvicorn on 127.0.0.1) under concurrent recall and ingest; after each kill the store opens, passes
its integrity checks, holds every journalled (acknowledged) write with its content and no recall record names a
missing node. Also checks that the checker itself catches a lost write, a dangling record and a damaged file.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from rel_crash_helpers import load_script

from memory_recall.controller import RecallController
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

ct = load_script("crash_test")
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


def _clean(result: dict[str, object], kills: int) -> None:
    assert result["kills"] == kills
    assert result["open_failures"] == 0
    assert result["integrity_failures"] == 0
    assert result["lost_acknowledged_writes"] == 0
    assert result["dangling_records"] == 0
    assert result["problems"] == []


def test_writer_sigkills_lose_no_acknowledged_write(tmp_path: Path) -> None:
    result = ct.run_writer_kills(tmp_path, 5, seed=3)
    _clean(result, 5)
    # Every run is killed after its first acknowledgement, so each contributes at least one journalled write.
    assert result["acknowledged_writes"] >= 5
    # The op sequence of each child is seeded by its run; runs 0-4 all start with a message ingest (how many
    # batches and edits follow depends on when the kill lands).
    kinds = result["acknowledged_by_kind"]
    assert kinds.get("msg", 0) >= 5 and set(kinds) <= {"msg", "nodes", "edit"}
    assert result["concurrent_recalls"] > 0, "the recall thread of the writer never ran"


def test_service_sigkills_lose_no_acknowledged_write(tmp_path: Path) -> None:
    result = ct.run_service_kills(tmp_path, 3, seed=4, clients=3)
    _clean(result, 3)
    assert result["unexpected_answers"] == []
    assert result["acknowledged_writes"] >= 3
    assert result["concurrent_recalls"] > 0
    # Three restarts after kills plus the final one, each answering health and a recall.
    assert result["restart_ms_max"] is not None and result["restart_ms_max"] < 120_000


class TestChecker:
    """The post-kill check is not vacuous: it reports what it is meant to find."""

    def _store(self, data_dir: Path) -> None:
        with Store.open(data_dir) as store:
            ctl = RecallController(store, RecallSettings(), embedder=None)
            msg = ChatMessage(floor=1, role="user", speaker="Traveller", text="Alice hid the silver key")
            ctl.on_message_added(ct.CHAT, msg)
            resp = ctl.run_recall({"chat_id": ct.CHAT, "messages": [msg.model_dump()], "target_user_floor": 1})
            assert resp.record is not None
            ctl.edit_record(ct.CHAT, 1, "edited text")

    def test_sound_store_passes(self, tmp_path: Path) -> None:
        self._store(tmp_path)
        journal = ct.Journal(tmp_path / "j.jsonl")
        journal.append({"k": "msg", "chat": ct.CHAT, "floor": 1, "text": "Alice hid the silver key"})
        journal.append({"k": "edit", "chat": ct.CHAT, "floor": 1, "text": "edited text"})
        journal.close()
        check = ct.check_store(tmp_path, tmp_path / "j.jsonl")
        assert check.ok and check.checked_writes == 2 and check.records == 1

    def test_lost_writes_and_dangling_records_are_reported(self, tmp_path: Path) -> None:
        self._store(tmp_path)
        journal = ct.Journal(tmp_path / "j.jsonl")
        journal.append({"k": "msg", "chat": ct.CHAT, "floor": 2, "text": "never written"})
        journal.append({"k": "msg", "chat": ct.CHAT, "floor": 1, "text": "other text"})
        journal.append({"k": "nodes", "chat": ct.CHAT, "ids": ["ghost"], "summaries": ["x"]})
        journal.append({"k": "edit", "chat": ct.CHAT, "floor": 1, "text": "another edit"})
        journal.close()
        # A cut last line (no newline) was never acknowledged: ignored, not a parse error.
        with open(tmp_path / "j.jsonl", "a") as f:
            f.write('{"k": "msg", "chat"')
        conn = sqlite3.connect(tmp_path / ct.DB_NAME)
        (raw,) = conn.execute("SELECT json FROM recall_records").fetchone()
        rec = json.loads(raw)
        rec["selected_node_ids"] = [*rec["selected_node_ids"], "gone-node"]
        conn.execute("UPDATE recall_records SET json = ?", (json.dumps(rec),))
        conn.commit()
        conn.close()
        check = ct.check_store(tmp_path, tmp_path / "j.jsonl")
        assert not check.ok and check.integrity == []
        assert [p.split(":")[0] for p in check.lost] == [
            "message floor 2", "message floor 1", "node ghost", "record edit floor 1"
        ]
        assert check.dangling == [f"record {ct.CHAT}/1 -> ['gone-node']"]

    def test_damaged_file_is_reported(self, tmp_path: Path) -> None:
        self._store(tmp_path)
        db = tmp_path / ct.DB_NAME
        data = bytearray(db.read_bytes())
        # Overwrite every page after the first (the header stays valid, the b-trees do not).
        data[4096:] = b"\xa5" * (len(data) - 4096)
        db.write_bytes(bytes(data))
        check = ct.check_store(tmp_path, tmp_path / "missing.jsonl")
        assert not check.ok and check.integrity
