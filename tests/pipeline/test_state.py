"""The shared pipeline types: hand-written dataclass constructors, shared empty defaults, the timer."""

from __future__ import annotations

import dataclasses
import time

import pytest

from memory_recall.pipeline.state import (
    RecallQuery,
    RecallState,
    StageResult,
    StageTrace,
    TimedStage,
    timed,
)


class TestStageTrace:
    def test_positional_and_keyword_arguments_in_field_order(self) -> None:
        a = StageTrace("s", 1.5, 3, 2, "k", "higher_is_better", True, "why", {"n": 1})
        b = StageTrace(
            name="s", elapsed_ms=1.5, count_in=3, count_out=2, score_kind="k",
            score_direction="higher_is_better", skipped=True, skip_reason="why", notes={"n": 1},
        )
        assert a == b
        assert a.to_dict() == {
            "name": "s", "elapsed_ms": 1.5, "count_in": 3, "count_out": 2, "score_kind": "k",
            "score_direction": "higher_is_better", "skipped": True, "skip_reason": "why", "notes": {"n": 1},
        }
        assert [f.name for f in dataclasses.fields(StageTrace)] == list(a.to_dict())

    def test_defaults_and_a_new_notes_dict_per_trace(self) -> None:
        a, b = StageTrace("x"), StageTrace("x")
        assert (a.elapsed_ms, a.count_in, a.count_out, a.score_kind, a.score_direction) == (0.0, 0, 0, "none", "none")
        assert (a.skipped, a.skip_reason, a.notes) == (False, "", {})
        assert a.notes is not b.notes
        assert StageTrace("x", notes=None).notes is None  # an explicit value is kept as given

    def test_frozen_and_replace(self) -> None:
        trace = StageTrace("x", count_in=2)
        with pytest.raises(dataclasses.FrozenInstanceError):
            trace.count_in = 3  # type: ignore[misc]
        new = dataclasses.replace(trace, notes={"ablated": True})
        assert (new.name, new.count_in, new.notes, trace.notes) == ("x", 2, {"ablated": True}, {})
        with pytest.raises(TypeError):
            StageTrace("x", bogus=1)  # type: ignore[call-arg]


def test_stage_result_is_frozen() -> None:
    state, trace = RecallState(snapshot=None, query=RecallQuery("q")), StageTrace("x")  # type: ignore[arg-type]
    result = StageResult(state, trace)
    assert (result.state, result.trace) == (state, trace) and result == StageResult(state=state, trace=trace)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.trace = trace  # type: ignore[misc]


def test_new_states_get_their_own_llm_and_meta_dicts() -> None:
    a = RecallState(snapshot=None, query=RecallQuery("a"))  # type: ignore[arg-type]
    b = RecallState(snapshot=None, query=RecallQuery("b"))  # type: ignore[arg-type]
    assert a.meta == {} and a.llm == {} and a.meta is not b.meta and a.llm is not b.llm
    assert len(a.scored) == 0 and len(a.candidates) == 0 and a.active.shape == (0,)
    assert a.vector_hits[0].size == a.bm25_hits[1].size == a.diffusion[0].size == 0
    c = a.evolve(meta=a.with_meta(k=1))
    assert c.meta == {"k": 1} and a.meta == {} and c.query is a.query
    with pytest.raises(TypeError):
        a.evolve(bogus=1)


def test_timed_measures_also_when_the_block_raises() -> None:
    with timed() as t:
        time.sleep(0.002)
    assert t[0] >= 1.0
    with pytest.raises(RuntimeError), timed() as u:
        time.sleep(0.002)
        raise RuntimeError("boom")
    assert u[0] >= 1.0


def test_timed_stage_wraps_the_fields_in_a_trace() -> None:
    class Probe(TimedStage):
        name = "probe"

        def _run(self, state: RecallState) -> tuple[RecallState, dict]:
            time.sleep(0.002)
            return state.evolve(pool=(1,)), {"count_in": 4, "count_out": 1, "notes": {"a": 1}}

    state = RecallState(snapshot=None, query=RecallQuery("q"))  # type: ignore[arg-type]
    result = Probe().run(state)
    assert result.state.pool == (1,) and state.pool == ()
    trace = result.trace
    assert (trace.name, trace.count_in, trace.count_out, trace.notes, trace.skipped) == ("probe", 4, 1, {"a": 1}, False)
    assert trace.elapsed_ms >= 1.0
