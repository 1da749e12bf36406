"""The background embedding worker: a write's request names its nodes, so the pass reads their rows only; requests
of one chat pile up into one pass, and any request without ids makes it a whole-chat pass."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from memory_recall.model.graph import Node
from memory_recall.providers import LocalEmbedder, local_engine_available
from memory_recall.service.background import EmbeddingWorker, SyncJobs
from memory_recall.store import Store

CHAT = "worker-chat"


class _Reads:
    """The store, recording the node ids of each ``embedding_status`` read (``None``: the whole chat)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.reads: list[list[str] | None] = []

    def embedding_status(self, chat_id: str, model_id: str, node_ids: Collection[str] | None = None) -> Any:
        self.reads.append(None if node_ids is None else sorted(node_ids))
        return self._store.embedding_status(chat_id, model_id, node_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _worker(store: Any, embedder: Any) -> EmbeddingWorker:
    return EmbeddingWorker(lambda: store, embedder, batch_size=8, jobs=SyncJobs())


def test_requests_pile_up_and_a_whole_chat_request_wins() -> None:
    worker = _worker(None, object())
    worker.request("a", ["n2"])
    worker.request("b")
    worker.request("a", ["n1", "n2"])
    assert worker._pending == {"a": {"n1", "n2"}, "b": None}
    worker.request("a")
    worker.request("a", ["n3"])
    assert worker._pending == {"a": None, "b": None}
    assert list(worker._pending) == ["a", "b"]  # request order


@pytest.mark.skipif(not local_engine_available(), reason="the local embedding engine is not installed")
def test_a_pass_reads_the_requested_rows_only(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        with store.write(CHAT) as w:
            w.upsert_nodes([Node(id=f"n{i}", type="event", seq=i, fields={"summary": f"Turn {i} at the docks."})
                            for i in range(6)])
        reads = _Reads(store)
        embedder = LocalEmbedder()
        worker = _worker(reads, embedder)

        async def passes(*requests: list[str] | None) -> None:
            task = asyncio.create_task(worker.run())
            for ids in requests:
                worker.request(CHAT, ids)
            while worker.busy_with(CHAT):
                await asyncio.sleep(0.01)
            await worker.close(task)

        asyncio.run(passes(["n1"], ["n4", "n1"]))
        assert reads.reads[-1] == ["n1", "n4"] and all(r is not None for r in reads.reads)
        assert sorted(store.embedding_hashes(CHAT, embedder.model_id)) == ["n1", "n4"]
        worker = _worker(reads, embedder)
        asyncio.run(passes(["n2"], None))
        assert reads.reads[-1] is None  # the whole-chat request took the pass over
        assert sorted(store.embedding_hashes(CHAT, embedder.model_id)) == [f"n{i}" for i in range(6)]
