"""VectorPrefilterStage: embeddings, similarity search, merge, failure policy (reference §3.7, departures
3–4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ctx_helpers import (
    MODEL,
    CountingEmbedder,
    assert_not_mutated,
    make_state,
    node,
    result_image,
    rules_snapshot,
    run_all,
    snapshot,
)

from memory_recall.errors import StrictModeViolation
from memory_recall.pipeline.query_plan import QueryPlanStage
from memory_recall.pipeline.state import Providers, QueryPlan
from memory_recall.pipeline.vector_prefilter import (
    VectorPrefilterStage,
    merge_limit,
    merge_vector_hits,
    query_similarities,
    top_k_per_query,
)
from memory_recall.settings import QueryPlanSettings, SelectionSettings, VectorSettings

SCENARIO_26_RECENT = ["[assistant]: 他提到了规则二的限制", "[user]: 我们先看规则一", "[user]: 他后来怎么做？"]


def vector_stage(embedder=None, top_k: int = 20, strict: bool = False, enabled: bool = True):
    return VectorPrefilterStage(
        VectorSettings(enabled=enabled),
        SelectionSettings(top_k=top_k),
        Providers(embedder=embedder, strict=strict),
    )


def planned(snap, message: str, recent=(), multi_intent: bool = True, **kw):
    plan_stage = QueryPlanStage(QueryPlanSettings(enable_multi_intent=multi_intent))
    return plan_stage.run(make_state(snap, message, recent, **kw)).state


def ids(state):
    return [state.snapshot.ids[i] for i in state.vector_hits[0].tolist()]


class TestScenario5Merge:
    def test_scenario_5_merge_max_per_node_ties_by_id(self):
        id_rank = np.array([0, 1, 2])  # a, b, c
        a, b, c = 0, 1, 2
        per_query = [
            (np.array([a, b]), np.array([0.5, 0.7]), np.array([0.5, 0.7])),
            (np.array([a, c]), np.array([0.6, 0.7]), np.array([0.6, 0.7])),
        ]
        idx, weighted, raw, raw_count = merge_vector_hits(per_query, id_rank, limit=2)
        assert raw_count == 4
        assert idx.tolist() == [b, c]
        assert weighted.tolist() == [0.7, 0.7]

    def test_merge_keeps_raw_cosine_of_the_winning_query(self):
        per_query = [
            (np.array([0]), np.array([0.35]), np.array([0.5])),  # weight 0.7
            (np.array([0]), np.array([0.18]), np.array([0.9])),  # weight 0.2
        ]
        idx, weighted, raw, _ = merge_vector_hits(per_query, np.array([0]), limit=24)
        assert (idx.tolist(), weighted.tolist(), raw.tolist()) == ([0], [0.35], [0.5])

    def test_equal_weighted_scores_earlier_query_wins(self):
        per_query = [
            (np.array([0]), np.array([0.4]), np.array([0.4])),
            (np.array([0]), np.array([0.4]), np.array([0.8])),
        ]
        _, _, raw, _ = merge_vector_hits(per_query, np.array([0]), limit=24)
        assert raw.tolist() == [0.4]

    def test_merge_limit(self):
        assert (merge_limit(4), merge_limit(12), merge_limit(20)) == (24, 24, 40)

    def test_empty(self):
        idx, weighted, raw, count = merge_vector_hits([], np.zeros(0, dtype=np.int64), 24)
        assert (idx.size, weighted.size, raw.size, count) == (0, 0, 0, 0)


class TestScenario26Queries:
    def test_scenario_26_multi_intent_off(self):
        emb = CountingEmbedder()
        state = planned(rules_snapshot(), "他后来怎么做？", SCENARIO_26_RECENT, multi_intent=False)
        res = vector_stage(emb, top_k=4).run(state)
        assert emb.calls == ["他后来怎么做？", "他提到了规则二的限制", "我们先看规则一"]
        assert res.state.meta["vectorHits"] == 9
        assert res.state.meta["vectorMergedHits"] == 3
        assert res.state.vector_raw_hit_count == 9

    def test_scenario_26_multi_intent_on_departure_8(self):
        """The reference makes 4 calls (adds ``他后来怎么做``) and reports ``vectorHits 12``; with departure 8
        the
        near-duplicate query is not embedded: 3 calls, 9 hits."""
        emb = CountingEmbedder()
        state = planned(rules_snapshot(), "他后来怎么做？", SCENARIO_26_RECENT)
        res = vector_stage(emb, top_k=4).run(state)
        assert emb.calls == ["他后来怎么做？", "他提到了规则二的限制", "我们先看规则一"]
        assert res.state.meta["vectorHits"] == 9
        assert res.state.meta["vectorMergedHits"] == 3

    def test_scenario_27_query_texts(self):
        emb = CountingEmbedder()
        vector_stage(emb, top_k=4).run(
            planned(rules_snapshot(), "请根据规则给出结论", ["用户：现在该怎么做？"])
        )
        assert emb.calls == ["请根据规则给出结论", "现在该怎么做？"]


class TestSearch:
    def test_weighted_and_raw_scores(self):
        emb = CountingEmbedder(vectors={"x": [1, 0, 0], "y": [0, 0, 1]})
        res = vector_stage(emb).run(planned(rules_snapshot(), "x", ["[assistant]: y"]))
        idx, weighted, raw = res.state.vector_hits
        assert ids(res.state) == ["rule-1", "rule-2", "rule-3"]
        cos2 = 0.9 / np.hypot(0.9, 0.1)
        np.testing.assert_allclose(weighted, [0.778, 0.778 * cos2, 0.222], rtol=1e-6)
        np.testing.assert_allclose(raw, [1.0, cos2, 1.0], rtol=1e-6)
        assert res.state.vector_status.retrieval_status == "ok"
        assert res.state.vector_status.semantic_search_used is True
        assert res.state.query_vectors.shape == (2, 3)
        assert res.trace.score_direction == "higher_is_better"

    def test_only_positive_cosines(self):
        emb = CountingEmbedder(default=[1, 0, 0])
        res = vector_stage(emb).run(planned(rules_snapshot(), "x"))
        assert ids(res.state) == ["rule-1", "rule-2"]  # rule-3 is orthogonal

    def test_top_k_ties_in_graph_order_then_merge_by_id(self):
        nodes = [node(i, seq=n) for n, i in enumerate(["z1", "a2", "m3"])]
        snap = snapshot(nodes, embeddings={i: [1, 0, 0] for i in ("z1", "a2", "m3")}, model_id=MODEL)
        res = vector_stage(CountingEmbedder(), top_k=2).run(planned(snap, "x"))
        # Per query the first two in graph order (z1, a2); the merged list breaks the tie by id.
        assert ids(res.state) == ["a2", "z1"]

    def test_top_k_helper(self):
        sims = np.array([[0.5, 0.9, 0.9, -0.2, 0.1]], dtype=np.float32)
        eligible = np.array([True, True, True, True, False])
        ((idx, scores),) = top_k_per_query(sims, eligible, 2)
        assert idx.tolist() == [1, 2]
        ((idx, _),) = top_k_per_query(sims, eligible, 10)
        assert idx.tolist() == [1, 2, 0]

    def test_inactive_and_vectorless_nodes_never_hit(self):
        snap = rules_snapshot()
        state = planned(snap, "x", active=np.array([False, True, True]))
        res = vector_stage(CountingEmbedder()).run(state)
        assert ids(res.state) == ["rule-2", "rule-3"]
        assert res.trace.count_in == 2


class TestFailurePolicy:
    """Departure 3: degrade to lexical_fallback, or raise in strict mode (§7 items 20–21)."""

    def test_timeout_falls_back(self):
        emb = CountingEmbedder(fail_on={"*": "timeout"})
        res = vector_stage(emb).run(planned(rules_snapshot(), "他后来怎么做？", SCENARIO_26_RECENT))
        status = res.state.vector_status
        assert (status.retrieval_status, status.semantic_search_used, status.failure_category) == (
            "lexical_fallback",
            False,
            "timeout",
        )
        assert emb.calls == ["他后来怎么做？"]  # the first failure stops the remaining queries
        assert res.state.vector_hits[0].size == 0
        assert res.state.query_vectors is None
        assert res.trace.skip_reason == "embedding-unavailable"
        assert res.state.skip_reasons == ("embedding-unavailable",)

    def test_later_query_failure_discards_earlier_vectors(self):
        emb = CountingEmbedder(fail_on={"他提到了规则二的限制": "http_status"})
        res = vector_stage(emb).run(planned(rules_snapshot(), "他后来怎么做？", SCENARIO_26_RECENT))
        assert len(emb.calls) == 2
        assert res.state.vector_status.failure_category == "http_status"
        assert res.state.vector_hits[0].size == 0

    def test_strict_mode_raises(self):
        emb = CountingEmbedder(fail_on={"*": "connect"})
        with pytest.raises(StrictModeViolation) as info:
            vector_stage(emb, strict=True).run(planned(rules_snapshot(), "x"))
        assert info.value.cause.category == "connect"

    def test_wrong_query_dimension(self):
        emb = CountingEmbedder(default=[1, 0, 0, 0])
        res = vector_stage(emb).run(planned(rules_snapshot(), "x"))
        assert res.state.vector_status.failure_category == "dimension_mismatch"
        with pytest.raises(StrictModeViolation):
            vector_stage(emb, strict=True).run(planned(rules_snapshot(), "x"))

    def test_other_model_is_never_compared(self):
        emb = CountingEmbedder(model_id="other:model")
        res = vector_stage(emb).run(planned(rules_snapshot(), "x"))
        assert res.state.vector_status.retrieval_status == "lexical_fallback"
        assert res.state.vector_status.failure_category == "dimension_mismatch"
        assert emb.calls == []


class TestSkips:
    def test_disabled(self):
        res = vector_stage(CountingEmbedder(), enabled=False).run(planned(rules_snapshot(), "x"))
        assert (res.trace.skip_reason, res.state.vector_status.retrieval_status) == (
            "vector-disabled",
            "disabled",
        )
        assert res.state.skip_reasons == ()

    def test_no_embedder(self):
        res = vector_stage(None).run(planned(rules_snapshot(), "x"))
        assert res.trace.skip_reason == "no-embedder"
        assert res.trace.notes["referenceSkipReason"] == "vector-config-invalid"
        assert res.state.vector_status.retrieval_status == "disabled"

    def test_no_queries(self):
        emb = CountingEmbedder()
        res = vector_stage(emb).run(make_state(rules_snapshot(), "x", plan=QueryPlan()))
        assert res.trace.skip_reason == "no-vector-queries"
        assert emb.calls == []

    def test_no_node_vectors_is_an_embedding_failure(self):
        """Active nodes without a single vector: embedding failed or never ran for the chat. Departure 3: reported
        with its category (the first version skipped with an empty category, and strict mode did not notice)."""
        emb = CountingEmbedder()
        snap = snapshot([node("a", name="Alice")])
        res = vector_stage(emb).run(planned(snap, "Alice"))
        assert res.trace.skip_reason == "embedding-unavailable"
        status = res.state.vector_status
        assert (status.retrieval_status, status.semantic_search_used, status.failure_category) == (
            "lexical_fallback", False, "missing_vectors")
        assert emb.calls == []

    def test_no_node_vectors_in_strict_mode_raises(self):
        snap = snapshot([node("a", name="Alice")])
        with pytest.raises(StrictModeViolation):
            vector_stage(CountingEmbedder(), strict=True).run(planned(snap, "Alice"))

    def test_empty_graph(self):
        res = vector_stage(CountingEmbedder()).run(planned(snapshot(), "x"))
        assert res.trace.skipped and res.state.vector_hits[0].size == 0


class TestContract:
    def test_input_not_mutated(self):
        state = planned(rules_snapshot(), "他后来怎么做？", SCENARIO_26_RECENT)
        assert_not_mutated(state, vector_stage(CountingEmbedder()).run)

    def test_deterministic(self):
        rng = np.random.default_rng(7)
        names = [f"n{i:03d}" for i in range(200)]
        vecs = {n: rng.normal(size=8) for n in names}
        snap = snapshot([node(n, seq=i) for i, n in enumerate(names)], embeddings=vecs, model_id=MODEL)
        emb = CountingEmbedder(default=rng.normal(size=8), vectors={"y": rng.normal(size=8)})
        state = planned(snap, "x", ["[assistant]: y"])
        stage = vector_stage(emb, top_k=10)
        first, second = stage.run(state), stage.run(state)
        assert result_image(first) == result_image(second)
        assert first.state.vector_hits[0].size == 20

    def test_matches_brute_force(self):
        rng = np.random.default_rng(3)
        names = [f"n{i:02d}" for i in range(60)]
        vecs = {n: rng.normal(size=6) for n in names}
        snap = snapshot([node(n, seq=i) for i, n in enumerate(names)], embeddings=vecs, model_id=MODEL)
        q = rng.normal(size=6)
        state, _ = run_all(make_state(snap, "x"), QueryPlanStage(QueryPlanSettings()))
        res = vector_stage(CountingEmbedder(default=q), top_k=5).run(state)
        cos = {n: float(np.dot(v / np.linalg.norm(v), q / np.linalg.norm(q))) for n, v in vecs.items()}
        expected = sorted((n for n in names if cos[n] > 0), key=lambda n: -cos[n])[:5]
        assert ids(res.state) == expected
        np.testing.assert_allclose(res.state.vector_hits[2], [cos[n] for n in expected], rtol=1e-5)


@pytest.mark.parametrize("n", [2500, 10001])
@pytest.mark.parametrize("q", [1, 2, 3, 5, 8])
def test_similarities_do_not_depend_on_the_blas_thread_count(n: int, q: int) -> None:
    """A single query used to be a GEMV, whose float32 bits differ between one and two OpenBLAS threads at these
    sizes; every query count now gives the same bits for any thread count, each query's row has the same bits
    whatever the other queries are, and the result equals the exact float64 product to float32 precision."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(n + q)
    emb = rng.standard_normal((n, 384)).astype(np.float32)
    queries = rng.standard_normal((q, 384)).astype(np.float32)
    with threadpool_limits(1, user_api="blas"):
        one = query_similarities(emb, queries)
        alone = [query_similarities(emb, queries[j : j + 1]) for j in range(q)]
    with threadpool_limits(2, user_api="blas"):
        two = query_similarities(emb, queries)
    assert one.shape == (q, n) and one.dtype == np.float32 and one.flags.c_contiguous
    assert one.tobytes() == two.tobytes()
    assert b"".join(a.tobytes() for a in alone) == one.tobytes()
    exact = queries.astype(np.float64) @ emb.astype(np.float64).T
    assert np.max(np.abs(one - exact)) < 1e-4


# Each OpenBLAS kernel (OPENBLAS_CORETYPE, read when the library loads) with the CPU flag it needs (SSE3 is "pni"
# in /proc/cpuinfo) and the names OpenBLAS reports for it (Zen runs its Haswell kernels, Prescott reports
# Katmai): a fresh interpreter per kernel runs the checks above, so the guarantee is checked for other machines.
_KERNELS = {"Prescott": "pni", "Nehalem": "sse4_2", "Sandybridge": "avx", "Haswell": "avx2", "Zen": "avx2",
            "SkylakeX": "avx512f"}
_REPORTED = {"Zen": {"Zen", "Haswell"}, "Prescott": {"Prescott", "Katmai"}}
_KERNEL_CHECK = """
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
from memory_recall.pipeline.vector_prefilter import query_similarities
for n, q in ((2500, 5), (10001, 8), (999, 3)):
    rng = np.random.default_rng(n + q)
    emb = rng.standard_normal((n, 384)).astype(np.float32)
    queries = rng.standard_normal((q, 384)).astype(np.float32)
    with threadpool_limits(1, user_api="blas"):
        one = query_similarities(emb, queries)
        alone = b"".join(query_similarities(emb, queries[j : j + 1]).tobytes() for j in range(q))
        again = query_similarities(emb, queries)
    with threadpool_limits(2, user_api="blas"):
        two = query_similarities(emb, queries)
    assert one.tobytes() == again.tobytes() == two.tobytes() == alone, (n, q)
    assert np.max(np.abs(one - queries.astype(np.float64) @ emb.astype(np.float64).T)) < 1e-4
print(",".join(sorted({i.get("architecture", "") for i in threadpool_info() if i.get("internal_api") == "openblas"})))
"""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@pytest.mark.parametrize("kernel", sorted(_KERNELS))
def test_the_guarantee_holds_for_every_openblas_kernel(kernel: str) -> None:
    """Same input, same bits, whatever the thread count and the other queries, under each OpenBLAS kernel this
    CPU can run (numpy's OpenBLAS picks the kernel by CPU; ``OPENBLAS_CORETYPE`` forces one)."""
    from threadpoolctl import threadpool_info

    if not any(i.get("internal_api") == "openblas" for i in threadpool_info()):
        pytest.skip("numpy is not linked against OpenBLAS")
    flags = _cpu_flags()
    if not flags:
        pytest.skip("the CPU flags are unknown (no /proc/cpuinfo)")
    if _KERNELS[kernel] not in flags:
        pytest.skip(f"this CPU lacks {_KERNELS[kernel]}, which OpenBLAS's {kernel} kernel needs")
    env = {**os.environ, "OPENBLAS_CORETYPE": kernel}
    done = subprocess.run([sys.executable, "-c", _KERNEL_CHECK], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() in _REPORTED.get(kernel, {kernel})  # the kernel really was the one forced
