"""The embedded store: one SQLite file per data directory holding the memory of many chats.

Usage::

    store = Store.open()                        # <data dir>/memory-recall.sqlite3, created and migrated
    with store.write("chat-1") as w:            # one transaction, one version bump on commit
        w.upsert_nodes(nodes)
        w.upsert_edges(edges)
    with store.read() as r:                     # one consistent snapshot across several reads
        version, graph = r.chat_version("chat-1"), r.load_graph("chat-1")

Contract
--------
* **Transactions.** Every public write is one ``BEGIN IMMEDIATE … COMMIT`` transaction; any error (bad input,
  SQLite failure, an exception in the body of ``with store.write(...)``) rolls the whole transaction back, so
  nothing half-written ever remains. ``PRAGMA synchronous=FULL`` in WAL mode: a write acknowledged by a
  returned call survives a SIGKILL of the process and a power loss.
* **Versions.** ``chat_version(chat_id)`` is 0 for an unknown chat and strictly increases with every committed
  write to that chat (exactly one bump per transaction, never on reads). Versions come from one store-wide
  counter, so a chat that is deleted and created again never reuses a version number: a cache keyed by
  ``(chat_id, version)`` cannot serve the deleted chat's data. ``StoreWriter.version`` is the version the open
  batch commits as (a recall record written in the same batch can carry it as ``graph_version``).
* **Threads and processes.** One :class:`Store` may be shared by threads. Writes are serialised by an
  internal lock around the one write connection (a nested ``store.write`` on the thread that holds the batch
  raises :class:`StoreError` instead of deadlocking); other processes are serialised by SQLite's write lock
  and the busy timeout. Reads use pooled connections of their own and see the last committed state (WAL
  snapshot isolation): readers never block the writer, never see a partial batch, and readers in other
  processes see committed data. Inside ``with store.write(...) as w`` the writer's own read methods
  (``w.get_nodes`` …) see the batch's uncommitted changes; ``store.get_nodes`` on the same thread does not.
* **Schema.** ``PRAGMA user_version`` is the schema version; :data:`MIGRATIONS` upgrades it one step at a
  time, each step in its own transaction. A database newer than this code, a file that is not SQLite, or a
  SQLite file of another application raises :class:`StoreError`. The FTS index remembers the tokenizer
  version and table options it was built with and is rebuilt when they change.
* **Scoping.** Every row belongs to a validated chat id (:func:`validate_chat_id`), except the global
  embedding cache. Model validation errors surface as :class:`InputError` naming the field.
* **File modes.** A store file this code creates is mode 0600 (SQLite gives its ``-wal`` and ``-shm`` files the
  mode of the database file), and a data directory :meth:`Store.open` creates is 0700 (both narrowed further by
  the umask): the chats are private. Existing files and directories keep their modes (an operator may have
  opened them to a backup group on purpose); ``memory-recall serve`` warns about store files others may read.

Ordering: nodes and edges come back in insertion order (an update keeps a row's place); records by user floor;
ties in BM25 scores break by node id (byte order).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
import operator
import os
import sqlite3
import sys
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from memory_recall.errors import InputError, NotFound, StoreError
from memory_recall.model.graph import (
    PRIMARY_LEXICAL_FIELDS,
    SECONDARY_LEXICAL_FIELDS,
    Edge,
    Node,
    first_validation_error,
    parse_edge,
    parse_node,
)
from memory_recall.model.records import PersistedRecall
from memory_recall.model.state import (
    HistoryState,
    JournalEntry,
    KnowledgeOwner,
    KnowledgeState,
    MemoryGraph,
    RegionState,
    SummaryState,
    TimelineState,
)
from memory_recall.store.bm25_index import Bm25Cache, Bm25Index, cache_for
from memory_recall.store.node_fields import same_fields
from memory_recall.store.snapshot import (
    PACKED_EDGE,
    PACKED_EDGE_DTYPE,
    BlobSlices,
    EdgeColumns,
    JoinedStrings,
    NodeIndex,
    NodeIndexTable,
    PackedTexts,
    SnapshotDelta,
    SnapshotSource,
    compress_text,
    gc_paused,
    node_index,
    spare_rows,
)
from memory_recall.text.stem import STEM_METHODS
from memory_recall.text.tokenize import (
    FTS5_TOKENIZE_CLAUSE,
    TOKENIZER_VERSION,
    index_terms,
)

__all__ = [
    "APPLICATION_ID",
    "DB_FILENAME",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "ChatInfo",
    "Store",
    "StoreReader",
    "StoreWriter",
    "default_data_dir",
    "chat_id_pattern",
    "fts_columns",
    "validate_chat_id",
]

DB_FILENAME = "memory-recall.sqlite3"
#: ``PRAGMA application_id`` of a memory-recall store ("MREC"): a foreign SQLite file is refused, not altered.
APPLICATION_ID = 0x4D524543
MAX_CHAT_ID_LENGTH = 128
# Spaces are allowed inside ids because chat hosts name chats "Seraphina - 2023-11-10@20h46m36s".
_CHAT_ID_PUNCT = frozenset("_-.:@ ")
# BM25 column weights (primary, secondary, body); the term columns come first in nodes_fts so that these are
# the first three bm25() arguments. Leading UNINDEXED columns would silently take the weights instead.
BM25_WEIGHTS = (3.0, 2.0, 1.0)
_MAX_BM25_TERMS = 1024
_MAX_BM25_LIMIT = 100_000
# SQLite builds before 3.32 allow 999 bound parameters per statement; stay below for IN (...) lists.
_CHUNK = 500
_SNAPSHOT_CHUNK = 8192  # rows per fetch of the snapshot read (bounded transient memory)
_MAX_MILLIS = 253_402_300_799_999
_MAX_MODEL_ID_LENGTH = 200
_MAX_TEXT_HASH_LENGTH = 256

T = TypeVar("T", bound=BaseModel)


# ------------------------------------------------------------------------------------------------------------
# Paths and chat ids
# ------------------------------------------------------------------------------------------------------------


def default_data_dir(explicit: str | Path | None = None) -> Path:
    """The data directory: ``explicit`` > env ``MEMORY_RECALL_DATA_DIR`` > the per-user default.

    The per-user default is ``%APPDATA%\\memory-recall`` on Windows, else ``$XDG_DATA_HOME/memory-recall`` or
    ``~/.local/share/memory-recall`` (a relative ``XDG_DATA_HOME`` is ignored, as the XDG spec asks).
    """
    if explicit is not None and str(explicit):
        return Path(explicit).expanduser()
    env = os.environ.get("MEMORY_RECALL_DATA_DIR", "")
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        appdata = os.environ.get("APPDATA", "")
        base = Path(appdata) if appdata else Path.home() / "AppData" / "Roaming"
    else:
        xdg = os.environ.get("XDG_DATA_HOME", "")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "memory-recall"


def validate_chat_id(chat_id: object) -> str:
    """Return ``chat_id`` if it is a valid chat id, else raise ``InputError("chat_id", reason)``.

    Valid: 1–128 characters, each a (Unicode) letter, a decimal digit, a space or one of ``_ - . : @``; no
    leading or trailing space, no leading dot and no ``..``, so an id can never name a parent directory or a
    hidden file if it is ever used in a path.
    """
    if not isinstance(chat_id, str):
        raise InputError("chat_id", f"must be a string, got {type(chat_id).__name__}")
    if not chat_id:
        raise InputError("chat_id", "must not be empty")
    if len(chat_id) > MAX_CHAT_ID_LENGTH:
        raise InputError("chat_id", f"must be at most {MAX_CHAT_ID_LENGTH} characters, got {len(chat_id)}")
    for i, ch in enumerate(chat_id):
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            raise InputError("chat_id", f"must not contain control characters (U+{ord(ch):04X} at {i})")
        if ch in "/\\":
            raise InputError("chat_id", f"must not contain path separators ({ch!r} at {i})")
        if not (ch in _CHAT_ID_PUNCT or ch.isalpha() or unicodedata.category(ch) == "Nd"):
            raise InputError(
                "chat_id", f"must contain only letters, digits, spaces and _ - . : @ ({ch!r} at {i})"
            )
    if chat_id != chat_id.strip(" "):
        raise InputError("chat_id", "must not start or end with a space")
    if chat_id.startswith("."):
        raise InputError("chat_id", "must not start with '.'")
    if ".." in chat_id:
        raise InputError("chat_id", "must not contain '..'")
    return chat_id


@functools.cache
def chat_id_pattern() -> str:
    """The regular expression that, with a length of 1 to :data:`MAX_CHAT_ID_LENGTH`, matches exactly the ids
    :func:`validate_chat_id` accepts (the ``pattern`` of every chat id in the service's OpenAPI schema).

    Python's ``re`` and JSON Schema validators read it alike: no shorthand classes (``\\w`` means ASCII to
    some engines and Unicode to others), no lookaround; the letters and decimal digits are listed from this
    Python's Unicode database, so the two agree on every code point. Built once (about 0.1 s).
    """
    allowed = [c for c in range(sys.maxunicode + 1) if chr(c).isalpha() or unicodedata.category(chr(c)) == "Nd"]
    allowed += [ord(ch) for ch in "_:@-"]
    allowed.sort()
    ranges: list[list[int]] = []
    for c in allowed:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])

    def char(c: int) -> str:
        return "\\-" if c == ord("-") else chr(c)

    body = "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)
    first = f"[{body}]"  # anything but a space or a dot
    # Then runs of characters where a dot is always followed by a non-dot (no "..") and the last character is
    # not a space: (an optional dot, then a non-dot)*, ending in a non-space or in a single dot.
    return f"^{first}(?:(?:\\.?[{body} ])*(?:\\.?{first}|\\.))?$"


@dataclass(frozen=True, slots=True)
class ChatInfo:
    """One chat of the store (``list_chats``). Times are milliseconds since the epoch."""

    chat_id: str
    version: int
    node_count: int
    edge_count: int
    created_at: int
    updated_at: int


# ------------------------------------------------------------------------------------------------------------
# Schema and migrations
# ------------------------------------------------------------------------------------------------------------


def _fts_create_sql() -> str:
    return (
        "CREATE VIRTUAL TABLE nodes_fts USING fts5("
        "primary_terms, secondary_terms, body_terms, chat_id UNINDEXED, node_id UNINDEXED, "
        f"{FTS5_TOKENIZE_CLAUSE})"
    )


def _migrate_v1(conn: sqlite3.Connection) -> None:
    """Initial schema: chats, nodes (+ FTS), edges, embeddings, knowledge, chat state, records, meta."""
    statements = [
        f"PRAGMA application_id = {APPLICATION_ID}",
        # value is untyped on purpose: the version clock is an integer, the tokenizer clause text.
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value)",
        """CREATE TABLE chats (
            chat_id TEXT PRIMARY KEY,
            version INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL)""",
        # rid is the rowid of the node's nodes_fts row, so FTS rows are found and deleted by rowid (the FTS
        # chat_id/node_id columns are UNINDEXED: filtering on them scans the whole index).
        """CREATE TABLE nodes (
            rid INTEGER PRIMARY KEY,
            chat_id TEXT NOT NULL REFERENCES chats(chat_id) ON DELETE CASCADE,
            node_id TEXT NOT NULL,
            ord INTEGER NOT NULL,
            type TEXT NOT NULL,
            archived INTEGER NOT NULL,
            seq_end INTEGER,
            json TEXT NOT NULL,
            UNIQUE (chat_id, node_id))""",
        "CREATE INDEX nodes_by_ord ON nodes(chat_id, ord)",
        """CREATE TABLE edges (
            chat_id TEXT NOT NULL,
            edge_id TEXT NOT NULL,
            from_id TEXT NOT NULL,
            to_id TEXT NOT NULL,
            ord INTEGER NOT NULL,
            json TEXT NOT NULL,
            PRIMARY KEY (chat_id, edge_id),
            FOREIGN KEY (chat_id, from_id) REFERENCES nodes(chat_id, node_id) ON DELETE CASCADE,
            FOREIGN KEY (chat_id, to_id) REFERENCES nodes(chat_id, node_id) ON DELETE CASCADE)""",
        "CREATE INDEX edges_by_from ON edges(chat_id, from_id)",
        "CREATE INDEX edges_by_to ON edges(chat_id, to_id)",
        "CREATE INDEX edges_by_ord ON edges(chat_id, ord)",
        """CREATE TABLE embeddings (
            chat_id TEXT NOT NULL,
            node_id TEXT NOT NULL,
            model_id TEXT NOT NULL,
            dim INTEGER NOT NULL,
            vector BLOB NOT NULL,
            PRIMARY KEY (chat_id, node_id, model_id),
            FOREIGN KEY (chat_id, node_id) REFERENCES nodes(chat_id, node_id) ON DELETE CASCADE)""",
        "CREATE INDEX embeddings_by_model ON embeddings(chat_id, model_id)",
        _fts_create_sql(),
        """CREATE TABLE knowledge_owners (
            chat_id TEXT NOT NULL REFERENCES chats(chat_id) ON DELETE CASCADE,
            owner_key TEXT NOT NULL,
            ord INTEGER NOT NULL,
            json TEXT NOT NULL,
            PRIMARY KEY (chat_id, owner_key))""",
        """CREATE TABLE chat_state (
            chat_id TEXT NOT NULL REFERENCES chats(chat_id) ON DELETE CASCADE,
            kind TEXT NOT NULL,
            json TEXT NOT NULL,
            PRIMARY KEY (chat_id, kind))""",
        """CREATE TABLE recall_records (
            chat_id TEXT NOT NULL REFERENCES chats(chat_id) ON DELETE CASCADE,
            user_floor INTEGER NOT NULL,
            json TEXT NOT NULL,
            updated_at INTEGER NOT NULL,
            PRIMARY KEY (chat_id, user_floor))""",
    ]
    for sql in statements:
        conn.execute(sql)


def _migrate_v2(conn: sqlite3.Connection) -> None:
    """Embedding text hashes (stale-vector detection), the global embedding cache, the store-wide clock."""
    conn.execute("ALTER TABLE embeddings ADD COLUMN text_hash TEXT NOT NULL DEFAULT ''")
    conn.execute(
        """CREATE TABLE embedding_cache (
            model_id TEXT NOT NULL,
            text_hash TEXT NOT NULL,
            dim INTEGER NOT NULL,
            vector BLOB NOT NULL,
            PRIMARY KEY (model_id, text_hash))"""
    )
    # v1 bumped each chat's own counter; the clock starts above every version handed out so far.
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) "
        "SELECT 'version_clock', coalesce(max(version), 0) FROM chats"
    )


def _migrate_v3(conn: sqlite3.Connection) -> None:
    """Denormalised columns for the snapshot builder: the node index values (``nodes.idx``) and the edge
    columns diffusion needs, so a snapshot of 100k nodes is built without parsing every node and edge JSON."""
    conn.execute("ALTER TABLE nodes ADD COLUMN idx TEXT NOT NULL DEFAULT ''")
    for column, decl in (
        ("relation", "TEXT NOT NULL DEFAULT 'related'"),
        ("strength", "REAL NOT NULL DEFAULT 0.8"),
        ("edge_type", "INTEGER NOT NULL DEFAULT 0"),
        ("invalid_at", "INTEGER"),
        ("expired_at", "INTEGER"),
    ):
        conn.execute(f"ALTER TABLE edges ADD COLUMN {column} {decl}")
    rows = conn.execute("SELECT rid, json FROM nodes").fetchall()
    conn.executemany(
        "UPDATE nodes SET idx = ? WHERE rid = ?",
        [(node_index(Node.model_validate_json(text)).to_json(), rid) for rid, text in rows],
    )
    edges = conn.execute("SELECT chat_id, edge_id, json FROM edges").fetchall()
    updates = []
    for chat_id, edge_id, text in edges:
        e = Edge.model_validate_json(text)
        updates.append((e.relation, e.strength, e.edge_type, e.invalid_at, e.expired_at, chat_id, edge_id))
    conn.executemany(
        "UPDATE edges SET relation = ?, strength = ?, edge_type = ?, invalid_at = ?, expired_at = ? "
        "WHERE chat_id = ? AND edge_id = ?",
        updates,
    )


def _pack_edge(src_rid: int, dst_rid: int, strength: float, edge_type: int, invalid_at: int | None,
               expired_at: int | None) -> bytes:
    """``edges.eb``: the edge's endpoint node rowids and numeric columns (``None`` times as NaN)."""
    return PACKED_EDGE.pack(
        src_rid, dst_rid, strength, edge_type,
        math.nan if invalid_at is None else invalid_at, math.nan if expired_at is None else expired_at,
    )


def _migrate_v4(conn: sqlite3.Connection) -> None:
    """Packed snapshot columns, so the snapshot read of a large chat decodes a few values per row instead of a
    JSON array and two id lookups per edge, and holds the node JSON compressed: ``nodes.ixb`` (the numeric index
    values, ``NodeIndex.to_packed``), ``nodes.ixs`` (the string ones, ``NodeIndex.strings_json``), ``nodes.jz``
    (``compress_text`` of ``nodes.json``, which stays the source of truth) and ``edges.eb`` (endpoint node rowids
    and numeric columns). Filled from the v3 columns (``nodes.idx``, the edge columns); nothing is removed."""
    conn.execute("ALTER TABLE nodes ADD COLUMN ixb BLOB NOT NULL DEFAULT x''")
    conn.execute("ALTER TABLE nodes ADD COLUMN ixs TEXT NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE nodes ADD COLUMN jz BLOB NOT NULL DEFAULT x''")
    conn.execute("ALTER TABLE edges ADD COLUMN eb BLOB NOT NULL DEFAULT x''")
    last = -1
    while rows := conn.execute(
        "SELECT rid, idx, json FROM nodes WHERE rid > ? ORDER BY rid LIMIT ?", (last, _SNAPSHOT_CHUNK)
    ).fetchall():
        last = rows[-1][0]
        updates = []
        for rid, index_text, text in rows:
            ix = NodeIndex.from_json(index_text)
            updates.append((ix.to_packed(), ix.strings_json(), compress_text(text), rid))
        conn.executemany("UPDATE nodes SET ixb = ?, ixs = ?, jz = ? WHERE rid = ?", updates)
    last = -1
    while rows := conn.execute(
        "SELECT e.rowid, coalesce(a.rid, -1), coalesce(b.rid, -1), e.strength, e.edge_type, e.invalid_at, "
        "e.expired_at FROM edges e "
        "LEFT JOIN nodes a ON a.chat_id = e.chat_id AND a.node_id = e.from_id "
        "LEFT JOIN nodes b ON b.chat_id = e.chat_id AND b.node_id = e.to_id "
        "WHERE e.rowid > ? ORDER BY e.rowid LIMIT ?",
        (last, _SNAPSHOT_CHUNK),
    ).fetchall():
        last = rows[-1][0]
        conn.executemany(
            "UPDATE edges SET eb = ? WHERE rowid = ?", [(_pack_edge(*r[1:]), r[0]) for r in rows]
        )


def _migrate_v5(conn: sqlite3.Connection) -> None:
    """Change tracking for incremental snapshot updates (:meth:`StoreReader.snapshot_delta`): ``cv``, the version
    that last wrote the row, on nodes, edges and embeddings (0 for the rows of older stores: no cached snapshot
    predates the migration), ``chats.state_cv`` for the chat state (knowledge, regions, timeline, summaries,
    history, journal), and ``deletions``, one row per deleted node, edge or vector (and a ``rebuild`` mark for the
    writes a delta does not describe: reordering, dropping every vector of a model)."""
    for table in ("nodes", "edges", "embeddings"):
        conn.execute(f"ALTER TABLE {table} ADD COLUMN cv INTEGER NOT NULL DEFAULT 0")
        conn.execute(f"CREATE INDEX {table}_by_cv ON {table}(chat_id, cv)")
    conn.execute("ALTER TABLE chats ADD COLUMN state_cv INTEGER NOT NULL DEFAULT 0")
    conn.execute(
        """CREATE TABLE deletions (
            chat_id TEXT NOT NULL REFERENCES chats(chat_id) ON DELETE CASCADE,
            version INTEGER NOT NULL,
            kind TEXT NOT NULL,
            rid INTEGER NOT NULL,
            model_id TEXT NOT NULL DEFAULT '')"""
    )
    conn.execute("CREATE INDEX deletions_by_version ON deletions(chat_id, version)")
    # Every message event reads the chat's character and entity nodes (names to match): by type, not a scan.
    conn.execute("CREATE INDEX nodes_by_type ON nodes(chat_id, type, ord)")


def _migrate_v6(conn: sqlite3.Connection) -> None:
    """Message nodes by floor (the end of their ``seq_range``): a deleted message's event reads the messages at
    its floor and after (:meth:`StoreReader.message_floors_from`), which without this read every message node of
    the chat (57 ms at 100,000 nodes)."""
    conn.execute("CREATE INDEX nodes_by_floor ON nodes(chat_id, type, seq_end)")


#: Ordered schema migrations: ``MIGRATIONS[i]`` upgrades ``user_version`` i to i + 1, inside one transaction.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _migrate_v1, _migrate_v2, _migrate_v3, _migrate_v4, _migrate_v5, _migrate_v6,
]
SCHEMA_VERSION = len(MIGRATIONS)


# ------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _dumps(model: BaseModel, field: str) -> str:
    """The JSON column text of a model: UTF-8 (no ASCII escapes), floats in shortest round-trip form.

    Not ``json.dumps(model_dump(mode="json"), sort_keys=True)``: sorting would reorder ``Node.fields``,
    whose order is meaningful (``embedding_text`` lists the non-preferred fields in it), and pydantic's
    serializer is deterministic and 3x faster, which keeps bulk upserts far above 5,000 nodes/s.
    """
    try:
        return model.model_dump_json()
    except PydanticSerializationError as exc:
        # Lone surrogates pass validation but are not UTF-8; name the item instead of failing mid-statement.
        if "surrogates not allowed" in str(exc):
            raise InputError(field, "contains unpaired surrogate characters") from None
        raise InputError(field, f"cannot be serialised: {exc}") from None


def _check_encodable(text: str, field: str) -> None:
    # Lone surrogates pass pydantic but cannot be stored as UTF-8; fail before the statement, naming the item.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(field, "contains unpaired surrogate characters") from None


def _load(cls: type[T], text: str, what: str) -> T:
    try:
        return cls.model_validate_json(text)
    except ValidationError as exc:
        raise StoreError(f"corrupt {what} in the store: {first_validation_error(exc)}") from exc


class _NodeParseMemo:
    """Parsed nodes by their exact stored JSON, least recently used evicted past ``limit``, one version per node id.

    Every message event reads all of the chat's character and entity nodes (the names a message may mention);
    parsing them is most of the event's cost (1,200 nodes: ~40 ms at 10k), and between two events almost none
    of them changes. The key is the whole JSON text, so a hit is the node the text parses to (nodes are frozen
    models and nothing mutates them), whatever store, chat or version it came from.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: OrderedDict[str, Node] = OrderedDict()
        self._text_of: dict[str, str] = {}  # node id → the text of its newest version held
        self._lock = threading.Lock()

    def load(self, text: str, keep: Callable[[Node], bool] | None = None) -> Node:
        """The node ``text`` parses to; remembered only when ``keep`` (if given) accepts it."""
        with self._lock:
            node = self._items.get(text)
            if node is not None:
                self._items.move_to_end(text)
                return node
        node = _load(Node, text, "node")
        if keep is not None and not keep(node):
            return node
        with self._lock:
            # One text per node id: a rewritten owner (each message event may touch its speaker) replaces its
            # older text instead of piling up versions until the limit.
            previous = self._text_of.get(node.id)
            if previous is not None and previous != text:
                self._items.pop(previous, None)
            self._text_of[node.id] = text
            self._items[text] = node
            if len(self._items) > self._limit:
                gone, old = self._items.popitem(last=False)
                if self._text_of.get(old.id) == gone:
                    del self._text_of[old.id]
        return node


#: Process-wide: the character and entity nodes of the chats being written (a 100k-node chat has ~12,000).
_PARSED_NODES = _NodeParseMemo(16_384)


def _is_owner(node: Node) -> bool:
    return node.type in OWNER_TYPES


#: ``(seq, node_id, prev_id, next_id)`` of one active message node, as :meth:`StoreReader.message_chain` reads it.
ChainLink = tuple[int, str, "str | None", "str | None"]
#: The node types whose rows every message event reads (the names a message may mention).
OWNER_TYPES = ("character", "entity")


class OwnerDerived(Protocol):
    """Values a caller derives from a chat's character/entity nodes, kept by :class:`IngestCache` beside them and
    updated from each change, so no event recomputes them over every owner node."""

    def update(self, node_id: str, old: Node | None, new: Node | None) -> None:
        """One owner node changed (``old``/``new`` ``None``: absent, or not a character/entity node)."""

    def snapshot(self) -> Any:
        """The current values, as an object the caller may keep after the cache changes again."""


@dataclass(frozen=True)
class ChainRun:
    """A contiguous piece of the chat's message chain (``links`` sorted by ``(seq, node_id)``); ``at_start`` /
    ``at_end``: it begins / ends the chain. A run that does not begin (end) the chain begins (ends) with a node
    more than the margin away from every anchor it was cut around."""

    at_start: bool
    at_end: bool
    links: tuple[ChainLink, ...]


@dataclass(frozen=True)
class IngestBase:
    """What an ingest event reads of a chat before planning (:meth:`StoreReader.ingest_base`).

    ``owners`` = :meth:`StoreReader.get_nodes_by_type` of :data:`OWNER_TYPES`, by id in that order (the caller's
    own copy: it may add to it). ``runs`` is set when every stored link of the chain agrees with the
    ``(seq, node_id)`` order of the active message nodes (so relinking around the anchors touches nothing outside
    the runs): the runs around the anchors, ``chain`` unset. Otherwise ``chain`` is the whole
    :meth:`StoreReader.message_chain` and ``runs`` unset. ``derived`` is the snapshot of the caller's
    :class:`OwnerDerived` (``None`` without a factory).
    """

    owners: dict[str, Node]
    runs: tuple[ChainRun, ...] | None
    chain: tuple[ChainLink, ...] | None
    derived: Any


class _ChatEntry:
    """One chat's cached ingest reads at ``version``: owner nodes by id (insertion order), the chain as a sorted
    ``(seq, id)`` list plus ``id → (seq, prev, next)``, whether every link agrees with that order."""

    __slots__ = ("version", "owners", "order", "rows", "consistent", "derived")

    def __init__(self, version: int, owners: list[Node], chain: Sequence[ChainLink]) -> None:
        self.version = version
        self.owners: dict[str, Node] = {n.id: n for n in owners}
        self.order: list[tuple[int, str]] = [(seq, nid) for seq, nid, _, _ in chain]
        self.rows: dict[str, tuple[int, str | None, str | None]] = {
            nid: (seq, prev, nxt) for seq, nid, prev, nxt in chain
        }
        self.consistent = self._all_consistent()
        self.derived: OwnerDerived | None = None

    def _all_consistent(self) -> bool:
        ids = [nid for _, nid in self.order]
        wanted = zip([None, *ids[:-1]], [*ids[1:], None], strict=True)
        stored = ((r[1], r[2]) for r in map(self.rows.__getitem__, ids))
        return all(map(operator.eq, stored, wanted))

    def _consistent_at(self, keys: Iterable[tuple[int, str]]) -> bool:
        order, n = self.order, len(self.order)
        for key in keys:
            i = bisect.bisect_left(order, key)
            for j in range(max(0, i - 1), min(n, i + 2)):
                nid = order[j][1]
                want = (order[j - 1][1] if j else None, order[j + 1][1] if j + 1 < n else None)
                if self.rows[nid][1:] != want:
                    return False
        return True

    def apply(self, log: Mapping[str, str | None], created: Collection[str]) -> bool:
        """Lay one committed batch's node writes over the entry (``log``: id → stored JSON, ``None`` when deleted,
        in write order; ``created``: ids whose rows the batch inserted). ``False`` when the entry cannot follow
        (an older node turned into a character/entity: its position in insertion order is unknown here)."""
        changed: list[tuple[int, str]] = []
        for nid, text in log.items():
            # Only owner nodes are remembered: every message of a long chat passes here once, and would push the
            # owners out of the memo (and hold ~20 KB each).
            new = None if text is None else _PARSED_NODES.load(text, _is_owner)
            old = self.owners.get(nid)
            if new is not None and new.type in OWNER_TYPES:
                if nid in created:
                    self.owners.pop(nid, None)  # a new row: last in insertion order
                elif old is None:
                    return False
                self.owners[nid] = new
            elif old is not None:
                del self.owners[nid]
            if self.derived is not None and (old is not None or (new is not None and new.type in OWNER_TYPES)):
                self.derived.update(nid, old, new if new is not None and new.type in OWNER_TYPES else None)
            row = self.rows.pop(nid, None)
            if row is not None:
                key = (row[0], nid)
                del self.order[bisect.bisect_left(self.order, key)]
                changed.append(key)
            if new is not None and new.type == "message" and not new.archived:
                key = (new.seq, nid)
                bisect.insort(self.order, key)
                self.rows[nid] = (new.seq, new.prev_id or None, new.next_id or None)
                changed.append(key)
        if changed:
            self.consistent = self._consistent_at(changed) if self.consistent else self._all_consistent()
        return True

    def runs(self, anchors: Iterable[tuple[int, str]], margin: int) -> tuple[ChainRun, ...]:
        order, n = self.order, len(self.order)
        spans = sorted(
            (max(0, i - margin), min(n, i + margin + 1))
            for i in (bisect.bisect_left(order, key) for key in anchors)
        )
        merged: list[list[int]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return tuple(
            ChainRun(lo == 0, hi == n, tuple((seq, nid, *self.rows[nid][1:]) for seq, nid in order[lo:hi]))
            for lo, hi in merged
        )


class IngestCache:
    """Per chat, what every ingest event reads (the character/entity nodes and the message chain), at one chat
    version, so an event on a large chat reads O(touched) rows instead of every owner node and chain link.

    Exactness: an entry serves a read only when its version is the chat version that read sees (versions only
    grow, and every write of any process bumps them), so another process's write is never missed: the entry is
    rebuilt from the store. This process's committed write batches are laid over the entry
    (:meth:`after_write`) when the entry was at the batch's base version; otherwise, or after a write the entry
    cannot follow (node reorder), it is dropped. Node rows are cached as parsed from their stored JSON, so a
    served row equals the row a read would parse. Thread-safe (one lock; readers copy what they take). At most
    ``max_chats`` chats are kept (least recently read dropped): an entry holds O(owners + messages) of one chat.
    """

    def __init__(self, max_chats: int = 16) -> None:
        self._lock = threading.Lock()
        self._max_chats = max_chats
        self._chats: OrderedDict[str, _ChatEntry] = OrderedDict()

    def read(self, reader: StoreReader, chat_id: str, anchors: Sequence[tuple[int, str]], margin: int,
             derive: Callable[[Iterable[Node]], OwnerDerived] | None) -> IngestBase:
        version = reader.chat_version(chat_id)
        with self._lock:
            entry = self._chats.get(chat_id)
            if entry is not None and entry.version == version:
                self._chats.move_to_end(chat_id)
                return self._take(entry, anchors, margin, derive)
        entry = _ChatEntry(version, reader.get_nodes_by_type(chat_id, OWNER_TYPES), reader.message_chain(chat_id))
        with self._lock:
            current = self._chats.get(chat_id)
            if current is None or current.version < version:
                self._chats[chat_id] = entry
                self._chats.move_to_end(chat_id)
                while len(self._chats) > self._max_chats:
                    self._chats.popitem(last=False)
            return self._take(entry, anchors, margin, derive)

    @staticmethod
    def _take(entry: _ChatEntry, anchors: Sequence[tuple[int, str]], margin: int,
              derive: Callable[[Iterable[Node]], OwnerDerived] | None) -> IngestBase:
        if derive is not None and entry.derived is None:
            entry.derived = derive(entry.owners.values())
        snap = entry.derived.snapshot() if derive is not None and entry.derived is not None else None
        owners = dict(entry.owners)  # one C copy: the planner's lookups start from it (no loop over the owners)
        if entry.consistent:
            return IngestBase(owners, entry.runs(anchors, margin), None, snap)
        chain = tuple((seq, nid, *entry.rows[nid][1:]) for seq, nid in entry.order)
        return IngestBase(owners, None, chain, snap)

    def after_write(self, chat_id: str, base_version: int, version: int, log: Mapping[str, str | None],
                    created: Collection[str], followable: bool) -> None:
        """A batch of this process committed ``version`` over ``base_version``: follow it or drop the entry."""
        with self._lock:
            entry = self._chats.get(chat_id)
            if entry is None:
                return
            if followable and entry.version == base_version and entry.apply(log, created):
                entry.version = version
            else:
                del self._chats[chat_id]

    def drop(self, chat_id: str) -> None:
        with self._lock:
            self._chats.pop(chat_id, None)


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _str_arg(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InputError(field, f"must be a string, got {type(value).__name__}")
    return value


def _id_list(ids: Iterable[str] | str, field: str) -> list[str]:
    if isinstance(ids, str):
        raise InputError(field, "must be a collection of ids, not one string")
    out: dict[str, None] = {}
    for i, value in enumerate(ids):
        out[_str_arg(value, f"{field}[{i}]")] = None
    return list(out)


def _int_arg(value: object, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(field, f"must be an int in the range [{lo}, {hi}]; got {value!r}")
    return value


def _model_id(model_id: object) -> str:
    if not isinstance(model_id, str) or not model_id.strip():
        raise InputError("model_id", "must be a non-empty string")
    if len(model_id) > _MAX_MODEL_ID_LENGTH:
        limit = _MAX_MODEL_ID_LENGTH
        raise InputError("model_id", f"must be at most {limit} characters, got {len(model_id)}")
    if any(unicodedata.category(ch) == "Cc" for ch in model_id):
        raise InputError("model_id", "must not contain control characters")
    _check_encodable(model_id, "model_id")
    return model_id


def _text_hash(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InputError(field, f"must be a string, got {type(value).__name__}")
    if len(value) > _MAX_TEXT_HASH_LENGTH:
        raise InputError(field, f"must be at most {_MAX_TEXT_HASH_LENGTH} characters, got {len(value)}")
    _check_encodable(value, field)
    return value


def _vector(value: object, field: str) -> np.ndarray:
    """A finite, non-empty 1-D float32 vector (little-endian), or ``InputError``."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InputError(field, f"is not a numeric vector: {exc}") from None
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise InputError(field, f"must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise InputError(field, f"must be a non-empty 1-D vector, got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype("<f4")
    if not np.isfinite(out).all():
        raise InputError(field, "must be finite (no NaN or infinity, also after conversion to float32)")
    return out


def _matrix(blobs: list[bytes], dims: list[int], what: str) -> np.ndarray:
    if not blobs:
        return np.zeros((0, 0), dtype=np.float32)
    d = dims[0]
    for blob, dim in zip(blobs, dims, strict=True):
        if dim != d or len(blob) != 4 * dim:
            raise StoreError(f"corrupt {what} in the store: vector sizes differ")
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), d).astype(np.float32)


def _strings(value: Any) -> Iterator[str]:
    """Text of a field value: strings and numbers, recursively through lists and dict values."""
    if isinstance(value, str):
        if value:
            yield value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


_PRIMARY = frozenset(PRIMARY_LEXICAL_FIELDS)
_SECONDARY = frozenset(SECONDARY_LEXICAL_FIELDS)


def fts_columns(node: Node) -> tuple[str, str, str]:
    """The pre-tokenized (primary, secondary, body) FTS text of a node (reference §1.2 lexical roles).

    Each string is tokenized on its own so CJK bigrams never span two values.
    """
    cols: tuple[list[str], list[str], list[str]] = ([], [], [])
    for key, value in node.fields.items():
        bucket = cols[0] if key in _PRIMARY else cols[1] if key in _SECONDARY else cols[2]
        for text in _strings(value):
            bucket.extend(index_terms(text))
    return " ".join(cols[0]), " ".join(cols[1]), " ".join(cols[2])


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            # A failed rollback means the connection is unusable; the original error is chained as context.
            raise StoreError(f"rollback failed: {exc}") from exc


def _get_meta(conn: sqlite3.Connection, key: str) -> Any:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def _set_meta(conn: sqlite3.Connection, key: str, value: Any) -> None:
    conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))


# ------------------------------------------------------------------------------------------------------------
# Reads
# ------------------------------------------------------------------------------------------------------------


class StoreReader:
    """Read methods over one connection; obtained from ``Store.read()`` (one consistent snapshot).

    The :class:`StoreWriter` of a batch is a reader too and sees the batch's own uncommitted changes.
    """

    def __init__(self, conn: sqlite3.Connection, ingest_cache: IngestCache | None = None) -> None:
        self._conn = conn
        self._ingest_cache = ingest_cache

    # -- chats ---------------------------------------------------------------------------------------------

    def chat_version(self, chat_id: str) -> int:
        """The chat's version; 0 for an unknown chat."""
        chat_id = validate_chat_id(chat_id)
        row = self._conn.execute("SELECT version FROM chats WHERE chat_id = ?", (chat_id,)).fetchone()
        return 0 if row is None else int(row[0])

    def list_chats(self) -> list[ChatInfo]:
        """Every chat with its version and counts, sorted by chat id."""
        rows = self._conn.execute(
            "SELECT c.chat_id, c.version, "
            "(SELECT count(*) FROM nodes n WHERE n.chat_id = c.chat_id), "
            "(SELECT count(*) FROM edges e WHERE e.chat_id = c.chat_id), "
            "c.created_at, c.updated_at FROM chats c ORDER BY c.chat_id"
        ).fetchall()
        return [ChatInfo(*row) for row in rows]

    def stats(self, chat_id: str) -> dict[str, Any]:
        """Counts of one chat: nodes by type, archived nodes, edges, embedded nodes per model, records."""
        chat_id = validate_chat_id(chat_id)
        c = self._conn
        by_type = dict(
            c.execute(
                "SELECT type, count(*) FROM nodes WHERE chat_id = ? GROUP BY type ORDER BY type", (chat_id,)
            ).fetchall()
        )
        archived = c.execute(
            "SELECT count(*) FROM nodes WHERE chat_id = ? AND archived = 1", (chat_id,)
        ).fetchone()[0]
        edges = c.execute("SELECT count(*) FROM edges WHERE chat_id = ?", (chat_id,)).fetchone()[0]
        embedded = dict(
            c.execute(
                "SELECT model_id, count(*) FROM embeddings WHERE chat_id = ? "
                "GROUP BY model_id ORDER BY model_id",
                (chat_id,),
            ).fetchall()
        )
        records = c.execute("SELECT count(*) FROM recall_records WHERE chat_id = ?", (chat_id,)).fetchone()[0]
        return {
            "chat_id": chat_id,
            "version": self.chat_version(chat_id),
            "node_count": sum(by_type.values()),
            "nodes_by_type": by_type,
            "archived_count": archived,
            "edge_count": edges,
            "embedded": embedded,
            "record_count": records,
        }

    # -- nodes and edges -----------------------------------------------------------------------------------

    def get_node(self, chat_id: str, node_id: str) -> Node | None:
        """One node, or ``None`` when the chat has no node of that id."""
        chat_id = validate_chat_id(chat_id)
        node_id = _str_arg(node_id, "node_id")
        row = self._conn.execute(
            "SELECT json FROM nodes WHERE chat_id = ? AND node_id = ?", (chat_id, node_id)
        ).fetchone()
        return None if row is None else _load(Node, row[0], f"node {node_id!r}")

    def get_nodes(self, chat_id: str, ids: Iterable[str] | None = None) -> list[Node]:
        """The chat's nodes (or those of ``ids`` that exist) in insertion order."""
        chat_id = validate_chat_id(chat_id)
        if ids is None:
            rows = self._conn.execute(
                "SELECT json FROM nodes WHERE chat_id = ? ORDER BY ord, rid", (chat_id,)
            ).fetchall()
            return [_load(Node, r[0], "node") for r in rows]
        wanted = _id_list(ids, "ids")
        found: list[tuple[int, int, str]] = []
        for part in _chunks(wanted):
            found.extend(
                self._conn.execute(
                    "SELECT ord, rid, json FROM nodes WHERE chat_id = ? "
                    f"AND node_id IN ({_marks(len(part))})",
                    (chat_id, *part),
                ).fetchall()
            )
        found.sort()
        return [_load(Node, r[2], "node") for r in found]

    def get_edges(self, chat_id: str) -> list[Edge]:
        """The chat's edges in insertion order."""
        chat_id = validate_chat_id(chat_id)
        rows = self._conn.execute(
            "SELECT json FROM edges WHERE chat_id = ? ORDER BY ord, edge_id", (chat_id,)
        ).fetchall()
        return [_load(Edge, r[0], "edge") for r in rows]

    def edges_of(self, chat_id: str, node_id: str) -> list[Edge]:
        """Edges touching ``node_id`` (either end), in insertion order."""
        chat_id = validate_chat_id(chat_id)
        node_id = _str_arg(node_id, "node_id")
        # The two end indexes named: left to itself, SQLite's planner reads the chat's every edge through
        # ``edges_by_ord`` to deliver the order (16 ms at 35,000 edges instead of 0.02 ms), so an edit's ingest
        # paid the size of the chat.
        rows = self._conn.execute(
            "SELECT ord, edge_id, json FROM edges INDEXED BY edges_by_from WHERE chat_id = ?1 AND from_id = ?2 "
            "UNION SELECT ord, edge_id, json FROM edges INDEXED BY edges_by_to WHERE chat_id = ?1 AND to_id = ?2 "
            "ORDER BY 1, 2",
            (chat_id, node_id),
        ).fetchall()
        return [_load(Edge, r[2], "edge") for r in rows]

    # -- targeted reads for incremental ingest and embedding (O(touched nodes), not O(chat)) ----------------

    def get_nodes_by_type(self, chat_id: str, types: Iterable[str]) -> list[Node]:
        """The chat's nodes whose ``type`` is one of ``types``, in insertion order (the ``type`` column: no JSON
        is parsed for the other nodes)."""
        chat_id = validate_chat_id(chat_id)
        wanted = _id_list(types, "types")
        if not wanted:
            return []
        # The type index named: SQLite's planner otherwise reads the chat's every node through ``nodes_by_ord`` for
        # the order (115-265 ms at 100,000 nodes instead of 69 ms for their 12,000 characters and entities).
        rows = self._conn.execute(
            f"SELECT json FROM nodes INDEXED BY nodes_by_type WHERE chat_id = ? AND type IN ({_marks(len(wanted))}) "
            "ORDER BY ord, rid",
            (chat_id, *wanted),
        ).fetchall()
        return [_PARSED_NODES.load(r[0]) for r in rows]

    def message_chain(self, chat_id: str) -> list[tuple[int, str, str | None, str | None]]:
        """``(seq, node_id, prev_id, next_id)`` of every active (not archived) ``message`` node, sorted by
        ``(seq, node_id)``: the temporal chain as stored, from the denormalised index column (one JSON parse of
        small arrays, no node JSON)."""
        chat_id = validate_chat_id(chat_id)
        # The index column is a JSON array in NodeIndex field order; SQLite extracts the three values in C
        # (faster than decoding whole rows in Python). A missing link is stored as "" (ids are never empty).
        pos = {name: i for i, name in enumerate(NodeIndex.__dataclass_fields__)}
        rows: list[tuple[int, str, str | None, str | None]] = self._conn.execute(
            f"SELECT json_extract(idx, '$[{pos['seq']}]') AS seq, node_id, "
            f"nullif(json_extract(idx, '$[{pos['prev_id']}]'), ''), "
            f"nullif(json_extract(idx, '$[{pos['next_id']}]'), '') "
            "FROM nodes WHERE chat_id = ? AND type = 'message' AND archived = 0 ORDER BY seq, node_id",
            (chat_id,),
        ).fetchall()
        return rows

    def ingest_base(self, chat_id: str, anchors: Iterable[tuple[int, str]], margin: int = 2,
                    derive: Callable[[Iterable[Node]], OwnerDerived] | None = None) -> IngestBase:
        """The chat's character/entity nodes and its message chain (see :class:`IngestBase`), the chain cut to
        the runs around ``anchors`` (``(seq, node_id)`` keys: where planned message nodes are and will be) with
        ``margin`` untouched nodes on each side when the stored links are consistent.

        Served from the store's :class:`IngestCache` when it holds the chat at the version this read sees (then
        O(owners) pointer copies, no row read); a batch writer (uncommitted changes) always reads the rows.
        """
        chat_id = validate_chat_id(chat_id)
        keys = list(anchors)
        if self._ingest_cache is not None:
            return self._ingest_cache.read(self, chat_id, keys, margin, derive)
        entry = _ChatEntry(self.chat_version(chat_id), self.get_nodes_by_type(chat_id, OWNER_TYPES),
                           self.message_chain(chat_id))
        return IngestCache._take(entry, keys, margin, derive)

    def message_floors_from(self, chat_id: str, floor: int) -> list[tuple[int, str]]:
        """``(floor, node_id)`` of every ``message`` node (active or archived) at ``floor`` or later, by floor:
        a message node's floor is the end of its ``seq_range`` (one indexed column, no node JSON read)."""
        chat_id = validate_chat_id(chat_id)
        start = _int_arg(floor, "floor", 0, sys.maxsize)
        rows: list[tuple[int, str]] = self._conn.execute(
            "SELECT seq_end, node_id FROM nodes WHERE chat_id = ? AND type = 'message' AND seq_end >= ? "
            "ORDER BY seq_end, node_id",
            (chat_id, start),
        ).fetchall()
        return rows

    def lasting_edge(self, chat_id: str, node_id: str, exclude_ends: Iterable[str] = ()) -> Edge | None:
        """Of the edges touching ``node_id`` whose other end is not in ``exclude_ends`` and that are not
        invalidated (``invalid_at`` unset), the one active longest: no ``expired_at`` first, then the latest
        ``expired_at``; ties by insertion order. ``None`` when there is none.

        If this edge is not active at some time, no other such edge is: one row answers "does the node keep an
        active edge besides those around ``exclude_ends``" without reading all its edges.
        """
        chat_id = validate_chat_id(chat_id)
        node_id = _str_arg(node_id, "node_id")
        exclude = _id_list(exclude_ends, "exclude_ends")
        if len(exclude) > _CHUNK:
            raise InputError("exclude_ends", f"must hold at most {_CHUNK} ids, got {len(exclude)}")
        # Numbered marks, shared by both halves; "" for none (SQLite reads "x NOT IN ()" as true).
        marks = ",".join(f"?{i + 3}" for i in range(len(exclude)))
        row = self._conn.execute(
            "SELECT json FROM ("
            "SELECT json, expired_at, ord, edge_id FROM edges WHERE chat_id = ?1 AND from_id = ?2 "
            f"AND invalid_at IS NULL AND to_id NOT IN ({marks}) "
            "UNION ALL SELECT json, expired_at, ord, edge_id FROM edges WHERE chat_id = ?1 AND to_id = ?2 "
            f"AND invalid_at IS NULL AND from_id NOT IN ({marks})"
            ") ORDER BY expired_at IS NULL DESC, expired_at DESC, ord, edge_id LIMIT 1",
            (chat_id, node_id, *exclude),
        ).fetchone()
        return None if row is None else _load(Edge, row[0], "edge")

    def embedding_status(
        self, chat_id: str, model_id: str, node_ids: Collection[str] | None = None
    ) -> list[tuple[str, bool, str | None, str | None]]:
        """``(node_id, archived, node_json, text_hash)`` of every node of the chat (of those of ``node_ids``
        only, when given: a write's nodes, not the chat) in insertion order: ``node_json`` is ``None`` for an
        archived node (not needed, not read), ``text_hash`` that of the node's stored ``model_id`` vector (``""``
        when stored without one) or ``None`` when it has none."""
        chat_id = validate_chat_id(chat_id)
        model_id = _model_id(model_id)
        select = (
            "SELECT n.node_id, n.archived, CASE WHEN n.archived THEN NULL ELSE n.json END, e.text_hash "
            "FROM nodes n LEFT JOIN embeddings e "
            "ON e.chat_id = n.chat_id AND e.node_id = n.node_id AND e.model_id = ? WHERE n.chat_id = ? "
        )
        if node_ids is None:
            rows = self._conn.execute(select + "ORDER BY n.ord, n.rid", (model_id, chat_id)).fetchall()
        else:
            wanted = json.dumps(sorted({str(i) for i in node_ids}))
            rows = self._conn.execute(
                select + "AND n.node_id IN (SELECT value FROM json_each(?)) ORDER BY n.ord, n.rid",
                (model_id, chat_id, wanted),
            ).fetchall()
        return [(r[0], bool(r[1]), r[2], r[3]) for r in rows]

    def stored_text_hash(self, chat_id: str, model_id: str) -> str | None:
        """The text hash of one stored ``model_id`` vector of the chat (any; ``None`` when it has none): a probe
        of the stored dimension."""
        row = self._conn.execute(
            "SELECT text_hash FROM embeddings WHERE chat_id = ? AND model_id = ? AND text_hash != '' LIMIT 1",
            (validate_chat_id(chat_id), _model_id(model_id)),
        ).fetchone()
        return None if row is None else str(row[0])

    # -- chat state ----------------------------------------------------------------------------------------

    def get_knowledge(self, chat_id: str) -> KnowledgeState:
        """The chat's knowledge owners (empty state for an unknown chat)."""
        chat_id = validate_chat_id(chat_id)
        rows = self._conn.execute(
            "SELECT owner_key, json FROM knowledge_owners WHERE chat_id = ? ORDER BY ord", (chat_id,)
        ).fetchall()
        owners = {key: _load(KnowledgeOwner, text, f"knowledge owner {key!r}") for key, text in rows}
        try:
            return KnowledgeState(owners=owners)
        except ValidationError as exc:
            raise StoreError(f"corrupt knowledge state in the store: {first_validation_error(exc)}") from exc

    def _state_json(self, chat_id: str, kind: str) -> str | None:
        chat_id = validate_chat_id(chat_id)
        row = self._conn.execute(
            "SELECT json FROM chat_state WHERE chat_id = ? AND kind = ?", (chat_id, kind)
        ).fetchone()
        return None if row is None else str(row[0])

    def _state(self, chat_id: str, kind: str, cls: type[T]) -> T:
        text = self._state_json(chat_id, kind)
        return cls() if text is None else _load(cls, text, f"{kind} state")

    def get_regions(self, chat_id: str) -> RegionState:
        """The chat's region state (default when never set)."""
        return self._state(chat_id, "regions", RegionState)

    def get_timeline(self, chat_id: str) -> TimelineState:
        """The chat's story timeline (default when never set)."""
        return self._state(chat_id, "timeline", TimelineState)

    def get_summaries(self, chat_id: str) -> SummaryState:
        """The chat's summary state (default when never set)."""
        return self._state(chat_id, "summaries", SummaryState)

    def get_history(self, chat_id: str) -> HistoryState:
        """The chat's history state (default when never set)."""
        return self._state(chat_id, "history", HistoryState)

    def get_journal(self, chat_id: str) -> list[JournalEntry]:
        """The chat's batch journal (empty when never set)."""
        text = self._state_json(chat_id, "journal")
        if text is None:
            return []
        try:
            items = json.loads(text)
            return [JournalEntry.model_validate(item) for item in items]
        except (ValueError, TypeError) as exc:  # ValidationError is a ValueError
            raise StoreError(f"corrupt journal in the store: {exc}") from exc

    def load_graph(self, chat_id: str) -> MemoryGraph:
        """Everything of one chat as a :class:`MemoryGraph` (use inside ``store.read()`` for one snapshot)."""
        try:
            return MemoryGraph(
                nodes=tuple(self.get_nodes(chat_id)),
                edges=tuple(self.get_edges(chat_id)),
                knowledge=self.get_knowledge(chat_id),
                regions=self.get_regions(chat_id),
                timeline=self.get_timeline(chat_id),
                summaries=self.get_summaries(chat_id),
                history=self.get_history(chat_id),
                batch_journal=tuple(self.get_journal(chat_id)),
            )
        except ValidationError as exc:
            raise StoreError(f"corrupt graph in the store: {first_validation_error(exc)}") from exc

    # -- embeddings ----------------------------------------------------------------------------------------

    def get_embeddings(self, chat_id: str, model_id: str) -> tuple[list[str], np.ndarray]:
        """Node ids and their ``model_id`` vectors as a float32 (n × d) matrix, in node insertion order.

        Only vectors of ``model_id``; no vectors → ``([], zeros((0, 0)))``.
        """
        chat_id = validate_chat_id(chat_id)
        model_id = _model_id(model_id)
        rows = self._conn.execute(
            "SELECT e.node_id, e.dim, e.vector FROM embeddings e "
            "JOIN nodes n ON n.chat_id = e.chat_id AND n.node_id = e.node_id "
            "WHERE e.chat_id = ? AND e.model_id = ? ORDER BY n.ord, n.rid",
            (chat_id, model_id),
        ).fetchall()
        ids = [r[0] for r in rows]
        return ids, _matrix([r[2] for r in rows], [r[1] for r in rows], f"embeddings of {model_id!r}")

    def snapshot_source(self, chat_id: str, model_id: str) -> SnapshotSource:
        """Everything :func:`~memory_recall.store.snapshot.build_snapshot` needs, read in this one transaction.

        Nodes come with their packed index values (``nodes.ixb`` numbers, ``nodes.ixs`` strings: no node JSON
        parse) and their compressed JSON (``nodes.jz``, kept compressed as
        :class:`~memory_recall.store.snapshot.PackedTexts` over one blob), each column as one SQLite
        concatenation in node order (no Python row per node); their ``model_id`` vectors are read in chunks
        straight into one (n × d) float32 matrix (``embeddings_aligned``: no joined copy); edges come as
        :class:`~memory_recall.store.snapshot.EdgeColumns` from concatenations of their packed columns
        (``edges.eb``, endpoints as node rowids mapped to positions with numpy: no per-edge objects or id
        lookups). The cyclic garbage collector is paused meanwhile (:func:`~memory_recall.store.snapshot.gc_paused`).
        Vectors of different sizes or malformed packed columns → ``StoreError``.
        """
        chat_id = validate_chat_id(chat_id)
        model_id = _model_id(model_id) if model_id else ""
        version = self.chat_version(chat_id)
        with gc_paused():  # the decode of a large chat creates millions of objects (see gc_paused)
            node_ids, rids, index_rows, node_json, matrix = self._snapshot_nodes(chat_id, model_id)
            edge_columns, edge_rowids = self._snapshot_edges(chat_id, rids)
        return SnapshotSource(
            chat_id=chat_id,
            version=version,
            node_ids=node_ids,
            node_index=index_rows,
            node_json=node_json,
            edges=[],
            model_id=model_id,
            embedding_ids=node_ids if matrix.size else [],
            embeddings=matrix,
            knowledge=self.get_knowledge(chat_id),
            regions=self.get_regions(chat_id),
            timeline=self.get_timeline(chat_id),
            summaries=self.get_summaries(chat_id),
            history=self.get_history(chat_id),
            journal=self.get_journal(chat_id),
            edge_columns=edge_columns,
            embeddings_aligned=bool(matrix.size),
            node_rids=rids,
            edge_rowids=edge_rowids,
        )

    def snapshot_delta(self, chat_id: str, model_id: str, since: int) -> SnapshotDelta | None:
        """What changed in the chat after version ``since`` (a snapshot built at ``since`` plus this delta is the
        snapshot of the current version: :func:`~memory_recall.store.snapshot.apply_delta`), read in this one
        transaction: the node rows, edge rows and ``model_id`` vectors written after ``since`` (``cv > since``,
        through their indexes: time proportional to what changed), the tombstones of what was deleted, and the
        chat state when it was written. ``None`` when no delta describes the change (a ``rebuild`` mark after
        ``since``, or the chat is gone): the caller rebuilds from :meth:`snapshot_source`.
        Malformed packed columns → ``StoreError``."""
        chat_id = validate_chat_id(chat_id)
        model_id = _model_id(model_id) if model_id else ""
        conn = self._conn
        row = conn.execute("SELECT version, state_cv FROM chats WHERE chat_id = ?", (chat_id,)).fetchone()
        if row is None:
            return None
        version, state_cv = int(row[0]), int(row[1])
        tombs = conn.execute(
            "SELECT kind, rid, model_id FROM deletions WHERE chat_id = ? AND version > ?", (chat_id, since)
        ).fetchall()
        if any(kind == "rebuild" for kind, _, _ in tombs):
            return None
        nodes = conn.execute(
            "SELECT rid, ord, node_id, ixb, ixs, jz FROM nodes WHERE chat_id = ? AND cv > ? ORDER BY ord, rid",
            (chat_id, since),
        ).fetchall()
        edges = conn.execute(
            "SELECT rowid, ord, edge_id, relation, eb FROM edges WHERE chat_id = ? AND cv > ? ORDER BY ord, rowid",
            (chat_id, since),
        ).fetchall()
        vectors = conn.execute(
            "SELECT n.rid, e.dim, e.vector FROM embeddings e JOIN nodes n ON n.chat_id = e.chat_id AND "
            "n.node_id = e.node_id WHERE e.chat_id = ? AND e.model_id = ? AND e.cv > ?",
            (chat_id, model_id, since),
        ).fetchall() if model_id else []
        try:
            table = NodeIndexTable.from_packed([r[3] for r in nodes], [r[4] for r in nodes])
        except ValueError as exc:
            raise StoreError(f"corrupt node index in the store: {exc}") from exc
        if any(blob[:1] != b"\x01" for *_, blob in nodes):
            raise StoreError("corrupt nodes in the store: a compressed node JSON has an unknown format")
        if any(len(r[4]) != PACKED_EDGE.size for r in edges):
            raise StoreError("corrupt edges in the store: packed edge columns of the wrong size")
        rec = np.frombuffer(b"".join(r[4] for r in edges), PACKED_EDGE_DTYPE)
        first = conn.execute(
            "SELECT dim FROM embeddings WHERE chat_id = ? AND model_id = ? LIMIT 1", (chat_id, model_id)
        ).fetchone() if model_id else None
        dims = {int(d) for _, d, _ in vectors}
        if len(dims) > 1 or any(len(v) != 4 * d for _, d, v in vectors):
            raise StoreError(f"corrupt embeddings of {model_id!r} in the store: vector sizes differ")
        dim = dims.pop() if dims else 0
        matrix = (
            np.frombuffer(b"".join(v for *_, v in vectors), "<f4").reshape(-1, dim).astype(np.float32)
            if vectors else np.zeros((0, 0), np.float32)
        )
        state = None
        if state_cv > since:
            state = (
                self.get_knowledge(chat_id), self.get_regions(chat_id), self.get_timeline(chat_id),
                self.get_summaries(chat_id), self.get_history(chat_id), self.get_journal(chat_id),
            )

        def rids_of(kind: str, models: tuple[str, ...] = ("",)) -> np.ndarray:
            return np.array(sorted({r for k, r, m in tombs if k == kind and m in models}), dtype=np.int64)

        return SnapshotDelta(
            chat_id=chat_id,
            since=since,
            version=version,
            model_id=model_id,
            node_rids=np.array([r[0] for r in nodes], dtype=np.int64),
            node_ids=[r[2] for r in nodes],
            node_index=table,
            node_blobs=[r[5] for r in nodes],
            deleted_nodes=rids_of("node"),
            edge_rowids=np.array([r[0] for r in edges], dtype=np.int64),
            edge_ids=[r[2] for r in edges],
            edge_relation=[sys.intern(r[3]) for r in edges],
            edge_src_rid=rec["src"].copy(),
            edge_dst_rid=rec["dst"].copy(),
            edge_strength=rec["strength"].copy(),
            edge_type=rec["edge_type"].copy(),
            edge_invalid_at=rec["invalid_at"].copy(),
            edge_expired_at=rec["expired_at"].copy(),
            deleted_edges=rids_of("edge"),
            vector_rids=np.array([r[0] for r in vectors], dtype=np.int64),
            vectors=matrix,
            deleted_vectors=rids_of("embedding", ("", model_id)),
            vector_dim=int(first[0]) if first is not None else 0,
            state=state,
        )

    def _snapshot_nodes(
        self, chat_id: str, model_id: str
    ) -> tuple[list[str], np.ndarray, NodeIndexTable, PackedTexts, np.ndarray]:
        """Node ids, node rowids, decoded index rows and node JSON (compressed) in node order, and the (n × d)
        matrix of their ``model_id`` vectors (zero rows where a node has none; ``zeros((0, 0))`` when no node
        has one)."""
        conn = self._conn
        # The node columns come as one row of concatenations built by SQLite (no Python object per node; ids
        # hold no control characters, the JSON string rows escape them). The rows' order inside an aggregate
        # is the subquery's in practice but not promised: the rowid and ord columns come along and the order
        # is checked below.
        row = conn.execute(
            "SELECT count(*), group_concat(rid), group_concat(ord), group_concat(node_id, char(31)), "
            "group_concat(ixs, ','), CAST(group_concat(ixb, '') AS BLOB), CAST(group_concat(jz, '') AS BLOB), "
            "group_concat(length(jz)) "
            "FROM (SELECT rid, ord, node_id, ixs, ixb, jz FROM nodes WHERE chat_id = ? ORDER BY ord, rid)",
            (chat_id,),
        ).fetchone()
        n = int(row[0])
        if not n:
            empty = np.zeros(0, dtype=np.int64)
            return [], empty, NodeIndexTable.from_packed([], []), PackedTexts(()), np.zeros((0, 0), np.float32)
        rid_text, ord_text, id_text, strings, packed, jz, jz_lengths = row[1:]
        rids = _int_list(rid_text, n, "node rowids")
        ords = _int_list(ord_text, n, "node order")
        if not _lex_sorted(ords, rids):
            raise StoreError("corrupt nodes in the store: the node rows came out of order")
        node_ids = id_text.split("\x1f")
        if len(node_ids) != n:
            raise StoreError("corrupt nodes in the store: a node id holds a control character")
        try:
            table = NodeIndexTable.from_joined(packed or b"", strings or "", n)
        except ValueError as exc:
            raise StoreError(f"corrupt node index in the store: {exc}") from exc
        lengths = _int_list(jz_lengths, n, "node JSON")
        blob = jz or b""
        if bool((lengths <= 0).any()) or int(lengths.sum()) != len(blob):
            raise StoreError("corrupt nodes in the store: compressed node JSON of the wrong size")
        ends = np.cumsum(lengths)
        if not bool((np.frombuffer(blob, np.uint8)[ends - lengths] == 1).all()):  # the format byte of each
            raise StoreError("corrupt nodes in the store: a compressed node JSON has an unknown format")
        del row, rid_text, ord_text, id_text, strings, packed, jz, jz_lengths, lengths
        matrix = self._snapshot_vectors(chat_id, model_id, node_ids)
        return node_ids, rids, table, PackedTexts(BlobSlices(blob, ends)), matrix

    def _snapshot_vectors(self, chat_id: str, model_id: str, node_ids: list[str]) -> np.ndarray:
        """The (n × d) float32 matrix of the chat's ``model_id`` vectors in ``node_ids`` order (zero rows where a
        node has none; ``zeros((0, 0))`` when no node has one), filled chunk by chunk: the leading rows of a
        buffer with spare rows after them."""
        conn = self._conn
        first = conn.execute(
            "SELECT dim FROM embeddings WHERE chat_id = ? AND model_id = ? LIMIT 1", (chat_id, model_id)
        ).fetchone() if model_id else None
        d = int(first[0]) if first is not None else 0
        if not d:
            return np.zeros((0, 0), dtype=np.float32)
        n = len(node_ids)
        # Spare rows after the matrix (zero pages the system maps only when written): the snapshot's first
        # appending delta writes the new nodes' rows there instead of copying the matrix (``spare_rows``).
        matrix = np.zeros((n + spare_rows(n), d), dtype=np.float32)[:n]
        position = dict(zip(node_ids, range(n), strict=True))
        # The chat's vectors in storage order, placed by node id: no join with the nodes table (a third of the
        # read's time at 100k nodes); a vector whose node is not in the chat is ignored, as the join did.
        cursor = conn.execute(
            "SELECT node_id, dim, vector FROM embeddings WHERE chat_id = ? AND model_id = ?", (chat_id, model_id)
        )
        what = f"embeddings of {model_id!r}"
        while rows := cursor.fetchmany(_SNAPSHOT_CHUNK):
            ids, dims, blobs = zip(*rows, strict=True)
            if set(dims) != {d} or set(map(len, blobs)) != {4 * d}:
                raise StoreError(f"corrupt {what} in the store: vector sizes differ")
            at = np.fromiter(map(position.get, ids, itertools.repeat(-1)), dtype=np.int64, count=len(ids))
            vectors = np.frombuffer(b"".join(blobs), "<f4").reshape(-1, d)
            del rows, ids, dims, blobs
            keep = at >= 0
            # One chunk-sized join, copied into place: the full matrix is never built twice.
            matrix[at[keep]] = vectors if keep.all() else vectors[keep]
        return matrix

    def _snapshot_edges(self, chat_id: str, rids: np.ndarray) -> tuple[EdgeColumns, np.ndarray]:
        """The chat's edges in edge-list order as columns, endpoints as positions in node order (``rids`` holds
        the node rowids in that order; −1 for an end that is not a node of the chat), and their rowids."""
        # One row of concatenations, as for the nodes (edge ids hold no control characters; a relation word that
        # holds the separator is caught by the count check).
        row = self._conn.execute(
            "SELECT count(*), group_concat(rowid), group_concat(ord), group_concat(edge_id, char(31)), "
            "group_concat(relation, char(31)), CAST(group_concat(eb, '') AS BLOB) "
            "FROM (SELECT rowid, ord, edge_id, relation, eb FROM edges WHERE chat_id = ? ORDER BY ord, rowid)",
            (chat_id,),
        ).fetchone()
        m = int(row[0])
        if not m:
            return EdgeColumns.empty(), np.zeros(0, np.int64)
        rowid_text, ord_text, id_text, relation_text, packed = row[1:]
        edge_rowids = _int_list(rowid_text, m, "edge rowids")
        if not _lex_sorted(_int_list(ord_text, m, "edge order"), edge_rowids):
            raise StoreError("corrupt edges in the store: the edge rows came out of order")
        try:
            edge_ids = JoinedStrings.split(id_text, "\x1f", m)  # compact: ~10 bytes per id, no str objects
        except ValueError as exc:
            raise StoreError(f"corrupt edges in the store: an edge id holds a control character ({exc})") from exc
        relation = relation_text.split("\x1f")
        if len(relation) != m:  # a relation word holds the separator (allowed): read the column row by row
            relation = [r for (r,) in self._conn.execute(
                "SELECT relation FROM edges WHERE chat_id = ? ORDER BY ord, rowid", (chat_id,)
            )]
        # A few distinct words: one string object each.
        interned = {word: sys.intern(word) for word in set(relation)}
        relation = list(map(interned.__getitem__, relation))
        if packed is None or len(packed) != m * PACKED_EDGE.size:
            raise StoreError("corrupt edges in the store: packed edge columns of the wrong size")
        rec = np.frombuffer(packed, PACKED_EDGE_DTYPE)
        position = _rid_positions(rids)
        return EdgeColumns(
            edge_ids, position(rec["src"]), position(rec["dst"]), relation,
            rec["strength"].copy(), rec["edge_type"].copy(), rec["invalid_at"].copy(), rec["expired_at"].copy(),
        ), edge_rowids

    def embedding_hashes(self, chat_id: str, model_id: str) -> dict[str, str]:
        """node id → text hash of its stored ``model_id`` vector (``""`` when stored without one)."""
        chat_id = validate_chat_id(chat_id)
        model_id = _model_id(model_id)
        rows = self._conn.execute(
            "SELECT e.node_id, e.text_hash FROM embeddings e "
            "JOIN nodes n ON n.chat_id = e.chat_id AND n.node_id = e.node_id "
            "WHERE e.chat_id = ? AND e.model_id = ? ORDER BY n.ord, n.rid",
            (chat_id, model_id),
        ).fetchall()
        return dict(rows)

    def cache_get(self, model_id: str, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """Cached vectors of ``model_id`` for the text hashes that are in the cache (global, not per chat)."""
        model_id = _model_id(model_id)
        wanted = _id_list(hashes, "hashes")
        out: dict[str, np.ndarray] = {}
        for part in _chunks(wanted):
            for h, dim, blob in self._conn.execute(
                f"SELECT text_hash, dim, vector FROM embedding_cache WHERE model_id = ? "
                f"AND text_hash IN ({_marks(len(part))})",
                (model_id, *part),
            ):
                out[h] = _matrix([blob], [dim], "embedding cache")[0]
        return {h: out[h] for h in wanted if h in out}

    # -- recall records ------------------------------------------------------------------------------------

    def get_record(self, chat_id: str, user_floor: int) -> PersistedRecall | None:
        """The recall record of one user floor, or ``None``."""
        chat_id = validate_chat_id(chat_id)
        floor = _int_arg(user_floor, "user_floor", 0, sys.maxsize)
        row = self._conn.execute(
            "SELECT json FROM recall_records WHERE chat_id = ? AND user_floor = ?", (chat_id, floor)
        ).fetchone()
        return None if row is None else _load(PersistedRecall, row[0], f"recall record {floor}")

    def list_records(self, chat_id: str) -> list[PersistedRecall]:
        """The chat's recall records by user floor."""
        chat_id = validate_chat_id(chat_id)
        rows = self._conn.execute(
            "SELECT json FROM recall_records WHERE chat_id = ? ORDER BY user_floor", (chat_id,)
        ).fetchall()
        return [_load(PersistedRecall, r[0], "recall record") for r in rows]

    # -- lexical -------------------------------------------------------------------------------------------

    def bm25(
        self, chat_id: str, terms: Sequence[str], limit: int = 50, *, stem: str = "none"
    ) -> list[tuple[str, float]]:
        """Non-archived nodes matching any of ``terms``, best first: ``(node_id, score)``.

        The score is FTS5's ``-bm25(nodes_fts, 3.0, 2.0, 1.0)`` (primary, secondary, body column weights),
        higher is better, with IDF and average length computed over this chat's rows only; ties by node id.
        Terms are plain text, never FTS syntax (:mod:`memory_recall.store.bm25_index` states the formula and
        the term rules). This reader builds the chat's index for each call (it sees its own snapshot, a
        writer its uncommitted rows); :meth:`Store.bm25` caches the index per chat version. ``stem`` stems
        index and query terms alike (``"none"``, ``"s"``, ``"porter"``; see the bm25_index module).
        """
        chat_id, term_list, limit = _bm25_args(chat_id, terms, limit)
        stem = _bm25_stem(stem)
        if not term_list:
            return []
        return _bm25_read_index(self._conn, chat_id, stem).query(term_list, limit)


def _int_list(text: str | None, count: int, what: str) -> np.ndarray:
    """The ``count`` integers of a ``group_concat`` of integers, as an int64 array."""
    try:  # numpy's text parser: no str object per value
        values = np.fromstring(text, dtype=np.int64, sep=",") if text else np.zeros(0, np.int64)
    except ValueError as exc:
        raise StoreError(f"corrupt {what} in the store: {exc}") from exc
    if values.size != count:
        raise StoreError(f"corrupt {what} in the store: {values.size} values for {count} rows")
    return values


def _lex_sorted(major: np.ndarray, minor: np.ndarray) -> bool:
    """Whether the pairs ``(major[i], minor[i])`` are in ascending order."""
    dm = np.diff(major)
    return bool((dm >= 0).all() and ((dm > 0) | (np.diff(minor) > 0)).all())


def _rid_positions(rids: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A vectorised map of node rowids to positions in ``rids`` (−1 for rowids not in it)."""
    n = rids.size
    if not n:
        return lambda q: np.full(q.size, -1, dtype=np.int64)
    lo, hi = int(rids.min()), int(rids.max())
    if hi - lo < 4 * n + 1024:
        # A chat's rowids are mostly dense: one lookup table of the span.
        table = np.full(hi - lo + 1, -1, dtype=np.int64)
        table[rids - lo] = np.arange(n, dtype=np.int64)

        def dense(q: np.ndarray) -> np.ndarray:
            inside = (q >= lo) & (q <= hi)
            out = np.full(q.size, -1, dtype=np.int64)
            out[inside] = table[q[inside] - lo]
            return out

        return dense
    order = np.argsort(rids, kind="stable")
    sorted_rids = rids[order]

    def sparse(q: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(sorted_rids, q), n - 1)
        return np.where(sorted_rids[at] == q, order[at], -1).astype(np.int64)

    return sparse


def _bm25_args(chat_id: str, terms: Sequence[str], limit: int) -> tuple[str, list[str], int]:
    """Validated ``bm25`` arguments; the terms with NUL, lone surrogates and blank terms removed."""
    chat_id = validate_chat_id(chat_id)
    limit = _int_arg(limit, "limit", 1, _MAX_BM25_LIMIT)
    if isinstance(terms, str):
        raise InputError("terms", "must be a list of terms, not one string")
    term_list = [_str_arg(t, f"terms[{i}]") for i, t in enumerate(terms)]
    if len(term_list) > _MAX_BM25_TERMS:
        raise InputError("terms", f"must hold at most {_MAX_BM25_TERMS} terms, got {len(term_list)}")
    return chat_id, [t for t in term_list if t.strip()], limit


def _bm25_stem(stem: str) -> str:
    """A validated ``bm25`` stem method (InputError naming ``stem`` otherwise)."""
    if not isinstance(stem, str) or stem not in STEM_METHODS:
        raise InputError("stem", f"must be one of {', '.join(STEM_METHODS)}, got {stem!r}")
    return stem


def _bm25_read_index(conn: sqlite3.Connection, chat_id: str, stem: str = "none") -> Bm25Index:
    """The BM25 index of the chat's FTS rows (its non-archived nodes), read on ``conn``."""
    # Through nodes (indexed by chat, in node-id order) to the FTS row by rowid: filtering nodes_fts on its
    # UNINDEXED chat_id column would scan every chat's rows. The rows are read from FTS5's content shadow
    # table (columns c0, c1, c2 = the three term columns): half the time of a lookup through the virtual table.
    rows = conn.execute(
        "SELECT n.node_id, f.c0, f.c1, f.c2 FROM nodes AS n "
        "JOIN nodes_fts_content AS f ON f.id = n.rid WHERE n.chat_id = ? ORDER BY n.node_id",
        (chat_id,),
    ).fetchall()
    if not rows:
        return Bm25Index.build([], [], [], [], stem=stem)
    ids, primary, secondary, body = zip(*rows, strict=True)
    return Bm25Index.build(ids, primary, secondary, body, stem=stem)


def _bm25_read_rows(conn: sqlite3.Connection, chat_id: str, ids: Iterable[str]) -> dict[str, tuple[str, str, str]]:
    """node id → its three FTS term columns, for those of ``ids`` that are indexed (non-archived nodes of the
    chat), read on ``conn``: the delta a cached BM25 index needs (:meth:`Bm25Cache.get`), by primary key."""
    found: dict[str, tuple[str, str, str]] = {}
    for part in _chunks(sorted(ids)):
        for node_id, primary, secondary, body in conn.execute(
            "SELECT n.node_id, f.c0, f.c1, f.c2 FROM nodes AS n JOIN nodes_fts_content AS f ON f.id = n.rid "
            f"WHERE n.chat_id = ? AND n.node_id IN ({_marks(len(part))})",
            (chat_id, *part),
        ):
            found[node_id] = (primary, secondary, body)
    return found


# ------------------------------------------------------------------------------------------------------------
# Writes
# ------------------------------------------------------------------------------------------------------------

_UPSERT_NODE = (
    "INSERT INTO nodes(chat_id, node_id, ord, type, archived, seq_end, json, idx, ixb, ixs, jz, cv) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(chat_id, node_id) DO UPDATE SET "
    "type = excluded.type, archived = excluded.archived, seq_end = excluded.seq_end, json = excluded.json, "
    "idx = excluded.idx, ixb = excluded.ixb, ixs = excluded.ixs, jz = excluded.jz, cv = excluded.cv"
)
_UPSERT_NODE_REORDER = _UPSERT_NODE + ", ord = excluded.ord"
# Every write of nodes_fts adds its node ids to StoreWriter._fts_touched: the chat's cached BM25 index is brought
# to the batch's version from exactly those rows (Bm25Cache.advance), so a write missing there would be served stale.
_DELETE_FTS = "DELETE FROM nodes_fts WHERE rowid = (SELECT rid FROM nodes WHERE chat_id = ? AND node_id = ?)"
_INSERT_FTS = (
    "INSERT INTO nodes_fts(rowid, primary_terms, secondary_terms, body_terms, chat_id, node_id) "
    "VALUES ((SELECT rid FROM nodes WHERE chat_id = ?1 AND node_id = ?2), ?3, ?4, ?5, ?1, ?2)"
)
_UPSERT_EDGE = (
    "INSERT INTO edges(chat_id, edge_id, from_id, to_id, ord, json, relation, strength, edge_type, invalid_at, "
    "expired_at, eb, cv) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(chat_id, edge_id) DO UPDATE SET "
    "from_id = excluded.from_id, to_id = excluded.to_id, json = excluded.json, relation = excluded.relation, "
    "strength = excluded.strength, edge_type = excluded.edge_type, invalid_at = excluded.invalid_at, "
    "expired_at = excluded.expired_at, eb = excluded.eb, cv = excluded.cv"
)
#: Tombstones of a write batch (:meth:`StoreReader.snapshot_delta`): ``(chat_id, version, kind, rid, model_id)``.
_RECORD_DELETION = "INSERT INTO deletions(chat_id, version, kind, rid, model_id) VALUES (?, ?, ?, ?, ?)"


class StoreWriter(StoreReader):
    """The operations of one write batch on one chat (``with store.write(chat_id) as w``).

    Everything runs in the batch's transaction; the chat's version is bumped once when the batch commits.
    Methods validate their input before touching the database and raise :class:`InputError` naming the item.
    """

    def __init__(self, conn: sqlite3.Connection, chat_id: str, now_ms: int) -> None:
        super().__init__(conn)
        self.chat_id = chat_id
        self._now = now_ms
        self._open = True
        conn.execute(
            "INSERT INTO chats(chat_id, version, created_at, updated_at) VALUES (?, 0, ?, ?) "
            "ON CONFLICT(chat_id) DO NOTHING",
            (chat_id, now_ms, now_ms),
        )
        clock = _get_meta(conn, "version_clock") or 0
        current = conn.execute("SELECT version FROM chats WHERE chat_id = ?", (chat_id,)).fetchone()[0]
        self._version = max(int(clock), int(current)) + 1
        #: The chat's version when the batch began, and the node ids whose FTS rows the batch wrote or deleted.
        self._base_version = int(current)
        self._fts_touched: set[str] = set()
        #: For the store's ingest cache: node id → stored JSON (``None``: deleted) in write order, the ids whose
        #: rows the batch inserted, and whether the cache can follow the batch (no reorder).
        self._node_log: dict[str, str | None] = {}
        self._created: set[str] = set()
        self._followable = True

    @property
    def version(self) -> int:
        """The version the chat has once this batch commits."""
        return self._version

    def _check_open(self) -> sqlite3.Connection:
        if not self._open:
            raise StoreError("the batch writer was used after its `with store.write(...)` block ended")
        return self._conn

    def _commit_version(self) -> None:
        conn = self._check_open()
        conn.execute(
            "UPDATE chats SET version = ?, updated_at = ? WHERE chat_id = ?",
            (self._version, self._now, self.chat_id),
        )
        _set_meta(conn, "version_clock", self._version)

    def _existing_nodes(self, ids: Sequence[str]) -> dict[str, int]:
        """node id → rowid of the ids that are nodes of the chat."""
        found: dict[str, int] = {}
        for part in _chunks(ids):
            found.update(
                self._conn.execute(
                    f"SELECT node_id, rid FROM nodes WHERE chat_id = ? AND node_id IN ({_marks(len(part))})",
                    (self.chat_id, *part),
                )
            )
        return found

    def _next_ord(self, table: str) -> int:
        sql = f"SELECT coalesce(max(ord), 0) FROM {table} WHERE chat_id = ?"
        return int(self._conn.execute(sql, (self.chat_id,)).fetchone()[0]) + 1

    # -- nodes ---------------------------------------------------------------------------------------------

    def upsert_nodes(self, nodes: Iterable[Node | Mapping[str, Any]]) -> int:
        """Insert or replace nodes (a replaced node keeps its insertion position); returns the count.

        A node repeated in the batch is written once with its last value at its first position.
        """
        return self._upsert_nodes(nodes, reorder=False)

    def _upsert_nodes(self, nodes: Iterable[Node | Mapping[str, Any]], *, reorder: bool) -> int:
        conn = self._check_open()
        batch: dict[str, tuple[int, Node]] = {}
        for i, item in enumerate(nodes):
            node = parse_node(item, f"nodes[{i}]")
            batch[node.id] = (i, node)
        if not batch:
            return 0
        chat = self.chat_id
        base = 1 if reorder else self._next_ord("nodes")
        # A stored node whose FTS row would come out the same (same archived flag, same fields in the same order:
        # the FTS columns are a function of those) keeps its row, and the chat's BM25 index its document. A chat
        # turn rewrites the previous message (its link to the new one) and the owners it mentions (their floor
        # ranges), whose text stands.
        stored = {} if reorder else self._stored_rows(list(batch))
        rows: list[tuple[Any, ...]] = []
        fts: list[tuple[str, str, str, str, str]] = []
        touched: list[str] = []
        for k, (i, node) in enumerate(batch.values()):
            text = _dumps(node, f"nodes[{i}]")
            seq_end = node.seq_range[1] if node.seq_range is not None else None
            ix = node_index(node)
            rows.append(
                (chat, node.id, base + k, node.type, int(node.archived), seq_end, text, ix.to_json(),
                 ix.to_packed(), ix.strings_json(), compress_text(text), self._version)
            )
            old = stored.get(node.id)
            if old is not None and old[0] == int(node.archived) and same_fields(old[1], text):
                continue
            touched.append(node.id)
            if not node.archived:
                fts.append((chat, node.id, *fts_columns(node)))
        if reorder:  # node order changes: no delta describes it
            self._record_rebuild()
            self._followable = False
        else:
            self._created.update(nid for nid in batch if nid not in stored)
            for row in rows:
                self._node_log[row[1]] = row[6]
        self._fts_touched.update(touched)
        conn.executemany(_DELETE_FTS, [(chat, node_id) for node_id in touched])
        conn.executemany(_UPSERT_NODE_REORDER if reorder else _UPSERT_NODE, rows)
        conn.executemany(_INSERT_FTS, fts)
        return len(rows)

    def _stored_rows(self, ids: Sequence[str]) -> dict[str, tuple[int, str]]:
        """node id → (archived, JSON) of the ids that are nodes of the chat."""
        found: dict[str, tuple[int, str]] = {}
        for part in _chunks(ids):
            rows = self._conn.execute(
                f"SELECT node_id, archived, json FROM nodes WHERE chat_id = ? AND node_id IN ({_marks(len(part))})",
                (self.chat_id, *part),
            )
            found.update((node_id, (int(archived), text)) for node_id, archived, text in rows)
        return found

    def delete_nodes(self, ids: Iterable[str]) -> int:
        """Hard-delete nodes with their edges, embeddings and FTS rows; unknown ids are ignored.

        Returns the number of nodes deleted.
        """
        conn = self._check_open()
        params = [(self.chat_id, node_id) for node_id in _id_list(ids, "ids")]
        self._fts_touched.update(node_id for _, node_id in params)
        conn.executemany(_DELETE_FTS, params)
        # The node tombstones; the edges and vectors the cascade deletes go with their node (a snapshot delta
        # drops what touches a deleted node).
        conn.executemany(
            "INSERT INTO deletions(chat_id, version, kind, rid, model_id) "
            "SELECT chat_id, ?, 'node', rid, '' FROM nodes WHERE chat_id = ? AND node_id = ?",
            [(self._version, *p) for p in params],
        )
        # Edges and embeddings go through ON DELETE CASCADE (rowcount counts the direct deletes only).
        cur = conn.executemany("DELETE FROM nodes WHERE chat_id = ? AND node_id = ?", params)
        for _, node_id in params:
            # Popped first: a node written again after this is a new row, last in insertion order.
            self._node_log.pop(node_id, None)
            self._node_log[node_id] = None
            self._created.discard(node_id)
        return max(cur.rowcount, 0)

    def reinforce(self, node_ids: Iterable[str], now_ms: int, importance_step: float = 0.1) -> int:
        """Access reinforcement (reference §1.9) of the recalled nodes; returns how many were updated.

        ``access_count + 1``, ``importance = min(10, importance + importance_step)`` (0.1 in the reference),
        ``last_access_time = now_ms``.
        Unknown ids are ignored (a node may be deleted between recall and reinforcement); each id counts once.
        """
        conn = self._check_open()
        now = _int_arg(now_ms, "now_ms", 0, _MAX_MILLIS)
        if not (isinstance(importance_step, int | float) and 0 <= importance_step <= 10):
            raise InputError("importance_step", f"must be a number in [0, 10], got {importance_step!r}")
        step = float(importance_step)
        ids = _id_list(node_ids, "node_ids")
        updates: list[tuple[str, str, bytes, str, bytes, str, str]] = []
        for part in _chunks(ids):
            for node_id, text in conn.execute(
                f"SELECT node_id, json FROM nodes WHERE chat_id = ? AND node_id IN ({_marks(len(part))})",
                (self.chat_id, *part),
            ).fetchall():
                node = _load(Node, text, f"node {node_id!r}")
                node = node.model_copy(
                    update={
                        "access_count": node.access_count + 1,
                        "importance": min(10.0, node.importance + step),
                        "last_access_time": now,
                    }
                )
                ix = node_index(node)
                text = _dumps(node, f"node {node_id!r}")
                updates.append(
                    (text, ix.to_json(), ix.to_packed(), ix.strings_json(), compress_text(text), self.chat_id,
                     node_id)
                )
        conn.executemany(
            "UPDATE nodes SET json = ?, idx = ?, ixb = ?, ixs = ?, jz = ?, cv = ? WHERE chat_id = ? AND node_id = ?",
            [(*u[:5], self._version, *u[5:]) for u in updates],
        )
        for u in updates:
            self._node_log[u[6]] = u[0]
        return len(updates)

    # -- edges ---------------------------------------------------------------------------------------------

    def upsert_edges(self, edges: Iterable[Edge | Mapping[str, Any]]) -> int:
        """Insert or replace edges (a replaced edge keeps its position); both ends must exist in the chat."""
        conn = self._check_open()
        batch: dict[str, tuple[int, Edge]] = {}
        for i, item in enumerate(edges):
            edge = parse_edge(item, f"edges[{i}]")
            batch[edge.id] = (i, edge)
        if not batch:
            return 0
        ends = list(dict.fromkeys(end for _, e in batch.values() for end in (e.from_id, e.to_id)))
        present = self._existing_nodes(ends)
        for i, edge in batch.values():
            for attr in ("from_id", "to_id"):
                end = getattr(edge, attr)
                if end not in present:
                    raise NotFound(
                        f"edges[{i}].{attr}",
                        f"edge {edge.id!r} points at node {end!r}, "
                        f"which does not exist in chat {self.chat_id!r}",
                    )
        base = self._next_ord("edges")
        rows = []
        for k, (i, edge) in enumerate(batch.values()):
            text = _dumps(edge, f"edges[{i}]")
            packed = _pack_edge(present[edge.from_id], present[edge.to_id], edge.strength, edge.edge_type,
                                edge.invalid_at, edge.expired_at)
            rows.append(
                (self.chat_id, edge.id, edge.from_id, edge.to_id, base + k, text, edge.relation, edge.strength,
                 edge.edge_type, edge.invalid_at, edge.expired_at, packed, self._version)
            )
        conn.executemany(_UPSERT_EDGE, rows)
        return len(rows)

    def delete_edges(self, ids: Iterable[str]) -> int:
        """Delete edges by id; unknown ids are ignored. Returns the count deleted."""
        conn = self._check_open()
        params = [(self.chat_id, edge_id) for edge_id in _id_list(ids, "ids")]
        conn.executemany(
            "INSERT INTO deletions(chat_id, version, kind, rid, model_id) "
            "SELECT chat_id, ?, 'edge', rowid, '' FROM edges WHERE chat_id = ? AND edge_id = ?",
            [(self._version, *p) for p in params],
        )
        cur = conn.executemany("DELETE FROM edges WHERE chat_id = ? AND edge_id = ?", params)
        return max(cur.rowcount, 0)

    # -- embeddings ----------------------------------------------------------------------------------------

    def put_embeddings(
        self,
        model_id: str,
        vectors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray, str]],
    ) -> int:
        """Store node vectors of one model: ``{node_id: vector}`` or ``[(node_id, vector, text_hash)]``.

        Vectors must be finite, 1-D, of one dimension, and of the dimension already stored for ``model_id`` in
        this chat; they are stored as little-endian float32. Every node must exist. Returns the count.
        """
        conn = self._check_open()
        model_id = _model_id(model_id)
        items: list[tuple[str, str, object, str]] = []  # (field, node_id, vector, text_hash)
        if isinstance(vectors, Mapping):
            for key, vec in vectors.items():
                items.append((f"vectors[{key!r}]", _str_arg(key, "vectors"), vec, ""))
        else:
            for i, item in enumerate(vectors):
                if not isinstance(item, tuple | list) or len(item) != 3:
                    raise InputError(f"vectors[{i}]", "must be a (node_id, vector, text_hash) tuple")
                node_id = _str_arg(item[0], f"vectors[{i}].node_id")
                text_hash = _text_hash(item[2], f"vectors[{i}].text_hash")
                items.append((f"vectors[{i}]", node_id, item[1], text_hash))
        if not items:
            return 0
        rows: list[tuple[str, str, str, int, str, bytes, int]] = []
        dim = 0
        for field, node_id, vec, text_hash in items:
            arr = _vector(vec, field)
            if dim and arr.shape[0] != dim:
                raise InputError(field, f"has dimension {arr.shape[0]}, but the first vector has {dim}")
            dim = arr.shape[0]
            rows.append((self.chat_id, node_id, model_id, dim, text_hash, arr.tobytes(), self._version))
        stored = conn.execute(
            "SELECT dim FROM embeddings WHERE chat_id = ? AND model_id = ? LIMIT 1", (self.chat_id, model_id)
        ).fetchone()
        if stored is not None and stored[0] != dim:
            raise InputError(
                "vectors",
                f"dimension {dim} differs from the dimension {stored[0]} already stored for model "
                f"{model_id!r} in chat {self.chat_id!r}",
            )
        present = self._existing_nodes(list(dict.fromkeys(r[1] for r in rows)))
        for field, node_id, _, _ in items:
            if node_id not in present:
                raise InputError(field, f"node {node_id!r} does not exist in chat {self.chat_id!r}")
        conn.executemany(
            "INSERT INTO embeddings(chat_id, node_id, model_id, dim, text_hash, vector, cv) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(chat_id, node_id, model_id) DO UPDATE SET "
            "dim = excluded.dim, text_hash = excluded.text_hash, vector = excluded.vector, cv = excluded.cv",
            rows,
        )
        return len(rows)

    def delete_embeddings(self, model_id: str, node_ids: Iterable[str] | None = None) -> int:
        """Delete the chat's ``model_id`` vectors (all, or those of ``node_ids``). Returns the count."""
        conn = self._check_open()
        model_id = _model_id(model_id)
        if node_ids is None:
            self._record_rebuild()
            sql = "DELETE FROM embeddings WHERE chat_id = ? AND model_id = ?"
            return conn.execute(sql, (self.chat_id, model_id)).rowcount
        params = [(self.chat_id, node_id, model_id) for node_id in _id_list(node_ids, "node_ids")]
        conn.executemany(
            "INSERT INTO deletions(chat_id, version, kind, rid, model_id) "
            "SELECT e.chat_id, ?, 'embedding', n.rid, e.model_id FROM embeddings e "
            "JOIN nodes n ON n.chat_id = e.chat_id AND n.node_id = e.node_id "
            "WHERE e.chat_id = ? AND e.node_id = ? AND e.model_id = ?",
            [(self._version, *p) for p in params],
        )
        sql = "DELETE FROM embeddings WHERE chat_id = ? AND node_id = ? AND model_id = ?"
        cur = conn.executemany(sql, params)
        return max(cur.rowcount, 0)

    def move_embeddings(self, moves: Sequence[tuple[str, str]]) -> int:
        """Move every model's vector of node ``old`` to node ``new`` for each ``(old, new)`` pair, in order.

        A vector already stored under ``new`` is replaced; ``new`` must be a node of the chat. Pairs apply one
        after the other, so a chain ``(b, a), (c, b)`` shifts vectors down without losing one. Returns the
        number of vectors moved.
        """
        conn = self._check_open()
        moved = 0
        for i, (old, new) in enumerate(moves):
            old = _str_arg(old, f"moves[{i}][0]")
            new = _str_arg(new, f"moves[{i}][1]")
            if old == new:
                continue
            if new not in self._existing_nodes([new]):
                raise InputError(f"moves[{i}][1]", f"node {new!r} does not exist in chat {self.chat_id!r}")
            conn.execute("DELETE FROM embeddings WHERE chat_id = ? AND node_id = ?", (self.chat_id, new))
            # ``old`` loses its vectors (every model: model_id ''), ``new`` gets them (their cv).
            conn.execute(
                "INSERT INTO deletions(chat_id, version, kind, rid, model_id) "
                "SELECT chat_id, ?, 'embedding', rid, '' FROM nodes WHERE chat_id = ? AND node_id = ?",
                (self._version, self.chat_id, old),
            )
            moved += conn.execute(
                "UPDATE embeddings SET node_id = ?, cv = ? WHERE chat_id = ? AND node_id = ?",
                (new, self._version, self.chat_id, old),
            ).rowcount
        return moved

    # -- chat state ----------------------------------------------------------------------------------------

    def _validated(self, value: Any, cls: type[T], field: str) -> T:
        if isinstance(value, cls):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise first_validation_error(exc, field) from None

    def _state_changed(self) -> None:
        """Mark the chat state (knowledge, regions, timeline, summaries, history, journal) as written by this
        batch (``chats.state_cv``: a snapshot delta then reads it again)."""
        self._check_open().execute(
            "UPDATE chats SET state_cv = ? WHERE chat_id = ?", (self._version, self.chat_id)
        )

    def _record_rebuild(self) -> None:
        """A write no snapshot delta describes (node reorder, every vector of a model dropped): snapshots older
        than this batch are rebuilt from the store."""
        self._check_open().execute(_RECORD_DELETION, (self.chat_id, self._version, "rebuild", 0, ""))

    def _put_state(self, kind: str, text: str) -> None:
        conn = self._check_open()
        self._state_changed()
        conn.execute(
            "INSERT INTO chat_state(chat_id, kind, json) VALUES (?, ?, ?) "
            "ON CONFLICT(chat_id, kind) DO UPDATE SET json = excluded.json",
            (self.chat_id, kind, text),
        )

    def set_knowledge(self, state: KnowledgeState) -> None:
        """Replace the chat's knowledge owners."""
        conn = self._check_open()
        state = self._validated(state, KnowledgeState, "knowledge")
        rows = []
        for i, (key, owner) in enumerate(state.owners.items()):
            text = _dumps(owner, f"knowledge.owners[{key!r}]")
            rows.append((self.chat_id, key, i, text))
        self._state_changed()
        conn.execute("DELETE FROM knowledge_owners WHERE chat_id = ?", (self.chat_id,))
        sql = "INSERT INTO knowledge_owners(chat_id, owner_key, ord, json) VALUES (?, ?, ?, ?)"
        conn.executemany(sql, rows)

    def set_regions(self, state: RegionState) -> None:
        """Replace the chat's region state."""
        self._put_state("regions", _dumps(self._validated(state, RegionState, "regions"), "regions"))

    def set_timeline(self, state: TimelineState) -> None:
        """Replace the chat's story timeline."""
        self._put_state("timeline", _dumps(self._validated(state, TimelineState, "timeline"), "timeline"))

    def set_summaries(self, state: SummaryState) -> None:
        """Replace the chat's summary state."""
        self._put_state("summaries", _dumps(self._validated(state, SummaryState, "summaries"), "summaries"))

    def set_history(self, state: HistoryState) -> None:
        """Replace the chat's history state."""
        self._put_state("history", _dumps(self._validated(state, HistoryState, "history"), "history"))

    def set_journal(self, entries: Iterable[JournalEntry]) -> None:
        """Replace the chat's batch journal."""
        items = [self._validated(e, JournalEntry, f"journal[{i}]") for i, e in enumerate(entries)]
        parts = [_dumps(e, f"journal[{i}]") for i, e in enumerate(items)]
        self._put_state("journal", "[" + ",".join(parts) + "]")  # marks the state changed

    # -- recall records ------------------------------------------------------------------------------------

    def put_record(self, record: PersistedRecall) -> None:
        """Insert or replace the record of ``record.user_floor``; ``record.chat_id`` must be this chat."""
        conn = self._check_open()
        record = self._validated(record, PersistedRecall, "record")
        if record.chat_id != self.chat_id:
            raise InputError(
                "record.chat_id", f"is {record.chat_id!r}, but the batch writes chat {self.chat_id!r}"
            )
        text = _dumps(record, "record")
        conn.execute(
            "INSERT INTO recall_records(chat_id, user_floor, json, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(chat_id, user_floor) DO UPDATE SET "
            "json = excluded.json, updated_at = excluded.updated_at",
            (self.chat_id, record.user_floor, text, record.updated_at or self._now),
        )

    def delete_record(self, user_floor: int) -> bool:
        """Delete the record of one user floor; ``False`` when there was none."""
        conn = self._check_open()
        floor = _int_arg(user_floor, "user_floor", 0, sys.maxsize)
        sql = "DELETE FROM recall_records WHERE chat_id = ? AND user_floor = ?"
        return conn.execute(sql, (self.chat_id, floor)).rowcount > 0

    def delete_records_from(self, user_floor: int) -> int:
        """Delete the records at floors ≥ ``user_floor`` (the chat was cut back); returns the count."""
        conn = self._check_open()
        floor = _int_arg(user_floor, "user_floor", 0, sys.maxsize)
        sql = "DELETE FROM recall_records WHERE chat_id = ? AND user_floor >= ?"
        return conn.execute(sql, (self.chat_id, floor)).rowcount

    def shift_records_down(self, user_floor: int) -> int:
        """A message before the later floors was removed: delete the record of ``user_floor`` and move the
        record of every floor after it down one floor (``user_floor`` in its JSON too). Returns the number of
        records moved."""
        conn = self._check_open()
        floor = _int_arg(user_floor, "user_floor", 0, sys.maxsize)
        conn.execute("DELETE FROM recall_records WHERE chat_id = ? AND user_floor = ?", (self.chat_id, floor))
        rows = conn.execute(
            "SELECT user_floor, json FROM recall_records WHERE chat_id = ? AND user_floor > ? ORDER BY user_floor",
            (self.chat_id, floor),
        ).fetchall()
        for old, text in rows:
            record = _load(PersistedRecall, text, f"recall record {old}")
            moved = record.model_copy(update={"user_floor": old - 1})
            conn.execute(
                "UPDATE recall_records SET user_floor = ?, json = ? WHERE chat_id = ? AND user_floor = ?",
                (old - 1, _dumps(moved, "record"), self.chat_id, old),
            )
        return len(rows)

    # -- whole graph ---------------------------------------------------------------------------------------

    def replace_graph(self, graph: MemoryGraph) -> None:
        """Make the chat's nodes, edges and state exactly ``graph`` (importers).

        Nodes missing from ``graph`` are deleted (with their embeddings); kept nodes keep their embeddings,
        whose text hashes tell a caller whether they are stale. Node order becomes the graph's order. Recall
        records stay.
        """
        conn = self._check_open()
        graph = self._validated(graph, MemoryGraph, "graph")
        keep = {n.id for n in graph.nodes}
        rows = conn.execute("SELECT node_id FROM nodes WHERE chat_id = ?", (self.chat_id,)).fetchall()
        existing = [r[0] for r in rows]
        self._record_rebuild()  # every edge goes and node order changes
        self._followable = False
        conn.execute("DELETE FROM edges WHERE chat_id = ?", (self.chat_id,))
        self.delete_nodes([node_id for node_id in existing if node_id not in keep])
        self._upsert_nodes(graph.nodes, reorder=True)
        self.upsert_edges(graph.edges)
        self.set_knowledge(graph.knowledge)
        self.set_regions(graph.regions)
        self.set_timeline(graph.timeline)
        self.set_summaries(graph.summaries)
        self.set_history(graph.history)
        self.set_journal(graph.batch_journal)


def _cache_put(conn: sqlite3.Connection, model_id: str, items: Mapping[str, np.ndarray]) -> int:
    model_id = _model_id(model_id)
    if not isinstance(items, Mapping):
        raise InputError("items", "must be a mapping of text hash to vector")
    rows: list[tuple[str, str, int, bytes]] = []
    dim = 0
    for key, vec in items.items():
        field = f"items[{key!r}]"
        text_hash = _text_hash(key, field)
        if not text_hash:
            raise InputError(field, "the text hash must not be empty")
        arr = _vector(vec, field)
        if dim and arr.shape[0] != dim:
            raise InputError(field, f"has dimension {arr.shape[0]}, but the first vector has {dim}")
        dim = arr.shape[0]
        rows.append((model_id, text_hash, dim, arr.tobytes()))
    if not rows:
        return 0
    sql = "SELECT dim FROM embedding_cache WHERE model_id = ? LIMIT 1"
    stored = conn.execute(sql, (model_id,)).fetchone()
    if stored is not None and stored[0] != dim:
        raise InputError(
            "items", f"dimension {dim} differs from the dimension {stored[0]} cached for model {model_id!r}"
        )
    conn.executemany(
        "INSERT OR REPLACE INTO embedding_cache(model_id, text_hash, dim, vector) VALUES (?, ?, ?, ?)", rows
    )
    return len(rows)


def _create_private(path: Path) -> None:
    """Create ``path`` as an empty file of mode 0600 unless something exists there (an empty file is an empty
    SQLite database; SQLite would create it 0644). Raises :class:`StoreError` when it cannot be created."""
    if path.exists():
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process created it meanwhile
    except OSError as exc:
        raise StoreError(f"cannot open the store {path}: {exc}") from exc
    os.close(fd)


# ------------------------------------------------------------------------------------------------------------
# The store
# ------------------------------------------------------------------------------------------------------------


def _chat_version_in(r: StoreReader, chat_id: str) -> int:
    """The chat's version as ``r`` sees it (0 for an unknown chat); ``chat_id`` already validated."""
    row = r._conn.execute("SELECT version FROM chats WHERE chat_id = ?", (chat_id,)).fetchone()
    return 0 if row is None else int(row[0])


def _cached_bm25_index(cache: Bm25Cache, r: StoreReader, chat_id: str, stem: str) -> Bm25Index:
    """The chat's BM25 index at the version ``r`` sees, from ``cache``: served, updated by its pending rows or
    built. Version and rows come from one read snapshot, so the cached index is exactly that version's."""
    conn = r._conn
    return cache.get(
        chat_id, _chat_version_in(r, chat_id), lambda: _bm25_read_index(conn, chat_id, stem), stem,
        changed=lambda ids: _bm25_read_rows(conn, chat_id, ids),
    )


class Store:
    """A memory-recall store in one SQLite file (see the module docstring for the contract).

    ``Store(path)`` opens (creating if needed) and migrates the file; ``Store.open(data_dir)`` does so for
    ``<data dir>/memory-recall.sqlite3``. ``busy_timeout`` (seconds) is how long a write waits for another
    process's write lock before :class:`StoreError`. ``clock`` returns milliseconds since the epoch for the
    created/updated times of chats (injectable for tests).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 5.0,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float) or not (
            math.isfinite(busy_timeout) and busy_timeout >= 0
        ):
            raise InputError("busy_timeout", f"must be a finite number of seconds >= 0; got {busy_timeout!r}")
        self._path = Path(path)
        self._timeout = float(busy_timeout)
        self._clock = clock or _wall_clock_ms
        self._lock = threading.Lock()
        self._lock_owner: int | None = None
        self._pool_lock = threading.Lock()
        self._pool: list[sqlite3.Connection] = []
        self._closed = False
        self._ingest_cache = IngestCache()
        _create_private(self._path)
        self._conn = self._connect(write=True)
        try:
            self._setup()
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def open(cls, data_dir: str | Path | None = None, *, busy_timeout: float = 5.0) -> Store:
        """Open the store of a data directory (see :func:`default_data_dir`), creating the directory."""
        directory = default_data_dir(data_dir)
        try:
            # 0700 applies to the last component only; missing parents get the default mode, as with mkdir -p.
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the data directory {directory}: {exc}") from exc
        return cls(directory / DB_FILENAME, busy_timeout=busy_timeout)

    @property
    def path(self) -> Path:
        return self._path

    # -- connections ---------------------------------------------------------------------------------------

    def _connect(self, *, write: bool) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                str(self._path), timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self._path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            # FULL: in WAL mode NORMAL may lose the last commits on power loss; acknowledged ones must not.
            conn.execute("PRAGMA synchronous = FULL")
            if not write:
                conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            conn.close()
            raise self._open_error(exc) from exc
        return conn

    def _open_error(self, exc: sqlite3.Error) -> StoreError:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
            return StoreError(f"{self._path} is not a memory-recall store (not SQLite): {exc}")
        return StoreError(f"cannot open the store {self._path}: {exc}")

    def _setup(self) -> None:
        conn = self._conn
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.Error as exc:
            raise self._open_error(exc) from exc
        # Identity first: a foreign database must be refused before anything (even its journal mode) changes.
        self._check_identity(version, app_id, tables)
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.Error as exc:
            raise StoreError(f"cannot switch {self._path} to WAL mode: {exc}") from exc
        if str(mode).lower() != "wal":
            raise StoreError(f"cannot switch {self._path} to WAL mode (got {mode!r}); network file system?")
        try:
            self._migrate()
            self._sync_fts()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot migrate the store {self._path}: {exc}") from exc

    def _check_identity(self, version: int, app_id: int, tables: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the store {self._path} has schema version {version}, newer than the {SCHEMA_VERSION} this "
                "memory-recall understands; upgrade memory-recall to open it"
            )
        if version > 0 and app_id != APPLICATION_ID:
            raise StoreError(f"{self._path} is a SQLite database of another application (id {app_id})")
        if version == 0 and tables:
            raise StoreError(f"{self._path} is a non-empty SQLite database that is not a memory-recall store")

    def _migrate(self) -> None:
        conn = self._conn
        # Without a write lock when there is nothing to do: opening must not wait for another process's batch.
        if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        for target in range(1, SCHEMA_VERSION + 1):
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read under the write lock: another process may have migrated meanwhile.
                current = conn.execute("PRAGMA user_version").fetchone()[0]
                if current >= target:
                    conn.execute("ROLLBACK")
                    continue
                if current != target - 1:
                    raise StoreError(f"unexpected schema version {current} while migrating to {target}")
                MIGRATIONS[target - 1](conn)
                conn.execute(f"PRAGMA user_version = {target}")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    def _fts_current(self) -> bool:
        conn = self._conn
        return (
            _get_meta(conn, "tokenizer_version") == TOKENIZER_VERSION
            and _get_meta(conn, "fts_tokenize_clause") == FTS5_TOKENIZE_CLAUSE
        )

    def _sync_fts(self) -> None:
        """Rebuild the FTS index when another tokenizer version or other table options built it."""
        if self._fts_current():
            return
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not self._fts_current():
                if _get_meta(conn, "fts_tokenize_clause") != FTS5_TOKENIZE_CLAUSE:
                    conn.execute("DROP TABLE IF EXISTS nodes_fts")
                    conn.execute(_fts_create_sql())
                else:
                    conn.execute("DELETE FROM nodes_fts")
                last = 0
                while True:
                    rows = conn.execute(
                        "SELECT rid, chat_id, node_id, json FROM nodes WHERE rid > ? AND archived = 0 "
                        "ORDER BY rid LIMIT 1000",
                        (last,),
                    ).fetchall()
                    if not rows:
                        break
                    conn.executemany(
                        "INSERT INTO nodes_fts(rowid, primary_terms, secondary_terms, body_terms, "
                        "chat_id, node_id) VALUES (?, ?, ?, ?, ?, ?)",
                        [
                            (rid, *fts_columns(_load(Node, text, "node")), chat, nid)
                            for rid, chat, nid, text in rows
                        ],
                    )
                    last = rows[-1][0]
                _set_meta(conn, "tokenizer_version", TOKENIZER_VERSION)
                _set_meta(conn, "fts_tokenize_clause", FTS5_TOKENIZE_CLAUSE)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    def _check_not_closed(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def close(self) -> None:
        """Close every connection. Idempotent; the store cannot be used afterwards."""
        if self._lock_owner == threading.get_ident():
            raise StoreError("cannot close the store inside one of its write batches")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions --------------------------------------------------------------------------------------

    @contextmanager
    def _write_lock(self) -> Iterator[sqlite3.Connection]:
        me = threading.get_ident()
        if self._lock_owner == me:
            raise StoreError(
                "nested write: this thread already holds an open store.write() batch; "
                "use that batch's writer instead"
            )
        with self._lock:
            self._check_not_closed()
            self._lock_owner = me
            try:
                yield self._conn
            finally:
                self._lock_owner = None

    @contextmanager
    def _transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        with self._write_lock() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"{action}: cannot start a write transaction: {exc}") from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise StoreError(f"{action}: {exc}") from exc
            except BaseException:
                _rollback(conn)
                raise

    @contextmanager
    def write(self, chat_id: str) -> Iterator[StoreWriter]:
        """One write batch on ``chat_id``: one transaction, one version bump on commit, rollback on any error.

        >>> with store.write("chat-1") as w:
        ...     w.upsert_nodes(nodes); w.upsert_edges(edges)
        """
        chat_id = validate_chat_id(chat_id)
        with self._transaction(f"write to chat {chat_id!r}") as conn:
            writer = StoreWriter(conn, chat_id, self._clock())
            try:
                yield writer
                writer._commit_version()
            finally:
                writer._open = False
        # Committed: the chat's cached BM25 indexes follow it to the new version with the touched rows pending,
        # and so do its cached ingest reads.
        cache_for(self).advance(chat_id, writer._base_version, writer.version, writer._fts_touched)
        self._ingest_cache.after_write(chat_id, writer._base_version, writer.version, writer._node_log,
                                       writer._created, writer._followable)

    @contextmanager
    def read(self) -> Iterator[StoreReader]:
        """A reader whose calls all see one committed snapshot of the store."""
        self._check_not_closed()
        conn = self._acquire_reader()
        healthy = True
        try:
            conn.execute("BEGIN")
            yield StoreReader(conn, self._ingest_cache)
        except sqlite3.Error as exc:
            healthy = False
            raise StoreError(f"read failed: {exc}") from exc
        finally:
            try:
                if conn.in_transaction:
                    conn.execute("COMMIT")
            except sqlite3.Error:
                healthy = False
            self._release_reader(conn, healthy)

    def _acquire_reader(self) -> sqlite3.Connection:
        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        return self._connect(write=False)

    def _release_reader(self, conn: sqlite3.Connection, healthy: bool) -> None:
        with self._pool_lock:
            # Keep a few idle connections; the rest (bursts of reader threads) are closed.
            if healthy and not self._closed and len(self._pool) < 8:
                self._pool.append(conn)
                return
        conn.close()

    # -- maintenance ---------------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """``PRAGMA user_version`` of the file."""
        with self.read() as r:
            return int(r._conn.execute("PRAGMA user_version").fetchone()[0])

    def check_integrity(self) -> list[str]:
        """Problems found by SQLite's integrity check and FTS5's own check; ``[]`` when the file is sound."""
        with self._transaction("integrity check") as conn:
            problems = [str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall()]
            problems = [] if problems == ["ok"] else problems
            try:
                conn.execute("INSERT INTO nodes_fts(nodes_fts) VALUES ('integrity-check')")
            except sqlite3.DatabaseError as exc:
                problems.append(f"nodes_fts: {exc}")
            fk = conn.execute("PRAGMA foreign_key_check").fetchall()
            problems.extend(f"foreign key violation in {row[0]} (rowid {row[1]})" for row in fk)
        return problems

    def delete_chat(self, chat_id: str) -> bool:
        """Remove everything of one chat; ``False`` when the chat did not exist."""
        chat_id = validate_chat_id(chat_id)
        with self._transaction(f"delete chat {chat_id!r}") as conn:
            sql = "DELETE FROM nodes_fts WHERE rowid IN (SELECT rid FROM nodes WHERE chat_id = ?)"
            conn.execute(sql, (chat_id,))
            # Everything else hangs off the chats row through ON DELETE CASCADE.
            cur = conn.execute("DELETE FROM chats WHERE chat_id = ?", (chat_id,))
            self._ingest_cache.drop(chat_id)
            return cur.rowcount > 0

    def cache_put(self, model_id: str, items: Mapping[str, np.ndarray]) -> int:
        """Store vectors in the global embedding cache (``text_hash → vector``), one dimension per model."""
        with self._transaction("embedding cache write") as conn:
            return _cache_put(conn, model_id, items)

    # -- reads (each in its own snapshot) ------------------------------------------------------------------

    def chat_version(self, chat_id: str) -> int:
        """See :meth:`StoreReader.chat_version`."""
        with self.read() as r:
            return r.chat_version(chat_id)

    def list_chats(self) -> list[ChatInfo]:
        """See :meth:`StoreReader.list_chats`."""
        with self.read() as r:
            return r.list_chats()

    def stats(self, chat_id: str) -> dict[str, Any]:
        """See :meth:`StoreReader.stats`."""
        with self.read() as r:
            return r.stats(chat_id)

    def get_node(self, chat_id: str, node_id: str) -> Node | None:
        """See :meth:`StoreReader.get_node`."""
        with self.read() as r:
            return r.get_node(chat_id, node_id)

    def get_nodes(self, chat_id: str, ids: Iterable[str] | None = None) -> list[Node]:
        """See :meth:`StoreReader.get_nodes`."""
        with self.read() as r:
            return r.get_nodes(chat_id, ids)

    def get_edges(self, chat_id: str) -> list[Edge]:
        """See :meth:`StoreReader.get_edges`."""
        with self.read() as r:
            return r.get_edges(chat_id)

    def edges_of(self, chat_id: str, node_id: str) -> list[Edge]:
        """See :meth:`StoreReader.edges_of`."""
        with self.read() as r:
            return r.edges_of(chat_id, node_id)

    def get_nodes_by_type(self, chat_id: str, types: Iterable[str]) -> list[Node]:
        """See :meth:`StoreReader.get_nodes_by_type`."""
        with self.read() as r:
            return r.get_nodes_by_type(chat_id, types)

    def message_chain(self, chat_id: str) -> list[tuple[int, str, str | None, str | None]]:
        """See :meth:`StoreReader.message_chain`."""
        with self.read() as r:
            return r.message_chain(chat_id)

    def lasting_edge(self, chat_id: str, node_id: str, exclude_ends: Iterable[str] = ()) -> Edge | None:
        """See :meth:`StoreReader.lasting_edge`."""
        with self.read() as r:
            return r.lasting_edge(chat_id, node_id, exclude_ends)

    def embedding_status(
        self, chat_id: str, model_id: str, node_ids: Collection[str] | None = None
    ) -> list[tuple[str, bool, str | None, str | None]]:
        """See :meth:`StoreReader.embedding_status`."""
        with self.read() as r:
            return r.embedding_status(chat_id, model_id, node_ids)

    def stored_text_hash(self, chat_id: str, model_id: str) -> str | None:
        """See :meth:`StoreReader.stored_text_hash`."""
        with self.read() as r:
            return r.stored_text_hash(chat_id, model_id)

    def get_knowledge(self, chat_id: str) -> KnowledgeState:
        """See :meth:`StoreReader.get_knowledge`."""
        with self.read() as r:
            return r.get_knowledge(chat_id)

    def get_regions(self, chat_id: str) -> RegionState:
        """See :meth:`StoreReader.get_regions`."""
        with self.read() as r:
            return r.get_regions(chat_id)

    def get_timeline(self, chat_id: str) -> TimelineState:
        """See :meth:`StoreReader.get_timeline`."""
        with self.read() as r:
            return r.get_timeline(chat_id)

    def get_summaries(self, chat_id: str) -> SummaryState:
        """See :meth:`StoreReader.get_summaries`."""
        with self.read() as r:
            return r.get_summaries(chat_id)

    def get_history(self, chat_id: str) -> HistoryState:
        """See :meth:`StoreReader.get_history`."""
        with self.read() as r:
            return r.get_history(chat_id)

    def get_journal(self, chat_id: str) -> list[JournalEntry]:
        """See :meth:`StoreReader.get_journal`."""
        with self.read() as r:
            return r.get_journal(chat_id)

    def load_graph(self, chat_id: str) -> MemoryGraph:
        """See :meth:`StoreReader.load_graph` (read in one snapshot)."""
        with self.read() as r:
            return r.load_graph(chat_id)

    def get_embeddings(self, chat_id: str, model_id: str) -> tuple[list[str], np.ndarray]:
        """See :meth:`StoreReader.get_embeddings`."""
        with self.read() as r:
            return r.get_embeddings(chat_id, model_id)

    def snapshot_source(self, chat_id: str, model_id: str) -> SnapshotSource:
        """See :meth:`StoreReader.snapshot_source` (read in one snapshot)."""
        with self.read() as r:
            return r.snapshot_source(chat_id, model_id)

    def snapshot_delta(self, chat_id: str, model_id: str, since: int) -> SnapshotDelta | None:
        """See :meth:`StoreReader.snapshot_delta` (read in one snapshot)."""
        with self.read() as r:
            return r.snapshot_delta(chat_id, model_id, since)

    def embedding_hashes(self, chat_id: str, model_id: str) -> dict[str, str]:
        """See :meth:`StoreReader.embedding_hashes`."""
        with self.read() as r:
            return r.embedding_hashes(chat_id, model_id)

    def cache_get(self, model_id: str, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """See :meth:`StoreReader.cache_get`."""
        with self.read() as r:
            return r.cache_get(model_id, hashes)

    def get_record(self, chat_id: str, user_floor: int) -> PersistedRecall | None:
        """See :meth:`StoreReader.get_record`."""
        with self.read() as r:
            return r.get_record(chat_id, user_floor)

    def list_records(self, chat_id: str) -> list[PersistedRecall]:
        """See :meth:`StoreReader.list_records`."""
        with self.read() as r:
            return r.list_records(chat_id)

    def bm25(
        self, chat_id: str, terms: Sequence[str], limit: int = 50, *, stem: str = "none"
    ) -> list[tuple[str, float]]:
        """See :meth:`StoreReader.bm25`; the chat's index is cached per chat (and stem method). After a write it is
        brought to the new version from the rows that write touched (:meth:`Bm25Cache.advance` on commit, the
        rows read here by node id: cost proportional to the change); it is built from every row only on a miss."""
        chat_id, term_list, limit = _bm25_args(chat_id, terms, limit)
        stem = _bm25_stem(stem)
        if not term_list:
            return []
        with self.read() as r:
            index = _cached_bm25_index(cache_for(self), r, chat_id, stem)
        return index.query(term_list, limit)

    def refresh_bm25(self, chat_id: str) -> list[str]:
        """Apply the ids a write left pending to the chat's cached BM25 indexes now (what the next :meth:`bm25`
        would do), so the recall after the write queries an index already current. Builds nothing: a chat
        without a cached index stays without. Returns the stem methods updated."""
        chat_id = validate_chat_id(chat_id)
        cache = cache_for(self)
        with self.read() as r:
            stems = cache.pending_stems(chat_id, _chat_version_in(r, chat_id))
            for stem in stems:
                _cached_bm25_index(cache, r, chat_id, stem)
        return stems

    # -- one-shot writes (each its own transaction and version bump) ---------------------------------------

    def upsert_nodes(self, chat_id: str, nodes: Iterable[Node | Mapping[str, Any]]) -> int:
        """See :meth:`StoreWriter.upsert_nodes`."""
        with self.write(chat_id) as w:
            return w.upsert_nodes(nodes)

    def delete_nodes(self, chat_id: str, ids: Iterable[str]) -> int:
        """See :meth:`StoreWriter.delete_nodes`."""
        with self.write(chat_id) as w:
            return w.delete_nodes(ids)

    def upsert_edges(self, chat_id: str, edges: Iterable[Edge | Mapping[str, Any]]) -> int:
        """See :meth:`StoreWriter.upsert_edges`."""
        with self.write(chat_id) as w:
            return w.upsert_edges(edges)

    def delete_edges(self, chat_id: str, ids: Iterable[str]) -> int:
        """See :meth:`StoreWriter.delete_edges`."""
        with self.write(chat_id) as w:
            return w.delete_edges(ids)

    def put_embeddings(
        self,
        chat_id: str,
        model_id: str,
        vectors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray, str]],
    ) -> int:
        """See :meth:`StoreWriter.put_embeddings`."""
        with self.write(chat_id) as w:
            return w.put_embeddings(model_id, vectors)

    def delete_embeddings(self, chat_id: str, model_id: str, node_ids: Iterable[str] | None = None) -> int:
        """See :meth:`StoreWriter.delete_embeddings`."""
        with self.write(chat_id) as w:
            return w.delete_embeddings(model_id, node_ids)

    def set_knowledge(self, chat_id: str, state: KnowledgeState) -> None:
        """See :meth:`StoreWriter.set_knowledge`."""
        with self.write(chat_id) as w:
            w.set_knowledge(state)

    def set_regions(self, chat_id: str, state: RegionState) -> None:
        """See :meth:`StoreWriter.set_regions`."""
        with self.write(chat_id) as w:
            w.set_regions(state)

    def set_timeline(self, chat_id: str, state: TimelineState) -> None:
        """See :meth:`StoreWriter.set_timeline`."""
        with self.write(chat_id) as w:
            w.set_timeline(state)

    def set_summaries(self, chat_id: str, state: SummaryState) -> None:
        """See :meth:`StoreWriter.set_summaries`."""
        with self.write(chat_id) as w:
            w.set_summaries(state)

    def set_history(self, chat_id: str, state: HistoryState) -> None:
        """See :meth:`StoreWriter.set_history`."""
        with self.write(chat_id) as w:
            w.set_history(state)

    def set_journal(self, chat_id: str, entries: Iterable[JournalEntry]) -> None:
        """See :meth:`StoreWriter.set_journal`."""
        with self.write(chat_id) as w:
            w.set_journal(entries)

    def put_record(self, chat_id: str, record: PersistedRecall) -> None:
        """See :meth:`StoreWriter.put_record`."""
        with self.write(chat_id) as w:
            w.put_record(record)

    def delete_record(self, chat_id: str, user_floor: int) -> bool:
        """See :meth:`StoreWriter.delete_record`."""
        with self.write(chat_id) as w:
            return w.delete_record(user_floor)

    def delete_records_from(self, chat_id: str, user_floor: int) -> int:
        """See :meth:`StoreWriter.delete_records_from`."""
        with self.write(chat_id) as w:
            return w.delete_records_from(user_floor)

    def set_record_unversioned(self, chat_id: str, user_floor: int, record: PersistedRecall | None) -> bool:
        """Write (``record``) or delete (``None``) the record of one user floor **without** a version bump.

        Records are not graph content: a replay counter, a manual edit of the injection text or a record
        deletion must not make the chat's snapshot or its other records look stale (recall-spec departure 7;
        the version contract of this module holds for every other write). One transaction; the chat must exist.
        Returns ``True`` when a record was written or deleted.
        """
        chat_id = validate_chat_id(chat_id)
        floor = _int_arg(user_floor, "user_floor", 0, sys.maxsize)
        with self._transaction(f"write a record of chat {chat_id!r}") as conn:
            if conn.execute("SELECT 1 FROM chats WHERE chat_id = ?", (chat_id,)).fetchone() is None:
                raise NotFound("chat_id", f"no chat {chat_id!r} in this store")
            writer = StoreWriter(conn, chat_id, self._clock())
            try:
                if record is None:
                    return writer.delete_record(floor)
                if record.user_floor != floor:
                    raise InputError("record.user_floor", f"is {record.user_floor}, but the floor is {floor}")
                writer.put_record(record)
                return True
            finally:
                writer._open = False

    def reinforce(self, chat_id: str, node_ids: Iterable[str], now_ms: int, importance_step: float = 0.1) -> int:
        """See :meth:`StoreWriter.reinforce`."""
        with self.write(chat_id) as w:
            return w.reinforce(node_ids, now_ms, importance_step)

    def replace_graph(self, chat_id: str, graph: MemoryGraph) -> None:
        """See :meth:`StoreWriter.replace_graph`."""
        with self.write(chat_id) as w:
            w.replace_graph(graph)
