"""Bulk write speed of the store: 10,000 nodes in one batch, FTS rows and snapshot columns included.

Usage: python scripts/bench_store.py [--nodes N]   (prints nodes/s for insert and update, and snapshot build ms)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from memory_recall.model.graph import Node
from memory_recall.store import Store
from memory_recall.store.snapshot import build_snapshot


def make_nodes(n: int) -> list[Node]:
    return [
        Node(
            id=f"n{i:06d}",
            type="event" if i % 3 else "character",
            seq=i,
            fields={
                "title": f"Event {i} at the north gate",
                "summary": f"Alice met Bob near the 钟楼入口 on day {i}; they argued about the old map.",
                "participants": ["Alice", "Bob"],
                "status": "resolved",
                "notes": "A longer free-text body that mentions the harbour, the storm and the lost ring.",
            },
            importance=5.0 + (i % 5),
            created_time=1_700_000_000_000 + i,
        )
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    nodes = make_nodes(args.nodes)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.sqlite3") as store:
        for label in ("insert", "update"):
            start = time.perf_counter()
            with store.write("bulk") as w:
                w.upsert_nodes(nodes)
            elapsed = time.perf_counter() - start
            print(f"upsert_nodes {label}: {args.nodes} nodes in {elapsed:.3f} s = {args.nodes / elapsed:,.0f} nodes/s")
        start = time.perf_counter()
        source = store.snapshot_source("bulk", "")
        read = time.perf_counter() - start
        snap = build_snapshot(source, now_ms=0)
        total = time.perf_counter() - start
        print(f"snapshot: read {read * 1000:.0f} ms, total {total * 1000:.0f} ms for {snap.n} nodes")


if __name__ == "__main__":
    main()
