"""Persisted replay, re-recall and record invalidation (reference §2.3–§2.4, recall-spec departures 1 and 7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_helpers import CHAT, NOW, CountingPipeline, request, upto

from memory_recall.controller import RecallController, RecallResponse
from memory_recall.errors import InputError, NotFound
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

FLOOR = 10


def first_recall(controller: RecallController, messages: list[ChatMessage]) -> RecallResponse:
    resp = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
    assert (resp.status, resp.reason, resp.source) == ("completed", "recall-completed", "fresh")
    assert resp.record is not None and resp.injection_text
    return resp


def node_state(store: Store) -> dict[str, tuple[float, int, int]]:
    return {n.id: (n.importance, n.access_count, n.last_access_time) for n in store.get_nodes(CHAT)}


class TestReplayIsExact:
    @pytest.mark.parametrize("gen_type", ["regenerate", "swipe", "continue"])
    def test_history_types_replay_without_pipeline(
        self, controller: RecallController, counting: CountingPipeline, store: Store, messages: list[ChatMessage],
        gen_type: str,
    ) -> None:
        fresh = first_recall(controller, messages)
        before_nodes, before_version = node_state(store), store.chat_version(CHAT)
        resp = controller.run_recall(request(upto(messages, FLOOR + 1), generation_type=gen_type, t=5000))
        assert (resp.status, resp.reason, resp.source) == ("completed", "persisted-record-reused", "persisted")
        assert resp.injection_text == fresh.injection_text  # byte for byte
        assert resp.input_source == "persisted-user-floor"
        assert resp.target_user_floor == FLOOR
        assert counting.calls == 1
        assert node_state(store) == before_nodes  # no access reinforcement on replay
        assert store.chat_version(CHAT) == before_version  # the generation_count write is not a graph change
        assert resp.record is not None and resp.record.generation_count == 1
        assert not resp.stale

    def test_all_replays_in_a_row(
        self, controller: RecallController, counting: CountingPipeline, store: Store, messages: list[ChatMessage]
    ) -> None:
        fresh = first_recall(controller, messages)
        texts = []
        for i, gen_type in enumerate(["regenerate", "swipe", "continue"]):
            texts.append(controller.run_recall(
                request(upto(messages, FLOOR + 1), generation_type=gen_type, t=1000 * (i + 1))
            ).injection_text)
        # A normal re-send of the same floor text (hosts report some re-rolls as normal): departure 1 reuse.
        resend = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR, t=9000))
        texts.append(resend.injection_text)
        assert texts == [fresh.injection_text] * 4
        assert counting.calls == 1
        record = store.get_record(CHAT, FLOOR)
        assert record is not None and record.generation_count == 4

    def test_manual_edit_is_replayed(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage]
    ) -> None:
        first_recall(controller, messages)
        edited = controller.edit_record(CHAT, FLOOR, "[Memory]\nhand-written note ")
        assert edited.record.manually_edited and edited.record.injection_text == "[Memory]\nhand-written note"
        resp = controller.run_recall(request(upto(messages, FLOOR + 1), generation_type="swipe"))
        assert resp.injection_text == "[Memory]\nhand-written note"
        assert resp.record is not None and resp.record.manually_edited
        assert counting.calls == 1

    def test_edit_record_validation(self, controller: RecallController, messages: list[ChatMessage]) -> None:
        with pytest.raises(NotFound) as err:
            controller.edit_record(CHAT, FLOOR, "x")
        assert err.value.field == "user_floor"
        first_recall(controller, messages)
        with pytest.raises(InputError) as err:
            controller.edit_record(CHAT, FLOOR, "   ")
        assert err.value.field == "text"


class TestFreshWhenNeeded:
    def test_edited_floor_gets_a_fresh_recall(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage]
    ) -> None:
        first_recall(controller, messages)
        changed = [m if m.floor != FLOOR else m.model_copy(update={"text": "Is the greenhouse locked at night?"})
                   for m in upto(messages, FLOOR + 1)]
        resp = controller.run_recall(request(changed, generation_type="regenerate", t=1000))
        assert (resp.source, resp.reason) == ("fresh", "recall-completed")
        assert resp.notes["reuse"] == "floor-edited"
        assert counting.calls == 2
        assert resp.record is not None and resp.record.bound_user_floor_text == "Is the greenhouse locked at night?"

    def test_explicit_rerecall_always_retrieves(
        self, controller: RecallController, counting: CountingPipeline, store: Store, messages: list[ChatMessage]
    ) -> None:
        first_recall(controller, messages)
        version = store.chat_version(CHAT)
        resp = controller.rerecall(CHAT, FLOOR, now_ms=NOW + 1000)
        assert (resp.source, resp.reason) == ("fresh", "recall-completed")
        assert counting.calls == 2
        assert store.chat_version(CHAT) > version  # fresh recall reinforces again
        resp2 = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR, rerecall=True))
        assert resp2.source == "fresh" and counting.calls == 3

    def test_normal_send_with_a_different_query_is_fresh(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage]
    ) -> None:
        """Reference §7 item 1: a new send must never replay the previous turn's block."""
        first_recall(controller, messages)
        resp = controller.run_recall(
            request(upto(messages, FLOOR + 1), target_user_floor=FLOOR, query_text="What about the greenhouse key?")
        )
        assert resp.source == "fresh" and resp.notes["reuse"] == "query-differs"
        assert counting.calls == 2

    def test_stale_record_opt_in(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        counting = CountingPipeline()
        settings = RecallSettings().with_overrides({"controller": {"replay_stale_records": True}})
        controller = RecallController(store, settings, pipeline=counting)
        first_recall(controller, messages)
        assert controller.get_record(CHAT, FLOOR).stale is False  # type: ignore[union-attr]
        controller.on_message_added(CHAT, ChatMessage(floor=12, role="user", speaker="Wren", text="The gate?"))
        assert controller.get_record(CHAT, FLOOR).stale is True  # type: ignore[union-attr]
        resp = controller.run_recall(request(upto(messages, FLOOR + 1), generation_type="swipe"))
        assert resp.source == "fresh" and resp.notes["reuse"] == "stale-graph-version"
        assert counting.calls == 2

    def test_stale_record_replayed_by_default(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage]
    ) -> None:
        first_recall(controller, messages)
        controller.on_message_added(CHAT, ChatMessage(floor=12, role="user", speaker="Wren", text="The gate?"))
        resp = controller.run_recall(request(upto(messages, FLOOR + 1), generation_type="swipe"))
        assert resp.source == "persisted" and resp.stale is True
        assert counting.calls == 1


class TestRecordLifecycle:
    def test_message_edit_invalidates_the_record(
        self, controller: RecallController, store: Store, messages: list[ChatMessage]
    ) -> None:
        first_recall(controller, messages)
        edited = messages[FLOOR].model_copy(update={"text": "Let me look at the footprints again."})
        report = controller.on_message_edited(CHAT, edited, now_ms=NOW + 10)
        assert report.record_deleted and report.ingest is not None
        assert store.get_record(CHAT, FLOOR) is None
        assert controller.get_record(CHAT, FLOOR) is None

    def test_message_delete_removes_only_that_floors_record(
        self, controller: RecallController, store: Store, messages: list[ChatMessage]
    ) -> None:
        first_recall(controller, messages)
        controller.run_recall(request(upto(messages, 8), target_user_floor=8, t=100))
        assert store.get_record(CHAT, 8) is not None
        report = controller.on_message_deleted(CHAT, 9, now_ms=NOW + 200)  # an assistant floor: records stay
        assert not report.record_deleted
        assert store.get_record(CHAT, 8) is not None and store.get_record(CHAT, FLOOR) is not None
        report = controller.on_message_deleted(CHAT, 8, now_ms=NOW + 300)
        assert report.record_deleted and store.get_record(CHAT, 8) is None
        assert store.get_record(CHAT, FLOOR) is not None

    def test_swipe_keeps_the_record(
        self, controller: RecallController, store: Store, counting: CountingPipeline, messages: list[ChatMessage]
    ) -> None:
        fresh = first_recall(controller, messages)
        swiped = messages[FLOOR + 1].model_copy(update={"text": "Erin shrugs and says nothing at all."})
        report = controller.on_message_swiped(CHAT, swiped, now_ms=NOW + 10)
        assert not report.record_deleted and report.ingest is not None
        resp = controller.run_recall(request(upto(messages, FLOOR) + [swiped], generation_type="swipe"))
        assert resp.source == "persisted" and resp.injection_text == fresh.injection_text
        assert counting.calls == 1
        with pytest.raises(InputError):
            controller.on_message_swiped(CHAT, messages[FLOOR], now_ms=NOW)

    def test_records_survive_reopening_the_store(
        self, store: Store, chat: str, db_path: Path, messages: list[ChatMessage]
    ) -> None:
        fresh = first_recall(RecallController(store, RecallSettings()), messages)
        store.close()
        reopened = Store(db_path)
        try:
            counting = CountingPipeline()
            controller = RecallController(reopened, RecallSettings(), pipeline=counting)
            status = controller.get_record(CHAT, FLOOR)
            assert status is not None and status.record == fresh.record and not status.stale
            resp = controller.run_recall(request(upto(messages, FLOOR + 1), generation_type="regenerate"))
            assert resp.source == "persisted" and resp.injection_text == fresh.injection_text
            assert counting.calls == 0
        finally:
            reopened.close()

    def test_delete_record(self, controller: RecallController, store: Store, messages: list[ChatMessage]) -> None:
        first_recall(controller, messages)
        version = store.chat_version(CHAT)
        assert controller.delete_record(CHAT, FLOOR) is True
        assert controller.delete_record(CHAT, FLOOR) is False
        assert controller.delete_record("no-such-chat", 0) is False
        assert store.chat_version(CHAT) == version


class TestConformance:
    """Reference §6.7 scenarios 45–51, 56, 57 with departure 1 (explicit input) applied.

    The reference tests seed a record by hand and stub retrieval; here records are written through the store
    and a counting pipeline around the real ``retrieve`` tells replay from fresh recall.
    """

    CHAT_ZH = "zh-chat"

    def _seed(self, store: Store, text: str, **record: object) -> list[ChatMessage]:
        from memory_recall.ingest.messages import ingest_messages
        from memory_recall.model.records import PersistedRecall

        msgs = [ChatMessage(floor=0, role="user", speaker="我", text=text),
                ChatMessage(floor=1, role="assistant", speaker="她", text="好啊，一起去。")]
        ingest_messages(store, self.CHAT_ZH, msgs, now_ms=NOW - 1)
        store.put_record(self.CHAT_ZH, PersistedRecall(chat_id=self.CHAT_ZH, user_floor=0,
                                                       injection_text="[记忆] 旧的召回块", **record))  # type: ignore[arg-type]
        return msgs

    def _run(self, store: Store, msgs: list[ChatMessage], **kw: object) -> tuple[RecallResponse, int]:
        counting = CountingPipeline()
        controller = RecallController(store, RecallSettings(), pipeline=counting)
        resp = controller.run_recall(request(msgs, chat_id=self.CHAT_ZH, **kw))
        return resp, counting.calls

    def test_scenario_45_regenerate_reuses(self, store: Store) -> None:
        """45: override text = floor text, regenerate, target 0, source chat-last-user → reused, no retrieval.
        Adaptation: the record carries another ``recall_input``; the bound text equals the floor."""
        text = "明日去摩耶山看夜景"
        msgs = self._seed(store, text, recall_input="别的文本", bound_user_floor_text=text)
        resp, calls = self._run(store, msgs, override_text=text, override_source="chat-last-user",
                                generation_type="regenerate", target_user_floor=0)
        assert (resp.status, resp.reason, calls) == ("completed", "persisted-record-reused", 0)
        assert resp.injection_text == "[记忆] 旧的召回块"
        assert resp.recall_input == "别的文本"

    def test_scenario_46_normal_with_target_reuses(self, store: Store) -> None:
        """46: the same with generation type normal and target 0 → reused (floor text == bound text)."""
        text = "明日去摩耶山看夜景"
        msgs = self._seed(store, text, recall_input="别的文本", bound_user_floor_text=text)
        resp, calls = self._run(store, msgs, override_text=text, target_user_floor=0)
        assert (resp.source, calls) == ("persisted", 0)

    def test_scenario_47_unbound_record(self, store: Store) -> None:
        """47: a record without bound text. Reference: normal + chat-last-user → reused; send-intent → fresh.
        Adaptation (departure 1): a normal send reuses only a record bound to the floor's text, so both normal
        cases retrieve; a history type (regenerate) still trusts the unbound record, an active source does not."""
        msgs = self._seed(store, "今晚吃什么")
        resp, calls = self._run(store, msgs, target_user_floor=0)
        assert (resp.source, resp.notes["reuse"], calls) == ("fresh", "normal-send-not-bound", 1)

    def test_scenario_47_history_trusts_unbound(self, store: Store) -> None:
        msgs = self._seed(store, "今晚吃什么")
        resp, calls = self._run(store, msgs, generation_type="regenerate")
        assert (resp.source, calls) == ("persisted", 0)
        resp, calls = self._run(store, msgs, generation_type="regenerate", override_text="今晚吃什么",
                                override_source="send-intent")
        assert (resp.source, calls) == ("fresh", 1)

    def test_scenario_48_edited_floor(self, store: Store) -> None:
        """48: bound to "编辑前的旧楼层", floor now "已经编辑过的新楼层" (= recall_input) → fresh retrieval."""
        msgs = self._seed(store, "已经编辑过的新楼层", bound_user_floor_text="编辑前的旧楼层",
                          recall_input="已经编辑过的新楼层")
        for gen_type in ("normal", "regenerate"):
            resp, calls = self._run(store, msgs, generation_type=gen_type, target_user_floor=0)
            assert (resp.source, resp.notes["reuse"], calls) == ("fresh", "floor-edited", 1)
            # the fresh recall rebinds the floor; restore the stale record for the next type
            self._seed(store, "已经编辑过的新楼层", bound_user_floor_text="编辑前的旧楼层",
                       recall_input="已经编辑过的新楼层")

    def test_scenario_49_empty_recall_input(self, store: Store) -> None:
        """49: empty recall_input and no bound text, regenerate with target 0 → reused."""
        msgs = self._seed(store, "海边的灯塔")
        resp, calls = self._run(store, msgs, generation_type="regenerate", target_user_floor=0)
        assert (resp.source, calls) == ("persisted", 0)

    def test_scenario_50_no_scan_without_target(self, store: Store) -> None:
        """50: reference: no target, normal, source chat-latest-user → the floor is found by scanning and
        reused. Adaptation (departure 1): the service never guesses a floor, so without a target the recall is
        fresh and not persisted; with the explicit target 0 it is reused."""
        text = "今晚去海边看烟花"
        msgs = self._seed(store, text, bound_user_floor_text=text, recall_input=text)
        resp, calls = self._run(store, msgs)
        assert (resp.source in ("fresh", "none"), resp.record_persisted, calls) == (True, False, 1)
        resp, calls = self._run(store, msgs, target_user_floor=0)
        assert (resp.source, calls) == ("persisted", 0)

    def test_scenario_51_rebuild_on_fresh(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        """51 (back-fill): a fresh recall rewrites the floor's record with recall_input, bound text, graph
        version and a reset generation_count, keeping created_at. Back-fill after GENERATION_ENDED is host-hook
        plumbing: a backend writes the record in the recall's own transaction, so there is nothing to back-fill
        and no ``already-up-to-date`` outcome."""
        controller = RecallController(store, RecallSettings())
        first = first_recall(controller, messages)
        controller.run_recall(request(upto(messages, FLOOR + 1), generation_type="swipe"))
        again = controller.rerecall(CHAT, FLOOR, now_ms=NOW + 50_000)
        assert first.record is not None and again.record is not None
        assert again.record.generation_count == 0
        assert again.record.created_at == first.record.created_at
        assert again.record.updated_at == NOW + 50_000
        assert again.record.recall_input and again.record.bound_user_floor_text
        assert again.record.graph_version == store.chat_version(CHAT)

    def test_scenario_56_final_source(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        """56: fresh with text → ``fresh``; neither → ``none``. Adaptation: a fresh recall with an empty block
        reports ``none`` and does not substitute the floor's older record (reuse already declined it)."""
        controller = RecallController(store, RecallSettings())
        assert first_recall(controller, messages).source == "fresh"
        empty = RecallController(store, RecallSettings(), renderer=lambda result, s: _Empty())
        resp = empty.rerecall(CHAT, FLOOR, now_ms=NOW + 1)
        assert (resp.status, resp.source, resp.injection_text) == ("completed", "none", "")
        assert not resp.record_persisted
        assert store.get_record(CHAT, FLOOR) is not None  # untouched

    def test_scenario_57_record_validation(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        """57: blank injection text is no record; generation_count is a non-negative int; records only on user
        floors (a target naming an assistant floor is refused, naming the field)."""
        from pydantic import ValidationError

        from memory_recall.model.records import PersistedRecall

        with pytest.raises(ValidationError):
            PersistedRecall(chat_id=CHAT, user_floor=0, injection_text="  ")
        with pytest.raises(ValidationError):
            PersistedRecall(chat_id=CHAT, user_floor=0, injection_text="x", generation_count=-1)
        controller = RecallController(store, RecallSettings())
        with pytest.raises(InputError) as err:
            controller.run_recall(request(upto(messages, FLOOR + 1), target_user_floor=FLOOR + 1))
        assert err.value.field == "target_user_floor"


class _Empty:
    text = ""
    blocks: list[object] = []
    omitted: list[object] = []
