"""Per-snapshot caches of derived graph structures (recall-spec departure 11: adjacency built once per graph
version, co-occurrence not recomputed per call; reference §7 items 25 and 27).

A :class:`~memory_recall.store.snapshot.GraphSnapshot` is immutable and lives exactly as long as its store
version is current, so anything derived only from it (diffusion adjacency, co-occurrence index, their masked
variants) is cached in a module-level :class:`weakref.WeakKeyDictionary` keyed by the snapshot's structure (see
below): the entries die with the snapshots of that structure, nothing is ever invalidated by hand. Each structure
keeps at most :data:`MAX_ENTRIES_PER_SNAPSHOT` derived values (least recently used evicted), so per-recall
variants (one per visibility mask) cannot grow without bound.

Also shared by the stages of this part of the pipeline (diffusion, residual, cross recall, co-occurrence): the
per-recall node masks (:func:`active_mask`, :func:`hidden_mask`, :func:`cooccurrence_eligible`) and small
order-preserving array helpers. Private to ``memory_recall.pipeline``.

Structure apart from statistics: a recall's reinforcement write gives the chat a new snapshot that shares the
old one's :class:`~memory_recall.store.snapshot.SnapshotStructure` and only has a new statistics overlay
(``importance``, ``access_count``, ``last_access_time``). :func:`cached` keys on the structure, so what it holds
survives such writes with no carry-over; a value that reads the overlay (anything ordered or filtered by
``importance``, node dumps) goes through :func:`cached_stats`, keyed on the snapshot object itself (structure and
overlay).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from memory_recall.store.snapshot import TYPE_CODE

if TYPE_CHECKING:
    from memory_recall.pipeline.state import RecallState
    from memory_recall.store.snapshot import GraphSnapshot, StructureChange

__all__ = [
    "COOCCURRENCE_EXCLUDED_TYPES",
    "MAX_ENTRIES_PER_SNAPSHOT",
    "active_mask",
    "cached",
    "cached_stats",
    "carry_rows",
    "changed_rows",
    "cooccurrence_eligible",
    "has_anchor_term_mask",
    "hidden_mask",
    "lookup",
    "mask_digest",
    "prepare",
    "unique_in_order",
    "without_rows",
]

T = TypeVar("T")
V = TypeVar("V")

#: Derived values kept per structure or snapshot: one recall of one profile makes about 18 per structure (the
#: adjacency, the stages' indexes and tables), a second profile or batch size a few more; per-mask variants (the
#: co-occurrence columns) are what this bounds.
MAX_ENTRIES_PER_SNAPSHOT = 32

#: Entries keyed by the snapshot's structure (:func:`cached`) or by the snapshot itself (:func:`cached_stats`).
_CACHE: weakref.WeakKeyDictionary[Any, OrderedDict[Hashable, Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()

#: Per structure: how each of its values that has an update path is obtained for a snapshot (the accessor that
#: called :func:`cached` with ``recipe``), replayed on a child structure by :func:`prepare`.
_RECIPES: weakref.WeakKeyDictionary[Any, dict[Hashable, Callable[[GraphSnapshot], object]]] = (
    weakref.WeakKeyDictionary()
)

#: Set while :func:`prepare` runs in this thread: :func:`cached` then only derives values, never builds them.
_PREPARING = threading.local()


class _NotDerivable(Exception):
    """Raised inside :func:`prepare` by a :func:`cached` call whose value would have to be built."""

#: Types that can never be co-occurrence anchors or partners (reference §3.10 "co-occurrence-eligible").
COOCCURRENCE_EXCLUDED_TYPES = frozenset({"event", "synopsis", "reflection"})


def cached(
    snapshot: GraphSnapshot, key: Hashable, build: Callable[[], T],
    update: Callable[[Any, StructureChange], T | None] | None = None,
    *, recipe: Callable[[GraphSnapshot], object] | None = None,
) -> tuple[T, bool]:
    """``(value, was_cached)``: the value derived from the structure of ``snapshot`` under ``key``, built once
    by ``build`` and shared by every snapshot of that structure (``build`` must not read the statistics
    overlay: ``importance``, or the reinforced fields of a node; use :func:`cached_stats` for that).

    ``update(parent_value, change)``: when the structure was updated from a parent structure by a delta and the
    parent (still alive) holds a value under ``key``, the new value is derived from it in time proportional to
    what changed instead of built (``None``: build it). It must give what ``build`` would.

    ``recipe(snapshot)``: the accessor that called this (it returns the value for any snapshot). Remembered with
    the structure, so that :func:`prepare` can derive the value for a child structure right after a write,
    before any recall asks for it.

    Thread-safe; two threads racing on a cold key may both build, the first stored value wins.
    """
    value, hit = _structure_value(snapshot, key, build, update)
    if recipe is not None and not hit:  # the first value of the key for this structure
        _register(snapshot.structure, key, recipe)
    return value, hit


def _structure_value(
    snapshot: GraphSnapshot, key: Hashable, build: Callable[[], T],
    update: Callable[[Any, StructureChange], T | None] | None,
) -> tuple[T, bool]:
    """:func:`cached` without the recipe: derived from the parent's value when it can be, else built."""
    structure = snapshot.structure
    preparing = getattr(_PREPARING, "on", False)
    if update is not None and structure.change is not None:
        parent = structure.parent
        if parent is not None:
            with _LOCK:
                entries = _CACHE.get(structure)
                found = entries is not None and key in entries
                parent_entries = None if found else _CACHE.get(parent)
                previous = parent_entries.get(key) if parent_entries else None
            if previous is not None:
                change = structure.change

                def derived() -> T:
                    value = update(previous, change)
                    if value is None and preparing:
                        raise _NotDerivable(key)
                    return build() if value is None else value

                return _cached(structure, key, derived)
    return _cached(structure, key, _not_built(key) if preparing else build)


def cached_stats(
    snapshot: GraphSnapshot, key: Hashable, build: Callable[[], T],
    *, recipe: Callable[[GraphSnapshot], object] | None = None,
) -> tuple[T, bool]:
    """:func:`cached` for values that read the statistics overlay too: kept per snapshot object (structure and
    overlay), so a reinforcement write (a new overlay) builds them again.

    ``recipe(snapshot)``: the accessor that called this, given only when ``build`` is cheap once the structure's
    values it reads are there (it derives, it does not build: an order kept by the structure re-checked against
    the overlay, an empty memo). :func:`prepare` then builds the value for the snapshot it prepares, so the recall
    after a write finds it; the structure's values ``build`` reads are still only derived there, never built."""
    preparing = getattr(_PREPARING, "on", False)
    if recipe is not None:
        with _LOCK:
            entries = _CACHE.get(snapshot)
            known = entries is not None and key in entries
        if not known:
            _register(snapshot.structure, ("stats", key), recipe)
    return _cached(snapshot, key, _not_built(key) if preparing and recipe is None else build)


def _register(structure: Any, key: Hashable, recipe: Callable[[GraphSnapshot], object]) -> None:
    with _LOCK:
        recipes = _RECIPES.get(structure)
        if recipes is None:
            recipes = _RECIPES[structure] = {}
        recipes[key] = recipe


def _not_built(key: Hashable) -> Callable[[], Any]:
    def refuse() -> Any:
        raise _NotDerivable(key)

    return refuse


def prepare(snapshot: GraphSnapshot) -> list[Hashable]:
    """Derive, for a snapshot whose structure a delta updated from a parent, every value the parent structure
    holds through a :func:`cached` call with a ``recipe``, from the parent's value (the update paths): what the
    first recall on the snapshot would otherwise do. Never builds a value: one whose update path declines (or
    that needs another value not derivable) is left for the recall to build. The values of :func:`cached_stats`
    calls with a ``recipe`` (registered under ``("stats", key)``) are built for ``snapshot`` itself, from the
    structure's values. Returns the keys derived, in order.

    Called right after a write (:meth:`~memory_recall.controller.RecallController.refresh`): the live snapshot and
    its derived structures are brought up to date with the write, in time proportional to what changed, and the
    recall after it finds them ready. Equal values to what the recall would derive (the same calls)."""
    structure = snapshot.structure
    parent = structure.parent
    if parent is None or structure.change is None:
        return []
    with _LOCK:
        recipes = list((_RECIPES.get(parent) or {}).items())
    done: list[Hashable] = []
    outer = getattr(_PREPARING, "on", False)
    _PREPARING.on = True
    try:
        for key, recipe in recipes:
            try:
                recipe(snapshot)
            except _NotDerivable:
                continue
            done.append(key)
    finally:
        _PREPARING.on = outer
    return done


def _cached(owner: Any, key: Hashable, build: Callable[[], T]) -> tuple[T, bool]:
    with _LOCK:
        entries = _CACHE.get(owner)
        if entries is None:
            entries = OrderedDict()
            _CACHE[owner] = entries
        if key in entries:
            entries.move_to_end(key)
            return entries[key], True
    value = build()
    with _LOCK:
        entries = _CACHE.setdefault(owner, OrderedDict())
        if key in entries:
            entries.move_to_end(key)
            return entries[key], True
        entries[key] = value
        while len(entries) > MAX_ENTRIES_PER_SNAPSHOT:
            entries.popitem(last=False)
    return value, False


def without_rows(memo: dict[int, V], rows: np.ndarray) -> dict[int, V]:
    """A copy of a per-node memo (node position → value) without the entries at ``rows``: the memo of a child
    structure whose kept nodes stand at the same positions (an appended-only change) and ``rows`` were rewritten.
    The copy is one C call, so a recall on the parent may add to ``memo`` meanwhile."""
    out = memo.copy()
    for i in rows.tolist():
        out.pop(int(i), None)
    return out


def carry_rows(old: np.ndarray, change: StructureChange, fill: Any) -> np.ndarray:
    """A per-node array of the parent structure (``old``: (n_old, ...)) moved to the child's positions by
    ``change``: the value of each node the delta kept and did not rewrite, ``fill`` for the rewritten and new
    nodes. O(n) in numpy (a copy when the delta only appended: ``remap`` is then the identity), never a Python loop
    over the nodes; ``old`` is not changed."""
    out = np.full((change.n_new, *old.shape[1:]), fill, dtype=old.dtype)
    if change.appended_only:
        out[: change.n_old] = old[: change.n_old]
    else:
        src = np.flatnonzero(np.asarray(change.remap) >= 0)
        out[change.remap[src]] = old[src]
    out[change.rewritten] = fill
    return out


def changed_rows(change: StructureChange) -> np.ndarray | None:
    """The nodes (new positions, ascending, unique) whose row an appended-only change may have changed: the
    rewritten, the relinked (:attr:`~memory_recall.store.snapshot.StructureChange.relinked`) and the new ones;
    ``None`` for any other change (then every row may have)."""
    if not change.appended_only or change.relinked is None:
        return None
    new = np.arange(change.appended, change.n_new, dtype=np.int64)
    return np.unique(np.concatenate([change.rewritten.astype(np.int64), change.relinked.astype(np.int64), new]))


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
