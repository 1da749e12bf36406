"""Every chat event ends with :meth:`RecallController.refresh`: the cached snapshot is updated by the store's delta,
the pipeline's per-structure values are derived from the previous structure's and the cached BM25 index takes the
written rows — before any recall asks. The recall after the event then finds all of it current, and its output is
byte-identical to the same recall on a fresh store handle, snapshot and caches."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

from controller_helpers import BENCH_NODES

from memory_recall import bench
from memory_recall.controller import RecallController
from memory_recall.ingest import ingest_messages
from memory_recall.model.chat import ChatMessage
from memory_recall.pipeline import _graph_cache
from memory_recall.pipeline.result import json_dumps
from memory_recall.pipeline.retrieve import prepare_snapshot, retrieve
from memory_recall.pipeline.scoring import _field_table
from memory_recall.pipeline.state import Providers
from memory_recall.providers.embedding import LOCAL_MODEL_ID
from memory_recall.settings import RecallSettings
from memory_recall.store import Store
from memory_recall.store.bm25_index import cache_for
from memory_recall.store.snapshot import SnapshotCache, load_snapshot

SETTINGS = RecallSettings(profile="app")
MODEL = LOCAL_MODEL_ID


def _recall(bench_store: Store, snap, k: int) -> str:
    scene = bench._Scene(BENCH_NODES)
    providers = Providers(embedder=bench._PassThroughEmbedder(MODEL, {}),
                          lexical_index=partial(bench_store.bm25, bench.CHAT))
    text = bench.QUERIES[k % len(bench.QUERIES)]
    return json_dumps(retrieve(snap, bench._query(scene, k, text), SETTINGS, providers))


def _message(j: int) -> ChatMessage:
    return ChatMessage(floor=900_000 + j, role="user", speaker=bench.USER,
                       text=f"I light the lantern by the harbor and ask Mira about the tower, turn {j}.")


def test_events_bring_snapshot_caches_and_bm25_up_to_date(bench_store: Store, bench_store_path: Path) -> None:
    ctl = RecallController(bench_store, SETTINGS, embedder=bench._PassThroughEmbedder(MODEL, {}))
    cache = ctl.snapshot_cache
    snap = cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
    for k in range(3):  # the recalls before the events: every per-structure value and the BM25 index exist
        _recall(bench_store, snap, k)
    for j in range(3):
        ctl.on_message_added(bench.CHAT, _message(j), now_ms=bench.NOW_MS)
        version = bench_store.chat_version(bench.CHAT)
        assert cache.last_update[bench.CHAT] == "delta"
        current = cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
        assert cache.last_update[bench.CHAT] == "cached" and current.version == version
        parent = current.structure.parent
        assert parent is not None and current.structure.change is not None
        # Every value the previous structure held through an update path is already derived for this one.
        with _graph_cache._LOCK:
            before = set(_graph_cache._RECIPES[parent])
            held = set(_graph_cache._CACHE[current.structure])
            # The values read with the statistics overlay are held by the snapshot object itself.
            held |= {("stats", key) for key in _graph_cache._CACHE.get(current, ())}
        assert before and before <= held, before - held
        assert ("diffusion-adjacency", 0.2, 0, 1.0, "all") in held and ("scoring-arrays",) in held
        assert ("stats", ("result-core-order",)) in held and ("visibility", "index") in held
        assert cache_for(bench_store).pending_stems(bench.CHAT, version) == []  # the index took the written rows
        got = _recall(bench_store, current, j)
        with Store(bench_store_path) as fresh_store:
            fresh = load_snapshot(fresh_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
            assert fresh.version == version
            assert got == _recall(fresh_store, fresh, j)


def test_refresh_updates_only_what_is_cached_and_never_builds(bench_store: Store) -> None:
    cache = SnapshotCache()
    ctl = RecallController(bench_store, SETTINGS, snapshot_cache=cache)
    ctl.on_message_added(bench.CHAT, _message(0), now_ms=bench.NOW_MS)
    assert cache.refresh(bench_store, bench.CHAT, now_ms=bench.NOW_MS) == []  # nothing cached: nothing built
    assert bench.CHAT not in cache.last_update
    snap = cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
    ctl.on_message_added(bench.CHAT, _message(1), now_ms=bench.NOW_MS)
    child = cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
    assert child.structure.parent is snap.structure
    # No recall ran on the parent: there was nothing to derive, and prepare builds nothing.
    assert prepare_snapshot(child) == []
    with _graph_cache._LOCK:
        assert not _graph_cache._CACHE.get(child.structure)
    assert cache_for(bench_store).pending_stems(bench.CHAT, bench_store.chat_version(bench.CHAT)) == []


def test_a_declined_update_is_left_to_the_recall(bench_store: Store) -> None:
    """A value whose update path declines is not built by prepare (the recall builds it), and the others are
    still derived."""
    snap = load_snapshot(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
    cache = SnapshotCache()
    cache._items[(bench.CHAT, MODEL)] = snap
    calls: list[str] = []

    def declining(s):
        return _graph_cache.cached(s, ("test-declines",), lambda: calls.append("build") or 1,
                                   lambda old, change: None, recipe=declining)[0]

    declining(snap)
    _recall(bench_store, snap, 0)
    assert calls == ["build"]
    ctl = RecallController(bench_store, SETTINGS, snapshot_cache=cache)
    assert ctl.refresh(bench.CHAT, now_ms=bench.NOW_MS) == []  # nothing written since: nothing to do
    ctl.on_message_added(bench.CHAT, _message(5), now_ms=bench.NOW_MS)
    child = cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
    with _graph_cache._LOCK:
        held = set(_graph_cache._CACHE[child.structure])
    assert ("test-declines",) not in held and ("scoring-arrays",) in held
    assert calls == ["build"]
    declining(child)  # the recall builds it
    assert calls == ["build", "build"]


def _held(snapshot) -> set:
    with _graph_cache._LOCK:
        return set(_graph_cache._CACHE.get(snapshot.structure, ()))


def test_writes_no_recall_follows_keep_the_derived_values_along_the_chain(
    bench_store: Store, bench_store_path: Path
) -> None:
    """Writes that no event refresh follows (the background embedding's vectors) update the cached snapshot at the
    next ``get``; the cache derives the pipeline's values for each new structure then (``on_update``), so a
    structure no recall ever ran on still hands them to the next one, and none is built again."""
    ctl = RecallController(bench_store, SETTINGS, embedder=bench._PassThroughEmbedder(MODEL, {}))
    cache = ctl.snapshot_cache
    first = cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
    _recall(bench_store, first, 0)
    table = _field_table(first)
    chain = [first]
    for j in range(3):
        ingest_messages(bench_store, bench.CHAT, [_message(20 + j)], now_ms=bench.NOW_MS)  # no refresh
        chain.append(cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS))
        assert cache.last_update[bench.CHAT] == "delta"
    for older, newer in zip(chain, chain[1:], strict=False):
        assert newer.structure.parent is None or newer.structure.parent is older.structure
        assert _held(first) <= _held(newer), _held(first) - _held(newer)
    # Derived, not built: the newest table shares the first one's vocabulary (a build starts a new one).
    assert _field_table(chain[-1]).vocab is table.vocab
    got = _recall(bench_store, chain[-1], 1)
    with Store(bench_store_path) as fresh_store:
        fresh = load_snapshot(fresh_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
        assert fresh.version == chain[-1].version
        assert got == _recall(fresh_store, fresh, 1)


def test_concurrent_gets_after_a_write_share_one_update(bench_store: Store) -> None:
    """Recalls arriving together after a write wait for one thread to apply the delta and all get its snapshot:
    one new structure, derived once."""
    updates: list[int] = []
    cache = SnapshotCache(on_update=lambda snap: updates.append(snap.version))
    cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS)
    ingest_messages(bench_store, bench.CHAT, [_message(40)], now_ms=bench.NOW_MS)
    version = bench_store.chat_version(bench.CHAT)
    barrier = threading.Barrier(6)
    got: list = []

    def recall_thread() -> None:
        barrier.wait()
        got.append(cache.get(bench_store, bench.CHAT, MODEL, now_ms=bench.NOW_MS))

    threads = [threading.Thread(target=recall_thread) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 6 and all(s is got[0] for s in got)
    assert got[0].version == version and updates == [version]
