"""The one tokenizer of the BM25 (SQLite FTS5) channel, used for index terms and query terms alike.

Contract (recall-spec "BM25 channel" and departure 8; seed ``lwc-retrieval-and-indexing`` "分词")::

    index_terms("Café 钟楼入口")  == ["café", "cafe", "钟", "楼", "入", "口", "钟楼", "楼入", "入口"]
    query_terms("cafe 钟楼入口")  == ["cafe", "钟楼", "楼入", "入口"]
    fts_match_expression(["cafe", 'a"b']) == '"cafe" OR "a""b"'

* Text is NFKC-normalised and case-folded first (full-width letters, ligatures and ``ß`` fold the
  way users expect).
* **Words.** Letters, digits and combining marks of every script except CJK/kana form words on
  whitespace/punctuation boundaries: Latin, Greek, Cyrillic, Hangul (Korean is space-separated),
  Arabic, Indic. The underscore separates (``snake_case`` → ``snake``, ``case``).

  - *Accents.* The index stores a word as written **and** accent-stripped (``café`` → ``café``,
    ``cafe``); a query uses only the stripped form, so ``cafe`` and ``café`` find each other.
    Stripping drops the combining diacritical marks after canonical decomposition (so ``ё`` → ``е``
    and ``й`` → ``и`` as well).
  - *Apostrophes* (``'``, ``’``, ``ʼ``) between letters do not split. A trailing possessive ``'s``
    is dropped (``caroline's`` → ``caroline``, ``it's`` → ``it``, a stop word); any other apostrophe
    is removed (``don't`` → ``dont``, ``o'brien`` → ``obrien``), so the word typed without the
    apostrophe still matches.
  - *Numbers.* A ``.`` between digits is kept (``3.14``, ``1.2.3`` stay one term); a ``,`` between a
    digit and exactly three digits is a thousands separator and is removed (``1,000`` → ``1000``);
    any other ``,`` splits (``3,5`` → ``3``, ``5``).
* **CJK.** A maximal run of ideographs (URO, Ext-A … Ext-H, compatibility ideographs, ``々〆〇``)
  and Japanese kana (hiragana, katakana with ``ー``, half-width katakana via NFKC) is one run; kanji
  and kana share a run, so a Japanese phrase also yields its cross-script bigrams. The index stores
  every unigram, then every adjacent bigram of a run; a query uses the adjacent bigrams, or the
  unigram when the run is a single character.
* **Stop words.** A small fixed English and Chinese list (:data:`STOP_WORDS`) is dropped from the
  index *and* from queries (dropping both keeps "every query term is an index term" true and the
  index smaller). A word is checked in its accent-stripped form.
* **Queries** are deduplicated in first-occurrence order and cut to ``max_terms`` (64 by default,
  the seed's limit). Only punctuation or only stop words → ``[]``.
* **Index terms** are *not* deduplicated: repeated terms are the term frequencies BM25 scores with.

The terms go to FTS5 pre-tokenized (joined by single spaces); :data:`FTS5_TOKENIZE_CLAUSE` is the
table option that keeps each of them one FTS token. :func:`fts_match_expression` quotes every term,
so user text is never parsed as FTS5 syntax. Bump :data:`TOKENIZER_VERSION` whenever the terms
produced for some text change; the store rebuilds an index built by another version.

Cost: linear in the text; every scan is a precompiled regex and the Python work is per term, not per
character (about 10k messages of 100-300 characters indexed and queried per second).
"""

from __future__ import annotations

import re
import unicodedata

from memory_recall.errors import InputError

__all__ = [
    "CJK_CHARS",
    "DEFAULT_MAX_QUERY_TERMS",
    "FTS5_TOKENIZE_CLAUSE",
    "STOP_WORDS",
    "TOKENIZER_VERSION",
    "fts_match_expression",
    "index_terms",
    "normalize_for_terms",
    "query_terms",
]

#: Version of the term rules; stored with the FTS index so an index built by other rules is rebuilt.
TOKENIZER_VERSION = 1

#: Seed "分词": document and span search accept at most 64 retrievable terms.
DEFAULT_MAX_QUERY_TERMS = 64

#: FTS5 table option for the pre-tokenized columns: append it to the column list of
#: ``CREATE VIRTUAL TABLE … USING fts5(col, …, <clause>)``.
#:
#: Why this tokenizer: a column holds our terms joined by spaces, so FTS5 must split on spaces only
#: and keep every term one token. ``unicode61`` whose token ``categories`` are letters, numbers,
#: marks, punctuation, symbols, private-use and unassigned code points splits only on separators
#: (``Z*``) and controls: CJK uni-/bigrams, ``café`` and ``3.14`` each stay one FTS token, so BM25
#: counts exactly our terms. ``remove_diacritics 0`` keeps ``café`` and ``cafe`` apart (accent
#: folding is done by this module). Rejected: ``ascii`` keeps non-ASCII runs whole but splits
#: ``3.14``; the default ``unicode61`` folds diacritics and splits ``3.14`` too; ``trigram`` defeats
#: pre-tokenizing. A quoted query term goes through the same tokenizer, and unicode61's case folding
#: is a no-op on case-folded terms, so a term always matches the same term in the index.
FTS5_TOKENIZE_CLAUSE = "tokenize = \"unicode61 remove_diacritics 0 categories 'L* N* M* P* S* Co Cn'\""

#: Body of a regex character class: the characters that form CJK runs (ideographs + kana). Shared
#: with the intent splitter. 々〆〇 and the kana combining voiced marks (NFKC turns ゛ into a space +
#: U+3099) belong to runs; the middle dot ・ (U+30FB) and ゠ separate, as in ジョン・スミス.
CJK_CHARS = (
    "\u3005-\u3007"  # 々 〆 〇
    "\u3041-\u3096\u3099-\u309a\u309d-\u309f"  # hiragana, combining voiced marks, ゝゞゟ
    "\u30a1-\u30fa\u30fc-\u30ff"  # katakana, ー ヽ ヾ ヿ
    "\u31f0-\u31ff"  # katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK Ext-A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uf900-\ufaff"  # compatibility ideographs (NFKC maps most to unified ones; the rest stay)
    "\U0001aff0-\U0001b16f"  # kana extensions and supplement (hentaigana, small kana)
    "\U00020000-\U0003ffff"  # Ext-B … Ext-H and the compatibility supplement (planes 2 and 3)
)

_ENGLISH_STOP_WORDS = (
    "a an the and or but if then than so as of to in on at by for with from into about "
    "is are was were be been am do does did have has had "
    "i me my we our you your he him his she her it its they them their "
    "this that these those there here what which who when where why how "
    "will would can could should just also very not no im dont"
)
# Unigrams are function characters; the bigrams are function words made of non-stop characters
# (什么, 怎么 …) that would otherwise be the most frequent bigrams of every chat.
_CHINESE_STOP_WORDS = (
    "的 了 是 在 和 与 及 或 我 你 他 她 它 吗 呢 吧 啊 呀 嘛 哦 也 都 就 着 之 "
    "什么 怎么 我们 你们 他们 她们 它们 这个 那个 这些 那些 这样 那样 "
    "一个 没有 就是 还是 但是 因为 所以 如果 已经"
)
#: The fixed stop-word list (English words; Chinese characters and words), dropped from index and
#: query terms alike.
STOP_WORDS: frozenset[str] = frozenset((_ENGLISH_STOP_WORDS + " " + _CHINESE_STOP_WORDS).split())

#: Code-point windows that hold every combining mark of the BMP (a test checks it against a full
#: scan); scanning them costs ~1 ms at import instead of ~30 ms for the whole BMP.
_MARK_WINDOWS = (
    (0x0300, 0x1DFF),
    (0x20D0, 0x20FF),
    (0x2CE0, 0x2DFF),
    (0x302A, 0x309A),
    (0xA600, 0xABFF),
    (0xFB1E, 0xFB1E),
    (0xFE00, 0xFE2F),
)


def _mark_class() -> str:
    """Regex class body of the combining marks (Mn, Mc, Me) of the BMP.

    Python's ``\\w`` excludes marks; without them an Indic vowel sign, or a Latin letter with a
    combining accent that has no precomposed form, would split a word.
    """
    ranges: list[tuple[int, int]] = []
    for lo, hi in _MARK_WINDOWS:
        for cp in range(lo, hi + 1):
            if unicodedata.category(chr(cp))[0] == "M":
                if ranges and ranges[-1][1] == cp - 1:
                    ranges[-1] = (ranges[-1][0], cp)
                else:
                    ranges.append((cp, cp))
    return "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges
    )


_MARKS = _mark_class()
# A word starts with a letter or digit that is not CJK/kana (those form runs) and continues with such
# characters or combining marks; starting with a letter means accent stripping never empties it.
# The explicit ranges are only a fast path (lower-case letters of Latin-1 and Latin Extended-A/B,
# Greek, Cyrillic, Hangul syllables, all inside ``[^\W_]``): the CJK-excluding lookahead costs more
# than the match itself.
_COMMON_LETTERS = "a-z0-9\u00df-\u00f6\u00f8-\u024f\u03ac-\u03ce\u0430-\u045f\uac00-\ud7a3"
_WORD_START = rf"(?:[{_COMMON_LETTERS}]|(?![{CJK_CHARS}])[^\W_])"
_WORD_CHAR = rf"(?:[{_COMMON_LETTERS}]++|(?![{CJK_CHARS}])[^\W_]|[{_MARKS}])"
_APOSTROPHES = "'\u2019\u02bc"
# Group 1: a CJK/kana run; group 2: a word, possibly joined by apostrophes, decimal points or
# thousands separators. Possessive quantifiers: a token never gives characters back, so no
# backtracking.
_TOKEN = re.compile(
    rf"([{CJK_CHARS}]++)"
    rf"|({_WORD_START}{_WORD_CHAR}*+"
    rf"(?:(?:[{_APOSTROPHES}]|(?<=\d)\.(?=\d)|(?<=\d),(?=\d{{3}}(?!\d)))"
    rf"{_WORD_START}{_WORD_CHAR}*+)*+)"
)
_POSSESSIVE = re.compile(rf"[{_APOSTROPHES}]s$")
_APOSTROPHE = re.compile(rf"[{_APOSTROPHES}]")
_BIGRAMS = re.compile(r"(?=(..))", re.DOTALL)
# Combining Diacritical Marks and its supplement/extension blocks: what accent stripping removes.
# Narrower than all marks on purpose: an Indic vowel sign is part of the word, not an accent.
_DIACRITICS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
# NUL ends an FTS5 query string early ("unterminated string"); lone surrogates cannot be encoded.
_FTS_UNSAFE = re.compile("[\x00\ud800-\udfff]")
# Characters that NFKC leaves alone and that never compose with a following character: ASCII, common
# kana, URO ideographs, Hangul syllables. A trailing jamo or mark composes with the character before
# it, so each span starts with the stable character before it. NFKC per span then equals NFKC of the
# whole text (a property test checks it), at half the cost for Chinese text.
_NFKC_STABLE = "\x00-\x7f\u3041-\u3096\u30a1-\u30fa\u4e00-\u9fff\uac00-\ud7a3"
_NFKC_SPAN = re.compile(rf"[{_NFKC_STABLE}]?[^{_NFKC_STABLE}]+")


def _nfkc_match(match: re.Match[str]) -> str:
    return unicodedata.normalize("NFKC", match.group())


def normalize_for_terms(text: str) -> str:
    """NFKC-normalise and case-fold ``text`` (the first step of both tokenizers)."""
    if text.isascii():
        return text.lower()
    # The quick check is ~100x cheaper than normalising text that is already NFKC; otherwise
    # (typically CJK text with full-width punctuation) only the unstable spans are normalised.
    if not unicodedata.is_normalized("NFKC", text):
        text = _NFKC_SPAN.sub(_nfkc_match, text)
    return text.casefold()


def _clean_word(word: str) -> str:
    if "," in word:
        word = word.replace(",", "")
    if (not word.isascii() or "'" in word) and _APOSTROPHE.search(word) is not None:
        word = _APOSTROPHE.sub("", _POSSESSIVE.sub("", word))
    return word


def _strip_accents(word: str) -> str:
    if word.isascii():
        return word
    # NFC afterwards recomposes what stripping leaves (NFD splits Hangul syllables into jamo).
    return unicodedata.normalize("NFC", _DIACRITICS.sub("", unicodedata.normalize("NFD", word)))


def index_terms(text: str) -> list[str]:
    """Terms to store for ``text`` in a pre-tokenized FTS5 column (join them with single spaces).

    Words as written plus their accent-stripped form when it differs; every unigram, then every
    adjacent bigram of each CJK/kana run; stop words dropped; repeats kept (BM25 term frequencies).

    >>> index_terms("The café, 钟楼")
    ['café', 'cafe', '钟', '楼', '钟楼']
    """
    if not text:
        return []
    out: list[str] = []
    stop = STOP_WORDS
    for run, word in _TOKEN.findall(normalize_for_terms(text)):
        if run:
            out.extend([ch for ch in run if ch not in stop])
            if len(run) > 1:
                out.extend([bg for bg in _BIGRAMS.findall(run) if bg not in stop])
            continue
        word = _clean_word(word)
        plain = _strip_accents(word)
        if not plain or plain in stop:
            continue
        out.append(word)
        if plain != word:
            out.append(plain)
    return out


def query_terms(text: str, max_terms: int = DEFAULT_MAX_QUERY_TERMS) -> list[str]:
    """Terms to search ``text`` with: accent-stripped words, CJK bigrams (a lone character as is).

    Stop words dropped, deduplicated in first-occurrence order, at most ``max_terms``. Every term
    is also in ``index_terms(text)``, so a document always matches its own text.

    >>> query_terms("What about the Café near 钟楼入口? 塔")
    ['cafe', 'near', '钟楼', '楼入', '入口', '塔']
    """
    if isinstance(max_terms, bool) or not isinstance(max_terms, int) or max_terms < 1:
        raise InputError("max_terms", f"must be an int in the range [1, inf); got {max_terms!r}")
    if not text:
        return []
    stop = STOP_WORDS
    seen: dict[str, None] = {}
    for run, word in _TOKEN.findall(normalize_for_terms(text)):
        if run:
            if len(run) == 1:
                if run not in stop:
                    seen[run] = None
            else:
                seen.update((bg, None) for bg in _BIGRAMS.findall(run) if bg not in stop)
        else:
            # An ASCII letters-and-digits word (most English words) has nothing to clean or strip.
            plain = word if word.isascii() and word.isalnum() else _strip_accents(_clean_word(word))
            if plain and plain not in stop:
                seen[plain] = None
        if len(seen) >= max_terms:
            break
    return list(seen)[:max_terms]


def fts_match_expression(terms: list[str]) -> str:
    """An FTS5 ``MATCH`` expression that ORs ``terms``, each a quoted string (``"`` doubled inside).

    Quoting makes every term a literal phrase: ``AND``/``OR``/``NOT``/``NEAR``, ``*``, ``^``, ``-``,
    column filters and quotes in user text are inert. NUL and lone surrogates (which SQLite cannot
    take) are removed and blank terms skipped. No terms → ``""``: the caller must not run a
    ``MATCH`` then (an empty FTS5 query is a syntax error).

    >>> fts_match_expression(['a"b', "or"])
    '"a""b" OR "or"'
    """
    quoted: list[str] = []
    for term in terms:
        safe = _FTS_UNSAFE.sub("", term)
        if safe.strip():
            quoted.append('"' + safe.replace('"', '""') + '"')
    return " OR ".join(quoted)
