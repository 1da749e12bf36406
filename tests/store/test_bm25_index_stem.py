"""Stemmed BM25 index: documents and queries stem alike, statistics over stems, the cache key holds the method."""

from __future__ import annotations

import math

import pytest
from store_helpers import node

from memory_recall.errors import InputError
from memory_recall.store import Store
from memory_recall.store.bm25_index import Bm25Cache, Bm25Index, cache_for
from memory_recall.text.stem import stem_term

IDS = ["a", "b", "c"]
PRIMARY = ["", "", ""]
SECONDARY = ["painting sunrise", "paints lake", "adopted dog"]
BODY = ["", "", ""]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.sqlite3")
    yield s
    s.close()


def test_stemmed_vocabulary_and_statistics() -> None:
    index = Bm25Index.build(IDS, PRIMARY, SECONDARY, BODY, stem="porter")
    assert sorted(index.vocab) == ["adopt", "dog", "lake", "paint", "sunris"]
    # "painted" reaches both documents whose word stems to "paint": n_q = 2 of N = 3 → idf floor 1e-6;
    # each has f = 2 (secondary), D = 2 = avgdl → norm 1.2.
    got = index.query(["painted"], 10)
    assert [i for i, _ in got] == ["a", "b"]
    assert got[0][1] == pytest.approx(1e-6 * (2 * 2.2) / (2 + 1.2), rel=1e-12)
    # A rare stem: "adopting" → "adopt", n_q = 1 → idf ln(2.5 / 1.5).
    assert index.query(["adopting"], 10) == [("c", math.log(2.5 / 1.5) * (2 * 2.2) / (2 + 1.2))]


def test_unstemmed_index_is_unchanged() -> None:
    plain = Bm25Index.build(IDS, PRIMARY, SECONDARY, BODY)
    assert plain.stem == "none"
    assert plain.query(["painted"], 10) == []
    assert [i for i, _ in plain.query(["paints"], 10)] == ["b"]


@pytest.mark.parametrize("method", ["s", "porter"])
def test_every_document_matches_its_own_words(method: str) -> None:
    words = ["ponies", "running", "glasses", "relational", "café", "2023", "shoes", "hiking", "hikes"]
    index = Bm25Index.build(
        [f"n{i}" for i in range(len(words))], [""] * len(words), words, [""] * len(words), stem=method
    )
    for i, word in enumerate(words):
        assert f"n{i}" in [d for d, _ in index.query([word], 50)], word
        assert stem_term(word, method) in index.vocab


def test_bad_stem_method() -> None:
    with pytest.raises(ValueError, match="stem must be one of none, s, porter, english"):
        Bm25Index.build(IDS, PRIMARY, SECONDARY, BODY, stem="snowball")


def test_cache_key_holds_the_stem_method() -> None:
    cache = Bm25Cache()
    plain = Bm25Index.build(IDS, PRIMARY, SECONDARY, BODY)
    stemmed = Bm25Index.build(IDS, PRIMARY, SECONDARY, BODY, stem="porter")
    assert cache.get("chat", 1, lambda: plain) is plain
    assert cache.get("chat", 1, lambda: stemmed, "porter") is stemmed
    assert cache.get("chat", 1, lambda: stemmed) is plain
    assert cache.get("chat", 1, lambda: plain, "porter") is stemmed
    assert cache.builds == 2
    with pytest.raises(ValueError, match="stemmed 'none', expected 's'"):
        cache.get("chat", 1, lambda: plain, "s")


def test_store_bm25_stem_option(store: Store) -> None:
    store.upsert_nodes("c", [node("c1", title="painting"), node("c2", title="lake"), node("c3", title="dog")])
    cache = cache_for(store)
    builds = cache.builds
    assert store.bm25("c", ["painted"]) == []
    assert [i for i, _ in store.bm25("c", ["painted"], stem="porter")] == ["c1"]
    assert [i for i, _ in store.bm25("c", ["dogs"], stem="s")] == ["c3"]
    assert store.bm25("c", ["painted"], stem="porter") == store.bm25("c", ["painting"], stem="porter")
    assert cache.builds == builds + 3  # none, porter, s: one index each, the repeat is cached
    with store.read() as r:
        assert [i for i, _ in r.bm25("c", ["painted"], stem="porter")] == ["c1"]
    with pytest.raises(InputError, match="stem"):
        store.bm25("c", ["painted"], stem="snowball")
