"""Cost of one ``message_added`` event on a large chat: ingest and the ``embed_missing`` that follows.

Usage::

    python scripts/bench_ingest_event.py --messages 10000 --events 5 --data-dir /tmp/bench-ingest

1. **Chat.** Builds (or reuses, in ``--data-dir``) a chat of ``--messages`` messages with the real ingestion
   (``ingest_messages`` in batches of 1000): three speakers, seeded random turns that mention places, people
   and quoted item names (so the chat has character and entity nodes and mention edges); then gives every node
   a vector with a trivial deterministic embedder (:class:`FastEmbedder`: 8 dimensions from the text hash,
   microseconds per text), so the embedding figure below is the bookkeeping, not a model.
2. **Ingest.** For each of ``--events`` new messages, on two copies of that store, one message is ingested:
   ``full`` = the whole-chat read (``load_view``: every node of the chat, edges two rings out) + plan + write,
   as before; ``targeted`` = ``ingest_messages`` as it is now (``load_view_targeted`` with the store's ingest
   cache, warm after the store's first event; the first timed event of the run is that cold one). The two copies
   get the same messages and must end in the same graph (checked: byte-equal node/edge dumps).
3. **embed_missing.** After each ingest, ``embed_missing`` with the fast embedder on each copy: ``full`` =
   the generic path (every node parsed), ``targeted`` = the store's ``embedding_status`` read plus the digest
   memo, warmed by one call before the timed events, as in a running service (that first call, which parses
   every node, is printed apart).

Prints CPU time (``time.process_time``, this process) and wall time per event, median and max, side by side.
The machine may be shared: compare the two columns of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory_recall.ingest.messages import ingest_messages, load_view, plan_messages
from memory_recall.model import ChatMessage
from memory_recall.providers import cache
from memory_recall.providers.cache import embed_missing
from memory_recall.store import Store

CHAT = "bench-chat"
NOW = 1_767_225_600_000
SPEAKERS = ("Ash", "Mara Vell", "Tobin Reed")
NAMES = ("Saltmere", "the Gull Inn", "Harbor Gate", "Old Quay", "Brinewood", "Captain Reyes", "Lady Orsolya",
         "Fenwick", "Mara", "Tobin")
WORDS = ("the tide turned and we walked along quiet docks talking about ships debts storms lanterns rope maps "
         "salt bread letters a broken compass north wind").split()


class FastEmbedder:
    """A trivial deterministic embedder (8 dimensions from the SHA-256 of the text): the timing script's
    stand-in, so ``embed_missing`` figures measure the bookkeeping, not a model."""

    model_id = "bench-fast-8"
    dim = 8

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:8], np.uint8).astype(np.float32) + 1.0
                for t in texts]
        m = np.asarray(rows, np.float32).reshape(len(texts), 8)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]


def messages(start: int, n: int, seed: int = 7) -> list[ChatMessage]:
    """``n`` seeded turns from floor ``start``: the user (``Ash``) on even floors, the others on odd floors."""
    rng = random.Random(seed * 1_000_003 + start)
    out = []
    for floor in range(start, start + n):
        speaker = SPEAKERS[0] if floor % 2 == 0 else rng.choice(SPEAKERS[1:])
        words = [rng.choice(WORDS) for _ in range(rng.randint(12, 40))]
        for _ in range(rng.randint(0, 2)):
            name = rng.choice((*NAMES, f'"Item {rng.randint(0, 300)}"'))
            words.insert(rng.randrange(len(words)), name)
        out.append(ChatMessage(floor=floor, role="user" if floor % 2 == 0 else "assistant", speaker=speaker,
                               text=" ".join(words).capitalize() + ".", send_time_ms=NOW - (10**9) + floor * 60_000))
    return out


def build(path: Path, n: int) -> dict[str, Any]:
    with Store(path) as store:
        if store.stats(CHAT)["node_count"] == 0:
            for lo in range(0, n, 1000):
                ingest_messages(store, CHAT, messages(lo, min(1000, n - lo)), now_ms=NOW)
            embed_missing(store, CHAT, FastEmbedder(), batch_size=512)
        return store.stats(CHAT)


def ingest_full(store: Store, message: ChatMessage, now_ms: int) -> None:
    """The previous path: whole-chat read (``load_view``), plan, write (same write as ``ingest_messages``)."""
    with store.read() as r:
        plan = plan_messages([message], load_view(r, CHAT, [message]), now_ms)
    with store.write(CHAT) as w:
        if plan.nodes:
            w.upsert_nodes(plan.nodes)
        if plan.edges:
            w.upsert_edges(plan.edges)


def ingest_targeted(store: Store, message: ChatMessage, now_ms: int) -> None:
    ingest_messages(store, CHAT, [message], now_ms=now_ms)


class _GenericStore:
    """The store seen through the generic ``EmbeddingStore`` protocol only (no ``embedding_status``): the
    previous ``embed_missing`` path."""

    def __init__(self, store: Store) -> None:
        self._s = store

    def __getattr__(self, name: str) -> Any:
        if name == "embedding_status":
            raise AttributeError(name)
        return getattr(self._s, name)


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return (time.process_time() - c0) * 1000, (time.perf_counter() - w0) * 1000, out


def dump(store: Store) -> str:
    nodes = sorted(n.model_dump_json() for n in store.get_nodes(CHAT))
    edges = sorted(e.model_dump_json() for e in store.get_edges(CHAT))
    return "\n".join(nodes + edges)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=5)
    ap.add_argument("--data-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    base = args.data_dir / f"chat-{args.messages}.sqlite3"
    t0 = time.perf_counter()
    stats = build(base, args.messages)
    print(f"chat: {stats['node_count']} nodes {stats['nodes_by_type']}, {stats['edge_count']} edges "
          f"(built/reused in {time.perf_counter() - t0:.1f} s)")
    copies = {}
    for name in ("full", "targeted"):
        dst = args.data_dir / f"run-{name}.sqlite3"
        for suffix in ("", "-wal", "-shm"):
            Path(str(dst) + suffix).unlink(missing_ok=True)
        shutil.copyfile(base, dst)
        copies[name] = Store(dst)
    fast = FastEmbedder()
    # The first call of a process parses every node (cold digest memo), as the generic path always does.
    cold_cpu, cold_wall, _ = timed(lambda: embed_missing(copies["targeted"], CHAT, fast))
    figures: dict[str, dict[str, list[float]]] = {
        k: {"cpu": [], "wall": []} for k in ("ingest full", "ingest targeted", "embed full", "embed targeted")
    }
    new = messages(args.messages, args.events, seed=11)
    for i, message in enumerate(new):
        now = NOW + (i + 1) * 1000
        # Alternate which variant goes first, so drift of the shared machine hits both alike.
        order = ("full", "targeted") if i % 2 == 0 else ("targeted", "full")
        for name in order:
            store = copies[name]
            ingest = ingest_full if name == "full" else ingest_targeted
            cpu, wall, _ = timed(lambda s=store, f=ingest, m=message, t=now: f(s, m, t))
            figures[f"ingest {name}"]["cpu"].append(cpu)
            figures[f"ingest {name}"]["wall"].append(wall)
            target: Any = _GenericStore(store) if name == "full" else store
            cpu, wall, rep = timed(lambda t=target: embed_missing(t, CHAT, fast))
            assert rep.total >= 1, rep
            figures[f"embed {name}"]["cpu"].append(cpu)
            figures[f"embed {name}"]["wall"].append(wall)
    same = dump(copies["full"]) == dump(copies["targeted"])
    ids_full, m_full = copies["full"].get_embeddings(CHAT, fast.model_id)
    ids_tgt, m_tgt = copies["targeted"].get_embeddings(CHAT, fast.model_id)
    same_vectors = ids_full == ids_tgt and np.array_equal(m_full, m_tgt)
    for s in copies.values():
        s.close()
    print(f"{args.events} one-message events on a {args.messages}-message chat (ms per event; median / max)")
    print(f"{'step':<18}{'CPU median':>12}{'CPU max':>10}{'wall median':>13}{'wall max':>10}")
    for key, v in figures.items():
        print(f"{key:<18}{statistics.median(v['cpu']):>12.1f}{max(v['cpu']):>10.1f}"
              f"{statistics.median(v['wall']):>13.1f}{max(v['wall']):>10.1f}")
    print(f"embed targeted, first call of the process (cold digest memo): CPU {cold_cpu:.1f} ms, "
          f"wall {cold_wall:.1f} ms")
    print(f"same graph on both copies: {same}; same vectors: {same_vectors}; "
          f"digest memo chats: {sum(len(m) for m in cache._DIGESTS.values())}")
    return 0 if same and same_vectors else 1


if __name__ == "__main__":
    sys.exit(main())
