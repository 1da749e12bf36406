"""Lexical field matching (reference §3.12 step 1, scenario §6.1 6; recall-spec departure 8).

Public functions
----------------
* :func:`lexical_units` ``(text, *, reference=False) -> list[str]`` — the matching units of a text,
  deduplicated in first-occurrence order.
* :func:`field_match` ``(field, sources, exact, includes, overlap, *, reference=False) -> float`` — best
  match of one node field against the lexical query sources: per non-empty source ``s`` (normalised), ``s ==
  f`` → ``exact`` (nothing else for that source); otherwise ``includes`` when ``min(len s, len f) ≥ 2``
  (JS length) and one contains the other, and always ``overlap · |units(s) ∩ units(f)| / |units(s)|``
  (0 when ``s`` has no units; the spec leaves that division undefined). Result ``min(1, max)``, 0 for an
  empty field. O(#sources · (len f + len s)).
* :func:`lexical_score` ``(primary_texts, secondary_texts, sources, *, reference=False) -> float`` —
  ``P`` = max over primary texts (name/title) of ``field_match(·, 1.0, 0.92, 0.72)``, ``S`` = max over
  secondary texts (summary, …) of ``field_match(·, 0.82, 0.68, 0.52)``, ``T = field_match(" ".join(primary +
  secondary), 0.65, 0.55, 0.45)``; 0 when all three are 0, else ``min(1, max(P, 0.82·S, 0.7·T, 0.75·P +
  0.35·S + 0.2·T))``.
* :func:`prepare_sources` ``(sources, *, reference=False) -> LexicalSources`` — normalises the sources and
  computes their units once; pass the result to :func:`lexical_score` / :func:`field_match` for every
  candidate of a recall (the kernel runs per candidate, a few hundred times).
* :func:`prepare_field` / :func:`prepare_node` ``(primary_texts, secondary_texts, *, reference=False) ->
  PreparedNode`` — a node's fields normalised once (text, JS length, units of each primary and secondary field
  and of their join); :func:`prepared_lexical_score` ``(node, sources) -> float`` is then exactly
  :func:`lexical_score` without any normalisation, so a caller can cache prepared nodes per graph snapshot.
  :func:`lexical_score` itself is ``prepared_lexical_score(prepare_node(...), prepare_sources(...))``.
* :func:`pack_node` ``(node, vocab) -> PackedNode`` and :func:`batch_lexical_scores` ``(nodes, sources, vocab)
  -> (m,) float64`` — :func:`prepared_lexical_score` of a few hundred candidates at once, bit for bit: the
  prepared fields flattened once per node (units numbered by a per-snapshot :class:`UnitVocab`), then the unit
  overlaps counted for all fields together in numpy and the containment tests run per source over all fields.

Unit classes
------------
``reference=True`` is the reference exactly: on ``NL(text)``, maximal runs of ``[a-z0-9]`` and of CJK
U+4E00–U+9FFF; every run of length ≥ 2 is a unit; a CJK run longer than 2 also adds all its character
bigrams. Everything else is a separator, so accented Latin, kana, hangul, Cyrillic and CJK Ext-A score 0
(reference §7 item 16).

The default (departure 8) first applies NFKC (full-width Latin and digits become ASCII, decomposed accents
compose, compatibility ideographs become unified ones) and then ``NL``, and recognises five run classes:

* Latin words: ASCII letters and digits, Latin-1/Extended-A/Extended-B/Extended Additional letters, and
  combining marks inside a word (``café``, ``straße``, ``ngô``);
* Cyrillic words (U+0400–U+052F);
* CJK ideographs: U+4E00–U+9FFF plus Extension A U+3400–U+4DBF (and 〆/々/〇);
* kana: hiragana, katakana (incl. ー, not the separator ・) and half-width katakana;
* hangul: syllables and jamo.

Latin and Cyrillic runs are space-delimited words (units when length ≥ 2, as the reference's ASCII runs).
CJK, kana and hangul runs add their bigrams when longer than 2 (like the reference's CJK runs): Japanese
and Chinese have no word spaces, and Korean words carry particles (``서울에서`` still shares ``서울``). A
script change ends a run. On ASCII/CJK-only text both modes give the same units, so scenario 6 holds in
both; ``field_match``'s ``exact``/``includes`` tests compare the same normalised strings as the units.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import re
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memory_recall.text.normalize import js_len, normalize_lexical

__all__ = [
    "LexicalSources",
    "PackedNode",
    "PreparedField",
    "PreparedNode",
    "UnitVocab",
    "batch_lexical_scores",
    "field_match",
    "lexical_score",
    "lexical_units",
    "pack_node",
    "prepare_field",
    "prepare_node",
    "prepare_sources",
    "prepared_lexical_score",
]

# Reference §3.12 step 1: runs of [a-z0-9] or of U+4E00–U+9FFF.
_REF_TOKEN = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]+")
_REF_CJK = re.compile(r"[\u4e00-\u9fff]+")

_LATIN = (
    r"0-9a-z\u00aa\u00b5\u00ba\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff"
    r"\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff"
)
_CYRILLIC = r"\u0400-\u052f\u1c80-\u1c8f\u2de0-\u2dff\ua640-\ua69f"
_CJK = r"\u3005\u3006\u3007\u3400-\u4dbf\u4e00-\u9fff"
_KANA = r"\u3041-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9f"  # not ・ U+30FB
_HANGUL = r"\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"
# Group order = class: 1 Latin, 2 Cyrillic, 3 CJK, 4 kana, 5 hangul (3–5 are bigram classes).
_EXT_TOKEN = re.compile(f"([{_LATIN}]+)|([{_CYRILLIC}]+)|([{_CJK}]+)|([{_KANA}]+)|([{_HANGUL}]+)")
_BIGRAM_GROUPS = frozenset({3, 4, 5})


def _normalise(text: object, reference: bool) -> str:
    if text is None:
        return ""
    if reference:
        return normalize_lexical(text)
    return normalize_lexical(unicodedata.normalize("NFKC", str(text)))


def _add_run(out: dict[str, None], token: str, bigrams: bool) -> None:
    if js_len(token) >= 2:
        out[token] = None
    if bigrams and len(token) > 2:
        for i in range(len(token) - 1):
            out[token[i : i + 2]] = None


@functools.lru_cache(maxsize=8192)
def _units_of_normalised(norm: str, reference: bool) -> tuple[str, ...]:
    out: dict[str, None] = {}  # insertion-ordered set: dedupe keeping first occurrence
    if reference:
        for m in _REF_TOKEN.finditer(norm):
            tok = m.group(0)
            _add_run(out, tok, _REF_CJK.fullmatch(tok) is not None)
    else:
        for m in _EXT_TOKEN.finditer(norm):
            _add_run(out, m.group(0), m.lastindex in _BIGRAM_GROUPS)
    return tuple(out)


def lexical_units(text: object, *, reference: bool = False) -> list[str]:
    """Matching units of ``text`` (module docstring), first-occurrence order.

    >>> lexical_units("Alice 现在怎么样了")
    ['alice', '现在怎么样了', '现在', '在怎', '怎么', '么样', '样了']
    """
    return list(_units_of_normalised(_normalise(text, reference), reference))


@dataclass(frozen=True)
class PreparedField:
    """One text normalised once — a node field (:func:`prepare_field`) or a query source
    (:func:`prepare_sources`): text, JS length and unit set."""

    text: str
    length: int
    units: frozenset[str]


@dataclass(frozen=True)
class LexicalSources:
    """Normalised lexical query sources with their units, computed once per recall."""

    items: tuple[PreparedField, ...]
    reference: bool = False

    @functools.cached_property
    def units(self) -> frozenset[str]:
        """Union of the units of every source."""
        return frozenset().union(*(src.units for src in self.items))

    @functools.cached_property
    def haystack(self) -> str:
        """The source texts joined by line feeds (which no normalised text contains)."""
        return "\n".join(src.text for src in self.items)


def prepare_sources(sources: Sequence[str] | LexicalSources, *, reference: bool = False) -> LexicalSources:
    """Normalise the query sources once; empty ones are dropped (they never match)."""
    if isinstance(sources, LexicalSources):
        if sources.reference != reference:
            raise ValueError("prepared sources were built with a different 'reference' mode.")
        return sources
    items = []
    for src in sources:
        s = _normalise(src, reference)
        if s:
            items.append(PreparedField(s, js_len(s), frozenset(_units_of_normalised(s, reference))))
    return LexicalSources(tuple(items), reference)


@dataclass(frozen=True)
class PreparedNode:
    """A node's lexical fields normalised once (:func:`prepare_node`); ``units`` is the union of the units of
    every field (used to skip the unit-overlap step when it cannot contribute)."""

    primary: tuple[PreparedField, ...]
    secondary: tuple[PreparedField, ...]
    joined: PreparedField | None
    units: frozenset[str]

    @functools.cached_property
    def fields(self) -> tuple[PreparedField, ...]:
        """Every prepared field: primary, secondary, then the joined text."""
        return (*self.primary, *self.secondary, *((self.joined,) if self.joined is not None else ()))

    @functools.cached_property
    def haystack(self) -> str:
        """The field texts joined by line feeds (which no normalised text contains)."""
        return "\n".join(f.text for f in self.fields)


def prepare_field(field: object, *, reference: bool = False) -> PreparedField | None:
    """``field`` normalised with its JS length and units; None when it normalises to "" (it never matches)."""
    f = _normalise(field, reference)
    if not f:
        return None
    return PreparedField(f, js_len(f), frozenset(_units_of_normalised(f, reference)))


def prepare_node(
    primary_texts: Sequence[str], secondary_texts: Sequence[str], *, reference: bool = False
) -> PreparedNode:
    """The fields :func:`lexical_score` reads, prepared once: scoring a prepared node against any sources
    (:func:`prepared_lexical_score`) gives exactly ``lexical_score(primary_texts, secondary_texts, sources)``.
    Empty fields are dropped (their match is 0)."""
    primary = tuple(p for p in (prepare_field(t, reference=reference) for t in primary_texts) if p is not None)
    secondary = tuple(p for p in (prepare_field(t, reference=reference) for t in secondary_texts) if p is not None)
    joined_text = " ".join(str(t) for t in (*primary_texts, *secondary_texts) if t is not None)
    joined = prepare_field(joined_text, reference=reference)
    units = frozenset().union(*(p.units for p in (*primary, *secondary, *((joined,) if joined else ()))))
    return PreparedNode(primary, secondary, joined, units)


def _prepared_match(
    f: PreparedField, prepared: LexicalSources, exact: float, includes: float, overlap: float, units_meet: bool
) -> float:
    # ``units_meet`` False: no source unit occurs in this node, every overlap term is 0 and is skipped.
    # Every candidate value is ≥ 0 and finite, so ``if value > best`` is ``best = max(best, value)``.
    best = 0.0
    text, length, units = f.text, f.length, f.units
    for src in prepared.items:
        if src.text == text:
            if exact > best:
                best = exact
            continue
        if src.length >= 2 and length >= 2 and includes > best and (src.text in text or text in src.text):
            best = includes
        if units_meet and src.units:
            value = overlap * len(src.units & units) / len(src.units)
            if value > best:
                best = value
    return min(1.0, best)


def _field_match(
    field: object, prepared: LexicalSources, exact: float, includes: float, overlap: float
) -> float:
    f = prepare_field(field, reference=prepared.reference)
    if f is None:
        return 0.0
    return _prepared_match(f, prepared, exact, includes, overlap, True)


def field_match(
    field: object,
    sources: Sequence[str] | LexicalSources,
    exact: float,
    includes: float,
    overlap: float,
    *,
    reference: bool = False,
) -> float:
    """Reference ``fieldMatch``: best exact / containment / unit-overlap match of one field.

    >>> field_match("Alice", ["Alice 现在怎么样了"], 1.0, 0.92, 0.72)
    0.92
    """
    return _field_match(field, prepare_sources(sources, reference=reference), exact, includes, overlap)


def lexical_score(
    primary_texts: Sequence[str],
    secondary_texts: Sequence[str],
    sources: Sequence[str] | LexicalSources,
    *,
    reference: bool = False,
) -> float:
    """Reference lexical score of one node: primary (name/title) and secondary (summary …) fields.

    >>> round(lexical_score([], ["hello world"], ["Hello   World"]), 6)
    0.6724
    """
    prepared = prepare_sources(sources, reference=reference)
    if not prepared.items:
        return 0.0
    return prepared_lexical_score(prepare_node(primary_texts, secondary_texts, reference=reference), prepared)


def prepared_lexical_score(node: PreparedNode, sources: LexicalSources) -> float:
    """:func:`lexical_score` of a prepared node (:func:`prepare_node`, same ``reference`` mode as the sources).
    O(#sources · #fields) string comparisons and set intersections; no normalisation.

    A node sharing no unit with the sources, with no source inside one of its fields and no field inside a
    source (equality is containment), scores exactly 0 and is rejected without the per-field loop.
    """
    if not sources.items:
        return 0.0
    meet = not node.units.isdisjoint(sources.units)
    if not meet and not _contains_any(node, sources):
        return 0.0
    # Plain loops instead of max(generator): the same value (every match is ≥ 0), less overhead per candidate.
    p = s = 0.0
    for f in node.primary:
        value = _prepared_match(f, sources, 1.0, 0.92, 0.72, meet)
        if value > p:
            p = value
    for f in node.secondary:
        value = _prepared_match(f, sources, 0.82, 0.68, 0.52, meet)
        if value > s:
            s = value
    t = _prepared_match(node.joined, sources, 0.65, 0.55, 0.45, meet) if node.joined is not None else 0.0
    if p == 0 and s == 0 and t == 0:
        return 0.0
    return min(1.0, max(p, 0.82 * s, 0.7 * t, 0.75 * p + 0.35 * s + 0.2 * t))


def _contains_any(node: PreparedNode, sources: LexicalSources) -> bool:
    # Normalised texts never hold a line feed (NQ turns every whitespace run into one space), so "s is inside
    # some field" is "s is inside the fields joined by line feeds", and likewise for fields inside sources.
    return any(src.text in node.haystack for src in sources.items) or any(
        f.text in sources.haystack for f in node.fields
    )


# --- batch scoring ----------------------------------------------------------------------------------------------

# Weights of the three field kinds, indexed by kind: 0 primary, 1 secondary, 2 the joined text (lexical_score).
_KIND_EXACT = np.array([1.0, 0.82, 0.65])
_KIND_INCLUDES = np.array([0.92, 0.68, 0.55])
_KIND_OVERLAP = np.array([0.72, 0.52, 0.45])


_TEXTS = operator.attrgetter("texts")
_META = operator.attrgetter("meta")
_UNIT_IDS = operator.attrgetter("unit_ids")


def _LEN_PLUS_ONE(text: str) -> int:  # noqa: N802 (used like a constant, with map)
    return len(text) + 1


class UnitVocab:
    """Integer ids of lexical units, assigned on first sight (thread-safe). One per graph snapshot: the ids of
    :class:`PackedNode` values are only comparable within the vocabulary that packed them."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ids)

    def ids_of(self, units: Sequence[str] | frozenset[str]) -> list[int]:
        """The ids of ``units``, new units added."""
        ids = self._ids
        missing = [u for u in units if u not in ids]
        if missing:
            with self._lock:  # ``len(ids)`` as the next id must not race with another insert
                for u in missing:
                    if u not in ids:
                        ids[u] = len(ids)
        return [ids[u] for u in units]

    def known(self, units: frozenset[str]) -> list[int]:
        """The ids of the units of ``units`` already in the vocabulary (the others occur in no packed node)."""
        ids = self._ids
        return [ids[u] for u in units if u in ids]


@dataclass(frozen=True)
class PackedNode:
    """A :class:`PreparedNode` flattened for :func:`batch_lexical_scores`: its field texts in
    :attr:`PreparedNode.fields` order; ``meta`` (fields × 4, intp) holds per field its kind (0 primary,
    1 secondary, 2 joined), whether its JS length is ≥ 2, its unit count and its length in code points;
    ``unit_ids`` the ids of all its units (:class:`UnitVocab`), field after field."""

    texts: tuple[str, ...]
    meta: np.ndarray
    unit_ids: np.ndarray


def pack_node(node: PreparedNode, vocab: UnitVocab) -> PackedNode:
    """``node`` flattened for :func:`batch_lexical_scores`, its units numbered by ``vocab``."""
    fields = node.fields
    kinds = [0] * len(node.primary) + [1] * len(node.secondary) + [2] * (node.joined is not None)
    meta = np.array(
        [(k, f.length >= 2, len(f.units), len(f.text)) for k, f in zip(kinds, fields, strict=True)], dtype=np.intp
    ).reshape(len(fields), 4)
    ids = np.array(vocab.ids_of([u for f in fields for u in f.units]), dtype=np.intp)
    return PackedNode(tuple(f.text for f in fields), meta, ids)


def batch_lexical_scores(nodes: Sequence[PackedNode | None], sources: LexicalSources, vocab: UnitVocab) -> np.ndarray:
    """``prepared_lexical_score`` of every node (0 for None), float64 (len(nodes),), bit for bit.

    The per-(source, field) loop of :func:`_prepared_match` done for all fields of all nodes at once:

    * unit overlap ``overlap · |units(s) ∩ units(f)| / |units(s)|``: a (sources × vocabulary) membership table
      looked up at every unit id of every field, counted per field by a cumulative sum (same float operations,
      in the same order, as the scalar form);
    * ``s`` inside ``f``: ``str.find`` of each source in all field texts joined by line feeds (no normalised
      text holds one, so a hit lies inside one field); ``f`` inside ``s`` (equality included): one containment
      test per field against the sources joined by line feeds, then per source only for the few fields found.

    Equality needs no separate pass beyond that: an equal source is a containing one. Every value is ≥ 0, so
    the maxima equal the scalar ``if value > best`` chain. ``nodes`` must come from :func:`pack_node` with this
    ``vocab`` and the same ``reference`` mode as ``sources``.
    """
    m = len(nodes)
    out = np.zeros(m)
    items = sources.items
    # map/chain/compress instead of comprehensions: a few hundred nodes and fields, iterated at C speed.
    rows = [r for r, p in enumerate(nodes) if p is not None]
    packs: list[PackedNode] = list(filter(None, nodes))
    field_texts = list(map(_TEXTS, packs))
    texts = list(itertools.chain.from_iterable(field_texts))
    n_fields = len(texts)
    if not items or n_fields == 0:
        return out
    owner = np.repeat(np.array(rows, dtype=np.intp), list(map(len, field_texts)))
    meta = np.concatenate(list(map(_META, packs)))
    kinds, long, counts, char_len = meta[:, 0], meta[:, 1].astype(bool), meta[:, 2], meta[:, 3]
    uids = np.concatenate(list(map(_UNIT_IDS, packs)))
    n_src = len(items)

    # Unit overlap counts, (sources × fields): which units of each field a source has, summed per field.
    size = int(uids.max()) + 1 if uids.size else 0
    field_of_unit = np.repeat(np.arange(n_fields), counts)
    shared = np.zeros((n_src, n_fields))
    for s, src in enumerate(items):
        member = np.zeros(size + 1, dtype=bool)
        member[[i for i in vocab.known(src.units) if i < size]] = True
        shared[s] = np.bincount(field_of_unit, weights=member[uids], minlength=n_fields)  # exact small integers
    n_units = np.array([len(src.units) for src in items], dtype=np.float64)
    # overlap · count / |units(s)|, evaluated left to right as in _prepared_match; a source without units has
    # no shared unit (0 / 1 = 0).
    value = (_KIND_OVERLAP[kinds] * shared) / np.where(n_units > 0, n_units, 1.0)[:, None]

    # Containment and equality, (sources × fields).
    contains = np.zeros((n_src, n_fields), dtype=bool)
    equal = np.zeros((n_src, n_fields), dtype=bool)
    joined = "\n".join(texts)
    starts: list[int] | None = None  # offset of each field in ``joined``, computed on the first hit
    for s, src in enumerate(items):
        pos = joined.find(src.text)
        while pos >= 0:
            if starts is None:
                starts = list(itertools.accumulate(map(_LEN_PLUS_ONE, texts), initial=0))
            f = bisect.bisect_right(starts, pos) - 1
            contains[s, f] = True
            pos = joined.find(src.text, starts[f + 1])
    # A field inside a source is at most as long as the longest source: only those fields are tested.
    short = np.flatnonzero(char_len <= max(len(src.text) for src in items)).tolist()
    for f in itertools.compress(short, map(sources.haystack.__contains__, [texts[f] for f in short])):
        text = texts[f]
        for s, src in enumerate(items):
            if text in src.text:
                contains[s, f] = True
                equal[s, f] = text == src.text
    src_long = np.array([src.length >= 2 for src in items], dtype=bool)
    includes = contains & src_long[:, None] & long[None, :]
    value = np.maximum(value, np.where(includes, _KIND_INCLUDES[kinds], 0.0))
    value = np.maximum(value, np.where(equal, _KIND_EXACT[kinds], 0.0))
    best = np.minimum(1.0, value.max(axis=0))

    # Per node and kind: the best field, then the combination of lexical_score.
    by_kind = np.zeros((m, 3))
    np.maximum.at(by_kind, (owner, kinds), best)
    p, s_, t = by_kind[:, 0], by_kind[:, 1], by_kind[:, 2]
    combined = 0.75 * p + 0.35 * s_ + 0.2 * t
    out = np.minimum(1.0, np.maximum(np.maximum(p, 0.82 * s_), np.maximum(0.7 * t, combined)))
    return out
