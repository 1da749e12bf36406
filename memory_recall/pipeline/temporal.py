"""Time cue: time-aware recall of chat turns (not in the reference; issue 17).

Contract of :func:`time_cue_weights`
    Reads the question (``state.query.user_message``), ``now_ms`` (the query's time), and of the candidate rows
    the message nodes' send times (``snapshot.created_time``: a synced turn's ``send_date`` or session date) and
    texts (``fields.summary``). Returns one multiplier per row (≥ 1; exactly 1 for non-message rows, and for
    every row when the question carries no time cue):

    * **asks when** — the question asks when, in which year/month/day, how long ago or since when (English and
      Chinese wording): a turn whose text says when something happened (``yesterday``, ``last week``, ``two
      months ago``, ``in 2022``, a month name, ``上周`` …) is multiplied by ``1 + time_expression_boost``. Such a
      turn is usually the one that dates the event against its own session date, the answer's source.
    * **names a time** — the question names a time of the chat's own timeline: a date (``16 November 2023``,
      ``November 16, 2023``), a month of a year (``May 2023``), a month alone (``in June``: that month of every
      year the chat's turns span), a year (``2022``), or a span relative to ``now`` (``yesterday``, ``last week``,
      ``last month``, ``last year``, ``recently``). A turn sent inside the named span, or up to
      :data:`TELL_LAG_MS` (14 days) after it (people tell of an event in the next session), is multiplied by
      ``1 + time_range_boost``.

    Both cues multiply together. No answers, evidence or categories are read; the wording of the question and the
    turns' own times only.
Cost
    One regex pass over the question; per candidate message row, its text is matched once per snapshot (a memo
    keyed by node index, so repeated questions over one snapshot do not parse again) and its send time compared
    in numpy. No loop over the whole graph.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from memory_recall.pipeline._graph_cache import cached
from memory_recall.settings import ScoringSettings
from memory_recall.store.snapshot import GraphSnapshot, StructureChange

__all__ = ["TELL_LAG_MS", "TimeCue", "parse_time_cue", "says_when", "time_cue_weights"]

DAY_MS = 86_400_000
#: How long after a named span a turn still counts as telling of it.
TELL_LAG_MS = 14 * DAY_MS

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH_RE = "|".join(sorted(_MONTHS, key=len, reverse=True))
_NUM_WORDS = r"a|an|one|two|three|four|five|six|seven|eight|nine|ten|few|couple of|several|\d+"
_UNITS = r"days?|weeks?|months?|years?"
_DAYS = r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_SEASONS = r"spring|summer|autumn|fall|winter"

_ASKS_WHEN = re.compile(
    r"\b(?:when|what (?:year|month|day|date|time|week)|which (?:year|month|day|date|week)|how long ago|since when"
    r"|how long (?:has|have|had|did|was|were)|in what order)\b|什么时候|何时|哪天|哪一天|哪年|哪一年|几月|多久以前",
    re.IGNORECASE,
)
_SAYS_WHEN = re.compile(
    rf"\b(?:yesterday|today|tonight|tomorrow|recently|lately|the other day|earlier this (?:week|month|year)"
    rf"|(?:last|this past|past|this|next) (?:night|week|weekend|month|year|time|{_DAYS}|{_SEASONS})"
    rf"|(?:{_NUM_WORDS}) (?:{_UNITS}) ago|(?:19|20)\d\d)\b"
    r"|昨天|前天|今天|明天|上周|上个?星期|上个月|去年|前年|最近|刚才",
    re.IGNORECASE,
)
#: Month names in a turn count capitalised only ("in May", not "I may go").
_MONTH_NAME = re.compile(r"\b(?:" + "|".join(sorted({n.capitalize() for n in _MONTHS}, key=len, reverse=True)) + r")\b")
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s*(?:of\s+)?({_MONTH_RE})\b,?\s*((?:19|20)\d\d)\b",
                             re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(rf"\b({_MONTH_RE})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s*((?:19|20)\d\d)\b", re.IGNORECASE)
_MONTH_YEAR = re.compile(rf"\b({_MONTH_RE})\b,?\s*(?:of\s+)?((?:19|20)\d\d)\b", re.IGNORECASE)
_MONTH_ALONE = re.compile(rf"\b(?:in|during|early|late|mid|of|since|until|by|before|after)\s+(?:-?\s*)?({_MONTH_RE})\b",
                          re.IGNORECASE)
_YEAR = re.compile(r"\b((?:19|20)\d\d)\b")
_RELATIVE = {
    re.compile(r"\byesterday\b|昨天", re.IGNORECASE): 2,
    re.compile(r"\b(?:last|this past|past) (?:week|weekend)\b|上周|上个?星期", re.IGNORECASE): 14,
    re.compile(r"\blast month\b|上个月", re.IGNORECASE): 62,
    re.compile(r"\brecently\b|\blately\b|最近", re.IGNORECASE): 31,
    re.compile(r"\blast year\b|去年", re.IGNORECASE): 730,
}


@dataclass(frozen=True)
class TimeCue:
    """What a question says about time: whether it asks when, and the spans ``[start, end)`` (ms) it names."""

    asks_when: bool = False
    spans: tuple[tuple[int, int], ...] = ()

    @property
    def active(self) -> bool:
        return self.asks_when or bool(self.spans)


def _ms(year: int, month: int, day: int = 1) -> int:
    return int(datetime(year, month, day, tzinfo=UTC).timestamp() * 1000)


def _month_span(year: int, month: int) -> tuple[int, int]:
    end = _ms(year + 1, 1) if month == 12 else _ms(year, month + 1)
    return _ms(year, month), end


def parse_time_cue(question: str, now_ms: float, years: tuple[int, ...] = ()) -> TimeCue:
    """The :class:`TimeCue` of ``question``; ``years`` are the years the chat's turns span (for a month named
    without its year), ``now_ms`` the query time (for ``last week`` …). Spans are sorted, each one once.

    >>> cue = parse_time_cue("Where was Tim in the week before 16 November 2023?", 0)
    >>> cue.asks_when, [(datetime.fromtimestamp(a / 1000, UTC).date().isoformat(),
    ...                  datetime.fromtimestamp(b / 1000, UTC).date().isoformat()) for a, b in cue.spans]
    (False, [('2023-11-08', '2023-11-17')])
    >>> parse_time_cue("When did Melanie go camping?", 0).asks_when
    True
    """
    spans: set[tuple[int, int]] = set()
    taken: list[tuple[int, int]] = []  # character ranges already read as a fuller date

    def free(m: re.Match[str]) -> bool:
        return all(m.end() <= a or m.start() >= b for a, b in taken)

    for pattern, day_first in ((_DAY_MONTH_YEAR, True), (_MONTH_DAY_YEAR, False)):
        for m in pattern.finditer(question):
            if not free(m):
                continue
            day_s, month_s = (m.group(1), m.group(2)) if day_first else (m.group(2), m.group(1))
            try:
                # A dated question ("the week before 16 November") looks at that day and the week before it.
                day_ms = _ms(int(m.group(3)), _MONTHS[month_s.lower()], int(day_s))
            except ValueError:
                continue
            spans.add((day_ms - 8 * DAY_MS, day_ms + DAY_MS))
            taken.append(m.span())
    for m in _MONTH_YEAR.finditer(question):
        if free(m):
            spans.add(_month_span(int(m.group(2)), _MONTHS[m.group(1).lower()]))
            taken.append(m.span())
    for m in _MONTH_ALONE.finditer(question):
        word = m.group(1)
        # "may" and the abbreviations count only capitalised ("in May", not "it may rain", "in mar…").
        if not free(m) or (word[0].islower() and (len(word) <= 4 or word.lower() == "may")):
            continue
        for year in years:
            spans.add(_month_span(year, _MONTHS[word.lower()]))
        taken.append(m.span())
    for m in _YEAR.finditer(question):
        if free(m):
            spans.add((_ms(int(m.group(1)), 1), _ms(int(m.group(1)) + 1, 1)))
    now = int(now_ms)
    for pattern, days in _RELATIVE.items():
        if now > 0 and pattern.search(question):
            spans.add((now - days * DAY_MS, now + 1))
    return TimeCue(asks_when=bool(_ASKS_WHEN.search(question)), spans=tuple(sorted(spans)))


def says_when(text: str) -> bool:
    """Whether a turn's text says when something happened.

    >>> says_when("I joined a service-focused online group last week"), says_when("That sounds lovely!")
    (True, False)
    """
    return _SAYS_WHEN.search(text) is not None or _MONTH_NAME.search(text) is not None


def _message_time_span(snapshot: GraphSnapshot, rows: np.ndarray | None = None) -> tuple[float, float] | None:
    """``(first, last)`` positive finite message time (ms) of ``snapshot`` (of the nodes ``rows`` only when
    given), ``None`` when there is none."""
    from memory_recall.pipeline.kind_weights import MESSAGE_TYPE_CODE

    types, times = snapshot.type_code, snapshot.created_time
    if rows is not None:
        types, times = types[rows], times[rows]
    t = times[(types == MESSAGE_TYPE_CODE) & np.isfinite(times)]
    t = t[t > 0]
    return None if t.size == 0 else (float(t.min()), float(t.max()))


#: Per structure: the positive finite message times' ``(first, last)``, or ``None``, in a 1-tuple (``None`` is the
#: decline of an update path).
_Span = tuple[tuple[float, float] | None]


def _updated_span(snapshot: GraphSnapshot, old: _Span, change: StructureChange) -> _Span | None:
    """The span of ``snapshot`` from its parent structure's: after an appended-only change that rewrote no node's
    type or time, the old rows hold the same times, so only the new ones are folded in (O(new rows)); ``None``
    (build) otherwise."""
    if not change.appended_only or change.changed_columns is None or (
        change.changed_columns & {"type_code", "created_time"}
    ):
        return None
    before, new = old[0], _message_time_span(snapshot, np.arange(change.appended, change.n_new))
    if before is None or new is None:
        return (before or new,)
    return ((min(before[0], new[0]), max(before[1], new[1])),)


def _chat_span(snapshot: GraphSnapshot) -> tuple[float, float] | None:
    value, _ = cached(snapshot, ("time-cue-span",), lambda: (_message_time_span(snapshot),),
                      lambda old, change: _updated_span(snapshot, old, change), recipe=_chat_span)
    return value[0]


def _chat_years(snapshot: GraphSnapshot) -> tuple[int, ...]:
    """The years from the first to the last finite message time of the snapshot (the span is cached per
    structure and updated after a write)."""
    span = _chat_span(snapshot)
    if span is None:
        return ()
    first = datetime.fromtimestamp(span[0] / 1000, UTC).year
    last = datetime.fromtimestamp(span[1] / 1000, UTC).year
    return tuple(range(first, min(last, first + 50) + 1))


def _says_when_rows(snapshot: GraphSnapshot, idx: np.ndarray) -> np.ndarray:
    memo: dict[int, bool]
    memo, _ = cached(snapshot, ("time-cue-says-when",), dict)
    out = np.zeros(idx.size, dtype=bool)
    for row, i in enumerate(idx.tolist()):
        hit = memo.get(i)
        if hit is None:
            node = snapshot.node(i)
            hit = any(says_when(t) for t in node.field_text("summary"))
            memo[i] = hit
        out[row] = hit
    return out


def time_cue_weights(
    snapshot: GraphSnapshot,
    idx: np.ndarray,
    is_message: np.ndarray,
    question: str,
    now_ms: float,
    settings: ScoringSettings,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Per-row multipliers of the time cue (see the module docstring) and trace notes (``asks_when``, the number
    of named ``spans``, ``raised`` rows). All ones when ``settings.time_cue`` is off."""
    m = idx.size
    weights = np.ones(m)
    if not settings.time_cue or m == 0 or not is_message.any():
        return weights, {}
    cue = parse_time_cue(question, now_ms, _chat_years(snapshot))
    if not cue.active:
        return weights, {}
    rows = np.flatnonzero(is_message)
    if cue.asks_when and settings.time_expression_boost > 0:
        weights[rows[_says_when_rows(snapshot, idx[rows])]] *= 1.0 + float(settings.time_expression_boost)
    if cue.spans and settings.time_range_boost > 0:
        t = snapshot.created_time[idx[rows]]
        spans = np.asarray(cue.spans, dtype=np.float64)
        inside = ((t[:, None] >= spans[None, :, 0]) & (t[:, None] < spans[None, :, 1] + TELL_LAG_MS)).any(axis=1)
        weights[rows[inside]] *= 1.0 + float(settings.time_range_boost)
    notes = {"asks_when": cue.asks_when, "spans": len(cue.spans), "raised": int(np.count_nonzero(weights > 1.0))}
    return weights, notes
