"""Crash test (issue 9): SIGKILL a writer process and the running service during concurrent recall and ingest.

Usage::

    python scripts/crash_test.py --writer-kills 100 --service-kills 100 --out crash.json

Two phases, each on its own fresh store in a temporary directory (``--workdir`` keeps it):

1. **Writer kills.** A child process (this script with ``--writer-child``) opens the store and loops over
   message ingests (``RecallController.on_message_added``), node batches (nodes, edges and vectors in one
   ``store.write``) and record edits (ingest a user turn, recall it, ``edit_record`` the persisted record),
   while a second thread of the same process recalls continuously. After each returned write call the child
   appends the write to a journal file outside the store and fsyncs it; it prints ``BEGIN`` before each call
   and ``ACK`` once the write is journalled, so a kill whose last line is ``BEGIN`` landed inside a write call
   ("mid-write") and every ``ACK`` the parent reads is in the journal. The parent kills it
   with SIGKILL at a random moment after its first acknowledgement.
2. **Service kills.** ``memory-recall serve`` (real uvicorn on 127.0.0.1, default settings: the packaged
   local embedder) runs as a subprocess while client threads send recalls, ``message_added`` events, node
   batches and record edits over HTTP; every 2xx answer to a write is journalled (fsynced). The parent kills
   the service with SIGKILL at a random moment once the clients have made progress, checks the store and
   restarts the service; the restart time is from process start to the first ``/v1/health`` and recall answers.
   A kill with write requests sent but not answered counts as "mid-write".

After every kill: the store opens (``Store`` and its migrations), ``PRAGMA integrity_check`` is ``ok`` (plus
the FTS5 and foreign key checks of ``Store.check_integrity``), every journalled write is present with its
content (message node ``msg:<floor>`` with its text, batch nodes with their summaries, the record with the
edited text), and no recall record's ``selected_node_ids`` names a missing node. The table and ``--out`` JSON
give kills, mid-write kills, integrity failures, lost acknowledged writes, dangling records and restart times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DB_NAME = "memory-recall.sqlite3"
CHAT = "crash-chat"
VEC_MODEL = "crash-vec"
_WORDS = (
    "storm harbour ring map tower market gate lantern oath debt letter sword ship forest river bridge temple "
    "archive garden secret promise festival winter poison cure crown thief guard merchant priest dragon raven"
).split()


# ---------------------------------------------------------------------------------------------------------------
# Journal and checks
# ---------------------------------------------------------------------------------------------------------------


class Journal:
    """Append-only JSON-lines file of acknowledged writes; every entry is fsynced before ``append`` returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Whole lines only: a line cut by a kill (no newline yet) was never acknowledged to anyone."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1]
    return [json.loads(line) for line in lines]


@dataclass
class Check:
    """Outcome of one post-kill check of the store against the journal."""

    opened: bool = True
    integrity: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    checked_writes: int = 0
    records: int = 0

    @property
    def ok(self) -> bool:
        return self.opened and not self.integrity and not self.lost and not self.dangling


def check_store(data_dir: Path, journal: Path) -> Check:
    """Open the store after a kill and compare it with every journalled write (see the module docstring)."""
    from memory_recall.store import Store

    out = Check()
    db = data_dir / DB_NAME
    try:
        with Store(db) as store:  # opening runs recovery of the WAL and any pending migration
            out.integrity = store.check_integrity()
    except Exception as exc:  # noqa: BLE001 - any failure to open is the finding, reported not raised
        out.opened = False
        out.integrity = [f"store does not open: {type(exc).__name__}: {exc}"]
        return out
    entries = read_journal(journal)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        raw = conn.execute("PRAGMA integrity_check").fetchall()
        if raw != [("ok",)]:
            out.integrity.append(f"PRAGMA integrity_check: {raw[:3]}")
        summaries: dict[tuple[str, str], str | None] = {
            (c, n): s
            for c, n, s in conn.execute("SELECT chat_id, node_id, json_extract(json, '$.fields.summary') FROM nodes")
        }
        records = {
            (c, int(f)): json.loads(j)
            for c, f, j in conn.execute("SELECT chat_id, user_floor, json FROM recall_records")
        }
    finally:
        conn.close()
    for e in entries:
        chat = e["chat"]
        if e["k"] == "msg":
            got = summaries.get((chat, f"msg:{e['floor']}"), "<missing>")
            if got != e["text"]:
                out.lost.append(f"message floor {e['floor']}: {got!r:.60}")
        elif e["k"] == "nodes":
            for nid, summary in zip(e["ids"], e["summaries"], strict=True):
                got = summaries.get((chat, nid), "<missing>")
                if got != summary:
                    out.lost.append(f"node {nid}: {got!r:.60}")
        elif e["k"] == "edit":
            rec = records.get((chat, e["floor"]))
            if rec is None or rec.get("injection_text") != e["text"] or not rec.get("manually_edited"):
                out.lost.append(f"record edit floor {e['floor']}: {rec and rec.get('injection_text')!r:.60}")
        out.checked_writes += 1
    out.records = len(records)
    for (chat, floor), rec in sorted(records.items()):
        missing = [n for n in rec.get("selected_node_ids", ()) if (chat, n) not in summaries]
        if missing:
            out.dangling.append(f"record {chat}/{floor} -> {missing[:3]}")
    return out


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


# ---------------------------------------------------------------------------------------------------------------
# Phase 1: writer process
# ---------------------------------------------------------------------------------------------------------------


def _text(rng: random.Random, tag: str) -> str:
    w = [rng.choice(_WORDS) for _ in range(4)]
    return f"Alice saw the {w[0]} and the {w[1]} near the {w[2]}; the {w[3]} mattered ({tag})."


def writer_child(data_dir: Path, journal_path: Path, seed: int) -> int:
    """The killed process: journalled writes in the main thread, recalls in a second thread, until killed."""
    from memory_recall.controller import RecallController
    from memory_recall.model.chat import ChatMessage
    from memory_recall.model.graph import Edge, Node
    from memory_recall.settings import RecallSettings
    from memory_recall.store import Store

    rng = random.Random(seed)
    store = Store.open(data_dir)
    ctl = RecallController(store, RecallSettings(), embedder=None)
    journal = Journal(journal_path)
    # Floors and ids continue from what earlier runs left, so every write of every run is unique.
    base = (seed % 400 + 1) * 20_000  # floors stay below the 10M limit and below the recall floors
    print("READY", flush=True)

    def recalls() -> None:
        qrng = random.Random(seed + 1)
        k = 0
        while True:
            k += 1
            time.sleep(qrng.uniform(0.0, 0.02))  # a reader, not a spin loop starving the writer of the GIL
            ctl.run_recall({
                "chat_id": CHAT, "messages": [{"floor": 9_500_000 + k, "role": "user", "text": _text(qrng, "q")}],
                "target_user_floor": 9_500_000 + k, "dry_run": True,
            })
            print("RECALLED", flush=True)

    threading.Thread(target=recalls, daemon=True).start()
    i = 0
    while True:
        i += 1
        op = rng.random()
        floor = base + i
        if op < 0.4:
            text = _text(rng, f"m{floor}")
            print(f"BEGIN msg {floor}", flush=True)
            ctl.on_message_added(CHAT, ChatMessage(floor=floor, role="user", speaker="Traveller", text=text))
            journal.append({"k": "msg", "chat": CHAT, "floor": floor, "text": text})
            print(f"ACK msg {floor}", flush=True)
        elif op < 0.75:
            ids = [f"n{floor}-{j}" for j in range(20)]
            summaries = [_text(rng, nid) for nid in ids]
            nodes = [
                Node(id=nid, type="event", seq=floor, seq_range=(floor, floor),
                     fields={"title": f"batch {floor}", "summary": s}, importance=5.0)
                for nid, s in zip(ids, summaries, strict=True)
            ]
            edges = [Edge(id=f"{a}>{b}", from_id=a, to_id=b, strength=0.5) for a, b in zip(ids, ids[1:], strict=False)]
            vecs = np.random.default_rng(floor).standard_normal((len(ids), 16)).astype(np.float32)
            print(f"BEGIN nodes {floor}", flush=True)
            with store.write(CHAT) as w:
                w.upsert_nodes(nodes)
                w.upsert_edges(edges)
                w.put_embeddings(VEC_MODEL, [(nid, vecs[j], f"h{nid}") for j, nid in enumerate(ids)])
            journal.append({"k": "nodes", "chat": CHAT, "ids": ids, "summaries": summaries})
            print(f"ACK nodes {floor}", flush=True)
        else:
            text = _text(rng, f"u{floor}")
            print(f"BEGIN msg {floor}", flush=True)
            msg = ChatMessage(floor=floor, role="user", speaker="Traveller", text=text)
            ctl.on_message_added(CHAT, msg)
            journal.append({"k": "msg", "chat": CHAT, "floor": floor, "text": text})
            print(f"ACK msg {floor}", flush=True)
            print(f"BEGIN recall {floor}", flush=True)
            resp = ctl.run_recall({"chat_id": CHAT, "messages": [msg.model_dump()], "target_user_floor": floor})
            print(f"ACK recall {floor}", flush=True)
            if resp.record is not None:
                edited = f"edited record {floor}: {_text(rng, 'e')}"
                print(f"BEGIN edit {floor}", flush=True)
                ctl.edit_record(CHAT, floor, edited)
                journal.append({"k": "edit", "chat": CHAT, "floor": floor, "text": edited})
                print(f"ACK edit {floor}", flush=True)


def run_writer_kills(workdir: Path, kills: int, *, seed: int = 9, log: Any = None) -> dict[str, Any]:
    """Kill the writer child ``kills`` times; returns the phase's figures (see :func:`_summary`)."""
    data_dir = workdir / "writer"
    data_dir.mkdir(parents=True, exist_ok=True)
    journal = workdir / "writer-journal.jsonl"
    rng = random.Random(seed)
    stats = _Stats("writer")
    for run in range(kills):
        proc = subprocess.Popen(
            [sys.executable, __file__, "--writer-child", str(data_dir), str(journal), str(run)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            while not any(line.startswith("ACK") for line in lines):
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError("writer exited early: " + (proc.stderr.read() if proc.stderr else ""))
                lines.append(line.strip())
            time.sleep(rng.uniform(0.0, 1.0))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=60)
        lines += out.splitlines()
        if proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"writer ended with {proc.returncode} before the kill: {err[-2000:]}")
        stats.recalls += sum(line == "RECALLED" for line in lines)
        lines = [line for line in lines if line != "RECALLED"]
        stats.kills += 1
        stats.mid_write += bool(lines and lines[-1].startswith("BEGIN"))
        stats.add(check_store(data_dir, journal), run, log)
    return stats.summary(read_journal(journal))


# ---------------------------------------------------------------------------------------------------------------
# Phase 2: the service
# ---------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(data_dir: Path, port: int) -> list[str]:
    """``memory-recall serve`` as a user runs it (default settings: the packaged local embedder)."""
    return [sys.executable, "-m", "memory_recall.cli", "serve", "--data-dir", str(data_dir), "--port", str(port)]


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Until ``/v1/health`` answers 200 and a recall answers 200 (raises if the process dies or time runs out)."""
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=30) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the service exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("the service did not answer in time")
            try:
                if client.get("/v1/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        r = client.post("/v1/recall", json={"chat_id": CHAT, "query_text": "where is the ring?", "dry_run": True})
        if r.status_code != 200:
            raise RuntimeError(f"recall after restart answered {r.status_code}: {r.text[:300]}")


class _Clients:
    """Client threads hammering the service across restarts; every 2xx write is journalled."""

    def __init__(self, url: str, journal: Journal, threads: int, seed: int) -> None:
        self.url = url
        self.journal = journal
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked = 0
        self.in_flight = 0
        self.counts: dict[str, int] = {}
        self.unexpected: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(t, seed), daemon=True) for t in range(threads)]

    def __enter__(self) -> _Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _count(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        with self.lock:
            self.in_flight += 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1

    def _ack(self, entry: dict[str, Any]) -> None:
        self.journal.append(entry)
        with self.lock:
            self.acked += 1

    def _check(self, r: Any, what: str) -> bool:
        if 200 <= r.status_code < 300:
            return True
        # A 5xx from a store killed mid-request is impossible (the process is gone); anything else is a finding.
        with self.lock:
            self.unexpected.append(f"{what}: {r.status_code} {r.text[:200]}")
        return False

    def _run(self, t: int, seed: int) -> None:
        import httpx

        rng = random.Random(seed * 100 + t)
        i = 0
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                i += 1
                floor = (t + 1) * 1_000_000 + i
                try:
                    self._one(client, rng, floor)
                except httpx.TransportError:
                    # The service is down (killed or restarting): not an answer, nothing acknowledged.
                    self._count("refused")
                    time.sleep(0.05)

    def _message(self, client: Any, floor: int, text: str) -> bool:
        msg = {"floor": floor, "role": "user", "speaker": "Traveller", "text": text}
        with self._write():
            r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "message": msg})
        if self._check(r, "message_added"):
            self._ack({"k": "msg", "chat": CHAT, "floor": floor, "text": text})
            self._count("message")
            return True
        return False

    def _one(self, client: Any, rng: random.Random, floor: int) -> None:
        op = rng.random()
        if op < 0.4:
            body = {"chat_id": CHAT, "messages": [{"floor": floor, "role": "user", "text": _text(rng, "q")}],
                    "target_user_floor": floor}
            if self._check(client.post("/v1/recall", json=body), "recall"):
                self._count("recall")
        elif op < 0.65:
            self._message(client, floor, _text(rng, f"m{floor}"))
        elif op < 0.85:
            ids = [f"s{floor}-{j}" for j in range(5)]
            summaries = [_text(rng, nid) for nid in ids]
            nodes = [
                {"id": nid, "type": "event", "seq": floor, "seq_range": [floor, floor],
                 "fields": {"title": f"batch {floor}", "summary": s}}
                for nid, s in zip(ids, summaries, strict=True)
            ]
            with self._write():
                r = client.post(f"/v1/chats/{CHAT}/nodes", json={"nodes": nodes})
            if self._check(r, "nodes"):
                self._ack({"k": "nodes", "chat": CHAT, "ids": ids, "summaries": summaries})
                self._count("nodes")
        else:
            text = _text(rng, f"u{floor}")
            if not self._message(client, floor, text):
                return
            msg = {"floor": floor, "role": "user", "speaker": "Traveller", "text": text}
            r = client.post("/v1/recall", json={"chat_id": CHAT, "messages": [msg], "target_user_floor": floor})
            if not self._check(r, "recall") or r.json().get("record") is None:
                return
            self._count("recall")
            edited = f"edited record {floor}: {_text(rng, 'e')}"
            with self._write():
                r = client.put(f"/v1/chats/{CHAT}/records/{floor}", json={"injection_text": edited})
            if self._check(r, "record edit"):
                self._ack({"k": "edit", "chat": CHAT, "floor": floor, "text": edited})
                self._count("edit")


def run_service_kills(
    workdir: Path, kills: int, *, seed: int = 10, clients: int = 4, log: Any = None
) -> dict[str, Any]:
    """Kill the service ``kills`` times under ``clients`` client threads; returns the phase's figures."""
    data_dir = workdir / "service"
    data_dir.mkdir(parents=True, exist_ok=True)
    journal_path = workdir / "service-journal.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rng = random.Random(seed)
    stats = _Stats("service")
    journal = Journal(journal_path)
    server_log = open(workdir / "service.log", "ab")  # noqa: SIM115 - kept open across restarts
    env = dict(os.environ, MEMORY_RECALL_CONFIG="", MEMORY_RECALL_PROFILE="app")
    # The chat exists before the first client recalls (a recall for a chat the store does not hold is a 404):
    # one node, not journalled (check_store looks only for what the journal holds).
    from memory_recall.store import Store

    with Store(data_dir / DB_NAME) as store:
        store.upsert_nodes(CHAT, [{"id": "seed", "type": "event", "fields": {"title": "seed"}}])
    try:
        with _Clients(url, journal, clients, seed) as cl:
            for run in range(kills):
                start = time.perf_counter()
                proc = subprocess.Popen(serve_command(data_dir, port), stdout=server_log, stderr=server_log, env=env)
                try:
                    wait_ready(url, proc)
                    stats.restart_s.append(time.perf_counter() - start)
                    acked = cl.acked
                    deadline = time.monotonic() + 60
                    # At least one acknowledged write of this run, so every kill finds the service busy.
                    while cl.acked <= acked and time.monotonic() < deadline:
                        time.sleep(0.01)
                    time.sleep(rng.uniform(0.0, 1.5))
                    stats.mid_write += cl.in_flight > 0
                finally:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=60)
                stats.kills += 1
                stats.add(check_store(data_dir, journal_path), run, log)
            counts = dict(cl.counts)
            unexpected = list(cl.unexpected)
            stats.recalls = counts.get("recall", 0)
    finally:
        journal.close()
        server_log.close()
    # Last: the service restarts once more on the final store and answers.
    start = time.perf_counter()
    proc = subprocess.Popen(
        serve_command(data_dir, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        wait_ready(url, proc)
        stats.restart_s.append(time.perf_counter() - start)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    out = stats.summary(read_journal(journal_path))
    out["client_answers"] = counts
    out["unexpected_answers"] = unexpected
    return out


# ---------------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------------


class _Stats:
    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.kills = 0
        self.mid_write = 0
        self.failed_open = 0
        self.integrity_failures = 0
        self.lost = 0
        self.dangling = 0
        self.restart_s: list[float] = []
        self.problems: list[str] = []
        self.started = time.perf_counter()
        self.records = 0
        self.recalls = 0

    def add(self, check: Check, run: int, log: Any) -> None:
        self.failed_open += not check.opened
        self.integrity_failures += bool(check.integrity)
        self.lost += len(check.lost)
        self.dangling += len(check.dangling)
        self.records = check.records
        for p in (*check.integrity, *check.lost, *check.dangling)[:5]:
            self.problems.append(f"{self.phase} kill {run}: {p}")
        if log is not None:
            log(f"{self.phase} kill {run + 1}: {'ok' if check.ok else 'FAIL'} ({check.checked_writes} journalled "
                f"writes checked, {check.records} records)")

    def summary(self, journal: list[dict[str, Any]]) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for e in journal:
            kinds[e["k"]] = kinds.get(e["k"], 0) + 1
        restart_ms = [s * 1000 for s in self.restart_s]
        return {
            "phase": self.phase, "kills": self.kills, "mid_write_kills": self.mid_write,
            "open_failures": self.failed_open, "integrity_failures": self.integrity_failures,
            "lost_acknowledged_writes": self.lost, "dangling_records": self.dangling,
            "acknowledged_writes": len(journal), "acknowledged_by_kind": kinds, "records_at_end": self.records,
            "concurrent_recalls": self.recalls,
            "restart_ms_p50": _pct(restart_ms, 50), "restart_ms_max": round(max(restart_ms), 1) if restart_ms else None,
            "duration_s": round(time.perf_counter() - self.started, 1), "problems": self.problems[:50],
        }


def table(results: Sequence[dict[str, Any]]) -> str:
    head = ("phase", "kills", "mid-write", "integrity fail", "lost acked", "dangling", "acked writes",
            "recalls", "restart p50 ms", "restart max ms", "duration s")
    rows = [head] + [
        (r["phase"], r["kills"], r["mid_write_kills"], r["integrity_failures"] + r["open_failures"],
         r["lost_acknowledged_writes"], r["dangling_records"], r["acknowledged_writes"], r["concurrent_recalls"],
         r["restart_ms_p50"] if r["restart_ms_max"] is not None else "-",
         r["restart_ms_max"] if r["restart_ms_max"] is not None else "-", r["duration_s"])
        for r in results
    ]
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--writer-child":
        return writer_child(Path(argv[1]), Path(argv[2]), int(argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writer-kills", type=int, default=100)
    parser.add_argument("--service-kills", type=int, default=100)
    parser.add_argument("--clients", type=int, default=4, help="client threads during the service phase")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--workdir", type=Path, default=None, help="keep the stores and journals here")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="crash-")))
        workdir.mkdir(parents=True, exist_ok=True)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        results = []
        if args.writer_kills:
            results.append(run_writer_kills(workdir, args.writer_kills, seed=args.seed, log=print))
        if args.service_kills:
            results.append(run_service_kills(workdir, args.service_kills, seed=args.seed + 1,
                                             clients=args.clients, log=print))
    print()
    print(f"crash test started {started}")
    print(table(results))
    for r in results:
        for p in r["problems"]:
            print("PROBLEM", p)
        if r.get("unexpected_answers"):
            odd = r["unexpected_answers"]
            print(f"{r['phase']}: {len(odd)} unexpected answers, first: {odd[:3]}")
        if r.get("client_answers"):
            print(f"{r['phase']} client answers: {r['client_answers']}")
    if args.out:
        args.out.write_text(json.dumps({"started": started, "results": results}, indent=2) + "\n")
    bad = any(r["integrity_failures"] or r["open_failures"] or r["lost_acknowledged_writes"] or r["dangling_records"]
              or r.get("unexpected_answers") for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
