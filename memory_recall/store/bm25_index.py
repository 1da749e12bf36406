"""Per-chat in-memory BM25 index: SQLite FTS5's ``bm25()`` formula with statistics over one chat's rows.

Usage::

    index = Bm25Index.build(node_ids, primary, secondary, body)    # the chat's nodes_fts columns
    index.query(["dragon", "lair"], limit=50)                       # [(node_id, score)], best first

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
* **Cost.** Build: one pass over the column strings, :data:`BUILD_CHUNK` documents at a time (only one chunk's
  token strings are alive; the rest are int32 codes), one dict lookup per token, one CSR matrix
  (terms × documents) of weighted frequencies, plus each entry's term score (it does not depend on the query).
  Query: a gather of the query terms' postings summed into a per-document array: O(postings + documents) numpy
  work, no Python loop over documents and no sort of the postings.

:class:`Bm25Cache` holds the latest index per chat keyed by ``(chat_id, version)`` and the stem
method (an index stemmed one way never answers a query of another); the store's version contract (a version is
never reused, not even by a chat deleted and created again) makes that key safe. :meth:`Bm25Cache.carry` moves an
index to the next version over a write that changed no indexed text (access reinforcement, records).
"""

from __future__ import annotations

import threading
import unicodedata
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import scipy.sparse as sp

from memory_recall.text.stem import STEM_METHODS, stem_term

__all__ = ["BM25_B", "BM25_K1", "BUILD_CHUNK", "Bm25Cache", "Bm25Index", "cache_for", "split_query_term"]

#: FTS5's constants (fts5_aux.c, fts5Bm25Function).
BM25_K1 = 1.2
BM25_B = 0.75
#: Column weights (primary, secondary, body): the store's ``BM25_WEIGHTS``.
_WEIGHTS = (3.0, 2.0, 1.0)
_IDF_FLOOR = 1e-6
#: Documents tokenised at a time by :meth:`Bm25Index.build` (bounds the live token strings, see there).
BUILD_CHUNK = 4096
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


@dataclass(frozen=True, eq=False)
class Bm25Index:
    """An immutable BM25 index over one chat's documents (see the module docstring).

    ``node_ids`` are in byte order (position = tie-break rank); ``tf`` is the (terms × documents) CSR matrix of
    weighted term frequencies; ``norm[d] = k1 · (1 − b + b · D_d / avgdl)``; ``idf[t]`` per term; ``stem`` the
    stem method applied to the vocabulary and to query tokens.
    """

    node_ids: tuple[str, ...]
    vocab: dict[str, int]
    tf: sp.csr_matrix
    norm: np.ndarray
    idf: np.ndarray
    stem: str = "none"
    #: Per stored (term, document) entry, its term score ``idf[t] · f · (k1 + 1) / (f + norm[d])`` (aligned with
    #: ``tf.data``): it does not depend on the query, so a query only gathers and sums. Derived in
    #: ``__post_init__``; 8 bytes per entry (the matrix itself takes 12).
    _term_score: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        tf = self.tf
        if tf.nnz:
            rows = np.repeat(np.arange(tf.shape[0]), np.diff(tf.indptr))
            term_score = self.idf[rows] * ((tf.data * (BM25_K1 + 1.0)) / (tf.data + self.norm[tf.indices]))
        else:
            term_score = np.zeros(0)
        object.__setattr__(self, "_term_score", term_score)

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
            return cls(ids, {}, empty, np.zeros(0), np.zeros(0), stem)
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
        avgdl = float(length.sum()) / n
        dl = length.astype(np.float64)
        norm = BM25_K1 * (1 - BM25_B + BM25_B * dl / avgdl) if avgdl > 0 else np.full(n, BM25_K1 * (1 - BM25_B))
        hits = np.diff(tf.indptr).astype(np.float64)
        idf = np.log((n - hits + 0.5) / (hits + 0.5))
        idf[idf <= 0] = _IDF_FLOOR
        return cls(ids, vocab, tf, norm, idf, stem)

    def __len__(self) -> int:
        return len(self.node_ids)

    def query(self, terms: Sequence[str], limit: int) -> list[tuple[str, float]]:
        """Documents containing any of ``terms``: ``(node_id, score)``, score desc then node id, at most ``limit``."""
        stem = self.stem
        rows = [
            code
            for term in terms
            for token in split_query_term(term)
            if (code := self.vocab.get(token if stem == "none" else stem_term(token, stem))) is not None
        ]
        if not rows or limit < 1:
            return []
        # A sparse gather over the query terms' posting runs (contiguous in the CSR rows), summed into a dense
        # per-document accumulator: O(postings + documents) in a handful of numpy calls, no sort of the
        # postings. bincount adds each document's term scores in query-term order, as a sum per term would.
        indptr, indices, term_score = self.tf.indptr, self.tf.indices, self._term_score
        spans = [(int(indptr[r]), int(indptr[r + 1])) for r in rows]
        if not any(end > start for start, end in spans):
            return []
        docs = np.concatenate([indices[start:end] for start, end in spans])
        weights = np.concatenate([term_score[start:end] for start, end in spans])
        acc = np.bincount(docs, weights=weights, minlength=len(self.node_ids))
        # Every term score is > 0 (idf ≥ 1e-6, f_q ≥ 1), so the positive entries are exactly the documents
        # holding a query term, in document order. (``acc > 0`` first: nonzero() of a float array is slow.)
        matched = np.flatnonzero(acc > 0)
        scores = acc[matched]
        k = min(limit, matched.size)
        if k < matched.size:
            # Keep every document scoring at least the k-th best so ties at the cut go by node id.
            kth = np.partition(scores, matched.size - k)[matched.size - k]
            keep = scores >= kth
            matched, scores = matched[keep], scores[keep]
        # Document position is node-id byte order, so it is the tie-break key.
        order = np.lexsort((matched, -scores))[:k]
        ids = self.node_ids
        return [(ids[d], float(s)) for d, s in zip(matched[order].tolist(), scores[order].tolist(), strict=True)]


class Bm25Cache:
    """The latest :class:`Bm25Index` of up to ``max_chats`` (chat, stem method) pairs, keyed by
    ``(chat_id, stem, version)``; thread-safe.

    ``get`` builds on a miss (a newer version replaces the pair's entry; least recently used pairs are
    evicted). Two threads missing at once may both build; either result is the same index.
    """

    def __init__(self, max_chats: int = 8) -> None:
        self.max_chats = max_chats
        self._entries: OrderedDict[tuple[str, str], tuple[int, Bm25Index]] = OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0

    def get(self, chat_id: str, version: int, build: Callable[[], Bm25Index], stem: str = "none") -> Bm25Index:
        """The chat's index at ``version`` stemmed by ``stem``, built by ``build()`` unless cached."""
        key = (chat_id, stem)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == version:
                self._entries.move_to_end(key)
                return entry[1]
        index = build()
        if index.stem != stem:
            raise ValueError(f"build() returned an index stemmed {index.stem!r}, expected {stem!r}")
        with self._lock:
            self.builds += 1
            current = self._entries.get(key)
            # A slower build of an older version never replaces a newer one.
            if current is None or current[0] <= version:
                self._entries[key] = (version, index)
                self._entries.move_to_end(key)
            while len(self._entries) > self.max_chats:
                self._entries.popitem(last=False)
        return index

    def carry(self, chat_id: str, base_version: int, new_version: int) -> int:
        """Re-key the chat's indexes cached at exactly ``base_version`` (every stem method) to ``new_version``;
        returns how many were carried.

        Only for a write that took the chat from ``base_version`` to ``new_version`` without changing any indexed
        text or the set of indexed (non-archived) nodes, e.g. access reinforcement (the caller's guarantee: the
        index at ``new_version`` would be built from the same rows). An entry at another version is left alone.
        """
        if new_version <= base_version:
            raise ValueError(f"new_version {new_version} must follow base_version {base_version}")
        carried = 0
        with self._lock:
            for key, (version, index) in list(self._entries.items()):
                if key[0] == chat_id and version == base_version:
                    self._entries[key] = (new_version, index)
                    carried += 1
        return carried

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
