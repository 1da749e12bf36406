"""Co-occurrence index and boost (reference §3.11, scenario §6.3 18; recall-spec departures 10, 11).

Public functions
----------------
* :func:`build_cooccurrence_index` ``(node_ids, recency, importance, seq_start, seq_end, batch_ranges,
  max_per_batch=10, eligible=None) -> CooccurrenceIndex`` — a symmetric n×n CSR count matrix over the
  eligible nodes (rows of ineligible nodes stay empty).

  * ``batchJournal`` source: for every batch with a finite ``processedRange`` ``[lo, hi]``, the eligible
    nodes whose ``[seq_start, seq_end]`` overlaps it (inclusive), sorted by recency desc, importance desc,
    then node id (byte order; the reference keeps list order) and cut to ``max_per_batch``; every unordered
    pair gets +1 in both directions. O(#batches · n) vectorised + O(#batches · max_per_batch²).
  * ``seqRange`` fallback when no batch produced ≥ 2 nodes: every pair of eligible nodes whose inclusive
    seq ranges overlap gets the overlap length ``min(end) − max(start) + 1`` (> 0). The reference checks
    all O(n²) pairs; here nodes are sorted by start and each node's partners are the contiguous run of
    later starts ``< its end + 1`` (``searchsorted``), so the cost is O(n log n + #pairs), the output size.

  Eligibility (non-archived, type not event/synopsis/reflection, has an anchor term) is the caller's job
  via ``eligible``; nodes with a non-finite seq range, or ``end − start + 1 ≤ 0``, can never overlap.
  NaN recency/importance sort last.
* :func:`cooccurrence_neighbors` ``(counts, node, order_key=None, limit=None) -> (idx, count)`` — one
  node's neighbour list, count desc then id. O(deg log deg).
* :func:`cooccurrence_boost` ``(anchor_idx, anchor_weight, counts, max_neighbors=10, scale=0.1,
  order_key=None) -> (idx, boost)`` — for each anchor in input order, its first ``max_neighbors``
  neighbours get ``anchor_weight · ln(1 + count) · scale``; boosts of several anchors add up. Returns
  the boosted nodes sorted by index (the caller adds them to ``graphScore``, creating entries for unseen
  nodes). O(Σ deg(anchor) log).

``order_key`` is each node's rank in id byte order (``CooccurrenceIndex.order_key``); ties break on it.
``_reference_build_cooccurrence_index`` / ``_reference_cooccurrence_boost`` are the plain-Python
transliterations (all-pairs fallback) used by the differential tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike

__all__ = [
    "SOURCE_BATCH_JOURNAL",
    "SOURCE_SEQ_RANGE",
    "CooccurrenceIndex",
    "build_cooccurrence_index",
    "cooccurrence_boost",
    "cooccurrence_neighbors",
    "id_order_key",
]

SOURCE_BATCH_JOURNAL = "batchJournal"
SOURCE_SEQ_RANGE = "seqRange"


@dataclass(frozen=True)
class CooccurrenceIndex:
    """Symmetric co-occurrence counts (n × n CSR), the source used and the id-order tie-break key."""

    counts: sp.csr_array
    source: str
    batch_count: int
    order_key: np.ndarray


def id_order_key(node_ids: Sequence[str]) -> np.ndarray:
    """Rank of every id in UTF-8 byte order (recall-spec departure 10). O(n log n)."""
    order = sorted(range(len(node_ids)), key=lambda i: node_ids[i].encode("utf-8"))
    key = np.empty(len(node_ids), dtype=np.int64)
    key[np.asarray(order, dtype=np.int64)] = np.arange(len(node_ids), dtype=np.int64)
    return key


def _pairs_within(members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.triu_indices(members.size, k=1)
    return members[a], members[b]


def build_cooccurrence_index(
    node_ids: Sequence[str],
    recency: ArrayLike,
    importance: ArrayLike,
    seq_start: ArrayLike,
    seq_end: ArrayLike,
    batch_ranges: ArrayLike,
    max_per_batch: int = 10,
    eligible: ArrayLike | None = None,
) -> CooccurrenceIndex:
    """Build the co-occurrence counts (module docstring); ``batch_ranges`` is (b × 2), NaN = no range.

    >>> idx = build_cooccurrence_index(["A", "B"], [2, 1], [5, 5], [1, 2], [2, 3], [[2, 2]])
    >>> idx.source, idx.counts.toarray().tolist()
    ('batchJournal', [[0.0, 1.0], [1.0, 0.0]])
    """
    n = len(node_ids)
    order_key = id_order_key(node_ids)
    start = np.asarray(seq_start, dtype=np.float64).reshape(-1)
    end = np.asarray(seq_end, dtype=np.float64).reshape(-1)
    rec = np.asarray(recency, dtype=np.float64).reshape(-1)
    imp = np.asarray(importance, dtype=np.float64).reshape(-1)
    elig = np.ones(n, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool).reshape(-1)
    if not (start.size == end.size == rec.size == imp.size == elig.size == n):
        raise ValueError(
            "node_ids, recency, importance, seq_start, seq_end and eligible must have the same length."
        )
    rec = np.where(np.isnan(rec), -np.inf, rec)
    imp = np.where(np.isnan(imp), -np.inf, imp)
    with np.errstate(invalid="ignore"):
        valid = elig & np.isfinite(start) & np.isfinite(end) & (end - start + 1 > 0)
    ranges = np.asarray(batch_ranges, dtype=np.float64).reshape(-1, 2)

    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    batch_count = 0
    for lo, hi in ranges:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            continue
        members = np.flatnonzero(valid & (start <= hi) & (end >= lo))
        if members.size < 2:
            continue
        top = members[np.lexsort((order_key[members], -imp[members], -rec[members]))[:max_per_batch]]
        if top.size < 2:
            continue
        batch_count += 1
        a, b = _pairs_within(top)
        rows.append(a)
        cols.append(b)
        vals.append(np.ones(a.size))
    source = SOURCE_BATCH_JOURNAL
    if batch_count == 0:
        source = SOURCE_SEQ_RANGE
        vidx = np.flatnonzero(valid)
        vidx = vidx[np.argsort(start[vidx], kind="stable")]
        s, e = start[vidx], end[vidx]
        # Overlap > 0 with a later start s_r ⇔ s_r < e_l + 1: partners form a contiguous run after l.
        hi_pos = np.searchsorted(s, e + 1, side="left")
        counts = np.maximum(0, hi_pos - np.arange(vidx.size) - 1)
        total = int(counts.sum())
        if total:
            left = np.repeat(np.arange(vidx.size), counts)
            right = left + 1 + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts))
            overlap = np.minimum(e[left], e[right]) - s[right] + 1
            rows.append(vidx[left])
            cols.append(vidx[right])
            vals.append(overlap)
    if rows:
        r = np.concatenate(rows)
        c = np.concatenate(cols)
        v = np.concatenate(vals)
        both = (np.concatenate([r, c]), np.concatenate([c, r]))
        mat = sp.csr_array((np.concatenate([v, v]), both), shape=(n, n))
        mat.sum_duplicates()
        mat.sort_indices()
    else:
        mat = sp.csr_array((n, n), dtype=np.float64)
    return CooccurrenceIndex(mat, source, batch_count, order_key)


def cooccurrence_neighbors(
    counts: sp.csr_array | sp.csr_matrix,
    node: int,
    order_key: np.ndarray | None = None,
    limit: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours of ``node`` with their counts, count desc then ``order_key`` (default index) asc."""
    lo, hi = counts.indptr[node], counts.indptr[node + 1]
    nbr = counts.indices[lo:hi].astype(np.int64)
    cnt = counts.data[lo:hi].astype(np.float64)
    keep = cnt > 0
    nbr, cnt = nbr[keep], cnt[keep]
    key = nbr if order_key is None else np.asarray(order_key)[nbr]
    order = np.lexsort((key, -cnt))
    if limit is not None:
        order = order[: max(0, limit)]
    return nbr[order], cnt[order]


def cooccurrence_boost(
    anchor_idx: ArrayLike,
    anchor_weight: ArrayLike,
    counts: sp.csr_array | sp.csr_matrix,
    max_neighbors: int = 10,
    scale: float = 0.1,
    order_key: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Graph-score boosts from co-occurring anchors (reference §3.11 "Boost").

    >>> counts = sp.csr_array(([3.0, 1.0, 3.0, 1.0], ([0, 0, 1, 2], [1, 2, 0, 0])), shape=(3, 3))
    >>> idx, boost = cooccurrence_boost([0], [2.0], counts)
    >>> idx.tolist(), boost.round(6).tolist()
    ([1, 2], [0.277259, 0.138629])
    """
    anchors = np.asarray(anchor_idx, dtype=np.int64).reshape(-1)
    weights = np.asarray(anchor_weight, dtype=np.float64).reshape(-1)
    if anchors.shape != weights.shape:
        raise ValueError("anchor_idx and anchor_weight must have the same length.")
    targets: list[np.ndarray] = []
    amounts: list[np.ndarray] = []
    for a, w in zip(anchors.tolist(), weights.tolist(), strict=True):  # anchors: a handful per recall
        nbr, cnt = cooccurrence_neighbors(counts, a, order_key, max_neighbors)
        targets.append(nbr)
        amounts.append(w * np.log(1.0 + cnt) * scale)
    if not targets:
        return np.empty(0, dtype=np.int64), np.empty(0)
    t = np.concatenate(targets)
    if t.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0)
    uniq, inverse = np.unique(t, return_inverse=True)
    # bincount adds in input order, i.e. anchor by anchor as the reference does.
    return uniq, np.bincount(inverse, weights=np.concatenate(amounts), minlength=uniq.size)


# --- plain-Python transliterations (differential tests) ------------------------------------------------


def _reference_build_cooccurrence_index(
    nodes: Sequence[Mapping[str, object]],
    journal: Sequence[tuple[float, float] | None],
    max_per_batch: int = 10,
) -> tuple[dict[str, dict[str, float]], str]:
    """Reference §3.11 index over already-eligible ``nodes`` (dicts with id, recency, importance, start,
    end); ties after recency/importance break by id bytes. Fallback is the reference's all-pairs loop."""
    counts: dict[str, dict[str, float]] = {}

    def add(a: str, b: str, v: float) -> None:
        counts.setdefault(a, {})
        counts.setdefault(b, {})
        counts[a][b] = counts[a].get(b, 0.0) + v
        counts[b][a] = counts[b].get(a, 0.0) + v

    def key(nd: Mapping[str, object]) -> tuple[float, float, bytes]:
        rec = float(nd["recency"])  # type: ignore[arg-type]
        imp = float(nd["importance"])  # type: ignore[arg-type]
        return (
            -(rec if not math.isnan(rec) else -math.inf),
            -(imp if not math.isnan(imp) else -math.inf),
            str(nd["id"]).encode("utf-8"),
        )

    def rng(nd: Mapping[str, object]) -> tuple[float, float]:
        return float(nd["start"]), float(nd["end"])  # type: ignore[arg-type]

    batches = 0
    for entry in journal:
        if entry is None or not (math.isfinite(entry[0]) and math.isfinite(entry[1])):
            continue
        lo, hi = entry
        members = [
            nd for nd in nodes
            if math.isfinite(rng(nd)[0]) and math.isfinite(rng(nd)[1])
            and rng(nd)[1] - rng(nd)[0] + 1 > 0 and rng(nd)[0] <= hi and rng(nd)[1] >= lo
        ]
        members.sort(key=key)
        members = members[:max_per_batch]
        if len(members) < 2:
            continue
        batches += 1
        for i in range(len(members)):
            for j in range(i + 1, len(members)):
                add(str(members[i]["id"]), str(members[j]["id"]), 1.0)
    if batches:
        return counts, SOURCE_BATCH_JOURNAL
    for i in range(len(nodes)):
        for j in range(i + 1, len(nodes)):
            (s1, e1), (s2, e2) = rng(nodes[i]), rng(nodes[j])
            if not all(math.isfinite(x) for x in (s1, e1, s2, e2)):
                continue
            overlap = min(e1, e2) - max(s1, s2) + 1
            if overlap > 0:
                add(str(nodes[i]["id"]), str(nodes[j]["id"]), overlap)
    return counts, SOURCE_SEQ_RANGE


def _reference_cooccurrence_boost(
    base: Mapping[str, float],
    anchors: Mapping[str, float],
    counts: Mapping[str, Mapping[str, float]],
    max_neighbors: int = 10,
    scale: float = 0.1,
) -> dict[str, float]:
    """Reference boost: ``graphScore += w·ln(1 + count)·scale`` over each anchor's sorted neighbours."""
    out = dict(base)
    for anchor, weight in anchors.items():
        nbrs = sorted(counts.get(anchor, {}).items(), key=lambda kv: (-kv[1], kv[0].encode("utf-8")))
        for nid, cnt in nbrs[:max_neighbors]:
            out[nid] = out.get(nid, 0.0) + weight * math.log(1 + cnt) * scale
    return out
