"""The process heap: keeping the C allocator's memory bounded under a service's mixed load (glibc only; a no-op
elsewhere).

A service that writes while it recalls has glibc's heaps creep upward for minutes, with the memory in use flat
(measured with ``mallinfo2`` under the load script's chat-turn mix: 45–53 MiB in use throughout, the heaps
growing from about 57 to 75–89 MiB in a minute, the free space inside them from 12 to 28–38 MiB). Two things feed it:

* **Large long-lived buffers inside the heaps.** Every write that rewrites vector rows copies the chat's vector
  matrix (3.4 MiB at 2,000 messages, several times a second under load). glibc raises its mmap threshold to the
  size of the largest mapped block freed, so after the first copy the next ones land in a heap, live until the
  next write, and leave a hole of their size behind them that smaller blocks then split. :func:`mapped_empty`
  gives such buffers their own mapping, returned to the system when the last view of them goes.
* **One heap per worker thread.** glibc gives each thread that allocates concurrently its own arena (up to eight
  per core), and each arena keeps its own free space at its own high-water mark. The service's worker threads
  take turns under the GIL, so the extra arenas buy little concurrency. :func:`limit_arenas` caps them
  (``memory-recall serve`` does, :attr:`~memory_recall.settings.ServiceSettings.malloc_arenas`).

:func:`release_freed_heap` returns the free pages of all heaps to the system (after a large snapshot read), and a
:class:`HeapTrimmer` does it every few seconds while the service works (``service.heap_trim_s``): with the two
fixes above the heaps still rose by several MiB in a minute under the load, their free space pinned as resident
pages, while the memory in use stayed flat.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "HUGE_PAGE_MIN_BYTES", "MAPPED_MIN_BYTES", "HeapTrimmer", "HeapUsage", "anonymous_rss", "heap_usage",
    "limit_arenas", "mapped_empty", "mapped_zeros", "memory_owner", "release_freed_heap",
]

#: Buffers at least this large get their own mapping from :func:`mapped_empty` (smaller ones stay in the heap:
#: a mapping costs a system call and fresh pages).
MAPPED_MIN_BYTES = 1 << 20
#: Mappings at least this large ask the kernel for huge pages (``MADV_HUGEPAGE``, honoured when transparent huge
#: pages are in ``madvise`` or ``always`` mode): a copy into a fresh mapping is paid in page faults, one per 4 KiB
#: page, and a chat's vector matrix at 100k nodes (154 MB) took 75 ms to fill with small pages and 25 ms with huge
#: ones. Smaller mappings keep small pages, so their spare rows stay resident only as they are written.
HUGE_PAGE_MIN_BYTES = 8 << 20
#: ``mallopt`` parameter number of ``M_ARENA_MAX`` (glibc ``malloc.h``).
_M_ARENA_MAX = -8

_lock = threading.Lock()
_libc: Any = None


def _glibc() -> Any:
    """glibc loaded through ctypes, or ``False`` (not Linux, or another C library: musl has neither
    ``malloc_trim`` nor ``mallopt``'s arena parameters)."""
    global _libc
    with _lock:
        if _libc is None:
            _libc = False
            if sys.platform.startswith("linux"):
                try:
                    import ctypes.util

                    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                    lib.malloc_trim, lib.mallopt  # noqa: B018 - both present, or not glibc
                    if hasattr(lib, "mallinfo2"):  # glibc 2.33+
                        lib.mallinfo2.restype = _Mallinfo2
                    _libc = lib
                except (OSError, AttributeError):
                    _libc = False
        return _libc


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (``malloc.h``, glibc 2.33 and later): every field a ``size_t``."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]


@dataclass(frozen=True)
class HeapUsage:
    """The C allocator's memory at one moment, in bytes, summed over its arenas (glibc ``mallinfo2``).

    ``in_use`` is what the process holds (blocks in the heaps plus blocks in their own mappings); ``heaps`` is the
    heaps' size, of which ``free`` is free space. The RSS can sit anywhere between ``in_use`` and ``heaps`` plus
    ``mapped``: free pages stay resident until reused or trimmed (:class:`HeapTrimmer`), and a free chunk smaller
    than a page, or a page shared with a live block, cannot be given back at all. So ``in_use`` rising with the RSS
    is the process's own memory growing. It is glibc's alone: Python's small objects (up to 512 bytes) live in
    Python's own arenas, which ``mallinfo2`` does not see, so the RSS rising while ``in_use`` stays level is the
    heaps fragmenting or Python's small objects growing.
    """

    in_use: int
    free: int
    heaps: int
    mapped: int


def heap_usage() -> HeapUsage | None:
    """The allocator's figures now (:class:`HeapUsage`), or ``None`` without glibc 2.33+ (``mallinfo2``). It walks
    every arena's free lists under the arena's lock: a fraction of a millisecond on the service's heaps."""
    lib = _glibc()
    info = getattr(lib, "mallinfo2", None) if lib else None
    if info is None:
        return None
    m = info()
    return HeapUsage(in_use=int(m.uordblks + m.hblkhd), free=int(m.fordblks), heaps=int(m.arena),
                     mapped=int(m.hblkhd))


def anonymous_rss() -> int | None:
    """This process's anonymous resident memory in bytes (Linux ``RssAnon``), ``None`` where ``/proc`` does not
    say. Memory the process allocates is anonymous; mapped files (the local embedding model) are not."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def release_freed_heap() -> None:
    """Give the heap memory freed by a large snapshot read back to the OS (glibc ``malloc_trim``; a no-op
    elsewhere). The read frees ~100 MB of row objects at 100k nodes that glibc would otherwise keep mapped, and
    the process's peak would then stack the BM25 index and the recalls on top of it."""
    lib = _glibc()
    if lib:
        lib.malloc_trim(0)


class HeapTrimmer:
    """A daemon thread that returns the free pages of glibc's heaps to the system (``malloc_trim(0)``) every
    ``interval_s`` seconds, when :meth:`note` was called since the last trim (an idle service is trimmed once,
    then left alone). :meth:`start` does nothing without glibc.

    Why: under a service's mixed load the heaps' free space is scattered between live blocks, so glibc can only
    give back the top of a heap, and the freed pages stay resident until a later block reuses them. The RSS
    then follows the heaps' high-water mark, which keeps rising for minutes as the transient peaks of concurrent
    requests land in new places, instead of the memory in use. A trim walks the heaps' free chunks and hands their
    whole pages back (``madvise(MADV_DONTNEED)``). It holds each heap's lock meanwhile: 1–8 ms on the service's
    60–70 MiB of heaps under the load script, every 5 s by default.
    """

    def __init__(self, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s: a positive number of seconds, got {interval_s}")
        self.interval_s = float(interval_s)
        self._active = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Trims done, and the seconds they took in all.
        self.trims = 0
        self.seconds = 0.0

    def note(self) -> None:
        """The process did some work (cheap, from any thread): trim at the next tick."""
        self._active = True

    def start(self) -> bool:
        """Start the thread; ``False`` (and nothing started) without glibc or when it already runs."""
        if not _glibc() or self._thread is not None:
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="heap-trimmer", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the thread and wait for it (a trim under way finishes first)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._active:
                continue
            self._active = False
            start = time.perf_counter()
            release_freed_heap()
            self.seconds += time.perf_counter() - start
            self.trims += 1


def limit_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` (``mallopt(M_ARENA_MAX)``); ``True`` when applied.

    Not applied for ``arenas`` 0 (glibc's default, eight per core), without glibc, or when the environment
    already sets the cap (``MALLOC_ARENA_MAX``, or ``arena_max`` in ``GLIBC_TUNABLES``: the user's choice wins).
    glibc fixes its arena limit when a second arena is first needed, so call this before worker threads
    allocate; a later call changes nothing.
    """
    if arenas < 0:
        raise ValueError(f"arenas: 0 (glibc's default) or a positive count, got {arenas}")
    if arenas == 0 or "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    lib = _glibc()
    return bool(lib) and lib.mallopt(_M_ARENA_MAX, arenas) == 1


def mapped_empty(shape: tuple[int, ...], dtype: Any, min_bytes: int | None = None) -> np.ndarray:
    """``np.empty(shape, dtype)``, in its own anonymous mapping when it takes at least ``min_bytes`` (default
    :data:`MAPPED_MIN_BYTES`; see the module docstring). The pages are zero until written. The mapping is unmapped
    when the array and every view of it are gone. A mapped array is a view of a flat array over the mapping (its
    ``base``, which its own views share as their ``base``), not an array that owns its memory."""
    mapped = _mapped(shape, dtype, min_bytes)
    return np.empty(shape, dtype) if mapped is None else mapped


def mapped_zeros(shape: tuple[int, ...], dtype: Any, min_bytes: int | None = None) -> np.ndarray:
    """``np.zeros(shape, dtype)``, mapped as :func:`mapped_empty` from ``min_bytes`` on (fresh mapped pages are
    zero, and resident only once written: a buffer's spare rows cost no memory until they are used)."""
    mapped = _mapped(shape, dtype, min_bytes)
    return np.zeros(shape, dtype) if mapped is None else mapped


def _mapped(shape: tuple[int, ...], dtype: Any, min_bytes: int | None) -> np.ndarray | None:
    """A zeroed array over a private anonymous mapping of its own, or None below ``min_bytes`` (None:
    :data:`MAPPED_MIN_BYTES`, read at the call)."""
    if min_bytes is None:
        min_bytes = MAPPED_MIN_BYTES
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dt.itemsize
    if nbytes < min_bytes or nbytes == 0:
        return None
    # Private: a shared anonymous mapping (mmap's default) is shmem, outside the process's anonymous RSS.
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= HUGE_PAGE_MIN_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: small pages, as before
            pass
    return np.frombuffer(mapping, dtype=dt, count=count).reshape(shape)


def memory_owner(array: np.ndarray) -> np.ndarray:
    """The array that holds ``array``'s memory: the end of its chain of array bases. That is the array itself when
    it owns its memory, the array it is a view of, or for a :func:`mapped_empty` array the flat array over the
    mapping (which the mapped array's own views share as their base)."""
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    return owner
