"""A writer process, a writing thread and three reader threads on one store file: no errors, whole batches."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from crash_writer import verify_batches
from store_helpers import node

from memory_recall.store import Store

WRITER = Path(__file__).with_name("crash_writer.py")
K = 40
BATCHES = 60
DIM = 4


def test_readers_only_ever_see_whole_batches(tmp_path: Path) -> None:
    db = tmp_path / "concurrent.sqlite3"
    store = Store(db)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(WRITER),
            str(db),
            "main",
            "--nodes",
            str(K),
            "--batches",
            str(BATCHES),
            "--dim",
            str(DIM),
            "--pause",
            "0.03",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    done = threading.Event()
    errors: list[BaseException] = []
    observed: list[Counter[int]] = [Counter() for _ in range(3)]

    def reader(slot: int) -> None:
        last_version, last_count = 0, 0
        try:
            while not done.is_set():
                # Two separate reads, as a caller would do them: each must show whole batches only.
                version = store.chat_version("main")
                nodes = store.get_nodes("main")
                per_batch = Counter(int(n.fields["batch"]) for n in nodes)
                assert set(per_batch.values()) <= {K}, f"partial batch: {per_batch}"
                assert version >= last_version and len(nodes) >= last_count
                last_version, last_count = version, len(nodes)
                # One snapshot: nodes, edges, vectors and chat state all agree.
                with store.read() as r:
                    observed[slot][verify_batches(r, "main", K, DIM)] += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def side_writer() -> None:
        # Competes with the writer process for SQLite's write lock: the busy timeout must absorb it.
        try:
            for i in range(40):
                with store.write("side") as w:
                    w.upsert_nodes([node(f"s{i}-{j}", title="side") for j in range(20)])
        except BaseException as exc:
            errors.append(exc)

    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first == "READY 0\n", first
    threads = [threading.Thread(target=reader, args=(slot,)) for slot in range(3)]
    threads.append(threading.Thread(target=side_writer))
    for t in threads:
        t.start()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=60)
    try:
        assert proc.returncode == 0, err
        assert errors == [], errors
        assert out.splitlines()[-1] == f"ACK {BATCHES - 1}"
        with store.read() as r:
            assert verify_batches(r, "main", K, DIM, fts_batches=range(BATCHES)) == BATCHES
        assert len(store.get_nodes("side")) == 800
        assert store.chat_version("side") > 0
        for seen in observed:
            # Every reader saw the store while it was being written, not just before and after: at least one
            # intermediate state besides the first and the last (how many depends on the machine's load).
            assert len(seen) >= 3, seen
    finally:
        store.close()
