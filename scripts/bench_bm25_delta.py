"""The chat's BM25 index after a write: first query after one new / edited / deleted message, beside the warm query.

On the bench graph (``memory_recall.bench.write_graph``), app lexical settings (Porter stemming, 100 hits, the
lexical stage's query terms of the bench queries). Per size it prints, as p50 over the rounds:

* ``build_ms``: the first query on a freshly opened store (every FTS row read and indexed);
* ``warm_ms``: a query on the cached index;
* per write kind (``new``: one new message node; ``edit``: an existing message's text changed; ``delete``: one
  message deleted): ``write_ms`` (the one-node write batch, commit included), ``first_ms`` (the first query after
  it: what a recall after a chat turn pays; ``first_max_ms`` the slowest of the rounds) and ``after_ms`` (the next
  query, warm again);
* whether the answers of the index maintained over all those writes equal those of a rebuild from the same rows.

``--compare PYTHONPATH`` runs the same measurement with another checkout of the package in a child process (its
own copy of the store), so old and new code are printed side by side from one run; note the load average beside
the figures (shared cores). Usage::

    python scripts/bench_bm25_delta.py --sizes 10000 100000 --store-dir DIR [--compare OLD_CHECKOUT] [--stream N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEM = "porter"  # the app settings' lexical stem method
LIMIT = 100  # the app settings' bm25_top_k


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def measure(path: Path, rounds: int, stream: int = 0) -> dict[str, Any]:
    """Open the store at ``path`` (a copy the run may modify) and time the index after writes (see the module)."""
    from memory_recall.bench import CHAT, QUERIES
    from memory_recall.pipeline.lexical import bm25_query_terms
    from memory_recall.store import Store
    from memory_recall.store.bm25_index import cache_for

    queries = [bm25_query_terms([q], 64) for q in QUERIES]
    out: dict[str, Any] = {}
    with Store(path) as store:
        start = time.perf_counter()
        store.bm25(CHAT, queries[0], LIMIT, stem=STEM)
        out["build_ms"] = round((time.perf_counter() - start) * 1000, 1)
        warm: list[float] = []
        for _ in range(3):
            for terms in queries:
                start = time.perf_counter()
                store.bm25(CHAT, terms, LIMIT, stem=STEM)
                warm.append((time.perf_counter() - start) * 1000)
        out["warm_ms"] = _p50(warm)
        messages = [n for n in store.get_nodes_by_type(CHAT, ["message"])][-3 * rounds - 1 :]
        cache = cache_for(store)
        builds = cache.builds
        for kind in ("new", "edit", "delete"):
            writes, firsts, afters = [], [], []
            for r in range(rounds):
                template = messages.pop()
                if kind == "new":
                    fields = dict(template.fields, content=f"new turn {r}: the storm reached the harbour gate")
                    changed = template.model_copy(update={"id": f"zz-new-{r:04d}", "fields": fields})
                elif kind == "edit":
                    fields = dict(template.fields, content=f"edited {r}: Alice hid the silver key in the tower")
                    changed = template.model_copy(update={"fields": fields})
                start = time.perf_counter()
                if kind == "delete":
                    store.delete_nodes(CHAT, [template.id])
                else:
                    store.upsert_nodes(CHAT, [changed])
                writes.append((time.perf_counter() - start) * 1000)
                terms = queries[r % len(queries)]
                start = time.perf_counter()
                store.bm25(CHAT, terms, LIMIT, stem=STEM)
                firsts.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                store.bm25(CHAT, terms, LIMIT, stem=STEM)
                afters.append((time.perf_counter() - start) * 1000)
            out[kind] = {
                "write_ms": _p50(writes), "first_ms": _p50(firsts), "first_max_ms": round(max(firsts), 2),
                "after_ms": _p50(afters),
            }
        if stream:
            # A long run of turns (new message, then a query): crosses the delta segment's compaction threshold
            # (~3 % of the chat), so it shows what a compaction costs the turn that triggers it.
            template = messages[0]
            firsts, cpus = [], []
            for r in range(stream):
                fields = dict(template.fields, content=f"turn {r}: a lantern by the river bridge")
                store.upsert_nodes(CHAT, [template.model_copy(update={"id": f"zz-turn-{r:05d}", "fields": fields})])
                terms = queries[r % len(queries)]
                cpu, start = time.process_time(), time.perf_counter()
                store.bm25(CHAT, terms, LIMIT, stem=STEM)
                firsts.append((time.perf_counter() - start) * 1000)
                # Process CPU time (background compaction threads included): tells work from waiting for a core.
                cpus.append((time.process_time() - cpu) * 1000)
            firsts.sort()
            cpus.sort()
            out["stream"] = {
                "turns": stream, "first_p50_ms": _p50(firsts), "first_p95_ms": round(firsts[int(0.95 * stream)], 2),
                "first_max_ms": round(firsts[-1], 2), "cpu_p50_ms": _p50(cpus),
                "cpu_p95_ms": round(cpus[int(0.95 * stream)], 2), "cpu_max_ms": round(cpus[-1], 2),
            }
        out["rebuilds_after_writes"] = cache.builds - builds
        out["deltas"] = getattr(cache, "deltas", None)
        if hasattr(cache, "wait"):
            cache.wait()
        out["compactions"] = getattr(cache, "compactions", None)
        # The incrementally maintained index against a rebuild from the same rows: identical answers expected.
        maintained = [store.bm25(CHAT, terms, LIMIT, stem=STEM) for terms in queries]
        cache.clear()
        out["identical_to_rebuild"] = maintained == [store.bm25(CHAT, terms, LIMIT, stem=STEM) for terms in queries]
    return out


def _copy(src: Path, into: Path) -> Path:
    dst = into / src.name
    shutil.copyfile(src, dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--store-dir", default="", help="keep/reuse bench-<n>.sqlite3 here (written when missing)")
    ap.add_argument("--compare", default="", help="PYTHONPATH of another checkout to run side by side")
    ap.add_argument("--stream", type=int, default=0, help="also time this many turns in a row (new message + query)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)  # a store copy to measure, JSON to stdout
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child), args.rounds, args.stream)))
        return
    from memory_recall.bench import write_graph

    keep = Path(args.store_dir) if args.store_dir else Path(tempfile.mkdtemp(prefix="bench-bm25-"))
    keep.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for n in args.sizes:
        source = keep / f"bench-{n}.sqlite3"
        if not source.exists():
            write_graph(n, source)
        rows: dict[str, dict[str, Any]] = {}
        runs = [("compare", args.compare)] if args.compare else []
        runs.append(("this", ""))
        for label, pythonpath in runs:
            with tempfile.TemporaryDirectory(prefix="bench-bm25-run-") as tmp:
                copy = _copy(source, Path(tmp))
                if pythonpath:
                    env = dict(os.environ, PYTHONPATH=pythonpath)
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", str(copy), "--rounds", str(args.rounds),
                         "--stream", str(args.stream)],
                        env=env, cwd=tmp, check=True, capture_output=True, text=True,
                    )
                    rows[label] = json.loads(done.stdout.strip().splitlines()[-1])
                else:
                    rows[label] = measure(copy, args.rounds, args.stream)
        print(f"\n{n} nodes (load {os.getloadavg()[0]:.2f})")
        print(f"{'':>10} {'build':>8} {'warm':>7}  " + "  ".join(f"{k + ' write/first/after':>27}" for k in
                                                              ("new", "edit", "delete")) + "  rebuilds")
        for label, r in rows.items():
            cells = "  ".join(
                f"{r[k]['write_ms']:>8.1f} {r[k]['first_ms']:>8.1f} {r[k]['after_ms']:>8.2f} ms"
                for k in ("new", "edit", "delete")
            )
            print(f"{label:>10} {r['build_ms']:>8.1f} {r['warm_ms']:>7.2f}  {cells}  {r['rebuilds_after_writes']:>8}")
            if "stream" in r:
                st = r["stream"]
                print(f"{'':>10} {st['turns']} turns in a row: first query p50 {st['first_p50_ms']} ms, p95 "
                      f"{st['first_p95_ms']} ms, max {st['first_max_ms']} ms (process CPU p50 {st['cpu_p50_ms']}, "
                      f"p95 {st['cpu_p95_ms']}, max {st['cpu_max_ms']} ms); compactions {r['compactions']}")
            print(f"{'':>10} answers after the writes identical to a rebuild: {r['identical_to_rebuild']}")
        print(json.dumps({"nodes": n, **rows}))


if __name__ == "__main__":
    main()
