"""``GraphSnapshot``: one chat's graph as arrays, built once per store version and shared by every recall.

Architecture "Hot path": the snapshot holds numpy arrays, not objects — ids, type codes, importance, time stamps,
scope codes, an (n × d) float32 L2-normalised embedding matrix with a mask for missing vectors, scipy CSR
matrices for edge strengths (inhibit edges kept apart, temporal links added from the prev/next chain), the entity
anchor index, and the knowledge state as dense per-owner arrays. Full :class:`~memory_recall.model.graph.Node`
objects are parsed lazily (only candidates ever need one).

Contract:
* A snapshot is immutable after :func:`build_snapshot` returns; stages read it and never write to it.
* ``version`` is the chat's store version it was built from; :class:`SnapshotCache` rebuilds when the version,
  the embedding model or the edge-validity horizon (an ``invalid_at``/``expired_at`` that has passed) changes.
* Node order is the store's insertion order (the reference's graph order); ``id_rank`` gives each node its
  position in byte order of ids, the tie-break everywhere (recall-spec departure 10).
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import itertools
import json
import math
import operator
import struct
import sys
import threading
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import scipy.sparse as sp

from memory_recall.heap import mapped_empty, memory_owner, release_freed_heap
from memory_recall.model.graph import (
    CORE_TYPES,
    INHIBIT_EDGE_TYPE,
    NODE_TYPES,
    Edge,
    MemoryScope,
    Node,
    anchor_terms,
)
from memory_recall.model.state import (
    HistoryState,
    JournalEntry,
    KnowledgeState,
    MemoryGraph,
    RegionState,
    SummaryState,
    TimelineState,
)
from memory_recall.store.csr import assembled, kept_entries, rows_of, spliced_rows
from memory_recall.store.node_fields import same_fields

__all__ = [
    "PACKED_EDGE",
    "PACKED_EDGE_DTYPE",
    "EdgeColumns",
    "EdgeRow",
    "GraphSnapshot",
    "BlobSlices",
    "JoinedStrings",
    "KnowledgeArrays",
    "NodeIndex",
    "NodeIndexTable",
    "PackedTexts",
    "NodeStats",
    "SnapshotCache",
    "SnapshotDelta",
    "SnapshotSource",
    "SnapshotStructure",
    "SharedIndex",
    "SharedPrefix",
    "StructureChange",
    "appended_rows",
    "inserted",
    "apply_delta",
    "build_snapshot",
    "compress_text",
    "decompress_text",
    "gc_paused",
    "load_snapshot",
    "release_freed_heap",
    "node_index",
    "snapshot_from_graph",
]

TYPE_CODE: dict[str, int] = {t: i for i, t in enumerate(NODE_TYPES)}
_TENSES = ("unknown", "past", "ongoing", "future", "flashback", "hypothetical")
TENSE_CODE: dict[str, int] = {t: i for i, t in enumerate(_TENSES)}
_OWNER_TYPE_CODE: dict[str, int] = {"character": 1, "user": 2}
_EDGE_ROW_FIELDS = operator.attrgetter(
    "edge_id", "from_id", "to_id", "relation", "strength", "edge_type", "invalid_at", "expired_at"
)
_SEP = "\x1f"
_NORM_BLOCK = 8192
#: Packed numeric index values of one node (``nodes.ixb``): seq, seq_start, seq_end, importance, created_time,
#: flags (bit 0 archived, 1 has_story_label, 2 has_span_label, 3 seq_start set, 4 seq_end set); little endian.
_PACKED_INDEX = struct.Struct("<qqqdqB")
_PACKED_INDEX_DTYPE = np.dtype([
    ("seq", "<i8"), ("seq_start", "<i8"), ("seq_end", "<i8"), ("importance", "<f8"), ("created_time", "<i8"),
    ("flags", "u1"),
])
#: Packed numeric columns of one edge (``edges.eb``): endpoint node rowids, strength, edge_type, invalid_at,
#: expired_at (ms; NaN when none); little endian.
PACKED_EDGE = struct.Struct("<qqdqdd")
PACKED_EDGE_DTYPE = np.dtype([
    ("src", "<i8"), ("dst", "<i8"), ("strength", "<f8"), ("edge_type", "<i8"), ("invalid_at", "<f8"),
    ("expired_at", "<f8"),
])


# ---------------------------------------------------------------------------------------------------------------
# The denormalised index values of one node (the store writes them beside the node JSON on every upsert)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeIndex:
    """What the snapshot needs of a node without parsing the whole node."""

    type: str
    archived: bool
    seq: int
    seq_start: int | None
    seq_end: int | None
    importance: float
    created_time: int
    layer: str
    owner_type: str
    owner_key: str
    owner_name: str
    region_primary: str
    region_tokens: tuple[str, ...]
    anchor_terms: tuple[str, ...]
    prev_id: str
    next_id: str
    visibility: tuple[str, ...] | None
    segment_id: str
    has_story_label: bool
    tense: str
    span_start_segment: str
    span_end_segment: str
    has_span_label: bool

    def to_json(self) -> str:
        return json.dumps(
            [
                self.type, int(self.archived), self.seq, self.seq_start, self.seq_end, self.importance,
                self.created_time, self.layer, self.owner_type, self.owner_key, self.owner_name,
                self.region_primary, _SEP.join(self.region_tokens), _SEP.join(self.anchor_terms),
                self.prev_id, self.next_id,
                None if self.visibility is None else _SEP.join(self.visibility),
                self.segment_id, int(self.has_story_label), self.tense, self.span_start_segment,
                self.span_end_segment, int(self.has_span_label),
            ],
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> NodeIndex:
        return cls._from_values(json.loads(text))

    def to_packed(self) -> bytes:
        """The numeric values as one ``nodes.ixb`` blob (see :meth:`NodeIndexTable.from_packed`)."""
        flags = (
            int(self.archived) | int(self.has_story_label) << 1 | int(self.has_span_label) << 2
            | int(self.seq_start is not None) << 3 | int(self.seq_end is not None) << 4
        )
        return _PACKED_INDEX.pack(
            self.seq, self.seq_start or 0, self.seq_end or 0, self.importance, self.created_time, flags
        )

    def strings_json(self) -> str:
        """The string values as one ``nodes.ixs`` JSON array (see :meth:`NodeIndexTable.from_packed`)."""
        return json.dumps(
            [
                self.type, self.layer, self.owner_type, self.owner_key, self.owner_name, self.region_primary,
                _SEP.join(self.region_tokens), _SEP.join(self.anchor_terms), self.prev_id, self.next_id,
                None if self.visibility is None else _SEP.join(self.visibility), self.segment_id, self.tense,
                self.span_start_segment, self.span_end_segment,
            ],
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def _from_values(cls, v: list[Any]) -> NodeIndex:
        regions, anchors, vis = v[12], v[13], v[16]
        return cls(
            v[0], bool(v[1]), v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
            tuple(t for t in regions.split(_SEP) if t) if regions else (),
            tuple(t for t in anchors.split(_SEP) if t) if anchors else (),
            v[14], v[15], None if vis is None else tuple(vis.split(_SEP)),
            v[17], bool(v[18]), v[19], v[20], v[21], bool(v[22]),
        )


#: Field order of :meth:`NodeIndex.to_json` (and of the dataclass).
_INDEX_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(NodeIndex))
#: Field order of :meth:`NodeIndex.strings_json`.
_STRING_FIELDS: tuple[str, ...] = (
    "type", "layer", "owner_type", "owner_key", "owner_name", "region_primary", "region_tokens", "anchor_terms",
    "prev_id", "next_id", "visibility", "segment_id", "tense", "span_start_segment", "span_end_segment",
)
#: String fields with few distinct values over a chat (interned when decoded in bulk).
_INTERNED_FIELDS: tuple[str, ...] = (
    "type", "layer", "owner_type", "owner_key", "owner_name", "region_primary", "segment_id", "tense",
    "span_start_segment", "span_end_segment",
)


def _split_interned(texts: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """Each text split on the term separator, without empty terms; equal texts share one tuple of interned
    terms."""
    memo = {text: tuple(map(sys.intern, filter(None, text.split(_SEP)))) if text else () for text in set(texts)}
    return tuple(map(memo.__getitem__, texts))


class NodeIndexTable(Sequence[NodeIndex]):
    """Decoded index rows of many nodes, held as columns (one tuple or numpy array per :class:`NodeIndex` field,
    repeated strings interned): a sequence of :class:`NodeIndex` built on access, plus :meth:`columns` for
    :func:`build_snapshot`.

    Tables decoded from packed rows (:meth:`from_packed`) hold the numeric and flag fields as numpy arrays
    (``seq_start``/``seq_end`` as float64 with NaN for none, the exact integers kept beside them).
    """

    def __init__(self, columns: dict[str, Any], exact: dict[str, np.ndarray] | None = None) -> None:
        self._cols = columns
        self._exact = exact or {}

    @classmethod
    def from_packed(cls, blobs: Sequence[bytes], strings: Sequence[str]) -> NodeIndexTable:
        """Columns of rows stored as :meth:`NodeIndex.to_packed` blobs and :meth:`NodeIndex.strings_json` texts
        (one ``frombuffer`` for the numbers, one JSON parse for the strings). Wrong blob sizes → ``ValueError``."""
        n = len(blobs)
        if n != len(strings):
            raise ValueError(f"{n} packed index rows but {len(strings)} string rows")
        if not n:
            return cls({name: () for name in _INDEX_FIELDS})
        if set(map(len, blobs)) != {_PACKED_INDEX.size}:
            raise ValueError("packed index rows of the wrong size")
        return cls.from_joined(b"".join(blobs), ",".join(strings), n)

    @classmethod
    def from_joined(cls, packed: bytes, strings: str, n: int) -> NodeIndexTable:
        """:meth:`from_packed` of ``n`` rows given as the concatenation of their blobs and the ``","``-join of
        their string rows (the store reads a chat's rows that way). Wrong sizes or counts → ``ValueError``."""
        if not n:
            if packed or strings:
                raise ValueError("index values for no rows")
            return cls({name: () for name in _INDEX_FIELDS})
        if len(packed) != n * _PACKED_INDEX.size:
            raise ValueError("packed index rows of the wrong size")
        rec = np.frombuffer(packed, _PACKED_INDEX_DTYPE)
        try:
            rows = json.loads("[" + strings + "]")
        except json.JSONDecodeError as exc:
            raise ValueError(f"string index rows are not JSON: {exc}") from None
        if len(rows) != n:
            raise ValueError(f"{n} packed index rows but {len(rows)} string rows")
        cols: dict[str, Any] = dict(zip(_STRING_FIELDS, zip(*rows, strict=True), strict=True))
        del rows
        _decode_strings(cols)
        flags = rec["flags"]
        cols["archived"] = (flags & 1) != 0
        cols["has_story_label"] = (flags & 2) != 0
        cols["has_span_label"] = (flags & 4) != 0
        exact = {}
        for name, bit in (("seq_start", 8), ("seq_end", 16)):
            ints = rec[name].copy()
            cols[name] = np.where((flags & bit) != 0, ints.astype(np.float64), np.nan)
            exact[name] = ints
        cols["seq"] = rec["seq"].copy()
        cols["importance"] = rec["importance"].copy()
        cols["created_time"] = rec["created_time"].copy()
        return cls({name: cols[name] for name in _INDEX_FIELDS}, exact)

    def __len__(self) -> int:
        return len(self._cols["type"])

    def _value(self, name: str, i: int) -> Any:
        col = self._cols[name]
        if not isinstance(col, np.ndarray):
            return col[i]
        if name in self._exact:
            return None if math.isnan(col[i]) else int(self._exact[name][i])
        return col[i].item()

    def _row(self, i: int) -> NodeIndex:
        return NodeIndex(*(self._value(name, i) for name in _INDEX_FIELDS))

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._row(k) for k in range(len(self))[i]]
        return self._row(range(len(self))[i])  # negative indices and IndexError as for a tuple

    def columns(self) -> dict[str, Any]:
        return dict(self._cols)


def _decode_strings(cols: dict[str, Any]) -> None:
    """Intern the few distinct values of the string columns and split the joined term lists, in place."""
    # json.loads makes a new string object per value: interning the few distinct values of these columns
    # keeps one copy each in the snapshot (a large chat repeats them on every node).
    for name in _INTERNED_FIELDS:
        cols[name] = tuple(map(sys.intern, cols[name]))
    cols["region_tokens"] = _split_interned(cols["region_tokens"])
    cols["anchor_terms"] = _split_interned(cols["anchor_terms"])
    memo = {v: None if v is None else tuple(v.split(_SEP)) for v in set(cols["visibility"])}
    cols["visibility"] = tuple(map(memo.__getitem__, cols["visibility"]))


#: Preset dictionary of :func:`compress_text` format 1 (the JSON of a default node: the keys and default values
#: every node repeats). Frozen: stored blobs depend on it; a new dictionary needs a new format byte.
_TEXT_DICT_1 = (
    b'{"id":"x","type":"event","fields":{"title":"","summary":"","name":"","participants":[]},"seq":0,'
    b'"seq_range":[0,0],"archived":false,"importance":5.0,"access_count":0,"last_access_time":0,"created_time":0,'
    b'"updated_at":0,"level":0,"parent_id":null,"child_ids":[],"prev_id":null,"next_id":null,"scope":{"layer":'
    b'"objective","owner_type":"","owner_id":"","owner_name":"","region_primary":"","region_path":[],'
    b'"region_secondary":[]},"story_time":{"segment_id":"","label":"","tense":"unknown","relation":"unknown",'
    b'"anchor_label":"","confidence":"medium","source":"derived"},"story_time_span":{"start_segment_id":"",'
    b'"end_segment_id":"","start_label":"","end_label":"","mixed":false,"source":"derived"},"evidence":[],'
    b'"extra":{}}'
)


def compress_text(text: str) -> bytes:
    """``text`` as a compressed blob: format byte 1, then raw deflate with :data:`_TEXT_DICT_1` as preset
    dictionary (a node's JSON shrinks about 4×; ~30 µs)."""
    # A 4 KiB window and small state: node JSON is short, and setting up the full 256 KiB state dominated.
    c = zlib.compressobj(6, zlib.DEFLATED, -12, 4, zdict=_TEXT_DICT_1)
    return b"\x01" + c.compress(text.encode("utf-8")) + c.flush()


def decompress_text(blob: bytes) -> str:
    """The text of a :func:`compress_text` blob (~10 µs). Unknown format or corrupt data → ``ValueError``."""
    if blob[:1] != b"\x01":
        raise ValueError(f"unknown compressed text format {blob[:1]!r}")
    d = zlib.decompressobj(-15, zdict=_TEXT_DICT_1)  # any window up to 32 KiB
    try:
        data = d.decompress(memoryview(blob)[1:]) + d.flush()
    except zlib.error as exc:
        raise ValueError(f"corrupt compressed text: {exc}") from exc
    if not d.eof:
        raise ValueError("corrupt compressed text: truncated")
    return data.decode("utf-8")


_T_co = TypeVar("_T_co", covariant=True)


class _ValueSequence(Sequence[_T_co]):
    """A compact immutable sequence that compares equal to any sequence of the same items, as a tuple of them
    would (and so is unhashable, like a list: equal to a tuple but not hashed like one)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


class _Taken(_ValueSequence[_T_co]):
    """The items of a sequence at the positions ``take`` (ascending), read through on access: what the kept graph
    of a deletion (:func:`_kept_snapshot`) holds of its parent's per-node strings, which the append after it reads
    at a few rows only; no column-sized container is made (each one costs the garbage collector a pass over its
    items)."""

    __slots__ = ("_items", "_take")

    def __init__(self, items: Sequence[_T_co], take: np.ndarray) -> None:
        self._items = items
        self._take = take

    def __len__(self) -> int:
        return int(self._take.size)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(map(self._items.__getitem__, self._take[i].tolist()))
        return self._items[int(self._take[i])]

    def __iter__(self) -> Iterator[_T_co]:
        return map(self._items.__getitem__, self._take.tolist())


class PackedTexts(_ValueSequence[str]):
    """Many texts (the node JSON of a snapshot) held as :func:`compress_text` blobs: a 100k-node chat's ~90 MB of
    JSON in ~24 MB. Item access decompresses one text (~10 µs), which suits the snapshot: only candidates are ever
    parsed, once each. Immutable; :meth:`replaced` returns a copy with some texts replaced (sharing the blobs).
    Equal to any sequence of the same texts.
    """

    __slots__ = ("_blobs", "_overrides")

    def __init__(self, blobs: Sequence[bytes], overrides: Mapping[int, str] | None = None) -> None:
        self._blobs = blobs
        self._overrides = dict(overrides or {})

    @classmethod
    def of(cls, texts: Sequence[str]) -> PackedTexts:
        return cls(tuple(map(compress_text, texts)))

    def __len__(self) -> int:
        return len(self._blobs)

    def _text(self, i: int) -> str:
        override = self._overrides.get(i)
        return override if override is not None else decompress_text(self._blobs[i])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._text(k) for k in range(len(self._blobs))[i]]
        return self._text(range(len(self._blobs))[i])  # negative indices and IndexError as for a tuple

    def __iter__(self) -> Iterator[str]:
        return map(self._text, range(len(self._blobs)))

    def replaced(self, updates: Mapping[int, str]) -> PackedTexts:
        """A copy with the texts at the positions of ``updates`` replaced."""
        return PackedTexts(self._blobs, {**self._overrides, **updates})


class JoinedStrings(_ValueSequence[str]):
    """Many short strings (a snapshot's edge ids) held as a few str parts and their offsets: ~10 bytes each
    instead of ~60 for separate str objects. Immutable; equal to any sequence of the same strings. :meth:`take`
    shares the text (it only selects offsets), so a selection costs no string work; :meth:`extended` adds its
    strings as a new part (the offsets in appendable buffers), so an append costs O(what it adds), not a copy of
    the text: the small trailing parts merge as they grow (each no larger than half the one before), so there
    are O(log n) parts and every character is copied O(log n) times over a chain of appends."""

    __slots__ = ("_bounds", "_ends", "_parts", "_starts")

    def __init__(
        self, text: str | tuple[str, ...], ends: np.ndarray, starts: np.ndarray | None = None,
        bounds: tuple[int, ...] = (0,),
    ) -> None:
        self._parts = (text,) if isinstance(text, str) else text
        # Global offset of each part's first character (strings never straddle two parts).
        self._bounds = bounds
        self._ends = ends  # (n,) int64: end offset of each string in the parts joined
        # (n,) int64 start offsets; None → each string starts where the previous one ends (the first at 0)
        self._starts = starts

    @classmethod
    def of(cls, items: Sequence[str]) -> JoinedStrings:
        ends = np.fromiter(itertools.accumulate(map(len, items)), np.int64, len(items))
        return cls("".join(items), ends)

    @classmethod
    def split(cls, text: str, sep: str, count: int) -> JoinedStrings:
        """The ``count`` strings of ``text`` joined by ``sep`` (a single character none of them contains; the
        empty text is no string). Another number of parts → ``ValueError``."""
        if not count:
            if text:
                raise ValueError(f"expected no strings, got {text!r:.40}")
            return cls("", np.zeros(0, np.int64))
        # The separators are the only code points equal to ``sep``: find them with numpy on the UTF-32 code units.
        units = np.frombuffer(text.encode("utf-32-le"), "<u4")
        cuts = np.flatnonzero(units == ord(sep))
        if cuts.size != count - 1:
            raise ValueError(f"expected {count} strings, got {cuts.size + 1}")
        ends = np.append(cuts, units.size).astype(np.int64)
        starts = np.empty(count, np.int64)
        starts[0] = 0
        starts[1:] = cuts + 1
        return cls(text, ends, starts)

    def _start_offsets(self) -> np.ndarray:
        if self._starts is not None:
            return self._starts
        starts = np.zeros(self._ends.size, np.int64)
        starts[1:] = self._ends[:-1]
        return starts

    def __len__(self) -> int:
        return int(self._ends.size)

    def _slice(self, start: int, end: int) -> str:
        if len(self._parts) == 1:
            return self._parts[0][start:end]
        j = bisect.bisect_right(self._bounds, start) - 1
        base = self._bounds[j]
        return self._parts[j][start - base : end - base]

    def _item(self, i: int) -> str:
        if self._starts is not None:
            return self._slice(int(self._starts[i]), int(self._ends[i]))
        return self._slice(int(self._ends[i - 1]) if i else 0, int(self._ends[i]))

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item(k) for k in range(len(self))[i]]
        return self._item(range(len(self))[i])  # negative indices and IndexError as for a tuple

    def __iter__(self) -> Iterator[str]:
        if len(self._parts) == 1:
            text = self._parts[0]
            return map(text.__getitem__, map(slice, self._start_offsets().tolist(), self._ends.tolist()))
        return map(self._slice, self._start_offsets().tolist(), self._ends.tolist())

    def extended(self, items: Sequence[str]) -> JoinedStrings:
        """These strings followed by ``items``: a new part for their text, the older parts shared (the trailing
        ones merged while the last is at least half the one before it), the offsets appended in place when
        this is the longest view of their buffers (:func:`appended_rows`)."""
        if not items:
            return self
        lengths = np.fromiter(map(len, items), np.int64, len(items))
        size = self._bounds[-1] + len(self._parts[-1])
        new_ends = size + np.cumsum(lengths)
        ends = appended_rows(self._ends, new_ends)
        starts = None
        if self._starts is not None:
            starts = appended_rows(self._starts, new_ends - lengths)
        tail = "".join(items)
        if not tail:  # empty strings only: no text to add
            return JoinedStrings(self._parts, ends, starts, self._bounds)
        parts, bounds = [*self._parts, tail], [*self._bounds, size]
        if not parts[0]:  # an empty first part (no strings yet) holds nothing to share
            del parts[0], bounds[0]
        while len(parts) > 1 and 2 * len(parts[-1]) >= len(parts[-2]):
            parts[-2:] = [parts[-2] + parts[-1]]
            del bounds[-1]
        return JoinedStrings(tuple(parts), ends, starts, tuple(bounds))

    def characters(self) -> int:
        """How many characters the strings hold (their total length)."""
        return int((self._ends - self._start_offsets()).sum())

    def text_size(self) -> int:
        """How many characters the shared text holds, strings no longer selected included."""
        return self._bounds[-1] + len(self._parts[-1])

    def take(self, positions: Sequence[int] | np.ndarray) -> JoinedStrings:
        """The strings at ``positions``, in that order (sharing this text)."""
        at = np.asarray(positions, dtype=np.int64).reshape(-1)
        if at.size and (at.min() < -len(self) or at.max() >= len(self)):
            raise IndexError("JoinedStrings index out of range")
        return JoinedStrings(self._parts, self._ends[at], self._start_offsets()[at], self._bounds)


class SharedPrefix(_ValueSequence[Any]):
    """The first ``n`` items of a list shared along a chain of deltas, with the positions a delta rewrote held
    apart (``overrides``, position → item): a snapshot's string columns and ids, as a tuple would hold them.
    :meth:`appended` extends the list in place when this is its longest view (older views keep their length and
    never see the new items) and :meth:`replaced` only copies the overrides, so a delta costs O(what it changed)
    instead of a copy of the column — and leaves no young column-sized container for the garbage collector to
    traverse (one such tuple of 100k strings costs the next recall milliseconds of collection). Immutable as a
    sequence; equal to any sequence of the same items."""

    __slots__ = ("_items", "_n", "_overrides")

    def __init__(self, items: list[Any], n: int, overrides: Mapping[int, Any] | None = None) -> None:
        self._items = items
        self._n = n
        self._overrides: Mapping[int, Any] = overrides or {}

    @classmethod
    def of(cls, items: Iterable[Any]) -> SharedPrefix:
        kept = list(items)
        return cls(kept, len(kept))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(map(self.__getitem__, range(self._n)[i]))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("SharedPrefix index out of range")
        if self._overrides:
            found = self._overrides.get(i, _MISSING)
            if found is not _MISSING:
                return found
        return self._items[i]

    def __iter__(self) -> Iterator[Any]:
        if not self._overrides:
            return itertools.islice(self._items, self._n)
        get = self._overrides.get
        return (get(i, v) for i, v in enumerate(itertools.islice(self._items, self._n)))

    def appended(self, tail: Iterable[Any]) -> SharedPrefix:
        """These items followed by ``tail``: written into the shared list when this is its longest view, else a
        copy (a second child of the same parent)."""
        tail = list(tail)
        with _SHARED_PREFIX_LOCK:
            if len(self._items) == self._n:
                self._items.extend(tail)
                return SharedPrefix(self._items, self._n + len(tail), self._overrides)
        return SharedPrefix(self._items[: self._n] + tail, self._n + len(tail), self._overrides)

    def replaced(self, updates: Mapping[int, Any]) -> SharedPrefix:
        """These items with the positions of ``updates`` (all below ``len(self)``) holding its values: the list
        is shared and the overrides copied, until they pass :data:`MAX_SHARED_OVERRIDES` (then one copy of the
        items with every override written in)."""
        if not updates:
            return self
        merged = {**self._overrides, **updates}
        if len(merged) <= MAX_SHARED_OVERRIDES:
            return SharedPrefix(self._items, self._n, merged)
        items = list(itertools.islice(self._items, self._n))
        for i, v in merged.items():
            items[i] = v
        return SharedPrefix(items, self._n)


class SharedIndex(Mapping[str, int]):
    """A snapshot's id → position map, shared along a chain of appending deltas: the dict holds every id of the
    longest view, and this view shows the ids at positions below its ``n`` (ids are added in position order, and
    an append only adds new ids at positions from ``n`` on, so an older view never sees a newer id).
    :meth:`appended` adds to the dict in place when this is its longest view, else copies this view's part
    once; an append costs O(ids added) instead of a copy of the map. Equal to the dict of the same items."""

    __slots__ = ("_d", "_n")

    def __init__(self, d: dict[str, int], n: int) -> None:
        self._d = d
        self._n = n

    @classmethod
    def of(cls, index: Mapping[str, int]) -> SharedIndex:
        """``index`` (positions ``0 … len - 1``, inserted in position order) as the start of a chain."""
        return index if isinstance(index, SharedIndex) else cls(dict(index), len(index))

    def __getitem__(self, key: str) -> int:
        v = self._d[key]
        if v >= self._n:
            raise KeyError(key)
        return v

    def get(self, key: str, default: Any = None) -> Any:
        v = self._d.get(key)
        return v if v is not None and v < self._n else default

    def __contains__(self, key: object) -> bool:
        v = self._d.get(key)  # type: ignore[call-overload]
        return v is not None and v < self._n

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[str]:
        # A copy of this view's keys taken under the lock: a newer view may add to the dict from another thread,
        # and iterating a dict while it grows raises.
        with _SHARED_PREFIX_LOCK:
            keys = list(itertools.islice(self._d, self._n))
        return iter(keys)

    def appended(self, ids: Sequence[str]) -> SharedIndex:
        """This map with ``ids`` (none of them in it) at positions ``n, n + 1, …``."""
        if not ids:
            return self
        n, k = self._n, len(ids)
        with _SHARED_PREFIX_LOCK:
            # The longest view adds in place (older views never see the new ids); any other copies its part.
            d = self._d if len(self._d) == n else dict(itertools.islice(self._d.items(), n))
            d.update(zip(ids, range(n, n + k), strict=True))
        return SharedIndex(d, n + k)


#: Rewritten positions a :class:`SharedPrefix` holds apart before its items are copied with them written in.
MAX_SHARED_OVERRIDES = 1024
_MISSING = object()
_SHARED_PREFIX_LOCK = threading.Lock()


def _seq_appended(old: Sequence[Any], tail: Iterable[Any]) -> SharedPrefix:
    """``old`` followed by ``tail`` as a :class:`SharedPrefix` (``old`` copied once when it is not one yet)."""
    if isinstance(old, SharedPrefix):
        return old.appended(tail)
    items = list(old)
    items.extend(tail)
    return SharedPrefix(items, len(items))


class BlobSlices(Sequence[bytes]):
    """Many byte strings held as one bytes object and their end offsets (the store reads a chat's compressed node
    JSON this way: no bytes object per node until one is asked for). Immutable."""

    __slots__ = ("_blob", "_ends")

    def __init__(self, blob: bytes, ends: np.ndarray) -> None:
        self._blob = blob
        self._ends = ends  # (n,) int64 end offsets, non-decreasing, the last one len(blob)

    def __len__(self) -> int:
        return int(self._ends.size)

    def _item(self, i: int) -> bytes:
        start = int(self._ends[i - 1]) if i else 0
        return self._blob[start : int(self._ends[i])]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item(k) for k in range(len(self))[i]]
        return self._item(range(len(self))[i])


def _index_columns(rows: Sequence[NodeIndex]) -> dict[str, tuple[Any, ...]]:
    """One tuple per :class:`NodeIndex` field over ``rows``."""
    if isinstance(rows, NodeIndexTable):
        return rows.columns()
    if not rows:
        return {name: () for name in _INDEX_FIELDS}
    return dict(zip(_INDEX_FIELDS, zip(*map(operator.attrgetter(*_INDEX_FIELDS), rows), strict=True), strict=True))


def _column(values: Any, dtype: Any, n: int) -> np.ndarray:
    """An index column as an (n,) array of ``dtype`` (packed tables already hold arrays)."""
    if isinstance(values, np.ndarray):
        return values.astype(dtype, copy=False).reshape(n)
    return np.fromiter(values, dtype=dtype, count=n)


def _visibility_names(value: Any) -> tuple[str, ...] | None:
    """Names in ``fields.visibility`` (reference §3.2): a list, or a comma-separated string; None if absent."""
    if value is None or value == "":
        return None
    if isinstance(value, list):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(part.strip() for part in str(value).split(",") if part.strip())


def node_index(node: Node) -> NodeIndex:
    """The denormalised index values of ``node``."""
    scope = node.scope
    st, span = node.story_time, node.story_time_span
    return NodeIndex(
        type=node.type,
        archived=node.archived,
        seq=node.seq,
        seq_start=node.seq_range[0] if node.seq_range is not None else None,
        seq_end=node.seq_range[1] if node.seq_range is not None else None,
        importance=float(node.importance),
        created_time=int(node.created_time),
        layer=scope.layer,
        owner_type=scope.owner_type,
        owner_key=scope.owner_key,
        owner_name=scope.owner_name or scope.owner_id,
        region_primary=scope.region_primary,
        region_tokens=tuple(scope.region_tokens()),
        anchor_terms=tuple(anchor_terms(node)),
        prev_id=node.prev_id or "",
        next_id=node.next_id or "",
        visibility=_visibility_names(node.fields.get("visibility")),
        segment_id=st.segment_id,
        has_story_label=bool(st.segment_id or st.label),
        tense=st.tense,
        span_start_segment=span.start_segment_id,
        span_end_segment=span.end_segment_id,
        has_span_label=bool(span.start_segment_id or span.end_segment_id or span.start_label or span.end_label),
    )


@dataclass(frozen=True, slots=True)
class EdgeRow:
    """The columns of an edge the snapshot needs."""

    edge_id: str
    from_id: str
    to_id: str
    relation: str
    strength: float
    edge_type: int
    invalid_at: int | None
    expired_at: int | None

    @classmethod
    def of(cls, edge: Edge) -> EdgeRow:
        return cls(edge.id, edge.from_id, edge.to_id, edge.relation, float(edge.strength), edge.edge_type,
                   edge.invalid_at, edge.expired_at)


@dataclass
class EdgeColumns:
    """The edges of a snapshot source as columns, in edge-list order (one entry per edge).

    ``src``/``dst`` are positions in the source's ``node_ids`` (−1 when the end is not a node of the source);
    ``invalid_at``/``expired_at`` are ms, NaN when none. Equal relation strings should be one (interned) object.
    """

    edge_ids: Sequence[str]
    src: np.ndarray  # (m,) int64
    dst: np.ndarray  # (m,) int64
    relation: Sequence[str]
    strength: np.ndarray  # (m,) float64
    edge_type: np.ndarray  # (m,) int64
    invalid_at: np.ndarray  # (m,) float64
    expired_at: np.ndarray  # (m,) float64

    @classmethod
    def of_rows(cls, rows: Sequence[EdgeRow], index: dict[str, int]) -> EdgeColumns:
        """Columns of ``rows`` with endpoints looked up in ``index`` (node id → position)."""
        m = len(rows)
        if not m:
            return cls.empty()
        edge_id, from_id, to_id, relation, strength, edge_type, invalid_at, expired_at = zip(
            *map(_EDGE_ROW_FIELDS, rows), strict=True
        )
        return cls(
            edge_ids=edge_id,
            src=np.fromiter(map(index.get, from_id, itertools.repeat(-1)), np.int64, m),
            dst=np.fromiter(map(index.get, to_id, itertools.repeat(-1)), np.int64, m),
            relation=relation,
            strength=np.array(strength, dtype=np.float64).reshape(m),
            edge_type=np.array(edge_type, dtype=np.int64).reshape(m),
            invalid_at=np.array(invalid_at, dtype=np.float64).reshape(m),  # None → NaN
            expired_at=np.array(expired_at, dtype=np.float64).reshape(m),
        )

    @classmethod
    def empty(cls) -> EdgeColumns:
        no_int, no_float = np.zeros(0, np.int64), np.zeros(0, np.float64)
        return cls((), no_int, no_int, (), no_float, no_int, no_float, no_float)


@dataclass
class SnapshotSource:
    """Everything a snapshot is built from, as read from the store in one read transaction.

    Two optional forms the store read uses to avoid per-edge objects and copies of the embedding matrix:

    * ``edge_columns`` set → the edges are these columns and ``edges`` is ignored (may be empty);
    * ``embeddings_aligned`` → ``embeddings`` is an (n × d) float32 matrix with one row per ``node_ids`` entry
      (zeros where a node has no vector; ``embedding_ids`` equals ``node_ids``), owned by the source:
      :func:`build_snapshot` normalises it in place and keeps it as the snapshot's matrix.
    """

    chat_id: str
    version: int
    node_ids: Sequence[str]
    node_index: Sequence[NodeIndex]  # a list, or the store's lazily decoded NodeIndexTable
    node_json: Sequence[str]  # a list, or the store's compressed PackedTexts (kept as is by the snapshot)
    edges: list[EdgeRow]
    model_id: str
    embedding_ids: list[str]
    embeddings: np.ndarray  # (m × d) float32, rows in ``embedding_ids`` order
    knowledge: KnowledgeState
    regions: RegionState
    timeline: TimelineState
    summaries: SummaryState
    history: HistoryState
    journal: list[JournalEntry]
    edge_columns: EdgeColumns | None = None
    embeddings_aligned: bool = False
    #: The store's node rowids (node order) and edge rowids (edge-list order) when read from a store: kept by the
    #: snapshot's structure so that :func:`apply_delta` can place the rows of a later delta.
    node_rids: np.ndarray | None = None
    edge_rowids: np.ndarray | None = None
    #: Set by :func:`apply_delta`: ``embeddings`` is the (n × d) matrix already L2-normalised and this is its
    #: has-vector mask (no second normalisation, which could change the last bit of a row).
    embeddings_normalised: np.ndarray | None = None


@dataclass
class SnapshotDelta:
    """What changed in a chat between two store versions (:meth:`StoreReader.snapshot_delta`), the input of
    :func:`apply_delta`.

    Node rows and edge rows written after ``since`` come in store order (``ord``, rowid); endpoints of edges
    and the rows of vectors are given as node rowids. ``deleted_*`` are the rowids of deleted nodes and edges and
    the node rowids whose ``model_id`` vector was deleted (the edges and vectors a node deletion cascades to are not
    listed: they go with the node). ``state`` is ``(knowledge, regions, timeline, summaries, history, journal)``
    when the chat state was written, else ``None``.
    """

    chat_id: str
    since: int
    version: int
    model_id: str
    node_rids: np.ndarray
    node_ids: list[str]
    node_index: NodeIndexTable
    node_blobs: list[bytes]  # compress_text of each node's JSON
    deleted_nodes: np.ndarray
    edge_rowids: np.ndarray
    edge_ids: list[str]
    edge_relation: list[str]
    edge_src_rid: np.ndarray
    edge_dst_rid: np.ndarray
    edge_strength: np.ndarray
    edge_type: np.ndarray
    edge_invalid_at: np.ndarray
    edge_expired_at: np.ndarray
    deleted_edges: np.ndarray
    vector_rids: np.ndarray
    vectors: np.ndarray  # (k × d) float32, raw (not normalised)
    deleted_vectors: np.ndarray
    vector_dim: int  # dimension of the chat's stored ``model_id`` vectors now (0: none stored)
    state: tuple[KnowledgeState, RegionState, TimelineState, SummaryState, HistoryState, list[JournalEntry]] | None

    @property
    def empty(self) -> bool:
        """Nothing written (only the version moved, e.g. a batch that wrote recall records)."""
        return not (
            self.node_rids.size or self.deleted_nodes.size or self.edge_rowids.size or self.deleted_edges.size
            or self.vector_rids.size or self.deleted_vectors.size or self.state is not None
        )


#: Buffers :meth:`_RowBuffer.holding` wrapped, by ``id`` of their memory (an entry leaves with its buffer, which
#: holds the memory).
_HELD: weakref.WeakValueDictionary[int, _RowBuffer] = weakref.WeakValueDictionary()
_HELD_LOCK = threading.Lock()


def spare_rows(n: int) -> int:
    """Spare rows to allocate after ``n`` rows of a growing matrix: an eighth more, at least 256 (appends are
    one message at a time)."""
    return max(256, n // 8)


#: Deleted rows beyond which :func:`_copy_runs` gathers the kept rows in one indexing pass instead of run by run.
MAX_COPY_RUNS = 64


def _copy_runs(matrix: np.ndarray, take: np.ndarray | None, out: np.ndarray) -> None:
    """``out[:k] = matrix[take]`` (all rows when ``take`` is None; ``take`` ascending, ``k`` its size), one slice
    copy per run of consecutive rows: a deletion keeps the rows around a few gaps, and a slice copy moves the
    bytes without the index pass and the temporary of a gather (a third of its time at 100k rows)."""
    if take is None:
        out[: matrix.shape[0]] = matrix
        return
    breaks = np.flatnonzero(np.diff(take) != 1) + 1
    if breaks.size > MAX_COPY_RUNS:
        np.take(matrix, take, axis=0, out=out[: take.size])
        return
    starts = np.concatenate([[0], breaks]).tolist()
    stops = np.concatenate([breaks, [take.size]]).tolist()
    for a, b in zip(starts, stops, strict=True):
        first = int(take[a])
        out[a:b] = matrix[first : first + (b - a)]


def _leading_view(view: np.ndarray, data: np.ndarray) -> bool:
    """``view`` is a view of ``data``'s memory starting at its first byte."""
    return memory_owner(view) is memory_owner(data) and view.ctypes.data == data.ctypes.data


class _RowBuffer:
    """A float32 matrix with spare rows, shared by the vector matrices of a chain of deltas: each snapshot's matrix
    is a leading view (``data[:n]``). A delta from the chain's newest snapshot (the *head*: the view this buffer
    handed out last) writes in place: appended rows into the spare rows (older snapshots, shorter views, never see
    them), and the first vector of a row that has never held one (a node the previous event added without a vector,
    which the background embedding now fills). Older snapshots that have the row see its new values, but each has
    ``has_vector`` false there, and every reader of a snapshot's vectors masks those rows (see
    :attr:`GraphSnapshot.embeddings`). A row that held a vector (*claimed*) is never written in place:
    a snapshot may still read it, so rewriting or deleting it copies the matrix. Any caller but the head copies."""

    __slots__ = ("__weakref__", "_claimed", "_head", "_lock", "_used", "data")


    def __init__(self, data: np.ndarray, head: np.ndarray, has_vector: np.ndarray) -> None:
        """``head``: the leading view of ``data`` handed out (its rows are in use); ``has_vector`` its mask."""
        self.data = data
        self._used = head.shape[0]
        self._lock = threading.Lock()
        self._head = head
        # Rows that held a vector in some snapshot of this buffer (a row written once stays claimed).
        self._claimed = np.zeros(data.shape[0], dtype=bool)
        self._claimed[: has_vector.size] = has_vector

    @property
    def head(self) -> np.ndarray:
        """The view handed out last (the chain's newest matrix)."""
        return self._head

    @classmethod
    def holding(cls, matrix: np.ndarray, has_vector: np.ndarray) -> _RowBuffer | None:
        """The buffer ``matrix`` is the leading rows of, when it was allocated with spare rows after it (the
        store's read of a chat's vectors; ``has_vector`` its rows' mask), else ``None``."""
        data = matrix.base
        if not (isinstance(data, np.ndarray) and data.base is None and data.dtype == matrix.dtype == np.float32
                and data.ndim == matrix.ndim == 2 and data.shape[1] == matrix.shape[1]
                and data.shape[0] > matrix.shape[0] and data.flags.c_contiguous and matrix.flags.c_contiguous
                and matrix.ctypes.data == data.ctypes.data):
            return None
        with _HELD_LOCK:  # one buffer object per memory: two snapshots built from one read share its rows' use
            held = _HELD.get(id(data))
            if held is None or held.data is not data:
                held = _HELD[id(data)] = cls(data, matrix, has_vector)
        return held

    @classmethod
    def of(
        cls, matrix: np.ndarray, has_vector: np.ndarray, extra: int, take: np.ndarray | None = None
    ) -> _RowBuffer:
        """A buffer holding a copy of ``matrix`` (its rows without a vector, per ``has_vector``, zero) followed by
        ``extra`` zero rows (its head: ``data[:n + extra]``), with spare rows after them. ``take`` (ascending row
        numbers): only those rows are copied, in order (a delta that deleted nodes), ``n`` their count."""
        mask = has_vector if take is None else has_vector[take]
        n = mask.shape[0]
        # Its own mapping when large (a new buffer per rewriting write would otherwise split the heaps).
        data = mapped_empty((n + extra + spare_rows(n), matrix.shape[1]), np.float32)
        _copy_runs(matrix, take, data)
        # The copied matrix may be an older snapshot's, whose rows without a vector a newer one filled in place.
        data[np.flatnonzero(~mask)] = 0.0
        data[n:n + extra] = 0.0
        return cls(data, data[:n + extra], mask)

    def claim(self, rows: np.ndarray) -> None:
        """Mark ``rows`` as holding a vector: a delta wrote them after :meth:`of` copied the matrix, and the
        snapshot it makes reads them, so a later delta must not write them in place."""
        with self._lock:
            self._claimed[rows] = True

    def extended(self, view: np.ndarray, extra: int, fill: np.ndarray) -> np.ndarray | None:
        """``view`` with ``extra`` zero rows appended, written in place, for a delta that then writes the vectors
        of the rows ``fill`` (positions in the result; claimed from now on) into it; ``None`` when ``view`` is not
        the head, the spare rows are too few, or a row of ``fill`` below ``view``'s length was ever claimed."""
        with self._lock:
            n = view.shape[0]
            if (view is not self._head or n != self._used or not _leading_view(view, self.data)
                    or n + extra > self.data.shape[0] or bool(self._claimed[fill].any())):
                return None
            self.data[n:n + extra] = 0.0
            self._claimed[fill] = True
            self._used = n + extra
            self._head = self.data[:n + extra]
            return self._head


#: Buffers handed out by :func:`appended_rows` → how many leading rows are in use (keyed by ``id``; an entry
#: leaves with its buffer).
_GROWN_USED: dict[int, int] = {}
_GROWN_LOCK = threading.Lock()


def appended_rows(old: np.ndarray, tail: Any) -> np.ndarray:
    """``np.concatenate([old, tail])`` along the rows (same dtype, shape and bytes), for arrays that are never
    written after they are made (a snapshot's, a per-structure cache's). When ``old`` is the leading rows of a
    buffer this function allocated and no array holds the rows after them yet, ``tail`` is written there and a
    longer view of the buffer returned: an append costs O(len(tail)) and older arrays (shorter views) never see
    the new rows. Otherwise a buffer with room for later appends (an eighth more rows, at least 256) is
    allocated and ``old`` copied once."""
    tail = np.asarray(tail)
    if tail.ndim != old.ndim:
        tail = tail.reshape(-1, *old.shape[1:])
    dtype = np.result_type(old, tail)
    n, k = old.shape[0], tail.shape[0]
    buf = old.base
    if isinstance(buf, np.ndarray) and buf.dtype == old.dtype == dtype and buf.shape[1:] == old.shape[1:] and n and (
            old.ctypes.data == buf.ctypes.data and old.flags.c_contiguous and buf.flags.c_contiguous):
        with _GROWN_LOCK:
            if _GROWN_USED.get(id(buf)) == n and n + k <= buf.shape[0]:
                buf[n:n + k] = tail
                _GROWN_USED[id(buf)] = n + k
                return buf[:n + k]
    if not k and old.dtype == dtype:
        return old
    buf = np.empty((n + k + max(256, (n + k) // 8), *old.shape[1:]), dtype=dtype)
    buf[:n] = old
    buf[n:n + k] = tail
    with _GROWN_LOCK:
        _GROWN_USED[id(buf)] = n + k
    weakref.finalize(buf, _GROWN_USED.pop, id(buf), None)
    return buf[:n + k]


def inserted(arr: np.ndarray, at: Any, values: Any) -> np.ndarray:
    """``np.insert(arr, at, values)`` for a 1-D ``arr`` and integer positions in ``[-n, n]`` (same values, dtype
    and order: values at one position keep their order; a position past either end is an ``IndexError``, which
    ``np.insert`` does not always raise), by one slice copy per run between positions instead of
    ``np.insert``'s boolean mask over the whole array: ~3x faster on a million rows, which a delta inserting a
    few entries into a snapshot's sparse matrices pays on every event."""
    arr = np.asarray(arr)
    at = np.asarray(at, dtype=np.int64).reshape(-1)
    if arr.ndim != 1:
        raise ValueError(f"inserted: a 1-D array is needed, got {arr.ndim} dimensions")
    vals = np.broadcast_to(np.asarray(values, dtype=arr.dtype), at.shape)
    n, k = arr.size, at.size
    if k and (int(at.min()) < -n or int(at.max()) > n):
        raise IndexError(f"inserted: positions out of bounds for {n} rows")
    at = np.where(at < 0, at + n, at)
    if k > 1 and bool(np.any(at[1:] < at[:-1])):
        order = np.argsort(at, kind="stable")
        at, vals = at[order], vals[order]
    out = np.empty(n + k, dtype=arr.dtype)
    prev = 0
    for j, p in enumerate(at.tolist()):
        out[prev + j:p + j] = arr[prev:p]
        prev = p
    out[prev + k:] = arr[prev:]
    out[at + np.arange(k)] = vals
    return out


def _same_at(old: np.ndarray, at: np.ndarray, values: Any) -> bool:
    """Whether ``old[at]`` already holds ``values`` (byte for byte, in ``old``'s dtype: NaN equals NaN)."""
    if not len(at):
        return True
    if old.dtype == object:
        return all(a is b or a == b for a, b in zip(old[at].tolist(), list(values), strict=True))
    return old[at].tobytes() == np.asarray(values, dtype=old.dtype).tobytes()


@dataclass(frozen=True, eq=False)
class _DeltaBase:
    """What :func:`apply_delta` needs of a snapshot beside its arrays: the node rowids (node order), the index
    columns as decoded from the store (``importance`` there is stale once reinforced: the overlay holds it),
    every edge as read (also inactive ones; endpoints as node positions) with its rowid, and the node JSON."""

    rids: np.ndarray
    columns: dict[str, Any]
    edges: EdgeColumns
    edge_rowids: np.ndarray
    #: ``prev_id``/``next_id`` → id → positions of the nodes whose link names that id while no node has it (see
    #: :meth:`dangling_links`); shared along a chain of appends, which only add to it.
    _dangling: dict[str, dict[str, list[int]]] | None = None
    #: The buffer the snapshot's vector matrix is a leading view of, when a delta appended rows to it.
    vectors: _RowBuffer | None = None

    def dangling_links(self, snap: GraphSnapshot) -> dict[str, dict[str, list[int]]]:
        """For ``prev_id`` and ``next_id``: each id that a node's link names but no node of ``snap`` has → the
        positions of those nodes (a superset: entries whose position no longer names that id, or that resolved,
        stay; a reader checks the column). Built on first use (one pass over the unresolved links), then kept."""
        if self._dangling is None:
            out: dict[str, dict[str, list[int]]] = {}
            for name, resolved in (("prev_id", snap.prev_index), ("next_id", snap.next_index)):
                col = self.columns[name]
                links: dict[str, list[int]] = {}
                for i in np.flatnonzero(resolved < 0).tolist():
                    if col[i]:
                        links.setdefault(col[i], []).append(i)
                out[name] = links
            object.__setattr__(self, "_dangling", out)
        assert self._dangling is not None
        return self._dangling


# ---------------------------------------------------------------------------------------------------------------
# Knowledge state as arrays (reference §1.5; precomputed once per snapshot: recall-spec departure 11)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnowledgeArrays:
    """Per-owner boolean masks and visibility scores over the snapshot's nodes.

    Row ``o`` of each (owners × n) array belongs to ``owner_keys[o]``. ``known`` includes manual-known ids and the
    owner's own character node; ``own_pov`` marks POV nodes whose scope owner key equals the owner's key — the
    reference quirk of §1.5 step 4 is fixed (owner keys match with or without a node id: recall-spec departure 2).
    """

    owner_keys: tuple[str, ...]
    owner_types: tuple[str, ...]
    owner_names: tuple[str, ...]
    aliases: tuple[tuple[str, ...], ...]
    owner_node_index: np.ndarray  # (owners,) int, −1 when the owner has no character node in the snapshot
    updated_at: np.ndarray  # (owners,) int64
    known: np.ndarray  # (owners × n) bool
    manual_known: np.ndarray
    mistaken: np.ndarray
    hidden: np.ndarray
    own_pov: np.ndarray
    visibility: np.ndarray  # (owners × n) float64

    def row(self, owner_key: str) -> int:
        """Row of an owner key (``character:name`` or ``character:name#nodeId``), or −1."""
        key = owner_key.lower()
        base = key.split("#", 1)[0]
        for i, k in enumerate(self.owner_keys):
            if k.lower() == key:
                return i
        for i, k in enumerate(self.owner_keys):
            if k.lower().split("#", 1)[0] == base:
                return i
        return -1


def _owner_base_key(owner_key: str) -> str:
    return owner_key.lower().split("#", 1)[0]


def _knowledge_arrays(
    state: KnowledgeState, index: Mapping[str, int], scope_owner_key: np.ndarray, n: int
) -> KnowledgeArrays:
    entries = list(state.owners.values())
    k = len(entries)
    known = np.zeros((k, n), dtype=bool)
    manual_known = np.zeros((k, n), dtype=bool)
    mistaken = np.zeros((k, n), dtype=bool)
    hidden = np.zeros((k, n), dtype=bool)
    own_pov = np.zeros((k, n), dtype=bool)
    visibility = np.zeros((k, n), dtype=np.float64)
    owner_node = np.full(k, -1, dtype=np.int64)

    def idx(ids: Sequence[str]) -> np.ndarray:
        return np.fromiter((index[i] for i in ids if i in index), dtype=np.int64)

    # The nodes' owner keys as codes (a chat has few distinct ones): one integer comparison per owner.
    keys = scope_owner_key.tolist()
    key_codes = {key: code for code, key in enumerate(dict.fromkeys(keys))}
    owner_code = np.fromiter(map(key_codes.__getitem__, keys), dtype=np.int64, count=n)
    del keys

    for o, entry in enumerate(entries):
        known[o, idx(entry.known_node_ids)] = True
        manual_known[o, idx(entry.manual_known_node_ids)] = True
        mistaken[o, idx(entry.mistaken_node_ids)] = True
        hidden[o, idx(entry.manual_hidden_node_ids)] = True
        if entry.visibility_scores:
            scores = entry.visibility_scores
            at = np.fromiter(map(index.get, scores, itertools.repeat(-1)), dtype=np.int64, count=len(scores))
            vals = np.fromiter(scores.values(), dtype=np.float64, count=len(scores))
            found = at >= 0
            visibility[o, at[found]] = vals[found]
        if entry.node_id and entry.node_id in index:
            owner_node[o] = index[entry.node_id]
            known[o, index[entry.node_id]] = True
        own_pov[o] = owner_code == key_codes.get(_owner_base_key(entry.owner_key), -1)
    return KnowledgeArrays(
        owner_keys=tuple(e.owner_key for e in entries),
        owner_types=tuple(e.owner_type for e in entries),
        owner_names=tuple(e.owner_name for e in entries),
        aliases=tuple(tuple(a for a in (e.owner_name, *e.aliases) if a) for e in entries),
        owner_node_index=owner_node,
        updated_at=np.array([e.updated_at for e in entries], dtype=np.int64),
        known=known | manual_known,
        manual_known=manual_known,
        mistaken=mistaken,
        hidden=hidden,
        own_pov=own_pov,
        visibility=visibility,
    )


# ---------------------------------------------------------------------------------------------------------------
# The snapshot
# ---------------------------------------------------------------------------------------------------------------


class SnapshotStructure:
    """The identity of a snapshot's structure: node index, vectors, CSR graphs, text and knowledge arrays — all
    but the statistics overlay (:class:`NodeStats`). A write that only access-reinforces nodes gives the chat a
    snapshot with a new overlay and this same object, so caches of structure-only values keyed on it
    (:func:`memory_recall.pipeline._graph_cache.cached`) survive such writes with no carry-over. Any other change
    makes a new structure.

    ``version`` is the store version the structure was built (or last updated by a delta) at. ``source`` holds what
    an incremental update needs beside the snapshot's own arrays (:func:`apply_delta`): the store-side node rowids,
    the undecoded index columns and every edge (also the inactive ones); ``None`` for snapshots built without a
    store (they are only ever rebuilt).
    """

    __slots__ = ("__weakref__", "_parent", "change", "source", "version")

    def __init__(
        self, version: int, source: _DeltaBase | None = None, *, parent: SnapshotStructure | None = None,
        change: StructureChange | None = None,
    ) -> None:
        self.version = version
        self.source = source
        # Held (with its caches) until this structure is itself updated (:meth:`release_parent`): the first recall
        # on the new snapshot updates the parent's cached values instead of building them. At most one parent
        # per live structure: a chain of updates keeps no older structure alive.
        self._parent = parent
        self.change = change

    @property
    def parent(self) -> SnapshotStructure | None:
        """The structure this one was updated from by a delta (:attr:`change` says how), until released."""
        return self._parent

    def release_parent(self) -> None:
        """Drop the parent (and so its caches): called when a delta updates this structure into a child."""
        self._parent = None

    def __repr__(self) -> str:
        return f"SnapshotStructure(version={self.version})"


@dataclass(frozen=True, eq=False)
class StructureChange:
    """How a delta turned a parent structure into its child (:attr:`SnapshotStructure.change`), for per-structure
    caches that update a parent's value instead of building anew (:func:`memory_recall.pipeline._graph_cache.cached`
    with ``update``): ``remap[i]`` is the new position of the parent's node ``i`` (−1: deleted); nodes at
    ``rewritten`` (new positions) were rewritten in place; the nodes from ``appended`` on are new;
    ``state_changed`` when the chat state (knowledge, regions, timeline, …) was written; ``edges_changed`` when
    an edge was written or deleted, or the edge horizon moved. ``appended_only`` when the delta deleted nothing,
    changed no kept edge and rewrote no node's archived flag or anchor terms (so ``remap`` is the identity, the
    old active edges and anchor lists stand and only get appended to): what most writes of a chat turn do.

    For an ``appended_only`` change also: ``changed_columns``, the per-node arrays of the snapshot (``type_code``,
    ``seq``, ``created_time``, …) whose value changed at some rewritten node, and ``relinked``, the kept nodes
    whose ``prev_index`` or ``next_index`` changed (rewritten, or an old link that names a new node resolving now),
    ascending. Any other change leaves them ``None``: nothing is known about the kept rows then.

    ``kept`` and ``via``, for a change that deleted nodes: the parent's rows it kept (ascending; the child holds
    them first, in that order) and the rest of the change as an ``appended_only`` change from the graph of those
    rows alone (:func:`_kept_snapshot`) to the child. A cache that can drop rows from its value derives the child's
    value as that drop followed by its update for ``via``. ``edges_kept`` and ``touched`` then tell what the drop
    did to the edges (see the fields).

    ``refielded``: the positions of ``rewritten`` whose ``fields`` changed (:func:`~memory_recall.store.node_fields.
    same_fields` of the old and new JSON text), ascending. A value made of a node's fields alone stays valid for
    the other rewritten nodes (a chat turn rewrites the previous message and the owners it names, not their
    text). ``None`` when not known: every rewritten node then counts as changed."""

    n_old: int
    n_new: int
    remap: np.ndarray
    rewritten: np.ndarray
    appended: int
    state_changed: bool
    edges_changed: bool
    appended_only: bool = False
    changed_columns: frozenset[str] | None = None
    relinked: np.ndarray | None = None
    refielded: np.ndarray | None = None
    kept: np.ndarray | None = None
    via: StructureChange | None = None
    #: With ``kept``: the kept graph's active edge count, and the kept nodes (positions there, ascending, unique) one
    #: of whose active edges the delta deleted.
    edges_kept: int | None = None
    touched: np.ndarray | None = None

    @property
    def fields_changed(self) -> np.ndarray:
        """The new positions whose ``fields`` may differ from the parent's: :attr:`refielded` when known, else
        :attr:`rewritten`."""
        return self.rewritten if self.refielded is None else self.refielded

    def carried(self) -> tuple[np.ndarray, np.ndarray]:
        """``(old, new)`` positions of the nodes whose rows are unchanged (kept and not rewritten)."""
        old = np.flatnonzero(self.remap >= 0)
        new = self.remap[old]
        keep = ~np.isin(new, self.rewritten)
        return old[keep], new[keep]


#: Parsed nodes a snapshot keeps (and hands to the snapshot a delta derives from it): the candidates of many
#: recalls, while a long-lived chat's snapshot never holds every node as a model (~10 KB each).
MAX_PARSED_NODES = 8192


def _newest(nodes: dict[int, Node]) -> list[tuple[int, Node]]:
    """The :data:`MAX_PARSED_NODES` most recently parsed of ``nodes`` (insertion order), oldest first."""
    items = list(nodes.items())
    return items[-MAX_PARSED_NODES:] if len(items) > MAX_PARSED_NODES else items


@dataclass(frozen=True, eq=False)
class NodeStats:
    """The per-node statistics overlay of a snapshot: what recall itself writes (access reinforcement).

    ``importance`` is the (n,) float64 importance of every node. ``reinforced`` maps a node index to its
    ``(access_count, importance, last_access_time)`` when a reinforcement write changed them after the node JSON
    held by the structure was read (:meth:`GraphSnapshot.node` applies them); a freshly built snapshot has none.
    Immutable: a reinforcement makes a new overlay.
    """

    importance: np.ndarray
    reinforced: Mapping[int, tuple[int, float, int]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class GraphSnapshot:
    """Arrays of one chat's graph at one store version (see the module docstring)."""

    chat_id: str
    version: int
    model_id: str
    ids: Sequence[str]  # a tuple, or a SharedPrefix after appending deltas
    index: Mapping[str, int]  # a dict, or a SharedIndex after appending deltas
    id_rank: np.ndarray  # (n,) int64: position of each id in byte order
    type_code: np.ndarray  # (n,) int16 into NODE_TYPES
    archived: np.ndarray  # (n,) bool
    seq: np.ndarray  # (n,) int64
    seq_start: np.ndarray  # (n,) float64, NaN when the node has no finite range
    seq_end: np.ndarray  # (n,) float64, NaN when the node has no finite range
    stats: NodeStats  # the statistics overlay: ``importance`` and what access reinforcement wrote since the build
    created_time: np.ndarray  # (n,) float64 ms
    is_pov: np.ndarray  # (n,) bool
    owner_type_code: np.ndarray  # (n,) int8: 0 none, 1 character, 2 user
    scope_owner_key: np.ndarray  # (n,) object: lower-cased owner key without "#nodeId", "" when objective
    # The string columns: tuples, or SharedPrefix views after appending deltas (see SharedPrefix).
    scope_owner_name: Sequence[str]
    region_primary: Sequence[str]
    region_tokens: Sequence[tuple[str, ...]]
    anchor_terms: Sequence[tuple[str, ...]]
    anchor_index: dict[str, tuple[int, ...]]  # anchor term → node indices (non-archived), graph order
    anchor_lengths: tuple[int, ...]  # distinct term lengths, descending
    visibility: dict[int, tuple[str, ...]]  # node index → names of ``fields.visibility``
    segment_id: Sequence[str]
    has_story_label: np.ndarray
    tense_code: np.ndarray
    span_start_segment: Sequence[str]
    span_end_segment: Sequence[str]
    has_span_label: np.ndarray
    prev_index: np.ndarray  # (n,) int64, −1 when none/missing
    next_index: np.ndarray
    # (n × d) float32, L2-normalised rows; a row without a vector is zero when the snapshot is made, but a newer
    # snapshot sharing the memory may fill it in place (``_RowBuffer``): readers mask rows by ``has_vector``.
    embeddings: np.ndarray
    has_vector: np.ndarray  # (n,) bool
    adjacency: sp.csr_matrix  # (n × n) summed strengths of active normal edges, symmetric
    inhibit: sp.csr_matrix  # (n × n) summed strengths of active inhibit edges, symmetric
    temporal_pairs: np.ndarray  # (t × 2) int64 unordered prev/next pairs of non-archived nodes
    edge_src: np.ndarray  # (e,) int64 of active edges, edge-list order
    edge_dst: np.ndarray
    edge_strength: np.ndarray
    edge_inhibit: np.ndarray
    edge_relation: Sequence[str]
    edge_ids: Sequence[str]  # a tuple, or JoinedStrings (compact) from the store
    incident: sp.csr_matrix  # (n × e) node → incident active edges (values = edge position + 1)
    valid_until_ms: float  # earliest future invalid_at/expired_at; the snapshot is stale after it
    knowledge: KnowledgeArrays
    knowledge_state: KnowledgeState
    regions: RegionState
    timeline: TimelineState
    summaries: SummaryState
    history: HistoryState
    journal: tuple[JournalEntry, ...]
    built_at_ms: int
    #: Identity of the structure (everything but :attr:`stats`): shared by the snapshots that differ only in their
    #: statistics overlay; per-snapshot caches of structure-only values key on it.
    structure: SnapshotStructure
    _node_json: Sequence[str] = field(repr=False)  # a tuple, or PackedTexts (compressed) from the store
    _nodes: dict[int, Node] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def importance(self) -> np.ndarray:
        """(n,) float64 importance of each node (the statistics overlay's: reinforcement updates it)."""
        return self.stats.importance

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def node(self, i: int, *, keep: bool = True) -> Node:
        """The full node at index ``i`` (parsed on first use, then cached). ``keep=False`` parses without caching
        (a cached parse is still returned): for a caller that keeps what it reads from the node itself, so the
        snapshot does not also hold the model (~6 KB a node) of every node it ever read."""
        cached = self._nodes.get(i)
        if cached is not None:
            return cached
        node = Node.model_validate_json(self._node_json[i])
        stat = self.stats.reinforced.get(i)
        if stat is not None:  # the node JSON predates the reinforcement writes of the overlay
            node = node.model_copy(
                update={"access_count": stat[0], "importance": stat[1], "last_access_time": stat[2]}
            )
        if not keep:
            return node
        with self._lock:
            self._nodes[i] = node
            if len(self._nodes) > MAX_PARSED_NODES:  # the oldest parse goes: memory stays bounded on any chat
                self._nodes.pop(next(iter(self._nodes)))
        return node

    def node_by_id(self, node_id: str) -> Node | None:
        i = self.index.get(node_id)
        return None if i is None else self.node(i)

    def type_of(self, i: int) -> str:
        return NODE_TYPES[int(self.type_code[i])]

    def recency(self, idx: np.ndarray) -> np.ndarray:
        """Recency key of each node of ``idx`` (float64): ``seqRange[1]``, or ``seq`` when the range is open."""
        end = self.seq_end[idx]
        return np.where(np.isnan(end), self.seq[idx].astype(np.float64), end)

    def mask_types(self, types: Sequence[str] | frozenset[str]) -> np.ndarray:
        codes = [TYPE_CODE[t] for t in types if t in TYPE_CODE]
        return np.isin(self.type_code, codes)

    @property
    def finite_range(self) -> np.ndarray:
        return ~np.isnan(self.seq_end)

    @property
    def core_mask(self) -> np.ndarray:
        """Non-archived nodes of always-inject types (no range or visibility filter: reference §3.20)."""
        return self.mask_types(CORE_TYPES) & ~self.archived

    def active_edges_of(self, i: int) -> list[int]:
        """Positions (in edge-list order) of the active edges touching node ``i``."""
        start, end = self.incident.indptr[i], self.incident.indptr[i + 1]
        return sorted(int(v) - 1 for v in self.incident.data[start:end])

    def scope_of(self, i: int) -> MemoryScope:
        return self.node(i).scope


def _normalise_rows(emb: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """L2-normalise ``emb`` in place, block by block (all rows, or the positions ``rows``); rows whose norm is
    not positive become zero. Returns the mask (over the normalised rows) of rows that have a vector.

    No full-size temporaries beside the matrix (peak memory of a large chat); the per-row arithmetic (float32
    norm, float32 divide) is the same for both forms, so the results are byte-identical.
    """
    count = emb.shape[0] if rows is None else rows.size
    ok = np.zeros(count, dtype=bool)
    for lo in range(0, count, _NORM_BLOCK):
        hi = min(count, lo + _NORM_BLOCK)
        block = emb[lo:hi] if rows is None else emb[rows[lo:hi]]
        norms = np.linalg.norm(block, axis=1)
        good = norms > 0
        ok[lo:hi] = good
        if not good.all():
            block[~good] = 0.0
            norms[~good] = 1.0
        block /= norms[:, None]
        if rows is not None:
            emb[rows[lo:hi]] = block
    return ok


def _embedding_matrix(source: SnapshotSource, index: dict[str, int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The snapshot's (n × d) normalised matrix and its has-vector mask (see :class:`SnapshotSource`)."""
    mat = source.embeddings
    dim = int(mat.shape[1]) if mat.ndim == 2 and mat.size else 0
    if source.embeddings_aligned and dim:
        if mat.shape[0] != n or mat.dtype != np.float32:
            raise ValueError(f"aligned embeddings must be ({n} × d) float32, got {mat.shape} {mat.dtype}")
        return mat, _normalise_rows(mat)
    emb = np.zeros((n, dim), dtype=np.float32)
    has_vec = np.zeros(n, dtype=bool)
    if dim:
        pos = np.fromiter(map(index.get, source.embedding_ids, itertools.repeat(-1)), dtype=np.int64)
        keep = pos >= 0
        target = pos[keep]
        emb[target] = mat if keep.all() else mat[keep]
        has_vec[target[_normalise_rows(emb, target)]] = True
    return emb, has_vec


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk build (the snapshot read and build of a large chat).

    Decoding 100k index rows creates millions of objects, and each collection the allocations trigger walks
    all of them (~40% of the decode time at 100k nodes). The snapshot creates no reference cycles, so
    reference counting frees what it drops. Re-enabled on exit only if it was enabled on entry (a process
    that disabled it keeps it off); nested and concurrent uses leave it enabled once the last one exits
    (a concurrent use may see it paused: that only delays collections).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_snapshot(source: SnapshotSource, *, now_ms: int) -> GraphSnapshot:
    """Build the arrays of a snapshot. O(n + e) numpy work plus one pass over the index rows (with the cyclic
    garbage collector paused: :func:`gc_paused`)."""
    with gc_paused():
        return _build_snapshot(source, now_ms=now_ms)


def _active_edges(
    invalid_at: np.ndarray, expired_at: np.ndarray, src: np.ndarray, dst: np.ndarray, archived: np.ndarray, now_ms: int
) -> np.ndarray:
    """The edges a snapshot keeps (reference §1.3): not invalid or expired at ``now_ms``, both ends present,
    distinct and not archived. A mask over the given edges."""
    keep = ~(invalid_at <= now_ms) & ~(expired_at <= now_ms) & (src >= 0) & (dst >= 0) & (src != dst)
    keep[keep] = ~archived[src[keep]] & ~archived[dst[keep]]
    return keep


def _next_expiry(invalid_at: np.ndarray, expired_at: np.ndarray, now_ms: int) -> float:
    """The earliest invalid/expiry time of these edges after ``now_ms`` (``inf`` when none): a snapshot holding
    them is stale from then on."""
    future = np.concatenate([invalid_at[invalid_at > now_ms], expired_at[expired_at > now_ms]])
    return float(future.min()) if future.size else math.inf


def _moved(positions: np.ndarray, remap: np.ndarray) -> np.ndarray:
    """Node positions (−1: none) moved to a delta's new positions by ``remap`` (−1 for a deleted node)."""
    return np.where(positions >= 0, remap[np.maximum(positions, 0)], -1)


def _anchor_index(anchor_terms: Sequence[tuple[str, ...]], archived: np.ndarray) -> dict[str, tuple[int, ...]]:
    """Anchor term → positions of the non-archived nodes that hold it, in node order; terms in the order of their
    first node (and of their place among its terms)."""
    index: dict[str, list[int]] = {}
    # Only the non-archived nodes with terms (a minority) are visited.
    with_terms = np.fromiter(map(bool, anchor_terms), dtype=bool, count=archived.size) & ~archived
    for i in np.flatnonzero(with_terms).tolist():
        for term in anchor_terms[i]:
            index.setdefault(term, []).append(i)
    return {t: tuple(v) for t, v in index.items()}


def _build_snapshot(source: SnapshotSource, *, now_ms: int) -> GraphSnapshot:
    ids = tuple(source.node_ids)
    n = len(ids)
    index = dict(zip(ids, range(n), strict=True))
    c = _index_columns(source.node_index)
    # Code point order of str equals the byte order of its UTF-8 encoding (ids cannot hold lone surrogates).
    order = sorted(range(n), key=ids.__getitem__)
    id_rank = np.empty(n, dtype=np.int64)
    id_rank[order] = np.arange(n, dtype=np.int64)

    type_code = np.fromiter(map(TYPE_CODE.get, c["type"], itertools.repeat(-1)), dtype=np.int16, count=n)
    archived = _column(c["archived"], bool, n)
    seq = _column(c["seq"], np.int64, n)
    seq_start = np.array(c["seq_start"], dtype=np.float64).reshape(n)  # None → NaN
    seq_end = np.array(c["seq_end"], dtype=np.float64).reshape(n)
    importance = _column(c["importance"], np.float64, n)
    created = _column(c["created_time"], np.float64, n)
    is_pov = np.fromiter(map(operator.eq, c["layer"], itertools.repeat("pov")), dtype=bool, count=n)
    owner_type_code = np.fromiter(map(_OWNER_TYPE_CODE.get, c["owner_type"], itertools.repeat(0)), np.int8, n)
    # A chat has few distinct owner keys: each is normalised once.
    base_keys = {k: _owner_base_key(k) if k else "" for k in set(c["owner_key"])}
    scope_owner_key = np.empty(n, dtype=object)
    scope_owner_key[:] = list(map(base_keys.__getitem__, c["owner_key"]))
    tense_code = np.fromiter(map(TENSE_CODE.get, c["tense"], itertools.repeat(0)), dtype=np.int8, count=n)

    anchor_index = _anchor_index(c["anchor_terms"], archived)
    anchor_lengths = tuple(sorted({len(t) for t in anchor_index}, reverse=True))

    prev_index = np.fromiter(map(index.get, c["prev_id"], itertools.repeat(-1)), dtype=np.int64, count=n)
    next_index = np.fromiter(map(index.get, c["next_id"], itertools.repeat(-1)), dtype=np.int64, count=n)

    # Embeddings: rows aligned to node order; missing vectors stay zero and are masked out.
    if source.embeddings_normalised is not None:
        emb, has_vec = source.embeddings, source.embeddings_normalised
    else:
        emb, has_vec = _embedding_matrix(source, index, n)

    # Active edges between non-archived nodes, in edge-list order (reference §1.3). Column passes instead of one
    # branchy loop: a large chat has several edges per node.
    cols = source.edge_columns if source.edge_columns is not None else EdgeColumns.of_rows(source.edges, index)
    valid_until = _next_expiry(cols.invalid_at, cols.expired_at, now_ms)
    keep = _active_edges(cols.invalid_at, cols.expired_at, cols.src, cols.dst, archived, now_ms)
    src = cols.src[keep]
    dst = cols.dst[keep]
    strength = cols.strength[keep]
    inhibit_mask = cols.edge_type[keep] == INHIBIT_EDGE_TYPE
    joined = isinstance(cols.edge_ids, JoinedStrings)
    edge_ids_t: Sequence[str]
    if keep.all():
        relation_t = tuple(cols.relation)
        edge_ids_t = cols.edge_ids if joined else tuple(cols.edge_ids)
    else:
        kept_at = np.flatnonzero(keep)
        kept = kept_at.tolist()
        relation_t = tuple(map(cols.relation.__getitem__, kept))
        edge_ids_t = cols.edge_ids.take(kept_at) if isinstance(cols.edge_ids, JoinedStrings) else tuple(
            map(cols.edge_ids.__getitem__, kept)
        )

    def sym(mask: np.ndarray) -> sp.csr_matrix:
        r = np.concatenate([src[mask], dst[mask]])
        c = np.concatenate([dst[mask], src[mask]])
        v = np.concatenate([strength[mask], strength[mask]])
        m = sp.csr_matrix((v, (r, c)), shape=(n, n))
        m.sum_duplicates()
        return m

    adjacency = sym(~inhibit_mask) if len(src) else sp.csr_matrix((n, n))
    inhibit = sym(inhibit_mask) if len(src) else sp.csr_matrix((n, n))
    e_count = len(src)
    epos = np.arange(e_count, dtype=np.int64)
    incident = sp.csr_matrix(
        (np.concatenate([epos + 1, epos + 1]).astype(np.float64),
         (np.concatenate([src, dst]), np.concatenate([epos, epos]))),
        shape=(n, e_count),
    )

    # Temporal links: prev/next chain between non-archived nodes, once per unordered pair.
    pairs: list[np.ndarray] = []
    for neighbour in (prev_index, next_index):
        ok = (neighbour >= 0) & ~archived
        left = np.nonzero(ok)[0]
        right = neighbour[ok]
        ok2 = ~archived[right] & (left != right)
        pairs.append(np.stack([np.minimum(left[ok2], right[ok2]), np.maximum(left[ok2], right[ok2])], axis=1))
    # Unique rows in (low, high) order, via one int64 key per pair (a row-wise unique sorts void records: slow).
    keys = np.unique(np.concatenate([p[:, 0] * max(n, 1) + p[:, 1] for p in pairs]))
    temporal_pairs = np.stack([keys // max(n, 1), keys % max(n, 1)], axis=1)

    knowledge = _knowledge_arrays(source.knowledge, index, scope_owner_key, n)
    base = None
    if source.node_rids is not None and source.edge_rowids is not None:
        base = _DeltaBase(source.node_rids, c, cols, source.edge_rowids, vectors=_RowBuffer.holding(emb, has_vec))
    return GraphSnapshot(
        chat_id=source.chat_id,
        version=source.version,
        model_id=source.model_id,
        ids=ids,
        index=index,
        id_rank=id_rank,
        type_code=type_code,
        archived=archived,
        seq=seq,
        seq_start=seq_start,
        seq_end=seq_end,
        stats=NodeStats(importance),
        created_time=created,
        is_pov=is_pov,
        owner_type_code=owner_type_code,
        scope_owner_key=scope_owner_key,
        scope_owner_name=tuple(c["owner_name"]),
        region_primary=tuple(c["region_primary"]),
        region_tokens=tuple(c["region_tokens"]),
        anchor_terms=tuple(c["anchor_terms"]),
        anchor_index=anchor_index,
        anchor_lengths=anchor_lengths,
        visibility={i: v for i, v in enumerate(c["visibility"]) if v is not None},
        segment_id=tuple(c["segment_id"]),
        has_story_label=_column(c["has_story_label"], bool, n),
        tense_code=tense_code,
        span_start_segment=tuple(c["span_start_segment"]),
        span_end_segment=tuple(c["span_end_segment"]),
        has_span_label=_column(c["has_span_label"], bool, n),
        prev_index=prev_index,
        next_index=next_index,
        embeddings=emb,
        has_vector=has_vec,
        adjacency=adjacency,
        inhibit=inhibit,
        temporal_pairs=temporal_pairs.astype(np.int64),
        edge_src=src,
        edge_dst=dst,
        edge_strength=strength,
        edge_inhibit=inhibit_mask,
        edge_relation=relation_t,
        edge_ids=edge_ids_t,
        incident=incident,
        valid_until_ms=valid_until,
        knowledge=knowledge,
        knowledge_state=source.knowledge,
        regions=source.regions,
        timeline=source.timeline,
        summaries=source.summaries,
        history=source.history,
        journal=tuple(source.journal),
        built_at_ms=now_ms,
        structure=SnapshotStructure(source.version, base),
        _node_json=source.node_json if isinstance(source.node_json, PackedTexts) else tuple(source.node_json),
    )


#: Chats at least this large return the read's freed heap memory to the OS after a build (:func:`load_snapshot`).
_TRIM_NODES = 10_000


def load_snapshot(store: Any, chat_id: str, model_id: str, *, now_ms: int) -> GraphSnapshot:
    """``build_snapshot(store.snapshot_source(chat_id, model_id), now_ms=now_ms)``, then the read's freed memory
    is returned to the OS (large chats). What :class:`SnapshotCache` does on a rebuild."""
    snap = build_snapshot(store.snapshot_source(chat_id, model_id), now_ms=now_ms)
    if snap.n >= _TRIM_NODES:
        release_freed_heap()
    return snap


def snapshot_from_graph(
    graph: MemoryGraph,
    *,
    now_ms: int,
    chat_id: str = "test",
    version: int = 1,
    embeddings: dict[str, np.ndarray] | None = None,
    model_id: str = "",
) -> GraphSnapshot:
    """Build a snapshot straight from a :class:`MemoryGraph` (tests, benchmarks, evaluation)."""
    embeddings = embeddings or {}
    emb_ids = [n.id for n in graph.nodes if n.id in embeddings]
    mat = (
        np.stack([np.asarray(embeddings[i], dtype=np.float32) for i in emb_ids])
        if emb_ids
        else np.zeros((0, 0), dtype=np.float32)
    )
    source = SnapshotSource(
        chat_id=chat_id,
        version=version,
        node_ids=[n.id for n in graph.nodes],
        node_index=[node_index(n) for n in graph.nodes],
        node_json=[n.model_dump_json() for n in graph.nodes],
        edges=[EdgeRow.of(e) for e in graph.edges],
        model_id=model_id,
        embedding_ids=emb_ids,
        embeddings=mat,
        knowledge=graph.knowledge,
        regions=graph.regions,
        timeline=graph.timeline,
        summaries=graph.summaries,
        history=graph.history,
        journal=list(graph.batch_journal),
    )
    return build_snapshot(source, now_ms=now_ms)


class _SplicedBlobs(Sequence[bytes]):
    """The compressed node JSON of a snapshot updated by deltas: position ``i`` is ``base[take[i]]`` for the rows
    kept from the snapshot the store read (``take[i] >= 0``) and ``extra[i]`` for the rows deltas wrote since.
    A delta on a spliced snapshot composes the two maps (one numpy gather, no nesting); :func:`_spliced` packs the
    blobs into one :class:`BlobSlices` again when the written rows pass :data:`_MAX_SPLICED_EXTRA`."""

    __slots__ = ("_base", "_extra", "_take")

    def __init__(self, base: Sequence[bytes], take: np.ndarray, extra: Mapping[int, bytes]) -> None:
        self._base = base
        self._take = take
        self._extra = dict(extra)

    def __len__(self) -> int:
        return int(self._take.size)

    def _item(self, i: int) -> bytes:
        at = int(self._take[i])
        return self._base[at] if at >= 0 else self._extra[i]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item(k) for k in range(len(self))[i]]
        return self._item(range(len(self))[i])


#: Rows written by deltas (held one bytes object each) before the node JSON is packed into one blob again: packing
#: costs a pass over the chat, so it runs once per this many written rows.
_MAX_SPLICED_EXTRA = 4096


def _spliced(base: Sequence[bytes], take: np.ndarray, extra: Mapping[int, bytes]) -> Sequence[bytes]:
    """``base`` with rows kept (``take[i] >= 0``: ``base[take[i]]``) and written (``extra[i]``), as one level of
    :class:`_SplicedBlobs` over the blobs the store read, whatever the number of deltas before."""
    extra = dict(extra)
    if isinstance(base, _SplicedBlobs):
        kept = take >= 0
        inner = np.full(take.size, -1, dtype=np.int64)
        inner[kept] = base._take[take[kept]]
        # Rows kept from the previous splice that it had written: their blobs move to this level's extra.
        for i in np.flatnonzero(kept & (inner < 0)).tolist():
            extra[i] = base._extra[int(take[i])]
        take, base = inner, base._base
    if len(extra) > _MAX_SPLICED_EXTRA:
        blobs = [base[int(at)] if at >= 0 else extra[i] for i, at in enumerate(take.tolist())]
        ends = np.fromiter(itertools.accumulate(map(len, blobs)), np.int64, len(blobs))
        return BlobSlices(b"".join(blobs), ends)
    return _SplicedBlobs(base, take, extra)


def _positions(keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Position in ``keys`` (unique int64) of each value of ``query``, −1 when absent. O((k + q) log k)."""
    query = np.asarray(query, dtype=np.int64)
    out = np.full(query.size, -1, dtype=np.int64)
    if not keys.size or not query.size:
        return out
    # Rowids in insertion order, as a chat's usually are, are searched as they are: no sort.
    order = None if bool(np.all(keys[1:] > keys[:-1])) else np.argsort(keys, kind="stable")
    sk = keys if order is None else keys[order]
    at = np.minimum(np.searchsorted(sk, query), sk.size - 1)
    found = sk[at] == query
    out[found] = at[found] if order is None else order[at[found]]
    return out


def _merge_column(old: Any, take: np.ndarray | None, updates: dict[int, Any], added: Any) -> Any:
    """One index column after a delta: the kept rows of ``old`` (all when ``take`` is None), rows of ``updates``
    (new position → value) replaced, then ``added`` appended. Arrays stay arrays (of the old dtype); others
    become a :class:`SharedPrefix`: of the old items when no row moved (the rewritten rows held apart), else of a
    new list of the kept items."""
    if isinstance(old, np.ndarray):
        if take is None and (not updates or _same_at(old, np.fromiter(updates, np.int64, len(updates)),
                                                     list(updates.values()))):
            return appended_rows(old, np.asarray(added, dtype=old.dtype))
        kept = old if take is None else old[take]
        out = np.concatenate([kept, np.asarray(added, dtype=old.dtype)]) if len(added) else kept.copy()
        if updates:
            out[np.fromiter(updates, np.int64, len(updates))] = np.asarray(list(updates.values()), dtype=old.dtype)
        return out
    if take is None and all(old[i] == v for i, v in updates.items()):
        return _seq_appended(old, added)
    if take is None:  # rows rewritten in place: held apart, the column's list shared
        shared = old if isinstance(old, SharedPrefix) else SharedPrefix.of(old)
        return shared.replaced(updates).appended(added)
    kept_list = _kept_items(old, take)
    for i, v in updates.items():
        kept_list[i] = v
    kept_list.extend(added)
    # Shared, so the next delta's appends extend this list instead of copying the column again.
    return SharedPrefix(kept_list, len(kept_list))


def _kept_items(old: Sequence[Any], take: np.ndarray) -> list[Any]:
    """``[old[i] for i in take]`` (``take`` ascending): the sequence copied in C and the few dropped items deleted,
    or past :data:`MAX_COPY_RUNS` of them gathered through an object array, never read one by one (a
    :class:`SharedPrefix` item is a Python call: 14 ms per column at 100k nodes)."""
    gone = len(old) - int(take.size)
    if gone > MAX_COPY_RUNS:
        return np.fromiter(old, dtype=object, count=len(old))[take].tolist()
    items = list(old)
    if gone:
        for i in np.setdiff1d(np.arange(len(old)), take, assume_unique=True)[::-1].tolist():
            del items[i]
    return items


_STAT_FIELDS = ("access_count", "importance", "last_access_time")


def _stats_only(snap: GraphSnapshot, delta: SnapshotDelta, at: np.ndarray) -> bool:
    """Whether ``delta`` only rewrote the statistics of existing nodes (``at``: their positions): same index
    values but importance, same node JSON but access reinforcement's fields, nothing else written."""
    if (
        delta.deleted_nodes.size or delta.edge_rowids.size or delta.deleted_edges.size or delta.vector_rids.size
        or delta.deleted_vectors.size or delta.state is not None or bool((at < 0).any())
    ):
        return False
    base = snap.structure.source
    assert base is not None
    new_cols = delta.node_index.columns()
    for name in _INDEX_FIELDS:
        if name == "importance":
            continue
        old_col, new_col = base.columns[name], new_cols[name]
        for k, p in enumerate(at.tolist()):
            a, b = old_col[p], new_col[k]
            if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
                continue
            if not (a == b or (isinstance(a, np.floating) and np.isnan(a) and np.isnan(b))):
                return False
    for k, p in enumerate(at.tolist()):
        old_node = Node.model_validate_json(snap._node_json[p]).model_dump(exclude=set(_STAT_FIELDS))
        new_node = Node.model_validate_json(decompress_text(delta.node_blobs[k])).model_dump(exclude=set(_STAT_FIELDS))
        if old_node != new_node:
            return False
    return True


def apply_delta(snap: GraphSnapshot, delta: SnapshotDelta, *, now_ms: int) -> GraphSnapshot | None:
    """The snapshot of ``delta.version``: ``snap`` (built or updated at ``delta.since``) with ``delta`` applied —
    equal to a fresh build of that version (every array, every node) — or ``None`` when ``snap`` cannot take a
    delta (built without a store, or a vector dimension changed): rebuild then.

    Only the rows the delta holds are decoded (no store read or JSON parse of unchanged nodes). A delta that only
    access-reinforced nodes (the recall's own write) gives a snapshot with a new statistics overlay and the same
    :class:`SnapshotStructure`, so structure-keyed caches stay valid; any other delta merges the kept, replaced
    and appended rows into the index columns, then derives the arrays from ``snap``'s: only the changed rows are
    computed when the delta deleted nothing (:func:`_appended_snapshot`), and a delta that deleted nodes is the
    old graph without them (:func:`_kept_snapshot`) followed by the same append. Anything else (an archived flag
    or anchor terms rewritten, a kept edge rewritten, the edge horizon passed) re-derives the arrays from the
    columns (:func:`_build_snapshot`, numpy passes over the chat).
    """
    base = snap.structure.source
    if base is None or snap.version != delta.since or delta.chat_id != snap.chat_id:
        return None
    texts = snap._node_json
    if not isinstance(texts, PackedTexts) or texts._overrides:
        return None
    with gc_paused():
        at = _positions(base.rids, delta.node_rids)
        dead = np.isin(delta.node_rids, delta.deleted_nodes)
        at[dead] = -1  # a rowid reused after a delete is a new node
        if delta.node_rids.size and now_ms < snap.valid_until_ms and _stats_only(snap, delta, at):
            return _with_stats(snap, delta, at)
        return _merged(snap, base, delta, at, now_ms)


def _with_stats(snap: GraphSnapshot, delta: SnapshotDelta, at: np.ndarray) -> GraphSnapshot:
    importance = snap.stats.importance.copy()
    reinforced = dict(snap.stats.reinforced)
    new_imp = delta.node_index.columns()["importance"]
    for k, p in enumerate(at.tolist()):
        node = Node.model_validate_json(decompress_text(delta.node_blobs[k]))
        importance[p] = float(new_imp[k])
        reinforced[p] = (node.access_count, node.importance, node.last_access_time)
    with snap._lock:
        parsed = {i: n for i, n in _newest(snap._nodes) if i not in reinforced}
    return dataclasses.replace(
        snap, version=delta.version, stats=NodeStats(importance, reinforced), _nodes=parsed, _lock=threading.Lock()
    )


def _kept_edge_strings(
    e_old: EdgeColumns, e_take: np.ndarray, e_upd: np.ndarray, e_pos: np.ndarray, delta: SnapshotDelta,
    added_ids: list[str], added_rel: tuple[str, ...],
) -> tuple[Sequence[str], Sequence[str]]:
    """The edge ids and relations of a delta that deleted or rewrote edges: the kept edges' (``e_take``), those
    rewritten in place (the delta's ``e_upd`` at ``e_pos``), then the added ones. Whole-column work in C: the ids
    are selected by offsets (:meth:`JoinedStrings.take`, no string copied) and the relations by
    :func:`_kept_items`, where a loop over the chat's edges in Python cost 150 ms at 35,000 edges (a deleted
    message's event).
    The ids' text is rewritten once less than half of it is still in use, so deleted ids do not pile up."""
    upd, at = e_upd.tolist(), e_pos.tolist()
    relation_list = _kept_items(e_old.relation, e_take)
    for k, p in zip(upd, at, strict=True):
        relation_list[p] = delta.edge_relation[k]
    relation_list.extend(added_rel)
    relation = SharedPrefix(relation_list, len(relation_list))
    old_ids = e_old.edge_ids
    kept = old_ids.take(e_take) if isinstance(old_ids, JoinedStrings) else JoinedStrings.of(
        list(map(old_ids.__getitem__, e_take.tolist())))
    # A rewritten edge keeps its row, so its id: the store's upsert keys on it. Checked, not assumed.
    if any(kept[p] != delta.edge_ids[k] for k, p in zip(upd, at, strict=True)):
        ids = list(kept)
        for k, p in zip(upd, at, strict=True):
            ids[p] = delta.edge_ids[k]
        kept = JoinedStrings.of(ids)
    elif 2 * kept.characters() < kept.text_size():
        kept = JoinedStrings.of(list(kept))
    return kept.extended(added_ids), relation


def _same_edges(
    e_old: EdgeColumns, old_src: np.ndarray, old_dst: np.ndarray, rows: np.ndarray, delta: SnapshotDelta,
    k: np.ndarray, d_src: np.ndarray, d_dst: np.ndarray,
) -> np.ndarray:
    """For each edge the delta writes over an old row (old rows ``rows``, the delta's edges ``k``): whether it
    holds what that row held in every field a snapshot reads (endpoints as new positions, strength, type, times
    with NaN equal to NaN, relation, id)."""

    def same_times(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a == b) | (np.isnan(a) & np.isnan(b))

    same = (
        (old_src[rows] == d_src[k]) & (old_dst[rows] == d_dst[k])
        & (e_old.strength[rows] == delta.edge_strength[k]) & (e_old.edge_type[rows] == delta.edge_type[k])
        & same_times(e_old.invalid_at[rows], delta.edge_invalid_at[k])
        & same_times(e_old.expired_at[rows], delta.edge_expired_at[k])
    )
    for j in np.flatnonzero(same).tolist():
        r, d = int(rows[j]), int(k[j])
        same[j] = e_old.relation[r] == delta.edge_relation[d] and e_old.edge_ids[r] == delta.edge_ids[d]
    return same


def _kept_snapshot(
    snap: GraphSnapshot, base: _DeltaBase, take: np.ndarray, remap: np.ndarray, e_dead: np.ndarray,
    source: SnapshotSource, now_ms: int,
) -> tuple[GraphSnapshot, np.ndarray] | None:
    """The snapshot of ``snap``'s graph without the nodes outside ``take`` (ascending; ``remap``: old position →
    new, −1 for those) and the edges at ``e_dead`` (rows of ``base.edges``, every edge of a removed node among
    them), equal to a fresh build of that graph in every field :func:`_appended_snapshot` reads: derived from
    ``snap``'s arrays in numpy passes (no parse, no Python loop over the nodes or edges). The base for the
    rewritten and appended rows of a delta that deleted nodes, never handed out; with it, the kept nodes one of
    whose active edges went (positions among the kept, ascending). The rows of the ends of a dead edge between
    two kept nodes are summed again (:func:`_rows_summed_again`); the per-node strings are read through
    (:class:`_Taken`), not copied. ``None`` (build then) when ``snap`` is outside its validity window or its
    active edges are not the build's rule over its edge rows."""
    if not (snap.built_at_ms <= now_ms < snap.valid_until_ms):
        return None
    n_old, k = snap.n, int(take.size)
    removed = remap < 0
    rl = remap.tolist()

    # Active edges: the build's rule over the old edge rows (the same set as at ``snap``'s build: no edge's time
    # came inside its validity window).
    e = base.edges
    inv, exp = e.invalid_at, e.expired_at
    act_rows = np.flatnonzero(_active_edges(inv, exp, e.src, e.dst, snap.archived, now_ms))
    if act_rows.size != snap.edge_src.size:
        return None
    act_keep = ~e_dead[act_rows]
    kept_edges = np.flatnonzero(act_keep)
    src, dst = remap[snap.edge_src[kept_edges]], remap[snap.edge_dst[kept_edges]]
    strength, inhibit_mask = snap.edge_strength[kept_edges], snap.edge_inhibit[kept_edges]
    # Dead active edges between two kept nodes (a deletion rewrites the moved messages' edges: deleted, then
    # added anew at the end): the rows of their ends are summed again from the kept edges.
    a_gone, b_gone = remap[snap.edge_src[~act_keep]], remap[snap.edge_dst[~act_keep]]
    touched = np.unique(np.concatenate([a_gone[a_gone >= 0], b_gone[b_gone >= 0]]))
    between = (a_gone >= 0) & (b_gone >= 0)
    inhibit_gone = snap.edge_inhibit[~act_keep][between]
    a_gone, b_gone = a_gone[between], b_gone[between]

    def graph(m: sp.csr_matrix, inhibit: bool) -> sp.csr_matrix | None:
        out = kept_entries(m, take, remap, k)
        sel = inhibit_gone == inhibit
        if not sel.any():
            return out
        rows = np.unique(np.concatenate([a_gone[sel], b_gone[sel]]))
        kind = inhibit_mask == inhibit
        return _rows_summed_again(out, rows, src[kind], dst[kind], strength[kind])

    adjacency, inhibit = graph(snap.adjacency, False), graph(snap.inhibit, True)
    if adjacency is None or inhibit is None:
        return None
    e_map = np.full(act_rows.size, -1, dtype=np.int64)
    e_map[kept_edges] = np.arange(kept_edges.size, dtype=np.int64)
    live = ~e_dead
    valid_until = _next_expiry(inv[live], exp[live], now_ms)

    # Anchor terms: only the terms of the rows from the first removed one on change their lists.
    first = int(np.argmax(removed))
    anchor_terms = _Taken(snap.anchor_terms, take)
    archived = snap.archived[take]
    index_t: dict[str, tuple[int, ...]] | None = dict(snap.anchor_index)
    gone_terms = False
    for term in {t for i in range(first, n_old) if not snap.archived[i] for t in snap.anchor_terms[i]}:
        assert index_t is not None
        old_list = index_t[term]
        moved = tuple(r for r in map(rl.__getitem__, old_list) if r >= 0)
        if moved and rl[old_list[0]] < 0:  # its first node went: its place in the terms' order may move
            index_t = None
            break
        if moved:
            index_t[term] = moved
        else:
            del index_t[term]
            gone_terms = True
    if index_t is None:  # the build's pass over the kept nodes with terms
        index_t = _anchor_index(anchor_terms, archived)
        gone_terms = True
    anchor_lengths = tuple(sorted({len(t) for t in index_t}, reverse=True)) if gone_terms else snap.anchor_lengths

    prev_index, next_index = _moved(snap.prev_index[take], remap), _moved(snap.next_index[take], remap)
    # Links of kept rows that named a removed node dangle now: the append resolves them if the delta adds that id.
    dangling: dict[str, dict[str, list[int]]] = {}
    for name, old_links in (("prev_id", snap.prev_index), ("next_id", snap.next_index)):
        out: dict[str, list[int]] = {}
        for node_id, positions in base.dangling_links(snap)[name].items():
            now_at = [r for r in map(rl.__getitem__, positions) if r >= 0]
            if now_at:
                out[node_id] = now_at
        v = old_links[take]
        for i in np.flatnonzero((v >= 0) & removed[np.maximum(v, 0)]).tolist():
            out.setdefault(snap.ids[int(v[i])], []).append(i)
        dangling[name] = out

    ids = _Taken(snap.ids, take)
    if first == k and isinstance(snap.index, SharedIndex | dict):  # the tail went: a view of the first k ids
        index: Mapping[str, int] = SharedIndex(snap.index._d if isinstance(snap.index, SharedIndex) else snap.index, k)
    else:
        index = dict(zip(_kept_items(snap.ids, take), range(k), strict=True))
    kept_rank = snap.id_rank[take]
    id_rank = kept_rank - np.searchsorted(np.sort(snap.id_rank[removed]), kept_rank)
    tp = snap.temporal_pairs
    tp_ok = (remap[tp[:, 0]] >= 0) & (remap[tp[:, 1]] >= 0) if tp.size else np.zeros(0, bool)
    kn = snap.knowledge
    owner_node = _moved(kn.owner_node_index, remap)
    knowledge = dataclasses.replace(
        kn, owner_node_index=owner_node, known=kn.known[:, take], manual_known=kn.manual_known[:, take],
        mistaken=kn.mistaken[:, take], hidden=kn.hidden[:, take], own_pov=kn.own_pov[:, take],
        visibility=kn.visibility[:, take],
    )
    edge_ids = snap.edge_ids
    kept_base = _DeltaBase(base.rids[take], source.node_index.columns() if isinstance(
        source.node_index, NodeIndexTable) else _index_columns(source.node_index), e, base.edge_rowids, dangling)
    assert source.embeddings_normalised is not None
    kept = dataclasses.replace(
        snap, ids=ids, index=index, id_rank=id_rank.astype(np.int64), type_code=snap.type_code[take],
        archived=archived, seq=snap.seq[take], seq_start=snap.seq_start[take],
        seq_end=snap.seq_end[take], stats=NodeStats(snap.stats.importance[take]),
        created_time=snap.created_time[take], is_pov=snap.is_pov[take], owner_type_code=snap.owner_type_code[take],
        scope_owner_key=snap.scope_owner_key[take],
        scope_owner_name=_Taken(snap.scope_owner_name, take),
        region_primary=_Taken(snap.region_primary, take),
        region_tokens=_Taken(snap.region_tokens, take),
        anchor_terms=anchor_terms, anchor_index=index_t,
        anchor_lengths=anchor_lengths,
        visibility={rl[p]: v for p, v in snap.visibility.items() if rl[p] >= 0},
        segment_id=_Taken(snap.segment_id, take), has_story_label=snap.has_story_label[take],
        tense_code=snap.tense_code[take], span_start_segment=_Taken(snap.span_start_segment, take),
        span_end_segment=_Taken(snap.span_end_segment, take), has_span_label=snap.has_span_label[take],
        prev_index=prev_index, next_index=next_index, embeddings=source.embeddings[:k],
        has_vector=source.embeddings_normalised[:k],
        adjacency=adjacency, inhibit=inhibit,
        temporal_pairs=remap[tp[tp_ok]].reshape(-1, 2).astype(np.int64),
        edge_src=src, edge_dst=dst, edge_strength=strength, edge_inhibit=inhibit_mask,
        edge_relation=SharedPrefix(_kept_items(snap.edge_relation, kept_edges), int(kept_edges.size)),
        edge_ids=edge_ids.take(kept_edges) if isinstance(edge_ids, JoinedStrings) else SharedPrefix(
            _kept_items(edge_ids, kept_edges), int(kept_edges.size)),
        incident=_incident_kept(snap.incident, take, e_map, int(kept_edges.size)),
        valid_until_ms=valid_until, knowledge=knowledge,
        structure=SnapshotStructure(snap.version, kept_base), _nodes={}, _lock=threading.Lock(),
    )
    return kept, touched


def _rows_summed_again(
    m: sp.csr_matrix, rows: np.ndarray, src: np.ndarray, dst: np.ndarray, strength: np.ndarray
) -> sp.csr_matrix | None:
    """``m`` (a build's symmetric summed-strength matrix of the edges ``src``–``dst``, except at ``rows``) with the
    rows ``rows`` (ascending, unique) summed again from those edges as :func:`_build_snapshot` sums them: the same
    entries of each such row in the same order through scipy's conversion, so the sums are bit for bit a
    build's. One pass over the edges, then :func:`~memory_recall.store.csr.spliced_rows`. ``None`` when the new
    rows' index dtype is not ``m``'s (build then)."""
    n = m.shape[0]
    dirty = np.zeros(n, dtype=bool)
    dirty[rows] = True
    touch = dirty[src] | dirty[dst]
    a, b, v = src[touch], dst[touch], strength[touch]
    r, c, vv = np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([v, v])
    on = dirty[r]
    part = sp.csr_matrix((vv[on], (r[on], c[on])), shape=m.shape)
    part.sum_duplicates()
    sub = rows_of(part, rows)
    if int(sub.indptr[-1]) and (sub.indices.dtype != m.indices.dtype or sub.indptr.dtype != m.indptr.dtype):
        return None
    spliced = spliced_rows(m, rows, sub, n)
    if spliced is None or spliced[2].dtype != m.indptr.dtype:
        return None
    out = assembled(sp.csr_matrix, m.shape, *spliced)
    out.has_sorted_indices = True
    out.has_canonical_format = True
    return out


def _incident_kept(m: sp.csr_matrix, rows: np.ndarray, e_map: np.ndarray, n_edges: int) -> sp.csr_matrix:
    """The node → incident edge matrix (values: edge position + 1) on the rows ``rows`` with the edges renumbered
    by ``e_map`` (old position → new, −1 dropped): :func:`~memory_recall.store.csr.kept_entries` with the values
    rewritten to match."""
    out = kept_entries(m, rows, e_map, n_edges)
    out.data = (out.indices + 1).astype(np.float64)
    return out


def _merged(
    snap: GraphSnapshot, base: _DeltaBase, delta: SnapshotDelta, at: np.ndarray, now_ms: int
) -> GraphSnapshot | None:
    n_old = snap.n
    removed = np.isin(base.rids, delta.deleted_nodes) if delta.deleted_nodes.size else np.zeros(n_old, bool)
    take: np.ndarray | None = np.flatnonzero(~removed) if removed.any() else None
    kept_n = n_old if take is None else int(take.size)
    remap = np.arange(n_old, dtype=np.int64) if take is None else np.full(n_old, -1, np.int64)
    if take is not None:
        remap[take] = np.arange(kept_n, dtype=np.int64)
    in_place = at >= 0
    in_place[in_place] = remap[at[in_place]] >= 0
    upd_new = remap[at[in_place]]  # new positions of the rows replaced in place
    upd_k = np.flatnonzero(in_place)
    add_k = np.flatnonzero(~in_place)
    n = kept_n + int(add_k.size)

    # Index columns: importance starts from the overlay (the structure's column predates reinforcement).
    new_cols = delta.node_index.columns()
    old_cols = dict(base.columns)
    old_cols["importance"] = snap.stats.importance
    upd_list, add_list = upd_k.tolist(), add_k.tolist()
    pos_list = upd_new.tolist()
    cols: dict[str, Any] = {}
    for name in _INDEX_FIELDS:
        col = new_cols[name]
        cols[name] = _merge_column(
            old_cols[name], take, dict(zip(pos_list, map(col.__getitem__, upd_list), strict=True)),
            [col[k] for k in add_list],
        )
    ids_list: Sequence[str]
    if take is None:
        ids_list = _seq_appended(snap.ids, [delta.node_ids[k] for k in add_list])
    else:
        kept_ids = _kept_items(snap.ids, take)
        kept_ids.extend(delta.node_ids[k] for k in add_list)
        ids_list = SharedPrefix(kept_ids, len(kept_ids))
    rids = appended_rows(base.rids, delta.node_rids[add_k]) if take is None else np.concatenate(
        [base.rids[take], delta.node_rids[add_k]])

    # Node JSON: kept rows share their blobs.
    texts = snap._node_json
    assert isinstance(texts, PackedTexts)
    node_take = np.concatenate([
        np.arange(n_old, dtype=np.int64) if take is None else take, np.full(add_k.size, -1, np.int64)
    ])
    extra: dict[int, bytes] = {}
    refielded: list[int] = []
    for k, p in zip(upd_list, pos_list, strict=True):
        node_take[p] = -1
        blob = delta.node_blobs[k]
        extra[p] = blob
        old_blob = texts._blobs[int(at[k])]
        if old_blob != blob and not same_fields(decompress_text(old_blob), decompress_text(blob)):
            refielded.append(p)
    for j, k in enumerate(add_list):
        extra[kept_n + j] = delta.node_blobs[k]
    node_json = PackedTexts(_spliced(texts._blobs, node_take, extra))

    # Edges: kept (not deleted, both ends kept), replaced in place, appended; endpoints as new positions.
    e_old = base.edges
    e_dead = np.isin(base.edge_rowids, delta.deleted_edges) if delta.deleted_edges.size else np.zeros(
        e_old.src.size, bool)
    if take is not None:
        gone = ((e_old.src >= 0) & (remap[np.maximum(e_old.src, 0)] < 0)) | (
            (e_old.dst >= 0) & (remap[np.maximum(e_old.dst, 0)] < 0))
        e_dead |= gone
    e_at = _positions(base.edge_rowids, delta.edge_rowids)
    e_ok = e_at >= 0
    e_ok[e_ok] = ~e_dead[e_at[e_ok]]
    e_take = np.flatnonzero(~e_dead)
    e_remap = np.full(e_old.src.size, -1, np.int64)
    e_remap[e_take] = np.arange(e_take.size, dtype=np.int64)
    position = _positions(rids, np.concatenate([delta.edge_src_rid, delta.edge_dst_rid]))
    d_src, d_dst = np.split(position, 2) if position.size else (position, position)
    e_upd = np.flatnonzero(e_ok)
    e_add = np.flatnonzero(~e_ok)
    if take is None:  # no node moved: the endpoints stand
        old_src, old_dst = e_old.src, e_old.dst
    else:
        old_src, old_dst = _moved(e_old.src, remap), _moved(e_old.dst, remap)
    if e_upd.size:  # edges written again as they were (a deletion rewrites the moved messages' edges) stay kept
        e_upd = e_upd[~_same_edges(e_old, old_src, old_dst, e_at[e_upd], delta, e_upd, d_src, d_dst)]
    e_pos = e_remap[e_at[e_upd]]

    edges_appended = e_take.size == e_old.src.size and not e_upd.size

    def edge_col(old: np.ndarray, new: np.ndarray) -> np.ndarray:
        if edges_appended:
            return appended_rows(old, new[e_add])
        out = np.concatenate([old[e_take], new[e_add]])
        out[e_pos] = new[e_upd]
        return out

    added_ids = [delta.edge_ids[k] for k in e_add.tolist()]
    added_rel = tuple(delta.edge_relation[k] for k in e_add.tolist())
    edge_ids: Sequence[str]
    relation: Sequence[str]
    if e_take.size == e_old.src.size and not e_upd.size and isinstance(e_old.edge_ids, JoinedStrings):
        # Only appended edges (a new message): the kept ids and relations are shared, not copied one by one.
        edge_ids = e_old.edge_ids.extended(added_ids)
        relation = _seq_appended(e_old.relation, added_rel)
    else:
        edge_ids, relation = _kept_edge_strings(e_old, e_take, e_upd, e_pos, delta, added_ids, added_rel)
    edges = EdgeColumns(
        edge_ids=edge_ids,
        src=edge_col(old_src, d_src),
        dst=edge_col(old_dst, d_dst),
        relation=relation,
        strength=edge_col(e_old.strength, delta.edge_strength),
        edge_type=edge_col(e_old.edge_type, delta.edge_type),
        invalid_at=edge_col(e_old.invalid_at, delta.edge_invalid_at),
        expired_at=edge_col(e_old.expired_at, delta.edge_expired_at),
    )
    edge_rowids = edge_col(base.edge_rowids, delta.edge_rowids)

    # Vectors: kept rows keep their normalised values; deleted ones become zero; the delta's are normalised here.
    # The matrix has the stored dimension (as a fresh read: none when the model has no vector row left).
    dim = delta.vector_dim
    if dim and snap.dim and dim != snap.dim:
        return None
    # Vector rows the delta writes (new positions) and kept rows whose vector it deletes.
    pos = np.arange(n)
    v_at = _positions(rids, delta.vector_rids) if delta.vector_rids.size and dim else np.zeros(0, np.int64)
    gone_v = pos[np.isin(rids, delta.deleted_vectors)] if delta.deleted_vectors.size else np.zeros(0, np.int64)
    written = v_at[v_at >= 0]
    kept_gone = bool((gone_v < kept_n).any())
    old_rows_written = bool((written < kept_n).any()) or kept_gone
    if snap.dim and dim and take is None:
        # In place when the old snapshot is its buffer's head: appended rows go into the spare rows, and so do the
        # first vectors of rows that never held one (the background embedding of the last turn's nodes). A row
        # that held a vector (rewritten or deleted) or no buffer to grow: the matrix is copied once into a buffer
        # with spare rows, for the next turns (older snapshots keep their bytes).
        buffer = base.vectors
        emb = None
        if buffer is not None and not kept_gone:
            emb = buffer.extended(snap.embeddings, n - kept_n, written)
        if emb is None:
            buffer = _RowBuffer.of(snap.embeddings, snap.has_vector, n - kept_n)
            emb = buffer.head
            # The old buffer now lives only as long as the old snapshots' own views: the parent structure, which
            # the child keeps until its next delta, must not hold a copy of the chat's matrix (154 MB at 100k)
            # meanwhile. A later delta from an old snapshot copies (it would not be the head of a new buffer).
            object.__setattr__(base, "vectors", None)
        new_rows = np.zeros(n - kept_n, bool)
        # The mask's kept rows are written below when old rows are: a copy then, else a shared append.
        has_vec = np.concatenate([snap.has_vector, new_rows]) if old_rows_written else appended_rows(
            snap.has_vector, new_rows)
    elif snap.dim and dim:  # nodes deleted: the kept rows copied once, zero rows for the new nodes, spare rows
        # (rows a newer snapshot of ``snap``'s buffer may have filled are zeroed by the copy, per ``has_vector``)
        buffer = _RowBuffer.of(snap.embeddings, snap.has_vector, n - kept_n, take)
        emb = buffer.head
        has_vec = np.concatenate([snap.has_vector[take], np.zeros(n - kept_n, bool)])
    else:
        buffer = None
        emb = np.zeros((n, dim), np.float32)
        has_vec = np.zeros(n, bool)
    if gone_v.size:
        emb[gone_v] = 0.0
        has_vec[gone_v] = False
    if v_at.size:
        ok = v_at >= 0
        block = np.ascontiguousarray(delta.vectors[ok], dtype=np.float32)
        good = _normalise_rows(block)
        emb[v_at[ok]] = block
        has_vec[v_at[ok]] = good
        if buffer is not None:
            buffer.claim(v_at[ok])

    if delta.state is not None:
        knowledge, regions, timeline, summaries, history, journal = delta.state
    else:
        knowledge, regions, timeline, summaries, history = (
            snap.knowledge_state, snap.regions, snap.timeline, snap.summaries, snap.history)
        journal = list(snap.journal)
    source = SnapshotSource(
        chat_id=snap.chat_id, version=delta.version, node_ids=ids_list,
        node_index=NodeIndexTable(cols), node_json=node_json, edges=[], model_id=snap.model_id,
        embedding_ids=[], embeddings=emb, knowledge=knowledge, regions=regions, timeline=timeline,
        summaries=summaries, history=history, journal=journal, edge_columns=edges,
        node_rids=rids, edge_rowids=edge_rowids, embeddings_normalised=has_vec,
    )
    new = None
    kept: tuple[GraphSnapshot, np.ndarray] | None = None
    changed_columns: frozenset[str] | None = None
    relinked: np.ndarray | None = None
    via_columns: frozenset[str] | None = None
    via_relinked: np.ndarray | None = None
    if take is None and not e_upd.size and e_take.size == e_old.src.size:
        appended = _appended_snapshot(snap, source, pos_list, n_old, int(e_old.src.size), now_ms)
        if appended is not None:
            new, changed_columns, relinked = appended
    elif take is not None and not e_upd.size:
        # Nodes deleted: the old graph without them (and their edges) derived from ``snap``, then the rewritten
        # and appended rows as an append to it.
        kept = _kept_snapshot(snap, base, take, remap, e_dead, source, now_ms)
        appended = None if kept is None else _appended_snapshot(
            kept[0], source, pos_list, kept_n, int(e_take.size), now_ms)
        if appended is not None:
            new, via_columns, via_relinked = appended
    appended_only = new is not None and take is None
    if new is None:
        new = _build_snapshot(source, now_ms=now_ms)
    assert new.structure.source is not None
    if buffer is not None:
        new = dataclasses.replace(
            new, structure=SnapshotStructure(delta.version, dataclasses.replace(new.structure.source, vectors=buffer)))
        assert new.structure.source is not None
    rewritten_at = np.array(sorted(pos_list), dtype=np.int64)
    refielded_at = np.array(sorted(refielded), dtype=np.int64)
    state_changed = delta.state is not None
    edges_changed = bool(delta.edge_rowids.size or delta.deleted_edges.size or now_ms >= snap.valid_until_ms)
    via = None
    if via_relinked is not None:  # nodes deleted, the rest an append to the kept graph
        via = StructureChange(
            n_old=kept_n, n_new=n, remap=np.arange(kept_n, dtype=np.int64), rewritten=rewritten_at, appended=kept_n,
            state_changed=state_changed, edges_changed=edges_changed, appended_only=True,
            changed_columns=via_columns, relinked=via_relinked, refielded=refielded_at,
        )
    change = StructureChange(
        n_old=n_old, n_new=n, remap=remap, rewritten=rewritten_at, appended=kept_n, state_changed=state_changed,
        edges_changed=edges_changed, appended_only=appended_only, changed_columns=changed_columns,
        relinked=relinked, refielded=refielded_at, kept=take if via is not None else None, via=via,
        edges_kept=int(kept[0].edge_src.size) if via is not None and kept is not None else None,
        touched=kept[1] if via is not None and kept is not None else None,
    )
    snap.structure.release_parent()  # its caches were updated from the parent's already, or never will be
    new = dataclasses.replace(
        new, structure=SnapshotStructure(delta.version, new.structure.source, parent=snap.structure, change=change)
    )
    # Reinforcement stats of kept nodes the delta did not rewrite stay in the overlay (their JSON predates them).
    rewritten = set(pos_list)
    reinforced = {
        int(remap[i]): v for i, v in snap.stats.reinforced.items() if remap[i] >= 0 and int(remap[i]) not in rewritten
    }
    if reinforced:
        new = dataclasses.replace(new, stats=NodeStats(new.stats.importance, reinforced))
    # Parsed nodes of the kept rows the delta did not rewrite are the same nodes (with the same overlay): the
    # first recall after a write then parses only the new and changed candidates.
    with snap._lock:
        parsed = dict(_newest(snap._nodes))
    if take is None:  # positions unchanged: one dict copy, less the rewritten rows
        for p in rewritten:
            parsed.pop(p, None)
        new._nodes.update(parsed)
    elif parsed:
        moved = remap[np.fromiter(parsed, np.int64, len(parsed))]
        keep = moved >= 0
        if rewritten:
            keep &= ~np.isin(moved, change.rewritten)
        new._nodes.update(zip(moved[keep].tolist(), itertools.compress(parsed.values(), keep.tolist()), strict=True))
    return new


def _column_seq(col: Sequence[Any]) -> Sequence[Any]:
    """A string column as a snapshot field: shared when it is a :class:`SharedPrefix`, else a tuple."""
    return col if isinstance(col, SharedPrefix) else tuple(col)


def _row_values(c: dict[str, Any], rows: list[int], index: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The per-node arrays of :func:`_build_snapshot` at ``rows`` only (same formulas, on those rows' column
    values): what a delta recomputes for its rewritten and appended nodes."""
    k = len(rows)

    def pick(name: str) -> list[Any]:
        col = c[name]
        return col[rows].tolist() if isinstance(col, np.ndarray) else list(map(col.__getitem__, rows))

    def arr(name: str, dtype: Any) -> np.ndarray:
        col = c[name]
        return (col[rows] if isinstance(col, np.ndarray) else np.asarray(pick(name))).astype(dtype).reshape(k)

    owner_key = pick("owner_key")
    scope = np.empty(k, dtype=object)
    scope[:] = [_owner_base_key(v) if v else "" for v in owner_key]
    return {
        "type_code": np.fromiter(map(TYPE_CODE.get, pick("type"), itertools.repeat(-1)), np.int16, k),
        "archived": arr("archived", bool),
        "seq": arr("seq", np.int64),
        "seq_start": np.array(pick("seq_start"), dtype=np.float64).reshape(k),
        "seq_end": np.array(pick("seq_end"), dtype=np.float64).reshape(k),
        "importance": arr("importance", np.float64),
        "created_time": arr("created_time", np.float64),
        "is_pov": np.fromiter(map(operator.eq, pick("layer"), itertools.repeat("pov")), bool, k),
        "owner_type_code": np.fromiter(map(_OWNER_TYPE_CODE.get, pick("owner_type"), itertools.repeat(0)), np.int8, k),
        "scope_owner_key": scope,
        "tense_code": np.fromiter(map(TENSE_CODE.get, pick("tense"), itertools.repeat(0)), np.int8, k),
        "has_story_label": arr("has_story_label", bool),
        "has_span_label": arr("has_span_label", bool),
        "prev_index": np.fromiter(map(index.get, pick("prev_id"), itertools.repeat(-1)), np.int64, k),
        "next_index": np.fromiter(map(index.get, pick("next_id"), itertools.repeat(-1)), np.int64, k),
    }


def _grown(m: sp.csr_matrix, shape: tuple[int, int]) -> sp.csr_matrix:
    """``m`` with empty rows (and columns) appended up to ``shape``; shares ``m``'s data and indices."""
    indptr = np.concatenate([m.indptr, np.full(shape[0] - m.shape[0], m.indptr[-1], m.indptr.dtype)])
    out = sp.csr_matrix((m.data, m.indices, indptr), shape=shape, copy=False)
    out.has_sorted_indices = True
    out.has_canonical_format = True
    return out


def _added_entries(
    old: sp.csr_matrix, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int]
) -> sp.csr_matrix | None:
    """``old`` (canonical, grown to ``shape``) with the entries ``(rows, cols, vals)`` added at positions it does
    not hold, equal to a build of all entries at once; ``None`` when an entry repeats a position (of ``old`` or
    of the new ones) or a value is zero (a sum would then depend on the order of additions, or drop a zero that
    a build keeps): build it then. O(nnz) in C (one copy of the arrays) plus O(len(rows) log) here."""
    grown = _grown(old, shape)
    if not rows.size:
        if _zero_free(old):
            grown._zero_free = True  # type: ignore[attr-defined]
        return grown
    if not np.all(vals != 0) or not _zero_free(old):
        return None
    keys = rows.astype(np.int64) * shape[1] + cols
    if np.unique(keys).size != keys.size:
        return None
    # Where each entry goes in the old data (rows in order, columns sorted within a row): a sorted insert, the
    # arrays copied once in C (what ``grown + extra`` gives, without a merge over every row).
    order = np.lexsort((cols, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    indptr, indices = grown.indptr, old.indices
    at = np.empty(rows.size, dtype=np.int64)
    for k, (i, j) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
        lo, hi = int(indptr[i]), int(indptr[i + 1])
        p = lo + int(np.searchsorted(indices[lo:hi], j)) if hi > lo else lo
        if p < hi and indices[p] == j:
            return None
        at[k] = p
    dtype = np.promote_types(old.data.dtype, np.asarray(vals).dtype)
    data = inserted(old.data.astype(dtype, copy=False), at, vals.astype(dtype, copy=False))
    new_indices = inserted(indices, at, cols.astype(indices.dtype))
    counts = np.bincount(rows, minlength=shape[0])
    new_indptr = indptr + np.concatenate([[0], np.cumsum(counts)]).astype(indptr.dtype)
    if new_indptr[-1] > np.iinfo(indices.dtype).max:
        return None  # past the index dtype: a build picks a wider one
    out = sp.csr_matrix((data, new_indices, new_indptr), shape=shape, copy=False)
    out.has_sorted_indices = True
    out.has_canonical_format = True
    out._zero_free = True  # type: ignore[attr-defined]  # non-zero values added to a matrix without zeros
    return out


def _zero_free(m: sp.csr_matrix) -> bool:
    """Whether ``m`` stores no explicit zero: scanned once per matrix, then remembered on it (a matrix
    :func:`_added_entries` derived from a zero-free one is zero-free, so a chain of appends never scans)."""
    known = getattr(m, "_zero_free", None)
    if known is None:
        known = bool(np.all(m.data != 0)) if m.data.size else True
        m._zero_free = known  # type: ignore[attr-defined]
    return bool(known)


def _appended_snapshot(
    snap: GraphSnapshot, source: SnapshotSource, rewritten: list[int], n_old: int, e_old: int, now_ms: int
) -> tuple[GraphSnapshot, frozenset[str], np.ndarray] | None:
    """:func:`_build_snapshot` of ``source`` for a delta that deleted nothing, appended nodes (from ``n_old`` on)
    and edges (from ``e_old`` on), rewrote the nodes at ``rewritten`` in place and changed no kept edge, derived
    from ``snap``'s arrays: only the changed rows are computed, the rest is shared or copied in C. ``None`` when
    the delta changes what the old rows derive (an archived flag or anchor terms rewritten, the edge horizon
    passed, a visibility list appearing or vanishing on a rewritten node): build then. Equal to the build, array
    by array (the incremental property tests check it). With the snapshot: the per-node arrays whose value
    changed at a rewritten row, and the old rows whose prev/next index changed
    (:attr:`StructureChange.changed_columns`, :attr:`StructureChange.relinked`)."""
    if not (snap.built_at_ms <= now_ms < snap.valid_until_ms):
        return None
    assert isinstance(source.node_index, NodeIndexTable)
    c = source.node_index.columns()
    n = len(source.node_ids)
    ids = source.node_ids if isinstance(source.node_ids, SharedPrefix) else tuple(source.node_ids)
    new_ids = tuple(ids[n_old:])
    index = SharedIndex.of(snap.index).appended(new_ids)
    rw = sorted(rewritten)
    rows = rw + list(range(n_old, n))
    vals = _row_values(c, rows, index)
    n_rw = len(rw)
    rw_at = np.asarray(rw, dtype=np.int64)
    old_terms = snap.anchor_terms
    for p in rw:
        if c["anchor_terms"][p] != old_terms[p]:
            return None
        if (c["visibility"][p] is None) != (p not in snap.visibility):
            return None
    if n_rw and not np.array_equal(vals["archived"][:n_rw], snap.archived[rw_at]):
        return None

    arrays: dict[str, np.ndarray] = {}
    changed_columns: set[str] = set()
    for name, v in vals.items():
        old = snap.importance if name == "importance" else getattr(snap, name)
        same = _same_at(old, rw_at, v[:n_rw])
        if not same:
            changed_columns.add(name)
        if name not in ("prev_index", "next_index") and same:
            arrays[name] = appended_rows(old, v[n_rw:])  # shared with the parent: written no further below
            continue
        out = np.concatenate([old, v[n_rw:]])
        out[rw_at] = v[:n_rw]
        arrays[name] = out
    # Old rows whose prev/next id names a new node (written before it) now resolve.
    assert snap.structure.source is not None
    dangling = snap.structure.source.dangling_links(snap)
    for name, col_name in (("prev_index", "prev_id"), ("next_index", "next_id")):
        col, links = c[col_name], dangling[col_name]
        for node_id in new_ids:
            for i in links.get(node_id, ()):
                if i < n_old and col[i] == node_id:
                    arrays[name][i] = index[node_id]
        for j, p in enumerate(rows):
            if vals[name][j] < 0 and col[p]:
                links.setdefault(col[p], []).append(p)
    archived = arrays["archived"]

    # id_rank: the new ids' places among the old ids (byte order = code point order), old ranks shifted past them.
    if new_ids:
        # Each new id's count of old ids below it by a binary search over the old ranks (O(log n) ids read), not
        # an (n,) array of every id, which cost O(n) Python reads of the ids per event.
        at_rank = np.empty(n_old, dtype=np.int64)
        at_rank[snap.id_rank] = np.arange(n_old, dtype=np.int64)
        ids_old = snap.ids
        order_new = sorted(range(len(new_ids)), key=new_ids.__getitem__)
        below = np.array(
            [bisect.bisect_left(range(n_old), new_ids[j], key=lambda r: ids_old[int(at_rank[r])]) for j in order_new],
            dtype=np.int64,
        )
        id_rank = snap.id_rank + np.searchsorted(below, snap.id_rank, side="right")
        new_rank = np.empty(len(new_ids), dtype=np.int64)
        new_rank[order_new] = below + np.arange(len(new_ids))
        id_rank = np.concatenate([id_rank, new_rank])
    else:
        id_rank = snap.id_rank

    # Appended nodes come last in graph order, and a term first seen on one goes last, as in a build.
    anchor_t = dict(snap.anchor_index)
    lengths = set(snap.anchor_lengths)
    for i in range(n_old, n):
        if not archived[i]:
            for term in c["anchor_terms"][i]:
                anchor_t[term] = (*anchor_t.get(term, ()), i)
                lengths.add(len(term))
    anchor_lengths = tuple(sorted(lengths, reverse=True))
    visibility = dict(snap.visibility)
    for p in rw:
        if c["visibility"][p] is not None:
            visibility[p] = c["visibility"][p]
    for i in range(n_old, n):
        if c["visibility"][i] is not None:
            visibility[i] = c["visibility"][i]

    # Edges: the appended ones that are active, after the old active ones.
    cols = source.edge_columns
    assert cols is not None
    inv, exp = cols.invalid_at[e_old:], cols.expired_at[e_old:]
    valid_until = min(snap.valid_until_ms, _next_expiry(inv, exp, now_ms))
    a_all, b_all = cols.src[e_old:], cols.dst[e_old:]
    keep = _active_edges(inv, exp, a_all, b_all, archived, now_ms)
    kept_at = np.flatnonzero(keep)
    a_new, b_new = a_all[keep], b_all[keep]
    s_new = cols.strength[e_old:][keep]
    inh_new = cols.edge_type[e_old:][keep] == INHIBIT_EDGE_TYPE
    e_base = snap.edge_src.size
    e_count = e_base + a_new.size
    kept_list = (kept_at + e_old).tolist()
    relation_t = _seq_appended(snap.edge_relation, map(cols.relation.__getitem__, kept_list))
    added_ids = list(map(cols.edge_ids.__getitem__, kept_list))
    edge_ids_t: Sequence[str] = (
        snap.edge_ids.extended(added_ids) if isinstance(snap.edge_ids, JoinedStrings)
        else (*snap.edge_ids, *added_ids)
    )

    def sym(old: sp.csr_matrix, mask: np.ndarray, everything: np.ndarray) -> sp.csr_matrix:
        r = np.concatenate([a_new[mask], b_new[mask]])
        cc = np.concatenate([b_new[mask], a_new[mask]])
        v = np.concatenate([s_new[mask], s_new[mask]])
        out = _added_entries(old, r, cc, v, (n, n))
        if out is not None:
            return out
        src = np.concatenate([snap.edge_src, a_new])[everything]
        dst = np.concatenate([snap.edge_dst, b_new])[everything]
        st = np.concatenate([snap.edge_strength, s_new])[everything]
        if not src.size:
            return sp.csr_matrix((n, n))
        m = sp.csr_matrix((np.concatenate([st, st]), (np.concatenate([src, dst]), np.concatenate([dst, src]))),
                          shape=(n, n))
        m.sum_duplicates()
        return m

    edge_inhibit = appended_rows(snap.edge_inhibit, inh_new)
    adjacency = sym(snap.adjacency, ~inh_new, ~edge_inhibit)
    inhibit = sym(snap.inhibit, inh_new, edge_inhibit)
    epos = np.arange(e_base, e_count, dtype=np.int64)
    incident = _added_entries(
        sp.csr_matrix((snap.incident.data, snap.incident.indices, snap.incident.indptr), shape=(n_old, e_count)),
        np.concatenate([a_new, b_new]), np.concatenate([epos, epos]),
        np.concatenate([epos + 1, epos + 1]).astype(np.float64), (n, e_count),
    )
    if incident is None:
        return None

    # Temporal pairs: those touching a changed row (rewritten, appended, or its prev/next moved) are derived again.
    prev_index, next_index = arrays["prev_index"], arrays["next_index"]
    moved = np.zeros(n, dtype=bool)
    moved[rw_at] = True
    moved[n_old:] = True
    links_moved = (prev_index[:n_old] != snap.prev_index) | (next_index[:n_old] != snap.next_index)
    relinked = np.flatnonzero(links_moved)
    moved[:n_old] |= links_moved
    nn = max(n, 1)
    old_pairs = snap.temporal_pairs
    stay = ~(moved[old_pairs[:, 0]] | moved[old_pairs[:, 1]]) if old_pairs.size else np.zeros(0, bool)
    kept_keys = old_pairs[stay, 0] * nn + old_pairs[stay, 1]
    new_keys: list[np.ndarray] = []
    for neighbour in (prev_index, next_index):
        ok = (neighbour >= 0) & ~archived
        ok &= moved | moved[np.maximum(neighbour, 0)]
        left = np.flatnonzero(ok)
        right = neighbour[ok]
        ok2 = ~archived[right] & (left != right)
        lo, hi = np.minimum(left[ok2], right[ok2]), np.maximum(left[ok2], right[ok2])
        new_keys.append(lo * nn + hi)
    add = np.unique(np.concatenate(new_keys))
    if add.size and kept_keys.size:  # kept_keys is sorted (the pairs are): a binary search, not a sort of it
        at = np.minimum(np.searchsorted(kept_keys, add), kept_keys.size - 1)
        add = add[kept_keys[at] != add]
    keys = inserted(kept_keys, np.searchsorted(kept_keys, add), add)
    temporal_pairs = np.stack([keys // nn, keys % nn], axis=1).astype(np.int64)

    if source.knowledge is snap.knowledge_state:
        knowledge = _knowledge_extended(snap.knowledge, source.knowledge, new_ids, arrays["scope_owner_key"], rows, n)
    else:
        knowledge = _knowledge_arrays(source.knowledge, index, arrays["scope_owner_key"], n)
    assert source.node_rids is not None and source.edge_rowids is not None
    base = _DeltaBase(source.node_rids, c, cols, source.edge_rowids, dangling)
    assert source.embeddings_normalised is not None
    new = GraphSnapshot(
        chat_id=source.chat_id, version=source.version, model_id=source.model_id, ids=ids, index=index,
        id_rank=id_rank, type_code=arrays["type_code"], archived=archived, seq=arrays["seq"],
        seq_start=arrays["seq_start"], seq_end=arrays["seq_end"], stats=NodeStats(arrays["importance"]),
        created_time=arrays["created_time"], is_pov=arrays["is_pov"], owner_type_code=arrays["owner_type_code"],
        scope_owner_key=arrays["scope_owner_key"], scope_owner_name=_column_seq(c["owner_name"]),
        region_primary=_column_seq(c["region_primary"]), region_tokens=_column_seq(c["region_tokens"]),
        anchor_terms=_column_seq(c["anchor_terms"]), anchor_index=anchor_t, anchor_lengths=anchor_lengths,
        visibility=visibility, segment_id=_column_seq(c["segment_id"]), has_story_label=arrays["has_story_label"],
        tense_code=arrays["tense_code"], span_start_segment=_column_seq(c["span_start_segment"]),
        span_end_segment=_column_seq(c["span_end_segment"]), has_span_label=arrays["has_span_label"],
        prev_index=prev_index, next_index=next_index, embeddings=source.embeddings,
        has_vector=source.embeddings_normalised, adjacency=adjacency, inhibit=inhibit, temporal_pairs=temporal_pairs,
        edge_src=appended_rows(snap.edge_src, a_new), edge_dst=appended_rows(snap.edge_dst, b_new),
        edge_strength=appended_rows(snap.edge_strength, s_new), edge_inhibit=edge_inhibit,
        edge_relation=relation_t, edge_ids=edge_ids_t, incident=incident, valid_until_ms=valid_until,
        knowledge=knowledge, knowledge_state=source.knowledge, regions=source.regions, timeline=source.timeline,
        summaries=source.summaries, history=source.history, journal=tuple(source.journal), built_at_ms=now_ms,
        structure=SnapshotStructure(source.version, base), _node_json=source.node_json,
    )
    return new, frozenset(changed_columns), relinked


#: Per knowledge owner entry (by ``id``, while it lives): its id lists as sets. An entry is immutable and a chat's
#: state is carried from snapshot to snapshot until it is written, so a chat event does not build them again.
_ID_SETS: dict[int, tuple[weakref.ref[Any], tuple[frozenset[str], ...]]] = {}
_ID_SETS_LOCK = threading.Lock()


def _id_sets(entry: Any) -> tuple[frozenset[str], ...]:
    """``(known, manual known, mistaken, manual hidden)`` node ids of a knowledge owner entry, as sets."""
    with _ID_SETS_LOCK:
        held = _ID_SETS.get(id(entry))
        if held is not None and held[0]() is entry:
            return held[1]
    sets = (frozenset(entry.known_node_ids), frozenset(entry.manual_known_node_ids),
            frozenset(entry.mistaken_node_ids), frozenset(entry.manual_hidden_node_ids))
    with _ID_SETS_LOCK:
        _ID_SETS[id(entry)] = (weakref.ref(entry), sets)
    weakref.finalize(entry, _forget_id_sets, id(entry))
    return sets


def _forget_id_sets(key: int) -> None:
    with _ID_SETS_LOCK:
        _ID_SETS.pop(key, None)


def _knowledge_extended(
    old: KnowledgeArrays, state: KnowledgeState, new_ids: Sequence[str], scope_owner_key: np.ndarray,
    rows: list[int], n: int,
) -> KnowledgeArrays:
    """:func:`_knowledge_arrays` of an unchanged knowledge state after nodes were rewritten or appended at
    ``rows`` (new positions; the appended ones, ``new_ids``, last): the old columns, widened to ``n``, with those
    columns derived again. O(owners × n) copies plus O(owners × len(rows) × list length) membership tests."""
    entries = list(state.owners.values())
    n_old = old.known.shape[1]

    def widen(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.zeros((a.shape[0], n - n_old), a.dtype)], axis=1)

    known, manual, mistaken, hidden, own_pov, vis = map(
        widen, (old.known, old.manual_known, old.mistaken, old.hidden, old.own_pov, old.visibility))
    owner_node = old.owner_node_index.copy()
    at = np.asarray(rows, dtype=np.int64)
    row_ids: list[str | None] = [None] * (len(rows) - len(new_ids)) + list(new_ids)
    for o, entry in enumerate(entries):
        sets = _id_sets(entry)
        for j, p in enumerate(rows):
            node_id = row_ids[j]
            if node_id is None:
                continue  # a rewritten node keeps its id, so its membership columns stand
            known[o, p] = node_id in sets[0] or node_id in sets[1]
            manual[o, p] = node_id in sets[1]
            mistaken[o, p] = node_id in sets[2]
            hidden[o, p] = node_id in sets[3]
            score = entry.visibility_scores.get(node_id) if entry.visibility_scores else None
            vis[o, p] = 0.0 if score is None else score
            if entry.node_id == node_id:
                owner_node[o] = p
                known[o, p] = True
        own_pov[o, at] = scope_owner_key[at] == _owner_base_key(entry.owner_key)
    return dataclasses.replace(
        old, owner_node_index=owner_node, known=known, manual_known=manual, mistaken=mistaken, hidden=hidden,
        own_pov=own_pov, visibility=vis,
    )


class SnapshotCache:
    """Keeps the latest snapshot per (chat, model); a write updates it from the store's delta
    (:meth:`StoreReader.snapshot_delta`, :func:`apply_delta`) instead of a rebuild.

    One thread at a time updates or builds a given (chat, model): the others wait and take its snapshot. Without
    that, concurrent recalls after a write each applied the same delta and got structures of their own, whose
    derived values (the per-structure caches of the pipeline) were each derived or built again, and the next
    delta could only derive from one of them.

    ``on_update(snapshot)`` is called, under that per-key lock, on every snapshot a delta gives a new structure
    (by :meth:`get` or :meth:`refresh`), before any caller sees it: the pipeline passes the derivation of its
    per-structure values from the parent structure's
    (:func:`~memory_recall.pipeline.retrieve.prepare_snapshot`). So each structure of the chain holds them from
    the start, and the next one derives from it even when a write (a background embedding's vectors, another
    event) comes before any recall asked; a recall that is still on an older snapshot finds them there too.
    """

    def __init__(self, on_update: Callable[[GraphSnapshot], object] | None = None) -> None:
        self._items: dict[tuple[str, str], GraphSnapshot] = {}
        self._lock = threading.Lock()
        self._updating: dict[tuple[str, str], threading.Lock] = {}
        #: Called on every snapshot a delta gives a new structure (class docstring); None: nothing is.
        self.on_update = on_update
        #: How the last ``get`` per chat got its snapshot: "cached", "delta", "stats" or "rebuild" (figures, tests).
        self.last_update: dict[str, str] = {}

    def _key_lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._lock:
            lock = self._updating.get(key)
            if lock is None:
                lock = self._updating[key] = threading.Lock()
            return lock

    @staticmethod
    def _is_current(snap: GraphSnapshot | None, version: int, now_ms: int) -> bool:
        """``snap`` is at the store's ``version`` and its edge horizon has not passed."""
        return snap is not None and snap.version == version and now_ms < snap.valid_until_ms

    def _current(self, key: tuple[str, str], version: int, now_ms: int) -> GraphSnapshot | None:
        with self._lock:
            snap = self._items.get(key)
        if snap is not None and self._is_current(snap, version, now_ms):
            self.last_update[key[0]] = "cached"
            return snap
        return None

    def get(self, store: Any, chat_id: str, model_id: str, *, now_ms: int) -> GraphSnapshot:
        """The cached snapshot if its version and edge horizon are current, else the cached one updated by the
        store's delta since its version, else a freshly built one."""
        key = (chat_id, model_id)
        current = self._current(key, store.chat_version(chat_id), now_ms)
        if current is not None:  # the common case takes no per-key lock
            return current
        with self._key_lock(key):
            # Another thread may have updated it while this one waited: take its snapshot.
            version = store.chat_version(chat_id)
            current = self._current(key, version, now_ms)
            if current is not None:
                return current
            with self._lock:
                snap = self._items.get(key)
            new = self._updated(store, key, snap, now_ms) if snap is not None else None
            if new is None:
                new = load_snapshot(store, chat_id, model_id, now_ms=now_ms)
                self.last_update[chat_id] = "rebuild"
            return self._stored(key, new)

    def refresh(self, store: Any, chat_id: str, *, now_ms: int) -> list[GraphSnapshot]:
        """Bring the chat's cached snapshots (one per model) up to the store's version right after a write, by
        the store's delta only: a snapshot the delta cannot update is dropped (the next :meth:`get` builds it),
        never rebuilt here. Returns the snapshots updated (not those already current). What the next ``get``
        would do, done with the write, so the recall after it finds the snapshot current."""
        with self._lock:
            keys = [k for k in self._items if k[0] == chat_id]
        out: list[GraphSnapshot] = []
        for key in keys:
            with self._key_lock(key):
                version = store.chat_version(chat_id)
                with self._lock:
                    snap = self._items.get(key)
                if snap is None or self._is_current(snap, version, now_ms):
                    continue
                new = self._updated(store, key, snap, now_ms)
                if new is None:
                    with self._lock:
                        if self._items.get(key) is snap:
                            del self._items[key]
                    continue
                out.append(self._stored(key, new))
        return out

    def _updated(self, store: Any, key: tuple[str, str], snap: GraphSnapshot, now_ms: int) -> GraphSnapshot | None:
        """``snap`` updated by the store's delta since its version, or None when there is none to read."""
        read_delta = getattr(store, "snapshot_delta", None)
        if read_delta is None or snap.structure.source is None:
            return None
        delta = read_delta(key[0], key[1], snap.version)
        if delta is None:
            return None
        new = apply_delta(snap, delta, now_ms=now_ms)
        if new is not None:
            self.last_update[key[0]] = "stats" if new.structure is snap.structure else "delta"
            if new.structure is not snap.structure and self.on_update is not None:
                self.on_update(new)
        return new

    def _stored(self, key: tuple[str, str], new: GraphSnapshot) -> GraphSnapshot:
        with self._lock:
            current = self._items.get(key)
            # A concurrent get may have stored a newer snapshot meanwhile: keep the newest.
            if current is None or current.version <= new.version:
                self._items[key] = new
        return new

    def apply_reinforcement(
        self,
        chat_id: str,
        model_id: str,
        node_ids: Sequence[str],
        importance_step: float,
        new_version: int,
        *,
        base_version: int,
        now_ms: int,
    ) -> bool:
        """Carry the cached snapshot over a write that only access-reinforced ``node_ids`` (and wrote records).

        When the cached snapshot was built at exactly ``base_version`` (the version before the write), it is
        replaced by one with the same structure and a new statistics overlay: the reinforced nodes'
        ``importance = min(10, importance + step)``, ``access_count + 1`` and ``last_access_time = now_ms``, as
        :meth:`StoreWriter.reinforce` writes them, and ``version = new_version``; it equals a rebuild at
        ``new_version``, and every structure-keyed cache stays valid. Otherwise nothing changes (the next ``get``
        reads the delta). Returns whether the cached snapshot was carried over.
        """
        key = (chat_id, model_id)
        with self._lock:
            snap = self._items.get(key)
            if snap is None or snap.version != base_version:
                return False
            idx = sorted({snap.index[i] for i in node_ids if i in snap.index})
            importance = snap.importance.copy()
            reinforced = dict(snap.stats.reinforced)
            for i in idx:
                node = snap.node(i)
                value = min(10.0, node.importance + importance_step)
                reinforced[i] = (node.access_count + 1, value, now_ms)
                importance[i] = value
            stale = set(idx)
            with snap._lock:
                parsed = {i: n for i, n in _newest(snap._nodes) if i not in stale}
            self._items[key] = dataclasses.replace(
                snap, version=new_version, stats=NodeStats(importance, reinforced), _nodes=parsed,
                _lock=threading.Lock(),
            )
            return True

    def invalidate(self, chat_id: str | None = None) -> None:
        """Drop the cached snapshots of ``chat_id`` (every chat's with None): the next :meth:`get` builds them."""
        with self._lock:
            if chat_id is None:
                self._items.clear()
            else:
                for key in [k for k in self._items if k[0] == chat_id]:
                    del self._items[key]

    def forget(self, chat_id: str) -> None:
        """Drop everything kept for ``chat_id``, a deleted chat: its snapshots, its per-key update locks and its
        :attr:`last_update` entry. Without it, a service that creates and deletes chats kept one lock per chat
        and model forever. A lock a thread holds stays (it still updates under it); one a thread took but has not
        acquired yet goes, and at worst a later update then runs beside that one, which only repeats work."""
        self.invalidate(chat_id)
        with self._lock:
            for key in [k for k, lock in self._updating.items() if k[0] == chat_id and not lock.locked()]:
                del self._updating[key]
            self.last_update.pop(chat_id, None)
