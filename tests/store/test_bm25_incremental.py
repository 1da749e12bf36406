"""The incrementally maintained BM25 index: after any sequence of adds, edits and deletes (and the compactions they
trigger) it answers every query exactly as a fresh build of the same documents does, scores bit for bit and order;
through the store, a write's touched rows bring the cached index up to date without a rebuild."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import node

import memory_recall.store.bm25_index as bm25_module
from memory_recall.store import Store
from memory_recall.store.bm25_index import Bm25Cache, Bm25Index, DocColumns, cache_for

WORDS = [
    "dragon", "dragons", "lair", "painting", "paints", "painted", "cave", "caves", "stone", "gate", "oath",
    "钟楼", "规则", "一", "x", "running", "runs",
]
QUERY_WORDS = [*WORDS, "unknown", "Dragon", "cave lair", "RUNS", "钟楼 规则"]
IDS = [f"n{i:02d}" for i in range(40)] + ["Z", "a10", "a2", "é1", "钟"]  # byte order differs from code-point order

column = st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join)
columns = st.tuples(column, column, column)
doc_id = st.sampled_from(IDS)
corpus = st.dictionaries(doc_id, columns, max_size=25)
# One step: documents added or replaced, and ids removed (possibly unknown ids).
step = st.tuples(st.dictionaries(doc_id, columns, max_size=6), st.lists(doc_id, max_size=4))
queries = st.lists(
    st.tuples(st.lists(st.sampled_from(QUERY_WORDS), min_size=1, max_size=5), st.sampled_from([1, 3, 10, 1000])),
    min_size=1,
    max_size=6,
)


def fresh(docs: dict[str, DocColumns], stem: str) -> Bm25Index:
    ids = list(docs)
    return Bm25Index.build(
        ids, [docs[i][0] for i in ids], [docs[i][1] for i in ids], [docs[i][2] for i in ids], stem=stem
    )


def assert_same(got: Bm25Index, want: Bm25Index, qs: list[tuple[list[str], int]]) -> None:
    """Every query answered identically (exact floats, exact order) and the same corpus statistics."""
    assert len(got) == len(want)
    assert got.node_ids == want.node_ids
    for terms, limit in qs:
        assert got.query(terms, limit) == want.query(terms, limit), (terms, limit)
    # The whole-corpus statistics too: term frequencies per document and the derived weights.
    assert got.norm.tobytes() == want.norm.tobytes()
    g_tf, w_tf = got.tf.tocsc(), want.tf.tocsc()
    g_terms = {code: term for term, code in got.vocab.items()}
    w_terms = {code: term for term, code in want.vocab.items()}
    for d in range(len(want)):
        g = {g_terms[c]: f for c, f in zip(*_col(g_tf, d), strict=True)}
        w = {w_terms[c]: f for c, f in zip(*_col(w_tf, d), strict=True)}
        assert g == w, got.node_ids[d]


def _col(m: object, d: int) -> tuple[list[int], list[float]]:
    start, end = m.indptr[d], m.indptr[d + 1]  # type: ignore[attr-defined]
    return m.indices[start:end].tolist(), m.data[start:end].tolist()  # type: ignore[attr-defined]


def apply(docs: dict[str, DocColumns], changed: dict[str, DocColumns], removed: list[str]) -> list[str]:
    """The model of one step on a plain dict; returns the removal list apply_delta gets (not also changed)."""
    removed = [i for i in removed if i not in changed]
    for i in removed:
        docs.pop(i, None)
    docs.update(changed)
    return removed


@pytest.fixture(params=[None, 3], ids=["default-compaction", "compact-often"])
def compaction(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run with the shipped compaction threshold (the delta segment never folds at these sizes) and with a tiny
    one (it folds every few steps), so both the delta path and the compacted path are checked."""
    if request.param is not None:
        monkeypatch.setattr(bm25_module, "COMPACT_MIN", request.param)
        monkeypatch.setattr(bm25_module, "COMPACT_FRACTION", 2)


class TestPropertyExact:
    @pytest.mark.usefixtures("compaction")
    @pytest.mark.parametrize("stem", ["none", "s", "porter"])
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(start=corpus, steps=st.lists(step, min_size=1, max_size=12), qs=queries)
    def test_random_edit_sequences_match_a_fresh_build(
        self, stem: str, start: dict[str, DocColumns], steps: list[tuple[dict[str, DocColumns], list[str]]],
        qs: list[tuple[list[str], int]],
    ) -> None:
        docs = dict(start)
        index = fresh(docs, stem)
        for changed, removed in steps:
            removed = apply(docs, changed, removed)
            index = index.apply_delta(changed, removed)
            assert_same(index, fresh(docs, stem), qs)

    @pytest.mark.parametrize("stem", ["none", "porter"])
    def test_an_older_version_keeps_answering_for_its_own_corpus(self, stem: str) -> None:
        rng = random.Random(5)
        docs = {i: (" ".join(rng.sample(WORDS, 3)), "", rng.choice(WORDS)) for i in IDS[:30]}
        versions = [(dict(docs), fresh(docs, stem))]
        for k in range(20):
            changed = {rng.choice(IDS): (" ".join(rng.sample(WORDS, 2)), f"new{k}", "") for _ in range(3)}
            removed = apply(docs, changed, [rng.choice(IDS)])
            versions.append((dict(docs), versions[-1][1].apply_delta(changed, removed)))
        qs = [([w], 1000) for w in WORDS] + [([f"new{k}" for k in range(20)], 1000), (["dragon", "cave"], 5)]
        for snapshot, index in versions:  # every version, after all the later ones were derived from it
            assert_same(index, fresh(snapshot, stem), qs)

    def test_removing_everything_and_adding_back(self) -> None:
        docs = {"a": ("dragon lair", "", ""), "b": ("cave", "dragon", "")}
        index = fresh(docs, "none").apply_delta({}, ["a", "b", "never-there"])
        assert len(index) == 0
        assert index.query(["dragon"], 10) == []
        index = index.apply_delta({"c": ("dragon", "", "")}, [])
        assert index.query(["dragon", "lair"], 10) == fresh({"c": ("dragon", "", "")}, "none").query(["dragon"], 10)

    def test_cjk_terms_and_stemming_exact_values(self) -> None:
        base = {"z1": ("钟楼", "", "规则 一"), "e1": ("paintings", "", ""), "e2": ("painted", "runs", "")}
        index = fresh(base, "porter").apply_delta({"z2": ("", "钟楼 钟楼", ""), "e3": ("painting", "", "")}, ["e2"])
        want = fresh({"z1": base["z1"], "e1": base["e1"], "z2": ("", "钟楼 钟楼", ""), "e3": ("painting", "", "")},
                     "porter")
        # N = 4, avgdl = (3 + 1 + 2 + 1) / 4; 钟楼 in two documents: idf = ln(2.5 / 2.5) → floor 1e-6.
        assert [i for i, _ in index.query(["钟楼"], 10)] == ["z2", "z1"]
        assert index.query(["钟楼", "paint"], 10) == want.query(["钟楼", "paint"], 10)
        assert index.query(["runs"], 10) == []  # e2 (the only document with "runs") was removed

    def test_bad_arguments(self) -> None:
        index = fresh({"a": ("x", "", "")}, "none")
        with pytest.raises(ValueError, match="both changed and removed"):
            index.apply_delta({"a": ("y", "", "")}, ["a"])
        with pytest.raises(ValueError, match="three term-column strings"):
            index.apply_delta({"b": ("y", None, "")}, [])  # type: ignore[dict-item]
        assert index.apply_delta({}, []) is index


class TestCompaction:
    def test_delta_folds_into_a_new_main_segment_past_the_threshold(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(bm25_module, "COMPACT_MIN", 4)
        monkeypatch.setattr(bm25_module, "COMPACT_FRACTION", 1000)
        docs = {f"m{i}": ("dragon", "", "") for i in range(10)}
        index = fresh(docs, "none")
        main = index.main
        for k in range(4):
            index = index.apply_delta({f"d{k}": ("cave dragon", "", "")}, [])
            assert index.main is main and index.delta is not None and len(index.delta.ids) == k + 1
        index = index.apply_delta({"d4": ("cave", "", "")}, [])  # the fifth delta document passes 4
        assert index.main is not main and index.delta is None and index.dead is None
        assert len(index.main.ids) == 15
        docs.update({f"d{k}": ("cave dragon", "", "") for k in range(4)} | {"d4": ("cave", "", "")})
        assert index.query(["dragon", "cave"], 100) == fresh(docs, "none").query(["dragon", "cave"], 100)

    def test_removed_main_documents_count_towards_the_threshold(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(bm25_module, "COMPACT_MIN", 2)
        monkeypatch.setattr(bm25_module, "COMPACT_FRACTION", 1000)
        index = fresh({f"m{i}": ("dragon", "", "") for i in range(6)}, "none")
        index = index.apply_delta({}, ["m0", "m1"])
        assert index.dead is not None and int(index.dead.sum()) == 2
        index = index.apply_delta({}, ["m2"])
        assert index.dead is None and index.main.ids == ("m3", "m4", "m5")


class TestCacheAdvance:
    def test_pending_rows_are_merged_on_the_next_get(self) -> None:
        cache = Bm25Cache()
        rows = {"a": ("dragon", "", ""), "b": ("cave", "", "")}
        built = cache.get("c", 3, lambda: fresh(rows, "none"))
        assert cache.advance("c", 3, 5, ["b", "c"]) == 1
        asked: list[frozenset[str]] = []

        def changed(ids: frozenset[str]) -> dict[str, DocColumns]:
            asked.append(ids)
            return {"c": ("dragon dragon", "", "")}  # b is gone (no row), c is new

        index = cache.get("c", 5, _no_build, changed=changed)
        assert asked == [frozenset({"b", "c"})]
        assert (cache.builds, cache.deltas) == (1, 1)
        assert index is not built and index.node_ids == ("a", "c")
        want = fresh({"a": ("dragon", "", ""), "c": ("dragon dragon", "", "")}, "none")
        assert index.query(["dragon", "cave"], 10) == want.query(["dragon", "cave"], 10)
        assert cache.get("c", 5, _no_build) is index  # complete now: served without asking again

    def test_several_writes_accumulate_and_other_versions_are_left_alone(self) -> None:
        cache = Bm25Cache()
        cache.get("c", 3, lambda: fresh({"a": ("x", "", "")}, "none"))
        assert cache.advance("c", 3, 4, ["a"]) == 1
        assert cache.advance("c", 4, 6, ["b"]) == 1
        assert cache.advance("c", 5, 7, ["z"]) == 0  # not the entry's version: a write we did not follow
        index = cache.get("c", 6, _no_build, changed=lambda ids: {i: ("y", "", "") for i in sorted(ids)})
        assert index.node_ids == ("a", "b") and [i for i, _ in index.query(["y"], 5)] == ["a", "b"]
        with pytest.raises(AssertionError, match="expected to be cached"):
            cache.get("c", 7, _no_build)

    def test_without_a_reader_a_pending_entry_is_rebuilt(self) -> None:
        cache = Bm25Cache()
        cache.get("c", 3, lambda: fresh({"a": ("x", "", "")}, "none"))
        cache.advance("c", 3, 4, ["a"])
        rebuilt = fresh({"a": ("y", "", "")}, "none")
        assert cache.get("c", 4, lambda: rebuilt) is rebuilt
        assert cache.builds == 2

    def test_too_many_pending_ids_drop_the_entry(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(bm25_module, "PENDING_MIN", 3)
        cache = Bm25Cache()
        cache.get("c", 1, lambda: fresh({"a": ("x", "", "")}, "none"))
        assert cache.advance("c", 1, 2, ["p", "q", "r"]) == 1
        assert cache.advance("c", 2, 3, ["s"]) == 0  # four pending > max(3, 1 // 4): a rebuild is cheaper
        with pytest.raises(AssertionError, match="expected to be cached"):
            cache.get("c", 3, _no_build)

    def test_rejects_a_version_that_does_not_follow(self) -> None:
        with pytest.raises(ValueError, match="must follow"):
            Bm25Cache().advance("c", 5, 4, [])


class TestBackgroundCompaction:
    """The cache folds a grown delta segment off the query path; deltas stored meanwhile are replayed."""

    @pytest.fixture
    def gate(self, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
        """Compaction waits for this event (so a test can store deltas while one runs); thresholds shrunk."""
        monkeypatch.setattr(bm25_module, "COMPACT_MIN", 2)
        monkeypatch.setattr(bm25_module, "COMPACT_FRACTION", 1000)
        event = threading.Event()
        original = Bm25Index.compacted

        def gated(self: Bm25Index) -> Bm25Index:
            assert event.wait(30), "the test never opened the gate"
            return original(self)

        monkeypatch.setattr(Bm25Index, "compacted", gated)
        return event

    def test_deltas_stored_during_a_compaction_are_replayed(self, gate: threading.Event) -> None:
        cache = Bm25Cache()
        docs = {f"m{i}": ("dragon", "", "cave") for i in range(6)}
        cache.get("c", 1, lambda: fresh(docs, "none"))
        main = cache.get("c", 1, _no_build).main
        version = 1
        # The first delta (one new document, one replaced main document: 2 delta + 1 masked > 2) starts a
        # compaction, gated; the next three are stored meanwhile.
        for k in range(4):
            cache.advance("c", version, version + 1, [f"d{k}", "m0"])
            version += 1
            rows = {f"d{k}": (f"lair x{k}", "", ""), "m0": (f"stone {k}", "", "")}
            docs.update(rows)
            index = cache.get("c", version, _no_build, changed=lambda ids, rows=rows: rows)
            assert index.main is main  # every answer so far came from the uncompacted index
            assert index.query(["lair", "stone", "dragon"], 100) == fresh(docs, "none").query(
                ["lair", "stone", "dragon"], 100
            )
        assert cache.compactions == 0
        gate.set()
        cache.wait()
        compacted = cache.get("c", version, _no_build)
        assert cache.compactions == 1 and compacted.main is not main
        # The index the compaction started from, folded; then the three later deltas replayed onto it.
        assert compacted.main.ids == ("d0", "m0", "m1", "m2", "m3", "m4", "m5")
        assert compacted.delta is not None and compacted.delta.ids == ("d1", "d2", "d3", "m0")
        for terms in (["lair"], ["stone", "x3"], ["dragon", "cave", "lair"], ["x0", "x1", "x2", "x3"]):
            assert compacted.query(terms, 100) == fresh(docs, "none").query(terms, 100)

    def test_a_rebuild_during_a_compaction_drops_it(self, gate: threading.Event) -> None:
        cache = Bm25Cache()
        docs = {f"m{i}": ("dragon", "", "") for i in range(4)}
        cache.get("c", 1, lambda: fresh(docs, "none"))
        cache.advance("c", 1, 2, ["a", "b", "e"])
        cache.get("c", 2, _no_build, changed=lambda ids: {i: ("lair", "", "") for i in ids})  # compaction starts
        cache.clear()
        docs.update({i: ("lair", "", "") for i in "abe"})
        rebuilt = cache.get("c", 2, lambda: fresh(docs, "none"))
        cache.advance("c", 2, 3, ["f"])
        latest = cache.get("c", 3, _no_build, changed=lambda ids: {"f": ("lair", "", "")})
        gate.set()
        cache.wait()
        assert cache.compactions == 0 and cache.get("c", 3, _no_build) is latest
        assert latest.main is rebuilt.main

    def test_without_background_the_fold_is_inline(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(bm25_module, "COMPACT_MIN", 2)
        monkeypatch.setattr(bm25_module, "COMPACT_FRACTION", 1000)
        cache = Bm25Cache(background=False)
        cache.get("c", 1, lambda: fresh({"m": ("x", "", "")}, "none"))
        cache.advance("c", 1, 2, ["a", "b", "e"])
        index = cache.get("c", 2, _no_build, changed=lambda ids: {i: ("x", "", "") for i in ids})
        assert index.delta is None and index.main.ids == ("a", "b", "e", "m")


def _no_build() -> Bm25Index:
    raise AssertionError("the index was expected to be cached")


CHAT = "inc"


def _fts_rows(store: Store) -> list[tuple[str, str, str, str]]:
    """The chat's FTS rows (node id, primary, secondary, body terms), in node-id order."""
    with store.read() as r:
        return [tuple(row) for row in r._conn.execute(
            "SELECT n.node_id, f.c0, f.c1, f.c2 FROM nodes AS n JOIN nodes_fts_content AS f ON f.id = n.rid "
            "WHERE n.chat_id = ? ORDER BY n.node_id", (CHAT,))]


def _store_fresh(store: Store, stem: str) -> list[list[tuple[str, float]]]:
    """The answers of an index rebuilt from the store's rows (the cache cleared first)."""
    cache_for(store).clear()
    return [store.bm25(CHAT, terms, 1000, stem=stem) for terms in STORE_QUERIES]


STORE_QUERIES = [["dragon"], ["cave", "lair"], ["painting", "钟楼"], ["oath", "x", "x"], ["gate", "stone", "runs"]]


class TestThroughTheStore:
    @pytest.mark.parametrize("stem", ["none", "porter"])
    def test_random_writes_match_a_rebuild(self, store: Store, stem: str) -> None:
        rng = random.Random(23)

        def text() -> str:
            return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 5)))

        store.upsert_nodes(CHAT, [node(i, title=text(), summary=text()) for i in IDS[:20]])
        store.bm25(CHAT, ["dragon"], 10, stem=stem)  # cached at this version
        for _ in range(25):
            op = rng.random()
            before = cache_for(store).builds
            deltas = cache_for(store).deltas
            with store.write(CHAT) as w:
                if op < 0.4:
                    w.upsert_nodes([node(rng.choice(IDS), title=text(), notes=text()) for _ in range(2)])
                elif op < 0.6:
                    w.delete_nodes([rng.choice(IDS)])
                elif op < 0.8:
                    archived = rng.random() < 0.5
                    w.upsert_nodes([node(rng.choice(IDS), title=text()).model_copy(update={"archived": archived})])
                else:
                    w.reinforce([rng.choice(IDS)], 1_700_000_000_000)
            got = [store.bm25(CHAT, terms, 1000, stem=stem) for terms in STORE_QUERIES]
            # Each write was followed: merged from its touched rows (or carried as is), never rebuilt.
            assert cache_for(store).builds == before
            assert cache_for(store).deltas - deltas in (0, 1)
            assert got == _store_fresh(store, stem)
            store.bm25(CHAT, ["dragon"], 10, stem=stem)  # cache the rebuilt index again for the next write

    def test_a_rewrite_with_the_same_fields_keeps_its_fts_row(self, store: Store, tmp_path: Path) -> None:
        """A chat turn rewrites nodes whose text stands (the previous message's link, an owner's floor range): their
        FTS rows are left as they are and the cached index is not told of them; a node whose fields change, whose
        fields come in another order or whose archived flag flips is written again. Either way the FTS rows are a
        fresh store's and the index answers as a rebuild."""
        a, b, c = node("a", title="dragon lair", notes="cave"), node("b", title="stone gate"), node("c", title="oath")
        store.upsert_nodes(CHAT, [a, b, c])
        store.bm25(CHAT, ["dragon"], 10)
        moved = a.model_copy(update={"seq": 7, "updated_at": 5, "next_id": "b"})  # the same fields
        grown = node("b", title="stone gate", summary="runs")
        gone = c.model_copy(update={"archived": True})
        with store.write(CHAT) as w:
            w.upsert_nodes([moved, grown, gone])
            first = set(w._fts_touched)
        reordered = node("b", summary="runs", title="stone gate")  # the same values in another order
        with store.write(CHAT) as w:
            w.upsert_nodes([moved, reordered, gone])
            second = set(w._fts_touched)
        assert (first, second) == ({"b", "c"}, {"b"})
        with Store(tmp_path / "fresh.sqlite3") as fresh:
            fresh.upsert_nodes(CHAT, [moved, reordered, gone])
            assert _fts_rows(store) == _fts_rows(fresh)
        assert _fts_rows(store) == [("a", "dragon lair", "", "cave"), ("b", "stone gate", "runs", "")]
        assert [store.bm25(CHAT, t, 1000) for t in STORE_QUERIES] == _store_fresh(store, "none")

    def test_two_writes_between_queries_and_a_reinforcement(self, store: Store) -> None:
        store.upsert_nodes(CHAT, [node("a", title="dragon lair"), node("b", title="cave")])
        store.bm25(CHAT, ["dragon"], 10)
        store.upsert_nodes(CHAT, [node("c", title="dragon dragon")])
        store.delete_nodes(CHAT, ["a"])
        store.reinforce(CHAT, ["b"], 1_700_000_000_000)
        builds = cache_for(store).builds
        got = store.bm25(CHAT, ["dragon", "cave"], 10)
        assert cache_for(store).builds == builds and [i for i, _ in got] == ["c", "b"]
        assert [store.bm25(CHAT, t, 1000) for t in STORE_QUERIES] == _store_fresh(store, "none")

    def test_concurrent_writers_and_readers_end_exact(self, store: Store) -> None:
        """Two writer threads and two reader threads on one chat (and both stem methods sharing the writes): no
        error, and once they stop, the maintained indexes answer as a rebuild does."""
        store.upsert_nodes(CHAT, [node(i, title=f"dragon {i}") for i in IDS[:10]])
        errors: list[BaseException] = []

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for k in range(40):
                    if rng.random() < 0.7:
                        store.upsert_nodes(CHAT, [node(rng.choice(IDS), title=" ".join(rng.sample(WORDS, 3)),
                                                       notes=f"w{seed} {k}")])
                    else:
                        store.delete_nodes(CHAT, [rng.choice(IDS)])
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        def reader(stem: str) -> None:
            try:
                for k in range(60):
                    store.bm25(CHAT, STORE_QUERIES[k % len(STORE_QUERIES)], 50, stem=stem)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(s,)) for s in (1, 2)]
        threads += [threading.Thread(target=reader, args=(stem,)) for stem in ("none", "porter")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        cache_for(store).wait()
        builds = cache_for(store).builds
        stems = ("none", "porter")
        maintained = {stem: [store.bm25(CHAT, t, 1000, stem=stem) for t in STORE_QUERIES] for stem in stems}
        assert cache_for(store).deltas > 0  # the writes were followed by merges, not only rebuilds
        assert maintained == {stem: _store_fresh(store, stem) for stem in stems}
        assert cache_for(store).builds > builds  # (the comparison itself rebuilt)

    def test_a_rolled_back_batch_leaves_the_cache_alone(self, store: Store) -> None:
        store.upsert_nodes(CHAT, [node("a", title="dragon")])
        before = store.bm25(CHAT, ["dragon", "lair"], 10)
        version = store.chat_version(CHAT)
        with pytest.raises(RuntimeError), store.write(CHAT) as w:
            w.upsert_nodes([node("b", title="lair")])
            raise RuntimeError("abort")
        assert store.chat_version(CHAT) == version
        assert cache_for(store).get(CHAT, version, _no_build) is not None
        assert store.bm25(CHAT, ["dragon", "lair"], 10) == before
