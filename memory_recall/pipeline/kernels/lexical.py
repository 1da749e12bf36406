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
* :class:`PackedFieldTable` ``(n, max_nodes)`` — the same, for nodes packed once into flat per-graph arrays:
  ``table.scores(keys, sources, prepare) -> (m,) float64`` packs the nodes it has not seen (``prepare(key)``
  gives their :class:`PreparedNode`) and gathers the batch's fields by indexing, bit for bit the same scores.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from memory_recall.heap import mapped_zeros
from memory_recall.text.normalize import js_len, normalize_lexical

__all__ = [
    "LexicalSources",
    "PackedFieldTable",
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
# A character of a bigram class; without one, _EXT_TOKEN's runs are exactly _EXT_SPACED_RUN's.
_EXT_BIGRAM_CHAR = re.compile(f"[{_CJK}{_KANA}{_HANGUL}]")
_EXT_SPACED_RUN = re.compile(f"[{_LATIN}]+|[{_CYRILLIC}]+")


def _js_len(text: str) -> int:
    """:func:`~memory_recall.text.normalize.js_len`, without its per-character loop for ASCII text."""
    return len(text) if text.isascii() else js_len(text)


def _normalise(text: object, reference: bool) -> str:
    if text is None:
        return ""
    if reference:
        return normalize_lexical(text)
    text = str(text)
    # NFKC leaves ASCII text as it is.
    return normalize_lexical(text if text.isascii() else unicodedata.normalize("NFKC", text))


def _add_run(out: dict[str, None], token: str, bigrams: bool) -> None:
    if _js_len(token) >= 2:
        out[token] = None
    if bigrams and len(token) > 2:
        for i in range(len(token) - 1):
            out[token[i : i + 2]] = None


#: Units of normalised texts remembered across calls: the query sources of every recall and the fields of nodes being
#: packed. Each is kept once in a field table carried along the snapshots, so repeats are rare. Every new or edited
#: text adds an entry (about 1.3 kB), so the bound is memory that writes fill: at 8,192 the service under edits alone
#: still grew 2.5 MiB a minute after four minutes; at 2,048 its trend was within noise of zero (docs/performance.md).
_UNIT_TEXTS = 2048


@functools.lru_cache(maxsize=_UNIT_TEXTS)
def _units_of_normalised(norm: str, reference: bool) -> tuple[str, ...]:
    out: dict[str, None] = {}  # insertion-ordered set: dedupe keeping first occurrence
    if reference:
        for m in _REF_TOKEN.finditer(norm):
            tok = m.group(0)
            _add_run(out, tok, _REF_CJK.fullmatch(tok) is not None)
    elif _EXT_BIGRAM_CHAR.search(norm) is None:
        # Only Latin and Cyrillic runs, of BMP characters (JS length = length): every run of two or more
        # characters is a unit, as _add_run would add it, without a Python call per run.
        return tuple(dict.fromkeys(t for t in _EXT_SPACED_RUN.findall(norm) if len(t) >= 2))
    else:
        _extended_runs(out, norm)
    return tuple(out)


def _extended_runs(out: dict[str, None], norm: str) -> None:
    """The extended units of ``norm``, added to ``out`` run by run (any text)."""
    for m in _EXT_TOKEN.finditer(norm):
        _add_run(out, m.group(0), m.lastindex in _BIGRAM_GROUPS)


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

    @functools.cached_property
    def signature(self) -> int:
        """:func:`_bigram_signature` of the source texts."""
        return _bigram_signature(self.haystack)


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
            items.append(PreparedField(s, _js_len(s), frozenset(_units_of_normalised(s, reference))))
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
    return PreparedField(f, _js_len(f), frozenset(_units_of_normalised(f, reference)))


#: Field signatures remembered across calls (a pure function of the text; an int each), bounded like the units.
_PREPARED_TEXTS = _UNIT_TEXTS
#: Prepared nodes remembered across calls: pure functions of the texts, with immutable results. They serve a field
#: table built afresh (a table carried over a snapshot delta keeps its packed rows, and repacks only the rewritten
#: nodes, whose texts were prepared moments before) and the repeats within a batch. A prepared node holds a frozen
#: set of unit strings per field, about 8 KB for a chat turn; the cache fills with every new or edited text, so its
#: bound is what the service holds for it under a stream of writes: 8 MB here (at 8,192 it was 64 MB, filled over
#: hours of chat, and the load's memory rose with it).
_PREPARED_NODES = 1024


def prepare_node(
    primary_texts: Sequence[str], secondary_texts: Sequence[str], *, reference: bool = False
) -> PreparedNode:
    """The fields :func:`lexical_score` reads, prepared once: scoring a prepared node against any sources
    (:func:`prepared_lexical_score`) gives exactly ``lexical_score(primary_texts, secondary_texts, sources)``.
    Empty fields are dropped (their match is 0). Nodes of plain strings are remembered (:func:`_prepare_texts`):
    the returned node may be shared between calls, never modify it."""
    if all(type(t) is str for t in itertools.chain(primary_texts, secondary_texts)):
        return _prepare_texts(tuple(primary_texts), tuple(secondary_texts), reference)
    return _prepare_node(primary_texts, secondary_texts, reference)


@functools.lru_cache(maxsize=_PREPARED_NODES)
def _prepare_texts(primary_texts: tuple[str, ...], secondary_texts: tuple[str, ...], reference: bool) -> PreparedNode:
    return _prepare_node(primary_texts, secondary_texts, reference)


def _prepare_node(primary_texts: Sequence[object], secondary_texts: Sequence[object], reference: bool) -> PreparedNode:
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
_SIGNATURE_BITS = (1 << 63) - 1


_TEXTS = operator.attrgetter("texts")
_META = operator.attrgetter("meta")
_UNIT_IDS = operator.attrgetter("unit_ids")


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


def _field_rows(node: PreparedNode) -> list[tuple[int, int, int, int]]:
    """The :attr:`PackedNode.meta` rows of ``node``'s fields: kind, JS length ≥ 2, unit count, length."""
    kinds = [0] * len(node.primary) + [1] * len(node.secondary) + [2] * (node.joined is not None)
    return [(k, int(f.length >= 2), len(f.units), len(f.text)) for k, f in zip(kinds, node.fields, strict=True)]


def _node_units(node: PreparedNode) -> list[str]:
    """The units of ``node``'s fields, field after field (a unit repeats when several fields hold it)."""
    return [u for f in node.fields for u in f.units]


#: Field texts up to this many code points get a bigram signature (longer ones: 0, never ruled out by it).
_SIGNED_LENGTH = 64


def _bigram_signature(text: str) -> int:
    """A 63-bit set of the character bigrams of ``text`` (bit ``(31·ord(a) + ord(b)) mod 63``): a text inside
    another has a signature inside the other's, so ``sig(f) & ~sig(s) != 0`` proves ``f`` is not inside ``s``."""
    sig = 0
    for a, b in set(itertools.pairwise(text)):
        sig |= 1 << ((31 * ord(a) + ord(b)) % 63)
    return sig


@functools.lru_cache(maxsize=_PREPARED_TEXTS)
def _field_signature(text: str) -> int:
    """:func:`_bigram_signature` of a field text short enough to be inside a query source, else 0."""
    return _bigram_signature(text) if len(text) <= _SIGNED_LENGTH else 0


def pack_node(node: PreparedNode, vocab: UnitVocab) -> PackedNode:
    """``node`` flattened for :func:`batch_lexical_scores`, its units numbered by ``vocab``."""
    fields = node.fields
    meta = np.array(_field_rows(node), dtype=np.intp).reshape(len(fields), 4)
    ids = np.array(vocab.ids_of(_node_units(node)), dtype=np.intp)
    return PackedNode(tuple(f.text for f in fields), meta, ids)


def batch_lexical_scores(nodes: Sequence[PackedNode | None], sources: LexicalSources, vocab: UnitVocab) -> np.ndarray:
    """``prepared_lexical_score`` of every node (0 for None), float64 (len(nodes),), bit for bit.

    The per-(source, field) loop of :func:`_prepared_match` done for all fields of all nodes at once
    (:func:`_flat_scores`). ``nodes`` must come from :func:`pack_node` with this ``vocab`` and the same
    ``reference`` mode as ``sources``. :class:`PackedFieldTable` does the same for nodes it keeps packed flat.
    """
    m = len(nodes)
    packs: list[PackedNode] = list(filter(None, nodes))
    texts = list(itertools.chain.from_iterable(map(_TEXTS, packs)))
    if not sources.items or not texts:
        return np.zeros(m)
    text_ids: dict[str, int] = {}
    extra = np.array([(text_ids.setdefault(t, len(text_ids)), _field_signature(t)) for t in texts], dtype=np.int64)
    return _flat_scores(
        np.fromiter((0 if p is None else len(p.texts) for p in nodes), dtype=np.intp, count=m),
        np.hstack([np.concatenate(list(map(_META, packs))), extra]),
        np.concatenate(list(map(_UNIT_IDS, packs))),
        "\n".join(texts),
        list(text_ids),
        sources,
        vocab,
    )


def _flat_scores(
    fcount: np.ndarray,
    meta: np.ndarray,
    uids: np.ndarray,
    joined: str,
    texts: Sequence[str],
    sources: LexicalSources,
    vocab: UnitVocab,
) -> np.ndarray:
    """``prepared_lexical_score`` of ``m = len(fcount)`` nodes given flat, float64 (m,): node ``r`` owns the next
    ``fcount[r]`` fields. Per field, ``meta`` (fields × 6, int64) holds the four :attr:`PackedNode.meta` columns,
    the position of its text in ``texts`` (equal texts may share one) and its :func:`_field_signature`; ``uids``
    are the unit ids (``vocab``) of every field, field after field, and ``joined`` the field texts joined by line
    feeds. ``sources`` must be non-empty.

    * unit overlap ``overlap · |units(s) ∩ units(f)| / |units(s)|``: one lookup over all unit ids gives, per
      unit, the distinct source unit sets holding it (a bit mask); the units some source holds are then counted
      per field and unit set (exact small integers; the same float operations, in the same order, as the scalar
      form);
    * ``s`` inside ``f``: ``str.find`` of each source in ``joined`` (no normalised text holds a line feed, so a
      hit lies inside one field), skipped for a source holding one found nowhere; ``f`` inside ``s`` (equality
      included): only fields no longer than the longest source and whose bigrams all occur in the sources
      (signatures) are tested, against the sources joined by line feeds, then per source for the fields found.

    Every value is ≥ 0 and a field's best is the maximum over sources of the overlap, includes and exact values,
    so it equals the scalar ``if value > best`` chain; sources with equal unit sets have equal overlaps.
    """
    m = fcount.shape[0]
    items = sources.items
    kinds, char_len = meta[:, 0], meta[:, 3]

    # Unit overlap, per distinct source unit set (a question and its intent segment often have the same units:
    # equal sets give equal values), best over the sets.
    unit_sets = list(dict.fromkeys(src.units for src in items))
    shared = _shared_units(unit_sets, meta[:, 2], uids, vocab)
    n_units = np.array([len(units) for units in unit_sets], dtype=np.float64)
    # overlap · count / |units(s)|, evaluated left to right as in _prepared_match; a source without units has
    # no shared unit (0 / 1 = 0).
    if len(unit_sets) == 1:
        best = (_KIND_OVERLAP[kinds] * shared[0]) / (float(n_units[0]) or 1.0)
    else:
        best = ((_KIND_OVERLAP[kinds] * shared) / np.where(n_units > 0, n_units, 1.0)[:, None]).max(axis=0)

    # Containment and equality: the fields some source is inside (when both JS lengths are ≥ 2) and the fields
    # equal to a source; each raises its field's best to the kind's includes / exact weight.
    includes: list[int] = []
    equal: list[int] = []
    starts: list[int] | None = None  # offset of each field in ``joined``, computed on the first hit
    absent: list[str] = []  # sources found nowhere: a source holding one is found nowhere either
    for src in sorted(items, key=lambda item: len(item.text)):
        if any(text in src.text for text in absent):
            continue
        pos = joined.find(src.text)
        if pos < 0:
            absent.append(src.text)
        while pos >= 0:
            if starts is None:
                starts = [0, *np.cumsum(char_len + 1).tolist()]
            f = bisect.bisect_right(starts, pos) - 1
            if src.length >= 2:
                includes.append(f)
            pos = joined.find(src.text, starts[f + 1])
    haystack = sources.haystack
    outside = ~sources.signature & _SIGNATURE_BITS  # bigrams no source holds
    maybe = np.flatnonzero(((meta[:, 5] & outside) == 0) & (char_len <= max(len(src.text) for src in items)))
    for f, t in zip(maybe.tolist(), meta[maybe, 4].tolist(), strict=True):
        text = texts[t]
        if text in haystack:
            for src in items:
                if text in src.text:
                    if src.length >= 2:
                        includes.append(f)
                    if text == src.text:
                        equal.append(f)
    if includes:
        found = np.array(includes)
        found = found[meta[found, 1] != 0]  # the field's JS length ≥ 2 too
        best[found] = np.maximum(best[found], _KIND_INCLUDES[kinds[found]])
    if equal:
        found = np.array(equal)
        best[found] = np.maximum(best[found], _KIND_EXACT[kinds[found]])
    best = np.minimum(1.0, best)

    # Per node and kind: the best field, then the combination of lexical_score.
    by_kind = np.zeros((m, 3))
    np.maximum.at(by_kind, (np.repeat(np.arange(m), fcount), kinds), best)
    p, s_, t_ = by_kind[:, 0], by_kind[:, 1], by_kind[:, 2]
    combined = 0.75 * p + 0.35 * s_ + 0.2 * t_
    return np.minimum(1.0, np.maximum(np.maximum(p, 0.82 * s_), np.maximum(0.7 * t_, combined)))


def _shared_units(
    unit_sets: Sequence[frozenset[str]], counts: np.ndarray, uids: np.ndarray, vocab: UnitVocab
) -> np.ndarray:
    """(sets × fields) float64: how many units of each field (``counts[f]`` unit ids each, consecutive in
    ``uids``) each unit set holds. One lookup over all unit ids marks the units some set holds (a bit per set,
    sets in groups of 62); only those are counted per field."""
    shared = np.zeros((len(unit_sets), counts.shape[0]))
    ends: np.ndarray | None = None  # end of each field's units in ``uids``
    for first in range(0, len(unit_sets), 62):
        group = unit_sets[first : first + 62]
        if len(group) == 1:
            ids = vocab.known(group[0])
            if not ids:
                continue
            member = np.zeros(len(vocab), dtype=bool)
            member[ids] = True
            hits = np.flatnonzero(member[uids])
        else:
            mask: dict[int, int] = {}
            for bit, units in enumerate(group):
                for i in vocab.known(units):
                    mask[i] = mask.get(i, 0) | (1 << bit)
            if not mask:
                continue
            lookup = np.zeros(len(vocab), dtype=np.int64)
            lookup[list(mask)] = list(mask.values())
            code = lookup[uids]
            hits = np.flatnonzero(code)
            code = code[hits]
        if ends is None:
            ends = np.cumsum(counts)
        field = np.searchsorted(ends, hits, side="right")
        if len(group) == 1:
            shared[first] = np.bincount(field, minlength=counts.shape[0])
        else:
            for bit in range(len(group)):
                shared[first + bit] = np.bincount(field, weights=(code >> bit) & 1, minlength=counts.shape[0])
    return shared


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions ``starts[r] … starts[r] + counts[r] − 1`` of every ``r``, concatenated."""
    ends = np.cumsum(counts)
    total = int(ends[-1]) if ends.size else 0
    return np.arange(total, dtype=np.intp) + np.repeat(starts - (ends - counts), counts)


#: Row buffers of a :class:`PackedFieldTable` at least this large get their own mapping (:func:`~memory_recall.heap.
#: mapped_zeros`). Under the service's chat-turn load (16 clients, a 2,000-message chat) the tables of the snapshots
#: a write leaves behind copy their buffers whenever a recall on them packs a node: 600 new buffers in 40 s, most
#: of 100–500 KiB, each alive until its snapshot goes. In glibc's heaps (its mmap threshold rises to the largest
#: mapped block freed) each leaves a hole that smaller blocks then split; mapped, they go back to the system when
#: freed, and their spare rows are resident only once written. Measured side by side (seven runs each), the
#: service ended the load 1.9 MiB lower on average; the RSS trend over the load's second half did not change.
GROWN_MAPPED_MIN_BYTES = 64 << 10


def _grown(arr: np.ndarray, used: int, extra: int, *, copy: bool = False) -> np.ndarray:
    """``arr`` if it has room for ``used + extra`` rows (and ``copy`` is False), else a larger copy of its first
    ``used`` rows (room for twice ``used + extra``, so appending is amortised O(1) per row). Never changes
    ``arr``'s existing rows."""
    need = used + extra
    if need <= arr.shape[0] and not copy:
        return arr
    # Sized from the rows in use, not from ``arr``'s capacity: a copy of a shared buffer sized from its capacity
    # would double the capacity on every copy, and tables remapped from one another copy again and again.
    # Mapped from GROWN_MAPPED_MIN_BYTES on: see there.
    out = mapped_zeros((max(2 * need, 256), *arr.shape[1:]), arr.dtype, GROWN_MAPPED_MIN_BYTES)
    out[:used] = arr[:used]
    return out


#: Dead slots a remapped :class:`PackedFieldTable` may hold before it is compacted (when they also outnumber the
#: live ones): below this the copy is not worth it.
MIN_COMPACT_DEAD = 1024


class PackedFieldTable:
    """The lexical fields of the nodes ``0 … n − 1`` of one graph, packed once per node (as :func:`pack_node`)
    into flat arrays, so that :meth:`scores` gathers a batch's fields with a few array indexings. Meant to live
    with a graph snapshot (its fields never change).

    Nodes are packed on first use, from ``prepare(key)`` (the node's :class:`PreparedNode`; None when it has no
    lexical text, which scores 0). At most ``max_nodes`` slots are kept, or one batch when it is larger: a
    batch that would pass the bound empties the table first (the vocabulary stays: ids only need to be
    consistent, not dense). Thread-safe; stored rows are never changed in place, so a batch scores from the
    arrays it saw even when another thread packs more nodes or empties the table meanwhile.

    A table for the next version of the graph (:meth:`remapped`) shares this one's packed rows instead of copying
    them: the row buffers are appended to in place only by the one table that owns them (ownership passes to the
    newest table; any other copies its rows before it next packs), the field texts are interned in one list shared
    by the tables of a lineage (append-only, under their shared lock), and a slot whose node is gone or changed is
    left dead (it still counts against ``max_nodes``: it still holds its rows). A remapped table whose dead slots
    outnumber its live ones (and :data:`MIN_COMPACT_DEAD`) is compacted: the live slots' rows copied into buffers of
    its own, so a lineage carried over many writes holds at most about twice its live rows, whatever ``max_nodes``.

    Memory per kept node: its field rows (6 ints each, a few fields), its unit ids (tens of ints), its field
    texts joined by line feeds, and each distinct field text once; plus one int per graph node (its slot).
    """

    def __init__(self, n: int, max_nodes: int) -> None:
        self.vocab = UnitVocab()
        self.max_nodes = max_nodes
        self._n = n
        self._lock = threading.Lock()
        self._empty()

    def _empty(self) -> None:
        # New objects, never cleared in place (see the class docstring).
        self._slot = np.full(self._n, -1, dtype=np.intp)  # node → slot, −1 when not packed
        self._keys = np.zeros(0, dtype=np.intp)  # slot → node (−1: a dead slot), the first _n_slots entries
        self._n_slots = 0
        self._dead = 0  # dead slots among the first _n_slots
        self._nodes = np.zeros((0, 4), dtype=np.intp)  # per slot: first field, field count, first unit, unit count
        # Per field: the PackedNode.meta columns, its text id and its signature (_field_signature).
        self._fields = np.zeros((0, 6), dtype=np.int64)
        self._units = np.zeros(0, dtype=np.int32)  # unit ids (a vocabulary never reaches 2³¹ units)
        self._haystacks: list[str] = []  # per slot: its field texts joined by line feeds ("" without fields)
        self._text_ids: dict[str, int] = {}
        self._texts: list[str] = []  # per text id
        self._n_fields = 0
        self._n_units = 0
        self._owns = True  # may append to the row buffers and _haystacks in place (class docstring)

    def __len__(self) -> int:
        return self._n_slots - self._dead

    def keys(self) -> list[int]:
        """The packed nodes, in packing order."""
        keys = self._keys[: self._n_slots]
        return keys[keys >= 0].tolist()  # type: ignore[no-any-return]

    def field_texts(self, key: int) -> tuple[str, ...] | None:
        """The packed field texts of node ``key`` (:attr:`PreparedNode.fields` order; empty for a node without
        lexical text), None when it is not packed."""
        with self._lock:
            slot = int(self._slot[key])
            if slot < 0:
                return None
            first, count = int(self._nodes[slot, 0]), int(self._nodes[slot, 1])
            return tuple(self._texts[t] for t in self._fields[first : first + count, 4].tolist())

    def carried(self, n: int, old: np.ndarray, new: np.ndarray) -> PackedFieldTable:
        """A table for a graph of ``n`` nodes whose node ``new[j]`` has the same lexical fields as this table's
        node ``old[j]`` (the nodes a graph update kept unchanged): those packed here are packed there (their rows
        shared, see :meth:`remapped`); any other node is packed on first use. O(n) in numpy."""
        remap = np.full(self._n, -1, dtype=np.intp)
        remap[np.asarray(old, dtype=np.intp)] = np.asarray(new, dtype=np.intp)
        return self.remapped(n, remap)

    def remapped(self, n: int, remap: np.ndarray, changed: np.ndarray | None = None) -> PackedFieldTable:
        """A table for a graph of ``n`` nodes in which this table's node ``i`` is node ``remap[i]`` (−1: gone,
        ``remap`` of length this table's ``n``) with the same lexical fields, except the nodes at ``changed``
        (positions in the new graph): the packed rows of the others are shared, in place (no row is copied: see
        the class docstring), and the new table owns the row buffers from now on; any other node is packed on
        first use. The vocabulary and the interned texts are shared, so unit and text ids stay comparable.
        O(packed slots + len(changed)) in numpy, plus an (n,) slot array."""
        remap = np.asarray(remap, dtype=np.intp)
        if remap.shape != (self._n,):
            raise ValueError(f"The 'remap' parameter must have shape ({self._n},). Got {remap.shape} instead.")
        changed = np.zeros(0, dtype=np.intp) if changed is None else np.asarray(changed, dtype=np.intp)
        out = PackedFieldTable.__new__(PackedFieldTable)
        out.vocab, out.max_nodes, out._n, out._lock = self.vocab, self.max_nodes, n, self._lock
        with self._lock:
            k = self._n_slots
            keys = self._keys[:k]
            new_keys = np.full(k, -1, dtype=np.intp)
            live = np.flatnonzero(keys >= 0)
            new_keys[live] = remap[keys[live]]
            slot = np.full(n, -1, dtype=np.intp)
            at = np.flatnonzero(new_keys >= 0)
            slot[new_keys[at]] = at
            if changed.size:
                gone = slot[changed]
                new_keys[gone[gone >= 0]] = -1
                slot[changed] = -1
            out._slot, out._keys, out._n_slots = slot, new_keys, k
            out._dead = k - int(np.count_nonzero(new_keys >= 0))
            out._nodes, out._fields, out._units = self._nodes, self._fields, self._units
            out._haystacks, out._texts, out._text_ids = self._haystacks, self._texts, self._text_ids
            out._n_fields, out._n_units = self._n_fields, self._n_units
            out._owns, self._owns = self._owns, False
            if out._dead > max(k - out._dead, MIN_COMPACT_DEAD):
                out._compact()
        return out

    def _compact(self) -> None:
        # Under the lock: the live slots' rows gathered into new buffers this table owns (the shared ones are only
        # read: the other tables of the lineage keep theirs), their field texts interned anew. O(live rows).
        keys = self._keys[: self._n_slots]
        live = np.flatnonzero(keys >= 0)
        rows = self._nodes[live]
        fields = self._fields[_ranges(rows[:, 0], rows[:, 1])]
        unit_rows = _ranges(rows[:, 2], rows[:, 3])
        text_ids, fields[:, 4] = np.unique(fields[:, 4], return_inverse=True)
        self._texts = [self._texts[t] for t in text_ids.tolist()]
        self._text_ids = {t: i for i, t in enumerate(self._texts)}
        rows[:, 0] = np.cumsum(rows[:, 1]) - rows[:, 1]
        rows[:, 2] = np.cumsum(rows[:, 3]) - rows[:, 3]
        self._nodes, self._fields, self._units = rows, fields, self._units[unit_rows]
        self._haystacks = [self._haystacks[i] for i in live.tolist()]
        self._keys = keys[live]
        self._slot = np.full(self._n, -1, dtype=np.intp)
        self._slot[self._keys] = np.arange(live.size, dtype=np.intp)
        self._n_slots, self._dead = int(live.size), 0
        self._n_fields, self._n_units = int(fields.shape[0]), int(unit_rows.size)
        self._owns = True

    def _pack(self, keys: list[int], prepared: list[PreparedNode | None]) -> None:
        # Under the lock: append the nodes' rows, then publish their slots.
        n_slots = self._n_slots
        if not self._owns:  # the buffers are another table's now: append to copies of this table's rows
            self._haystacks = self._haystacks[:n_slots]
        node_rows: list[tuple[int, int, int, int]] = []
        field_rows: list[tuple[int, ...]] = []
        units: list[str] = []
        text_ids, texts = self._text_ids, self._texts
        for node in prepared:
            if node is None:
                node_rows.append((self._n_fields + len(field_rows), 0, self._n_units + len(units), 0))
                self._haystacks.append("")
                continue
            node_units = _node_units(node)
            rows = _field_rows(node)
            node_rows.append(
                (self._n_fields + len(field_rows), len(rows), self._n_units + len(units), len(node_units))
            )
            for row, f in zip(rows, node.fields, strict=True):
                tid = text_ids.get(f.text)
                if tid is None:
                    tid = text_ids[f.text] = len(texts)
                    texts.append(f.text)
                field_rows.append((*row, tid, _field_signature(f.text)))
            units.extend(node_units)
            self._haystacks.append(node.haystack)
        copy = not self._owns
        self._nodes = _grown(self._nodes, n_slots, len(keys), copy=copy)
        self._nodes[n_slots : n_slots + len(keys)] = np.array(node_rows, dtype=np.intp).reshape(-1, 4)
        self._fields = _grown(self._fields, self._n_fields, len(field_rows), copy=copy)
        self._fields[self._n_fields : self._n_fields + len(field_rows)] = np.array(
            field_rows, dtype=np.int64
        ).reshape(-1, 6)
        self._units = _grown(self._units, self._n_units, len(units), copy=copy)
        self._units[self._n_units : self._n_units + len(units)] = self.vocab.ids_of(units)
        self._owns = True
        self._n_fields += len(field_rows)
        self._n_units += len(units)
        self._keys = _grown(self._keys, n_slots, len(keys))
        self._keys[n_slots : n_slots + len(keys)] = keys
        self._n_slots += len(keys)
        self._slot[keys] = np.arange(n_slots, n_slots + len(keys), dtype=np.intp)

    def scores(
        self, keys: np.ndarray, sources: LexicalSources, prepare: Callable[[int], PreparedNode | None]
    ) -> np.ndarray:
        """:func:`prepared_lexical_score` of the nodes ``keys`` (node indices in ``[0, n)``, repeats allowed)
        against ``sources``, float64 (len(keys),), bit for bit; nodes not packed yet are packed first (none
        when ``sources`` is empty: every score is then 0). ``prepare`` must use the ``reference`` mode of
        ``sources``, the same on every call for a given table."""
        keys = np.asarray(keys, dtype=np.intp)
        m = keys.size
        if not sources.items or m == 0:
            return np.zeros(m)
        with self._lock:
            slots = self._slot[keys]
            if (slots < 0).any():
                missing = list(dict.fromkeys(keys[slots < 0].tolist()))
                if self._n_slots + len(missing) > self.max_nodes:
                    self._empty()
                    missing = list(dict.fromkeys(keys.tolist()))
                self._pack(missing, [prepare(k) for k in missing])
                slots = self._slot[keys]
            nodes, fields, units = self._nodes, self._fields, self._units
            texts, haystacks = self._texts, self._haystacks
        rows = nodes[slots]
        fcount = rows[:, 1]
        meta = fields[_ranges(rows[:, 0], fcount)]
        if meta.shape[0] == 0:
            return np.zeros(m)
        return _flat_scores(
            fcount,
            meta,
            units[_ranges(rows[:, 2], rows[:, 3])],
            "\n".join(filter(None, map(haystacks.__getitem__, slots.tolist()))),
            texts,
            sources,
            self.vocab,
        )
