"""``memory_recall.store.csr``: the row gather, the stack and the kept entries equal scipy's fancy indexing and
``vstack`` entry for entry (same order, values and class), on random matrices with empty rows, stored zeros and
repeated picks."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from memory_recall.store.csr import kept_entries, rows_of, stacked


def _random(cls: type, rows: int, cols: int, seed: int) -> sp.csr_matrix | sp.csr_array:
    rng = np.random.default_rng(seed)
    m = cls(sp.random(rows, cols, density=float(rng.uniform(0.0, 0.4)), random_state=seed, format="csr"))
    if m.nnz:
        m.data[rng.integers(0, m.nnz, size=max(1, m.nnz // 5))] = 0.0  # stored zeros stay stored
    return m


def _arrays(m: sp.csr_matrix | sp.csr_array) -> tuple[object, ...]:
    return type(m), m.shape, m.indptr.tolist(), m.indices.tolist(), m.data.tobytes(), m.data.dtype


@pytest.mark.parametrize("cls", [sp.csr_matrix, sp.csr_array])
@pytest.mark.parametrize("seed", range(5))
def test_rows_of_is_scipys_row_indexing(cls: type, seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    m = _random(cls, int(rng.integers(1, 40)), int(rng.integers(1, 40)), seed)
    picks = (
        np.arange(m.shape[0], dtype=np.int64),
        rng.permutation(m.shape[0]).astype(np.int64),
        rng.integers(0, m.shape[0], size=int(rng.integers(0, 50))).astype(np.int64),  # repeats, maybe none
    )
    for rows in picks:
        got = rows_of(m, rows)
        assert _arrays(got) == _arrays(m[rows])
        assert got.indices.dtype == m.indices.dtype and got.indptr.dtype == m.indptr.dtype


@pytest.mark.parametrize("cls", [sp.csr_matrix, sp.csr_array])
@pytest.mark.parametrize("seed", range(5))
def test_stacked_is_vstack_of_the_widened_rows(cls: type, seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    top = _random(cls, int(rng.integers(0, 20)), int(rng.integers(1, 30)), seed)
    bottom = _random(cls, int(rng.integers(0, 20)), int(rng.integers(1, 30)), seed + 50)
    width = max(top.shape[1], bottom.shape[1]) + int(rng.integers(0, 4))
    widened = [cls((m.data, m.indices, m.indptr), shape=(m.shape[0], width)) for m in (top, bottom)]
    expected = sp.vstack(widened, format="csr")
    got = stacked(top, bottom, width)
    assert _arrays(got) == _arrays(expected) and type(got) is cls
    assert got.indices.dtype == expected.indices.dtype and got.indptr.dtype == expected.indptr.dtype


def test_stacked_widens_the_index_dtype_past_int32() -> None:
    small = sp.csr_matrix((np.ones(1), np.array([0], dtype=np.int32), np.array([0, 1], dtype=np.int32)), shape=(1, 2))
    wide = stacked(small, small, 2**31)
    assert wide.indices.dtype == wide.indptr.dtype == np.int64
    assert wide.shape == (2, 2**31) and wide.indptr.tolist() == [0, 1, 2]


@pytest.mark.parametrize("cls", [sp.csr_matrix, sp.csr_array])
@pytest.mark.parametrize("seed", range(6))
def test_kept_entries_is_scipys_indexing_of_the_kept_rows_and_columns(cls: type, seed: int) -> None:
    """The rows and columns a deletion keeps (ascending, the leading ones or any, the columns the same or others),
    the columns renumbered: scipy's ``m[rows][:, cols]`` of a canonical matrix, with its flags carried."""
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(1, 40))
    m = _random(cls, n, n, seed)
    m.sum_duplicates()
    leading = np.arange(int(rng.integers(0, n + 1)), dtype=np.int64)  # the leading rows: the newest went
    some = np.flatnonzero(rng.random(n) < 0.7).astype(np.int64)
    for kept, cols in ((leading, leading), (some, some), (leading, some)):  # the last: edges renumbered
        col_map = np.full(n, -1, dtype=np.int64)
        col_map[cols] = np.arange(cols.size, dtype=np.int64)
        got = kept_entries(m, kept, col_map, int(cols.size))
        want = cls(m[kept][:, cols])
        assert _arrays(got) == _arrays(want)
        assert got.indices.dtype == m.indices.dtype and got.indptr.dtype == m.indptr.dtype
        assert got.has_canonical_format and got.has_sorted_indices
