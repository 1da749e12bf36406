"""Load test (issue 9): concurrent clients against the real service on 127.0.0.1.

Usage::

    python scripts/load_test.py --clients 32 --seconds 60 --nodes 10000 --out load.json

1. **Chat.** Builds (or reuses, in ``--data-dir``) a chat of ``--nodes`` nodes from the seeded synthetic
   roleplay graph of the recall benchmark (``memory_recall.bench``: type mix, edges, owners, regions, story
   time), then embeds every node with the packaged local embedder through ``embed_missing`` — the function the
   service itself runs after a write — so the stored vectors are exactly what ``memory-recall serve`` with
   default settings would have produced and recall queries embed in the same space (the benchmark's random
   vectors would not be). A reused store only gets what is missing (``embed_missing`` embeds nothing when every
   active node has its vector); each run works on a fresh copy of the built store.
2. **Service.** ``memory-recall serve --data-dir … --port …`` as a user starts it (default settings, embedding
   provider ``local``: the packaged multilingual-e5-small engine, no API key), a subprocess with real uvicorn.
   Warm-up: one recall (snapshot build) and one recall record per client (the targets of record edits).
3. **Load.** ``--clients`` asyncio clients (httpx, one connection each) for ``--seconds``: 80 % recalls
   (a ``normal`` generation for a new user floor, queries of the benchmark), 15 % ``message_added`` events
   (new turns, ingested and embedded inline by the service), 5 % record edits (``PUT`` on the client's
   record; ``--mix`` changes the shares); the first request of client ``c`` is of kind ``c % 3`` (when that
   kind is in the mix), so a short run exercises every kind.
   Every answer is validated; a non-2xx answer, a timeout (``--timeout``), a transport error or an
   invalid body is an error.
4. **Memory.** The service's RSS (``/proc/<pid>/status``) is sampled every ``--sample-s`` seconds from start
   to end; "growth after warm-up" compares the last sample with the first sample of the load's second half. Its
   anonymous part is sampled too: the file-backed rest is mostly the embedding model's mapped file, whose pages
   come in as new texts reach more of its vocabulary (bounded by the file, and reclaimable by the system). The
   RSS without that file's pages (``/proc/<pid>/smaps``) is sampled as well. The trend over the second half is
   the Theil-Sen slope of its in-load samples (with its 95 % interval), beside the least-squares one: a sample
   taken while a matrix copy is alive, or right after a heap trim, is an outlier that moves a fitted line and the
   first-to-last difference, not the median of the pairwise slopes. With each sample the service's own
   ``GET /v1/memory`` gives the C allocator's memory in use, trended the same way: the RSS rising while that
   stays level is the heaps fragmenting or Python's small objects growing (they live in Python's own arenas,
   outside glibc's figures).

Prints a table (count, errors, p50/p95/p99/max latency per kind, throughput) and the RSS samples; ``--out``
writes everything as JSON. ``--repeat N`` runs the load N times, one after the other, each on a fresh copy of the
chat and a fresh service, and ends with the second half's anonymous RSS trend of every run, their median and how
many runs have its 95 % interval above zero (:func:`repeat_summary`; ``--out`` then holds every run and the
summary): on a shared machine single 60 s runs of one code spread over several MiB. ``--arm "NAME VAR=VALUE …"``
(repeatable) compares service environments: each of the ``--repeat`` rounds runs every arm once, in the order
given, so the arms alternate and share the machine's busy and quiet spells; the summary is then per arm, and every
run records its arm and the service's ``GET /v1/memory`` answer at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import theilslopes

CHAT = "load-chat"
DB_NAME = "memory-recall.sqlite3"
KINDS = ("recall", "message", "edit")
#: The mix of a chat turn under load: recall 70 %, ``message_added`` events 20 %, edits 10 % (``message_edited``
#: events with ``--messages``, record edits on the benchmark graph, which holds no messages to edit).
MIX = (0.70, 0.20, 0.10)


# ---------------------------------------------------------------------------------------------------------------
# The chat
# ---------------------------------------------------------------------------------------------------------------


class RandomVectors:
    """Seeded random unit vectors (from each text's SHA-256) under the local model's id and dimension: a chat of
    thousands of nodes gets its vectors in seconds instead of the local engine's quarter of an hour. Recall
    timings are the same (the same matrix shapes and stages); what the recalls find is not measured then. The
    service still embeds new messages and the queries with the real engine."""

    def __init__(self) -> None:
        from memory_recall.providers.embedding import LOCAL_DIM, LOCAL_MODEL_ID

        self.model_id, self.dim = LOCAL_MODEL_ID, LOCAL_DIM

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        import hashlib

        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode("utf-8")).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.asarray(rows, np.float32).reshape(len(texts), self.dim)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]


def _builder_embedder(vectors: str) -> Any:
    from memory_recall.providers.embedding import LocalEmbedder

    return RandomVectors() if vectors == "random" else LocalEmbedder()


def build_chat(data_dir: Path, n: int, *, log: Any = print, vectors: str = "local") -> dict[str, Any]:
    """Create (or reuse) the ``n``-node chat in ``data_dir``; returns what was done and how long it took.
    ``vectors="random"``: the stored vectors are :class:`RandomVectors` (a fresh ``data_dir`` is needed to switch:
    the two kinds share the model id)."""
    from memory_recall.bench import _Plan  # the benchmark's seeded synthetic roleplay graph
    from memory_recall.model.graph import Edge, Node
    from memory_recall.store import Store

    data_dir.mkdir(parents=True, exist_ok=True)
    embedder = _builder_embedder(vectors)
    out: dict[str, Any] = {"nodes": n, "embedding_model": embedder.model_id, "vectors": vectors}
    with Store.open(data_dir) as store:
        stats = store.stats(CHAT) if CHAT in {c.chat_id for c in store.list_chats()} else {"node_count": 0}
        reuse = stats["node_count"] >= n
        out["reused"] = reuse
        start = time.perf_counter()
        if not reuse:
            if stats["node_count"]:
                store.delete_chat(CHAT)
            plan = _Plan(n)
            for lo in range(0, n, 2000):
                nodes = [Node.model_validate(plan.node(i)) for i in range(lo, min(n, lo + 2000))]
                with store.write(CHAT) as w:
                    w.upsert_nodes(nodes)
            for lo in range(0, int(plan.edge_src.size), 8000):
                edges = [Edge.model_validate(e) for e in plan.edges(lo, lo + 8000)]
                with store.write(CHAT) as w:
                    w.upsert_edges(edges)
            plan.write_state(store, CHAT)
        out["graph_write_s"] = round(time.perf_counter() - start, 1)
        _embed_chat(store, embedder, out, log)
    return out


def _embed_chat(store: Any, embedder: Any, out: dict[str, Any], log: Any) -> None:
    """Embed what the chat lacks (``embed_missing``, as the service does; on a reused store nothing, or the rest
    of an interrupted build), logging progress every 15 s, and record ``embedded_now``, ``embed_s``,
    ``node_count`` and the chat's stats in ``out``."""
    from memory_recall.providers.cache import embed_missing

    start = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 15:
            last[0] = time.perf_counter()
            log(f"  embedded {done}/{total} nodes ({time.perf_counter() - start:.0f} s)")

    report = embed_missing(store, CHAT, embedder, progress=progress)
    out["embedded_now"] = report.total
    out["embed_s"] = round(time.perf_counter() - start, 1)
    stats = store.stats(CHAT)
    out["node_count"] = stats["node_count"]
    out["stats"] = {k: v for k, v in stats.items() if isinstance(v, int | float | str | dict)}


def _chat_script() -> Any:
    """``scripts/bench_ingest_event.py`` as a module: its seeded turns are the message chat's turns."""
    import importlib.util

    path = Path(__file__).with_name("bench_ingest_event.py")
    spec = importlib.util.spec_from_file_location("bench_ingest_event", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_message_chat(data_dir: Path, messages: int, *, log: Any = print, vectors: str = "local") -> dict[str, Any]:
    """Create (or reuse) a chat of ``messages`` turns written by the real message ingestion (``ingest_messages``
    in batches of 500, the seeded turns of ``scripts/bench_ingest_event.py``), every node embedded with the
    packaged local embedder through ``embed_missing``."""
    from memory_recall.ingest import ingest_messages
    from memory_recall.ingest.messages import message_id
    from memory_recall.store import Store

    turns = _chat_script()
    data_dir.mkdir(parents=True, exist_ok=True)
    embedder = _builder_embedder(vectors)
    out: dict[str, Any] = {"messages": messages, "embedding_model": embedder.model_id, "vectors": vectors}
    with Store.open(data_dir) as store:
        known = CHAT in {c.chat_id for c in store.list_chats()}
        have = store.get_node(CHAT, message_id(messages - 1)) if known else None
        out["reused"] = have is not None
        start = time.perf_counter()
        if have is None:
            store.delete_chat(CHAT)
            for lo in range(0, messages, 500):
                ingest_messages(store, CHAT, turns.messages(lo, min(500, messages - lo)), now_ms=turns.NOW)
        out["graph_write_s"] = round(time.perf_counter() - start, 1)
        _embed_chat(store, embedder, out, log)
    return out


def message_queries() -> tuple[str, ...]:
    """Recall queries about the message chat's places, people and things (seeded, fixed order)."""
    turns = _chat_script()
    rng = random.Random(16)
    return tuple(
        f"What happened at {rng.choice(turns.NAMES)} with the {rng.choice(turns.WORDS)}?" for _ in range(40)
    )


# ---------------------------------------------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_parts_mb(pid: int) -> tuple[float, float, float]:
    """Resident set size of ``pid`` in MiB (Linux ``/proc``): ``(total, anonymous, file-backed)``. The file-backed
    part is mostly the local embedding model, mapped from its file: its pages come in as texts use more of the
    vocabulary (up to the file's size), and the system can drop them at any time; memory the service allocates
    is anonymous."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    if "VmRSS" not in fields:
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return fields["VmRSS"], fields.get("RssAnon", fields["VmRSS"]), fields.get("RssFile", 0.0)


def mapped_rss_mb(pid: int, directory: Path | None) -> float:
    """Resident MiB of ``pid``'s mappings of ``.bin`` files in ``directory`` (Linux ``/proc/<pid>/smaps``): the
    local engine's model file, whose pages come in as texts reach new tokens. 0 when ``directory`` is None."""
    if directory is None:
        return 0.0
    prefix, total, inside = f"{directory.resolve()}/", 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line: range perms offset dev inode [path]
            path = head[5] if len(head) == 6 else ""
            inside = path.startswith(prefix) and path.endswith(".bin")
        elif inside and head[:1] == ["Rss:"]:
            total += int(head[1])
    return round(total / 1024, 1)


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (Linux ``/proc``)."""
    return rss_parts_mb(pid)[0]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Service:
    """``memory-recall serve`` in a subprocess with default settings and the local embedder."""

    def __init__(self, data_dir: Path, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        """``env``: variables set in the service's environment on top of this process's (an arm's)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, MEMORY_RECALL_CONFIG="", MEMORY_RECALL_EMBEDDING__PROVIDER="local", **(env or {}))
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memory_recall.cli", "serve", "--data-dir", str(data_dir),
             "--port", str(self.port)],
            stdout=self._log, stderr=self._log, env=env,
        )

    def wait_ready(self, timeout: float = 120.0) -> float:
        import httpx

        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=5).status_code == 200:
                    return time.perf_counter() - start
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the service did not start")

    def stop(self) -> bool:
        """SIGTERM as Ctrl-C would; ``True`` when the service shut down cleanly (uvicorn re-raises the signal
        after its graceful shutdown, so the exit status is -SIGTERM either way: its log says which)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        finally:
            self._log.close()
        text = Path(self._log.name).read_text(errors="replace")
        return code in (0, -signal.SIGTERM) and "Application shutdown complete" in text


class RssSampler(threading.Thread):
    """Samples the service's RSS every ``period`` seconds as ``(seconds since start, MiB)``, its anonymous part
    the same way in ``anon``, and the RSS without the model file's pages (:func:`mapped_rss_mb`) in ``rest``.
    Given the service's ``url``, also the C allocator's memory in use from ``GET /v1/memory`` in ``in_use`` (a
    sample the service does not answer within a second is left out): the RSS rising with it level is the heaps
    fragmenting or Python's small objects growing, which glibc's figures do not count."""

    def __init__(self, pid: int, period: float, url: str | None = None) -> None:
        from memory_recall.providers.embedding import local_engine_dir

        super().__init__(daemon=True)
        self.pid, self.period, self.url = pid, period, url
        self.samples: list[tuple[float, float]] = []
        self.anon: list[tuple[float, float]] = []
        self.rest: list[tuple[float, float]] = []
        self.in_use: list[tuple[float, float]] = []
        self.t0 = time.perf_counter()
        self._halt = threading.Event()
        engine = local_engine_dir()
        self._model_dir = Path(engine) if engine else None

    def sample(self) -> float:
        mb, anon, _ = rss_parts_mb(self.pid)
        model = mapped_rss_mb(self.pid, self._model_dir)
        t = round(time.perf_counter() - self.t0, 1)
        self.samples.append((t, mb))
        self.anon.append((t, anon))
        self.rest.append((t, round(mb - model, 1)))
        in_use = self._heap_in_use_mb()
        if in_use is not None:
            self.in_use.append((t, in_use))
        return mb

    def _heap_in_use_mb(self) -> float | None:
        import httpx

        if self.url is None:
            return None
        try:
            heap = _service_memory(self.url, timeout=1.0)["heap"]
        except httpx.HTTPError:
            return None
        return None if heap is None else round(heap["in_use_bytes"] / 2**20, 1)

    def run(self) -> None:
        while not self._halt.wait(self.period):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()


# ---------------------------------------------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------------------------------------------


def _queries() -> tuple[str, ...]:
    from memory_recall.bench import QUERIES

    return QUERIES


@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    started: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    recall_status: dict[str, int] = field(default_factory=dict)
    recall_source: dict[str, int] = field(default_factory=dict)
    retrieval_status: dict[str, int] = field(default_factory=dict)


def _recall_body(client: int, floor: int, query: str) -> dict[str, Any]:
    return {
        "chat_id": CHAT, "target_user_floor": floor,
        "messages": [{"floor": floor, "role": "user", "speaker": "Traveller", "text": query}],
    }


async def _client(
    c: int, http: Any, deadline: float, res: Results, queries: Sequence[str], edit_floor: int, seed: int,
    mix: Sequence[float], chat_messages: int = 0, t0: float = 0.0,
) -> None:
    """One client's loop. ``chat_messages`` > 0: the chat is a message chat of that many turns and an edit is a
    ``message_edited`` event of one of them; 0: an edit is a record edit. Latencies are kept with their start
    time (seconds since ``t0``) so the figures can be split by halves."""
    import httpx

    rng = random.Random(seed * 1000 + c)
    i = 0
    while time.perf_counter() < deadline:
        i += 1
        r = rng.random()
        kind = "recall" if r < mix[0] else "message" if r < mix[0] + mix[1] else "edit"
        if i == 1 and mix[c % len(KINDS)] > 0:
            kind = KINDS[c % len(KINDS)]  # so that even a short run exercises every kind of the mix
        floor = 2_000_000 + c * 100_000 + i  # unique per request: every recall is a fresh one
        start = time.perf_counter()
        problem = ""
        try:
            if kind == "recall":
                resp = await http.post("/v1/recall", json=_recall_body(c, floor, rng.choice(queries)))
                if resp.status_code == 200:
                    body = resp.json()
                    res.recall_status[body["status"]] = res.recall_status.get(body["status"], 0) + 1
                    res.recall_source[body["source"]] = res.recall_source.get(body["source"], 0) + 1
                    rs = body.get("retrieval_status", "")
                    res.retrieval_status[rs] = res.retrieval_status.get(rs, 0) + 1
                    if body["chat_id"] != CHAT or body["status"] != "completed" or not body["injection_text"]:
                        problem = f"recall answered {body['status']}/{body['reason']}"
            elif kind == "message":
                who = rng.choice(("Alice", "Bram", "Corin", "Dahlia"))
                text = f"{who} looks at the {rng.choice(queries).lower()} ({c}-{i})"
                msg = {"floor": 5_000_000 + c * 100_000 + i, "role": rng.choice(("user", "assistant")),
                       "speaker": who, "text": text}
                resp = await http.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "message": msg})
                if resp.status_code == 200:
                    body = resp.json()
                    embedded = body["embedding"]["status"] in ("ok", "queued")
                    if body["type"] != "message_added" or body["nodes_added"] < 1 or not embedded:
                        problem = f"event answered {body}"
            elif chat_messages:
                edited = rng.randrange(chat_messages)
                msg = {"floor": edited, "role": "user" if edited % 2 == 0 else "assistant",
                       "speaker": "Ash" if edited % 2 == 0 else "Mara Vell",
                       "text": f"{rng.choice(queries)} (edited by client {c} at {i})"}
                resp = await http.post(f"/v1/chats/{CHAT}/events", json={"type": "message_edited", "message": msg})
                if resp.status_code == 200:
                    body = resp.json()
                    if body["type"] != "message_edited" or body["nodes_updated"] < 1:
                        problem = f"edit event answered {body}"
            else:
                text = f"edited by client {c} at {i}"
                resp = await http.put(f"/v1/chats/{CHAT}/records/{edit_floor}", json={"injection_text": text})
                if resp.status_code == 200:
                    rec = resp.json()["record"]
                    if rec["injection_text"] != text or not rec["manually_edited"]:
                        problem = f"edit answered {rec['injection_text']!r}"
            if resp.status_code != 200:
                problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
        except httpx.TimeoutException:
            problem = "timeout"
        except httpx.TransportError as exc:
            problem = f"transport error {type(exc).__name__}"
        elapsed = (time.perf_counter() - start) * 1000
        if problem:
            res.errors[kind].append(problem)
        else:
            res.latencies[kind].append(elapsed)
            res.started[kind].append(start - t0)


async def _run_clients(url: str, clients: int, seconds: float, timeout: float, seed: int,
                       edit_floors: Sequence[int], mix: Sequence[float],
                       chat_messages: int = 0) -> tuple[Results, float]:
    import httpx

    res = Results()
    queries = message_queries() if chat_messages else _queries()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.gather(*(
            _client(c, http, deadline, res, queries, edit_floors[c], seed, mix, chat_messages, start)
            for c in range(clients)
        ))
        wall = time.perf_counter() - start
    return res, wall


def _setup_records(url: str, clients: int, queries: Sequence[str]) -> list[int]:
    """One recall record per client (its record-edit target); also warms the snapshot."""
    import httpx

    floors = []
    with httpx.Client(base_url=url, timeout=300) as http:
        for c in range(clients):
            floor = 1_000_000 + c
            r = http.post("/v1/recall", json=_recall_body(c, floor, queries[c % len(queries)]))
            r.raise_for_status()
            if r.json()["record"] is None:
                raise RuntimeError(f"warm-up recall {c} persisted no record: {r.json()['reason']}")
            floors.append(floor)
    return floors


# ---------------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------------


def _pcts(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    arr = np.asarray(values)
    return {
        "p50": round(float(np.percentile(arr, 50)), 1), "p95": round(float(np.percentile(arr, 95)), 1),
        "p99": round(float(np.percentile(arr, 99)), 1), "max": round(float(arr.max()), 1),
    }


def run_load(
    *, data_dir: Path, nodes: int, clients: int, seconds: float, timeout: float = 60.0, sample_s: float = 1.0,
    seed: int = 9, mix: Sequence[float] = MIX, messages: int = 0, vectors: str = "local", log: Any = print,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build/reuse the chat (``messages`` > 0: a message chat of that many turns, else the ``nodes``-node
    benchmark graph), start the service (``env`` added to its environment), run the load; returns the JSON figures
    (see the module doc)."""
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_before = [round(x, 2) for x in os.getloadavg()]
    if messages:
        log(f"chat: {messages} messages in {data_dir}")
        chat = build_message_chat(data_dir, messages, log=log, vectors=vectors)
    else:
        log(f"chat: {nodes} nodes in {data_dir}")
        chat = build_chat(data_dir, nodes, log=log, vectors=vectors)
    log(f"  {'reused' if chat['reused'] else 'built'}: {chat['node_count']} nodes, embedded {chat['embedded_now']} "
        f"now in {chat['embed_s']} s ({chat['embedding_model']})")
    # Every run starts from the same chat: a copy of the built store (runs add turns and records).
    run_dir = Path(tempfile.mkdtemp(prefix="load-run-"))
    for f in data_dir.glob(f"{DB_NAME}*"):
        shutil.copy2(f, run_dir / f.name)
    service = Service(run_dir, run_dir / "service.log", env)
    try:
        ready_s = service.wait_ready()
        sampler = RssSampler(service.proc.pid, sample_s, service.url)
        rss_ready = sampler.sample()
        start = time.perf_counter()
        queries = message_queries() if messages else _queries()
        edit_floors = _setup_records(service.url, clients, queries)
        warmup_s = time.perf_counter() - start
        rss_warm = sampler.sample()
        log(f"service ready in {ready_s:.1f} s (RSS {rss_ready} MiB); warm-up {warmup_s:.1f} s (RSS {rss_warm} MiB)")
        cpu0 = cpu_s(service.proc.pid)
        load_t0 = time.perf_counter() - sampler.t0
        sampler.start()
        res, wall = asyncio.run(
            _run_clients(service.url, clients, seconds, timeout, seed, edit_floors, mix, messages)
        )
        sampler.stop()
        cpu_load = cpu_s(service.proc.pid) - cpu0
        rss_end = sampler.sample()
        memory_end = _service_memory(service.url)
    finally:
        clean_shutdown = service.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    during = [mb for t, mb in sampler.samples if t > load_t0]
    second_half = [mb for t, mb in sampler.samples if t > load_t0 + seconds / 2]
    anon_second_half = [mb for t, mb in sampler.anon if t > load_t0 + seconds / 2]
    load_end = load_t0 + wall
    anon_trend = half_trend(sampler.anon, load_t0 + seconds / 2, load_end)
    added_late = sum(1 for t in res.started["message"] if t >= seconds / 2)
    kinds = {}
    for k in KINDS:
        ok = res.latencies[k]
        late = [ms for ms, t in zip(ok, res.started[k], strict=True) if t >= seconds / 2]
        kinds[k] = {"ok": len(ok), "errors": len(res.errors[k]), "throughput_per_s": round(len(ok) / wall, 2),
                    **_pcts(ok), "second_half": _pcts(late), "first_errors": res.errors[k][:5]}
    total_ok = sum(len(v) for v in res.latencies.values())
    return {
        "started": started, "clients": clients, "mix": list(mix), "seconds": seconds, "wall_s": round(wall, 1),
        "chat": chat,        "embedder": chat["embedding_model"], "kinds": kinds,
        "errors": sum(len(v) for v in res.errors.values()), "requests_ok": total_ok,
        "throughput_per_s": round(total_ok / wall, 2), "recall_status": res.recall_status,
        "recall_source": res.recall_source,
        "retrieval_status": res.retrieval_status, "service_cpu_s": round(cpu_load, 1),
        "service_ready_s": round(ready_s, 1), "warmup_s": round(warmup_s, 1),
        "rss_mb": {
            "ready": rss_ready, "after_warmup": rss_warm, "max_during": max(during) if during else None,
            "end": rss_end, "second_half_first": second_half[0] if second_half else None,
            "growth_second_half": round(rss_end - second_half[0], 1) if second_half else None,
            "samples": sampler.samples,
            "anon_growth_second_half": (
                round(sampler.anon[-1][1] - anon_second_half[0], 1) if anon_second_half else None
            ),
            "anon_samples": sampler.anon,
            "trend_second_half": half_trend(sampler.samples, load_t0 + seconds / 2, load_end),
            "anon_trend_second_half": anon_trend,
            "messages_added_second_half": added_late,
            "anon_kib_per_message_second_half": (
                round(anon_trend["growth"] * 1024 / added_late, 1) if anon_trend and added_late else None
            ),
            "heap_in_use_samples": sampler.in_use,
            "heap_in_use_trend_second_half": half_trend(sampler.in_use, load_t0 + seconds / 2, load_end),
            "without_model_samples": sampler.rest,
            "without_model_trend_second_half": half_trend(sampler.rest, load_t0 + seconds / 2, load_end),
        },
        "service_memory_end": memory_end,
        "clean_shutdown": clean_shutdown,
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
    }


def _service_memory(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The service's ``GET /v1/memory`` answer (its RSS, heaps and heap trims so far); raises ``httpx.HTTPError``."""
    import httpx

    return dict(httpx.get(f"{url}/v1/memory", timeout=timeout).raise_for_status().json())


def half_trend(samples: Sequence[tuple[float, float]], start: float, end: float) -> dict[str, float] | None:
    """The in-load samples of ``(start, end]`` (seconds since the sampler's start, MiB): the first and the last,
    the growth between them, and the least-squares slope over all of them in MiB per minute (one sample on a
    spike moves the endpoints, not much the slope). The sample taken after the clients stopped is not among them:
    in five 60 s runs of the chat-turn mix it was 3.3–3.5 MiB above the last in-load sample (in recall-only runs,
    equal), a step at the end of the load rather than part of its trend. None under 2 samples."""
    pts = [(t, mb) for t, mb in samples if start < t <= end]
    if len(pts) < 2:
        return None
    t, mb = np.asarray(pts, dtype=np.float64).T
    slope = float(np.polyfit(t, mb, 1)[0]) * 60
    # The Theil-Sen slope (the median of the pairwise slopes) with its 95 % interval: the samples jump up while a
    # matrix copy is alive and down right after a heap trim, and such outliers move a least-squares line.
    robust, _, low, high = theilslopes(mb, t, alpha=0.95)
    return {"first": pts[0][1], "last": pts[-1][1], "growth": round(pts[-1][1] - pts[0][1], 1),
            "slope_mib_per_min": round(slope, 2), "samples": len(pts),
            "theil_sen_mib_per_min": round(float(robust) * 60, 2),
            "theil_sen_95": [round(float(low) * 60, 2), round(float(high) * 60, 2)],
            "theil_sen_over_half_mib": round(float(robust) * (t[-1] - t[0]), 2)}


def _theil_sen_text(trend: dict[str, Any], added: int) -> str:
    """``trend``'s Theil-Sen slope, its 95 % interval and its growth over the half, per message ``added`` too."""
    low, high = trend["theil_sen_95"]
    each = f", {trend['theil_sen_over_half_mib'] * 1024 / added:+.1f} KiB per message added" if added else ""
    return (f"{trend['theil_sen_mib_per_min']:+} MiB/min (95 % interval {low:+} to {high:+}), "
            f"{trend['theil_sen_over_half_mib']:+} MiB over the half{each}")


def table(out: dict[str, Any]) -> str:
    head = ("kind", "ok", "errors", "per s", "p50 ms", "p95 ms", "p99 ms", "max ms", "2nd half p50", "2nd half p95")
    rows = [head] + [
        (k, v["ok"], v["errors"], v["throughput_per_s"], v["p50"], v["p95"], v["p99"], v["max"],
         v["second_half"]["p50"], v["second_half"]["p95"])
        for k, v in out["kinds"].items()
    ]
    rows.append(("all", out["requests_ok"], out["errors"], out["throughput_per_s"], "", "", "", "", "", ""))
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def repeat_summary(outs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The second half's anonymous RSS trend over repeated runs (``run_load`` results, in run order): each run's
    Theil-Sen growth over the half (MiB), their median, and how many runs have the trend's 95 % interval wholly
    above zero, including zero (an end at zero counts as including it) or wholly below. Single 60 s runs of one
    code spread over several MiB on a shared machine, so a comparison needs several runs per variant. A run
    without a trend (under two samples in the half) counts in none of them."""
    trends = [t for out in outs if (t := out["rss_mb"]["anon_trend_second_half"])]
    growth = [t["theil_sen_over_half_mib"] for t in trends]
    return {
        "growth_mib": growth,
        "median_mib": round(float(np.median(growth)), 2) if growth else None,
        "above_zero": sum(1 for t in trends if t["theil_sen_95"][0] > 0),
        "including_zero": sum(1 for t in trends if t["theil_sen_95"][0] <= 0 <= t["theil_sen_95"][1]),
        "below_zero": sum(1 for t in trends if t["theil_sen_95"][1] < 0),
    }


@dataclass(frozen=True)
class Arm:
    """One service environment of a comparison: its name and the variables it sets."""

    name: str
    env: dict[str, str] = field(default_factory=dict)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_arm(text: str) -> Arm:
    """``NAME [VAR=VALUE ...]``, split as a shell splits words (a value may hold ``=``, ``:`` and ``,``, and spaces
    when quoted), as ``env`` takes them. Raises :class:`ValueError` naming what is wrong."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"cannot split it into words: {exc}") from None
    if not words or "=" in words[0]:
        raise ValueError("the arm needs a name before its variables")
    env: dict[str, str] = {}
    for item in words[1:]:
        var, eq, value = item.partition("=")
        if not eq or not _ENV_NAME.fullmatch(var):
            raise ValueError(f"{item!r} is not VAR=VALUE with VAR an environment variable's name")
        if var in env:
            raise ValueError(f"{var} is set twice")
        env[var] = value
    return Arm(words[0], env)


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    """Print one run's figures (the table, the RSS samples and trends, the first errors)."""
    print()
    chat = f"{args.messages} messages, " if args.messages else ""
    arm = f" [arm {out['arm']}]" if "arm" in out else ""
    print(f"load test{arm} started {out['started']}: {args.clients} clients, mix {args.mix}, {out['wall_s']} s, "
          f"{chat}{out['chat']['node_count']} nodes, embedder {out['embedder']}; load average before "
          f"{out['load_average']['before']}, after {out['load_average']['after']}")
    print(table(out))
    rss = out["rss_mb"]
    print(f"service RSS MiB: ready {rss['ready']}, after warm-up {rss['after_warmup']}, max during "
          f"{rss['max_during']}, end {rss['end']}, growth over the second half {rss['growth_second_half']}")
    print("RSS samples (s, MiB):", " ".join(f"{t:g}:{mb:g}" for t, mb in rss["samples"]))
    print(f"anonymous RSS (without the mapped model file) growth over the second half "
          f"{rss['anon_growth_second_half']}; samples:", " ".join(f"{t:g}:{mb:g}" for t, mb in rss["anon_samples"]))
    trend = rss["anon_trend_second_half"]
    if trend:
        print(f"anonymous RSS over the second half, in-load samples only: {trend['first']} -> {trend['last']} MiB "
              f"({trend['growth']:+} MiB, slope {trend['slope_mib_per_min']:+} MiB/min over {trend['samples']} "
              f"samples); {rss['messages_added_second_half']} messages added meanwhile "
              f"({rss['anon_kib_per_message_second_half']} KiB each)")
        print(f"anonymous RSS trend over the second half (Theil-Sen): "
              f"{_theil_sen_text(trend, rss['messages_added_second_half'])}")
    used = rss["heap_in_use_trend_second_half"]
    if used:
        print(f"allocator's memory in use (GET /v1/memory) over the second half: {used['first']} -> {used['last']} "
              f"MiB; trend (Theil-Sen) {_theil_sen_text(used, rss['messages_added_second_half'])}")
    rest = rss["without_model_trend_second_half"]
    if rest:
        print(f"RSS without the model file's pages over the second half, in-load samples only: {rest['first']} -> "
              f"{rest['last']} MiB ({rest['growth']:+} MiB, slope {rest['slope_mib_per_min']:+} MiB/min, Theil-Sen "
              f"{rest['theil_sen_mib_per_min']:+} MiB/min, {rest['theil_sen_over_half_mib']:+} MiB over the half)")
    print(f"service CPU during the load: {out['service_cpu_s']} s; recall status {out['recall_status']}, "
          f"source {out['recall_source']}; retrieval {out['retrieval_status']}")
    for k, v in out["kinds"].items():
        for e in v["first_errors"]:
            print(f"ERROR {k}: {e}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=0,
                        help="a message chat of this many turns (real ingestion) instead of the --nodes graph")
    parser.add_argument("--vectors", choices=("local", "random"), default="local",
                        help="stored vectors of the built chat: the local engine, or seeded random unit vectors "
                             "under its model id (builds in seconds; recall timings alike)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-request timeout (counts as an error)")
    parser.add_argument("--sample-s", type=float, default=1.0, help="RSS sampling period")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--mix", default="70,20,10", help="percent of recalls, message_added events, edits")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="store to build or reuse (default: a per-size directory in the temp dir)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs one after the other, each on a fresh copy of the chat; a summary of the second "
                             "half's RSS trend follows (with --arm: rounds, each running every arm once)")
    parser.add_argument("--arm", action="append", default=[], metavar="'NAME [VAR=VALUE ...]'",
                        help="a service environment to compare (repeatable); the arms alternate, the summary is "
                             "per arm")
    parser.add_argument("--build-only", action="store_true", help="build or check the chat, then stop")
    args = parser.parse_args(argv)
    size = f"msgs-{args.messages}" if args.messages else str(args.nodes)
    data_dir = args.data_dir or Path(tempfile.gettempdir()) / f"memory-recall-load-{size}"
    if args.build_only:
        built = (build_message_chat(data_dir, args.messages, vectors=args.vectors) if args.messages
                 else build_chat(data_dir, args.nodes, vectors=args.vectors))
        print(json.dumps(built, indent=2))
        return 0
    mix = [float(x) / 100 for x in args.mix.split(",")]
    if len(mix) != 3 or any(x < 0 for x in mix) or abs(sum(mix) - 1) > 1e-9:
        parser.error(f"--mix must be three percentages adding up to 100, got {args.mix!r}")
    if args.repeat < 1:
        parser.error(f"--repeat must be a positive number of runs, got {args.repeat}")
    arms: list[Arm] = []
    for text in args.arm:
        try:
            arms.append(parse_arm(text))
        except ValueError as exc:
            parser.error(f"--arm {text!r}: {exc}")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        parser.error(f"--arm names must differ, got {', '.join(names)}")
    outs: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        for arm in arms or [Arm("")]:  # no --arm: one run per round, the environment as it is
            out = run_load(data_dir=data_dir, nodes=args.nodes, clients=args.clients, seconds=args.seconds,
                           timeout=args.timeout, sample_s=args.sample_s, seed=args.seed, mix=mix,
                           messages=args.messages, vectors=args.vectors, env=arm.env)
            if arm.name:
                out = {"arm": arm.name, "arm_env": arm.env, **out}
            report(out, args)
            outs.append(out)
    doc: dict[str, Any] = outs[0]
    if arms:
        summaries = {a.name: repeat_summary([o for o in outs if o["arm"] == a.name]) for a in arms}
        for name, summary in summaries.items():
            _print_summary(f"arm {name}, {args.repeat} run{'s' if args.repeat > 1 else ''}", summary)
        doc = {"runs": outs, "summary": summaries}
    elif len(outs) > 1:
        summary = repeat_summary(outs)
        _print_summary(f"{len(outs)} runs", summary)
        doc = {"runs": outs, "summary": summary}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if any(out["errors"] for out in outs) else 0


def _print_summary(what: str, summary: dict[str, Any]) -> None:
    growth = ", ".join(f"{g:+}" for g in summary["growth_mib"])
    median = "none" if summary["median_mib"] is None else f"{summary['median_mib']:+} MiB"
    print(f"\nanonymous RSS over the second half, {what} (Theil-Sen): {growth} MiB; median {median}; its 95 % "
          f"interval above zero in {summary['above_zero']}, including zero in {summary['including_zero']}, below "
          f"zero in {summary['below_zero']}")


if __name__ == "__main__":
    sys.exit(main())
