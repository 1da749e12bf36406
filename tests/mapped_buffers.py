"""The mapping under an array made by :func:`memory_recall.heap.mapped_empty` (tests of the heap module and of the
snapshot's vector buffers)."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np


def mapping_of(arr: np.ndarray) -> mmap.mmap | None:
    """The anonymous mapping under ``arr`` (through its base arrays and ``np.frombuffer``'s memoryview), else
    None (the array owns its memory, or sits on something else)."""
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None
