"""The HTTP service: FastAPI routes over the controller, the ingest rules and the store.

Usage::

    app = create_app(load_settings(), store=Store.open(data_dir))      # an ASGI app (tests, embedding)
    serve("127.0.0.1", 8765, data_dir=None, token=None, settings=load_settings())   # blocks until stopped

Routes (``/v1``; OpenAPI at ``/openapi.json``, docs at ``/docs`` and ``/redoc``, served offline by
:mod:`memory_recall.service.docs`)
------------------------------------------------------------------
===========================================================  ==========================================
``POST   /v1/recall``                                        the recall hook (compute, or replay on
                                                             regenerate/swipe/continue)
``GET    /v1/chats/{chat_id}/records/{floor}``               a record with ``stale``
``PUT    /v1/chats/{chat_id}/records/{floor}``               edit its injection text (manual edit)
``DELETE /v1/chats/{chat_id}/records/{floor}``               drop it
``POST   /v1/chats/{chat_id}/records/{floor}/rerecall``      forced fresh recall of that floor
``POST   /v1/chats/{chat_id}/events``                        message_added/edited/swiped/deleted
``POST   /v1/chats/{chat_id}/sync``, ``GET`` the same        whole-chat sync (202 + job), its progress
``POST   /v1/chats/{chat_id}/nodes``, ``.../edges``          batch upsert
``DELETE /v1/chats/{chat_id}/nodes``, ``.../edges``          batch delete (``{"ids": [...]}``)
``POST   /v1/chats/{chat_id}/import``                        replace the graph with an ST-BME export
``GET    /v1/chats/{chat_id}/export``                        the graph as an ST-BME export
``GET    /v1/chats``, ``GET /v1/chats/{chat_id}/stats``      chat list, counts
``DELETE /v1/chats/{chat_id}``                               delete a chat
``GET    /v1/health`` (no token), ``GET /v1/version``        liveness, versions and embedding model
``GET    /v1/memory``                                        the process's memory: RSS, allocator, trims
===========================================================  ==========================================

Contract
--------
* **Status codes.** Validation of a body, path or query value → 422 with FastAPI's ``detail`` list
  (``loc``/``msg``/``type``) plus a top-level ``error`` naming the first field; :class:`InputError` and
  per-request :class:`ConfigError` (bad ``options``) → 422 the same way; :class:`NotFound` and an unknown chat
  → 404; missing/wrong token → 401; body over ``service.max_body_bytes`` → 413; a ``Host`` header that does
  not name the service → 421 and a body not received within ``service.body_timeout_s`` → 408
  (:mod:`memory_recall.service.auth`; head and idle deadlines: :mod:`memory_recall.service.connections`);
  :class:`StoreError`, :class:`EmbeddingUnavailable`, :class:`LLMUnavailable` → 503 (the server or a provider
  is unwell, the request may be retried). A strict-mode provider failure is *not* an HTTP error: the controller
  completes the recall with ``status="aborted"``, ``reason="strict-mode-violation"`` and the failure category,
  so the host sees why and injects nothing. Anything else is a bug → 500 ``{"error": "internal error"}`` (logged).
* **Concurrency.** Every store, ingest, embedding and recall call runs in a worker thread
  (``anyio.to_thread.run_sync``), never on the event loop. Recalls and writes (events, node/edge batches,
  import, record edits, chat deletion, sync ingestion) go through two separate bounded lanes (:class:`Lanes`):
  at most :data:`RECALL_SLOTS` recalls and :data:`WRITE_SLOTS` writes at once, each lane first come first
  served, so a write never waits for a recall slot nor a recall for a write slot. Recalls are bounded because
  the pipeline is CPU-bound: more recall threads than cores only added contention (service memory grew with
  the number of clients: 1.8 GB at 32 clients on a 10k-node chat, 0.55 GB with the bound). Writes to one chat
  are serialised by a per-chat ``asyncio.Lock`` held for the write only (the store's own lock serialises the
  SQLite writer across chats).
* **Memory.** :func:`serve` caps glibc's malloc arenas at ``service.malloc_arenas`` (2) before any worker
  thread allocates, and a snapshot's large vector buffers get mappings of their own
  (:mod:`memory_recall.heap`): with glibc's defaults the service's heaps crept up for minutes under writes while
  the memory in use stayed flat. While requests come, a :class:`~memory_recall.heap.HeapTrimmer` gives the heaps'
  free pages back every ``service.heap_trim_s`` (5) seconds, so the RSS follows the memory in use.
* **Versions.** A write's response carries the chat version its own transaction committed (for an event that
  changed nothing, the version it read); later writes (a recall's reinforcement, background vectors) give
  later versions.
* **Embedding after writes.** An event, node batch or import answers once its write committed; the background
  worker (:mod:`memory_recall.service.background`: one worker, small chunks, no chat lock held) embeds the
  nodes it wrote (``embedding.status="queued"``), and recall meanwhile uses lexical evidence for the nodes still
  without a vector and counts them in ``vectors_missing``. ``?embed=inline`` embeds the written nodes (never
  the chat's backlog) before the answer, after the chat's lock is released; its failure does not fail the
  write: the response says ``embedding.status="failed"`` with the category and the worker retries. The local
  engine serves waiting queries before passage slices (:class:`~memory_recall.providers.embedding.EngineGate`),
  so a recall's query embedding waits for at most one short slice of any chat's embedding. A whole-chat sync
  answers at once and embeds in the background, as does the re-embedding of every chat at startup when the
  model changed.
* **Shutdown.** The lifespan handler waits (``service.shutdown_timeout_s``) for in-flight writes, then closes
  the store if the app opened it (a store passed to :func:`create_app` belongs to the caller).
* **Logs** never contain query or message text unless the ``memory_recall.service`` logger is at DEBUG. Under
  :func:`serve` every ``memory_recall.*`` logger writes to stderr through uvicorn's default handler and
  formatter at the server's log level (:func:`log_config`): one ``INFO:     recall chat=… -> status/reason …``
  line per recall.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from typing import Annotated, Any, Literal, TypeVar

import anyio.to_thread
from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from memory_recall.blas import pin_single_thread
from memory_recall.controller import ChatEventReport, RecallController, RecallRequest, RecallResponse, RecordStatus
from memory_recall.errors import (
    ConfigError,
    EmbeddingUnavailable,
    InputError,
    LLMUnavailable,
    MemoryRecallError,
    NotFound,
    StoreError,
)
from memory_recall.heap import HeapTrimmer, anonymous_rss, heap_usage
from memory_recall.ingest import export_stbme, import_stbme_report, ingest_messages
from memory_recall.ingest.messages import sync_messages
from memory_recall.model.chat import ChatMessage
from memory_recall.pipeline.retrieve import prepare_snapshot
from memory_recall.providers import Embedder, embed_missing
from memory_recall.service.auth import (
    OPEN_PATHS,
    BodyLimit,
    HostCheck,
    TokenAuth,
    allowed_host_names,
    check_bind,
    resolve_token,
    warn_if_shared,
)
from memory_recall.service.background import EmbeddingWorker, SyncJobs
from memory_recall.service.docs import ASSETS_PATH, DOCS_PATH, REDOC_PATH, install_docs
from memory_recall.service.openapi import install_openapi
from memory_recall.service.schemas import (
    ChatEvent,
    ChatList,
    ChatStats,
    ChatSummary,
    DeleteResult,
    EdgeBatch,
    EmbeddingOutcome,
    ErrorBody,
    EventResult,
    HealthBody,
    HeapBody,
    IdBatch,
    ImportResult,
    MemoryBody,
    MessageAdded,
    MessageDeleted,
    MessageEdited,
    MessageSwiped,
    NodeBatch,
    RecordEdit,
    RerecallBody,
    StbmeExport,
    StbmeImport,
    SyncRequest,
    SyncStatus,
    VersionBody,
    WriteResult,
)
from memory_recall.settings import RecallSettings
from memory_recall.store import Store, validate_chat_id
from memory_recall.store.snapshot import SnapshotCache

__all__ = ["API_VERSION", "create_app", "log_config", "serve"]

API_VERSION = "v1"
#: Nodes per chunk of background embedding (one vector write each). A query embedding waits behind one engine
#: slice of a chunk at most (:class:`~memory_recall.providers.embedding.EngineGate`), not behind the chunk.
BACKGROUND_EMBED_BATCH = 8
#: Recalls (and re-recalls) running at once; the others wait for a slot on the event loop (see Concurrency).
RECALL_SLOTS = max(2, min(8, os.cpu_count() or 2))
#: Writes (events, batches, imports, record edits, syncs) running at once, in their own lane: SQLite takes one
#: writer at a time, so more would only wait there, holding threads.
WRITE_SLOTS = 2
#: How a write sees to the vectors of the nodes it wrote (the ``embed`` query parameter of the write routes).
EmbedMode = Literal["background", "inline", "none"]
try:
    __version__ = _pkg_version("memory-recall")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0+unknown"
log = logging.getLogger("memory_recall.service")
T = TypeVar("T")



def _decimal(value: Any) -> Any:
    # A path floor is written in ASCII digits: pydantic's lax int would also read "4.0", "+4", " 4" and "4_0".
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be written in decimal digits")
    return value


# The chat id rules are checked by validate_chat_id (its messages name the rule); the OpenAPI document states them
# as a pattern (memory_recall.service.openapi).
ChatId = Annotated[str, Path(min_length=1, max_length=128, description="Chat id (validate_chat_id rules)")]
Embed = Annotated[
    Literal["background", "inline"],
    Query(description="`background`: answer after the write, the vectors follow (recalls meanwhile count the "
                      "nodes still without one in `vectors_missing`); `inline`: embed the written nodes first"),
]
Floor = Annotated[int, Path(ge=0, le=10_000_000, description="User floor of the record"), BeforeValidator(_decimal)]

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token"},
    404: {"model": ErrorBody, "description": "Unknown chat, record or message"},
    405: {"model": ErrorBody, "description": "Method not allowed on this path; `Allow` lists the methods it has"},
    408: {"model": ErrorBody, "description": "Body not received within service.body_timeout_s"},
    413: {"model": ErrorBody, "description": "Body over service.max_body_bytes"},
    421: {"model": ErrorBody, "description": "The Host header does not name this service"},
    422: {"model": ErrorBody, "description": "Validation error; `error` names the first field"},
    503: {"model": ErrorBody, "description": "Store or provider unavailable"},
}


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------------------------
# Error mapping (the one place the error tree becomes status codes)
# ---------------------------------------------------------------------------------------------------------------


def _field_loc(field: str, root: str) -> list[str | int]:
    """``"nodes[3].importance"`` → ``[root, "nodes", 3, "importance"]``."""
    loc: list[str | int] = [root]
    for part in field.replace("[", ".").replace("]", "").split("."):
        if part:
            loc.append(int(part) if part.isdigit() else part)
    return loc


def _loc_text(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc)


def _validation_response(detail: list[dict[str, Any]]) -> JSONResponse:
    first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
    return JSONResponse(status_code=422, content={"error": f"{_loc_text(first['loc'])}: {first['msg']}",
                                                  "detail": detail})


def _body_problem(cause: BaseException | None) -> str | None:
    """One line naming why a request body could not be decoded, or ``None`` when the cause is unknown."""
    if isinstance(cause, RecursionError):
        return "body: JSON nested too deeply"
    if isinstance(cause, UnicodeDecodeError):
        return f"body: not valid UTF-8 (byte {cause.start})"
    return None


def _path_methods(request: Request) -> list[str]:
    """Every method some route serves on ``request``'s path, sorted."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


class _PathError(Exception):
    """A path parameter failed a rule pydantic cannot express (chat id rules)."""

    def __init__(self, name: str, exc: InputError) -> None:
        super().__init__(exc.reason)
        self.name = name
        self.reason = exc.reason


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "invalid value")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return _validation_response(detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown route (404), wrong method (405), unparseable body (400): same shape as every other error.
        detail = exc.detail
        headers = exc.headers
        if exc.status_code == 400:
            # FastAPI raises its generic "error parsing the body" from the decoder's error: name the problem.
            detail = _body_problem(exc.__cause__) or detail
        if exc.status_code == 405:
            # Starlette's Allow names the methods of the first route matching the path; each method of a path is
            # its own route here, so list them all.
            headers = {**(headers or {}), "Allow": ", ".join(_path_methods(request))}
        return JSONResponse(
            status_code=exc.status_code, content={"error": str(detail), "detail": detail}, headers=headers
        )

    @app.exception_handler(_PathError)
    async def _bad_path(request: Request, exc: _PathError) -> JSONResponse:
        return _validation_response([{"loc": ["path", exc.name], "msg": exc.reason, "type": "value_error"}])

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"error": str(exc), "detail": None})

    @app.exception_handler(InputError)
    async def _input(request: Request, exc: InputError) -> JSONResponse:
        return _validation_response([{"loc": _field_loc(exc.field, "body"), "msg": exc.reason, "type": "value_error"}])

    @app.exception_handler(ConfigError)
    async def _config(request: Request, exc: ConfigError) -> JSONResponse:
        # At request time a ConfigError can only come from the request (per-request ``options``).
        loc = _field_loc(exc.field or "options", "body")
        return _validation_response([{"loc": loc, "msg": exc.reason, "type": "value_error"}])

    @app.exception_handler(StoreError)
    @app.exception_handler(EmbeddingUnavailable)
    @app.exception_handler(LLMUnavailable)
    async def _unavailable(request: Request, exc: MemoryRecallError) -> JSONResponse:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(status_code=503, content={"error": str(exc), "detail": type(exc).__name__})

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(status_code=500, content={"error": "internal error", "detail": type(exc).__name__})


# ---------------------------------------------------------------------------------------------------------------
# Service state
# ---------------------------------------------------------------------------------------------------------------


class Lanes:
    """Two bounded executors in front of the worker threads, one for recalls and one for writes.

    Each lane admits at most its number of slots at once, in arrival order (anyio's capacity limiter is FIFO);
    the lanes do not share slots, so a write never queues behind recalls nor a recall behind writes (measured
    before, with one unbounded pool for writes beside bounded recalls and the embedding inline under the chat's
    lock: ``message_added`` p95 4.3 s under 16 clients on a 2,000-message chat). :attr:`running` and
    :attr:`waiting` count per lane (diagnostics and tests).
    """

    def __init__(
        self, *, recall_slots: int, write_slots: int, on_done: Callable[[], None] | None = None
    ) -> None:
        """``on_done``: called after each job, whichever way it ended (the heap trimmer's activity note)."""
        self._limiters = {
            "recall": anyio.CapacityLimiter(recall_slots),
            "write": anyio.CapacityLimiter(write_slots),
        }
        self._on_done = on_done

    def running(self, lane: Literal["recall", "write"]) -> int:
        return int(self._limiters[lane].borrowed_tokens)

    def waiting(self, lane: Literal["recall", "write"]) -> int:
        return int(self._limiters[lane].statistics().tasks_waiting)

    async def run(self, lane: Literal["recall", "write"], fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread once ``lane`` has a free slot."""
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiters[lane])
        finally:
            if self._on_done is not None:
                self._on_done()


class _Service:
    """What the routes share: store, providers, controller, per-chat write locks, in-flight write count."""

    def __init__(
        self, settings: RecallSettings, store: Store | None, embedder: Embedder | None, llm: Any, owns_store: bool
    ) -> None:
        self.settings = settings
        self._store = store
        self.embedder = embedder
        self.llm = llm
        self.owns_store = owns_store
        self.snapshots = SnapshotCache(on_update=prepare_snapshot)
        self._controller: Any = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self._lanes: Lanes | None = None
        self.jobs = SyncJobs()
        self.tasks: set[asyncio.Task[None]] = set()  # running sync jobs (kept referenced until done)
        #: Created on the running loop (lifespan): background embedding of syncs, failed writes and startup.
        self.worker: EmbeddingWorker | None = None
        #: Started by the lifespan when ``service.heap_trim_s`` > 0; each recall and write notes its work.
        self.trimmer: HeapTrimmer | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise StoreError("the store is not open")
        return self._store

    @property
    def controller(self) -> Any:
        if self._controller is None:
            self._controller = RecallController(
                self.store, self.settings, embedder=self.embedder, llm=self.llm, snapshot_cache=self.snapshots
            )
        return self._controller

    def open(self) -> None:
        if self._store is None:
            self._store = Store.open(
                self.settings.store.data_dir or None, busy_timeout=self.settings.store.busy_timeout_ms / 1000
            )
            self.owns_store = True

    async def close(self, timeout_s: float) -> None:
        if self._inflight and self._idle is not None:
            log.info("waiting for %d in-flight write(s)", self._inflight)
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                log.warning("shutdown: %d write(s) still running after %.0f s", self._inflight, timeout_s)
        if self.owns_store and self._store is not None:
            await anyio.to_thread.run_sync(self._store.close)
            self._store = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread."""
        return await anyio.to_thread.run_sync(lambda: fn(*args))

    @property
    def lanes(self) -> Lanes:
        if self._lanes is None:  # created on the running loop
            self._lanes = Lanes(recall_slots=RECALL_SLOTS, write_slots=WRITE_SLOTS,
                                on_done=self.trimmer.note if self.trimmer is not None else None)
        return self._lanes

    async def recall(self, fn: Callable[[], T]) -> T:
        """``fn()`` (a recall) in the recall lane: a worker thread, at most :data:`RECALL_SLOTS` at once."""
        return await self.lanes.run("recall", fn)

    async def write(
        self,
        chat_id: str,
        fn: Callable[[], T],
        *,
        embed: EmbedMode | bool = "background",
        touched: Callable[[T], Collection[str] | None] | None = None,
    ) -> tuple[T, EmbeddingOutcome]:
        """Run the write ``fn`` in the write executor under the chat's lock, then see to the vectors of what it
        wrote (see the module docstring): ``"background"`` asks the embedding worker (status ``queued``);
        ``"inline"`` (or ``True``) embeds the nodes ``touched(result)`` names (every node lacking a vector when
        it is ``None`` or gives ``None``) before returning, after the chat's lock is released; ``"none"`` (or
        ``False``) leaves them."""
        mode: EmbedMode = "inline" if embed is True else "none" if embed is False else embed
        lock = self._locks.setdefault(chat_id, asyncio.Lock())
        self._lock_users[chat_id] = self._lock_users.get(chat_id, 0) + 1
        if self._idle is None:
            self._idle = asyncio.Event()
        self._inflight += 1
        self._idle.clear()
        try:
            async with lock:
                result = await self.lanes.run("write", fn)
            # The lock covers the write only: embedding the new nodes (hundreds of milliseconds) under it made
            # every other write of the chat queue behind the engine. embed_missing stores a vector only if the
            # node's text is still the one embedded, so a write meanwhile is safe.
            if mode == "inline":
                ids = touched(result) if touched is not None else None
                outcome = await self.embed(chat_id, ids)
            elif mode == "background":
                outcome = self.queue_embedding(chat_id, touched(result) if touched is not None else None)
            else:
                outcome = self.no_embedding()
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
            # Drop the lock of a chat nobody is writing to, so arbitrary chat ids cannot grow the table.
            self._lock_users[chat_id] -= 1
            if not self._lock_users[chat_id]:
                del self._lock_users[chat_id], self._locks[chat_id]
        return result, outcome

    async def reembed_all(self) -> None:
        """Ask the background worker to embed every chat's nodes lacking a vector of the configured model.

        Run at startup, so switching the embedding model re-embeds existing chats without blocking the service
        (recalls meanwhile fall back to lexical for the nodes not yet done, and say so); vectors of the old
        model stay stored under its own model id and are never mixed in.
        """
        if self.embedder is None or self.worker is None:
            return
        for info in await anyio.to_thread.run_sync(self.store.list_chats):
            self.worker.request(info.chat_id)

    def no_embedding(self) -> EmbeddingOutcome:
        return EmbeddingOutcome(status="disabled", model_id=self.embedder.model_id if self.embedder else "")

    def queue_embedding(self, chat_id: str, node_ids: Collection[str] | None = None) -> EmbeddingOutcome:
        """Ask the background worker to embed what the chat lacks (``node_ids``: the nodes a write touched, when
        known); ``queued`` (``disabled`` without an embedder)."""
        if self.embedder is None or self.worker is None:
            return self.no_embedding()
        self.worker.request(chat_id, node_ids)
        return EmbeddingOutcome(status="queued", model_id=self.embedder.model_id)

    async def embed(self, chat_id: str, node_ids: Collection[str] | None = None) -> EmbeddingOutcome:
        """Embed ``node_ids`` (or every node lacking a vector) of the chat now; a failure leaves the rest to the
        background worker, which retries."""
        embedder = self.embedder
        if embedder is None:
            return self.no_embedding()
        batch = self.settings.embedding.batch_size
        try:
            report = await anyio.to_thread.run_sync(
                lambda: embed_missing(self.store, chat_id, embedder, batch_size=batch, node_ids=node_ids)
            )
        except EmbeddingUnavailable as exc:
            log.warning("embedding after a write to chat %r failed: %s", chat_id, exc.category)
            if self.worker is not None:
                self.worker.request(chat_id)
            return EmbeddingOutcome(status="failed", model_id=embedder.model_id, failure_category=exc.category)
        return EmbeddingOutcome(status="ok", model_id=report.model_id, embedded=report.total)

    async def sync(self, chat_id: str, messages: list[ChatMessage]) -> None:
        """The whole-chat sync job (started by the sync route, which has answered already)."""
        job = self.jobs.get(chat_id)
        assert job is not None
        job_id = job.job_id
        try:
            report, _ = await self.write(
                chat_id, lambda: sync_messages(self.store, chat_id, messages, now_ms=_now_ms()), embed=False
            )
        except MemoryRecallError as exc:
            log.warning("sync of chat %r failed: %s", chat_id, exc)
            self.jobs.failed(chat_id, job_id, str(exc))
            return
        except Exception as exc:  # a bug: the job says so instead of vanishing with the task
            log.error("sync of chat %r failed", chat_id, exc_info=exc)
            self.jobs.failed(chat_id, job_id, "internal error")
            return
        embedding = self.embedder is not None and self.worker is not None
        model_id = self.embedder.model_id if self.embedder is not None else ""
        self.jobs.ingested(chat_id, job_id, version=report.version, report=report, embedding=embedding,
                           model_id=model_id)
        log.info("synced chat %r: %d message(s), %d node(s) added, %d updated, %d retired", chat_id,
                 report.messages, report.nodes_added, report.nodes_updated, report.nodes_retired)
        if embedding and self.worker is not None:
            self.worker.request(chat_id)


def _svc(request: Request) -> _Service:
    svc: _Service = request.app.state.service
    return svc


def _chat_id(chat_id: str) -> str:
    try:
        return validate_chat_id(chat_id)
    except InputError as exc:
        raise _PathError("chat_id", exc) from None


def _graph_write(svc: _Service, chat_id: str, fn: Callable[[Any], int]) -> Callable[[], tuple[int, int]]:
    """A store batch running ``fn(writer)``; returns (count, committed version) and drops the chat's snapshot."""

    def run() -> tuple[int, int]:
        with svc.store.write(chat_id) as w:
            count = fn(w)
            version = w.version
        svc.snapshots.invalidate(chat_id)
        return count, version

    return run


async def _existing_chat_write(request: Request, chat_id: str, op: Callable[[Any], int]) -> WriteResult:
    """One graph batch ``op(writer)`` on an existing chat (404 otherwise), without embedding afterwards."""
    svc = _svc(request)
    chat_id = _chat_id(chat_id)
    await _require_chat(svc, chat_id)
    (count, version), emb = await svc.write(chat_id, _graph_write(svc, chat_id, op), embed=False)
    return WriteResult(chat_id=chat_id, version=version, count=count, embedding=emb)


def _check_whole_chat(messages: Sequence[ChatMessage]) -> None:
    """Floors ``0 … n-1`` once each (checked before the job starts, so a bad body is a 422, not a failed job)."""
    seen: dict[int, int] = {}
    for i, m in enumerate(messages):
        if m.floor in seen:
            raise InputError(f"messages[{i}].floor", f"floor {m.floor} repeats messages[{seen[m.floor]}]")
        seen[m.floor] = i
    n = len(messages)
    for i, m in enumerate(messages):
        if m.floor >= n:
            missing = next(f for f in range(n) if f not in seen)
            raise InputError(
                f"messages[{i}].floor",
                f"a whole chat of {n} message(s) holds floors 0 to {n - 1}; got {m.floor} (floor {missing} is "
                "missing)",
            )


def _check_chat(store: Store, chat_id: str) -> None:
    """:class:`NotFound` naming ``chat_id`` unless the store holds the chat (call in a worker thread)."""
    if store.chat_version(chat_id) == 0:
        raise NotFound("chat_id", f"unknown chat {chat_id!r}")


async def _require_chat(svc: _Service, chat_id: str) -> None:
    await svc.run(_check_chat, svc.store, chat_id)


# ---------------------------------------------------------------------------------------------------------------
# App factory
# ---------------------------------------------------------------------------------------------------------------


def create_app(
    settings: RecallSettings,
    *,
    store: Store | None = None,
    embedder: Embedder | None = None,
    llm: Any = None,
) -> FastAPI:
    """The service as an ASGI app. Without ``store`` the app opens ``settings.store`` at startup and closes it
    at shutdown; ``embedder``/``llm`` ``None`` mean lexical-only recall and no rerank. Raises
    :class:`ConfigError` for a non-loopback ``settings.service.host`` without a token, and for an unusable
    ``service.token_file`` (:func:`~memory_recall.service.auth.resolve_token`).
    """
    svc_settings = settings.service
    token = resolve_token(svc_settings)
    check_bind(svc_settings.host, token)
    pin_single_thread()  # byte-identical recalls on any core count (memory_recall.blas)
    service = _Service(settings, store, embedder, llm, owns_store=False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(service.open)
        if svc_settings.heap_trim_s > 0:
            service.trimmer = HeapTrimmer(svc_settings.heap_trim_s)
            service.trimmer.start()
        service.worker = EmbeddingWorker(
            lambda: service.store, service.embedder, batch_size=BACKGROUND_EMBED_BATCH, jobs=service.jobs
        )
        worker = asyncio.create_task(service.worker.run())
        await service.reembed_all()
        try:
            yield
        finally:
            await service.worker.close(worker)
            for task in list(service.tasks):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await service.close(svc_settings.shutdown_timeout_s)
            if service.trimmer is not None:
                service.trimmer.stop()

    app = FastAPI(
        title="memory-recall",
        version=__version__,
        description="Memory recall for roleplay chats: the recall hook, chat events, records and the memory graph.",
        lifespan=lifespan,
        responses=_ERRORS,
        docs_url=None,  # FastAPI's pages load their assets from a CDN: served from a package (install_docs)
        redoc_url=None,
    )
    app.state.service = service
    _install_error_handlers(app)
    _add_routes(app)
    install_openapi(app)
    install_docs(app)
    # Outermost last: CORS answers preflights and decorates 401/408/413/421 (so the host's page can read why), then
    # the Host check (a wrong Host learns nothing, not even whether a token is set), auth, the body limit.
    app.add_middleware(
        BodyLimit, max_bytes=svc_settings.max_body_bytes, sync_max_bytes=svc_settings.max_sync_body_bytes,
        timeout_s=svc_settings.body_timeout_s, sync_timeout_s=svc_settings.sync_body_timeout_s,
    )
    docs = {DOCS_PATH, REDOC_PATH, app.openapi_url or "/openapi.json"} if svc_settings.public_docs else set()
    app.add_middleware(
        TokenAuth, token=token, public_paths=OPEN_PATHS | docs,
        public_prefixes=(f"{ASSETS_PATH}/",) if svc_settings.public_docs else (),
    )
    app.add_middleware(HostCheck, allowed=allowed_host_names(svc_settings.host, svc_settings.allowed_hosts))
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(svc_settings.cors_origins),
        allow_methods=["GET", "POST", "PUT", "DELETE"],
        allow_headers=["Authorization", "Content-Type"],
        max_age=600,
    )
    return app


def _add_routes(app: FastAPI) -> None:  # noqa: C901 - one flat list of routes reads best
    v1 = f"/{API_VERSION}"

    # -- recall hook ---------------------------------------------------------------------------------------------

    @app.post(f"{v1}/recall", response_model=RecallResponse, tags=["recall"])
    async def recall(request: Request, body: RecallRequest) -> RecallResponse:
        """The recall hook. Call it at both host hook points: a ``normal`` generation computes (or reuses) the
        recall for ``target_user_floor``; ``regenerate``/``swipe``/``continue`` replay the record persisted for
        that floor byte for byte. Inject ``injection_text`` when ``status == "completed"``. 404 for a chat the
        service does not hold (sync it first)."""
        svc = _svc(request)
        start = time.perf_counter()

        def run() -> RecallResponse:
            # A recall never writes a chat: one the store has never seen is the host's mistake (send it first).
            # Checked in the recall's own worker thread (no second hop).
            _check_chat(svc.store, body.chat_id)
            result: RecallResponse = svc.controller.run_recall(body)
            return result

        response = await svc.recall(run)
        log.info(
            "recall chat=%r type=%s floor=%s -> %s/%s source=%s %.1f ms",
            body.chat_id, body.generation_type.value, body.target_user_floor, response.status, response.reason,
            response.source, (time.perf_counter() - start) * 1000,
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("recall chat=%r input=%r", body.chat_id, response.recall_input)
        return response

    # -- records -------------------------------------------------------------------------------------------------

    @app.get(f"{v1}/chats/{{chat_id}}/records/{{floor}}", response_model=RecordStatus, tags=["records"])
    async def get_record(request: Request, chat_id: ChatId, floor: Floor) -> RecordStatus:
        """The recall record persisted for one user floor, with ``stale`` (graph changed since)."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        record = await svc.run(svc.controller.get_record, chat_id, floor)
        if record is None:
            raise NotFound("floor", f"chat {chat_id!r} has no recall record for floor {floor}")
        return record

    @app.put(f"{v1}/chats/{{chat_id}}/records/{{floor}}", response_model=RecordStatus, tags=["records"])
    async def edit_record(request: Request, chat_id: ChatId, floor: Floor, body: RecordEdit) -> RecordStatus:
        """Replace a record's injection text (sets ``manually_edited``; replays then inject the edited text)."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        record, _ = await svc.write(
            chat_id, lambda: svc.controller.edit_record(chat_id, floor, body.injection_text), embed=False
        )
        return record

    @app.delete(f"{v1}/chats/{{chat_id}}/records/{{floor}}", response_model=DeleteResult, tags=["records"])
    async def delete_record(request: Request, chat_id: ChatId, floor: Floor) -> DeleteResult:
        """Drop a record (the next generation for that floor recalls afresh)."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        deleted, _ = await svc.write(chat_id, lambda: svc.controller.delete_record(chat_id, floor), embed=False)
        if not deleted:
            raise NotFound("floor", f"chat {chat_id!r} has no recall record for floor {floor}")
        return DeleteResult(chat_id=chat_id, deleted=True)

    @app.post(
        f"{v1}/chats/{{chat_id}}/records/{{floor}}/rerecall", response_model=RecallResponse, tags=["records"]
    )
    async def rerecall(
        request: Request, chat_id: ChatId, floor: Floor, body: Annotated[RerecallBody | None, Body()] = None
    ) -> RecallResponse:
        """Force a fresh recall for ``floor`` and replace its record, even when the floor is unchanged. Without
        ``messages`` the floor's text comes from its record."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        b = body or RerecallBody()
        scene = {k: v for k, v in b.model_dump(exclude={"messages", "query_text"}).items() if v}
        response: RecallResponse = await svc.recall(
            lambda: svc.controller.rerecall(chat_id, floor, messages=b.messages, query_text=b.query_text, **scene)
        )
        return response

    # -- chat events ---------------------------------------------------------------------------------------------

    @app.post(f"{v1}/chats/{{chat_id}}/events", response_model=EventResult, tags=["events"])
    async def chat_event(
        request: Request, chat_id: ChatId, event: Annotated[ChatEvent, Body()], embed: Embed = "background"
    ) -> EventResult:
        """A host chat event: ``message_added`` (one or a batch; an existing floor is re-ingested),
        ``message_edited`` (the floor's recall record is dropped), ``message_swiped`` (an assistant message
        shows another alternative), ``message_deleted`` (``shift: true`` when later messages moved down a floor).
        Updates the graph by the ingest rules and answers; the nodes it wrote are embedded in the background
        (``embedding.status="queued"``; recalls meanwhile count them in ``vectors_missing``), or before the
        answer with ``?embed=inline``. ``version`` is the chat's version right after this event's own write
        (the current version when it changed nothing). For a whole chat use ``POST /v1/chats/{chat_id}/sync``."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        ctl = svc.controller
        now = _now_ms()

        def apply() -> tuple[int, Any, int]:
            if isinstance(event, MessageAdded):
                if event.message is not None:
                    rep: ChatEventReport = ctl.on_message_added(chat_id, event.message, now_ms=now)
                    report, dropped = rep.ingest, int(rep.record_deleted)
                else:
                    report, dropped = ingest_messages(svc.store, chat_id, event.batch, now_ms=now), 0
                    ctl.refresh(chat_id, now_ms=now)
            else:
                if isinstance(event, MessageEdited):
                    rep = ctl.on_message_edited(chat_id, event.message, now_ms=now)
                elif isinstance(event, MessageSwiped):
                    rep = ctl.on_message_swiped(chat_id, event.message, now_ms=now)
                elif event.shift:
                    rep = ctl.on_message_removed(chat_id, event.floor, now_ms=now)
                else:
                    assert isinstance(event, MessageDeleted)
                    rep = ctl.on_message_deleted(chat_id, event.floor, now_ms=now)
                report, dropped = rep.ingest, int(rep.record_deleted)
            # The version of this event's own transaction: reading the chat's version afterwards could see a
            # recall's reinforcement or the vectors of a background embedding written since.
            version = report.version if report is not None else svc.store.chat_version(chat_id)
            return version, report, dropped

        def touched(result: tuple[int, Any, int]) -> Collection[str]:
            report = result[1]
            return tuple(report.node_ids) if report is not None else ()

        (version, report, dropped), embedding = await svc.write(chat_id, apply, embed=embed, touched=touched)
        counts = {
            k: getattr(report, k, 0)
            for k in ("nodes_added", "nodes_updated", "nodes_retired", "edges_added", "edges_updated", "edges_retired")
        }
        return EventResult(
            chat_id=chat_id, type=event.type, version=version, records_invalidated=dropped, embedding=embedding,
            **counts,
        )

    # -- whole-chat sync -----------------------------------------------------------------------------------------

    @app.post(f"{v1}/chats/{{chat_id}}/sync", response_model=SyncStatus, status_code=202, tags=["events"])
    async def sync_chat(request: Request, chat_id: ChatId, body: SyncRequest) -> SyncStatus:
        """Make the chat exactly ``messages`` (floors ``0 … n-1``): answers at once with the job, which ingests
        in the background (unchanged floors write nothing, so re-sending is cheap and idempotent) and then
        embeds. Recall works meanwhile: on the graph as far as it is written, lexically for the nodes still
        without a vector (the recall response counts them in ``vectors_missing``). Poll ``GET`` for progress.
        """
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        messages = list(body.messages)
        _check_whole_chat(messages)
        job = svc.jobs.start(chat_id, len(messages))
        task = asyncio.create_task(svc.sync(chat_id, messages))
        svc.tasks.add(task)
        task.add_done_callback(svc.tasks.discard)
        return job

    @app.get(f"{v1}/chats/{{chat_id}}/sync", response_model=SyncStatus, tags=["events"])
    async def sync_status(request: Request, chat_id: ChatId) -> SyncStatus:
        """The chat's latest sync job (since the service started); 404 when there is none."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        job = svc.jobs.get(chat_id)
        if job is None:
            raise NotFound("chat_id", f"no sync of chat {chat_id!r} since the service started")
        return job

    # -- graph ---------------------------------------------------------------------------------------------------

    @app.post(f"{v1}/chats/{{chat_id}}/nodes", response_model=WriteResult, tags=["graph"])
    async def upsert_nodes(
        request: Request, chat_id: ChatId, body: NodeBatch, embed: Embed = "background"
    ) -> WriteResult:
        """Insert or replace nodes by id (creates the chat); embedded in the background (``?embed=inline``:
        before the answer)."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        nodes = [n.to_node() for n in body.nodes]
        write = _graph_write(svc, chat_id, lambda w: w.upsert_nodes(nodes))
        (count, version), emb = await svc.write(chat_id, write, embed=embed)
        return WriteResult(chat_id=chat_id, version=version, count=count, embedding=emb)

    @app.delete(f"{v1}/chats/{{chat_id}}/nodes", response_model=WriteResult, tags=["graph"])
    async def delete_nodes(request: Request, chat_id: ChatId, body: IdBatch) -> WriteResult:
        """Delete nodes by id (with their edges and vectors). 404 for an unknown chat."""
        return await _existing_chat_write(request, chat_id, lambda w: w.delete_nodes(body.ids))

    @app.post(f"{v1}/chats/{{chat_id}}/edges", response_model=WriteResult, tags=["graph"])
    async def upsert_edges(request: Request, chat_id: ChatId, body: EdgeBatch) -> WriteResult:
        """Insert or replace edges by id; both ends must be nodes of the chat (else 404 naming the edge)."""
        edges = [e.to_edge() for e in body.edges]
        return await _existing_chat_write(request, chat_id, lambda w: w.upsert_edges(edges))

    @app.delete(f"{v1}/chats/{{chat_id}}/edges", response_model=WriteResult, tags=["graph"])
    async def delete_edges(request: Request, chat_id: ChatId, body: IdBatch) -> WriteResult:
        """Delete edges by id. 404 for an unknown chat."""
        return await _existing_chat_write(request, chat_id, lambda w: w.delete_edges(body.ids))

    @app.post(f"{v1}/chats/{{chat_id}}/import", response_model=ImportResult, tags=["graph"])
    async def import_graph(
        request: Request, chat_id: ChatId, body: StbmeImport, embed: Embed = "background"
    ) -> ImportResult:
        """Replace the chat's graph with an ST-BME graph export (the export object, or a wrapper holding it).
        Skipped or repaired items are listed in ``warnings``; recall records are kept. Embedded in the
        background (``?embed=inline``: before the answer)."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        now = _now_ms()

        data = body.model_dump()  # every key as sent: the importer reads the body (StbmeImport: its schema)

        def run() -> tuple[int, list[str]]:
            report = import_stbme_report(data, now_ms=now)
            with svc.store.write(chat_id) as w:
                w.replace_graph(report.graph)
                version = w.version  # this import's own version (see chat_event)
            svc.snapshots.invalidate(chat_id)
            return version, list(report.warnings)

        (version, warnings), emb = await svc.write(chat_id, run, embed=embed)
        stats = await svc.run(svc.store.stats, chat_id)
        return ImportResult(
            chat_id=chat_id, version=version, node_count=stats["node_count"], edge_count=stats["edge_count"],
            warnings=warnings, embedding=emb,
        )

    @app.get(f"{v1}/chats/{{chat_id}}/export", response_model=StbmeExport, tags=["graph"])
    async def export_graph(request: Request, chat_id: ChatId) -> dict[str, Any]:
        """The chat's graph as an ST-BME graph export (imports back to an equal graph)."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        await _require_chat(svc, chat_id)
        graph = await svc.run(svc.store.load_graph, chat_id)
        return await svc.run(export_stbme, graph)

    # -- chats ---------------------------------------------------------------------------------------------------

    @app.get(f"{v1}/chats", response_model=ChatList, tags=["chats"])
    async def list_chats(request: Request) -> ChatList:
        """Every chat of the store with its version and counts."""
        svc = _svc(request)
        chats = await svc.run(svc.store.list_chats)
        return ChatList(
            chats=[
                ChatSummary(chat_id=c.chat_id, version=c.version, node_count=c.node_count, edge_count=c.edge_count,
                            created_at=c.created_at, updated_at=c.updated_at)
                for c in chats
            ]
        )

    @app.get(f"{v1}/chats/{{chat_id}}/stats", response_model=ChatStats, tags=["chats"])
    async def chat_stats(request: Request, chat_id: ChatId) -> dict[str, Any]:
        """Counts of one chat: nodes by type, archived, edges, embedded nodes per model, records."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)
        await _require_chat(svc, chat_id)
        stats: dict[str, Any] = await svc.run(svc.store.stats, chat_id)
        return stats

    @app.delete(f"{v1}/chats/{{chat_id}}", response_model=DeleteResult, tags=["chats"])
    async def delete_chat(request: Request, chat_id: ChatId) -> DeleteResult:
        """Delete a chat with its graph, vectors and records."""
        svc = _svc(request)
        chat_id = _chat_id(chat_id)

        def run() -> bool:
            deleted = svc.store.delete_chat(chat_id)
            svc.snapshots.forget(chat_id)
            return deleted

        if svc.worker is not None:
            svc.worker.drop(chat_id)
        svc.jobs.forget(chat_id)
        deleted, _ = await svc.write(chat_id, run, embed=False)
        if not deleted:
            raise NotFound("chat_id", f"unknown chat {chat_id!r}")
        return DeleteResult(chat_id=chat_id, deleted=True)

    # -- health --------------------------------------------------------------------------------------------------

    @app.get(f"{v1}/health", response_model=HealthBody, tags=["service"])
    async def health() -> HealthBody:
        """Liveness (no token needed)."""
        return HealthBody(status="ok")

    @app.get(f"{v1}/memory", response_model=MemoryBody, tags=["service"])
    async def memory(request: Request) -> MemoryBody:
        """The process's anonymous RSS, the C allocator's memory in use and free, and the heap trims so far: a
        rising RSS with ``heap.in_use_bytes`` level is the heaps fragmenting or Python's small objects (outside
        glibc's figures), not blocks glibc hands out."""
        trimmer = _svc(request).trimmer
        usage = heap_usage()
        return MemoryBody(
            anonymous_rss_bytes=anonymous_rss(),
            heap=None if usage is None else HeapBody(
                in_use_bytes=usage.in_use, free_bytes=usage.free, heaps_bytes=usage.heaps, mapped_bytes=usage.mapped,
            ),
            heap_trims=trimmer.trims if trimmer is not None else 0,
            heap_trim_seconds=round(trimmer.seconds, 6) if trimmer is not None else 0.0,
        )

    @app.get(f"{v1}/version", response_model=VersionBody, tags=["service"])
    async def version(request: Request) -> VersionBody:
        """Package, API and store schema versions and the embedding model in use."""
        svc = _svc(request)
        schema = await svc.run(lambda: svc.store.schema_version)
        return VersionBody(
            name="memory-recall", version=__version__, api=API_VERSION, schema_version=schema,
            embedding_model=svc.embedder.model_id if svc.embedder else "",
        )


# ---------------------------------------------------------------------------------------------------------------
# serve
# ---------------------------------------------------------------------------------------------------------------


def log_config(log_level: str = "info") -> dict[str, Any]:
    """uvicorn's ``LOGGING_CONFIG`` (a deep copy) plus a ``memory_recall`` logger on uvicorn's ``default`` handler
    (stderr, ``"%(levelprefix)s %(message)s"``) at ``log_level`` (a uvicorn level name: ``critical`` …
    ``trace``), not propagating, so the service's lines look like uvicorn's and appear once. Raises
    :class:`ConfigError` for an unknown level."""
    import copy

    import uvicorn.config

    level = uvicorn.config.LOG_LEVELS.get(log_level.lower())
    if level is None:
        raise ConfigError(
            f"unknown log level {log_level!r}; expected one of {', '.join(uvicorn.config.LOG_LEVELS)}",
            field="log_level",
        )
    config: dict[str, Any] = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["memory_recall"] = {"handlers": ["default"], "level": level, "propagate": False}
    return config


def serve(
    host: str,
    port: int,
    data_dir: str | None,
    token: str | None,
    settings: RecallSettings,
    *,
    token_file: str | None = None,
    log_level: str = "info",
) -> None:
    """Run the service on uvicorn until interrupted (Ctrl-C finishes in-flight writes, then closes the store).

    ``host``/``port``/``data_dir`` override ``settings`` when given; ``token``, or else ``token_file`` (a file
    holding the token, :func:`~memory_recall.service.auth.read_token_file`), replaces ``service.token`` and
    ``service.token_file``. Once the token and the bind address are accepted, logging is configured
    (:func:`log_config`) and a token file or an existing store file that group or others may access gets a
    warning (:func:`~memory_recall.service.auth.warn_if_shared`; the store keeps their modes). The connections get
    the deadlines of :func:`~memory_recall.service.connections.server_options`. Raises :class:`ConfigError` (one
    line, before binding) for a non-loopback host without a token, an unusable token file or provider
    configuration.
    """
    import logging.config
    from pathlib import Path

    import uvicorn

    from memory_recall.heap import limit_arenas
    from memory_recall.providers import make_embedder, make_llm
    from memory_recall.service.connections import server_options
    from memory_recall.store import default_data_dir
    from memory_recall.store.sqlite import DB_FILENAME

    update: dict[str, Any] = {"host": host or settings.service.host, "port": port}
    if token:
        update.update(token=token, token_file="")
    elif token_file:
        update.update(token="", token_file=token_file)
    service = settings.service.model_copy(update=update)
    token_path = service.token_file.strip()
    service = service.model_copy(update={"token": resolve_token(service), "token_file": ""})
    store_settings = settings.store.model_copy(update={"data_dir": data_dir or settings.store.data_dir})
    settings = settings.model_copy(update={"service": service, "store": store_settings})
    check_bind(service.host, service.token)
    # Only now: a refusal above leaves the caller's logging as it was (serve may run in-process, as in tests).
    logging.config.dictConfig(log_config(log_level))
    if token_path:
        warn_if_shared(Path(token_path).expanduser(), "token file")
    store_dir = default_data_dir(store_settings.data_dir or None)
    for suffix in ("", "-wal", "-shm"):
        warn_if_shared(store_dir / f"{DB_FILENAME}{suffix}", "store file")
    # Before the embedding engine and the worker threads allocate: glibc fixes its arena limit then.
    if limit_arenas(service.malloc_arenas):
        log.info("malloc arenas limited to %d", service.malloc_arenas)
    embedder = make_embedder(settings.embedding)
    llm = make_llm(settings.llm) if settings.rerank.enabled else None
    app = create_app(settings, embedder=embedder, llm=llm)
    uvicorn.run(
        app,
        host=service.host,
        port=service.port,
        log_level=log_level,
        log_config=log_config(log_level),
        timeout_graceful_shutdown=int(service.shutdown_timeout_s),
        **server_options(service),
    )
