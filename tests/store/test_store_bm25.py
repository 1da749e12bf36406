"""The BM25 channel: exact order and scores on small English and Chinese corpora, hostile queries."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import new_chat_id, node

from memory_recall.errors import InputError
from memory_recall.model.graph import Node
from memory_recall.store import Store
from memory_recall.store.sqlite import fts_columns
from memory_recall.text.tokenize import query_terms

ENGLISH = [
    # Every document has exactly four index terms, so only the column weights tell them apart.
    node("t-title", title="dragon lair", summary="cave north"),
    node("s-summary", title="mountain pass", summary="dragon sleeps"),
    node("b-body", title="old road", notes="dragon seen"),
    node("f1", title="castle gate", summary="stone wall"),
    node("f2", title="river ford", summary="cold water"),
    node("f3", title="forest path", summary="tall trees"),
    node("f4", title="market square", summary="busy stalls"),
]

CHINESE = [
    node("z-title", title="钟楼", summary="夜晚很安静"),
    node("z-summary", title="集市", summary="钟楼附近的集市"),
    node("z-body", title="城门", notes="远处能看见钟楼"),
    node("z-f1", title="王都", summary="王城的中心"),
    node("z-f2", title="森林", summary="树木茂密"),
    node("z-f3", title="河流", summary="河水很冷"),
    node("z-f4", title="港口", summary="船只停泊"),
]


def reference_bm25(corpus: Iterable[Node], terms: list[str]) -> dict[str, float]:
    """FTS5's bm25 (k1 = 1.2, b = 0.75, weights 3/2/1, IDF floored at 1e-6), negated: higher is better."""
    docs = {n.id: [col.split() for col in fts_columns(n)] for n in corpus if not n.archived}
    n_rows = len(docs)
    avgdl = sum(len(c) for cols in docs.values() for c in cols) / n_rows
    weights = (3.0, 2.0, 1.0)
    out: dict[str, float] = {}
    for doc_id, cols in docs.items():
        length = sum(len(c) for c in cols)
        score, matched = 0.0, False
        for term in dict.fromkeys(terms):
            hits = sum(1 for other in docs.values() if any(term in c for c in other))
            idf = math.log((n_rows - hits + 0.5) / (hits + 0.5))
            idf = idf if idf > 0 else 1e-6
            freq = sum(w * c.count(term) for w, c in zip(weights, cols, strict=True))
            matched |= freq > 0
            score += idf * freq * 2.2 / (freq + 1.2 * (0.25 + 0.75 * length / avgdl))
        if matched:
            out[doc_id] = score
    return out


def _expected(corpus: list[Node], terms: list[str]) -> list[tuple[str, float]]:
    ref = reference_bm25(corpus, terms)
    return sorted(ref.items(), key=lambda kv: (-kv[1], kv[0]))


def _assert_ranking(got: list[tuple[str, float]], expected: list[tuple[str, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        assert a == pytest.approx(b, rel=1e-9)


class TestEnglish:
    def test_title_beats_summary_beats_body(self, store: Store) -> None:
        store.upsert_nodes("en", ENGLISH)
        got = store.bm25("en", query_terms("Where is the dragon?"))
        assert [i for i, _ in got] == ["t-title", "s-summary", "b-body"]
        _assert_ranking(got, _expected(ENGLISH, ["dragon"]))
        assert got[0][1] > got[1][1] > got[2][1] > 0

    def test_more_matched_terms_rank_higher(self, store: Store) -> None:
        store.upsert_nodes("en", ENGLISH)
        terms = query_terms("dragon sleeps in the mountain")
        assert terms == ["dragon", "sleeps", "mountain"]
        got = store.bm25("en", terms)
        assert [i for i, _ in got] == ["s-summary", "t-title", "b-body"]
        _assert_ranking(got, _expected(ENGLISH, terms))

    def test_term_frequency_and_length(self, store: Store) -> None:
        corpus = [
            node("twice", notes="ghost ghost town"),
            node("once", notes="ghost lamp town"),
            node("long", notes="ghost lamp town with many other words here"),
            *ENGLISH[3:],
        ]
        store.upsert_nodes("en", corpus)
        got = store.bm25("en", ["ghost"])
        assert [i for i, _ in got] == ["twice", "once", "long"]
        _assert_ranking(got, _expected(corpus, ["ghost"]))

    def test_ties_break_by_node_id(self, store: Store) -> None:
        corpus = [node("b2", title="twin"), node("a1", title="twin"), node("c3", title="twin"), *ENGLISH[3:]]
        store.upsert_nodes("en", corpus)
        got = store.bm25("en", ["twin"])
        assert [i for i, _ in got] == ["a1", "b2", "c3"]
        assert got[0][1] == got[1][1] == got[2][1]
        assert [i for i, _ in store.bm25("en", ["twin"], limit=2)] == ["a1", "b2"]

    def test_lists_and_numbers_are_indexed(self, store: Store) -> None:
        store.upsert_nodes(
            "en",
            [node("p", participants=["Alice", "Bob"]), node("n", notes={"deep": ["Ω", 3.14]}), *ENGLISH[3:]],
        )
        assert [i for i, _ in store.bm25("en", ["bob"])] == ["p"]
        assert [i for i, _ in store.bm25("en", ["3.14"])] == ["n"]


class TestChinese:
    def test_title_beats_summary_beats_body(self, store: Store) -> None:
        store.upsert_nodes("zh", CHINESE)
        terms = query_terms("钟楼")
        assert terms == ["钟楼"]
        got = store.bm25("zh", terms)
        assert [i for i, _ in got] == ["z-title", "z-summary", "z-body"]
        _assert_ranking(got, _expected(CHINESE, terms))

    def test_bigram_query(self, store: Store) -> None:
        store.upsert_nodes("zh", CHINESE)
        terms = query_terms("钟楼附近的集市在哪里")
        got = store.bm25("zh", terms)
        assert got[0][0] == "z-summary"
        _assert_ranking(got, _expected(CHINESE, terms))


class TestScope:
    def test_archived_nodes_and_other_chats_are_never_returned(self, store: Store) -> None:
        store.upsert_nodes("en", ENGLISH)
        store.upsert_nodes("other", [node("t-title", title="dragon"), node("x", title="dragon dragon")])
        store.upsert_nodes("en", [Node(id="arch", type="event", archived=True, fields={"title": "dragon"})])
        assert [i for i, _ in store.bm25("en", ["dragon"])] == ["t-title", "s-summary", "b-body"]
        assert [i for i, _ in store.bm25("other", ["dragon"])] == ["x", "t-title"]
        # Un-archiving indexes the node again; archiving removes it.
        store.upsert_nodes("en", [Node(id="arch", type="event", fields={"title": "dragon dragon"})])
        assert store.bm25("en", ["dragon"])[0][0] == "arch"
        store.upsert_nodes(
            "en", [Node(id="t-title", type="event", archived=True, fields={"title": "dragon"})]
        )
        assert "t-title" not in [i for i, _ in store.bm25("en", ["dragon"])]

    def test_statistics_are_per_chat(self, store: Store) -> None:
        # IDF and average length come from the chat's own rows (the store-wide FTS5 statistics did not).
        other = [node(f"o{i}", title="dragon") for i in range(3)]
        store.upsert_nodes("en", ENGLISH)
        store.upsert_nodes("other", other)
        ref = reference_bm25(ENGLISH, ["dragon"])
        got = store.bm25("en", ["dragon"])
        assert [s for _, s in got] == pytest.approx(
            [ref["t-title"], ref["s-summary"], ref["b-body"]], rel=1e-9
        )

    def test_updates_reindex(self, store: Store) -> None:
        store.upsert_nodes("en", ENGLISH)
        store.upsert_nodes("en", [node("b-body", title="dragon road", notes="dragon seen")])
        assert store.bm25("en", ["dragon"])[0][0] == "b-body"
        store.upsert_nodes("en", [node("t-title", title="no longer")])
        assert "t-title" not in [i for i, _ in store.bm25("en", ["dragon"])]


HOSTILE = [
    '"',
    '""',
    "'",
    "a OR b",
    "a AND NOT b",
    "NEAR(a b, 2)",
    "*",
    "dra*",
    "^dragon",
    "-dragon",
    "+dragon",
    "primary_terms: dragon",
    "{primary_terms body_terms}: dragon",
    "chat_id:en",
    "rowid = 1",
    "(",
    ")",
    "'); DROP TABLE nodes; --",
    "dragon\x00lair",
    "\ud800dragon",
    "\x01\x02",
    "   ",
    "😀",
    "AND",
    "OR",
    "NOT",
    "dragon" * 5000,
    "龍 OR 钟楼*",
    '"dragon" OR "',
    "a:b:c",
    "\\",
    "%",
    "_",
    "?",
    "$1",
]


class TestHostile:
    @pytest.mark.parametrize("text", HOSTILE)
    def test_hostile_text_never_breaks_the_query(self, store: Store, text: str) -> None:
        store.upsert_nodes("en", ENGLISH)
        via_tokenizer = store.bm25("en", query_terms(text))
        raw_terms = store.bm25("en", [text, "dragon"])  # raw caller terms are quoted too
        assert all(isinstance(i, str) and isinstance(s, float) for i, s in via_tokenizer + raw_terms)
        assert [i for i, _ in raw_terms] == ["t-title", "s-summary", "b-body"]
        assert len(store.get_nodes("en")) == len(ENGLISH)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(text=st.text(max_size=60))
    def test_any_text(self, shared_store: Store, text: str) -> None:
        chat = new_chat_id()
        shared_store.upsert_nodes(chat, [node("a", title="dragon"), node("b", title="castle")])
        for terms in (query_terms(text), [text], text.split()):
            for node_id, score in shared_store.bm25(chat, terms):
                assert node_id in ("a", "b") and math.isfinite(score)

    def test_a_document_always_finds_itself(self, store: Store) -> None:
        texts = [
            "Café au lait",
            "钟楼入口",
            "O'Brien's 3.14 rule",
            "ジョン・スミス",
            "Ёлка и йогурт",
            "snake_case",
        ]
        store.upsert_nodes("c", [node(f"n{i}", title=t) for i, t in enumerate(texts)])
        for i, t in enumerate(texts):
            assert f"n{i}" in [j for j, _ in store.bm25("c", query_terms(t))], t

    def test_argument_validation(self, store: Store) -> None:
        assert store.bm25("en", []) == []
        assert store.bm25("en", ["", "  ", "\x00"]) == []
        with pytest.raises(InputError) as info:
            store.bm25("en", "dragon")
        assert info.value.field == "terms"
        with pytest.raises(InputError) as info:
            store.bm25("en", ["dragon", 3])  # type: ignore[list-item]
        assert info.value.field == "terms[1]"
        for bad in (0, -1, 1.5, True):
            with pytest.raises(InputError) as info:
                store.bm25("en", ["dragon"], limit=bad)  # type: ignore[arg-type]
            assert info.value.field == "limit"

    def test_the_index_survives_hostile_queries(self, store: Store) -> None:
        store.upsert_nodes("en", ENGLISH)
        for text in HOSTILE:
            store.bm25("en", [text])
        conn = sqlite3.connect(str(store.path))
        assert conn.execute("SELECT count(*) FROM nodes").fetchone()[0] == len(ENGLISH)
        conn.close()
        assert store.check_integrity() == []
