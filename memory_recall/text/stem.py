"""Suffix stemmers for the BM25 channel's Latin-script terms: an S-stemmer, Porter (1980) and Snowball English.

Contract
--------
* :func:`stem_term` ``(term, method)`` is the one entry point. ``method`` is ``"none"`` (the term unchanged),
  ``"s"`` (Harman's S-stemmer: plural endings only), ``"porter"`` (M. F. Porter, "An algorithm for suffix
  stripping", Program 14(3), 1980) or ``"english"`` (Porter's later Snowball English stemmer, "Porter2"). The
  last two are the ``snowballstemmer`` package's implementations.
* Only terms made of ASCII lower-case letters (``str.isascii()`` and ``str.isalpha()``, as the tokenizer
  produces for English words after case and accent folding) of more than two letters are stemmed; digits,
  CJK terms, accented forms and anything else pass unchanged, so a stemmer never merges terms of other
  scripts.
* Deterministic, pure and thread-safe; the index stems its vocabulary once per term and a query stems its terms
  the same way, so a document always matches its own words.

>>> [stem_term(w, "porter") for w in ("painting", "painted", "paints", "relational", "café", "2023")]
['paint', 'paint', 'paint', 'relat', 'café', '2023']
>>> [stem_term(w, "s") for w in ("ponies", "shoes", "dogs", "glass", "bus")]
['pony', 'shoe', 'dog', 'glass', 'bus']
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Literal

import snowballstemmer

__all__ = ["STEM_METHODS", "StemMethod", "english_stem", "porter_stem", "s_stem", "stem_term"]

StemMethod = Literal["none", "s", "porter", "english"]
#: The accepted ``method`` values.
STEM_METHODS: tuple[str, ...] = ("none", "s", "porter", "english")

_SNOWBALL = {name: snowballstemmer.stemmer(name) for name in ("porter", "english")}
_SNOWBALL_LOCK = threading.Lock()


def _stemmable(term: str) -> bool:
    return len(term) > 2 and term.isascii() and term.isalpha() and term.islower()


def s_stem(word: str) -> str:
    """Harman's S-stemmer (JASIS 42(1), 1991): ``-ies``→``-y``, ``-es``→``-e``, ``-s``→``""`` with its exceptions."""
    if not _stemmable(word):
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


# ------------------------------------------------------------------------------------------------------------
# Porter (1980) and Snowball English, through snowballstemmer (stems are memoised: chats repeat their words)
# ------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def _snowball(word: str, algorithm: str) -> str:
    with _SNOWBALL_LOCK:  # a snowballstemmer object keeps per-call state: one caller at a time
        return _SNOWBALL[algorithm].stemWord(word)


def porter_stem(word: str) -> str:
    """The Porter (1980) stem of ``word`` (see the module contract for which terms are stemmed)."""
    return _snowball(word, "porter") if _stemmable(word) else word


def english_stem(word: str) -> str:
    """The Snowball English ("Porter2") stem of ``word`` (see the module contract for which terms are stemmed)."""
    return _snowball(word, "english") if _stemmable(word) else word


def stem_term(term: str, method: str) -> str:
    """``term`` stemmed by ``method`` (one of :data:`STEM_METHODS`); raises ValueError for another method."""
    if method == "none":
        return term
    if method == "porter":
        return porter_stem(term)
    if method == "english":
        return english_stem(term)
    if method == "s":
        return s_stem(term)
    raise ValueError(f"unknown stem method {method!r}; expected one of {', '.join(STEM_METHODS)}")
