"""Shared text helpers of the reference (stbme-reference §0), re-implemented exactly.

* :func:`js_len` counts UTF-16 code units, the unit every length limit of the reference is written in.
* :func:`normalize_query` (``NQ``), :func:`normalize_lexical` (``NL``), :func:`normalize_recall_input` (``NR``).
* :func:`unique_queries` (unique strings, query flavour), :func:`hash_recall_input`, :func:`is_trivial_input`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "TrivialCheck",
    "cut_js",
    "hash_recall_input",
    "is_trivial_input",
    "js_len",
    "normalize_lexical",
    "normalize_query",
    "normalize_recall_input",
    "unique_queries",
]


def js_len(text: str) -> int:
    """Length in UTF-16 code units (JS ``String.length``); astral characters count 2."""
    if text.isascii():
        return len(text)
    # Two bytes per BMP character (a lone surrogate included, via surrogatepass), four per astral one.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def cut_js(text: str, max_units: int) -> str:
    """First ``max_units`` UTF-16 units of ``text``; never splits a surrogate pair (drops it instead)."""
    if max_units <= 0:
        return ""
    if len(text) <= max_units // 2 or js_len(text) <= max_units:
        return text
    out: list[str] = []
    used = 0
    for ch in text:
        width = 2 if ord(ch) > 0xFFFF else 1
        if used + width > max_units:
            break
        out.append(ch)
        used += width
    return "".join(out)


def normalize_query(text: object, max_len: int = 400) -> str:
    """``NQ``: CRLF→LF, every whitespace run → one space, trim, cut to ``max_len`` JS units."""
    if text is None:
        return ""
    # str.split() splits on exactly the characters regex ``\s`` matches (both use the Unicode whitespace
    # test), so this is ``re.sub(r"\s+", " ", s).strip()`` at a fraction of the cost; CR and LF are both
    # whitespace, so CRLF→LF needs no pass of its own.
    return cut_js(" ".join(str(text).split()), max_len)


def normalize_lexical(text: object) -> str:
    """``NL``: ``NQ(text, 600)`` lower-cased."""
    return normalize_query(text, 600).lower()


def normalize_recall_input(text: object) -> str:
    """``NR``: CRLF→LF then trim; no whitespace collapsing, no truncation."""
    if text is None:
        return ""
    return str(text).replace("\r\n", "\n").strip()


def unique_queries(texts: list[str], max_len: int = 400) -> list[str]:
    """Normalise each text with ``NQ``, drop empties, dedupe case-insensitively, keep first-occurrence order."""
    seen: set[str] = set()
    out: list[str] = []
    for t in texts:
        n = normalize_query(t, max_len)
        if not n:
            continue
        key = n.lower()
        if key in seen:
            continue
        seen.add(key)
        out.append(n)
    return out


def hash_recall_input(text: object) -> str:
    """``hashRecallInput``: 31-polynomial over the UTF-16 units of ``NR(text)`` mod 2^32, decimal; ``""`` if empty."""
    s = normalize_recall_input(text)
    if not s:
        return ""
    h = 0
    data = s.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(data), 2):
        unit = data[i] | (data[i + 1] << 8)
        h = (h * 31 + unit) & 0xFFFFFFFF
    return str(h)


@dataclass(frozen=True)
class TrivialCheck:
    """Verdict of :func:`is_trivial_input`; ``reason`` is ``"empty"``, ``"slash-command"`` or ``""``."""

    trivial: bool
    reason: str = ""


def is_trivial_input(text: object) -> TrivialCheck:
    """Reference §2.5: empty after ``NR`` → ``empty``; starting with ``/`` → ``slash-command``; else not trivial."""
    s = normalize_recall_input(text)
    if not s:
        return TrivialCheck(True, "empty")
    if s.startswith("/"):
        return TrivialCheck(True, "slash-command")
    return TrivialCheck(False, "")
