"""The recall right after a write, beside the warm recall of the same run (the user's turn without embeddings).

For each size: the benchmark graph (``memory_recall.bench``) in a store, one :class:`SnapshotCache`, recalls with the
app settings (query vectors seeded, so no embedding is timed). Warm: recalls on the cached snapshot. After a write:
one new chat message ingested (``ingest_messages``, no embedding) and, as every chat event of the controller ends
(:meth:`RecallController.refresh`), the cached snapshot, the pipeline's per-structure values and the BM25 index
brought up to date (``refresh_ms``; ``event_ms`` = ingest + refresh, what the event's caller waits for); then the
recall (the cache's ``get`` and the pipeline). ``--no-refresh`` leaves all of that to the recall, as before events
refreshed (``snapshot_ms`` is then the ``get``). Prints one JSON object per size: p50/p95 of ``warm_ms``,
``ingest_ms``, ``refresh_ms``/``snapshot_ms``, ``event_ms``, ``recall_ms`` (the recall after the event),
``after_write_ms`` (refresh + recall), ``recall_ratio`` (recall p50 / warm p50) and ``ratio`` (after-write p50 / warm
p50), the same as process CPU time (``*_cpu_ms``, ``*cpu_ratio``: less sensitive to other load), how the cache got
its snapshots, and the load average.

    python scripts/bench_after_write.py --sizes 10000,100000 --turns 15 --store-dir bench-stores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"p50": round(float(np.percentile(arr, 50)), 2), "p95": round(float(np.percentile(arr, 95)), 2)}


def _graph(n: int, store_dir: Path) -> Path:
    """The size-``n`` benchmark graph, written once into ``store_dir`` by a child process (then reused)."""
    path = store_dir / f"after-write-{n}.sqlite3"
    if not path.exists():
        cmd = [sys.executable, "-m", "memory_recall.bench", "--write", str(n), "--db", str(path)]
        subprocess.run(cmd, check=True, capture_output=True, env=os.environ.copy())
    return path


def bench_size(n: int, turns: int, warm: int, store_dir: Path, refresh: bool = True) -> dict[str, Any]:
    from memory_recall import bench
    from memory_recall.ingest.messages import ingest_messages
    from memory_recall.model.chat import ChatMessage
    from memory_recall.pipeline.retrieve import prepare_snapshot, retrieve
    from memory_recall.pipeline.state import Providers
    from memory_recall.providers.embedding import LOCAL_MODEL_ID
    from memory_recall.settings import RecallSettings
    from memory_recall.store import Store
    from memory_recall.store.snapshot import SnapshotCache

    source = _graph(n, store_dir)
    with tempfile.TemporaryDirectory(prefix="after-write-") as tmp:
        path = Path(tmp) / "store.sqlite3"
        shutil.copyfile(source, path)
        scene = bench._Scene(n)
        settings = RecallSettings(profile="app")
        embedder = bench._PassThroughEmbedder(LOCAL_MODEL_ID, {})
        with Store(path) as store, bench._blas_one_thread():
            cache = SnapshotCache()
            providers = Providers(embedder=embedder, lexical_index=partial(store.bm25, bench.CHAT))
            now = bench.NOW_MS

            def recall(k: int) -> tuple[float, float]:
                snap = cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now)
                text = bench.QUERIES[k % len(bench.QUERIES)]
                start, cpu = time.perf_counter(), time.process_time()
                retrieve(snap, bench._query(scene, k, text), settings, providers)
                return (time.perf_counter() - start) * 1000, (time.process_time() - cpu) * 1000

            for k in range(len(bench.QUERIES)):  # warm-up: snapshot, BM25 index, lazy caches
                recall(k)
            warm_runs = [recall(k) for k in range(warm)]
            warm_ms, warm_cpu = [w for w, _ in warm_runs], [c for _, c in warm_runs]
            ingest, update, after, total, total_cpu, recall_cpu = [], [], [], [], [], []
            how: Counter[str] = Counter()
            for j in range(turns):
                message = ChatMessage(floor=9_000_000 + j, role="user", speaker=bench.USER,
                                      text=f"I light the lantern by the harbor and ask Mira about the tower, turn {j}.")
                t0 = time.perf_counter()
                ingest_messages(store, bench.CHAT, [message], now_ms=now)
                t1, c1 = time.perf_counter(), time.process_time()
                if refresh:  # what RecallController.refresh does at the end of every chat event
                    for fresh in cache.refresh(store, bench.CHAT, now_ms=now):
                        prepare_snapshot(fresh)
                    store.refresh_bm25(bench.CHAT)
                t2, c2 = time.perf_counter(), time.process_time()
                snap = cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now)
                how[getattr(cache, "last_update", {}).get(bench.CHAT, "rebuild")] += 1
                text = bench.QUERIES[j % len(bench.QUERIES)]
                retrieve(snap, bench._query(scene, j, text), settings, providers)
                t3, c3 = time.perf_counter(), time.process_time()
                total_cpu.append((c3 - c1) * 1000)
                recall_cpu.append((c3 - c2) * 1000)
                ingest.append((t1 - t0) * 1000)
                update.append((t2 - t1) * 1000)
                after.append((t3 - t2) * 1000)
                total.append((t3 - t1) * 1000)
    out = {
        "nodes": n, "refresh": refresh, "warm_ms": _pct(warm_ms), "ingest_ms": _pct(ingest),
        "refresh_ms" if refresh else "snapshot_ms": _pct(update),
        "event_ms": _pct([a + b for a, b in zip(ingest, update, strict=True)]) if refresh else None,
        "recall_ms": _pct(after), "after_write_ms": _pct(total),
        "recall_ratio": round(float(np.median(after)) / float(np.median(warm_ms)), 2),
        "ratio": round(float(np.median(total)) / float(np.median(warm_ms)), 2),
        # Process CPU time: less sensitive to the other load on shared cores than the wall times.
        "warm_cpu_ms": _pct(warm_cpu), "after_write_cpu_ms": _pct(total_cpu), "recall_cpu_ms": _pct(recall_cpu),
        "cpu_ratio": round(float(np.median(total_cpu)) / float(np.median(warm_cpu)), 2),
        "recall_cpu_ratio": round(float(np.median(recall_cpu)) / float(np.median(warm_cpu)), 2),
        "snapshot_how": dict(how),
        "loadavg": [round(v, 2) for v in os.getloadavg()],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000", help="comma-separated graph sizes")
    parser.add_argument("--turns", type=int, default=15, help="messages ingested (one recall after each)")
    parser.add_argument("--warm", type=int, default=30, help="warm recalls")
    parser.add_argument("--store-dir", default="", help="keep the written graphs here (reused by later runs)")
    parser.add_argument("--no-refresh", action="store_true",
                        help="leave the snapshot update to the recall (the code before events refreshed it)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="after-write-graphs-") as tmp:
        store_dir = Path(args.store_dir or tmp)
        store_dir.mkdir(parents=True, exist_ok=True)
        for n in (int(s) for s in args.sizes.split(",") if s):
            print(json.dumps(bench_size(n, args.turns, args.warm, store_dir, not args.no_refresh)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
