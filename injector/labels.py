"""The fixed words of the injection block, in the block's language (recall-spec departure: see
``docs/reference-differences.md``, "Injector labels").

The reference prints Chinese labels in every block: the floor marker of summary headers (``楼 2 ~ 7``), the owner
prefixes of POV rows (``角色:`` / ``用户:``), the unnamed-owner fallbacks (``未命名`` / ``未命名角色``), the legacy
group headings (``## 当前状态记忆`` …) and the user-POV note. Here they follow the language of the memories printed:

* ``InjectorSettings.language`` ``"zh"`` — the reference's Chinese labels (:data:`ZH`), always;
* ``"en"`` — English labels (:data:`EN`), always;
* ``"auto"`` (default) — :func:`block_language` of the texts the block would print: Chinese when their Han
  characters weigh more than their Latin letters in the reference's token estimate (a Han character counts 1/2
  token, any other character 1/4: Chinese when ``2 × han > latin``), else English. A recall of Chinese memories
  gets Chinese labels, an English one English labels, whatever the host's interface language (the request's
  ``locale`` only picks the language of ``reason_text``: a Chinese user may write in English and the other way
  round, and the block is read by the LLM beside the chat, not by the user).

The bracket headings (``[Summary - Active Frontier]``, ``[Memory - Character POV: …]`` …), column names and table
names are English in the reference already and stay as they are in both languages. Headings are settings
(``InjectorSettings.headings``): a heading left at its default is printed in the block's language; a heading set
to any other text is printed as written.

Usage::

    labels = labels_for(language_of(settings.language, texts))
    headings = localised_headings(settings.headings, labels)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from memory_recall.settings import InjectorHeadings

__all__ = [
    "EN",
    "ZH",
    "BlockLanguage",
    "Labels",
    "block_language",
    "block_texts",
    "labels_for",
    "language_of",
    "localised_headings",
]

BlockLanguage = Literal["en", "zh"]


@dataclass(frozen=True)
class Labels:
    """The fixed words of one language. ``headings`` maps :class:`InjectorHeadings` field names to the text that
    replaces the field's (reference) default in this language; fields not listed keep their default."""

    language: BlockLanguage
    #: Summary header range marker: ``[Summary L0 / <floors> 2 ~ 7]``.
    floors: str
    #: POV row owner prefix by owner type; any other owner type prints ``POV``.
    owner_prefix: Mapping[str, str]
    #: Owner cell name when the scope has neither a name nor an id.
    unnamed_owner: str
    #: Character-POV section label when nothing names the owner.
    unnamed_character: str
    headings: Mapping[str, str] = field(default_factory=dict)


#: The reference's labels (§4.1, §4.2).
ZH = Labels(
    language="zh",
    floors="楼",
    owner_prefix={"character": "角色", "user": "用户"},
    unnamed_owner="未命名",
    unnamed_character="未命名角色",
)

#: English labels: the reference's Chinese words translated.
EN = Labels(
    language="en",
    floors="messages",
    owner_prefix={"character": "Character", "user": "User"},
    unnamed_owner="unnamed",
    unnamed_character="unnamed character",
    headings={
        "user_pov_note": "These are the user's (player's) subjective memories, not facts the characters know; use "
                         "them only as background on relationships, promises, feelings and the long-term "
                         "interaction.",
        "group_state": "## Current State",
        "group_episodic": "## Events and Episodes",
        "group_reflective": "## Reflections and Long-Term Anchors",
        "group_rule": "## Rules and Constraints",
        "group_other": "## Other Related Memories",
    },
)

_BY_LANGUAGE: dict[str, Labels] = {"en": EN, "zh": ZH}


def labels_for(language: BlockLanguage) -> Labels:
    """The labels of ``language``."""
    return _BY_LANGUAGE[language]


def _is_han(ch: str) -> bool:
    # The reference's token estimate counts U+4E00–U+9FFF as CJK; extension A (U+3400–U+4DBF) is Han too.
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf"


def _is_latin_letter(ch: str) -> bool:
    return ch < "\u0250" and ch.isalpha()


def block_language(texts: Iterable[str]) -> BlockLanguage:
    """``"zh"`` when the Han characters of ``texts`` weigh more than their Latin letters in the reference's token
    estimate (``2 × han > latin``), else ``"en"`` (also for no letters at all). Cost: one pass over the text."""
    han = latin = 0
    for text in texts:
        for ch in text:
            if _is_han(ch):
                han += 1
            elif _is_latin_letter(ch):
                latin += 1
    return "zh" if 2 * han > latin else "en"


def language_of(setting: str, texts: Iterable[str]) -> BlockLanguage:
    """The block language for ``InjectorSettings.language`` (``"auto"`` reads ``texts``, see the module docstring)."""
    if setting == "en":
        return "en"
    if setting == "zh":
        return "zh"
    return block_language(texts)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def block_texts(nodes: Iterable[Mapping[str, Any]], summaries: Iterable[Mapping[str, Any]] = (),
                names: Iterable[str] = ()) -> Iterable[str]:
    """The texts a block of ``nodes`` and summary entries prints (field values, story-time labels, scope owner
    names, summary texts and spans) and the owner ``names`` of its sections: what :func:`block_language` reads."""
    for node in nodes:
        fields = node.get("fields")
        if isinstance(fields, Mapping):
            for key in sorted(fields):  # sorted: the count does not depend on it, but keep iteration defined
                yield from _strings(fields[key])
        for key in ("story_time", "storyTime", "story_time_span", "storyTimeSpan", "scope"):
            part = node.get(key)
            if isinstance(part, Mapping):
                for sub in ("label", "start_label", "startLabel", "end_label", "endLabel", "owner_name", "ownerName"):
                    yield from _strings(part.get(sub))
    for entry in summaries:
        yield from _strings(entry.get("text"))
        span = entry.get("story_time_span", entry.get("storyTimeSpan"))
        if isinstance(span, Mapping):
            for sub in ("start_label", "startLabel", "end_label", "endLabel"):
                yield from _strings(span.get(sub))
    yield from names


def localised_headings(headings: InjectorHeadings, labels: Labels) -> InjectorHeadings:
    """``headings`` with every field still at its (reference) default replaced by ``labels``' text for it."""
    defaults = InjectorHeadings()
    update = {name: text for name, text in labels.headings.items()
              if getattr(headings, name) == getattr(defaults, name)}
    return headings.model_copy(update=update) if update else headings
