"""Tests of the multi-intent split and lexical query sources (``memory_recall.text.intent``):
reference §3.6 and §6.1 scenarios 1 and 4, with the departure-8 word/abbreviation/decimal rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_recall.text import intent
from memory_recall.text.intent import lexical_query_sources, split_intent_segments
from memory_recall.text.normalize import js_len, normalize_query


class TestReferenceScenario1:
    """stbme-reference §6.1 scenario 1; only the "a.b.c" case changes under departure 8."""

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("规则一，然后规则二。另外规则三", ["规则一", "规则二", "规则三"]),
            ("他后来怎么做？", ["他后来怎么做"]),
            ("ok", []),
            (
                "What did Bob do? And then, where did he go; also the tavern!",
                ["What did Bob do", "And then", "where did he go", "also the tavern"],
            ),
            (
                "明天我们计划去钟楼吗？顺便看看旧城区，还有王都的庆典",
                ["明天我们计划去钟楼吗", "看看旧城区", "王都的庆典"],
            ),
        ],
    )
    def test_scenario_1(self, text: str, expected: list[str]) -> None:
        assert split_intent_segments(text) == expected

    def test_scenario_1_six_segments_keep_first_four(self) -> None:
        text = "第一段，第二段，第三段，第四段，第五段，第六段"
        assert split_intent_segments(text, max_segments=4) == ["第一段", "第二段", "第三段", "第四段"]

    def test_scenario_1_a_b_c_is_one_word_under_departure_8(self) -> None:
        # The reference gives [] (it splits every "."); departure 8 keeps "a.b.c" whole, and at JS
        # length 5 it is a segment.
        assert split_intent_segments("a.b.c") == ["a.b.c"]


class TestDeparture8Punctuation:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            # The reference gives ["Smith went to Washington", "He said hello"].
            (
                "Mr. Smith went to Washington. He said hello!",
                ["Mr. Smith went to Washington", "He said hello"],
            ),
            ("It costs 3.50 dollars. Fine", ["It costs 3.50 dollars", "Fine"]),
            ("We need 1,000 coins, fast", ["We need 1,000 coins", "fast"]),
            ("Count 1, 2, 3 then", ["Count 1", "3 then"]),
            (
                "Ask Dr. Who, e.g. tomorrow. Or Mrs. Hudson",
                ["Ask Dr. Who", "e.g. tomorrow", "Or Mrs. Hudson"],
            ),
            ("Bring apples, pears etc. and go", ["Bring apples", "pears etc. and go"]),
            ("i.e. this one. MR. X and ST. Y", ["i.e. this one", "MR. X and ST. Y"]),
            ("Visit example.com. Then rest...ok fine", ["Visit example.com", "Then rest", "ok fine"]),
            ("version v1.2.3 is out. Update now", ["version v1.2.3 is out", "Update now"]),
            ("end.Next", ["end.Next"]),  # letters on both sides, no space: not a sentence end
        ],
    )
    def test_dots_and_commas(self, text: str, expected: list[str]) -> None:
        assert split_intent_segments(text) == expected

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("Hamr. Then more", ["Hamr", "Then more"]),  # "mr" inside a word is no abbreviation
            ("Ask the dr. Then go", ["Ask the dr. Then go"]),  # case-insensitive abbreviation
            ("I said no. Then left", ["I said no", "Then left"]),  # "no" is not in the list
        ],
    )
    def test_abbreviations_are_whole_words(self, text: str, expected: list[str]) -> None:
        assert split_intent_segments(text) == expected

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("规则一.规则二", ["规则一", "规则二"]),  # a "." next to CJK still splits
            ("去钟楼.com", ["去钟楼", "com"]),
            ("去钟楼3.5小时", ["去钟楼3.5小时"]),  # digits on both sides
            ("第一行\n第二行\n\n第三行", ["第一行", "第二行", "第三行"]),
            ("一二三；；；四五六！？七八九", ["一二三", "四五六", "七八九"]),
        ],
    )
    def test_cjk_punctuation(self, text: str, expected: list[str]) -> None:
        assert split_intent_segments(text) == expected


class TestDeparture8Connectives:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("虽然后来他走了，我们还在", ["虽然后来他走了", "我们还在"]),  # 虽然 + 后来, not 然后
            ("他突然后退一步", ["他突然后退一步"]),
            ("不同时期的人物", ["不同时期的人物"]),  # 不同 + 时期
            ("同时代的作家们", ["同时代的作家们"]),
            ("你说对了这个问题", ["你说对了这个问题"]),  # 说对了 = "said it right"
            ("这就对了吧朋友", ["这就对了吧朋友"]),
        ],
    )
    def test_connective_inside_a_longer_word_does_not_split(self, text: str, expected: list[str]) -> None:
        assert split_intent_segments(text) == expected

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("先去钟楼然后去城门", ["先去钟楼", "去城门"]),
            ("吃完饭对了明天去哪", ["吃完饭", "明天去哪"]),
            ("看看地图同时问问路人", ["看看地图", "问问路人"]),
            ("要带剑而且要带盾并且带药", ["要带剑", "要带盾"]),
            ("问问艾琳顺便问问罗伊另外问问王", ["问问艾琳", "问问罗伊", "问问王"]),
            (
                "我有三把剑还有两把弓",
                ["我有三把剑", "两把弓"],
            ),  # the reference's weakness stays: 还有 = "also have"
        ],
    )
    def test_standalone_connectives_split(self, text: str, expected: list[str]) -> None:
        assert split_intent_segments(text) == expected

    def test_english_words_are_not_connectives(self) -> None:
        assert split_intent_segments("go there and then also come back") == [
            "go there and then also come back"
        ]

    def test_every_exception_belongs_to_a_connective(self) -> None:
        assert set(intent.CONNECTIVE_EXCEPTIONS) <= set(intent.CONNECTIVES)
        assert intent.CONNECTIVES == ("顺便", "另外", "还有", "对了", "然后", "而且", "并且", "同时")


class TestLimits:
    def test_min_length_counts_js_units(self) -> None:
        # U+20000 is two UTF-16 units, so two of them reach min_length 3 while "ab" does not.
        assert split_intent_segments("ab，\U00020000\U00020000") == ["\U00020000\U00020000"]

    def test_min_length_parameter(self) -> None:
        assert split_intent_segments("ab，cde，fghi", min_length=4) == ["fghi"]
        assert split_intent_segments("ab，cde", min_length=1) == ["ab", "cde"]

    @pytest.mark.parametrize(
        ("max_segments", "expected"), [(0, ["一二三"]), (-3, ["一二三"]), (2, ["一二三", "四五六"])]
    )
    def test_max_segments_at_least_one(self, max_segments: int, expected: list[str]) -> None:
        assert split_intent_segments("一二三，四五六，七八九", max_segments=max_segments) == expected

    def test_exact_dedupe_before_the_limit(self) -> None:
        text = "规则一，规则一，规则二，Abc，abc，规则三"
        assert split_intent_segments(text) == ["规则一", "规则二", "Abc", "abc"]

    @pytest.mark.parametrize("text", ["", "   ", "。。。", "，然后，另外"])
    def test_nothing_to_split(self, text: str) -> None:
        assert split_intent_segments(text) == []


class TestLexicalQuerySources:
    def test_scenario_4(self) -> None:
        text = "规则一，然后规则二。另外规则三；顺便看看规则四！还有五"
        assert lexical_query_sources(text, multi_intent=True) == [
            text,
            "规则一",
            "规则二",
            "规则三",
            "看看规则四",
        ]

    def test_scenario_4_multi_intent_off(self) -> None:
        text = "规则一，然后规则二。另外规则三；顺便看看规则四！还有五"
        assert lexical_query_sources(text, multi_intent=False) == [text]

    def test_trailing_question_mark_gives_a_second_source(self) -> None:
        assert lexical_query_sources("他后来怎么做？", multi_intent=True) == [
            "他后来怎么做？",
            "他后来怎么做",
        ]

    def test_full_text_is_nq_normalised_and_duplicates_drop_case_insensitively(self) -> None:
        assert lexical_query_sources("  Hello   World  ", multi_intent=True) == ["Hello World"]
        assert lexical_query_sources("HELLO world. hello WORLD", multi_intent=True) == [
            "HELLO world. hello WORLD",
            "HELLO world",
        ]

    def test_max_segments(self) -> None:
        assert lexical_query_sources("一二三，四五六，七八九", multi_intent=True, max_segments=1) == [
            "一二三，四五六，七八九",
            "一二三",
        ]

    def test_given_segments_are_used(self) -> None:
        text = "规则一，然后规则二"
        assert lexical_query_sources(text, multi_intent=True, segments=["规则二"]) == [text, "规则二"]
        assert lexical_query_sources(text, multi_intent=False, segments=["规则二"]) == [text]
        segments = split_intent_segments(text, 4)
        assert lexical_query_sources(text, True, segments=segments) == lexical_query_sources(text, True)

    def test_empty(self) -> None:
        assert lexical_query_sources("", multi_intent=True) == []
        assert lexical_query_sources("  \n ", multi_intent=False) == []


_TEXT = st.one_of(
    st.text(max_size=120),
    st.text(
        alphabet=st.sampled_from(list("ab1 .,;!?\n，。；！？然后同时对了还有顺便不说虽Mr") + ["\U00020000"]),
        max_size=60,
    ),
)


class TestProperties:
    @settings(max_examples=200)
    @given(_TEXT, st.integers(-2, 6), st.integers(0, 5))
    def test_segments_are_trimmed_unique_long_enough_substrings(
        self, text: str, max_segments: int, min_length: int
    ) -> None:
        segments = split_intent_segments(text, max_segments=max_segments, min_length=min_length)
        assert len(segments) <= max(1, max_segments)
        assert len(segments) == len(set(segments))
        for segment in segments:
            assert segment == segment.strip()
            assert js_len(segment) >= min_length
            assert segment in text
        assert split_intent_segments(text, max_segments=max_segments, min_length=min_length) == segments

    @settings(max_examples=100)
    @given(_TEXT, st.booleans())
    def test_sources_start_with_the_full_text(self, text: str, multi_intent: bool) -> None:
        sources = lexical_query_sources(text, multi_intent=multi_intent)
        assert len({s.lower() for s in sources}) == len(sources)
        if sources:
            assert sources[0] == normalize_query(text)
