"""The recall right after a write, beside the warm recall of the same run (the user's turn without embeddings).

For each size: the benchmark graph (``memory_recall.bench``) in a store, one :class:`SnapshotCache`, recalls with the
settings of ``--profile`` (``app``, or ``default``: what ``load_settings`` gives without one), query vectors seeded
so no embedding is timed. Warm: recalls on the cached snapshot. After a write: one new chat message ingested
(``ingest_messages``, no embedding) and, as every chat event of the controller ends
(:meth:`RecallController.refresh`), the cached snapshot, the pipeline's per-structure values and the BM25 index
brought up to date (``refresh_ms``; ``event_ms`` = ingest + refresh, what the event's caller waits for); then the
recall (the cache's ``get`` and the pipeline); ``refresh_parts_ms`` splits the refresh into the snapshot's delta,
the derived values and the BM25 delta. ``--no-refresh`` leaves all of that to the recall, as before events
refreshed (``snapshot_ms`` is then the ``get``). With ``--event edit`` each turn's event is an edit instead: the
message written before the timed turns gets a new text (its node rewritten in place, with its edges); with
``--event remove`` a deletion: the message :data:`REMOVE_BACK` floors before the chat's last one is removed and
the later ones move down a floor (``remove_message``; the messages are written before the warm recalls); with
``--event mix`` a new message, an edit and a deletion in turn (``by_kind``: each kind's event and
``paired_ratio``, also given for a single kind).

With ``--fill-vectors``, after each of those recalls the turn's new nodes get their vectors, as the background
embedding writes them (``fill_write_ms``), and the cache applies that write (``fill_refresh_ms``: what the next
event or recall pays otherwise); ``fill_in_place`` counts the fills that kept the vector matrix's memory. With
``--edit-vectors``, after that an old node that holds a vector gets a new one (an edited message re-embedded:
the matrix is copied), the cache applies it (``edit_refresh_ms``) and a recall runs; ``anon_rss_mb`` is the
process's anonymous RSS at the end (what the old copies still held cost).

Prints one JSON object per size: p50/p95 of ``warm_ms``, ``ingest_ms``, ``refresh_ms``/``snapshot_ms``,
``event_ms``, ``recall_ms`` (the recall after the event), ``after_write_ms`` (refresh + recall), ``recall_ratio``
(recall p50 / warm p50) and ``ratio`` (after-write p50 / warm p50); the same as process CPU time (``*_cpu_ms``,
``*cpu_ratio``: less sensitive to other load; the event's leaves out the time its commit waits for the disk); how
the cache got its snapshots; the load average; and per pipeline stage, its p50 in the recall after the event minus
its warm p50 (``stage_extra_ms``, where they differ by 0.1 ms or more: the work the after-write recall still does
that the warm one does not).

``paired_warm_ms``, ``paired_turns_ms`` (each turn's pair; ``paired_turns_cpu_ms`` in CPU time) and
``paired_ratio``: right after each after-write recall, the same query runs again on the same snapshot (a warm
recall: the first one derived what it needed); ``paired_ratio`` is the median over the turns of (recall after the
event / that warm recall), and ``paired_cpu_ratio`` the same in CPU time. Each pair is taken within milliseconds,
so the machine's drift and the chat's growth over the turns cancel out of it, which they do not from
``recall_ratio``, whose warm recalls all run before the first turn.

    python scripts/bench_after_write.py --sizes 10000,100000 --turns 15 --store-dir bench-stores
"""

from __future__ import annotations

import argparse
import gc
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

#: ``--event mix``: each turn's event in turn.
MIX = ("add", "edit", "remove")
#: ``--event remove``: how many messages come after the one each turn deletes (they move down a floor).
REMOVE_BACK = 20


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"p50": round(float(np.percentile(arr, 50)), 2), "p95": round(float(np.percentile(arr, 95)), 2)}


def _stage_extra(warm: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float]:
    """Per stage (and ``build_result``): p50 after the event minus p50 warm, where they differ by 0.1 ms or more."""
    out: dict[str, float] = {}
    for name in after[0] if after else ():
        if name == "total":
            continue
        extra = float(np.median([s.get(name, 0.0) for s in after]) - np.median([s.get(name, 0.0) for s in warm]))
        if abs(extra) >= 0.1:
            out[name] = round(extra, 2)
    return out


def _graph(n: int, store_dir: Path) -> Path:
    """The size-``n`` benchmark graph, written once into ``store_dir`` by a child process (then reused)."""
    path = store_dir / f"after-write-{n}.sqlite3"
    if not path.exists():
        cmd = [sys.executable, "-m", "memory_recall.bench", "--write", str(n), "--db", str(path)]
        subprocess.run(cmd, check=True, capture_output=True, env=os.environ.copy())
    return path


def bench_size(
    n: int, turns: int, warm: int, store_dir: Path, refresh: bool = True, profile: str = "app",
    fill_vectors: bool = False, edit_vectors: bool = False, event: str = "add",
) -> dict[str, Any]:
    from memory_recall import bench
    from memory_recall.ingest.messages import ingest_messages, remove_message
    from memory_recall.model.chat import ChatMessage
    from memory_recall.pipeline.result import build_result
    from memory_recall.pipeline.retrieve import prepare_snapshot, run_pipeline
    from memory_recall.pipeline.state import Providers
    from memory_recall.providers.embedding import LOCAL_MODEL_ID
    from memory_recall.settings import load_settings
    from memory_recall.store import Store
    from memory_recall.store.snapshot import SnapshotCache

    source = _graph(n, store_dir)
    with tempfile.TemporaryDirectory(prefix="after-write-") as tmp:
        path = Path(tmp) / "store.sqlite3"
        shutil.copyfile(source, path)
        scene = bench._Scene(n)
        settings = load_settings(profile=profile)
        embedder = bench._PassThroughEmbedder(LOCAL_MODEL_ID, {})
        with Store(path) as store, bench._blas_one_thread():
            cache = SnapshotCache()
            providers = Providers(embedder=embedder, lexical_index=partial(store.bm25, bench.CHAT))
            now = bench.NOW_MS

            def run(snap: Any, k: int, stages: list[dict[str, float]]) -> None:
                text = bench.QUERIES[k % len(bench.QUERIES)]
                done = run_pipeline(snap, bench._query(scene, k, text), settings, providers)
                t = time.perf_counter()
                build_result(done.state, done.settings, timings=done.timings)
                stages.append({**done.timings, "build_result": (time.perf_counter() - t) * 1000})

            warm_stages: list[dict[str, float]] = []
            after_stages: list[dict[str, float]] = []

            def recall(k: int) -> tuple[float, float]:
                snap = cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now)
                start, cpu = time.perf_counter(), time.process_time()
                run(snap, k, warm_stages)
                return (time.perf_counter() - start) * 1000, (time.process_time() - cpu) * 1000

            # One message first, untimed: the benchmark graph's message chain is not the one ingestion keeps (it skips
            # archived turns, the graph's links do not), so the first event relinks ~1.5 % of the messages once, which
            # a chat ingested turn by turn never does; the warm-up recalls then see the relinked nodes.
            settle = ChatMessage(floor=8_999_999, role="user", speaker=bench.USER, text="I step off the boat.")
            ingest_messages(store, bench.CHAT, [settle], now_ms=now)
            if event in ("remove", "mix"):  # the messages the turns remove, and REMOVE_BACK after them, untimed
                ingest_messages(store, bench.CHAT, [
                    ChatMessage(floor=9_000_000 + i, role="user", speaker=bench.USER,
                                text=f"I walk along the harbor toward the tower, step {i}.")
                    for i in range(turns + REMOVE_BACK)
                ], now_ms=now)
            for k in range(len(bench.QUERIES)):  # warm-up: snapshot, BM25 index, lazy caches
                recall(k)
            warm_stages.clear()
            warm_runs = [recall(k) for k in range(warm)]
            warm_ms, warm_cpu = [w for w, _ in warm_runs], [c for _, c in warm_runs]
            ingest, update, after, total, total_cpu, recall_cpu = [], [], [], [], [], []
            ingest_cpu: list[float] = []
            update_cpu: list[float] = []
            fill_write: list[float] = []
            fill_refresh: list[float] = []
            shared: list[bool] = []
            edit_refresh: list[float] = []
            parts: dict[str, list[float]] = {"snapshot": [], "derived": [], "bm25": []}
            paired: list[tuple[float, float]] = []  # (recall after the event, the same recall warm), per turn
            paired_cpu: list[tuple[float, float]] = []
            rng = np.random.default_rng(0)
            n_before = cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now).n
            n_start = n_before
            how: Counter[str] = Counter()
            kinds: list[str] = []
            for j in range(turns):
                # "edit": the user rewrites the message of the turn before the timed ones (an edited message keeps
                # its floor, so its node is rewritten in place with its edges); "remove": the message REMOVE_BACK
                # floors before the last one is deleted and the later ones move down a floor; else a new message.
                # "mix": a new message, an edit, a deletion, in turn (new messages after the written block).
                kind = MIX[j % len(MIX)] if event == "mix" else event
                kinds.append(kind)
                floor = 8_999_999 if kind == "edit" else 9_000_000 + j
                if event == "mix" and kind == "add":
                    floor = 9_000_000 + turns + REMOVE_BACK + j
                message = ChatMessage(floor=floor, role="user", speaker=bench.USER,
                                      text=f"I light the lantern by the harbor and ask Mira about the tower, turn {j}.")
                t0, c0 = time.perf_counter(), time.process_time()
                if kind == "remove":
                    remove_message(store, bench.CHAT, 9_000_000 + turns - 1 - j, now_ms=now)
                else:
                    ingest_messages(store, bench.CHAT, [message], now_ms=now)
                t1, c1 = time.perf_counter(), time.process_time()
                if refresh:  # what RecallController.refresh does at the end of every chat event
                    fresh_snaps = cache.refresh(store, bench.CHAT, now_ms=now)
                    p1 = time.perf_counter()
                    for fresh in fresh_snaps:
                        prepare_snapshot(fresh)
                    p2 = time.perf_counter()
                    store.refresh_bm25(bench.CHAT)
                    p3 = time.perf_counter()
                    parts["snapshot"].append((p1 - t1) * 1000)
                    parts["derived"].append((p2 - p1) * 1000)
                    parts["bm25"].append((p3 - p2) * 1000)
                t2, c2 = time.perf_counter(), time.process_time()
                snap = cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now)
                how[getattr(cache, "last_update", {}).get(bench.CHAT, "rebuild")] += 1
                run(snap, j, after_stages)
                t3, c3 = time.perf_counter(), time.process_time()
                run(snap, j, [])  # the same recall again, warm: the pair's other half
                paired.append(((t3 - t2) * 1000, (time.perf_counter() - t3) * 1000))
                paired_cpu.append(((c3 - c2) * 1000, (time.process_time() - c3) * 1000))
                if fill_vectors:  # the background embedding of the turn's new nodes, then what applies it
                    new_rows = np.flatnonzero(~snap.has_vector[n_before:]) + n_before
                    vectors = rng.standard_normal((new_rows.size, snap.dim)).astype(np.float32)
                    t4 = time.perf_counter()
                    with store.write(bench.CHAT) as w:
                        w.put_embeddings(LOCAL_MODEL_ID, {snap.ids[int(i)]: v for i, v in zip(new_rows, vectors,
                                                                                             strict=True)})
                    t5 = time.perf_counter()
                    for fresh in cache.refresh(store, bench.CHAT, now_ms=now):
                        prepare_snapshot(fresh)
                    store.refresh_bm25(bench.CHAT)
                    t6 = time.perf_counter()
                    filled = cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now)
                    assert bool(filled.has_vector[new_rows].all())
                    fill_write.append((t5 - t4) * 1000)
                    fill_refresh.append((t6 - t5) * 1000)
                    shared.append(bool(np.shares_memory(filled.embeddings, snap.embeddings)))
                    n_before = filled.n
                else:
                    n_before = snap.n
                if edit_vectors:  # an edited message re-embedded: a new vector for a node that held one
                    old_rows = np.flatnonzero(snap.has_vector[: n // 2])
                    target = snap.ids[int(old_rows[int(rng.integers(old_rows.size))])]
                    t7 = time.perf_counter()
                    with store.write(bench.CHAT) as w:
                        w.put_embeddings(LOCAL_MODEL_ID, {target: rng.standard_normal(snap.dim).astype(np.float32)})
                    for fresh in cache.refresh(store, bench.CHAT, now_ms=now):
                        prepare_snapshot(fresh)
                    edit_refresh.append((time.perf_counter() - t7) * 1000)
                    run(cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now), j, [])
                ingest_cpu.append((c1 - c0) * 1000)
                update_cpu.append((c2 - c1) * 1000)
                total_cpu.append((c3 - c1) * 1000)
                recall_cpu.append((c3 - c2) * 1000)
                ingest.append((t1 - t0) * 1000)
                update.append((t2 - t1) * 1000)
                after.append((t3 - t2) * 1000)
                total.append((t3 - t1) * 1000)
            nodes_added = cache.get(store, bench.CHAT, LOCAL_MODEL_ID, now_ms=now).n - n_start
    out = {
        "nodes": n, "event": event, "profile": profile, "refresh": refresh, "warm_ms": _pct(warm_ms),
        "ingest_ms": _pct(ingest),
        "refresh_ms" if refresh else "snapshot_ms": _pct(update),
        "event_ms": _pct([a + b for a, b in zip(ingest, update, strict=True)]) if refresh else None,
        # Per kind of event (with --event mix: each kind's turns; else the one kind): the event, and the median of
        # (recall after it / the same recall warm).
        "by_kind": None if not refresh else {
            k: {
                "turns": kinds.count(k),
                "event_ms": _pct([a + b for a, b, x in zip(ingest, update, kinds, strict=True) if x == k]),
                "paired_ratio": round(float(np.median([a / w for (a, w), x in zip(paired, kinds, strict=True)
                                                       if x == k])), 2),
            }
            for k in dict.fromkeys(kinds)
        },
        "recall_ms": _pct(after), "after_write_ms": _pct(total),
        "recall_ratio": round(float(np.median(after)) / float(np.median(warm_ms)), 2),
        "ratio": round(float(np.median(total)) / float(np.median(warm_ms)), 2),
        # Process CPU time: less sensitive to the other load on shared cores than the wall times.
        "warm_cpu_ms": _pct(warm_cpu), "after_write_cpu_ms": _pct(total_cpu), "recall_cpu_ms": _pct(recall_cpu),
        "ingest_cpu_ms": _pct(ingest_cpu), "refresh_cpu_ms" if refresh else "snapshot_cpu_ms": _pct(update_cpu),
        "event_cpu_ms": _pct([a + b for a, b in zip(ingest_cpu, update_cpu, strict=True)]) if refresh else None,
        # The refresh's three parts: the snapshot's delta, the stages' derived values, the BM25 index's delta.
        "refresh_parts_ms": {k: _pct(v) for k, v in parts.items()} if refresh else None,
        "paired_warm_ms": _pct([w for _, w in paired]),
        "paired_turns_ms": [[round(a, 3), round(w, 3)] for a, w in paired],
        "paired_turns_cpu_ms": [[round(a, 3), round(w, 3)] for a, w in paired_cpu],
        "paired_ratio": round(float(np.median([a / w for a, w in paired])), 2),
        "paired_cpu_ratio": round(float(np.median([a / w for a, w in paired_cpu])), 2),
        "cpu_ratio": round(float(np.median(total_cpu)) / float(np.median(warm_cpu)), 2),
        "recall_cpu_ratio": round(float(np.median(recall_cpu)) / float(np.median(warm_cpu)), 2),
        "snapshot_how": dict(how),
        "nodes_added": nodes_added,
        "loadavg": [round(v, 2) for v in os.getloadavg()],
        "stage_extra_ms": _stage_extra(warm_stages, after_stages),
    }
    if fill_vectors:
        out.update(fill_write_ms=_pct(fill_write), fill_refresh_ms=_pct(fill_refresh),
                   fill_in_place=f"{sum(shared)}/{len(shared)}")
    if edit_vectors:
        gc.collect()
        out.update(edit_refresh_ms=_pct(edit_refresh), anon_rss_mb=_anon_rss_mb())
    return out


def _anon_rss_mb() -> float:
    """This process's anonymous resident memory (Linux), MiB; 0 elsewhere."""
    from memory_recall.heap import anonymous_rss

    return round((anonymous_rss() or 0) / 2**20, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000", help="comma-separated graph sizes")
    parser.add_argument("--turns", type=int, default=15, help="messages ingested (one recall after each)")
    parser.add_argument("--warm", type=int, default=30, help="warm recalls")
    parser.add_argument("--store-dir", default="", help="keep the written graphs here (reused by later runs)")
    parser.add_argument("--no-refresh", action="store_true",
                        help="leave the snapshot update to the recall (the code before events refreshed it)")
    parser.add_argument("--profile", choices=("app", "default"), default="app",
                        help="the settings profile of the recalls (default: app)")
    parser.add_argument("--fill-vectors", action="store_true",
                        help="after each turn's recall, write the new nodes' vectors as the background embedding "
                             "does and time the write (fill_write_ms) and the refresh that applies it "
                             "(fill_refresh_ms, before the next turn)")
    parser.add_argument("--edit-vectors", action="store_true",
                        help="after each turn, also write a new vector for an old node that holds one (an edited "
                             "message re-embedded: the matrix is copied), apply it (edit_refresh_ms) and recall; "
                             "prints the anonymous RSS at the end (anon_rss_mb: one size per run for a clean "
                             "figure)")
    parser.add_argument("--event", choices=("add", "edit", "remove", "mix"), default="add",
                        help="each turn's chat event: a new message (add, the default), an edit of the message "
                             "written before the timed turns (edit: its node rewritten in place) or the deletion of "
                             f"the message {REMOVE_BACK} floors before the last one (remove: the later ones move "
                             "down); mix: a new message, an edit and a deletion in turn (by_kind splits them)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="after-write-graphs-") as tmp:
        store_dir = Path(args.store_dir or tmp)
        store_dir.mkdir(parents=True, exist_ok=True)
        for n in (int(s) for s in args.sizes.split(",") if s):
            print(json.dumps(bench_size(
                n, args.turns, args.warm, store_dir, not args.no_refresh, args.profile, args.fill_vectors,
                args.edit_vectors, args.event)),
                flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
