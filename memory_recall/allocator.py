"""A fixed ``malloc`` mmap threshold for the long-lived service, so its memory stays flat under writes.

glibc serves an allocation above the *mmap threshold* with its own ``mmap`` (returned to the system on
``free``) and smaller ones from its heaps (arenas). The threshold starts at 128 KiB and is *dynamic*: each
freed mmapped block raises it to that block's size, up to 32 MiB. Recall and the snapshot updates after a write
allocate and free many short-lived numpy arrays of a few hundred KiB to a few MiB (candidate matrices, delta
columns, sparse products), so after the first of them the threshold has risen and they all land in the arenas,
whose free space is fragmented by the long-lived objects between them and is not given back. Measured with the
load script (16 clients, the chat-turn mix, 2,000-message chat): the arenas' free space grew from 1 MiB to
53 MiB in 160 s while the memory in use stayed at 53–61 MiB, and RSS grew by ~0.25 MiB/s; with the threshold
fixed at 256 KiB, RSS over the second half of a 60 s run stayed within 1 MiB, at the same latencies.

:func:`tune_allocator` fixes the threshold (which also disables the dynamic trim threshold, left at its
128 KiB default). It is process-wide and only called by ``memory-recall serve``; a ``MALLOC_MMAP_THRESHOLD_``
set in the environment wins, and on a C library other than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "tune_allocator"]

#: Bytes: arrays from this size up get their own mapping. 256 KiB keeps per-node and per-candidate arrays of
#: small chats in the arenas (fast) and moves whole-graph columns and temporaries out of them.
MMAP_THRESHOLD = 256 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt parameter number, from glibc's malloc.h


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; True when it was set, False when the environment
    already sets one or the C library is not glibc (nothing changed). Idempotent."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only (musl has no dynamic threshold)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
