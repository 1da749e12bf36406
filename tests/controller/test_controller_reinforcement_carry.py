"""Recalls through the controller with persist + access reinforcement keep what reinforcement does not change:
the snapshot's structure with every cache keyed on it, and the chat's BM25 index. Outputs on the carried state are
byte-identical to the same recall on a fresh store handle, snapshot and caches at the same store version."""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
from controller_helpers import BENCH_NODES

from memory_recall import bench
from memory_recall.controller import RecallController, RecallRequest, RecallResponse
from memory_recall.model.chat import ChatMessage
from memory_recall.model.graph import Node
from memory_recall.pipeline import _admission, _graph_cache, owners, result, scoring
from memory_recall.pipeline.cooccurrence import cooccurrence_index
from memory_recall.pipeline.result import RecallResult, json_dumps
from memory_recall.pipeline.retrieve import retrieve
from memory_recall.providers.embedding import LOCAL_MODEL_ID
from memory_recall.settings import RecallSettings
from memory_recall.store import Store
from memory_recall.store.bm25_index import Bm25Index, cache_for
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache

#: The benchmark graph (owners, knowledge, regions, timeline, embeddings) at a size that keeps the test fast.
#: The largest step reinforcement allows: importance moves as much as it can between recalls.
SETTINGS = RecallSettings(profile="app").with_overrides({"reinforcement": {"importance_step": 1.0}})
RECALLS = 6


class Recorder:
    """The real ``retrieve``, remembering the canonical JSON of each result and the snapshot it ran on."""

    def __init__(self) -> None:
        self.outputs: list[str] = []
        self.snapshots: list[GraphSnapshot] = []

    def __call__(self, snapshot: Any, query: Any, settings: Any, providers: Any = None) -> RecallResult:
        result = retrieve(snapshot, query, settings, providers)
        self.outputs.append(json_dumps(result))
        self.snapshots.append(snapshot)
        return result


def _request(k: int, *, persist: bool, probe: bool = False) -> RecallRequest:
    scene = bench._Scene(BENCH_NODES)
    text = bench.QUERIES[k % len(bench.QUERIES)] + (" (probe)" if probe else "")
    q = bench._query(scene, k, text)
    return RecallRequest(
        chat_id=bench.CHAT,
        messages=[ChatMessage(floor=0, role="user", text=text)],
        query_text=text,
        active_region=q.active_region,
        active_owner_keys=list(q.active_owner_keys or []),
        now_ms=bench.NOW_MS + k,
        persist=persist,
    )


def _response_json(resp: RecallResponse) -> str:
    """The response without what differs between two runs of one recall (timings, cache-hit notes)."""
    data = resp.model_dump(mode="json")
    data["timings"] = {}
    for trace in data.get("traces", []):
        trace["elapsed_ms"] = 0.0
        if isinstance(trace.get("notes"), dict):
            trace["notes"] = {k: v for k, v in trace["notes"].items() if "cache" not in k.lower()}
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


def _entries(snap: GraphSnapshot) -> dict[Hashable, Any]:
    """The snapshot's cache entries: those of its structure and its own (statistics-keyed) ones."""
    with _graph_cache._LOCK:
        return {**_graph_cache._CACHE.get(snap.structure, {}), **_graph_cache._CACHE.get(snap, {})}


def _stats_entries(snap: GraphSnapshot) -> dict[Hashable, Any]:
    with _graph_cache._LOCK:
        return dict(_graph_cache._CACHE.get(snap, {}))


def _no_build() -> Bm25Index:
    raise AssertionError("the BM25 index was expected to be cached")


def _assert_memo_shared(old: owners._SnapshotMemo, new: owners._SnapshotMemo) -> None:
    """The owner stage's memo is the structure's: the same object, holding only the walk lists that do not read
    importance (the others are per snapshot)."""
    assert new is old
    assert old.pov_owner and old.participant_text and old.story_label and old.events is not None
    assert {kind for kind, _ in old.walk} == {"event", "near"}  # the recall walked these; "pov" is per overlay
    assert old.scenes


def _assert_weak_tables_shared(old: GraphSnapshot, new: GraphSnapshot) -> None:
    """The admission verdicts, scoring scene codes and owner participant memo: keyed by the (shared) structure."""
    assert new.structure is old.structure
    with _graph_cache._LOCK:
        entries = _graph_cache._CACHE[old.structure]
        tables = [entries[key] for key in (("admission", "verdicts"), ("scoring", "scene-codes"),
                                           ("owners", "participants"))]
    assert tables[0] and tables[1].codes and tables[2]
    assert _admission._scenes(new) is tables[0] and scoring._structure_scenes(new) is tables[1]
    assert owners._participant_memo(new) is tables[2]


def _assert_entries_equal_fresh_builds(carried: GraphSnapshot, fresh: GraphSnapshot) -> None:
    """Every value the carried snapshot's cache entries hold (carried or filled since) equals what the same builds
    give on the fresh snapshot of the same version: a carried part that read reinforced data shows up here even
    when it does not change this recall's output (the order of tied neighbours, core nodes or batch members)."""
    entries = _entries(carried)
    memo = entries[("owners", "snapshot")]
    fresh_memo = owners._SnapshotMemo(fresh)
    assert memo.walk and all(owners._walk_list(fresh, fresh_memo, *key) == v for key, v in memo.walk.items())
    assert memo.pov_owner and all(owners._resolve_pov_owner(fresh, i) == v for i, v in memo.pov_owner.items())
    assert all(owners._participant_text(fresh, i) == v for i, v in memo.participant_text.items())
    assert memo.types == fresh.type_code.tolist() and memo.archived == fresh.archived.tolist()
    kept = entries[("result-kept",)]
    dumps = entries.get(("result-node-dumps",), {})
    assert all(result._node_entry(fresh, i) == v for i, v in dumps.items())
    assert all(m.node_id == fresh.ids[i] and m.reason == reason for (i, reason), m in kept.omitted.items())
    for story, table in kept.priority.items():
        judged = np.flatnonzero(table != result._UNKNOWN_PRIORITY)
        assert np.array_equal(result._temporal_priority(fresh, story, judged), table[judged].astype(np.float64))
    if ("result-core-order",) in entries:
        order, synopsis = entries[("result-core-order",)]
        fresh_order, fresh_synopsis = result._core_order(fresh)
        assert np.array_equal(order, fresh_order) and np.array_equal(synopsis, fresh_synopsis)
    for key, value in entries.items():
        if isinstance(key, tuple) and key[0] == "cooccurrence-index":
            assert (value.counts != cooccurrence_index(fresh, key[1])[0].counts).nnz == 0


def _controller(bench_store: Store, cache: SnapshotCache, recorder: Recorder) -> RecallController:
    embedder = bench._PassThroughEmbedder(LOCAL_MODEL_ID, {})
    return RecallController(bench_store, SETTINGS, embedder=embedder, snapshot_cache=cache, pipeline=recorder)


def test_recalls_on_carried_state_equal_recalls_on_fresh_state(bench_store: Store, bench_store_path: Path) -> None:
    cache, recorder = SnapshotCache(), Recorder()
    controller = _controller(bench_store, cache, recorder)
    bm25 = cache_for(bench_store)
    first_build: int | None = None
    index: Bm25Index | None = None
    for k in range(RECALLS):
        version = bench_store.chat_version(bench.CHAT)
        resp = controller.run_recall(_request(k, persist=True))
        assert resp.status == "completed" and resp.notes["reinforced"] > 0
        assert bench_store.chat_version(bench.CHAT) == version + 1 == resp.graph_version
        used = recorder.snapshots[-1]
        carried = cache.get(bench_store, bench.CHAT, LOCAL_MODEL_ID, now_ms=bench.NOW_MS + k)
        assert carried is not used and carried.version == version + 1
        first_build = used.built_at_ms if first_build is None else first_build
        assert carried.built_at_ms == first_build  # carried over every write, never rebuilt

        # The carried snapshot has the recall's structure, so every structure-keyed entry is the same value; the
        # statistics-keyed ones (importance orders, node dumps) belong to the old overlay and are not carried.
        assert carried.structure is used.structure
        before, after = _entries(used), _entries(carried)
        stats_before = _stats_entries(used)
        assert set(after) == set(before) - set(stats_before) and all(after[k] is before[k] for k in after)
        names = {key[0] if isinstance(key, tuple) else key for key in after}
        assert {"scoring-arrays", "lexical-fields", "anchors", "diffusion-adjacency", "context"} <= names
        assert {("result-core-order",), ("result-node-dumps",)} <= set(stats_before)
        assert _stats_entries(carried) == {}
        _assert_memo_shared(before[("owners", "snapshot")], after[("owners", "snapshot")])
        _assert_weak_tables_shared(used, carried)

        # The chat's BM25 index: built by the first recall, then carried over each reinforcement write.
        current = bm25.get(bench.CHAT, version + 1, _no_build)
        index = current if index is None else index
        assert bm25.builds == 1 and current is index

        # The same recall (persist off: the store stays at this version) on the carried state and on a fresh
        # store handle (its own BM25 cache), a fresh snapshot cache and so fresh per-snapshot caches.
        probe = _request(k, persist=False, probe=True)
        carried_resp = controller.run_recall(probe)
        assert recorder.snapshots[-1] is carried and carried_resp.source == "fresh"
        carried_out = recorder.outputs[-1]
        with Store(bench_store_path) as fresh_store:
            fresh_recorder = Recorder()
            fresh_resp = _controller(fresh_store, SnapshotCache(), fresh_recorder).run_recall(probe)
            fresh_snap = fresh_recorder.snapshots[-1]
            assert fresh_snap is not carried and fresh_snap.built_at_ms == bench.NOW_MS + k
            assert cache_for(fresh_store).builds == 1
        assert fresh_recorder.outputs[-1] == carried_out
        assert _response_json(fresh_resp) == _response_json(carried_resp)
        _assert_entries_equal_fresh_builds(carried, fresh_snap)
        assert bench_store.chat_version(bench.CHAT) == version + 1


def test_bm25_index_and_caches_rebuilt_after_a_graph_write(bench_store: Store) -> None:
    cache, recorder = SnapshotCache(), Recorder()
    controller = _controller(bench_store, cache, recorder)
    bm25 = cache_for(bench_store)
    controller.run_recall(_request(0, persist=True))
    controller.run_recall(_request(1, persist=True))
    index = bm25.get(bench.CHAT, bench_store.chat_version(bench.CHAT), _no_build)
    arrays = _entries(recorder.snapshots[-1])[("scoring-arrays",)]
    assert bm25.builds == 1 and recorder.snapshots[1].built_at_ms == recorder.snapshots[0].built_at_ms
    # A graph write (new node text) is not a reinforcement: the next recall rebuilds index, snapshot and caches.
    bench_store.upsert_nodes(bench.CHAT, [Node(id="zz-new", type="event", fields={"title": "lantern vigil"}, seq=1)])
    graph_version = bench_store.chat_version(bench.CHAT)
    controller.run_recall(_request(2, persist=True))
    # The BM25 index is not rebuilt: the write's one touched row is merged into the cached index.
    assert (bm25.builds, bm25.deltas) == (1, 1)
    rebuilt = recorder.snapshots[-1]
    assert rebuilt.version == graph_version and "zz-new" in rebuilt.index
    assert rebuilt.built_at_ms == bench.NOW_MS + 2  # built by this recall (the earlier ones at NOW_MS + 0)
    assert _entries(rebuilt)[("scoring-arrays",)] is not arrays
    # ... and that recall's own reinforcement write carried the new index on.
    assert bm25.get(bench.CHAT, graph_version + 1, _no_build) is not index
    assert bench_store.bm25(bench.CHAT, ["lantern", "vigil"], 5)[0][0] == "zz-new" and bm25.builds == 1
