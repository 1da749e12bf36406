"""Query plan stage: context query blend, multi-intent split, vector queries, lexical sources (reference
§3.5–§3.6).

Reads
    ``state.query.user_message`` and ``state.query.recent_lines`` (``"[user]: …"`` / ``"[assistant]: …"``
    lines, reference §2.2; the lines are chosen by the caller — ``QueryPlanSettings.recent_context_messages``
    is the controller's window, reference §5.2, and is not applied again here).
Writes
    ``state.plan`` (:class:`~memory_recall.pipeline.state.QueryPlan`): blend ``parts`` (kind, label, text,
    weight), ``active``, ``combined_text``, ``vector_queries`` ((text, part weight) in order),
    ``lexical_sources`` and the intent ``segments`` of the current message. Meta (reference §3.21):
    ``segmentsUsed`` (the segment list), ``queryBlendActive``, ``queryBlendParts`` (kind, label, weight,
    120-unit preview, JS length), ``queryBlendWeights`` (kind → weight).
Blend (reference §3.5, exact)
    ``current = NQ(userMessage)``. Recent lines parse as ``[user]: x`` / ``[assistant]: x`` or ``user: x`` /
    ``assistant: x`` / ``用户: x`` / ``助手: x`` / ``ai: x`` (role case-insensitive, ASCII or full-width
    colon); other lines are ignored; texts are ``NQ``-normalised. From the newest line: the newest assistant
    text, and the newest user text that differs (case-insensitively) from the current text. Weights: current
    ``max(0, 1 − wa − wp)`` (1 when blending is off), assistant ``wa``, previous user ``wp``; empty or
    (case-insensitively) repeated texts are dropped; weights renormalised to sum 1 and rounded to 3 decimals
    (equal split when all are 0). ``active`` = blending on and more than one part; ``combined_text`` = the
    single text, or ``"<label>:\\n<text>"`` blocks joined by blank lines.
Vector queries (reference §3.6)
    The current-user part gives ``unique([text, *segments ≠ text])`` when multi-intent is on, every other part
    its text; each query carries its part's weight.
Lexical sources (reference §3.6)
    ``unique([NQ(current), *segments(current)])`` (segments only with multi-intent on), via
    :func:`memory_recall.text.intent.lexical_query_sources`.
Settings
    ``QueryPlanSettings``: ``enable_context_query_blend``, ``context_assistant_weight`` (0.2),
    ``context_previous_user_weight`` (0.1), ``enable_multi_intent``, ``multi_intent_max_segments`` (4).
Skip reasons
    ``empty-query``: no blend part and no lexical source (nothing to search with).
Departures
    * recall-spec 8 (§7 item 16): vector queries that differ only by trailing punctuation/whitespace or case
      (``他后来怎么做？`` / ``他后来怎么做``) are one query: the first keeps its place and takes the larger
      weight (the vector merge keeps the max weighted score per node, so ranking is unchanged and one
      embedding call is saved). Scenario 4 gives 3 queries instead of 4; scenario 26 with multi-intent makes 3
      embedding calls and ``vectorHits`` 9 instead of 4 calls and 12. The intent splitter's own departure 8
      rules apply as well.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from memory_recall.pipeline.state import BlendPart, QueryPlan, RecallState, TimedStage
from memory_recall.settings import QueryPlanSettings
from memory_recall.text.intent import lexical_query_sources, split_intent_segments
from memory_recall.text.normalize import cut_js, js_len, normalize_query, unique_queries

__all__ = [
    "BLEND_LABELS",
    "QueryPlanStage",
    "build_query_blend",
    "build_vector_queries",
    "parse_context_line",
]

#: Labels of the blend parts in ``combined_text`` (reference §3.5).
BLEND_LABELS: dict[str, str] = {
    "currentUser": "当前用户消息",
    "assistantContext": "最近 assistant 回复",
    "previousUser": "上一条 user 消息",
}

_ROLES = {"user": "user", "用户": "user", "assistant": "assistant", "助手": "assistant", "ai": "assistant"}
_LINE = re.compile(
    r"^\s*(?:\[(user|assistant)\]|(user|assistant|用户|助手|ai))\s*[:：]\s*(.*)$",
    re.IGNORECASE | re.DOTALL,
)
_PREVIEW_UNITS = 120  # reference §3.21 queryBlendParts preview length


def parse_context_line(line: str) -> tuple[str, str] | None:
    """``(role, NQ(text))`` of one recent line, role ``"user"``/``"assistant"``; None if it does not parse.

    >>> parse_context_line("用户：现在该怎么做？")
    ('user', '现在该怎么做？')
    >>> parse_context_line("[Assistant]:  hi  there"), parse_context_line("narrator: x")
    (('assistant', 'hi there'), None)
    """
    match = _LINE.match(line or "")
    if match is None:
        return None
    role = _ROLES[(match.group(1) or match.group(2)).lower()]
    return role, normalize_query(match.group(3))


def build_query_blend(
    user_message: str,
    recent_lines: Sequence[str],
    *,
    enabled: bool = True,
    assistant_weight: float = 0.2,
    previous_user_weight: float = 0.1,
) -> tuple[tuple[BlendPart, ...], bool, str]:
    """``(parts, active, combined_text)`` of the context query blend (reference §3.5, scenarios 2–3).

    >>> parts, active, _ = build_query_blend("x?", ["用户：现在该怎么做？"])
    >>> [(p.kind, p.weight) for p in parts], active
    ([('currentUser', 0.875), ('previousUser', 0.125)], True)
    """
    current = normalize_query(user_message)
    assistant_text = ""
    previous_text = ""
    if enabled:
        current_low = current.lower()
        for line in reversed(recent_lines):
            parsed = parse_context_line(line)
            if parsed is None or not parsed[1]:
                continue
            role, text = parsed
            if role == "assistant" and not assistant_text:
                assistant_text = text
            elif role == "user" and not previous_text and text.lower() != current_low:
                previous_text = text
            if assistant_text and previous_text:
                break
    raw: list[tuple[str, str, float]] = [
        ("currentUser", current, max(0.0, 1.0 - assistant_weight - previous_user_weight) if enabled else 1.0)
    ]
    if enabled:
        raw.append(("assistantContext", assistant_text, assistant_weight))
        raw.append(("previousUser", previous_text, previous_user_weight))
    kept: list[tuple[str, str, float]] = []
    seen: set[str] = set()
    for kind, text, weight in raw:
        if not text or text.lower() in seen:
            continue
        seen.add(text.lower())
        kept.append((kind, text, weight))
    total = sum(w for _, _, w in kept)
    parts = tuple(
        BlendPart(
            kind=kind,
            label=BLEND_LABELS[kind],
            text=text,
            weight=round(weight / total if total > 0 else 1.0 / len(kept), 3),
        )
        for kind, text, weight in kept
    )
    active = enabled and len(parts) > 1
    if len(parts) == 1:
        combined = parts[0].text
    else:
        combined = "\n\n".join(f"{p.label}:\n{p.text}" for p in parts)
    return parts, active, combined


def _near_duplicate_key(text: str) -> str:
    """Case-folded text without trailing punctuation/whitespace (departure 8); the text itself if nothing
    else remains (``"？？"`` must not collapse with every other punctuation-only query)."""
    end = len(text)
    while end > 0 and (text[end - 1].isspace() or unicodedata.category(text[end - 1])[0] in "PZ"):
        end -= 1
    return (text[:end] or text).casefold()


def build_vector_queries(
    parts: Sequence[BlendPart], segments: Sequence[str], *, multi_intent: bool
) -> tuple[tuple[str, float], ...]:
    """Vector queries ``(text, weight)`` of the plan (reference §3.6 with departure 8's near-duplicate merge).

    >>> parts, _, _ = build_query_blend("他后来怎么做？", [])
    >>> build_vector_queries(parts, ["他后来怎么做"], multi_intent=True)
    (('他后来怎么做？', 1.0),)
    """
    planned: list[tuple[str, float]] = []
    for part in parts:
        if part.kind == "currentUser" and multi_intent:
            texts = unique_queries([part.text, *(s for s in segments if s != part.text)])
        else:
            texts = [part.text]
        planned.extend((text, part.weight) for text in texts)
    position: dict[str, int] = {}
    merged: list[tuple[str, float]] = []
    for text, weight in planned:
        key = _near_duplicate_key(text)
        at = position.get(key)
        if at is None:
            position[key] = len(merged)
            merged.append((text, weight))
        elif weight > merged[at][1]:
            merged[at] = (merged[at][0], weight)
    return tuple(merged)


class QueryPlanStage(TimedStage):
    """Build the query plan of one recall (see the module docstring)."""

    name = "query_plan"

    def __init__(self, settings: QueryPlanSettings) -> None:
        self.settings = settings

    def _run(self, state: RecallState) -> tuple[RecallState, dict[str, Any]]:
        s = self.settings
        query = state.query
        parts, active, combined = build_query_blend(
            query.user_message,
            query.recent_lines,
            enabled=s.enable_context_query_blend,
            assistant_weight=s.context_assistant_weight,
            previous_user_weight=s.context_previous_user_weight,
        )
        current = normalize_query(query.user_message)
        segments = (
            tuple(split_intent_segments(current, s.multi_intent_max_segments))
            if s.enable_multi_intent
            else ()
        )
        # A message that is already NQ-normalised (the usual case) splits into the segments just computed.
        lexical = tuple(
            lexical_query_sources(
                query.user_message,
                s.enable_multi_intent,
                s.multi_intent_max_segments,
                segments=segments if s.enable_multi_intent and query.user_message == current else None,
            )
        )
        base: dict[str, Any] = {"score_kind": "blend_weight", "score_direction": "higher_is_better"}
        if not parts and not lexical:
            skipped = state.evolve(skip_reasons=state.with_skip("empty-query"))
            return skipped, {
                **base,
                "count_in": len(query.recent_lines) + 1,
                "count_out": 0,
                "skipped": True,
                "skip_reason": "empty-query",
            }
        vector_queries = build_vector_queries(parts, segments, multi_intent=s.enable_multi_intent)
        plan = QueryPlan(
            parts=parts,
            active=active,
            combined_text=combined,
            vector_queries=vector_queries,
            lexical_sources=lexical,
            segments=segments,
        )
        meta = state.with_meta(
            segmentsUsed=list(segments),
            queryBlendActive=active,
            queryBlendParts=[
                {
                    "kind": p.kind,
                    "label": p.label,
                    "weight": p.weight,
                    "preview": cut_js(p.text, _PREVIEW_UNITS),
                    "length": js_len(p.text),
                }
                for p in parts
            ],
            queryBlendWeights={p.kind: p.weight for p in parts},
        )
        notes = {
            "vectorQueries": len(vector_queries),
            "lexicalSources": len(lexical),
            "segments": len(segments),
        }
        return state.evolve(plan=plan, meta=meta), {
            **base,
            "count_in": len(query.recent_lines) + 1,
            "count_out": len(vector_queries),
            "notes": notes,
        }
