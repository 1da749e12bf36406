"""Tests of the BM25 tokenizer (``memory_recall.text.tokenize``): exact terms per script, stop words,
limits, FTS5 round trips with hostile input, and property tests."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import unicodedata
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_recall.errors import InputError
from memory_recall.text import tokenize as tok
from memory_recall.text.tokenize import (
    DEFAULT_MAX_QUERY_TERMS,
    FTS5_TOKENIZE_CLAUSE,
    STOP_WORDS,
    TOKENIZER_VERSION,
    fts_match_expression,
    index_terms,
    normalize_for_terms,
    query_terms,
)

# Every script and edge case the unit tests below use; the determinism test replays them.
SAMPLES = [
    "Café 钟楼入口",
    "Caroline's don't O'Brien James' it's",
    "3.14 1,000 1,000,000 3,5 v1.2.3 example.com",
    "Привет, мир! Ёлка йод",
    "서울에서 만나요",
    "東京タワーに行きたい ｶﾀｶﾅ ジョン・スミス",
    "Alice 在钟楼 met Bob",
]


def _fts(tokenize_clause: str = FTS5_TOKENIZE_CLAUSE) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE docs USING fts5(body, {tokenize_clause})")
    conn.execute("CREATE VIRTUAL TABLE docs_vocab USING fts5vocab(docs, 'row')")
    return conn


def _index(conn: sqlite3.Connection, texts: dict[int, str]) -> None:
    conn.executemany(
        "INSERT INTO docs(rowid, body) VALUES (?, ?)",
        [(rowid, " ".join(index_terms(text))) for rowid, text in texts.items()],
    )


def _search(conn: sqlite3.Connection, expression: str) -> list[int]:
    if not expression:
        return []
    rows = conn.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY rowid", (expression,))
    return [r[0] for r in rows]


def _vocab(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT term FROM docs_vocab ORDER BY term")]


class TestIndexTerms:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("", []),
            ("Hello, World!", ["hello", "world"]),
            ("HELLO hello Hello", ["hello", "hello", "hello"]),  # repeats kept: BM25 term frequency
            ("snake_case ＡＢＣ ﬁne Straße", ["snake", "case", "abc", "fine", "strasse"]),
        ],
    )
    def test_english(self, text: str, expected: list[str]) -> None:
        assert index_terms(text) == expected

    def test_chinese_unigrams_then_bigrams_per_run(self) -> None:
        assert index_terms("钟楼入口，旧城") == [
            "钟",
            "楼",
            "入",
            "口",
            "钟楼",
            "楼入",
            "入口",
            "旧",
            "城",
            "旧城",
        ]

    def test_chinese_stop_characters_and_words_dropped(self) -> None:
        # 的 是 are stop characters; 什么 我们 stop words; 么 什 们 on their own are not.
        assert index_terms("的 什么 我们 是") == ["什", "么", "们"]
        assert index_terms("我的书") == ["书", "我的", "的书"]

    def test_cjk_extension_a_and_compatibility_ideographs(self) -> None:
        # U+3400 (Ext-A) forms a run; U+FA0E (a compatibility ideograph without NFKC mapping) too;
        # U+F900 maps to U+8C48 under NFKC.
        assert index_terms("\u3400\u3401") == ["\u3400", "\u3401", "\u3400\u3401"]
        assert index_terms("\ufa0e\u4e00") == ["\ufa0e", "\u4e00", "\ufa0e\u4e00"]
        assert index_terms("\uf900") == ["\u8c48"]
        assert index_terms("\U00020000\U00020001") == ["\U00020000", "\U00020001", "\U00020000\U00020001"]

    def test_mixed_scripts(self) -> None:
        assert index_terms("Alice 在钟楼 met Bob") == ["alice", "钟", "楼", "在钟", "钟楼", "met", "bob"]

    def test_japanese_kana_and_kanji_share_a_run(self) -> None:
        assert index_terms("東京タワーに行きたい") == [
            "東", "京", "タ", "ワ", "ー", "に", "行", "き", "た", "い",
            "東京", "京タ", "タワ", "ワー", "ーに", "に行", "行き", "きた", "たい",
        ]  # fmt: skip

    def test_half_width_katakana_and_middle_dot(self) -> None:
        assert index_terms("ｶﾀｶﾅ") == ["カ", "タ", "カ", "ナ", "カタ", "タカ", "カナ"]
        assert index_terms("ジョン・スミス") == [
            "ジ",
            "ョ",
            "ン",
            "ジョ",
            "ョン",
            "ス",
            "ミ",
            "ス",
            "スミ",
            "ミス",
        ]

    def test_korean_words(self) -> None:
        assert index_terms("서울에서 만나요!") == ["서울에서", "만나요"]

    def test_cyrillic_and_greek_words_with_stripped_forms(self) -> None:
        assert index_terms("Привет, мир! Ёлка йод") == ["привет", "мир", "ёлка", "елка", "йод", "иод"]
        assert index_terms("Ελληνικά ΣΟΦΟΣ") == ["ελληνικά", "ελληνικα", "σοφοσ"]

    def test_accents_index_both_forms(self) -> None:
        assert index_terms("Café naïve Résumé") == ["café", "cafe", "naïve", "naive", "résumé", "resume"]

    def test_combining_marks_stay_in_the_word(self) -> None:
        # q + U+0303 has no precomposed form; Devanagari vowel signs are marks too.
        assert index_terms("q\u0303 e\u0301") == ["q\u0303", "q", "é", "e"]
        assert index_terms("हिंदी भाषा") == ["हिंदी", "भाषा"]

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("Caroline's", ["caroline"]),
            ("Caroline\u2019s", ["caroline"]),
            ("Caroline\u02bcs", ["caroline"]),
            ("don't", []),  # "dont" is a stop word
            ("O'Brien rock'n'roll", ["obrien", "rocknroll"]),
            ("James' it's", ["james"]),
            ("'quoted'", ["quoted"]),
        ],
    )
    def test_apostrophes(self, text: str, expected: list[str]) -> None:
        assert index_terms(text) == expected

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("3.14 v1.2.3", ["3.14", "v1.2.3"]),
            ("1,000 1,000,000", ["1000", "1000000"]),
            ("3,5 1,0000", ["3", "5", "1", "0000"]),
            ("example.com", ["example", "com"]),
            ("end. 42", ["end", "42"]),
            ("１２３", ["123"]),
        ],
    )
    def test_numbers(self, text: str, expected: list[str]) -> None:
        assert index_terms(text) == expected

    @pytest.mark.parametrize("text", ["", "!!! ... ？？", "the a of and", "的 了 是", "   \n\t"])
    def test_only_punctuation_or_stop_words(self, text: str) -> None:
        assert index_terms(text) == []


class TestQueryTerms:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("What did Bob do at the Tavern?", ["bob", "tavern"]),
            ("cafe", ["cafe"]),
            ("CAFÉ", ["cafe"]),
            ("钟楼入口", ["钟楼", "楼入", "入口"]),
            ("塔", ["塔"]),  # a lone ideograph stays a unigram
            ("钟 楼", ["钟", "楼"]),
            ("我们的", ["们的"]),  # only the stop bigram 我们 is dropped
            ("Alice 在钟楼 met Bob", ["alice", "在钟", "钟楼", "met", "bob"]),
            (
                "東京タワーに行きたい",
                ["東京", "京タ", "タワ", "ワー", "ーに", "に行", "行き", "きた", "たい"],
            ),
            ("서울에서 만나요", ["서울에서", "만나요"]),
            ("Ёлка и йод", ["елка", "и", "иод"]),
            ("It costs 3.50 dollars, 1,000 in total", ["costs", "3.50", "dollars", "1000", "total"]),
            ("Caroline's café", ["caroline", "cafe"]),
        ],
    )
    def test_terms(self, text: str, expected: list[str]) -> None:
        assert query_terms(text) == expected

    @pytest.mark.parametrize("text", ["", "?!。", "the of and", "的", "什么", "我们", "it's", "I'm"])
    def test_only_punctuation_or_stop_words_give_no_terms(self, text: str) -> None:
        assert query_terms(text) == []

    def test_stop_words_list_is_small_and_lower_case(self) -> None:
        assert 100 <= len(STOP_WORDS) <= 130
        assert all(w == normalize_for_terms(w) for w in STOP_WORDS)
        assert {"the", "and", "的", "什么", "我们"} <= STOP_WORDS

    def test_dedupe_keeps_first_occurrence_order(self) -> None:
        assert query_terms("beta alpha Beta gamma ALPHA café cafe") == ["beta", "alpha", "gamma", "cafe"]
        assert query_terms("钟楼钟楼") == ["钟楼", "楼钟"]

    def test_at_most_64_terms(self) -> None:
        text = " ".join(f"w{i}" for i in range(100))
        assert DEFAULT_MAX_QUERY_TERMS == 64
        assert query_terms(text) == [f"w{i}" for i in range(64)]
        assert query_terms(text, max_terms=3) == ["w0", "w1", "w2"]

    def test_limit_counts_distinct_terms(self) -> None:
        assert query_terms("a1 a1 a1 b2 a1 c3", max_terms=2) == ["a1", "b2"]

    @pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
    def test_invalid_max_terms(self, bad: object) -> None:
        with pytest.raises(InputError, match="max_terms"):
            query_terms("hello", max_terms=bad)  # type: ignore[arg-type]


class TestFtsMatchExpression:
    def test_quotes_and_ors(self) -> None:
        assert fts_match_expression(["cafe", 'a"b', "钟楼"]) == '"cafe" OR "a""b" OR "钟楼"'

    def test_empty(self) -> None:
        assert fts_match_expression([]) == ""
        assert fts_match_expression(["", "  ", "\x00"]) == ""

    def test_unsafe_characters_removed(self) -> None:
        assert fts_match_expression(["a\x00b", "c\ud800"]) == '"ab" OR "c"'


@pytest.fixture
def corpus() -> Iterator[sqlite3.Connection]:
    conn = _fts()
    _index(
        conn,
        {
            1: "foo bar",
            2: "We met near the harbour, a and b",
            3: "title x marks the spot",
            4: "艾琳觉得钟楼入口非常可疑",
            5: "Café au lait",
            6: "It costs 3.14 gold",
            7: "東京タワーに行きたい",
            8: "Ёлка в лесу",
        },
    )
    yield conn
    conn.close()


class TestFts5RoundTrip:
    @pytest.mark.parametrize(
        ("query", "expected_terms", "expected_rows"),
        [
            ('foo" OR "*', ["foo"], [1]),
            ("NEAR(a b)", ["near", "b"], [2]),
            ("title:x", ["title", "x"], [3]),
            ("body:foo", ["body", "foo"], [1]),
            ("{body}: bar", ["body", "bar"], [1]),
            ("-x", ["x"], [3]),
            ("^x", ["x"], [3]),
            ("foo*", ["foo"], [1]),
            ("x AND NOT foo", ["x", "foo"], [1, 3]),
            ("(", [], []),
            ('"', [], []),
            ("'", [], []),
        ],
    )
    def test_hostile_queries_are_inert(
        self, corpus: sqlite3.Connection, query: str, expected_terms: list[str], expected_rows: list[int]
    ) -> None:
        terms = query_terms(query)
        assert terms == expected_terms
        assert _search(corpus, fts_match_expression(terms)) == expected_rows

    @pytest.mark.parametrize(
        "raw", ['foo" OR "*', "NEAR(a b)", "title:x", "-x", "^x", '"', "AND", "*", ")", "a\x00"]
    )
    def test_raw_hostile_terms_run_without_error(self, corpus: sqlite3.Connection, raw: str) -> None:
        # Even a caller that skips query_terms cannot inject syntax; each string is one literal phrase.
        assert _search(corpus, fts_match_expression([raw])) == []

    @pytest.mark.parametrize(
        ("query", "expected_rows"),
        [
            ("钟楼", [4]),
            ("楼", [4]),  # single-character query matches through the index unigrams
            ("钟楼里到底有什么", [4]),
            ("cafe", [5]),
            ("café", [5]),
            ("CAFE", [5]),
            ("3.14", [6]),
            ("3", []),
            ("タワー", [7]),
            ("елка", [8]),
            ("ёлка", [8]),
            ("the", []),
        ],
    )
    def test_matches(self, corpus: sqlite3.Connection, query: str, expected_rows: list[int]) -> None:
        assert _search(corpus, fts_match_expression(query_terms(query))) == expected_rows

    def test_every_index_term_is_one_fts_token(self) -> None:
        conn = _fts()
        texts = dict(enumerate(SAMPLES, start=1))
        _index(conn, texts)
        expected = sorted({t for text in SAMPLES for t in index_terms(text)})
        assert _vocab(conn) == expected

    def test_ascii_tokenizer_splits_decimals_but_keeps_cjk(self) -> None:
        # Why FTS5_TOKENIZE_CLAUSE is not plain "ascii": it keeps non-ASCII runs whole but splits "3.14".
        conn = _fts("tokenize = 'ascii'")
        _index(conn, {1: "3.14 钟楼 café"})
        assert _vocab(conn) == ["14", "3", "cafe", "café", "楼", "钟", "钟楼"]

    def test_default_unicode61_folds_diacritics(self) -> None:
        # Why remove_diacritics 0: the default folds "café" into "cafe" and splits "3.14".
        conn = _fts("tokenize = 'unicode61'")
        _index(conn, {1: "3.14 café"})
        assert _vocab(conn) == ["14", "3", "cafe"]


class TestContract:
    def test_tokenizer_version(self) -> None:
        assert TOKENIZER_VERSION == 1

    def test_all_exports_exist(self) -> None:
        assert all(hasattr(tok, name) for name in tok.__all__)

    def test_mark_windows_cover_every_bmp_mark(self) -> None:
        marks = {cp for cp in range(0x10000) if unicodedata.category(chr(cp))[0] == "M"}
        covered = {cp for lo, hi in tok._MARK_WINDOWS for cp in range(lo, hi + 1)}
        assert marks - covered == set()

    def test_deterministic_across_hash_seeds(self) -> None:
        code = (
            "import json, sys; from memory_recall.text.tokenize import index_terms, query_terms; "
            "print(json.dumps([[index_terms(t), query_terms(t)] for t in json.loads(sys.argv[1])]))"
        )
        outputs = []
        for seed in ("1", "2"):
            env = {**os.environ, "PYTHONHASHSEED": seed}
            run = subprocess.run(
                [sys.executable, "-c", code, json.dumps(SAMPLES)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            outputs.append(json.loads(run.stdout))
        expected = [[index_terms(t), query_terms(t)] for t in SAMPLES]
        assert outputs == [expected, expected]


_ANY_TEXT = st.text(max_size=200)
# Biased towards the interesting scripts and separators so short examples hit them often.
_SCRIPT_TEXT = st.text(
    alphabet=st.sampled_from(
        list("aéZ9 .,'’-_\"*:^()钟楼入口的什么我们タワーかｶ서울ёлкаΣσ\u0301\u3099\n\t·。，")
        + ["\U00020000", "\ufa0e", "\u00a0", "\x00"]
    ),
    max_size=60,
)


class TestProperties:
    @settings(max_examples=200)
    @given(st.one_of(_ANY_TEXT, _SCRIPT_TEXT))
    def test_never_raise_and_query_terms_are_index_terms(self, text: str) -> None:
        index = index_terms(text)
        query = query_terms(text)
        assert set(query) <= set(index)
        assert len(query) == len(set(query)) <= DEFAULT_MAX_QUERY_TERMS
        assert all(t and not any(ch.isspace() for ch in t) and '"' not in t for t in index)

    @settings(max_examples=200)
    @given(st.one_of(_ANY_TEXT, _SCRIPT_TEXT))
    def test_span_nfkc_equals_whole_text_nfkc(self, text: str) -> None:
        assert normalize_for_terms(text) == unicodedata.normalize("NFKC", text).casefold()

    @settings(max_examples=100)
    @given(st.one_of(_ANY_TEXT, _SCRIPT_TEXT))
    def test_document_matches_its_own_text(self, text: str) -> None:
        conn = _fts()
        _index(conn, {1: text})
        expression = fts_match_expression(query_terms(text))
        assert _search(conn, expression) == ([1] if expression else [])

    @settings(max_examples=100)
    @given(st.lists(st.one_of(_ANY_TEXT, _SCRIPT_TEXT), max_size=5))
    def test_match_expression_of_arbitrary_terms_never_raises(self, terms: list[str]) -> None:
        conn = _fts()
        _index(conn, {1: "foo bar 钟楼"})
        _search(conn, fts_match_expression(terms))
