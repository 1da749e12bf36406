"""Recall benchmark (issue 8): synthetic roleplay graphs at several sizes, per-stage and total latency.

Usage::

    python scripts/bench_recall.py --sizes 1000,10000,100000 --out bench.json
    memory-recall bench --sizes 1000,10000

Each size runs in a fresh subprocess (so peak RSS is per size) and:

1. generates a seeded synthetic graph: a realistic type mix (message, event, character, location, thread, rule,
   reflection, pov_memory, entity), average degree about 7 with some inhibit edges, 384-d random unit vectors,
   four character knowledge owners (known ids, visibility scores, POV memories), regions with adjacency and
   story-time segments;
2. writes it into a SQLite store in a temporary directory through ``store.write`` upserts (ingest throughput,
   embedding excluded) in a child process, so the generator's arrays are not counted; the measuring process then
   opens the store and times ``build_snapshot(store.snapshot_source(...))``, so its peak RSS is what a user's
   process holds (store read, snapshot, recalls);
3. runs a fixed set of 20 queries with default "app" settings, no LLM, the four owners active and the store's
   BM25 channel: once with the real :class:`~memory_recall.providers.embedding.LocalEmbedder` (query embedding
   included; its vectors are recorded) and then ``--repeat`` times through a pass-through embedder returning the
   recorded vectors (query embedding excluded). Without the local engine both use seeded random query vectors.
   These recalls share one snapshot, so the per-snapshot structures the stages derive lazily (scoring arrays,
   packed lexical fields, anchor index, adjacency, ...) and the chat's BM25 index are warm;
4. times ``--first`` recalls (default 5) each on a freshly built snapshot with the store's BM25 index dropped:
   the first recall after a graph change, which builds all of those (snapshot build itself excluded, it is
   ``snapshot_build_ms``);
5. times ``--service`` recalls (default 20, after two warm-up ones) through the recall controller on a copy of
   the store, as the service runs them: a new user turn each time, records persisted and access reinforcement
   written after every recall (which gives the chat a new version);
6. times ``--turns`` user turns (default 10, after two warm-up ones) on another copy: one ``message_added`` event
   ingested as the service does, the snapshot brought up to date and the next recall while a thread embeds the
   event's nodes as the service's background worker does (``turn_ms`` and each part), beside a warm recall of
   the same run (``warm_ms``), with the real local embedder for the new nodes and the queries when it is
   installed.

BLAS is limited to one thread inside the benchmark (threadpoolctl) so the two shared cores are not
oversubscribed. The JSON written to ``--out`` is a list with one object per size (see :func:`bench_size`).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["QUERIES", "bench_size", "main", "write_graph"]

DIM = 384
CHAT = "bench"
NOW_MS = 1_760_000_000_000
OWNERS = ("Alice", "Bram", "Corin", "Dahlia")
USER = "Traveller"
#: Type mix of a long roleplay chat ingested without and then with LLM extraction.
TYPE_MIX: tuple[tuple[str, float], ...] = (
    ("message", 0.40), ("event", 0.16), ("pov_memory", 0.12), ("entity", 0.08), ("reflection", 0.08),
    ("character", 0.04), ("location", 0.05), ("thread", 0.04), ("rule", 0.03),
)
_WORDS = (
    "storm harbour ring map tower market gate lantern oath debt letter sword ship forest river bridge temple "
    "archive garden secret promise betrayal festival winter spring poison cure crown thief guard merchant "
    "priest scholar dragon wolf raven key door cellar roof bell chapel mill well road inn tavern fire ash "
    "silver gold iron glass salt bread wine tea candle book song dance mask"
).split()
_PLACES = (
    "Harbour", "Old Market", "North Gate", "Bell Tower", "Temple", "Archive", "Mill", "River Crossing", "Inn",
    "Forest Road", "Castle", "Docks", "Chapel", "Garden", "Cellars", "Bridge", "Watchtower", "Library",
)
QUERIES: tuple[str, ...] = (
    "Where did Alice hide the silver key?",
    "What did Bram promise at the North Gate?",
    "Does Corin know about the poison in the wine?",
    "Tell me what happened during the storm at the Harbour.",
    "Why is Dahlia angry with the merchant?",
    "Who stole the map from the Archive?",
    "Remember the festival at the Old Market?",
    "What does the guard at the Bell Tower want?",
    "Alice and Bram argued about the debt again.",
    "Is the bridge over the River Crossing still broken?",
    "What rule applies inside the Temple?",
    "Corin found a letter in the cellar.",
    "Let's go back to the Inn and ask about the raven.",
    "Dahlia said the dragon sleeps under the Castle.",
    "What did we learn from the priest about the crown?",
    "I light a candle and read the old book.",
    "How long ago was the fire at the Mill?",
    "Bram, what is your real goal?",
    "The wolf followed us along the Forest Road.",
    "Who was at the chapel when the bell rang?",
)


# ---------------------------------------------------------------------------------------------------------------
# Synthetic graph
# ---------------------------------------------------------------------------------------------------------------


class _Scene:
    """What the queries of a size need of its graph (region names, story segments), without generating it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.regions = list(_PLACES) + [f"Region {i}" for i in range(max(0, int(np.sqrt(n) // 2) - len(_PLACES)))]
        self.segments = max(4, min(300, n // 100))


class _Plan(_Scene):
    """Seeded per-node attributes of one synthetic graph, as arrays (nodes are materialised in chunks)."""

    def __init__(self, n: int, seed: int = 8) -> None:
        super().__init__(n)
        rng = np.random.default_rng(seed)
        types = [t for t, _ in TYPE_MIX]
        probs = np.array([p for _, p in TYPE_MIX])
        self.types = rng.choice(len(types), size=n, p=probs / probs.sum())
        self.type_names = types
        # The four owners' character nodes first, so every size has them.
        self.types[: len(OWNERS)] = types.index("character")
        self.region = rng.integers(0, len(self.regions), size=n)
        # Story time advances with the chat.
        self.segment = np.minimum((np.arange(n) * self.segments) // max(n, 1), self.segments - 1)
        self.owner = rng.integers(0, len(OWNERS), size=n)
        self.importance = np.round(rng.uniform(1.0, 9.5, size=n), 2)
        self.words = rng.integers(0, len(_WORDS), size=(n, 6))
        self.archived = rng.random(n) < 0.02
        self.archived[: len(OWNERS)] = False
        vec = rng.standard_normal((n, DIM), dtype=np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        self.vectors = vec
        # Edges: average degree ~7 (3.5 edges per node), biased to nearby nodes (chat locality), 4% inhibit.
        e = int(3.5 * n)
        src = rng.integers(0, n, size=e)
        near = rng.random(e) < 0.7
        offset = rng.integers(1, 60, size=e)
        dst = np.where(near, (src + offset) % n, rng.integers(0, n, size=e))
        keep = src != dst
        self.edge_src, self.edge_dst = src[keep], dst[keep]
        m = int(keep.sum())
        self.edge_strength = np.round(rng.uniform(0.2, 1.0, size=m), 3)
        self.edge_inhibit = rng.random(m) < 0.04
        self.edge_relation = rng.integers(0, 5, size=m)
        # Knowledge: each owner knows up to 512 ids (the store cap) and has visibility scores on ~15%.
        self.known = [np.sort(rng.choice(n, size=min(512, n // 3), replace=False)) for _ in OWNERS]
        self.vis = [rng.choice(n, size=max(1, n * 15 // 100), replace=False) for _ in OWNERS]
        self.vis_score = [np.round(rng.uniform(0.05, 1.0, size=v.size), 3) for v in self.vis]

    def node_id(self, i: int) -> str:
        return f"{self.type_names[int(self.types[i])][:3]}-{i:07d}"

    def node(self, i: int) -> dict[str, Any]:
        from memory_recall.model.graph import StoryTime  # noqa: F401  (keeps the import cost out of timing)

        t = self.type_names[int(self.types[i])]
        w = [_WORDS[k] for k in self.words[i]]
        place = self.regions[int(self.region[i])]
        who = OWNERS[int(self.owner[i])]
        other = OWNERS[(int(self.owner[i]) + 1) % len(OWNERS)]
        text = f"{who} and {other} talked about the {w[0]} and the {w[1]} near the {place}; {w[2]} {w[3]} {w[4]}."
        fields: dict[str, Any]
        scope: dict[str, Any] = {"region_primary": place}
        if t == "message":
            fields = {"speaker": who if i % 2 else USER, "summary": text, "participants": [who, USER],
                      "date": f"day {int(self.segment[i]) + 1}"}
        elif t == "event":
            fields = {"title": f"The {w[0]} at the {place}", "summary": text, "participants": [who, other],
                      "status": "resolved" if i % 3 else "open"}
        elif t == "pov_memory":
            fields = {"summary": f"{who} remembers the {w[0]} at the {place}", "belief": f"{other} hid the {w[1]}",
                      "emotion": w[5], "attitude": "wary", "certainty": "medium", "about": other}
            scope = {"layer": "pov", "owner_type": "character", "owner_name": who, "owner_id": who,
                     "region_primary": place}
        elif t == "entity":
            fields = {"name": f"{w[0].title()} {w[1].title()} {i}", "kind": "object", "aliases": [],
                      "summary": text}
        elif t == "reflection":
            fields = {"insight": f"{who} trusts {other} less after the {w[0]}", "trigger": w[1],
                      "suggestion": f"remind {who} of the {w[2]}"}
        elif t == "character":
            name = OWNERS[i] if i < len(OWNERS) else f"{w[0].title()}keeper {i}"
            fields = {"name": name, "traits": f"{w[1]}, {w[2]}", "state": f"carrying the {w[3]}",
                      "goal": f"find the {w[4]}", "inventory": w[5], "core_note": ""}
        elif t == "location":
            fields = {"name": f"{place} {w[0]} {i}", "state": w[1], "features": f"{w[2]} and {w[3]}",
                      "danger": "low"}
        elif t == "thread":
            fields = {"title": f"Quest of the {w[0]} {i}", "summary": text, "status": "active"}
        else:  # rule
            fields = {"title": f"Law of the {w[0]} {i}", "constraint": f"no {w[1]} inside the {place}",
                      "scope": place, "status": "active"}
        prev_id = self._chain(i, -1) if t == "message" else None
        next_id = self._chain(i, +1) if t == "message" else None
        seg = int(self.segment[i])
        return {
            "id": self.node_id(i), "type": t, "fields": fields, "seq": i // 2, "archived": bool(self.archived[i]),
            "importance": float(self.importance[i]), "created_time": NOW_MS - (self.n - i) * 60_000,
            "prev_id": prev_id, "next_id": next_id, "scope": scope,
            "story_time": {"segment_id": f"seg-{seg:03d}", "label": f"Day {seg + 1}", "tense": "past"},
        }

    def _chain(self, i: int, step: int) -> str | None:
        # Nearest message before/after i (messages form the prev/next chain of the chat).
        j = i + step
        msg = self.type_names.index("message")
        while 0 <= j < self.n and j - i < 50 and i - j < 50:
            if self.types[j] == msg:
                return self.node_id(j)
            j += step
        return None

    def edges(self, lo: int, hi: int) -> list[dict[str, Any]]:
        rel = ("related", "mentions", "causes", "located_at", "contradicts")
        return [
            {"id": f"e{k:08d}", "from_id": self.node_id(int(self.edge_src[k])),
             "to_id": self.node_id(int(self.edge_dst[k])), "relation": rel[int(self.edge_relation[k])],
             "strength": float(self.edge_strength[k]), "edge_type": 255 if self.edge_inhibit[k] else 0}
            for k in range(lo, min(hi, self.edge_src.size))
        ]

    def write_state(self, store: Any, chat_id: str) -> None:
        """Write :meth:`state` (knowledge, regions, timeline, history) into ``chat_id`` of ``store``."""
        state = self.state()
        with store.write(chat_id) as w:
            w.set_knowledge(state["knowledge"])
            w.set_regions(state["regions"])
            w.set_timeline(state["timeline"])
            w.set_history(state["history"])

    def state(self) -> dict[str, Any]:
        from memory_recall.model.state import (
            HistoryState,
            KnowledgeOwner,
            KnowledgeState,
            RegionAdjacency,
            RegionState,
            StorySegment,
            TimelineState,
        )

        owners = {}
        for o, name in enumerate(OWNERS):
            key = f"character:{name.lower()}"
            owners[key] = KnowledgeOwner(
                owner_type="character", owner_key=key, owner_name=name, node_id=self.node_id(o),
                known_node_ids=tuple(self.node_id(int(i)) for i in self.known[o]),
                visibility_scores={self.node_id(int(i)): float(s) for i, s in zip(self.vis[o], self.vis_score[o],
                                                                                   strict=True)},
                updated_at=NOW_MS,
            )
        r = len(self.regions)
        regions = RegionState(
            adjacency_map={
                name: RegionAdjacency(adjacent=(self.regions[(k + 1) % r], self.regions[(k + 3) % r]))
                for k, name in enumerate(self.regions)
            },
            recent_regions=tuple(self.regions[:3]),
        )
        timeline = TimelineState(
            segments=tuple(StorySegment(id=f"seg-{s:03d}", label=f"Day {s + 1}", order=s + 1)
                           for s in range(self.segments)),
            next_order=self.segments + 1,
        )
        history = HistoryState(active_region=self.regions[0], active_story_segment_id=f"seg-{self.segments - 1:03d}")
        return {"knowledge": KnowledgeState(owners=owners), "regions": regions, "timeline": timeline,
                "history": history}


# ---------------------------------------------------------------------------------------------------------------
# Embedders
# ---------------------------------------------------------------------------------------------------------------


class _RecordingEmbedder:
    """Wraps the real embedder and records every query vector (query embedding included)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.vectors: dict[str, np.ndarray] = {}

    def embed_query(self, text: str) -> np.ndarray:
        vec = self.inner.embed_query(text)
        self.vectors[text] = vec
        return vec

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_passages(texts)


class _PassThroughEmbedder:
    """Returns precomputed query vectors (query embedding excluded); seeded random unit vectors otherwise."""

    def __init__(self, model_id: str, vectors: dict[str, np.ndarray]) -> None:
        self.model_id = model_id
        self.dim = DIM
        self.vectors = vectors

    def embed_query(self, text: str) -> np.ndarray:
        vec = self.vectors.get(text)
        if vec is None:
            seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
            vec = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            vec /= np.linalg.norm(vec)
            self.vectors[text] = vec
        return vec

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.embed_query(t) for t in texts]) if texts else np.zeros((0, DIM), np.float32)


# ---------------------------------------------------------------------------------------------------------------
# One size
# ---------------------------------------------------------------------------------------------------------------


def _pct(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {"p50": 0.0, "p95": 0.0}
    return {"p50": round(float(np.percentile(arr, 50)), 3), "p95": round(float(np.percentile(arr, 95)), 3)}


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, size):
        yield lo, min(n, lo + size)


def _blas_one_thread() -> Any:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _query(plan: _Scene, k: int, text: str) -> Any:
    from memory_recall.pipeline.state import RecallQuery

    prev = QUERIES[(k - 1) % len(QUERIES)]
    return RecallQuery(
        user_message=text,
        recent_lines=(f"[user]: {prev}", "[assistant]: The lantern flickers as you wait for an answer.",
                      f"[user]: {text}"),
        now_ms=NOW_MS, seed=k, chat_id=CHAT, user_floor=plan.n // 2 + k,
        # The scene (region) changes every fifth query: a roleplay scene lasts a few turns.
        active_region=plan.regions[(k // 5) % len(plan.regions)],
        active_owner_keys=tuple(f"character:{o.lower()}" for o in OWNERS),
        active_story_segment_id=f"seg-{plan.segments - 1:03d}",
        host_user_name=USER,
    )


def write_graph(n: int, path: Path, *, chunk: int = 5000) -> dict[str, Any]:
    """Generate the size-``n`` graph and write it into the store at ``path``; returns ``edges`` and
    ``ingest_nodes_per_s`` (node upserts only, node validation excluded)."""
    from memory_recall.model.graph import Edge, Node
    from memory_recall.providers.embedding import LOCAL_MODEL_ID
    from memory_recall.store import Store

    plan = _Plan(n)
    with Store(path) as store:
        ingest_s = 0.0
        for lo, hi in _chunks(n, chunk):
            nodes = [Node.model_validate(plan.node(i)) for i in range(lo, hi)]
            start = time.perf_counter()
            with store.write(CHAT) as w:
                w.upsert_nodes(nodes)
            ingest_s += time.perf_counter() - start
        for lo, hi in _chunks(plan.edge_src.size, 4 * chunk):
            edges = [Edge.model_validate(e) for e in plan.edges(lo, hi)]
            with store.write(CHAT) as w:
                w.upsert_edges(edges)
        for lo, hi in _chunks(n, 4 * chunk):
            with store.write(CHAT) as w:
                w.put_embeddings(LOCAL_MODEL_ID, [(plan.node_id(i), plan.vectors[i], "") for i in range(lo, hi)])
        plan.write_state(store, CHAT)
    return {"edges": int(plan.edge_src.size), "ingest_nodes_per_s": round(n / ingest_s, 1)}


def bench_size(
    n: int, *, repeat: int = 5, chunk: int = 5000, profile: str = "", store_dir: str = "", first: int = 5,
    service: int = 20, turns: int = 10,
) -> dict[str, Any]:
    """Benchmark one graph size in this process; returns its JSON object.

    The graph is generated and written by a child process (:func:`write_graph`); this process only opens the
    store, builds the snapshot and recalls, so ``peak_rss_mb`` is what a user's process holds. With
    ``store_dir`` the store is kept there as ``bench-<n>.sqlite3`` and reused by later runs (the graph is seeded,
    so it is the same graph; a store of an older schema is migrated when opened); a reused store has no ingest
    figure (``ingest_nodes_per_s`` is the one recorded when it was written).

    Keys: ``nodes``, ``edges``, ``total_ms`` / ``total_ms_with_embedding`` / ``pipeline_ms`` / ``total_cpu_ms``
    (process CPU time of one recall: less sensitive to other load on shared cores) (p50, p95),
    ``stages`` (name → p50, p95 of the stage traces; ``result`` is the result builder), ``snapshot_build_ms``,
    ``snapshot_read_ms`` (the store read part), ``snapshot_build_cpu_ms`` (process CPU time of the build),
    ``ingest_nodes_per_s``, ``peak_rss_mb`` (after the recalls on one snapshot, before the first recalls below),
    ``peak_rss_after_first_mb`` (after them: a snapshot rebuilt five times; before the controller recalls, which
    open a second store), ``first_recall_ms`` (p50, p95 of the first recall on a fresh
    snapshot without a BM25 index, query embedding excluded) with ``first_recall_stages``, ``service_recall_ms``
    (p50, p95 of a controller recall with persistence and reinforcement, query embedding excluded),
    ``embedding_matrix_mb``, ``rss_target_mb`` and ``query_embedding`` (``local`` or ``random``); with
    ``turns`` > 0 the user's turn (:func:`_bench_turn`): ``turn_ms``, ``warm_ms``, ``turn_parts_ms``
    (``ingest``, ``embed``, ``snapshot``, ``recall``), ``embed_single_ms``, ``turn_target_ms``, ``turn_embedder``.
    """
    from memory_recall.settings import RecallSettings
    from memory_recall.store import Store

    plan = _Scene(n)
    settings = RecallSettings(profile="app")
    out: dict[str, Any] = {"nodes": n}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(store_dir or tmp) / (f"bench-{n}.sqlite3" if store_dir else "bench.sqlite3")
        record = path.with_suffix(".json")
        if store_dir and path.exists() and record.exists():
            written = json.loads(record.read_text(encoding="utf-8"))
            out["store_reused"] = True
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "memory_recall.bench", "--write", str(n), "--db", str(path),
                   "--chunk", str(chunk)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"writing the {n}-node graph failed:\n{proc.stderr}")
            written = json.loads(proc.stdout)
            if store_dir:
                record.write_text(json.dumps(written), encoding="utf-8")
        out["edges"] = written["edges"]
        out["ingest_nodes_per_s"] = written["ingest_nodes_per_s"]
        with Store(path) as store, _blas_one_thread():
            _bench_store(store, out, plan, settings, repeat=repeat, profile=profile, first=first)
        out["peak_rss_after_first_mb"] = round(_peak_rss_mb(), 1)
        if service > 0:
            gc.collect()
            with _blas_one_thread():
                _bench_service(path, out, plan, settings, service)
        if turns > 0:
            gc.collect()
            with _blas_one_thread():
                _bench_turn(path, out, plan, settings, turns)
    return out


def _bench_store(
    store: Any, out: dict[str, Any], plan: _Scene, settings: Any, *, repeat: int, profile: str, first: int = 5
) -> None:
    """Snapshot build and recall timings on the written store (fills ``out``)."""
    from memory_recall.heap import release_freed_heap
    from memory_recall.pipeline.result import build_result
    from memory_recall.pipeline.retrieve import run_pipeline
    from memory_recall.pipeline.state import Providers
    from memory_recall.providers.embedding import LOCAL_MODEL_ID, LocalEmbedder, local_engine_available
    from memory_recall.store.bm25_index import cache_for
    from memory_recall.store.snapshot import build_snapshot

    n = plan.n
    builds, reads, build_cpu = [], [], []
    snap = None
    for _ in range(3):
        snap = None
        cpu0 = time.process_time()
        start = time.perf_counter()
        source = store.snapshot_source(CHAT, LOCAL_MODEL_ID)
        mid = time.perf_counter()
        snap = build_snapshot(source, now_ms=NOW_MS)
        del source
        release_freed_heap()  # as SnapshotCache does after a large build (load_snapshot)
        end = time.perf_counter()
        build_cpu.append((time.process_time() - cpu0) * 1000)
        builds.append((end - start) * 1000)
        reads.append((mid - start) * 1000)
    assert snap is not None
    out["snapshot_build_ms"] = round(float(np.median(builds)), 1)
    out["snapshot_read_ms"] = round(float(np.median(reads)), 1)
    out["snapshot_build_cpu_ms"] = round(float(np.median(build_cpu)), 1)  # less sensitive to other load
    lexical = partial(store.bm25, CHAT)

    def once(k: int, text: str, embedder: Any, on: Any = None) -> tuple[float, dict[str, float]]:
        target = on if on is not None else snap
        assert target is not None
        cpu = time.process_time()
        start = time.perf_counter()
        run = run_pipeline(target, _query(plan, k, text), settings, Providers(embedder=embedder,
                                                                             lexical_index=lexical))
        t0 = time.perf_counter()
        build_result(run.state, run.settings, timings=run.timings)
        end = time.perf_counter()
        timings = dict(run.timings)
        timings["result"] = (end - t0) * 1000
        timings["cpu"] = (time.process_time() - cpu) * 1000
        return (end - start) * 1000, timings

    recorded: dict[str, np.ndarray] = {}
    with_emb: list[float] = []
    if local_engine_available():
        rec = _RecordingEmbedder(LocalEmbedder())
        rec.embed_query("warm up")
        for _ in range(2 if repeat > 1 else 1):
            for k, text in enumerate(QUERIES):
                with_emb.append(once(k, text, rec)[0])
        recorded = rec.vectors
        out["query_embedding"] = "local"
    else:
        out["query_embedding"] = "random"
    passthrough = _PassThroughEmbedder(LOCAL_MODEL_ID, recorded)
    for k, text in enumerate(QUERIES):  # warm-up: lazy caches, first-call imports
        once(k, text, passthrough)
    totals: list[float] = []
    stages: dict[str, list[float]] = {}
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    for _ in range(repeat):
        for k, text in enumerate(QUERIES):
            total, timings = once(k, text, passthrough)
            totals.append(total)
            for name, ms in timings.items():
                stages.setdefault(name, []).append(ms)
    if profiler is not None:
        profiler.stop()
        Path(profile).write_text(profiler.output_text(unicode=True, color=False, show_all=False))
    pipeline = stages.pop("total", [])
    cpu = stages.pop("cpu", [])
    out["total_ms"] = _pct(totals)
    out["total_ms_with_embedding"] = _pct(with_emb) if with_emb else None
    out["pipeline_ms"] = _pct(pipeline)
    out["total_cpu_ms"] = _pct(cpu)
    out["stages"] = {name: _pct(v) for name, v in stages.items()}

    # The first recall after a graph change: a fresh snapshot (its build not timed) and no BM25 index, so the
    # recall pays every lazily derived structure (a new message or graph write starts the same way).
    firsts: list[float] = []
    first_stages: dict[str, list[float]] = {}
    out["peak_rss_mb"] = round(_peak_rss_mb(), 1)  # the figure: store, one snapshot, its recalls
    snap = None  # one snapshot alive at a time, as in the service (its derived caches die with it)
    gc.collect()
    for j in range(first):
        fresh = build_snapshot(store.snapshot_source(CHAT, LOCAL_MODEL_ID), now_ms=NOW_MS)
        release_freed_heap()  # as load_snapshot does after a large build
        cache_for(store).clear()
        gc.collect()
        k = (j * 7) % len(QUERIES)
        total, timings = once(k, QUERIES[k], passthrough, fresh)
        firsts.append(total)
        for name, ms in timings.items():
            first_stages.setdefault(name, []).append(ms)
        del fresh
    if firsts:
        out["first_recall_ms"] = {**_pct(firsts), "max": round(max(firsts), 3)}
        out["first_recall_stages"] = {name: _pct(v) for name, v in first_stages.items() if name not in ("cpu",)}
    matrix_mb = n * DIM * 4 / 2**20
    out["embedding_matrix_mb"] = round(matrix_mb, 1)
    out["rss_target_mb"] = round(2.5 * matrix_mb + 200, 1)


def _copy_store(path: Path, copy: Path) -> Path:
    """``copy``, made a consistent copy of the store file at ``path`` (SQLite's online backup)."""
    import sqlite3

    src, dst = sqlite3.connect(path), sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return copy


def _timed_recall(controller: Any, q: Any, k: int, floor: int, messages: list[Any], now_ms: int, what: str) -> float:
    """Wall ms of one controller recall of bench query ``k`` (scene and owners of ``q``) for user ``floor``;
    raises when it does not complete."""
    from memory_recall.controller import RecallRequest

    request = RecallRequest(
        chat_id=CHAT, messages=messages, query_text=QUERIES[k], target_user_floor=floor,
        active_region=q.active_region, active_owner_keys=list(q.active_owner_keys or ()), now_ms=now_ms,
    )
    start = time.perf_counter()
    response = controller.run_recall(request)
    elapsed = (time.perf_counter() - start) * 1000
    if response.status != "completed":
        raise RuntimeError(f"{what} ended {response.status}: {response.reason_text}")
    return elapsed


def _bench_service(path: Path, out: dict[str, Any], plan: _Scene, settings: Any, count: int) -> None:
    """``service_recall_ms``: recalls through :class:`~memory_recall.controller.RecallController` on a copy of
    the store (records and reinforcement are written), one new user turn each, two warm-up turns first."""

    from memory_recall.controller import RecallController
    from memory_recall.model.chat import ChatMessage
    from memory_recall.providers.embedding import LOCAL_MODEL_ID
    from memory_recall.store import Store

    embedder = _PassThroughEmbedder(LOCAL_MODEL_ID, {})
    with tempfile.TemporaryDirectory() as tmp:
        copy = _copy_store(path, Path(tmp) / "service.sqlite3")
        with Store(copy) as svc:
            controller = RecallController(svc, settings, embedder=embedder)
            times: list[float] = []
            for turn in range(count + 2):
                k = turn % len(QUERIES)
                q = _query(plan, k, QUERIES[k])
                # Floors after the synthetic graph's (seq < n/2), as a host's next turns: a recall never returns
                # message nodes at or after its own user floor, so floors inside the graph would hide most of them.
                floor = plan.n // 2 + 2 * turn
                messages = [
                    ChatMessage(floor=floor, role="assistant", text="The lantern flickers as you wait."),
                    ChatMessage(floor=floor + 1, role="user", text=QUERIES[k]),
                ]
                elapsed = _timed_recall(controller, q, k, floor + 1, messages, NOW_MS + turn, f"service recall {turn}")
                if turn >= 2:
                    times.append(elapsed)
    out["service_recall_ms"] = _pct(times)


def _bench_turn(path: Path, out: dict[str, Any], plan: _Scene, settings: Any, count: int) -> None:
    """``turn_ms``: the user's turn on a copy of the store, as the service runs it — one ``message_added``
    ingested (:meth:`~memory_recall.controller.RecallController.on_message_added`; the service answers the
    event here), the snapshot brought up to date (``SnapshotCache.get``, what the recall does first) and the
    recall of the next user floor, while a thread embeds the nodes the event wrote (``embed_missing`` on them,
    what the service's background worker runs; ``embed`` is its own wall time, not part of the turn, but the
    recall's query shares the engine with it) — with each component; beside it ``warm_ms``, a recall of the
    same run with no message before it (the previous recall's reinforcement and record written, as in the
    service). The recalls embed their query with
    the real local embedder when it is installed (else seeded random vectors), so ``embed_single_ms`` (one
    short passage and one query, timed alone) gives the target's terms: ``turn_ms`` p50 against
    ``warm_ms`` p50 + 2 × single embedding + 30 ms. Two warm-up turns are not counted."""

    from memory_recall.controller import RecallController
    from memory_recall.model.chat import ChatMessage
    from memory_recall.providers.cache import embed_missing
    from memory_recall.providers.embedding import LOCAL_MODEL_ID, LocalEmbedder, local_engine_available
    from memory_recall.service.background import EVENT_EMBED_DELAY_S
    from memory_recall.store import Store

    embedder: Any = LocalEmbedder() if local_engine_available() else _PassThroughEmbedder(LOCAL_MODEL_ID, {})
    parts: dict[str, list[float]] = {k: [] for k in ("turn", "ingest", "embed", "snapshot", "recall", "warm")}
    single: dict[str, list[float]] = {"passage": [], "query": []}
    with tempfile.TemporaryDirectory() as tmp:
        copy = _copy_store(path, Path(tmp) / "turn.sqlite3")
        with Store(copy) as store:
            controller = RecallController(store, settings, embedder=embedder)
            model_id = embedder.model_id

            def recall(turn: int, floor: int, k: int, messages: list[ChatMessage]) -> float:
                return _timed_recall(controller, _query(plan, k, QUERIES[k]), k, floor, messages, NOW_MS + turn,
                                     f"turn recall {turn}")

            for turn in range(count + 2):
                k = turn % len(QUERIES)
                floor = plan.n // 2 + 4 * turn  # after the synthetic graph's floors (see _bench_service)
                said = ChatMessage(floor=floor, role="assistant", speaker=OWNERS[turn % len(OWNERS)],
                                   text=f"{OWNERS[turn % len(OWNERS)]} says: {QUERIES[(k + 3) % len(QUERIES)]}")
                asked = ChatMessage(floor=floor + 1, role="user", speaker=USER, text=QUERIES[k])
                t0 = time.perf_counter()
                report = controller.on_message_added(CHAT, said, now_ms=NOW_MS + turn).ingest
                t1 = time.perf_counter()
                # The service answers the event here and its worker embeds the new nodes meanwhile: the recall
                # below shares the engine with that embedding (its query goes before the next passage slice).
                wrote = report.node_ids if report is not None else ()
                embed_ms: list[float] = []

                def background(ids: Sequence[str] = wrote, into: list[float] = embed_ms) -> None:
                    b0 = time.perf_counter()
                    time.sleep(EVENT_EMBED_DELAY_S)  # as the worker starts an event's pass
                    embed_missing(store, CHAT, embedder, node_ids=ids)
                    into.append((time.perf_counter() - b0) * 1000)

                worker = threading.Thread(target=background)
                worker.start()
                t2 = time.perf_counter()
                controller.snapshot_cache.get(store, CHAT, model_id, now_ms=NOW_MS + turn)
                t3 = time.perf_counter()
                recall_ms = recall(turn, floor + 1, k, [said, asked])
                worker.join()
                controller.snapshot_cache.get(store, CHAT, model_id, now_ms=NOW_MS + turn)  # the vectors, untimed
                # The warm recall of the same run: the next user floor, nothing written since the last recall
                # but that recall's reinforcement and record.
                w = (k + 1) % len(QUERIES)
                warm_ms = recall(turn, floor + 3, w, [ChatMessage(floor=floor + 3, role="user", speaker=USER,
                                                                  text=QUERIES[w])])
                s0 = time.perf_counter()
                embedder.embed_passages([said.text])
                s1 = time.perf_counter()
                embedder.embed_query(asked.text)
                s2 = time.perf_counter()
                if turn < 2:
                    continue
                for name, ms in (("ingest", t1 - t0), ("snapshot", t3 - t2)):
                    parts[name].append(ms * 1000)
                parts["embed"].append(embed_ms[0])
                parts["recall"].append(recall_ms)
                parts["turn"].append((t1 - t0 + t3 - t2) * 1000 + recall_ms)
                parts["warm"].append(warm_ms)
                single["passage"].append((s1 - s0) * 1000)
                single["query"].append((s2 - s1) * 1000)
    out["turn_ms"] = _pct(parts.pop("turn"))
    out["warm_ms"] = _pct(parts.pop("warm"))
    out["turn_parts_ms"] = {name: _pct(v) for name, v in parts.items()}
    out["embed_single_ms"] = {name: _pct(v) for name, v in single.items()}
    out["turn_embedder"] = "local" if isinstance(embedder, LocalEmbedder) else "random"
    target = out["warm_ms"]["p50"] + out["embed_single_ms"]["passage"]["p50"] + out["embed_single_ms"]["query"][
        "p50"] + 30.0
    out["turn_target_ms"] = round(target, 3)


# ---------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------


def _table(results: Sequence[dict[str, Any]]) -> str:
    lines = []
    head = (f"{'nodes':>7} {'p50 ms':>8} {'p95 ms':>8} {'cpu p95':>8} {'+emb p50':>9} {'+emb p95':>9} {'snap ms':>8} "
            f"{'ingest/s':>9} {'RSS MB':>7} {'RSS max':>7} {'1st p50':>8} {'1st max':>8} {'svc p50':>8} {'svc p95':>8}")
    lines.append(head)
    for r in results:
        emb = r.get("total_ms_with_embedding") or {"p50": float("nan"), "p95": float("nan")}
        first = r.get("first_recall_ms") or {"p50": float("nan"), "max": float("nan")}
        svc = r.get("service_recall_ms") or {"p50": float("nan"), "p95": float("nan")}
        lines.append(
            f"{r['nodes']:>7} {r['total_ms']['p50']:>8.2f} {r['total_ms']['p95']:>8.2f} "
            f"{r.get('total_cpu_ms', {}).get('p95', float('nan')):>8.2f} {emb['p50']:>9.2f} "
            f"{emb['p95']:>9.2f} {r['snapshot_build_ms']:>8.0f} {r['ingest_nodes_per_s']:>9.0f} "
            f"{r['peak_rss_mb']:>7.0f} {r.get('rss_target_mb', 0):>7.0f} "
            f"{first['p50']:>8.1f} {first['max']:>8.1f} {svc['p50']:>8.1f} {svc['p95']:>8.1f}"
        )
    names = list(dict.fromkeys(name for r in results for name in r["stages"]))
    lines.append("")
    lines.append(f"{'stage p50/p95 ms':<18}" + "".join(f"{r['nodes']:>16}" for r in results))
    for name in names:
        cells = []
        for r in results:
            s = r["stages"].get(name)
            cells.append(f"{s['p50']:>7.2f}/{s['p95']:<7.2f}" if s else f"{'-':>15}")
        lines.append(f"{name:<18}" + " ".join(cells))
    turned = [r for r in results if "turn_ms" in r]
    if turned:
        lines.append("")
        lines.append(f"{'user turn p50/p95':<18}" + "".join(f"{r['nodes']:>16}" for r in turned))
        rows: list[tuple[str, tuple[str, ...]]] = [("turn_ms", ("turn_ms",)), ("warm_ms", ("warm_ms",))]
        rows += [(name, ("turn_parts_ms", name)) for name in ("ingest", "embed", "snapshot", "recall")]
        rows += [(f"1 {name}", ("embed_single_ms", name)) for name in ("passage", "query")]
        for label, keys in rows:
            cells = []
            for r in turned:
                v = r
                for key in keys:
                    v = v[key]
                cells.append(f"{v['p50']:>7.1f}/{v['p95']:<7.1f}")
            lines.append(f"{label:<18}" + " ".join(cells))
        lines.append(f"{'target p50':<18}" + " ".join(f"{r['turn_target_ms']:>15.1f}" for r in turned))
    lines.append("")
    lines.append(f"{'first recall p50':<18}" + "".join(f"{r['nodes']:>16}" for r in results))
    for name in list(dict.fromkeys(name for r in results for name in r.get("first_recall_stages", {}))):
        cells = []
        for r in results:
            s = r.get("first_recall_stages", {}).get(name)
            cells.append(f"{s['p50']:>15.2f}" if s else f"{'-':>15}")
        lines.append(f"{name:<18}" + " ".join(cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring); returns the exit code. A bad argument is one line on
    stderr (exit 2); a bad ``--out`` raises :class:`~memory_recall.errors.InputError` before anything runs."""
    from memory_recall.cli_common import OneLineParser, int_in_range, int_list
    from memory_recall.errors import InputError

    parser = OneLineParser(prog="memory-recall bench", description="Recall benchmark (issue 8).")
    # At least 10 nodes: the generator needs a few of each type (2 nodes fail in write_graph).
    parser.add_argument("--sizes", type=int_list(10, 10_000_000), default=(1000, 10000, 100000),
                        help="comma-separated node counts, each at least 10 (default 1000,10000,100000)")
    parser.add_argument("--repeat", type=int_in_range(1, 10_000), default=5, help="passes over the 20 queries per size")
    parser.add_argument("--out", default="bench.json", help="JSON output path")
    parser.add_argument("--profile", default="", help="write a pyinstrument text profile of the timed recalls")
    parser.add_argument("--store-dir", default="", help="keep the generated stores here and reuse them next time")
    parser.add_argument("--first", type=int_in_range(0, 10_000), default=5,
                        help="first recalls on a fresh snapshot per size")
    parser.add_argument("--service", type=int_in_range(0, 10_000), default=20,
                        help="recalls through the controller per size")
    parser.add_argument("--turns", type=int_in_range(0, 10_000), default=10,
                        help="user turns (message event + recall) per size")
    parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)  # worker mode: one size
    parser.add_argument("--write", type=int, default=0, help=argparse.SUPPRESS)  # writer mode: one graph
    parser.add_argument("--db", default="", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=5000, help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.write:
        json.dump(write_graph(args.write, Path(args.db), chunk=args.chunk), sys.stdout)
        return 0
    if args.one:
        json.dump(bench_size(args.one, repeat=args.repeat, profile=args.profile, store_dir=args.store_dir,
                             first=args.first, service=args.service, turns=args.turns), sys.stdout)
        return 0
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        what = "is a directory" if out.is_dir() else f"has no directory {str(out.parent)!r}"
        raise InputError("--out", f"{args.out} {what}; name a file in an existing directory")
    sizes = list(args.sizes)
    results = []
    for n in sizes:
        cmd = [sys.executable, "-m", "memory_recall.bench", "--one", str(n), "--repeat", str(args.repeat),
               "--first", str(args.first), "--service", str(args.service), "--turns", str(args.turns)]
        if args.profile:
            cmd += ["--profile", f"{args.profile}.{n}.txt"]
        if args.store_dir:
            cmd += ["--store-dir", str(Path(args.store_dir).resolve())]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return proc.returncode
        results.append(json.loads(proc.stdout))
        print(f"# {n} nodes done in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    try:
        out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError("--out", f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
