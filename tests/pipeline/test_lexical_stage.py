"""LexicalStage: the BM25 channel over the store's FTS5 index (recall-spec "BM25 channel")."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from ctx_helpers import NOW, assert_not_mutated, make_state, node, result_image, run_all, snapshot

from memory_recall.model.state import MemoryGraph
from memory_recall.pipeline.lexical import LexicalStage, bm25_query_terms
from memory_recall.pipeline.query_plan import QueryPlanStage
from memory_recall.pipeline.state import Providers, QueryPlan
from memory_recall.settings import LexicalSettings, QueryPlanSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import build_snapshot

PLAN = QueryPlanStage(QueryPlanSettings())


class RecordingIndex:
    """A tiny in-test BM25 index: returns fixed ``(node_id, score)`` rows and records its calls."""

    def __init__(self, rows):
        self.rows = list(rows)
        self.calls: list[tuple[list[str], int]] = []

    def __call__(self, terms, limit):
        self.calls.append((list(terms), limit))
        return self.rows[:limit]


def lexical(index=None, **settings) -> LexicalStage:
    return LexicalStage(LexicalSettings(**settings), Providers(lexical_index=index))


def planned(snap, message: str, **kw):
    state, _ = run_all(make_state(snap, message, **kw), PLAN)
    return state


def hit_ids(state):
    return [state.snapshot.ids[i] for i in state.bm25_hits[0].tolist()]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.sqlite3")
    yield s
    s.close()


class TestWithStore:
    CHAT = "chat-lex"

    def build(self, store: Store, nodes):
        store.replace_graph(self.CHAT, MemoryGraph(nodes=tuple(nodes)))
        snap = build_snapshot(store.snapshot_source(self.CHAT, ""), now_ms=NOW)
        return snap, Providers(lexical_index=partial(store.bm25, self.CHAT))

    def test_hits_normalised_by_the_best(self, store):
        snap, providers = self.build(
            store,
            [
                node("a", name="Alice", summary="常驻角色"),
                node("b", "location", name="Garden", summary="Alice walks in the garden"),
                node("c", "location", name="Tower"),
            ],
        )
        res = LexicalStage(LexicalSettings(), providers).run(planned(snap, "Where is the garden?"))
        assert hit_ids(res.state) == ["b"]
        assert res.state.bm25_hits[1].tolist() == [1.0]
        assert res.trace.notes["terms"] == ["garden"]
        assert res.state.meta["bm25Hits"] == 1

    def test_scores_in_unit_interval_best_first(self, store):
        snap, providers = self.build(
            store,
            [
                node("a", name="Alice", summary="Alice and the garden"),
                node("b", "location", name="Garden", summary="the garden of Alice, garden roses"),
                node("c", "location", name="Tower"),
            ],
        )
        res = LexicalStage(LexicalSettings(), providers).run(planned(snap, "Alice garden"))
        scores = res.state.bm25_hits[1]
        assert set(hit_ids(res.state)) == {"a", "b"}
        assert scores[0] == 1.0 and 0 < scores[1] <= 1.0
        assert np.all(np.diff(scores) <= 0)

    def test_inactive_nodes_dropped(self, store):
        snap, providers = self.build(
            store,
            [
                node("a", name="Alice"),
                node("b", name="Alice Two"),
                node("c", name="Alice Three", archived=True),
            ],
        )
        state = planned(snap, "Alice", active=np.array([True, False, False]))
        res = LexicalStage(LexicalSettings(), providers).run(state)
        assert hit_ids(res.state) == ["a"]

    def test_cjk_bigrams(self, store):
        snap, providers = self.build(
            store,
            [node("t", "location", name="钟楼", summary="艾琳觉得钟楼入口非常可疑"), node("m", name="集市")],
        )
        res = LexicalStage(LexicalSettings(), providers).run(planned(snap, "钟楼里到底有什么"))
        assert hit_ids(res.state) == ["t"]


class TestWithTinyIndex:
    def test_normalisation_order_and_filtering(self):
        snap = snapshot([node("a"), node("b"), node("c"), node("d", seq_range=None)])
        index = RecordingIndex([("c", 4.0), ("a", 2.0), ("b", 2.0), ("zz", 9.0), ("d", 8.0), ("a", 1.0)])
        res = lexical(index).run(planned(snap, "alpha beta"))
        assert hit_ids(res.state) == ["c", "a", "b"]  # unknown id and range-less node dropped; ties by id
        assert res.state.bm25_hits[1].tolist() == [1.0, 0.5, 0.5]
        assert index.calls == [(["alpha", "beta"], 30)]
        assert res.trace.score_kind == "bm25_normalised"
        assert (res.trace.count_in, res.trace.count_out) == (6, 3)

    def test_terms_from_all_sources_capped(self):
        snap = snapshot([node("a")])
        index = RecordingIndex([])
        lexical(index, bm25_max_terms=3).run(planned(snap, "规则一，然后规则二"))
        assert index.calls[0][0] == ["规则", "则一", "然后"]
        assert bm25_query_terms(["one two", "two three", "four"], 64) == ["one", "two", "three", "four"]

    def test_top_k_setting_is_the_limit(self):
        index = RecordingIndex([])
        lexical(index, bm25_top_k=7).run(planned(snapshot([node("a")]), "alpha"))
        assert index.calls[0][1] == 7

    def test_non_positive_scores_dropped(self):
        snap = snapshot([node("a"), node("b")])
        res = lexical(RecordingIndex([("a", 0.0), ("b", -1.0)])).run(planned(snap, "alpha"))
        assert res.state.bm25_hits[0].size == 0


class TestSkips:
    def test_disabled(self):
        index = RecordingIndex([("a", 1.0)])
        res = lexical(index, enable_bm25=False).run(planned(snapshot([node("a")]), "alpha"))
        assert (res.trace.skipped, res.trace.skip_reason) == (True, "bm25-disabled")
        assert res.state.skip_reasons == ()
        assert index.calls == []

    def test_no_index(self):
        res = lexical(None).run(planned(snapshot([node("a")]), "alpha"))
        assert res.trace.skip_reason == "no-lexical-index"
        assert res.state.skip_reasons == ("no-lexical-index",)

    @pytest.mark.parametrize("message", ["", "the of and", "？！"])
    def test_no_terms(self, message):
        index = RecordingIndex([("a", 1.0)])
        res = lexical(index).run(
            make_state(snapshot([node("a")]), message, plan=QueryPlan(lexical_sources=(message,)))
        )
        assert res.trace.skip_reason == "no-query-terms"
        assert res.state.bm25_hits[0].size == 0
        assert index.calls == []


class TestContract:
    def test_input_not_mutated(self):
        state = planned(snapshot([node("a"), node("b")]), "alpha")
        assert_not_mutated(state, lexical(RecordingIndex([("b", 3.0), ("a", 1.0)])).run)

    def test_deterministic(self):
        state = planned(snapshot([node(f"n{i}") for i in range(10)]), "alpha")
        stage = lexical(RecordingIndex([(f"n{i}", float(i % 3)) for i in range(10)]))
        assert result_image(stage.run(state)) == result_image(stage.run(state))
