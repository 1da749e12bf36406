"""Term matching for owner mentions, entity anchors and story cues (recall-spec departure 8).

The reference matches raw substrings: owner aliases case-insensitively (§3.1), entity anchors
case-sensitively (§3.8), story cues as Chinese keywords (§3.12 step 4). So ``Ann`` matches
``Announcement`` and ``alice`` never anchors ``Alice`` (§7 item 16). Here, for all three:

* Text and term are **folded** by :func:`fold`: lower-cased and accent-stripped character by
  character (``Renée`` → ``renee``), length-preserving, so a position in the folded text is the
  same position in the original. CJK ideographs, kana and Hangul are never changed (stripping the
  voiced mark of ``が`` would turn it into ``か``).
* An end of the term that is a letter or digit of a **spaced script** (Latin, Greek, Cyrillic,
  Arabic, Indic …) must sit on a word boundary: the neighbouring text character must not be such a
  letter or digit. ``ann`` is found in ``Ann's``, ``Ann-Marie`` and ``艾琳和Ann``, not in
  ``Announcement`` or ``Joanna``.
* An end that is a character of an **unspaced script** (CJK ideographs, kana, Hangul, Thai, Lao,
  Khmer, Myanmar: :data:`UNSPACED_CHARS`) or punctuation needs no boundary: these scripts write
  names without spaces and attach particles to them (``艾琳在钟楼``, ``민수가``), so a substring is
  the only workable test, as in the reference.

Usage::

    text = fold(normalize_query(message))
    term_occurs(text, fold("Ann"))          # word-boundary aware
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from memory_recall.text.tokenize import CJK_CHARS

__all__ = ["UNSPACED_CHARS", "fold", "is_word_char", "term_at_boundaries", "term_occurs"]

#: Regex class body of the scripts matched by plain substring (no word boundaries): the tokenizer's
#: CJK ideographs and kana, plus Hangul (jamo, compatibility jamo, syllables), Thai, Lao, Myanmar
#: and Khmer.
UNSPACED_CHARS = (
    CJK_CHARS
    + "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"  # Hangul
    + "\u0e00-\u0eff"  # Thai, Lao
    + "\u1000-\u109f"  # Myanmar
    + "\u1780-\u17ff"  # Khmer
)
_UNSPACED = re.compile(f"[{UNSPACED_CHARS}]")


@lru_cache(maxsize=16384)
def _fold_char(ch: str) -> str:
    low = ch.lower()
    if len(low) != 1:  # "İ".lower() is two characters: keep the original to stay length-preserving
        low = ch
    if low.isascii() or _UNSPACED.match(low):
        return low
    stripped = unicodedata.normalize(
        "NFC", "".join(c for c in unicodedata.normalize("NFD", low) if not unicodedata.combining(c))
    )
    return stripped if len(stripped) == 1 else low


def fold(text: str) -> str:
    """Lower-case and strip accents per character; ``len(fold(t)) == len(t)`` always.

    >>> fold("Renée ÉCOLE 艾琳 が")
    'renee ecole 艾琳 が'
    """
    if text.isascii():
        return text.lower()
    return "".join(map(_fold_char, text))


@lru_cache(maxsize=16384)
def is_word_char(ch: str) -> bool:
    """A letter, digit or combining mark of a spaced script (an end that needs a word boundary)."""
    if not (ch.isalnum() or unicodedata.category(ch).startswith("M")):
        return False
    return _UNSPACED.match(ch) is None


def term_at_boundaries(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` (a term occurrence) sits on the boundaries its ends require."""
    if start > 0 and is_word_char(text[start]) and is_word_char(text[start - 1]):
        return False
    return not (end < len(text) and is_word_char(text[end - 1]) and is_word_char(text[end]))


def term_occurs(text: str, term: str) -> bool:
    """Whether the folded ``term`` occurs in the folded ``text`` on the required boundaries.

    >>> term_occurs(fold("The Announcement"), fold("Ann")), term_occurs(fold("Ann's cat"), fold("ANN"))
    (False, True)
    >>> term_occurs(fold("艾琳在钟楼"), "钟楼")
    True
    """
    if not term:
        return False
    start = text.find(term)
    while start >= 0:
        if term_at_boundaries(text, start, start + len(term)):
            return True
        start = text.find(term, start + 1)
    return False
