"""Crash safety: a writer SIGKILLed at random points loses no acknowledged batch and leaves no partial one.

Not marked slow on purpose (≈ 25 s): durability is the store's first promise.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from crash_writer import MODEL, batch, batch_term, node_id, vector

from memory_recall.store import Store

WRITER = Path(__file__).with_name("crash_writer.py")
RUNS = 22
K = 200
DIM = 8


def _sql_batches(db: Path, chat: str) -> int:
    """Per-batch row counts of every table, straight from SQLite; asserts whole batches only; returns m."""
    conn = sqlite3.connect(str(db))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

        def per_batch(sql: str) -> dict[int, int]:
            return {int(b): c for b, c in conn.execute(sql, (chat,))}

        nodes = per_batch(
            "SELECT json_extract(json, '$.fields.batch'), count(*) FROM nodes WHERE chat_id = ? GROUP BY 1"
        )
        edges = per_batch("SELECT substr(edge_id, 2, 6), count(*) FROM edges WHERE chat_id = ? GROUP BY 1")
        vectors = per_batch(
            "SELECT substr(node_id, 2, 6), count(*) FROM embeddings WHERE chat_id = ? GROUP BY 1"
        )
        fts = per_batch("SELECT substr(node_id, 2, 6), count(*) FROM nodes_fts WHERE chat_id = ? GROUP BY 1")
        row = conn.execute(
            "SELECT json_extract(json, '$.last_processed_assistant_floor') FROM chat_state "
            "WHERE chat_id = ? AND kind = 'history'",
            (chat,),
        ).fetchone()
    finally:
        conn.close()
    m = len(nodes)
    assert sorted(nodes) == list(range(m))
    assert nodes == dict.fromkeys(range(m), K), "a partial batch of nodes"
    assert edges == dict.fromkeys(range(m), K - 1), "a partial batch of edges"
    assert vectors == dict.fromkeys(range(m), K), "a partial batch of vectors"
    assert fts == dict.fromkeys(range(m), K), "a partial batch of FTS rows"
    assert (row[0] if row else -1) == m - 1, "history does not match the batches"
    return m


def _api_check(db: Path, chat: str, batches: range) -> None:
    """The batches of one run, read through the Store API: exact models, vectors, edges and BM25 hits."""
    with Store(db) as store:
        assert store.check_integrity() == []
        with store.read() as r:
            ids, mat = r.get_embeddings(chat, MODEL)
            for b in batches:
                nodes, edges = batch(b, K)
                assert r.get_nodes(chat, [n.id for n in nodes]) == nodes
                assert r.edges_of(chat, node_id(b, 1)) == edges[0:2]
                assert ids[b * K : (b + 1) * K] == [n.id for n in nodes]
                assert np.array_equal(
                    mat[b * K : (b + 1) * K], np.stack([vector(b, i, DIM) for i in range(K)])
                )
                hits = r.bm25(chat, [batch_term(b)], limit=K + 10)
                assert sorted(i for i, _ in hits) == [n.id for n in nodes]


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
def test_acknowledged_batches_survive_sigkill(tmp_path: Path) -> None:
    rng = random.Random(20240917)
    db = tmp_path / "crash.sqlite3"
    chat = "crash-chat"
    acked = -1
    mid_batch_kills = 0
    for run in range(RUNS):
        proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(db), chat, "--nodes", str(K), "--dim", str(DIM)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            if run in (0, 7):
                # Kill at a random moment of start-up (imports, open, migrations on the first run).
                time.sleep(rng.uniform(0.2, 0.6))
                lines: list[str] = []
            else:
                lines = [proc.stdout.readline()]  # type: ignore[union-attr]
                assert lines[0].startswith("READY"), lines[0] + proc.stderr.read()  # type: ignore[union-attr]
                # Wait for the first acknowledgement so every run makes progress however loaded the machine
                # is, then kill at a random moment of the following batches.
                while not lines[-1].startswith("ACK"):
                    line = proc.stdout.readline()  # type: ignore[union-attr]
                    assert line, "writer exited early: " + proc.stderr.read()  # type: ignore[union-attr]
                    lines.append(line)
                time.sleep(rng.uniform(0.0, 0.3))
        finally:
            proc.kill()  # SIGKILL on POSIX
            out, err = proc.communicate(timeout=30)
        lines += out.splitlines()
        assert proc.returncode == -9, err
        acks = [int(line.split()[1]) for line in lines if line.startswith("ACK")]
        if lines and lines[-1].startswith("BEGIN"):
            mid_batch_kills += 1
        start = int(lines[0].split()[1]) if lines and lines[0].startswith("READY") else max(acked + 1, 0)
        acked = max([acked, *acks])
        if not db.exists():
            continue
        m = _sql_batches(db, chat)
        assert m - 1 >= acked, f"run {run}: batch {acked} was acknowledged but only {m} batches survived"
        # The run's batches, plus one committed but killed before its ACK, are whole through the API too.
        _api_check(db, chat, range(start, m))
    # Every run but the two start-up kills acknowledged at least one batch (ids count from 0).
    assert acked + 1 >= RUNS - 2, "the writer acknowledged too few batches to test anything"
    assert mid_batch_kills >= RUNS // 2, f"only {mid_batch_kills} kills landed inside a transaction"
