from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_helpers import BENCH_NODES, CHAT, NOW, CountingPipeline, demo_messages

from memory_recall import bench
from memory_recall.controller import RecallController
from memory_recall.ingest.messages import ingest_messages
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import SnapshotCache


@pytest.fixture
def messages() -> list[ChatMessage]:
    return demo_messages()


@pytest.fixture
def chat(store: Store, messages: list[ChatMessage]) -> str:
    ingest_messages(store, CHAT, messages, now_ms=NOW - 1000)
    return CHAT


@pytest.fixture
def counting() -> CountingPipeline:
    return CountingPipeline()


@pytest.fixture
def cache() -> SnapshotCache:
    return SnapshotCache()


@pytest.fixture
def controller(store: Store, chat: str, counting: CountingPipeline, cache: SnapshotCache) -> RecallController:
    return RecallController(store, RecallSettings(), pipeline=counting, snapshot_cache=cache)


@pytest.fixture(scope="session")
def bench_graph_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "graph.sqlite3"
    bench.write_graph(BENCH_NODES, path)
    return path


@pytest.fixture
def bench_store_path(bench_graph_file: Path, tmp_path: Path) -> Path:
    """A copy of the benchmark graph's store for one test."""
    path = tmp_path / "bench-store.sqlite3"
    shutil.copyfile(bench_graph_file, path)
    return path


@pytest.fixture
def bench_store(bench_store_path: Path) -> Iterator[Store]:
    s = Store(bench_store_path)
    yield s
    s.close()
