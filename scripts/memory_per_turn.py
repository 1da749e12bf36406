"""What the service keeps per chat turn, measured without the allocator's noise (issue 16).

Usage::

    python scripts/memory_per_turn.py --messages 2000 --turns 60,160,260

The service's RSS under load (``scripts/load_test.py``) mixes what the service keeps with what the allocators
hold on to (arenas of many threads, freed pages not returned), so two runs of the same minute differ by several
MiB. This script counts what Python still references instead: the service app in process (FastAPI's test
client, the real store on a copy of the load script's message chat, the packaged local embedder), one
``message_added`` event and three recalls per turn, one after the other. ``tracemalloc`` starts at the first mark
(after the working set of the first turns has filled) and, at each later mark, after the background embedding
settled and a full collection, prints the memory allocated since then and still alive (``retained``), the
anonymous RSS beside it, and the retained KiB per turn since the previous mark. At the last mark it lists the
lines that hold the most.

Between two late marks ``retained`` grows by what each turn adds for good: the new message's rows, vectors and
packed fields, and the caches of the nodes it touched. From the first mark to the second it also counts the
long-lived buffers that were reallocated meanwhile (the vector matrix grows by copying), so compare late marks.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Sequence
from pathlib import Path


def anon_rss_mib() -> float:
    """This process's anonymous resident memory (Linux ``/proc``), MiB."""
    from memory_recall.heap import anonymous_rss

    rss = anonymous_rss()
    if rss is None:
        raise RuntimeError("no RssAnon in /proc/self/status")
    return rss / 2**20


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="the chat's turns before the run")
    parser.add_argument("--turns", default="60,160,260",
                        help="marks: tracemalloc starts after the first, figures at the others")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--top", type=int, default=12, help="lines listed at the last mark")
    args = parser.parse_args(argv)
    marks = sorted({int(x) for x in args.turns.split(",")})
    if len(marks) < 2 or marks[0] < 1:
        parser.error(f"--turns needs two or more positive marks, got {args.turns!r}")

    os.environ["MEMORY_RECALL_CONFIG"] = ""
    os.environ["MEMORY_RECALL_EMBEDDING__PROVIDER"] = "local"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import load_test as lt

    with warnings.catch_warnings():  # Starlette asks for httpx2 instead of httpx; httpx serves the test client
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
        from fastapi.testclient import TestClient

    from memory_recall.providers import make_embedder
    from memory_recall.service.app import create_app
    from memory_recall.settings import load_settings

    data_dir = Path(tempfile.gettempdir()) / f"memory-recall-load-msgs-{args.messages}"
    lt.build_message_chat(data_dir, args.messages, vectors="random", log=lambda _: None)
    run_dir = Path(tempfile.mkdtemp(prefix="memory-per-turn-"))
    try:
        for f in data_dir.glob(f"{lt.DB_NAME}*"):
            shutil.copy2(f, run_dir / f.name)
        settings = load_settings(None)
        settings = settings.model_copy(update={"store": settings.store.model_copy(update={"data_dir": str(run_dir)})})
        app = create_app(settings, embedder=make_embedder(settings.embedding))
        queries = lt.message_queries()
        rng = random.Random(args.seed)
        last: tuple[int, int] | None = None
        with TestClient(app, base_url="http://127.0.0.1") as client:
            for turn in range(1, marks[-1] + 1):
                who = rng.choice(("Alice", "Bram", "Corin", "Dahlia"))
                message = {"floor": 5_000_000 + turn, "role": rng.choice(("user", "assistant")), "speaker": who,
                           "text": f"{who} looks at the {rng.choice(queries).lower()} ({turn})"}
                r = client.post(f"/v1/chats/{lt.CHAT}/events", json={"type": "message_added", "message": message})
                r.raise_for_status()
                for j in range(3):
                    body = lt._recall_body(0, 2_000_000 + turn * 10 + j, rng.choice(queries))
                    client.post("/v1/recall", json=body).raise_for_status()
                if turn not in marks:
                    continue
                time.sleep(1.5)  # the background embedding of the last turns
                gc.collect()
                if turn == marks[0]:
                    tracemalloc.start(6)
                    print(f"turn {turn}: tracing starts; anonymous RSS {anon_rss_mib():.1f} MiB", flush=True)
                    last = (turn, 0)
                    continue
                retained = tracemalloc.get_traced_memory()[0]
                assert last is not None
                per_turn = (retained - last[1]) / 1024 / (turn - last[0])
                print(f"turn {turn}: retained since turn {marks[0]} {retained / 2**20:.2f} MiB, "
                      f"{per_turn:.1f} KiB per turn since turn {last[0]}; anonymous RSS {anon_rss_mib():.1f} MiB",
                      flush=True)
                last = (turn, retained)
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            tracemalloc.stop()
        print(f"what holds the most of it at turn {marks[-1]}:")
        for stat in snap.statistics("lineno")[: args.top]:
            print(f"  {stat}")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
