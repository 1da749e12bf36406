"""Multi-intent split of the user's message and the lexical query sources (reference §3.6, departure 8).

Contract::

    split_intent_segments("规则一，然后规则二。另外规则三") == ["规则一", "规则二", "规则三"]
    split_intent_segments("Mr. Smith went to Washington. He said hello!")
        == ["Mr. Smith went to Washington", "He said hello"]
    lexical_query_sources("他后来怎么做？", multi_intent=True) == ["他后来怎么做？", "他后来怎么做"]

The reference splits on every run of ``，,。.；;！!？?`` or newline and on each occurrence of the
connectives ``顺便 另外 还有 对了 然后 而且 并且 同时``, trims the pieces, keeps those of JS length
≥ ``min_length``, dedupes them exactly and keeps the first ``max(1, max_segments)``. Departure 8
(fixing §7 item 16) narrows the split points:

* **A lone ``.`` does not split** after an abbreviation of :data:`ABBREVIATIONS` (case-insensitive,
  as a whole word: ``Mr.``, ``e.g.``, ``etc.``), nor between two letters or digits of a spaced
  script with no space after it (``3.14``, ``a.b.c``, ``example.com``). A ``.`` next to a CJK/kana
  character still splits (Chinese has no spaces: ``规则一.规则二`` is two clauses). A run of several
  marks (``...``, ``.,``) always splits.
* **A lone ``,`` does not split** between two digits (``1,000``).
* **Connectives split only as words.** Chinese has no spaces, so "as a word" means: not part of a
  longer known word formed with the character just before or after it.
  :data:`CONNECTIVE_EXCEPTIONS` lists those characters per connective (``不同时``, ``同时代``,
  ``虽然后来``, ``突然后退``, ``说对了``, ``这就对了`` …); anywhere else the connective splits,
  as in the reference. English words are never connectives.

Consequence: ``"a.b.c"`` gives ``["a.b.c"]`` where the reference gives ``[]``; that case of §6.1
scenario 1 conflicts with departure 8, and the departure wins.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memory_recall.text.normalize import js_len, normalize_query, unique_queries
from memory_recall.text.tokenize import CJK_CHARS

__all__ = [
    "ABBREVIATIONS",
    "CONNECTIVES",
    "CONNECTIVE_EXCEPTIONS",
    "lexical_query_sources",
    "split_intent_segments",
]

#: Connective words of the reference (§3.6), in its order.
CONNECTIVES: tuple[str, ...] = ("顺便", "另外", "还有", "对了", "然后", "而且", "并且", "同时")

#: Per connective: (characters before it, characters after it) that make it part of a longer
#: word, where it does not split. Only connectives that often sit inside a common longer word are
#: listed; 顺便 另外 还有 而且 并且 rarely do.
CONNECTIVE_EXCEPTIONS: dict[str, tuple[str, str]] = {
    # 虽然 既然 突然 当然 显然 自然 竟然 果然 居然 依然 仍然 忽然 偶然 必然 固然 纵然 公然
    # 猛然 骤然 决然 天然 全然 诚然 断然 毅然 坦然 淡然 安然 悄然 默然 宛然 茫然 欣然 截然
    # 蓦然 陡然 徒然, followed by 后来 后退 后悔 后者 …
    "然后": ("虽既突当显自竟果居依仍忽偶必固纵公猛骤决天全诚断毅坦淡安悄默宛茫欣截蓦陡徒", ""),
    # 说对了/做对了/猜对了/答对了/这就对了/都对了 …: 对 as "correct" after a verb or adverb, not "oh right".
    "对了": ("说做猜答找选走用就算弄搞写看想问读记认押赌买填蒙讲排数判全都也又才绝反相针是不", ""),
    # 不同时/相同时/共同时 (不同 + 时间 …) before; 同时代/同时期/同时段 after.
    "同时": ("不相共等异协认赞如雷混会陪偕随", "代期段"),
}

#: Abbreviations after which ``.`` does not end a clause (matched case-insensitively as a whole word).
#: Kept short on purpose: each entry also hides a real sentence end after that word ("… on Main
#: St. Then"), so words that often end sentences ("no") are left out.
ABBREVIATIONS: tuple[str, ...] = tuple("mr mrs ms dr prof st jr sr vs etc e.g i.e".split())


def _connective_pattern(word: str) -> str:
    before, after = CONNECTIVE_EXCEPTIONS.get(word, ("", ""))
    return (f"(?<![{before}])" if before else "") + word + (f"(?![{after}])" if after else "")


# Group 1: a punctuation run (splits unless departure 8 protects a lone "." or ","); otherwise a
# connective that stands as a word.
_SEPARATOR = re.compile(
    r"([，,。.；;！!？?\n]+)|" + "|".join(_connective_pattern(word) for word in CONNECTIVES)
)
# A letter or digit of a spaced script (not CJK/kana), on both sides of a "." that must not split.
_SPACED_WORD_CHAR = re.compile(rf"(?![{CJK_CHARS}])[^\W_]")
# Searched with pos/endpos so only a few characters are scanned; the lookbehind still sees the
# character before the window, so "xmr." is not "mr.".
_ABBREVIATION_TAIL = re.compile(
    r"(?<![\w.])(?:" + "|".join(re.escape(a) for a in sorted(ABBREVIATIONS, key=len, reverse=True)) + r")\Z",
    re.IGNORECASE,
)
_ABBREVIATION_WINDOW = max(len(a) for a in ABBREVIATIONS)
_DIGIT = re.compile(r"\d")


def _is_split(text: str, start: int, end: int) -> bool:
    """Whether the punctuation run ``text[start:end]`` ends a clause (departure 8)."""
    if end - start != 1:
        return True
    mark = text[start]
    if mark not in ".,":
        return True
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    if mark == ",":
        return not (before and after and _DIGIT.match(before) and _DIGIT.match(after))
    if before and after and _SPACED_WORD_CHAR.match(before) and _SPACED_WORD_CHAR.match(after):
        return False
    return _ABBREVIATION_TAIL.search(text, max(0, start - _ABBREVIATION_WINDOW), start) is None


def split_intent_segments(text: str, max_segments: int = 4, min_length: int = 3) -> list[str]:
    """Split ``text`` into intent segments (reference §3.6, departure 8: see the module docstring).

    >>> split_intent_segments("明天我们计划去钟楼吗？顺便看看旧城区，还有王都的庆典")
    ['明天我们计划去钟楼吗', '看看旧城区', '王都的庆典']
    >>> split_intent_segments("It costs 3.50 dollars. Fine")
    ['It costs 3.50 dollars', 'Fine']
    """
    if not text:
        return []
    text = text.strip()
    pieces: list[str] = []
    last = 0
    for match in _SEPARATOR.finditer(text):
        start, end = match.span()
        if match.group(1) is not None and not _is_split(text, start, end):
            continue
        pieces.append(text[last:start])
        last = end
    pieces.append(text[last:])

    limit = max(1, max_segments)
    out: list[str] = []
    for piece in pieces:
        piece = piece.strip()
        if js_len(piece) < min_length or piece in out:
            continue
        out.append(piece)
        if len(out) == limit:
            break
    return out


def lexical_query_sources(
    current: str, multi_intent: bool, max_segments: int = 4, *, segments: Sequence[str] | None = None
) -> list[str]:
    """Texts the lexical score compares node fields with (reference §3.6).

    ``unique_queries([NQ(current), *split_intent_segments(current)])``; the segments only when
    ``multi_intent`` is on. ``segments``, when given, must be ``split_intent_segments(current, max_segments)``
    (a caller that already split the text passes it instead of splitting it again).

    >>> lexical_query_sources("规则一，然后规则二", multi_intent=True)
    ['规则一，然后规则二', '规则一', '规则二']
    """
    sources = [normalize_query(current)]
    if multi_intent:
        sources.extend(split_intent_segments(current, max_segments) if segments is None else segments)
    return unique_queries(sources)
