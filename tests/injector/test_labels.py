"""Block language and labels (``injector.labels``; departure "Injector labels" in docs/reference-differences.md)."""

from __future__ import annotations

import pytest
from injector_helpers import char_pov, node

from injector.labels import (
    EN,
    ZH,
    block_language,
    block_texts,
    labels_for,
    language_of,
    localised_headings,
)
from memory_recall.settings import InjectorHeadings


def _has_han(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


class TestBlockLanguage:
    @pytest.mark.parametrize(("texts", "expected"), [
        ([], "en"),
        (["", "123 !? …"], "en"),  # no letters at all
        (["abc", "林晚"], "zh"),  # 2 × 2 Han > 3 letters
        (["abcd", "林晚"], "en"),  # 4 is not more than 4
        (["Zoë", "é"], "en"),  # accented Latin letters count as Latin
        (["ひらがな", "한국어"], "en"),  # kana and hangul are neither
        (["㐀"], "zh"),  # CJK extension A is Han
    ])
    def test_weights(self, texts, expected):
        assert block_language(texts) == expected

    @pytest.mark.parametrize(("setting", "texts", "expected"), [
        ("en", ["林晚在钟楼"], "en"),
        ("zh", ["Erin in the study"], "zh"),
        ("auto", ["林晚在钟楼"], "zh"),
        ("auto", ["Erin in the study"], "en"),
    ])
    def test_setting(self, setting, texts, expected):
        assert language_of(setting, texts) == expected

    def test_labels_for(self):
        assert labels_for("en") is EN and labels_for("zh") is ZH


class TestBlockTexts:
    def test_what_is_read(self):
        pov = node("p", "pov_memory", scope=char_pov("Ann"), time="Dawn", span=("S", "E"), summary="A",
                   about=["B", ["C"]], certainty=0.5)
        raw = {"id": "r", "type": "event", "fields": {"summary": "R"}, "storyTime": {"label": "Noon"}}
        summary = {"text": "T", "story_time_span": {"start_label": "S1", "end_label": "E1"}}
        assert list(block_texts([pov, raw], [summary], ["Owner"])) == [
            "B", "C", "A", "Dawn", "S", "E", "Ann", "R", "Noon", "T", "S1", "E1", "Owner"]


class TestLabels:
    def test_every_chinese_default_heading_has_an_english_form(self):
        defaults = InjectorHeadings()
        chinese = sorted(name for name in InjectorHeadings.model_fields if _has_han(getattr(defaults, name)))
        assert chinese == sorted(EN.headings)
        assert not any(_has_han(text) for text in EN.headings.values())
        assert ZH.headings == {}

    def test_english_labels_have_no_chinese(self):
        words = [EN.floors, EN.unnamed_owner, EN.unnamed_character, *EN.owner_prefix.values()]
        assert words == ["messages", "unnamed", "unnamed character", "Character", "User"]
        assert (ZH.floors, ZH.unnamed_owner, ZH.unnamed_character, ZH.owner_prefix) == (
            "楼", "未命名", "未命名角色", {"character": "角色", "user": "用户"})

    def test_localised_headings(self):
        english = localised_headings(InjectorHeadings(), EN)
        assert english.group_state == "## Current State"
        assert english.user_pov_note == EN.headings["user_pov_note"]
        assert english.summary == "[Summary - Active Frontier]"  # English in the reference already
        assert localised_headings(InjectorHeadings(), ZH) == InjectorHeadings()
        custom = InjectorHeadings(group_state="## Zustand", group_rule="## 规则")
        assert localised_headings(custom, EN).model_dump() == {
            **english.model_dump(), "group_state": "## Zustand", "group_rule": "## 规则"}
        assert localised_headings(english, EN) == english  # idempotent
