"""Per-snapshot caches of derived graph structures (recall-spec departure 11: adjacency built once per graph
version, co-occurrence not recomputed per call; reference §7 items 25 and 27).

A :class:`~memory_recall.store.snapshot.GraphSnapshot` is immutable and lives exactly as long as its store
version is current, so anything derived only from it (diffusion adjacency, co-occurrence index, their masked
variants) is cached in a module-level :class:`weakref.WeakKeyDictionary` keyed by the snapshot object: the
entries die with the snapshot, nothing is ever invalidated by hand. Each snapshot keeps at most
:data:`MAX_ENTRIES_PER_SNAPSHOT` derived values (least recently used evicted), so per-recall variants (one per
visibility mask) cannot grow without bound.

Also shared by the stages of this part of the pipeline (diffusion, residual, cross recall, co-occurrence): the
per-recall node masks (:func:`active_mask`, :func:`hidden_mask`, :func:`cooccurrence_eligible`) and small
order-preserving array helpers. Private to ``memory_recall.pipeline``.

Carry-over across access reinforcement: a recall's reinforcement write gives the chat a new version, and
:meth:`~memory_recall.store.snapshot.SnapshotCache.apply_reinforcement` replaces the cached snapshot by a new
object that differs only in ``importance``, ``version`` and the reinforced nodes' JSON (``access_count``,
``importance``, ``last_access_time``). The entries that depend on none of these are handed to the new snapshot
(:func:`carry_over` with :data:`REINFORCEMENT_SAFE_KEYS`, registered as the snapshot cache's carry hook when this
module is imported) instead of being rebuilt. The list is an explicit allow-list: an entry not on it is rebuilt.
An entry that mixes both kinds of parts is carried only through a function its module registers
(:func:`register_reinforcement_derive`), which returns a new value sharing only the independent parts; the
pipeline's other per-snapshot tables (weak dicts of their own modules) are carried by hooks of those modules
(:func:`carry_weak_entry`).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from memory_recall.store.snapshot import TYPE_CODE, SnapshotCache

if TYPE_CHECKING:
    from memory_recall.pipeline.state import RecallState
    from memory_recall.store.snapshot import GraphSnapshot

__all__ = [
    "COOCCURRENCE_EXCLUDED_TYPES",
    "MAX_ENTRIES_PER_SNAPSHOT",
    "REINFORCEMENT_DERIVED",
    "REINFORCEMENT_SAFE_KEYS",
    "active_mask",
    "cached",
    "carry_over",
    "carry_weak_entry",
    "cooccurrence_eligible",
    "has_anchor_term_mask",
    "hidden_mask",
    "lookup",
    "mask_digest",
    "register_reinforcement_derive",
    "unique_in_order",
]

T = TypeVar("T")
V = TypeVar("V")

#: Derived values kept per snapshot (base adjacency + a few masked variants + co-occurrence index).
MAX_ENTRIES_PER_SNAPSHOT = 16

_CACHE: weakref.WeakKeyDictionary[GraphSnapshot, OrderedDict[Hashable, Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()

#: Types that can never be co-occurrence anchors or partners (reference §3.10 "co-occurrence-eligible").
COOCCURRENCE_EXCLUDED_TYPES = frozenset({"event", "synopsis", "reflection"})


def cached(snapshot: GraphSnapshot, key: Hashable, build: Callable[[], T]) -> tuple[T, bool]:
    """``(value, was_cached)``: the value derived from ``snapshot`` under ``key``, built once by ``build``.

    Thread-safe; two threads racing on a cold key may both build, the first stored value wins.
    """
    with _LOCK:
        entries = _CACHE.get(snapshot)
        if entries is None:
            entries = OrderedDict()
            _CACHE[snapshot] = entries
        if key in entries:
            entries.move_to_end(key)
            return entries[key], True
    value = build()
    with _LOCK:
        entries = _CACHE.setdefault(snapshot, OrderedDict())
        if key in entries:
            entries.move_to_end(key)
            return entries[key], True
        entries[key] = value
        while len(entries) > MAX_ENTRIES_PER_SNAPSHOT:
            entries.popitem(last=False)
    return value, False


#: Cache keys (or key prefixes: a tuple key whose leading items equal an entry's tuple matches it) whose values
#: depend on nothing access reinforcement changes (``importance``, ``access_count``, ``last_access_time``), so a
#: snapshot carried over a reinforcement-only write keeps them. Each reason names what the build reads. Left out
#: on purpose (they read what reinforcement changes): ``("cooccurrence-index", …)`` and ``("cooccurrence-columns",
#: …)`` (each batch keeps its nodes ranked by recency, then importance), ``("result-core-order",)`` (ordered by
#: importance); carried only in part (:data:`REINFORCEMENT_DERIVED`): ``("owners", "snapshot")`` (its "pov" and
#: "entity" walk lists are ordered by recency then importance), ``("result-kept",)`` (node dumps hold
#: ``access_count``, ``importance`` and ``last_access_time``).
REINFORCEMENT_SAFE_KEYS: tuple[tuple[str, ...] | str, ...] = (
    # scoring: region tokens, scope owner keys/names, primary regions, timeline segment orders, tense and story
    # labels, knowledge gate codes and visibility; lazily, node labels (name/title/summary text) and per-segment
    # temporal codes from those arrays.
    ("scoring-arrays",),
    # scoring: the nodes' lexical field texts (name/title primary, secondary fields), packed on first use.
    ("lexical-fields",),
    # anchors: folded form of ``snapshot.anchor_index`` (anchor terms of the non-archived nodes).
    ("anchors", "folded-index"),
    # visibility: archived flags, finite ranges, ``fields.visibility`` names, type codes and seq of message nodes.
    ("visibility", "index"),
    # context: ``snapshot.region_primary`` only.
    ("context", "has-primary-region"),
    # context: knowledge owner rows (keys, names, aliases, updated_at), owner nodes' seq/seq_end, timeline segments.
    ("context", "owner-index"),
    # cross recall: anchor terms, type codes and archived flags.
    "cross-recall-cooccurrence-eligible",
    # diffusion: edge adjacency/inhibit matrices and temporal prev/next pairs (with hub damping from degrees).
    ("diffusion-adjacency",),
    # diffusion: the adjacency above with the rows/columns of a visibility mask (part of the key) zeroed.
    ("diffusion-adjacency-masked",),
    # dedup: per node, a number for (scope owner key, summary/insight/title/name text), only ever compared for
    # equality; per range-type set, masks from type codes and seq ranges.
    ("dedup-keys",),
)


def _allowed(key: Hashable, allowed: tuple[tuple[str, ...] | str, ...]) -> bool:
    for entry in allowed:
        if isinstance(entry, tuple):
            if isinstance(key, tuple) and key[: len(entry)] == entry:
                return True
        elif key == entry:
            return True
    return False


#: Cache keys whose value mixes parts that depend on access reinforcement with parts that do not: key →
#: ``derive(value)``, a new value for the carried snapshot that shares only the independent parts (``None``: nothing
#: to carry). Registered by the module that builds the entry (:func:`register_reinforcement_derive`): ``("owners",
#: "snapshot")`` (owners.py) and ``("result-kept",)`` (result.py).
REINFORCEMENT_DERIVED: dict[Hashable, Callable[[Any], Any]] = {}


def register_reinforcement_derive(key: Hashable, derive: Callable[[Any], Any]) -> None:
    """Carry the entry ``key`` (exact key) over access reinforcement as ``derive(value)`` (see
    :data:`REINFORCEMENT_DERIVED`). ``derive`` runs under the cache lock: it must not call :func:`cached`."""
    REINFORCEMENT_DERIVED[key] = derive


def carry_over(
    old: GraphSnapshot,
    new: GraphSnapshot,
    keys: tuple[tuple[str, ...] | str, ...] = REINFORCEMENT_SAFE_KEYS,
    derived: Mapping[Hashable, Callable[[Any], Any]] | None = None,
) -> list[Hashable]:
    """Share with ``new`` the entries of ``old`` whose key matches ``keys`` (see :data:`REINFORCEMENT_SAFE_KEYS`)
    and, for a key of ``derived``, ``derived[key](value)`` (unless it is ``None``); returns the keys carried (least
    recently used first).

    The caller guarantees that those entries, built on ``old``, equal what ``new`` would build: values are shared,
    not copied (they are immutable or only filled lazily with values that are equal on both). Entries ``new``
    already holds are kept. ``new`` ends with at most :data:`MAX_ENTRIES_PER_SNAPSHOT` entries.
    """
    derived = derived or {}
    with _LOCK:
        source = _CACHE.get(old)
        if not source:
            return []
        target: dict[Hashable, Any] = _CACHE.get(new) or {}
        carried: list[tuple[Hashable, Any]] = []
        for k, v in source.items():
            if k in target:
                continue
            if _allowed(k, keys):
                carried.append((k, v))
            elif k in derived:
                part = derived[k](v)
                if part is not None:
                    carried.append((k, part))
        if not carried:
            return []
        # The new snapshot's own entries win and count as more recently used than the carried ones.
        merged: OrderedDict[Hashable, Any] = OrderedDict(carried)
        merged.update(target)
        while len(merged) > MAX_ENTRIES_PER_SNAPSHOT:
            merged.popitem(last=False)
        _CACHE[new] = merged
        return [k for k, _ in carried if k in merged]


def carry_weak_entry(
    table: weakref.WeakKeyDictionary[Any, V], lock: threading.Lock, old: GraphSnapshot, new: GraphSnapshot,
    share: Callable[[V], V],
) -> bool:
    """``table[new] = share(table[old])`` under ``lock`` when ``old`` has an entry and ``new`` none: the carry of
    a module's own per-snapshot weak table (``share`` returns a new container holding the same values, so the two
    snapshots' bounds and evictions stay apart). Returns whether it carried."""
    with lock:
        value = table.get(old)
        if value is None or new in table:
            return False
        table[new] = share(value)
        return True


def _carry_reinforced(old: GraphSnapshot, new: GraphSnapshot) -> None:
    carry_over(old, new, derived=REINFORCEMENT_DERIVED)


SnapshotCache.register_reinforcement_carry(_carry_reinforced)


def mask_digest(mask: np.ndarray) -> str:
    """A short stable digest of a boolean mask (cache key of masked variants). O(n / 8) bytes hashed."""
    packed = np.packbits(np.asarray(mask, dtype=bool))
    return f"{mask.shape[0]}:{hashlib.blake2b(packed.tobytes(), digest_size=16).hexdigest()}"


def active_mask(state: RecallState) -> np.ndarray:
    """The recall-eligible nodes: ``state.active`` when the context stage set it, else non-archived nodes with
    a finite ``seqRange[1]`` (reference §3.2 without the visibility filter)."""
    snap = state.snapshot
    act = state.active
    if isinstance(act, np.ndarray) and act.dtype == bool and act.shape == (snap.n,):
        return act
    return ~snap.archived & snap.finite_range


def hidden_mask(state: RecallState) -> np.ndarray | None:
    """Nodes the visibility filter removed (``state.meta["visibility_hidden_mask"]``), or None when absent or
    empty. Recall-spec departure 2: such nodes never receive energy, never seed, never become candidates."""
    mask = state.meta.get("visibility_hidden_mask")
    if mask is None:
        return None
    arr = np.asarray(mask, dtype=bool)
    if arr.shape != (state.snapshot.n,) or not arr.any():
        return None
    return arr


def cooccurrence_eligible(snapshot: GraphSnapshot, idx: np.ndarray) -> np.ndarray:
    """For each node index in ``idx``: non-archived, type not event/synopsis/reflection, has an anchor term
    (reference §3.10). O(len(idx)); called on vector hits (a few dozen)."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return np.zeros(0, dtype=bool)
    # The type test on ``idx`` only (``snapshot.mask_types`` would test every node of the graph).
    excluded = [TYPE_CODE[t] for t in sorted(COOCCURRENCE_EXCLUDED_TYPES) if t in TYPE_CODE]
    type_ok = ~np.isin(snapshot.type_code[idx], excluded)
    has_term = np.fromiter((bool(snapshot.anchor_terms[i]) for i in idx.tolist()), dtype=bool, count=idx.size)
    return ~snapshot.archived[idx] & type_ok & has_term


def has_anchor_term_mask(snapshot: GraphSnapshot) -> np.ndarray:
    """(n,) bool: non-archived nodes with at least one anchor term, from the snapshot's anchor
    index (no Python loop over nodes: one pass over the term → nodes lists, in C)."""
    mask = np.zeros(snapshot.n, dtype=bool)
    if snapshot.anchor_index:
        members = np.fromiter(itertools.chain.from_iterable(snapshot.anchor_index.values()), dtype=np.int64)
        mask[members] = True
    return mask


def unique_in_order(idx: np.ndarray) -> np.ndarray:
    """``idx`` without repeats, first occurrence kept, order preserved."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return idx
    _, first = np.unique(idx, return_index=True)
    return idx[np.sort(first)]


def lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray, default: float = 0.0) -> np.ndarray:
    """``values[keys == q]`` for each ``q`` of ``query`` (``default`` when absent); ``keys`` unique."""
    keys = np.asarray(keys, dtype=np.int64)
    query = np.asarray(query, dtype=np.int64)
    out = np.full(query.shape[0], default, dtype=np.float64)
    if keys.size == 0 or query.size == 0:
        return out
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    pos = np.clip(np.searchsorted(sk, query), 0, sk.size - 1)
    found = sk[pos] == query
    out[found] = np.asarray(values, dtype=np.float64)[order][pos[found]]
    return out
