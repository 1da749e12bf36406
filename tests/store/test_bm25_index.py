"""The per-chat BM25 index: hand-computed values, agreement with FTS5's bm25(), per-chat statistics, cache."""

from __future__ import annotations

import math
import random
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import node

from memory_recall.store import Store
from memory_recall.store.bm25_index import BUILD_CHUNK, Bm25Cache, Bm25Index, cache_for, split_query_term
from memory_recall.text.tokenize import fts_match_expression, query_terms

_FTS_SQL = (
    "SELECT node_id, -bm25(nodes_fts, 3.0, 2.0, 1.0) AS score FROM nodes_fts "
    "WHERE nodes_fts MATCH ? AND chat_id = ? ORDER BY score DESC, node_id LIMIT ?"
)


def fts5_scores(path: Path, chat_id: str, terms: list[str]) -> dict[str, float]:
    """SQLite's own bm25() for the quoted OR query (statistics over every chat of the file)."""
    conn = sqlite3.connect(str(path))
    try:
        rows = conn.execute(_FTS_SQL, (fts_match_expression(terms), chat_id, 100_000)).fetchall()
    finally:
        conn.close()
    return {str(i): float(s) for i, s in rows}


def _ln(x: float) -> float:
    return math.log(x)


class TestHandComputed:
    """Three documents; N = 3, token counts 2, 3, 4, so avgdl = 3."""

    index = Bm25Index.build(
        ["a", "b", "c"],
        ["dragon lair", "", "castle"],
        ["", "dragon", ""],
        ["", "cave cave", "stone wall gate"],
    )

    def test_one_rare_term(self) -> None:
        # lair: n_q = 1, idf = ln(2.5 / 1.5); doc a: f = 3 (primary), D = 2, k1·(1 − b + b·2/3) = 0.9.
        assert self.index.query(["lair"], 10) == [("a", _ln(2.5 / 1.5) * (3 * 2.2) / (3 + 0.9))]

    def test_common_term_idf_floor_and_sum(self) -> None:
        # dragon: n_q = 2 → ln(1.5 / 2.5) < 0 → idf 1e-6. Doc b: dragon f = 2 (secondary), cave f = 2 (body
        # twice), D = 3 → norm 1.2. Doc a: dragon f = 3, norm 0.9.
        got = self.index.query(["dragon", "cave"], 10)
        b = 1e-6 * (2 * 2.2) / (2 + 1.2) + _ln(2.5 / 1.5) * (2 * 2.2) / (2 + 1.2)
        a = 1e-6 * (3 * 2.2) / (3 + 0.9)
        assert [i for i, _ in got] == ["b", "a"]
        assert got[0][1] == pytest.approx(b, rel=1e-12)
        assert got[1][1] == pytest.approx(a, rel=1e-12)

    def test_repeated_term_counts_twice_and_unknown_terms_are_dropped(self) -> None:
        once = self.index.query(["lair"], 10)[0][1]
        assert self.index.query(["lair", "nowhere", "lair"], 10) == [("a", pytest.approx(2 * once, rel=1e-12))]
        assert self.index.query(["nowhere"], 10) == []
        assert self.index.query([], 10) == []

    def test_query_terms_are_plain_text(self) -> None:
        assert split_query_term("Lair") == ["lair"]
        assert split_query_term('dragon OR "lair*"') == ["dragon", "or", '"lair*"']
        assert split_query_term("lair\x00") == ["lair"]
        assert split_query_term("钟楼") == ["钟楼"]
        assert self.index.query(["LAIR"], 10) == self.index.query(["lair"], 10)
        # Several tokens in one term are scored as those terms.
        assert self.index.query(["cave lair"], 10) == self.index.query(["cave", "lair"], 10)

    def test_empty_index(self) -> None:
        empty = Bm25Index.build([], [], [], [])
        assert len(empty) == 0
        assert empty.query(["dragon"], 5) == []

    def test_bad_build_input(self) -> None:
        with pytest.raises(ValueError, match="same length"):
            Bm25Index.build(["a"], ["x"], [], [""])
        with pytest.raises(ValueError, match="unique"):
            Bm25Index.build(["b", "a", "b"], ["x", "x", "x"], ["", "", ""], ["", "", ""])


WORDS = ["dragon", "lair", "cave", "castle", "stone", "river", "café", "钟楼", "集市", "north"]
_doc = st.fixed_dictionaries(
    {f: st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join) for f in ("title", "summary", "notes")}
)


class TestAgreesWithFts5:
    @settings(max_examples=40, deadline=None)
    @given(
        docs=st.lists(_doc, min_size=1, max_size=12),
        archived=st.sets(st.integers(0, 11), max_size=3),
        terms=st.lists(st.sampled_from([*WORDS, "cafe", "钟", "楼", "unknown"]), min_size=1, max_size=5),
    )
    def test_single_chat_store(self, docs: list[dict[str, str]], archived: set[int], terms: list[str]) -> None:
        with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "s.sqlite3") as store:
            nodes = [node(f"n{i:02d}", **fields) for i, fields in enumerate(docs)]
            for i in archived & set(range(len(nodes))):
                nodes[i] = nodes[i].model_copy(update={"archived": True})
            store.upsert_nodes("only", nodes)
            got = store.bm25("only", terms, limit=100)
            expected = fts5_scores(store.path, "only", terms)
        assert sorted(i for i, _ in got) == sorted(expected)
        for node_id, score in got:
            assert score == pytest.approx(expected[node_id], rel=1e-9, abs=1e-15)
        # Own order: score desc, then id. (Mathematically equal scores summed in another term order can differ
        # in the last bit in either implementation, so the order is not compared with FTS5's bit for bit.)
        assert got == sorted(got, key=lambda kv: (-kv[1], kv[0]))

    def test_chinese_corpus(self, store: Store) -> None:
        corpus = [
            node("z-title", title="钟楼", summary="夜晚很安静"),
            node("z-summary", title="集市", summary="钟楼附近的集市"),
            node("z-body", title="城门", notes="远处能看见钟楼"),
            node("z-f1", title="王都", summary="王城的中心"),
        ]
        store.upsert_nodes("zh", corpus)
        terms = query_terms("钟楼附近的集市在哪里")
        got = store.bm25("zh", terms)
        expected = fts5_scores(store.path, "zh", terms)
        assert [i for i, _ in got] == ["z-summary", "z-title", "z-body"]
        assert dict(got) == pytest.approx(expected, rel=1e-9)


class TestPerChat:
    def test_another_chat_does_not_move_scores(self, store: Store) -> None:
        store.upsert_nodes("a", [node("a1", title="dragon lair"), node("a2", notes="dragon"), node("a3", title="x")])
        before = store.bm25("a", ["dragon", "lair"])
        fts_before = fts5_scores(store.path, "a", ["dragon", "lair"])
        assert dict(before) == pytest.approx(fts_before, rel=1e-9)  # one chat: the same as FTS5
        store.upsert_nodes("b", [node(f"b{i}", title="dragon dragon", notes="lair") for i in range(5)])
        assert store.bm25("a", ["dragon", "lair"]) == before
        # FTS5's store-wide statistics did move: the old channel's scores changed.
        assert fts5_scores(store.path, "a", ["dragon", "lair"]) != pytest.approx(fts_before, rel=1e-6)

    def test_archived_nodes_are_not_counted(self, store: Store) -> None:
        store.upsert_nodes("a", [node("a1", title="dragon"), node("a2", title="cave"), node("a3", title="lair")])
        before = store.bm25("a", ["dragon"])
        store.upsert_nodes("a", [node("a4", title="dragon")])
        store.upsert_nodes("a", [node("a4", title="dragon").model_copy(update={"archived": True})])
        assert store.bm25("a", ["dragon"]) == before


class TestOrder:
    def test_ties_by_node_id_byte_order(self, store: Store) -> None:
        ids = ["é1", "z", "Z", "a10", "a2", "钟"]
        store.upsert_nodes("t", [node(i, title="twin") for i in ids] + [node("other", title="x y")])
        got = store.bm25("t", ["twin"])
        assert [i for i, _ in got] == sorted(ids, key=lambda i: i.encode())
        assert [i for i, _ in got] == ["Z", "a10", "a2", "z", "é1", "钟"]
        assert len({s for _, s in got}) == 1
        assert [i for i, _ in store.bm25("t", ["twin"], limit=2)] == ["Z", "a10"]

    def test_cut_keeps_ties_in_id_order(self) -> None:
        # 30 documents, scores in three tied groups; every limit cuts in id order within a group.
        ids = [f"d{i:02d}" for i in range(30)]
        primary = ["key" if i % 3 == 0 else "" for i in range(30)]
        secondary = ["key" if i % 3 == 1 else "" for i in range(30)]
        body = ["key" if i % 3 == 2 else "" for i in range(30)]
        index = Bm25Index.build(ids[::-1], primary[::-1], secondary[::-1], body[::-1])
        full = index.query(["key"], 100)
        assert [i for i, _ in full] == ids[0::3] + ids[1::3] + ids[2::3]
        for limit in range(1, 31):
            assert index.query(["key"], limit) == full[:limit]

    def test_deterministic(self) -> None:
        args = (["b", "a", "c"], ["x y", "y", "x x"], ["", "x", ""], ["z", "", "y"])
        assert Bm25Index.build(*args).query(["x", "y"], 3) == Bm25Index.build(*args).query(["x", "y"], 3)


class TestExactFormula:
    """Query scores are the formula summed per document in query-term order from the index's own statistics
    (``idf``, ``norm``; checked against FTS5 above), bit for bit, and the cut keeps score desc then id order."""

    @staticmethod
    def reference(index: Bm25Index, terms: list[str], limit: int) -> list[tuple[str, float]]:
        tf = index.tf.toarray()
        scores: dict[int, float] = {}
        for term in terms:
            for token in split_query_term(term):
                row = index.vocab.get(token)
                if row is None:
                    continue
                for d in np.flatnonzero(tf[row]).tolist():
                    f = tf[row, d]
                    part = index.idf[row] * ((f * (1.2 + 1.0)) / (f + index.norm[d]))
                    scores[d] = scores.get(d, 0.0) + part
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        return [(index.node_ids[d], float(v)) for d, v in ranked]

    def test_random_queries(self) -> None:
        rng = random.Random(11)
        ids, primary, secondary, body = TestChunkedBuild._corpus(3, 400)
        index = Bm25Index.build(ids, primary, secondary, body)
        vocab = [*index.vocab, "unknown", "Dragon", "cave lair"]
        for _ in range(60):
            terms = [rng.choice(vocab) for _ in range(rng.randrange(1, 7))]  # repeats count twice
            limit = rng.choice([1, 5, 30, 1000])
            expected = self.reference(index, terms, limit)
            assert index.query(terms, limit) == expected, terms
        assert len(index.query(["dragon", "lair", "cave"], 1000)) > 100  # the queries hit many documents


class TestChunkedBuild:
    """``build`` tokenises a few documents at a time; the index must not depend on the chunk size."""

    @staticmethod
    def _corpus(seed: int, n: int) -> tuple[list[str], list[str], list[str], list[str]]:
        rng = random.Random(seed)
        words = ["dragon", "dragons", "lair", "painting", "paints", "cave", "stone", "钟楼", "gate", "x", "oath"]
        words += [f"w{i}" for i in range(60)]  # rare terms keep the vocabulary growing chunk after chunk

        def column() -> str:
            return " ".join(rng.choice(words) for _ in range(rng.randrange(0, 6)))

        ids = [f"n{i:04d}" for i in range(n)]
        rng.shuffle(ids)  # unsorted input: build sorts by node id before chunking
        primary, secondary, body = [column() for _ in ids], [column() for _ in ids], [column() for _ in ids]
        body[17] = "  cave\tlair  "  # odd whitespace: that chunk falls back to per-document counting
        return ids, primary, secondary, body

    @pytest.mark.parametrize("stem", ["none", "porter"])
    def test_chunk_size_never_changes_the_index(self, stem: str) -> None:
        args = self._corpus(8, 300)
        whole = Bm25Index.build(*args, stem=stem, chunk=300)
        queries = [["dragon"], ["lair", "cave"], ["paint", "w3", "钟楼"], ["w59", "x", "x"], ["nowhere"]]
        for chunk in (1, 7, 64, 299, BUILD_CHUNK):
            part = Bm25Index.build(*args, stem=stem, chunk=chunk)
            assert part.node_ids == whole.node_ids
            assert list(part.vocab.items()) == list(whole.vocab.items())  # same codes in the same order
            for got, want in [
                (part.tf.indptr, whole.tf.indptr),
                (part.tf.indices, whole.tf.indices),
                (part.tf.data, whole.tf.data),
                (part.norm, whole.norm),
                (part.idf, whole.idf),
            ]:
                assert got.tobytes() == want.tobytes()
            for terms in queries:
                assert part.query(terms, 1000) == whole.query(terms, 1000)
        # Every token is counted once with its column weight, the odd-whitespace document's too.
        ids, primary, secondary, body = args
        want_total = sum(w * len(text.split()) for w, col in zip((3, 2, 1), args[1:], strict=True) for text in col)
        assert whole.tf.data.sum() == want_total
        odd = whole.node_ids.index(ids[17])
        assert whole.tf[:, odd].sum() == 3 * len(primary[17].split()) + 2 * len(secondary[17].split()) + 2

    def test_bad_chunk(self) -> None:
        with pytest.raises(ValueError, match="chunk"):
            Bm25Index.build(["a"], ["x"], [""], [""], chunk=0)


class TestCache:
    def test_rebuilds_after_a_write_bumps_the_version(self, store: Store) -> None:
        store.upsert_nodes("c", [node("c1", title="dragon"), node("c2", title="cave"), node("c3", title="x")])
        cache = cache_for(store)
        builds = cache.builds
        first = store.bm25("c", ["dragon"])
        assert [i for i, _ in first] == ["c1"]
        assert store.bm25("c", ["dragon"]) == first
        assert cache.builds == builds + 1
        store.upsert_nodes("other", [node("o1", title="dragon")])  # another chat's version only
        assert store.bm25("c", ["dragon"]) == first
        assert cache.builds == builds + 1
        deltas = cache.deltas
        store.upsert_nodes("c", [node("c4", title="dragon dragon")])
        assert [i for i, _ in store.bm25("c", ["dragon"])] == ["c4", "c1"]
        # The write's one new row was merged into the cached index: no rebuild from the chat.
        assert (cache.builds, cache.deltas) == (builds + 1, deltas + 1)
        cache.clear()
        assert [i for i, _ in store.bm25("c", ["dragon"])] == ["c4", "c1"]
        assert cache.builds == builds + 2

    def test_writer_sees_its_uncommitted_rows(self, store: Store) -> None:
        store.upsert_nodes("c", [node("c1", title="dragon"), node("c2", title="cave")])
        assert store.bm25("c", ["lair"]) == []
        with store.write("c") as w:
            w.upsert_nodes([node("c3", title="lair")])
            assert [i for i, _ in w.bm25("c", ["lair"])] == ["c3"]
            assert store.bm25("c", ["lair"]) == []  # committed state only
        assert [i for i, _ in store.bm25("c", ["lair"])] == ["c3"]

    def test_deleted_and_recreated_chat_is_not_served_stale(self, store: Store) -> None:
        store.upsert_nodes("c", [node("c1", title="dragon"), node("c2", title="cave")])
        assert [i for i, _ in store.bm25("c", ["dragon"])] == ["c1"]
        store.delete_chat("c")
        assert store.bm25("c", ["dragon"]) == []
        store.upsert_nodes("c", [node("n1", title="dragon"), node("n2", title="x")])
        assert [i for i, _ in store.bm25("c", ["dragon"])] == ["n1"]

    def test_eviction_and_older_versions(self) -> None:
        cache = Bm25Cache(max_chats=2)
        idx = [Bm25Index.build([f"n{i}"], ["t"], [""], [""]) for i in range(4)]
        assert cache.get("a", 5, lambda: idx[0]) is idx[0]
        assert cache.get("a", 4, lambda: idx[1]) is idx[1]  # an older version is built but not kept
        assert cache.get("a", 5, lambda: idx[2]) is idx[0]
        cache.get("b", 1, lambda: idx[2])
        cache.get("c", 1, lambda: idx[3])  # evicts a, the least recently used
        assert cache.get("a", 5, lambda: idx[1]) is idx[1]
        assert cache.builds == 5
