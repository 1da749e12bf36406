"""Background work of the service: the embedding worker and the whole-chat sync jobs.

Usage (inside the running service; :mod:`memory_recall.service.app` wires it)::

    worker = EmbeddingWorker(lambda: store, embedder, batch_size=8, jobs=jobs)
    task = asyncio.create_task(worker.run())
    worker.request("chat-1")          # embed what the chat lacks, soon, in the background
    worker.request("chat-1", ["n7"])  # … or only what a write touched (its rows alone are read)
    await worker.close()

Contract
--------
* **One worker, one chat at a time, small chunks.** The worker takes the requested chats in request order and
  brings each one's vectors up to date with :func:`~memory_recall.providers.embed_missing` in chunks of
  ``batch_size`` nodes. It holds no chat lock: a chunk's vectors are written only for nodes whose text did not
  change meanwhile (``embed_missing`` checks inside the chunk's write), so events and recalls on the same chat
  run between chunks. The engine serves a waiting query before the next passage slice
  (:class:`~memory_recall.providers.embedding.EngineGate`), so a recall's query embedding waits for at most one
  slice. Every event of the service requests its chat here (the event answers before its vectors exist).
* **Failures retry.** An unavailable embedder marks the chat's sync job ``failed`` with the category and the
  chat is requested again after a back-off (5 s doubling to 5 min); a later success marks the job ``done``.
* **Sync jobs** (:class:`SyncJobs`) keep the latest whole-chat sync per chat in memory: ``ingesting`` →
  ``embedding`` → ``done`` (or ``failed``). A restart forgets them (the graph itself is in the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import anyio.to_thread

from memory_recall.errors import EmbeddingUnavailable, MemoryRecallError
from memory_recall.providers import Embedder, embed_missing
from memory_recall.service.schemas import SyncStatus

__all__ = ["EmbeddingWorker", "SyncJobs"]

log = logging.getLogger("memory_recall.service")

#: An event's pass starts this long after its request: the host asks for the turn's recall right after the event,
#: and a passage slice already running when the recall comes would make its query wait (a slice that comes
#: during a recall holds back by itself: EngineGate.recalling). More events of the chat meanwhile join the pass.
EVENT_EMBED_DELAY_S = 0.05
_RETRY_FIRST_S = 5.0
_RETRY_MAX_S = 300.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class SyncJobs:
    """The latest whole-chat sync of each chat (in memory; see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: dict[str, SyncStatus] = {}
        self._ids = itertools.count(1)

    def start(self, chat_id: str, messages: int) -> SyncStatus:
        """A new job in state ``ingesting`` (it replaces the chat's previous job)."""
        job = SyncStatus(
            job_id=f"sync-{next(self._ids)}", chat_id=chat_id, state="ingesting", messages=messages,
            started_at=_now_ms(),
        )
        self._jobs[chat_id] = job
        return job

    def get(self, chat_id: str) -> SyncStatus | None:
        return self._jobs.get(chat_id)

    def _update(self, chat_id: str, job_id: str | None = None, **changes: Any) -> SyncStatus | None:
        job = self._jobs.get(chat_id)
        if job is None or (job_id is not None and job.job_id != job_id):
            return None  # superseded by a newer sync of the chat
        job = job.model_copy(update=changes)
        self._jobs[chat_id] = job
        return job

    def ingested(self, chat_id: str, job_id: str, *, version: int, report: Any, embedding: bool,
                 model_id: str) -> SyncStatus | None:
        """The messages are written; the job waits for the embedding worker unless there is no embedder."""
        return self._update(
            chat_id, job_id, state="embedding" if embedding else "done", version=version,
            nodes_added=report.nodes_added, nodes_updated=report.nodes_updated, nodes_retired=report.nodes_retired,
            embedding_model=model_id, ingested_at=_now_ms(), finished_at=None if embedding else _now_ms(),
        )

    def failed(self, chat_id: str, job_id: str, error: str) -> SyncStatus | None:
        return self._update(chat_id, job_id, state="failed", error=error, finished_at=_now_ms())

    def embedding_progress(self, chat_id: str, done: int, total: int) -> None:
        job = self._jobs.get(chat_id)
        if job is not None and job.state in ("embedding", "failed") and job.ingested_at is not None:
            self._update(chat_id, state="embedding", vectors_done=done, vectors_total=total, error="",
                         failure_category="")

    def embedding_finished(self, chat_id: str, *, error: str = "", category: str = "") -> None:
        job = self._jobs.get(chat_id)
        if job is None or job.ingested_at is None or job.state == "done":
            return
        if error:
            self._update(chat_id, state="failed", error=error, failure_category=category, finished_at=_now_ms())
        else:
            self._update(chat_id, state="done", vectors_done=job.vectors_total, error="", failure_category="",
                         finished_at=_now_ms())

    def forget(self, chat_id: str) -> None:
        self._jobs.pop(chat_id, None)


class EmbeddingWorker:
    """Embeds requested chats in the background (see the module docstring)."""

    def __init__(self, store: Callable[[], Any], embedder: Embedder | None, *, batch_size: int,
                 jobs: SyncJobs) -> None:
        self._store = store
        self.embedder = embedder
        self.batch_size = batch_size
        self.jobs = jobs
        # Requested chats in request order → the node ids to embed (``None``: whatever the chat lacks).
        self._pending: dict[str, set[str] | None] = {}
        self._wake = asyncio.Event()
        self._closing = False
        self._dropped: set[str] = set()
        self._current: str | None = None
        self._retry_s: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def request(self, chat_id: str, node_ids: Collection[str] | None = None) -> None:
        """Embed what ``chat_id`` lacks, after the chats requested before it. ``node_ids``: only those nodes
        need a vector (a write's nodes): the pass reads their rows only, not every node of the chat; requests
        pile up into one pass (any request without ids makes it a whole-chat pass)."""
        if self.embedder is None or self._closing:
            return
        self._dropped.discard(chat_id)
        if node_ids is None:
            self._pending[chat_id] = None
        else:
            wanted = self._pending[chat_id] if chat_id in self._pending else set()
            if wanted is not None:
                wanted.update(node_ids)
            self._pending[chat_id] = wanted
        self._wake.set()

    def busy_with(self, chat_id: str) -> bool:
        """True while ``chat_id`` is being embedded or waits for it."""
        return chat_id == self._current or chat_id in self._pending

    def drop(self, chat_id: str) -> None:
        """The chat was deleted: stop after the current chunk and forget it."""
        self._pending.pop(chat_id, None)
        self._dropped.add(chat_id)
        timer = self._timers.pop(chat_id, None)
        if timer is not None:
            timer.cancel()

    async def run(self) -> None:
        """The worker loop (one task for the service's lifetime; ends on :meth:`close`)."""
        while not self._closing:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            chat_id = next(iter(self._pending))
            if self._pending[chat_id] is not None:  # an event's pass (see EVENT_EMBED_DELAY_S)
                await asyncio.sleep(EVENT_EMBED_DELAY_S)
                if chat_id not in self._pending:  # dropped meanwhile
                    continue
            node_ids = self._pending.pop(chat_id)
            self._current = chat_id
            try:
                await self._embed(chat_id, node_ids)
            finally:
                self._current = None

    async def _embed(self, chat_id: str, node_ids: set[str] | None = None) -> None:
        embedder = self.embedder
        assert embedder is not None

        def stop() -> bool:
            return self._closing or chat_id in self._dropped

        def progress(done: int, total: int) -> None:
            self.jobs.embedding_progress(chat_id, done, total)

        try:
            report = await anyio.to_thread.run_sync(
                lambda: embed_missing(self._store(), chat_id, embedder, batch_size=self.batch_size,
                                      progress=progress, stop=stop, node_ids=node_ids)
            )
        except EmbeddingUnavailable as exc:
            log.warning("background embedding of chat %r failed: %s", chat_id, exc.category)
            self.jobs.embedding_finished(chat_id, error=str(exc), category=exc.category)
            self._retry_later(chat_id)
            return
        except MemoryRecallError as exc:  # the chat vanished or the store is closing
            log.info("background embedding of chat %r stopped: %s", chat_id, exc)
            return
        self._retry_s.pop(chat_id, None)
        if stop():
            return
        if report.total:
            log.info("embedded %d node(s) of chat %r in the background (%.0f ms)", report.total, chat_id,
                     report.elapsed_ms)
        if chat_id not in self._pending:  # else a write requested another pass: the job is not done yet
            self.jobs.embedding_finished(chat_id)

    def _retry_later(self, chat_id: str) -> None:
        delay = self._retry_s.get(chat_id, _RETRY_FIRST_S / 2) * 2
        self._retry_s[chat_id] = min(delay, _RETRY_MAX_S)
        loop = asyncio.get_running_loop()
        self._timers[chat_id] = loop.call_later(self._retry_s[chat_id], self._retry, chat_id)

    def _retry(self, chat_id: str) -> None:
        self._timers.pop(chat_id, None)
        self.request(chat_id)

    async def close(self, task: asyncio.Task[None] | None) -> None:
        """Stop after the current chunk; waits for the loop task to end."""
        self._closing = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wake.set()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
