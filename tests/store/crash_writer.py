"""Write numbered batches into a store until killed; the crash and concurrency tests drive it as a subprocess.

    python crash_writer.py DB CHAT [--nodes K] [--batches N] [--dim D] [--pause SECONDS]

Batch ``n`` writes, in one ``store.write`` transaction, ``K`` nodes (ids ``b<n>-<i>``, title ``batch<n>``),
``K - 1`` edges chaining them, one ``D``-dim vector per node and
``history.last_processed_assistant_floor = n``. It prints ``READY <first batch>`` once the store is open,
``BEGIN <n>`` inside each transaction and ``ACK <n>`` after its commit, flushing each line, so the parent
knows exactly which batches were acknowledged. The first
batch is the number of complete batches already in the store; ``--batches 0`` (the default) writes forever;
``--pause`` sleeps between batches (outside the transaction).

:func:`verify_batches` is the checker both tests share: it asserts that the store holds whole batches only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from memory_recall.model.graph import Edge, Node
from memory_recall.model.state import HistoryState
from memory_recall.store import Store, StoreReader

MODEL = "crash-model"


def node_id(n: int, i: int) -> str:
    return f"b{n:06d}-{i:04d}"


def batch_term(n: int) -> str:
    return f"batch{n}"


def vector(n: int, i: int, dim: int) -> np.ndarray:
    return (np.arange(dim, dtype=np.float32) + np.float32(n * 1000 + i)).astype(np.float32)


def batch(n: int, k: int) -> tuple[list[Node], list[Edge]]:
    nodes = [
        Node(
            id=node_id(n, i),
            type="event",
            seq=n,
            fields={
                "title": batch_term(n),
                "summary": f"第{n}批的第{i}个节点 marker {i}",
                "batch": n,
                "index": i,
            },
            importance=(i % 10) + 0.5,
            created_time=1_700_000_000_000 + n,
        )
        for i in range(k)
    ]
    edges = [
        Edge(id=f"{node_id(n, i)}>{i + 1}", from_id=node_id(n, i), to_id=node_id(n, i + 1), strength=0.5)
        for i in range(k - 1)
    ]
    return nodes, edges


def verify_batches(
    reader: StoreReader, chat: str, k: int, dim: int, *, fts_batches: Sequence[int] = ()
) -> int:
    """Assert that ``chat`` holds batches 0..m-1, each complete and consistent; return m.

    Nodes, edges, vectors and the history floor must all agree; ``fts_batches`` are also searched by BM25.
    """
    nodes = reader.get_nodes(chat)
    per_batch = Counter(int(node.fields["batch"]) for node in nodes)
    m = len(per_batch)
    assert sorted(per_batch) == list(range(m)), f"batches are not 0..{m - 1}: {sorted(per_batch)}"
    partial = {b: c for b, c in per_batch.items() if c != k}
    assert not partial, f"partial batches: {partial}"
    assert [node.id for node in nodes] == [node_id(b, i) for b in range(m) for i in range(k)]
    edges = reader.get_edges(chat)
    assert [e.id for e in edges] == [f"{node_id(b, i)}>{i + 1}" for b in range(m) for i in range(k - 1)]
    ids, mat = reader.get_embeddings(chat, MODEL)
    assert ids == [node.id for node in nodes]
    if m:
        expected = np.stack([vector(b, i, dim) for b in range(m) for i in range(k)])
        assert np.array_equal(mat, expected)
    assert reader.embedding_hashes(chat, MODEL) == {node.id: f"h{node.id}" for node in nodes}
    assert reader.get_history(chat).last_processed_assistant_floor == m - 1
    for b in fts_batches:
        if b < m:
            hits = reader.bm25(chat, [batch_term(b)], limit=k + 10)
            assert sorted(i for i, _ in hits) == [node_id(b, i) for i in range(k)], f"FTS rows of batch {b}"
    return m


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("chat")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--batches", type=int, default=0)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args(argv)
    k, dim = args.nodes, args.dim
    store = Store(args.db)
    first = store.stats(args.chat)["node_count"] // k
    print(f"READY {first}", flush=True)
    n = first
    while args.batches == 0 or n < first + args.batches:
        with store.write(args.chat) as w:
            print(f"BEGIN {n}", flush=True)
            # Built inside the transaction on purpose: a kill then most likely lands mid-batch.
            nodes, edges = batch(n, k)
            w.upsert_nodes(nodes)
            w.upsert_edges(edges)
            w.put_embeddings(
                MODEL, [(node.id, vector(n, i, dim), f"h{node.id}") for i, node in enumerate(nodes)]
            )
            w.set_history(HistoryState(last_processed_assistant_floor=n))
        print(f"ACK {n}", flush=True)
        n += 1
        if args.pause:
            time.sleep(args.pause)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
