"""Row operations on CSR matrices in plain numpy, for the few rows a chat event touches.

scipy's fancy row indexing and ``vstack`` cost tens of microseconds of checks each, more than the copy itself on the
handful of rows one event changes. These give the same stored entries, in the same order, with the input's dtypes;
the result is of the input's class (``csr_matrix`` or ``csr_array``).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import scipy.sparse as sp

__all__ = ["assembled", "kept_entries", "rows_of", "spliced_rows", "stacked"]

M = TypeVar("M", sp.csr_matrix, sp.csr_array)


def assembled(cls: type[M], shape: tuple[int, int], data: np.ndarray, indices: np.ndarray, indptr: np.ndarray) -> M:
    """A ``cls`` matrix holding exactly these arrays (their dtypes kept, nothing checked or copied): the caller
    vouches for them. Set on an empty matrix (no format flags cached yet): the constructor would scan the indices
    to pick a dtype."""
    out = cls(shape, dtype=data.dtype)
    out.data, out.indices, out.indptr = data, indices, indptr
    return out


def rows_of(mat: M, rows: np.ndarray) -> M:
    """``mat[rows]`` (``rows`` int64 positions, any order, repeats allowed): each row's stored entries verbatim, by
    one numpy gather. O(entries of those rows)."""
    indptr = mat.indptr
    starts, ends = indptr[rows], indptr[rows + 1]
    lengths = (ends - starts).astype(np.int64)
    out_ptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_ptr[1:])
    at = np.repeat(starts.astype(np.int64) - out_ptr[:-1], lengths) + np.arange(int(out_ptr[-1]), dtype=np.int64)
    return assembled(type(mat), (rows.size, mat.shape[1]), mat.data[at], mat.indices[at], out_ptr.astype(indptr.dtype))


def stacked(top: M, bottom: M, columns: int) -> M:
    """The rows of ``top`` then those of ``bottom``, ``columns`` wide (at least either's width): ``sp.vstack`` of
    the two, both widened. The index dtype is the wider of the two (int64 past int32's range)."""
    nnz = int(top.indptr[-1])
    total = nnz + int(bottom.indptr[-1])
    dtype = np.result_type(top.indices.dtype, bottom.indices.dtype, top.indptr.dtype, bottom.indptr.dtype)
    if max(total, columns) > np.iinfo(np.int32).max:
        dtype = np.dtype(np.int64)
    data = np.concatenate([top.data[:nnz], bottom.data[: int(bottom.indptr[-1])]])
    indices = np.concatenate([top.indices[:nnz], bottom.indices[: int(bottom.indptr[-1])]]).astype(dtype, copy=False)
    indptr = np.concatenate([top.indptr, bottom.indptr[1:] + nnz]).astype(dtype, copy=False)
    return assembled(type(top), (top.shape[0] + bottom.shape[0], columns), data, indices, indptr)


def kept_entries(m: M, rows: np.ndarray, col_map: np.ndarray, n_cols: int) -> M:
    """``m`` restricted to the rows ``rows`` (ascending) with each column ``j`` moved to ``col_map[j]`` (ascending
    where kept; −1: dropped): the entries' order within a row is kept, so a canonical matrix stays canonical (its
    flags are carried). A few numpy passes over the entries; the leading rows (a deletion of the newest nodes) are
    cut without a pass over the rows."""
    n = m.shape[0]
    indptr = m.indptr
    if rows.size and rows.size == int(rows[-1]) + 1:  # the leading rows (a deletion of the newest nodes)
        end = int(indptr[rows.size])
        new_col = col_map[m.indices[:end]]
        ok = new_col >= 0
        data = m.data[:end]
        starts, stops = indptr[: rows.size], indptr[1 : rows.size + 1]
    else:
        row_kept = np.zeros(n, dtype=bool)
        row_kept[rows] = True
        new_col = col_map[m.indices]
        ok = (new_col >= 0) & np.repeat(row_kept, np.diff(indptr))
        data = m.data
        starts, stops = indptr[rows], indptr[rows + 1]
    running = np.zeros(ok.size + 1, dtype=np.int64)
    np.cumsum(ok, out=running[1:])
    out_ptr = np.zeros(rows.size + 1, dtype=indptr.dtype)
    np.cumsum(running[stops] - running[starts], out=out_ptr[1:])
    out = assembled(type(m), (rows.size, n_cols), data[ok], new_col[ok].astype(m.indices.dtype), out_ptr)
    out.has_sorted_indices = m.has_sorted_indices
    out.has_canonical_format = m.has_canonical_format
    return out


def spliced_rows(
    old: M, rows: np.ndarray, sub: M, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(data, indices, indptr)`` of ``old`` (n_old rows) grown to ``n`` rows, with its rows at ``rows`` (sorted,
    unique; rows from n_old on are new) replaced by the rows of ``sub`` (one per entry of ``rows``, in that order):
    the untouched runs of old rows and the new rows in turn, each run one slice copy, O(len(rows)) Python. The
    index arrays take ``old``'s index dtype; ``None`` when the entries would not fit it."""
    dtype = old.indices.dtype
    n_old = old.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    counts[:n_old] = np.diff(old.indptr)
    counts[rows] = np.diff(sub.indptr)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    if int(indptr[-1]) > np.iinfo(dtype).max:
        return None
    data_parts: list[np.ndarray] = []
    index_parts: list[np.ndarray] = []
    starts = np.flatnonzero(np.diff(rows, prepend=-2) != 1)  # runs of consecutive rows
    ends = np.append(starts[1:], rows.size) if rows.size else starts
    nxt = 0  # the first old row not copied yet
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        first = int(rows[a])
        stop = min(first, n_old)
        if stop > nxt:
            lo, hi = int(old.indptr[nxt]), int(old.indptr[stop])
            data_parts.append(old.data[lo:hi])
            index_parts.append(old.indices[lo:hi])
        lo, hi = int(sub.indptr[a]), int(sub.indptr[b])
        data_parts.append(sub.data[lo:hi])
        index_parts.append(sub.indices[lo:hi])
        nxt = first + (b - a)
    if nxt < n_old:
        lo, hi = int(old.indptr[nxt]), int(old.indptr[n_old])
        data_parts.append(old.data[lo:hi])
        index_parts.append(old.indices[lo:hi])
    data = np.concatenate(data_parts) if data_parts else np.zeros(0, dtype=old.data.dtype)
    indices = np.concatenate(index_parts) if index_parts else np.zeros(0, dtype=dtype)
    return data, indices, indptr.astype(dtype)
