"""LoCoMo (the ``locomo10.json`` layout) → chat messages and questions.

Contract of :func:`load_locomo`:

* Sessions are read in numeric order (``session_10`` after ``session_9``); a ``session_N_date_time`` key
  without a ``session_N`` list (conv-26 has dates up to session 35 and turns up to 19) is ignored.
* Each turn becomes one :class:`~memory_recall.model.ChatMessage`: ``floor`` is a running index over all
  sessions of the conversation, role ``user`` for ``speaker_a`` and ``assistant`` for ``speaker_b``,
  ``speaker`` the turn's speaker name, ``text`` the turn text, ``date`` the session's ``session_N_date_time``,
  ``evidence_id`` the ``dia_id`` and ``attachments = (blip_caption,)`` when the turn shares a photo (the
  caption is part of the evidence: questions ask about what the photo shows).
* Each QA item becomes a :class:`LocomoQuestion`: ``answer`` is ``answer`` when present, else
  ``adversarial_answer`` (two category-5 items carry both; the plain answer is the correct one), as a string;
  evidence ids are normalised as the dataset README says: split on ``;`` and whitespace, stripped, ids that
  match no turn of the conversation dropped (``"D"``, ``"D:11:26"``, ``"D10:19"`` in the dev split),
  deduplicated in order.
* Structure is validated; a malformed file raises :class:`~memory_recall.errors.InputError` whose ``field``
  is the JSON path of the bad value (``conversation[2].session_3[5].text``; the index is the position in the
  top-level list).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from memory_recall.errors import InputError
from memory_recall.model.chat import ChatMessage
from memory_recall.model.graph import first_validation_error

__all__ = ["LocomoConversation", "LocomoQuestion", "load_locomo", "parse_locomo"]

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_SPLIT = re.compile(r"[;\s]+")


@dataclass(frozen=True)
class LocomoQuestion:
    """One QA item; ``evidence`` holds normalised dia_ids, each mapping to a turn of its conversation."""

    question: str
    answer: str
    evidence: tuple[str, ...]
    category: int
    raw_evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocomoConversation:
    """One LoCoMo sample as chat messages; ``dia_index`` maps each dia_id to its message floor."""

    sample_id: str
    speaker_a: str
    speaker_b: str
    messages: list[ChatMessage]
    questions: list[LocomoQuestion]
    dia_index: dict[str, int] = field(default_factory=dict)


def _require(obj: Any, kind: type | tuple[type, ...], path: str, what: str) -> Any:
    if not isinstance(obj, kind) or isinstance(obj, bool) and kind is not bool:
        raise InputError(path, f"must be {what}, got {type(obj).__name__}")
    return obj


def _str(obj: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str:
    if key not in obj:
        if required:
            raise InputError(f"{path}.{key}", "is missing")
        return ""
    value = obj[key]
    if value is None and not required:
        return ""
    return str(_require(value, str, f"{path}.{key}", "a string"))


def _normalise_evidence(raw: list[Any], path: str, dia_index: Mapping[str, int]) -> tuple[str, ...]:
    out: list[str] = []
    for i, item in enumerate(raw):
        _require(item, str, f"{path}[{i}]", "a string")
        for part in _EVIDENCE_SPLIT.split(item):
            part = part.strip()
            if part and part in dia_index and part not in out:
                out.append(part)
    return tuple(out)


def _conversation(sample: Any, path: str) -> LocomoConversation:
    _require(sample, dict, path, "an object")
    sample_id = _str(sample, "sample_id", path)
    conv = _require(sample.get("conversation"), dict, f"{path}.conversation", "an object")
    cpath = path
    speaker_a = _str(conv, "speaker_a", cpath)
    speaker_b = _str(conv, "speaker_b", cpath)
    sessions = sorted(
        (int(m.group(1)), key) for key in conv if (m := _SESSION_KEY.fullmatch(key))
    )
    messages: list[ChatMessage] = []
    dia_index: dict[str, int] = {}
    for number, key in sessions:
        spath = f"{path}.{key}"
        turns = _require(conv[key], list, spath, "a list of turns")
        date = _str(conv, f"{key}_date_time", cpath, required=False)
        for j, turn in enumerate(turns):
            tpath = f"{spath}[{j}]"
            _require(turn, dict, tpath, "an object")
            speaker = _str(turn, "speaker", tpath)
            text = _str(turn, "text", tpath)
            dia_id = _str(turn, "dia_id", tpath)
            if not dia_id:
                raise InputError(f"{tpath}.dia_id", "must not be empty")
            if dia_id in dia_index:
                raise InputError(f"{tpath}.dia_id", f"duplicates {dia_id!r}")
            role: Literal["user", "assistant"]
            if speaker == speaker_a:
                role = "user"
            elif speaker == speaker_b:
                role = "assistant"
            else:
                raise InputError(f"{tpath}.speaker", f"{speaker!r} is neither speaker_a nor speaker_b")
            caption = _str(turn, "blip_caption", tpath, required=False).strip()
            try:
                message = ChatMessage(
                    floor=len(messages), role=role, speaker=speaker, text=text, date=date,
                    evidence_id=dia_id, attachments=(caption,) if caption else (),
                    extra={"session": number},
                )
            except ValidationError as exc:
                raise first_validation_error(exc, tpath) from None
            dia_index[dia_id] = message.floor
            messages.append(message)
    questions: list[LocomoQuestion] = []
    qa = _require(sample.get("qa", []), list, f"{path}.qa", "a list")
    for k, item in enumerate(qa):
        qpath = f"{path}.qa[{k}]"
        _require(item, dict, qpath, "an object")
        question = _str(item, "question", qpath)
        key = "answer" if "answer" in item else "adversarial_answer"
        if key not in item:
            raise InputError(f"{qpath}.answer", "is missing (neither answer nor adversarial_answer)")
        answer = _require(item[key], (str, int, float), f"{qpath}.{key}", "a string or a number")
        raw = _require(item.get("evidence", []), list, f"{qpath}.evidence", "a list")
        category = _require(item.get("category"), int, f"{qpath}.category", "an int")
        questions.append(LocomoQuestion(
            question=question,
            answer=str(answer),
            evidence=_normalise_evidence(raw, f"{qpath}.evidence", dia_index),
            category=category,
            raw_evidence=tuple(raw),
        ))
    return LocomoConversation(sample_id, speaker_a, speaker_b, messages, questions, dia_index)


def parse_locomo(data: Any) -> list[LocomoConversation]:
    """Convert already-decoded LoCoMo JSON (a list of samples) into conversations."""
    _require(data, list, "conversation", "a list of samples")
    return [_conversation(sample, f"conversation[{i}]") for i, sample in enumerate(data)]


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Read a LoCoMo file (``locomo10.json`` layout).

    >>> convs = load_locomo("locomo_dev.json")  # doctest: +SKIP
    >>> convs[0].messages[0].evidence_id
    'D1:1'
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("path", f"no such file: {p}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError("path", f"{p} is not valid JSON: {exc}") from None
    return parse_locomo(data)
