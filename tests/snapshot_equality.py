"""Exact comparison of snapshot values (and of the caches derived from them), shared by every test directory:
an incrementally updated value must equal a fresh build's bit for bit (not a test module)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.sparse as sp

from memory_recall.store.snapshot import JoinedStrings, PackedTexts, SharedIndex, SharedPrefix

__all__ = ["exactly_equal"]


def exactly_equal(x: Any, y: Any) -> bool:
    """Whether two snapshot field values are exactly equal: arrays by dtype, shape and bytes (object arrays by
    value), sparse matrices by their three arrays, dataclasses field by field, the compact text sequences item
    by item (every item a ``str``), a :class:`SharedPrefix` as the tuple of its items, a :class:`SharedIndex` as
    the dict of its items, dicts in key order."""
    if isinstance(x, PackedTexts | JoinedStrings) or isinstance(y, PackedTexts | JoinedStrings):  # compact forms
        return list(x) == list(y) and all(type(t) is str for t in (*x, *y))
    if isinstance(x, SharedPrefix) or isinstance(y, SharedPrefix):  # a tuple's items, shared along appends
        return isinstance(x, SharedPrefix | tuple) and isinstance(y, SharedPrefix | tuple) and len(x) == len(y) and all(
            exactly_equal(p, q) for p, q in zip(x, y, strict=True))
    if isinstance(x, SharedIndex) or isinstance(y, SharedIndex):  # a dict's items, shared along appends
        return isinstance(x, SharedIndex | dict) and isinstance(y, SharedIndex | dict) and list(x.items()) == list(
            y.items())
    if type(x) is not type(y):
        return False
    if isinstance(x, np.ndarray):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        return bool(x.tolist() == y.tolist()) if x.dtype == object else x.tobytes() == y.tobytes()
    if sp.issparse(x):
        parts = ("indptr", "indices", "data")
        return x.shape == y.shape and all(exactly_equal(getattr(x, k), getattr(y, k)) for k in parts)
    if dataclasses.is_dataclass(x):
        return all(exactly_equal(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, dict):
        return list(x) == list(y) and all(exactly_equal(x[k], y[k]) for k in x)
    if isinstance(x, tuple | list):
        return len(x) == len(y) and all(exactly_equal(p, q) for p, q in zip(x, y, strict=True))
    return bool(x == y)
