"""Embedding cache: node vectors are computed once per (model id, text) and reused everywhere.

:func:`embed_missing` brings a chat's stored vectors up to date for one embedder:

* A node needs a vector when it is not archived and the store holds no vector for it under
  ``embedder.model_id`` or holds one whose text hash differs from ``text_hash(embedding_text(node))``.
* Those texts are looked up in the store's content-addressed cache (``cache_get(model_id, hashes)``)
  first; only the misses are sent to the embedder, each distinct text once. So re-ingesting a chat,
  importing the same graph into a second chat or re-running an evaluation never embeds a text twice.
* Work is done in chunks of ``batch_size`` nodes; each chunk's vectors and cache entries are committed before
  the next chunk starts, so an interrupted run resumes where it stopped.
* Vectors live under the embedder's model id: switching models re-embeds under the new id and leaves the old
  model's vectors untouched; two models' vectors are never mixed.

The store is any :class:`EmbeddingStore` (``memory_recall.store.sqlite.Store`` is one): ``get_nodes``,
``embedding_hashes``, ``cache_get``, ``cache_put`` and ``write(chat_id)`` whose writer has ``put_embeddings``.

**Cost.** A store with ``embedding_status`` (the SQLite store) is read in one query of node ids, node JSON
texts and stored text hashes; a node's embedding text hash is computed (node parsed, text built, SHA-256) only
when its JSON text changed since the last call in this process for that store and chat (remembered per node
as the 64-bit Python hash of the JSON text: the digest memo). So the call after a one-message ingest parses
the few changed nodes, not the chat; the first call in a process, or on a store without ``embedding_status``
(the generic path: every node parsed), costs O(chat). Both paths give the same result.

No query cache exists on purpose: a query is embedded in milliseconds locally, and a cache keyed across
providers could serve another provider version's vector (seed ``retrieval-and-evidence.md``).
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from pydantic import ValidationError

from memory_recall.errors import EmbeddingUnavailable, InputError, StoreError
from memory_recall.model.graph import Node, embedding_text
from memory_recall.providers.embedding import Embedder

__all__ = ["EmbedReport", "EmbeddingStore", "embed_missing", "text_hash"]


class _EmbeddingWriter(Protocol):
    def put_embeddings(self, model_id: str, vectors: Iterable[tuple[str, np.ndarray, str]]) -> int: ...


class EmbeddingStore(Protocol):
    """The part of the store :func:`embed_missing` uses."""

    def get_nodes(self, chat_id: str) -> Sequence[Node]: ...

    def embedding_hashes(self, chat_id: str, model_id: str) -> dict[str, str]: ...

    def cache_get(self, model_id: str, hashes: Iterable[str]) -> dict[str, np.ndarray]: ...

    def cache_put(self, model_id: str, items: Mapping[str, np.ndarray]) -> int: ...

    def write(self, chat_id: str) -> AbstractContextManager[_EmbeddingWriter]: ...


# store → chat id → node id → (hash of the node's JSON text, text hash of its embedding text). Weak keys: a
# closed and dropped store takes its memo with it. Entries are pure functions of the JSON text, checked on
# every use, so a stale or concurrently replaced memo can cost a recomputation, never a wrong answer.
_DIGESTS: weakref.WeakKeyDictionary[Any, dict[str, dict[str, tuple[int, str]]]] = weakref.WeakKeyDictionary()
_DIGESTS_LOCK = threading.Lock()


def text_hash(text: str) -> str:
    """SHA-256 hex digest of the UTF-8 bytes of ``text`` (nothing else is hashed: the model id is a separate
    key)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class EmbedReport:
    """What :func:`embed_missing` did.

    ``total``: nodes whose vector was written; ``from_cache``: of those, nodes served by the cache;
    ``embedded``: distinct texts sent to the embedder; ``calls``: ``embed_passages`` calls; ``up_to_date``:
    active nodes whose stored vector was already current; ``archived``: archived nodes skipped.
    ``total - from_cache`` may exceed ``embedded`` when several nodes share one new text.
    """

    model_id: str
    total: int = 0
    from_cache: int = 0
    embedded: int = 0
    calls: int = 0
    up_to_date: int = 0
    archived: int = 0
    elapsed_ms: float = 0.0


def embed_missing(
    store: EmbeddingStore,
    chat_id: str,
    embedder: Embedder,
    *,
    progress: Callable[[int, int], None] | None = None,
    batch_size: int = 64,
    node_ids: Collection[str] | None = None,
    stop: Callable[[], bool] | None = None,
    started: Callable[[int], None] | None = None,
) -> EmbedReport:
    """Embed every active node of ``chat_id`` whose vector for ``embedder.model_id`` is missing or stale.

    ``progress(done, total)`` is called after each committed chunk (``total`` = nodes needing a vector);
    ``started(total)`` once before the first chunk, with that same total (0 included), so a progress display can
    show the total and time its rate from the start of the work rather than from the end of the first chunk.
    ``node_ids`` restricts the work to those nodes (a write embeds what it touched, not the chat's backlog);
    ``stop()`` is asked before each chunk and ends the run early when true (the report counts what was done).
    A chunk's vectors are written only for nodes whose text is still the text embedded, so a run may overlap
    other writes to the chat: a node edited or deleted meanwhile is skipped and picked up by the next run.
    Raises :class:`EmbeddingUnavailable` from the embedder (chunks committed before the failure stay) and
    ``dimension_mismatch`` when the vectors of one model id disagree in dimension.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InputError("batch_size", f"must be an int in the range [1, inf). Got {batch_size!r} instead.")
    start = time.perf_counter()
    model_id = embedder.model_id
    if hasattr(store, "embedding_status"):
        todo, probe, up_to_date, archived = _todo_targeted(store, chat_id, model_id, node_ids)
    else:
        todo, probe, up_to_date, archived = _todo_full(store, chat_id, model_id)
        if node_ids is not None:
            wanted_ids = set(node_ids)
            todo = [item for item in todo if item[0] in wanted_ids]
    total = len(todo)
    if started is not None:
        started(total)
    from_cache = embedded = calls = done = skipped = 0
    dim = embedder.dim or None
    if todo and dim is None:
        # Vectors already stored for this model fix its dimension; every stored vector is also cached, so
        # one cache lookup finds it without loading the chat's matrix.
        if probe is not None:
            for vec in store.cache_get(model_id, [probe]).values():
                dim = int(np.asarray(vec).shape[0])
    for offset in range(0, total, batch_size):
        if stop is not None and stop():
            break
        chunk = todo[offset : offset + batch_size]
        wanted = list(dict.fromkeys(digest for _, _, digest in chunk))
        vectors: dict[str, np.ndarray] = {
            h: np.asarray(v, dtype=np.float32) for h, v in store.cache_get(model_id, wanted).items()
        }
        hits = set(vectors)
        misses: dict[str, str] = {}
        for _, text, digest in chunk:
            if digest not in vectors:
                misses.setdefault(digest, text)
        fresh: dict[str, np.ndarray] = {}
        if misses:
            matrix = embedder.embed_passages(list(misses.values()))
            calls += 1
            embedded += len(misses)
            fresh = {digest: matrix[i] for i, digest in enumerate(misses)}
            vectors.update(fresh)
        for vec in vectors.values():
            dim = dim or int(vec.shape[0])
            if vec.ndim != 1 or vec.shape[0] != dim:
                raise EmbeddingUnavailable(
                    "dimension_mismatch",
                    f"{model_id}: a vector has shape {vec.shape}, the others have {dim} dimensions",
                )
        if fresh:
            # Cache first: a crash before the node rows are written costs a cache hit on rerun, not a call.
            store.cache_put(model_id, fresh)
        rows: list[tuple[str, str, str]] = []
        try:
            with store.write(chat_id) as writer:
                rows = _still_current(writer, chat_id, chunk)
                if not rows:
                    raise _NothingCurrent  # roll back: no version bump, no chat created anew
                writer.put_embeddings(
                    model_id, [(node_id, vectors[digest], digest) for node_id, _, digest in rows]
                )
        except _NothingCurrent:
            rows = []
        skipped += len(chunk) - len(rows)
        from_cache += sum(1 for _, _, digest in chunk if digest in hits)
        done += len(chunk)
        if progress is not None:
            progress(done, total)

    return EmbedReport(
        model_id=model_id,
        total=done - skipped,
        from_cache=from_cache,
        embedded=embedded,
        calls=calls,
        up_to_date=up_to_date,
        archived=archived,
        elapsed_ms=(time.perf_counter() - start) * 1000,
    )


_Todo = tuple[list[tuple[str, str, str]], str | None, int, int]


class _NothingCurrent(Exception):
    """Every node of a chunk changed or vanished while it was embedded: its write batch is rolled back."""


def _still_current(writer: Any, chat_id: str, chunk: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The items of ``chunk`` whose node still exists, is active and has the embedded text (read inside the
    write that stores the vectors, so nothing can change in between). A writer without reads keeps all."""
    if not hasattr(writer, "get_nodes"):
        return chunk
    current = {n.id: n for n in writer.get_nodes(chat_id, [node_id for node_id, _, _ in chunk])}
    kept = []
    for item in chunk:
        node = current.get(item[0])
        if node is not None and not node.archived and text_hash(embedding_text(node)) == item[2]:
            kept.append(item)
    return kept


def _todo_full(store: EmbeddingStore, chat_id: str, model_id: str) -> _Todo:
    """``(todo, probe, up_to_date, archived)`` from every node of the chat: ``todo`` = ``(node id, text, text
    hash)`` of the active nodes needing a vector, in node order; ``probe`` = the first non-empty stored text
    hash of the model (fixes an unknown dimension)."""
    nodes = list(store.get_nodes(chat_id))
    stored: dict[str, str] = dict(store.embedding_hashes(chat_id, model_id))
    todo: list[tuple[str, str, str]] = []
    archived = up_to_date = 0
    for node in nodes:
        if node.archived:
            archived += 1
            continue
        text = embedding_text(node)
        digest = text_hash(text)
        if stored.get(node.id) == digest:
            up_to_date += 1
            continue
        todo.append((node.id, text, digest))
    return todo, next((h for h in stored.values() if h), None), up_to_date, archived


def _parse(node_id: str, text: str) -> Node:
    try:
        return Node.model_validate_json(text)
    except ValidationError as exc:
        raise StoreError(f"corrupt node {node_id!r} in the store: {exc.errors()[0].get('msg', exc)}") from exc


def _todo_targeted(store: Any, chat_id: str, model_id: str, node_ids: Collection[str] | None = None) -> _Todo:
    """:func:`_todo_full` from ``store.embedding_status`` and the digest memo (see "Cost" in the module
    docstring): same result, node JSON parsed only for nodes changed since the last call. With ``node_ids``,
    only those nodes are read (a write's nodes: O(written), not a read of every node's JSON per event); the
    counts are then theirs."""
    if node_ids is not None:
        rows: list[tuple[str, bool, str | None, str | None]] = store.embedding_status(chat_id, model_id, node_ids)
    else:
        rows = store.embedding_status(chat_id, model_id)
    with _DIGESTS_LOCK:
        try:
            memo: dict[str, dict[str, tuple[int, str]]] | None = _DIGESTS.setdefault(store, {})
        except TypeError:  # not weak-referenceable: no memo
            memo = None
        known = memo.get(chat_id, {}) if memo is not None else {}
    fresh: dict[str, tuple[int, str]] = {}
    todo: list[tuple[str, str, str]] = []
    archived = up_to_date = 0
    probe: str | None = None
    for node_id, is_archived, doc, stored in rows:
        if probe is None and stored:
            probe = stored
        if is_archived or doc is None:
            archived += 1
            continue
        key = hash(doc)
        hit = known.get(node_id)
        text: str | None = None
        if hit is not None and hit[0] == key:
            digest = hit[1]
        else:
            text = embedding_text(_parse(node_id, doc))
            digest = text_hash(text)
        fresh[node_id] = (key, digest)
        if stored == digest:
            up_to_date += 1
            continue
        if text is None:  # known digest, but the vector is missing or stale (e.g. a new model id)
            text = embedding_text(_parse(node_id, doc))
        todo.append((node_id, text, digest))
    if memo is not None:
        with _DIGESTS_LOCK:
            if node_ids is None:
                memo[chat_id] = fresh
            else:
                memo.setdefault(chat_id, {}).update(fresh)
    if probe is None and node_ids is not None and todo and hasattr(store, "stored_text_hash"):
        probe = store.stored_text_hash(chat_id, model_id)  # the dimension check needs one stored vector
    return todo, probe, up_to_date, archived
