"""Per-chat in-memory BM25 index: SQLite FTS5's ``bm25()`` formula with statistics over one chat's rows.

Usage::

    index = Bm25Index.build(node_ids, primary, secondary, body)    # the chat's nodes_fts columns
    index.query(["dragon", "lair"], limit=50)                       # [(node_id, score)], best first
    later = index.apply_delta({"n9": (p, s, b)}, removed=["n2"])    # a new index; `index` is unchanged

Contract
--------
* **Formula.** FTS5's ``bm25(nodes_fts, 3.0, 2.0, 1.0)`` (``fts5_aux.c``), negated so higher is better: for
  every query term ``q`` and document ``d``

  - ``f_q = Σ_c w_c · tf(q, c)`` with column weights ``w = (3, 2, 1)`` (primary, secondary, body);
  - ``D`` = the document's token count over all three columns (unweighted), ``avgdl`` = total tokens / rows;
  - ``idf_q = ln((N − n_q + 0.5) / (n_q + 0.5))``, replaced by ``1e-6`` when ≤ 0 (a term in more than half
    the rows still counts a little, as in FTS5);
  - ``score = Σ_q idf_q · f_q · (k1 + 1) / (f_q + k1 · (1 − b + b · D / avgdl))``, ``k1 = 1.2``, ``b = 0.75``.

  Only documents containing at least one query term are returned. A repeated query term counts once per
  occurrence, as a repeated phrase in an FTS5 ``OR`` query does.
* **Statistics are per chat.** ``N``, ``n_q`` and ``avgdl`` come from the rows the index is built from (one
  chat's non-archived nodes), so one chat's scores never move when another chat changes. This is the one
  intended difference from the store-wide FTS5 table, whose statistics cover every chat.
* **Terms.** Documents hold pre-tokenised terms joined by single spaces
  (:func:`memory_recall.store.sqlite.fts_columns`). A query term is plain text, never FTS syntax: NUL and lone
  surrogates are removed (as :func:`~memory_recall.text.tokenize.fts_match_expression` does), the rest is
  split where FTS5's ``unicode61`` tokenizer with the store's ``categories`` option splits (whitespace,
  control and format characters) and lower-cased (its case folding). A term that splits into several tokens
  is searched as those tokens, each scored on its own (FTS5 would have searched the quoted phrase); the
  lexical stage's terms are single tokens. Unknown terms are dropped.
* **Stemming** (optional, ``stem`` = ``"none"``/``"s"``/``"porter"``,
  :func:`memory_recall.text.stem.stem_term`): every document token and every query token goes through the same
  stemmer before the vocabulary lookup, so ``paints`` finds ``painting``. Statistics (``n_q``, ``tf``) are over
  the stemmed terms; document lengths do not change. ``"none"`` is exactly the FTS5 formula above.
* **Order.** Score descending, ties by node-id byte order; deterministic.
* **Incremental updates are exact.** :meth:`Bm25Index.apply_delta` (documents added or replaced, ids removed)
  returns the index of the changed corpus without touching the unchanged documents: a main segment (shared,
  immutable) with the removed documents masked, plus a small delta segment. The corpus statistics (``n_q`` per
  term, ``N``, total tokens) are kept as exact integers and every term weight is computed from them at query
  time by the same expressions as for a fresh build, so the answers — scores bit for bit, and order — are those
  of :meth:`Bm25Index.build` over the same documents (property-tested over random edit sequences).
* **Cost.** Build: one pass over the column strings, :data:`BUILD_CHUNK` documents at a time (only one chunk's
  token strings are alive; the rest are int32 codes), one dict lookup per token, one CSR matrix
  (terms × documents) of weighted frequencies. Delta: the changed documents' tokenisation, a bisection per id,
  numpy work proportional to the delta segment; past ~3 % of the chat the delta is folded into a new main
  segment (O(postings), amortised; in the background under :class:`Bm25Cache`). Query: per query term, its live
  postings' term scores (computed on the term's first query at this index version, then cached), gathered and
  summed into a per-document array: O(postings + documents) numpy work, no Python loop over documents and no
  sort of the postings.

:class:`Bm25Cache` holds the latest index per chat keyed by ``(chat_id, version)`` and the stem
method (an index stemmed one way never answers a query of another); the store's version contract (a version is
never reused, not even by a chat deleted and created again) makes that key safe. The store tells it of every
committed write (:meth:`Bm25Cache.advance`: the node ids whose FTS rows the batch wrote or deleted) and the next
query merges those rows (:meth:`Bm25Cache.get` with ``changed``); a write that touched no FTS row (access
reinforcement, records) moves the index to the new version as is, so no caller has to declare it.
"""

from __future__ import annotations

import math
import threading
import unicodedata
import weakref
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise

import numpy as np
import scipy.sparse as sp

from memory_recall.store.csr import rows_of, stacked
from memory_recall.text.stem import STEM_METHODS, stem_term

__all__ = [
    "BM25_B",
    "BM25_K1",
    "BUILD_CHUNK",
    "COMPACT_FRACTION",
    "COMPACT_HARD",
    "COMPACT_MIN",
    "PENDING_FRACTION",
    "PENDING_MIN",
    "Bm25Cache",
    "Bm25Index",
    "DocColumns",
    "cache_for",
    "split_query_term",
]

#: FTS5's constants (fts5_aux.c, fts5Bm25Function).
BM25_K1 = 1.2
BM25_B = 0.75
#: Column weights (primary, secondary, body): the store's ``BM25_WEIGHTS``.
_WEIGHTS = (3.0, 2.0, 1.0)
_IDF_FLOOR = 1e-6
#: Documents tokenised at a time by :meth:`Bm25Index.build` (bounds the live token strings, see there).
BUILD_CHUNK = 4096
#: :meth:`Bm25Index.apply_delta` folds the delta segment into a new main segment once the delta documents plus the
#: removed main documents pass ``max(COMPACT_MIN, main documents // COMPACT_FRACTION)``: queries then never carry
#: more than ~3 % dead or out-of-segment postings, and the O(postings) merge is amortised over that many changes.
COMPACT_MIN = 256
COMPACT_FRACTION = 32
#: With deferred compaction (Bm25Cache), the multiple of that threshold past which apply_delta folds inline anyway.
COMPACT_HARD = 4
# Token characters of the store's unicode61 tokenizer: categories 'L* N* M* P* S* Co Cn'. Everything
# else (Z*, Cc, Cf, Cs) separates tokens.
_TOKEN_MAJOR = frozenset("LNMPS")
_TOKEN_EXACT = frozenset({"Co", "Cn"})


def _is_token_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] in _TOKEN_MAJOR or cat in _TOKEN_EXACT


def split_query_term(term: str) -> list[str]:
    """The index tokens one plain-text query term stands for (see the module contract).

    >>> split_query_term('Dragon "Lair"')
    ['dragon', '"lair"']
    """
    # The common case (a word of the tokenizer) is one token already.
    if term.isalnum():
        return [term.lower()]
    tokens: list[str] = []
    current: list[str] = []
    for ch in term:
        if ch == "\x00" or "\ud800" <= ch <= "\udfff":
            continue  # removed, not a separator: fts_match_expression deletes them before quoting
        if _is_token_char(ch):
            current.append(ch)
        elif current:
            tokens.append("".join(current).lower())
            current = []
    if current:
        tokens.append("".join(current).lower())
    return tokens


def _column_tokens(column: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """All tokens of some documents' column strings in document order, and the token count of each document."""
    tokens = " ".join(column).split()
    # Terms are joined by single spaces and hold no whitespace (fts_columns), so spaces + 1 counts them.
    counts = np.fromiter(map(str.count, column, [" "] * len(column)), dtype=np.int64, count=len(column))
    counts += np.fromiter(map(bool, column), dtype=np.int64, count=len(column))
    if int(counts.sum()) != len(tokens):
        # Text not written by fts_columns (repeated or odd whitespace): count per document instead.
        per_doc = [s.split() for s in column]
        tokens = [t for doc in per_doc for t in doc]
        counts = np.fromiter(map(len, per_doc), dtype=np.int64, count=len(per_doc))
    return tokens, counts


def _encode(tokens: list[str], vocab: dict[str, int]) -> np.ndarray:
    """The vocabulary codes of ``tokens`` (int32), adding unseen terms to ``vocab`` in first-seen order."""
    missing = [term for term in dict.fromkeys(tokens) if term not in vocab]
    vocab.update(zip(missing, range(len(vocab), len(vocab) + len(missing)), strict=True))
    # int32 halves the code arrays; a vocabulary past 2**31 terms cannot be held in memory anyway, and
    # np.fromiter raises OverflowError rather than wrapping if it ever were.
    return np.fromiter(map(vocab.__getitem__, tokens), dtype=np.int32, count=len(tokens))


#: A document given by its three space-joined term columns (primary, secondary, body), as ``nodes_fts`` holds them.
DocColumns = tuple[str, str, str]


def _norm(dl: np.ndarray, avgdl: float) -> np.ndarray:
    """``k1 · (1 − b + b · D / avgdl)`` per document length; the one expression every index path uses, so an
    incrementally maintained index and a fresh build compute bit-identical values."""
    if avgdl > 0:
        return BM25_K1 * (1 - BM25_B + BM25_B * dl / avgdl)
    return np.full(dl.shape, BM25_K1 * (1 - BM25_B))


def _idf(n: int, hits: int) -> float:
    """``ln((N − n_q + 0.5) / (n_q + 0.5))``, floored at ``1e-6``. Scalar libm ``log`` on purpose: numpy's
    vectorised ``log`` may round differently from its scalar path (SIMD loops), which would make a term's weight
    depend on how many terms were computed together."""
    idf = math.log((n - hits + 0.5) / (hits + 0.5))
    return idf if idf > 0 else _IDF_FLOOR


class _Vocabulary:
    """The append-only term → code map of an index and of every index derived from it by
    :meth:`Bm25Index.apply_delta` (a term keeps its code forever, so derived indexes share the main segment's
    posting rows without copying the map). Each index knows how many codes existed when it was made (the length
    of its ``df``); a code past that is a term it has never seen."""

    __slots__ = ("_lock", "codes")

    def __init__(self, codes: dict[str, int]) -> None:
        self.codes = codes
        self._lock = threading.Lock()

    def encode(self, tokens: list[str]) -> tuple[np.ndarray, int]:
        """The codes of ``tokens`` (int32; unseen terms appended) and the vocabulary size after encoding."""
        with self._lock:
            codes = _encode(tokens, self.codes)
            return codes, len(self.codes)

    def size(self) -> int:
        with self._lock:
            return len(self.codes)


def _tokenise_docs(
    columns: Sequence[Sequence[str]], vocab: _Vocabulary, stem: str
) -> tuple[sp.csr_matrix, np.ndarray]:
    """The (documents × vocabulary) CSR matrix of weighted term frequencies of a few documents given as their three
    term columns, and each document's token count (int64). New (stemmed) terms are appended to ``vocab``."""
    m = len(columns[0])
    tokens_parts: list[list[str]] = []
    column_counts: list[np.ndarray] = []
    for column in columns:
        tokens, counts = _column_tokens(column)
        tokens_parts.append(tokens)
        column_counts.append(counts)
    tokens = [t for part in tokens_parts for t in part]
    if stem != "none":
        stemmed = {term: stem_term(term, stem) for term in dict.fromkeys(tokens)}
        tokens = [stemmed[t] for t in tokens]
    codes, size = vocab.encode(tokens)
    doc_range = np.arange(m, dtype=np.int32)
    docs = np.concatenate([np.repeat(doc_range, counts) for counts in column_counts])
    weights = np.repeat(np.asarray(_WEIGHTS), [int(counts.sum()) for counts in column_counts])
    # Duplicate (document, term) entries are summed: f_q = Σ_c w_c · tf(q, c), small integers, exact in float64.
    matrix = sp.csr_matrix((weights, (docs, codes)), shape=(m, size), dtype=np.float64)
    matrix.sum_duplicates()
    return matrix, column_counts[0] + column_counts[1] + column_counts[2]


def _widen(matrix: sp.csr_matrix, columns: int) -> sp.csr_matrix:
    """``matrix`` with ``columns`` columns (≥ its own): the vocabulary only grows, so older rows just get wider."""
    if matrix.shape[1] == columns:
        return matrix
    return sp.csr_matrix((matrix.data, matrix.indices, matrix.indptr), shape=(matrix.shape[0], columns))


@dataclass(frozen=True, eq=False)
class _Segment:
    """The main segment: documents in node-id byte order (position = tie-break rank), the (terms × documents) CSR
    matrix of weighted frequencies (terms known when it was built) and the documents' token counts. Immutable and
    shared by every index derived from it; documents removed later are masked by the index, not deleted here."""

    ids: tuple[str, ...]
    tf: sp.csr_matrix
    dl: np.ndarray
    _by_doc: list[sp.csc_matrix] = field(default_factory=list, init=False, repr=False)

    def prepare(self) -> sp.csc_matrix:
        """The (terms × documents) matrix by document, built once per segment (O(postings): ~50 ms at 100k
        documents). It is needed only when a main document is replaced or removed; :class:`Bm25Cache` builds it
        off the query path after a build or a compaction. Two threads building it at once build the same view."""
        if not self._by_doc:
            self._by_doc.append(self.tf.tocsc())
        return self._by_doc[0]

    def doc_codes(self, slots: np.ndarray) -> np.ndarray:
        """The term codes of the documents at ``slots`` (each distinct term of a document once), concatenated."""
        csc = self.prepare()
        return np.concatenate([csc.indices[csc.indptr[s] : csc.indptr[s + 1]] for s in slots.tolist()])


@dataclass(frozen=True, eq=False)
class _Delta:
    """Documents added or replaced since the main segment was built, in node-id order: their (documents × terms)
    matrix of weighted frequencies, each stored entry's document (``entry_doc``: a query term's postings are the
    entries whose column is its code, one vectorised comparison over the small delta), token counts, the main
    position each id sorts just before (``gap``) and the tie-break keys derived from it (``key``, see
    :meth:`Bm25Index.apply_delta`)."""

    ids: tuple[str, ...]
    by_doc: sp.csr_matrix
    entry_doc: np.ndarray
    length: np.ndarray
    gap: np.ndarray
    key: np.ndarray

    @classmethod
    def of(cls, ids: tuple[str, ...], by_doc: sp.csr_matrix, length: np.ndarray, gap: np.ndarray) -> _Delta:
        d = len(ids)
        entry_doc = np.repeat(np.arange(d, dtype=np.int64), np.diff(by_doc.indptr))
        # Tie-break keys: main position p ranks p·(D+1) + D; the j-th delta document (by id), whose id sorts just
        # before main position q, ranks q·(D+1) + j. An id equal to a main id is a replaced document, whose main
        # slot is masked, so it never meets its own key.
        return cls(ids, by_doc, entry_doc, length, gap, gap * (d + 1) + np.arange(d, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Bm25Index:
    """An immutable BM25 index over one chat's documents (see the module docstring).

    Layout: a main :class:`_Segment` (built by :meth:`build` or by a compaction), a mask of its documents removed
    since (``dead``), and a small delta segment of documents added or replaced since. The corpus statistics are
    kept exactly: ``df`` (documents per term code), ``n_docs`` and ``total_len`` (token count of all documents).
    Term weights are derived from them at query time, per query term, and cached per index (an index is one
    corpus version): so an index reached by :meth:`apply_delta` answers every query exactly as a fresh
    :meth:`build` of the same documents does, scores bit for bit and order.
    """

    main: _Segment
    terms: _Vocabulary
    df: np.ndarray
    n_docs: int
    total_len: int
    stem: str = "none"
    dead: np.ndarray | None = None
    delta: _Delta | None = None
    #: Per query term code, the (document slot, term score) arrays of its live postings at this version.
    _rows: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, init=False, repr=False)
    _compacted: list[Bm25Index] = field(default_factory=list, init=False, repr=False)

    @classmethod
    def build(
        cls,
        node_ids: Sequence[str],
        primary: Sequence[str],
        secondary: Sequence[str],
        body: Sequence[str],
        stem: str = "none",
        *,
        chunk: int = BUILD_CHUNK,
    ) -> Bm25Index:
        """Index documents given as their three space-joined term columns; ``node_ids`` unique.

        The documents may come in any order: they are sorted by node-id byte order here. ``stem`` is a
        :data:`~memory_recall.text.stem.STEM_METHODS` value (ValueError otherwise). ``chunk`` (≥ 1) is how
        many documents are tokenised at a time; it bounds the build's memory and never changes the index.
        """
        if stem not in STEM_METHODS:
            raise ValueError(f"stem must be one of {', '.join(STEM_METHODS)}, got {stem!r}")
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk!r}")
        n = len(node_ids)
        if not len(primary) == len(secondary) == len(body) == n:
            raise ValueError("node_ids and the three term columns must have the same length")
        # str order is UTF-8 byte order (SQLite's BINARY collation); the store reads rows already sorted.
        if all(a < b for a, b in pairwise(node_ids)):
            ids, columns = tuple(node_ids), [list(primary), list(secondary), list(body)]
        else:
            order = sorted(range(n), key=node_ids.__getitem__)
            ids = tuple(node_ids[i] for i in order)
            columns = [[col[i] for i in order] for col in (primary, secondary, body)]
            if not all(a < b for a, b in pairwise(ids)):
                raise ValueError("node_ids must be unique")
        if n == 0:
            empty = sp.csr_matrix((0, 0), dtype=np.float64)
            return cls._of_main(ids, {}, empty, np.zeros(0, dtype=np.int64), stem)
        # Tokenised and encoded BUILD_CHUNK documents at a time, column by column, so only one chunk's token
        # strings exist at once (a list of every token of a 100k-node chat is ~200 MB of Python objects for
        # a ~26 MB index). Columns, then documents, is the order a single pass over each whole column would
        # see the terms in, so codes are numbered in that first-seen order whatever the chunk size.
        vocab: dict[str, int] = {}
        code_parts: list[np.ndarray] = []
        column_counts: list[np.ndarray] = []
        for column in columns:
            chunk_counts = []
            for start in range(0, n, chunk):
                tokens, counts = _column_tokens(column[start : start + chunk])
                code_parts.append(_encode(tokens, vocab))
                chunk_counts.append(counts)
                del tokens
            column_counts.append(np.concatenate(chunk_counts))
        del columns
        codes = np.concatenate(code_parts)
        del code_parts
        if stem != "none":
            # Stem each distinct term once, then renumber the token codes through the stemmed vocabulary.
            stemmed = [stem_term(term, stem) for term in vocab]
            vocab = {term: i for i, term in enumerate(dict.fromkeys(stemmed))}
            remap = np.fromiter(map(vocab.__getitem__, stemmed), dtype=np.int32, count=len(stemmed))
            codes = remap[codes]
        doc_range = np.arange(n, dtype=np.int32)
        docs = np.concatenate([np.repeat(doc_range, counts) for counts in column_counts])
        weights = np.repeat(np.asarray(_WEIGHTS), [int(counts.sum()) for counts in column_counts])
        length = column_counts[0] + column_counts[1] + column_counts[2]
        # COO → CSR sums duplicate (term, document) entries: f_q = Σ_c w_c · tf(q, c). The sums are of small
        # integers, exact in float64, so the summation order does not matter.
        tf = sp.csr_matrix((weights, (codes, docs)), shape=(len(vocab), n), dtype=np.float64)
        del codes, docs, weights
        tf.sum_duplicates()
        return cls._of_main(ids, vocab, tf, length, stem)

    @classmethod
    def _of_main(
        cls, ids: tuple[str, ...], vocab: dict[str, int], tf: sp.csr_matrix, length: np.ndarray, stem: str
    ) -> Bm25Index:
        segment = _Segment(ids, tf, length.astype(np.float64))
        df = np.diff(tf.indptr).astype(np.int64)
        return cls(segment, _Vocabulary(vocab), df, len(ids), int(length.sum()), stem)

    def __len__(self) -> int:
        return self.n_docs

    # -- incremental updates -------------------------------------------------------------------------------

    def apply_delta(
        self, changed: Mapping[str, DocColumns], removed: Iterable[str] = (), *, defer_compaction: bool = False
    ) -> Bm25Index:
        """The index of this corpus with ``changed`` documents added or replaced (node id → its three term
        columns, as in :meth:`build`) and ``removed`` ids dropped; ``self`` is unchanged.

        Ids of ``removed`` that are not in the index are ignored (a node deleted before it was ever indexed, or an
        archived one); an id may not be both changed and removed (ValueError). Cost: the tokenisation of the
        changed documents, a bisection per changed or removed id, and numpy work proportional to the delta
        segment (never to the chat); once the delta segment holds more than ``max(COMPACT_MIN, main /
        COMPACT_FRACTION)`` documents it is folded into a new main segment (one O(postings) merge, amortised over
        that many changes). With ``defer_compaction`` the fold is left to the caller (:attr:`wants_compaction`,
        :meth:`compacted`; :class:`Bm25Cache` runs it in the background) up to :data:`COMPACT_HARD` times that
        size. The result answers every query exactly as ``Bm25Index.build`` of the same documents.
        """
        gone = set(removed)
        both = gone.intersection(changed)
        if both:
            raise ValueError(f"node ids both changed and removed: {sorted(both)[:5]}")
        drop = gone.union(changed)
        if not drop:
            return self
        main, delta = self.main, self.delta
        n_main = len(main.ids)
        n_docs, total = self.n_docs, self.total_len
        df = self.df
        lost: list[np.ndarray] = []  # term codes of the documents leaving the corpus (one per document term)
        # Main documents removed or replaced: masked, their statistics subtracted.
        slots = [p for i in drop if (p := bisect_left(main.ids, i)) < n_main and main.ids[p] == i]
        dead = self.dead
        if slots:
            at = np.asarray(sorted(slots), dtype=np.int64)
            if dead is not None:
                at = at[~dead[at]]
            if at.size:
                dead = np.zeros(n_main, dtype=bool) if dead is None else dead.copy()
                dead[at] = True
                lost.append(main.doc_codes(at))
                n_docs -= int(at.size)
                total -= int(main.dl[at].sum())
        # Delta documents removed or replaced: dropped from the delta segment (found by bisection, so the cost is
        # per dropped id, not per delta document).
        kept_ids: Sequence[str] = ()
        kept: tuple[sp.csr_matrix, np.ndarray, np.ndarray] | None = None  # by_doc, length, gap of the kept rows
        if delta is not None:
            d_old = len(delta.ids)
            out_pos = sorted(
                {p for i in drop if (p := bisect_left(delta.ids, i)) < d_old and delta.ids[p] == i}
            )
            kept_ids = delta.ids
            kept = (delta.by_doc, delta.length, delta.gap)
            if out_pos:
                out = np.asarray(out_pos, dtype=np.int64)
                lost.append(rows_of(delta.by_doc, out).indices)
                n_docs -= int(out.size)
                total -= int(delta.length[out].sum())
                keep = np.ones(d_old, dtype=bool)
                keep[out] = False
                rows = np.flatnonzero(keep)
                kept = (rows_of(delta.by_doc, rows), delta.length[rows], delta.gap[rows])
                remaining = list(delta.ids)
                for p in reversed(out_pos):
                    del remaining[p]
                kept_ids = remaining
        # New and replaced documents, tokenised into the shared vocabulary.
        new_ids = sorted(changed)
        columns = [[changed[i][c] for i in new_ids] for c in range(3)]
        for i, (node_id, cols) in enumerate(zip(new_ids, zip(*columns, strict=True), strict=True)):
            if not all(isinstance(c, str) for c in cols):
                raise ValueError(f"changed[{node_id!r}] must be three term-column strings (document {i})")
        added, added_len = (
            _tokenise_docs(columns, self.terms, self.stem) if new_ids else (None, np.zeros(0, dtype=np.int64))
        )
        size = max(self.terms.size(), df.size)
        df = np.concatenate([df, np.zeros(size - df.size, dtype=np.int64)])
        if lost:
            df -= np.bincount(np.concatenate(lost), minlength=size)
        if added is not None:
            df += np.bincount(added.indices, minlength=size)
            n_docs += len(new_ids)
            total += int(added_len.sum())
        # The new delta segment: the kept delta rows (in id order) merged with the new documents (in id order).
        k, m = len(kept_ids), len(new_ids)
        result: Bm25Index
        if not k + m:
            result = Bm25Index(main, self.terms, df, n_docs, total, self.stem, dead, None)
        elif not m:
            assert kept is not None
            by_doc, length, gap = kept
            result = Bm25Index(
                main, self.terms, df, n_docs, total, self.stem, dead,
                _Delta.of(tuple(kept_ids), _widen(by_doc, size), length, gap),
            )
        else:
            assert added is not None
            new_gap = np.fromiter((bisect_left(main.ids, i) for i in new_ids), dtype=np.int64, count=m)
            # New document j lands before kept document ins[j]: final positions by a merge of two sorted lists.
            ins = np.fromiter((bisect_left(kept_ids, i) for i in new_ids), dtype=np.int64, count=m)
            new_pos = ins + np.arange(m, dtype=np.int64)
            if kept is None or not k:
                by_doc, length, gap, ids = _widen(added, size), added_len, new_gap, list(new_ids)
            else:
                by_doc = stacked(kept[0], added, size)
                length, gap = np.concatenate([kept[1], added_len]), np.concatenate([kept[2], new_gap])
                ids = list(kept_ids)
                for pos, node_id in zip(new_pos.tolist(), new_ids, strict=True):
                    ids.insert(pos, node_id)  # increasing positions: every earlier insert is before this one
                if not (new_pos == k + np.arange(m)).all():  # not simply appended: reorder the rows
                    perm = np.empty(k + m, dtype=np.int64)
                    perm[new_pos] = k + np.arange(m, dtype=np.int64)
                    rest = np.ones(k + m, dtype=bool)
                    rest[new_pos] = False
                    perm[rest] = np.arange(k, dtype=np.int64)
                    by_doc, length, gap = rows_of(by_doc, perm), length[perm], gap[perm]
            result = Bm25Index(
                main, self.terms, df, n_docs, total, self.stem, dead, _Delta.of(tuple(ids), by_doc, length, gap)
            )
        if result._excess() > (COMPACT_HARD if defer_compaction else 1):
            result = result.compacted()
        return result

    def _excess(self) -> float:
        """Delta documents plus masked main documents, as a fraction of the compaction threshold."""
        n_main = len(self.main.ids)
        out = (0 if self.delta is None else len(self.delta.ids)) + (
            0 if self.dead is None else int(np.count_nonzero(self.dead))
        )
        return out / max(COMPACT_MIN, n_main // COMPACT_FRACTION)

    @property
    def wants_compaction(self) -> bool:
        """Whether the delta segment and the masked documents passed the compaction threshold (see apply_delta)."""
        return self._excess() > 1

    def compacted(self) -> Bm25Index:
        """The same corpus as one main segment (no removed slots, no delta): what :meth:`build` of these documents
        gives up to the numbering of term codes. O(postings); ``self`` when it already is one segment."""
        if self.delta is None and self.dead is None:
            return self
        if self._compacted:
            return self._compacted[0]
        main, delta = self.main, self.delta
        n_main = len(main.ids)
        size = self.df.size
        live = np.arange(n_main, dtype=np.int64) if self.dead is None else np.flatnonzero(~self.dead)
        d = 0 if delta is None else len(delta.ids)
        # Every live document's tie-break key (see apply_delta) orders them by node id.
        keys = live * (d + 1) + d
        coo = main.tf.tocoo()
        rows, cols, data = coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data
        slot_rank = np.full(n_main + d, -1, dtype=np.int64)
        if delta is not None:
            keys = np.concatenate([keys, delta.key])
            by_doc = delta.by_doc
            rows = np.concatenate([rows, by_doc.indices.astype(np.int64)])
            cols = np.concatenate([cols, delta.entry_doc + n_main])
            data = np.concatenate([data, by_doc.data])
        slots = np.concatenate([live, n_main + np.arange(d, dtype=np.int64)])
        order = np.argsort(keys, kind="stable")
        slot_rank[slots[order]] = np.arange(order.size, dtype=np.int64)
        new_col = slot_rank[cols]
        alive = new_col >= 0
        tf = sp.csr_matrix(
            (data[alive], (rows[alive], new_col[alive])), shape=(size, order.size), dtype=np.float64
        )
        tf.sum_duplicates()
        ordered = slots[order]
        ids = tuple(main.ids[s] if s < n_main else delta.ids[s - n_main] for s in ordered.tolist())  # type: ignore[union-attr]
        dl = np.concatenate([main.dl, np.zeros(0) if delta is None else delta.length.astype(np.float64)])[ordered]
        segment = _Segment(ids, tf, dl)
        result = Bm25Index(segment, self.terms, self.df, self.n_docs, self.total_len, self.stem)
        self._compacted.append(result)
        return result

    # -- inspection (the whole corpus in node-id order; O(postings) for an index with a delta) -------------

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The indexed node ids in byte order (document position = tie-break rank)."""
        return self.compacted().main.ids

    @property
    def vocab(self) -> dict[str, int]:
        """Term → code (shared with derived indexes, so it may hold terms this index has no posting of)."""
        return self.terms.codes

    @property
    def tf(self) -> sp.csr_matrix:
        """The (term codes × documents) CSR matrix of weighted term frequencies, documents in :attr:`node_ids`
        order."""
        return self.compacted().main.tf

    @property
    def norm(self) -> np.ndarray:
        """``k1 · (1 − b + b · D_d / avgdl)`` per document in :attr:`node_ids` order."""
        avgdl = float(self.total_len) / self.n_docs if self.n_docs else 0.0
        return _norm(self.compacted().main.dl, avgdl)

    @property
    def idf(self) -> np.ndarray:
        """``idf`` per term code (the query-time weights)."""
        return np.array([_idf(self.n_docs, int(h)) for h in self.df.tolist()], dtype=np.float64)

    # -- queries -------------------------------------------------------------------------------------------

    def _row(self, code: int) -> tuple[np.ndarray, np.ndarray]:
        """The live postings of one term code: document slots and their term scores
        ``idf · f · (k1 + 1) / (f + norm[d])`` at this version (computed once per index and term)."""
        cached = self._rows.get(code)
        if cached is not None:
            return cached
        hits = int(self.df[code])
        docs: list[np.ndarray] = []
        scores: list[np.ndarray] = []
        if hits > 0:
            idf = _idf(self.n_docs, hits)
            avgdl = float(self.total_len) / self.n_docs
            main, delta = self.main, self.delta
            tf = main.tf
            if code < tf.shape[0]:
                start, end = int(tf.indptr[code]), int(tf.indptr[code + 1])
                at, f = tf.indices[start:end], tf.data[start:end]
                if self.dead is not None:
                    keep = ~self.dead[at]
                    at, f = at[keep], f[keep]
                docs.append(at)
                scores.append(idf * ((f * (BM25_K1 + 1.0)) / (f + _norm(main.dl[at], avgdl))))
            if delta is not None:
                hit = np.flatnonzero(delta.by_doc.indices == code)
                if hit.size:
                    at, f = delta.entry_doc[hit], delta.by_doc.data[hit]
                    docs.append(at + len(main.ids))
                    dl = delta.length[at].astype(np.float64)
                    scores.append(idf * ((f * (BM25_K1 + 1.0)) / (f + _norm(dl, avgdl))))
        if len(docs) == 1:
            row = (docs[0], scores[0])  # the main segment's own index slice: a view, no copy
        elif docs:
            row = (np.concatenate(docs), np.concatenate(scores))
        else:
            row = (np.zeros(0, dtype=np.int64), np.zeros(0))
        self._rows[code] = row
        return row

    def query(self, terms: Sequence[str], limit: int) -> list[tuple[str, float]]:
        """Documents containing any of ``terms``: ``(node_id, score)``, score desc then node id, at most ``limit``."""
        stem = self.stem
        known = self.df.size
        rows = [
            code
            for term in terms
            for token in split_query_term(term)
            if (code := self.terms.codes.get(token if stem == "none" else stem_term(token, stem))) is not None
            and code < known
        ]
        if not rows or limit < 1:
            return []
        # The query terms' live postings with their per-version term scores, summed into a dense per-slot
        # accumulator: O(postings + documents) in a handful of numpy calls, no sort of the postings. bincount adds
        # each document's term scores in query-term order, as a sum per term would (a document appears at most
        # once per term: in the main segment or in the delta).
        spans = [self._row(r) for r in rows]
        if not any(docs.size for docs, _ in spans):
            return []
        docs = np.concatenate([s[0] for s in spans])
        weights = np.concatenate([s[1] for s in spans])
        n_main = len(self.main.ids)
        delta = self.delta
        acc = np.bincount(docs, weights=weights, minlength=n_main + (0 if delta is None else len(delta.ids)))
        # Every term score is > 0 (idf ≥ 1e-6, f_q ≥ 1), so the positive entries are exactly the documents
        # holding a query term. (``acc > 0`` first: nonzero() of a float array is slow.)
        matched = np.flatnonzero(acc > 0)
        scores = acc[matched]
        k = min(limit, matched.size)
        if k < matched.size:
            # Keep every document scoring at least the k-th best so ties at the cut go by node id.
            kth = np.partition(scores, matched.size - k)[matched.size - k]
            keep = scores >= kth
            matched, scores = matched[keep], scores[keep]
        main_ids = self.main.ids
        if delta is None:
            # Main slot = node-id byte order, so it is the tie-break key.
            order = np.lexsort((matched, -scores))[:k]
            return [
                (main_ids[d], float(s))
                for d, s in zip(matched[order].tolist(), scores[order].tolist(), strict=True)
            ]
        width = len(delta.ids) + 1
        key = matched * width + (width - 1)
        in_delta = matched >= n_main
        key[in_delta] = delta.key[matched[in_delta] - n_main]
        order = np.lexsort((key, -scores))[:k]
        delta_ids = delta.ids
        return [
            (main_ids[d] if d < n_main else delta_ids[d - n_main], float(s))
            for d, s in zip(matched[order].tolist(), scores[order].tolist(), strict=True)
        ]


@dataclass
class _Entry:
    """A cached index and the node ids whose rows may differ between it and the chat at ``version``."""

    version: int
    index: Bm25Index
    pending: frozenset[str] = frozenset()


#: Pending node ids past which an entry is dropped instead of advanced (reading that many rows one by one and
#: merging them costs about what a rebuild does): ``max(PENDING_MIN, indexed documents / PENDING_FRACTION)``.
PENDING_MIN = 2048
PENDING_FRACTION = 4


class Bm25Cache:
    """The latest :class:`Bm25Index` of up to ``max_chats`` (chat, stem method) pairs, keyed by
    ``(chat_id, stem, version)``; thread-safe.

    Incremental use (the store's): every committed write calls :meth:`advance` with the node ids whose indexed
    rows it may have changed; the chat's entry moves to the new version with those ids pending. The next
    :meth:`get` at that version with a ``changed`` reader applies them (:meth:`Bm25Index.apply_delta`: the
    pending ids' current rows, an id without a row is removed) instead of rebuilding. A write that changed no
    indexed text (access reinforcement, records) advances the entry with nothing pending, so it serves the new
    version as is. ``get`` builds on any other miss (a newer version replaces the pair's entry; least recently
    used pairs are evicted). Two threads missing at once may both build; either result is the same index.

    Background work (``background=True``, the default), off every query's path and never changing an answer:
    after a full build, the main segment's by-document view (:meth:`_Segment.prepare`, needed by the first edit
    or delete); once a delta index passes the compaction threshold, its compaction. Deltas applied while a
    compaction runs are logged and replayed onto the compacted index, which then replaces the entry if the entry
    still holds the index the log ends with (otherwise the work is dropped). :meth:`wait` joins that work (tests,
    figures).
    """

    def __init__(self, max_chats: int = 8, *, background: bool = True) -> None:
        self.max_chats = max_chats
        self.background = background
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        #: Per (chat, stem) pair with a compaction running: the deltas stored since it started, in order, as
        #: ``(base index, rows, removed ids, resulting index)``.
        self._compacting: dict[tuple[str, str], list[tuple[Bm25Index, Mapping[str, DocColumns], list[str],
                                                             Bm25Index]]] = {}
        self._threads: list[threading.Thread] = []
        #: Full builds and delta applications made by :meth:`get`, compactions swapped in (figures and tests).
        self.builds = 0
        self.deltas = 0
        self.compactions = 0

    def get(
        self,
        chat_id: str,
        version: int,
        build: Callable[[], Bm25Index],
        stem: str = "none",
        changed: Callable[[frozenset[str]], Mapping[str, DocColumns]] | None = None,
    ) -> Bm25Index:
        """The chat's index at ``version`` stemmed by ``stem``.

        Cached → returned. Cached at ``version`` with ids pending and ``changed`` given → ``changed(ids)`` must
        return the rows of those ids that are indexed at exactly ``version`` (read in the same snapshot as the
        version; ids without a row are removed from the index), which are merged into the cached index.
        Otherwise ``build()`` builds it.
        """
        key = (chat_id, stem)
        base: _Entry | None = None
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.version == version:
                self._entries.move_to_end(key)
                if not entry.pending:
                    return entry.index
                if changed is not None:
                    base = entry
        rows: Mapping[str, DocColumns] = {}
        removed: list[str] = []
        if base is not None:
            rows = changed(base.pending)  # type: ignore[misc]
            removed = [i for i in base.pending if i not in rows]
            index = base.index.apply_delta(rows, removed, defer_compaction=self.background)
        else:
            index = build()
        if index.stem != stem:
            raise ValueError(f"build() returned an index stemmed {index.stem!r}, expected {stem!r}")
        job: Callable[[], None] | None = None
        with self._lock:
            if base is not None:
                self.deltas += 1
            else:
                self.builds += 1
            current = self._entries.get(key)
            # A slower build of an older version never replaces a newer one (nor a complete entry of this one).
            if current is None or current.version < version or (current.version == version and current.pending):
                self._entries[key] = _Entry(version, index)
                self._entries.move_to_end(key)
                if base is not None and key in self._compacting:
                    self._compacting[key].append((base.index, rows, removed, index))
                if self.background:
                    if base is None:
                        job = index.main.prepare
                    elif index.wants_compaction and key not in self._compacting:
                        self._compacting[key] = []
                        job = partial(self._compact, key, index)
            while len(self._entries) > self.max_chats:
                self._entries.popitem(last=False)
        if job is not None:
            self._spawn(job)
        return index

    def _spawn(self, job: Callable[[], None]) -> None:
        thread = threading.Thread(target=job, name="bm25-background", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _compact(self, key: tuple[str, str], index: Bm25Index) -> None:
        """Compact ``index``, replay the deltas stored meanwhile, swap the result in (see the class docstring)."""
        try:
            result = index.compacted()
            result.main.prepare()
            expected = index
            while True:
                with self._lock:
                    steps = self._compacting.get(key, [])
                    if not steps:
                        self._compacting.pop(key, None)
                        entry = self._entries.get(key)
                        if entry is not None and entry.index is expected:
                            self._entries[key] = _Entry(entry.version, result, entry.pending)
                            self.compactions += 1
                        return
                    self._compacting[key] = []
                for base, rows, removed, produced in steps:
                    if base is not expected:  # a rebuild came in between: this lineage is no longer cached
                        with self._lock:
                            self._compacting.pop(key, None)
                        return
                    result = result.apply_delta(rows, removed, defer_compaction=True)
                    expected = produced
        except BaseException:
            # The cached index stays valid (only uncompacted; apply_delta folds inline past COMPACT_HARD).
            with self._lock:
                self._compacting.pop(key, None)
            raise

    def wait(self, timeout: float | None = None) -> None:
        """Join the background work started so far (each thread up to ``timeout`` seconds)."""
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)

    def pending_stems(self, chat_id: str, version: int) -> list[str]:
        """The stem methods whose cached index of ``chat_id`` is at ``version`` with ids pending (sorted): those a
        :meth:`get` at that version with a ``changed`` reader would update."""
        with self._lock:
            return sorted(k[1] for k, e in self._entries.items() if k[0] == chat_id and e.version == version
                          and e.pending)

    def advance(self, chat_id: str, base_version: int, new_version: int, touched: Iterable[str] = ()) -> int:
        """Move the chat's entries cached at exactly ``base_version`` (every stem method) to ``new_version`` with
        ``touched`` added to their pending ids; returns how many were moved.

        The caller's guarantee: one committed write took the chat from ``base_version`` to ``new_version`` and
        ``touched`` holds every node id whose indexed row (text, or presence: inserted, archived, deleted) that
        write may have changed. An entry at another version is left alone (it is older or newer; a later ``get``
        rebuilds what it cannot serve). An entry whose pending ids would pass
        ``max(PENDING_MIN, len(index) / PENDING_FRACTION)`` is dropped instead.
        """
        if new_version <= base_version:
            raise ValueError(f"new_version {new_version} must follow base_version {base_version}")
        touched = frozenset(touched)
        moved = 0
        with self._lock:
            for key, entry in list(self._entries.items()):
                if key[0] != chat_id or entry.version != base_version:
                    continue
                pending = entry.pending | touched
                if len(pending) > max(PENDING_MIN, len(entry.index) // PENDING_FRACTION):
                    del self._entries[key]
                    continue
                self._entries[key] = _Entry(new_version, entry.index, pending)
                moved += 1
        return moved

    def carry(self, chat_id: str, base_version: int, new_version: int) -> int:
        """:meth:`advance` over a write that changed no indexed text and no indexed node set (access
        reinforcement, records): the entry at ``base_version`` serves ``new_version`` as is."""
        return self.advance(chat_id, base_version, new_version, ())

    def clear(self) -> None:
        """Drop every cached index."""
        with self._lock:
            self._entries.clear()


_CACHES: weakref.WeakKeyDictionary[object, Bm25Cache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def cache_for(owner: object) -> Bm25Cache:
    """The :class:`Bm25Cache` of ``owner`` (a store), created on first use and dropped with the owner."""
    with _CACHES_LOCK:
        cache = _CACHES.get(owner)
        if cache is None:
            cache = _CACHES[owner] = Bm25Cache()
        return cache
