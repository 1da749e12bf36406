"""Hand-made lists of the names in the Chinese fixture chats, and the precision/recall of an ingest against them.

Not a test module (``from zh_fixture_names import GOLD, score``). The lists were written by reading
``fixtures/chats/zh-*/chat.json`` before the CJK name rules existed, cross-checked with the characters and locations
of the fixture's ``graph.json`` (written by the fixture's author), and never edited from the detector's output:
every character, place, organisation, book and named event a reader of the chat would want as a memory hub. Each
entry is ``(canonical name, accepted spellings)``; the accepted spellings are the other ways the chat itself names
the same thing (``小米娅`` for 米娅, ``后山`` for 后山禁地). Generic nouns (孩子, 卫兵, 石板), titles (师姐, 长老),
time words (子时, 明晚) and descriptions (三尾白狐, 倒钟记号) are not names.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

GOLD: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "zh-bell-tower": (
        ("叶行", ("叶行",)),
        ("露西亚", ("露西亚",)),
        ("艾琳", ("艾琳",)),
        ("卡尔", ("卡尔",)),
        ("米娅", ("米娅", "小米娅")),
        ("钟楼", ("钟楼", "王都钟楼")),
        ("王都", ("王都",)),
        ("卫队", ("卫队", "王都卫队")),
        ("旧城区", ("旧城区",)),
        ("地下储藏室", ("地下储藏室", "储藏室")),
        ("地下入口", ("地下入口",)),
        ("下水道", ("下水道",)),
        ("旧祭坛", ("旧祭坛",)),
        ("集市", ("集市", "集市东头")),
        ("港口", ("港口",)),
        ("王宫", ("王宫",)),
    ),
    "zh-qingyun-sect": (
        ("林舟", ("林舟",)),
        ("苏晚", ("苏晚", "苏师姐")),
        ("玄机子", ("玄机子", "玄机子长老")),
        ("赵恒", ("赵恒",)),
        ("刘师叔", ("刘师叔",)),
        ("阿雪", ("阿雪",)),
        ("王大山", ("王大山",)),
        ("青云宗", ("青云宗",)),
        ("山门", ("山门", "青云宗山门")),
        ("外门弟子院", ("外门弟子院", "弟子院")),
        ("后山禁地", ("后山禁地", "后山", "禁地")),
        ("藏经阁", ("藏经阁",)),
        ("灵药园", ("灵药园", "药园")),
        ("清河镇", ("清河镇",)),
        ("演武场", ("演武场",)),
        ("青云引气诀", ("青云引气诀",)),
        ("百草杂记", ("百草杂记",)),
        ("狐妖之乱", ("狐妖之乱",)),
        ("外门小比", ("外门小比", "小比")),
        ("凝血草", ("凝血草",)),
    ),
}


def score(chat: str, found: Iterable[str]) -> tuple[Fraction, Fraction, list[str], list[str]]:
    """``(precision, recall, false positives, missed canonical names)`` of the names ``found`` in ``chat``.

    A found name is correct when it is an accepted spelling of some entry; an entry is recalled when any of its
    spellings was found (two spellings of one entry both count as correct, once each).
    """
    names = sorted(set(found))
    accepted = {spelling for _, spellings in GOLD[chat] for spelling in spellings}
    wrong = [n for n in names if n not in accepted]
    missed = [canon for canon, spellings in GOLD[chat] if not set(spellings) & set(names)]
    total = len(GOLD[chat])
    precision = Fraction(len(names) - len(wrong), len(names)) if names else Fraction(0)
    return precision, Fraction(total - len(missed), total), wrong, missed
