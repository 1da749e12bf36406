"""Request validation, input resolution and recent-context lines (reference §2.1–§2.2, scenarios 54–55)."""

from __future__ import annotations

from typing import Any

import pytest

from memory_recall.controller import RecallController, RecallRequest, parse_request, resolve_input
from memory_recall.controller.inputs import build_recent_lines, latest_user_floor, strip_plot_blocks
from memory_recall.errors import InputError
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store


def msg(floor: int, role: str, text: str, **kw: Any) -> ChatMessage:
    return ChatMessage(floor=floor, role=role, text=text, **kw)  # type: ignore[arg-type]


CHAT = [
    msg(0, "system", "The story begins."),
    msg(1, "user", "first user"),
    msg(2, "assistant", "first reply"),
    msg(3, "user", "second user"),
    msg(4, "assistant", "second reply"),
]
TAIL_USER = [*CHAT, msg(5, "user", "tail user")]


def req(messages: list[ChatMessage], **kw: Any) -> RecallRequest:
    return RecallRequest(chat_id="c", messages=messages, **kw)


class TestResolutionPriority:
    @pytest.mark.parametrize(
        ("fields", "messages", "source", "text"),
        [
            ({"override_text": "ov", "query_text": "q", "send_intent": "si", "target_user_floor": 3}, TAIL_USER,
             "override", "ov"),
            ({"override_text": "ov", "override_source": "send-intent"}, CHAT, "send-intent", "ov"),
            ({"query_text": "q", "send_intent": "si", "target_user_floor": 3}, TAIL_USER, "query-text", "q"),
            ({"send_intent": " si \r\n", "target_user_floor": 3}, TAIL_USER, "send-intent", "si"),
            ({"target_user_floor": 3}, TAIL_USER, "target-user-floor", "second user"),
            ({}, TAIL_USER, "chat-tail-user", "tail user"),
            ({}, CHAT, "chat-last-user", "second user"),
            ({}, [msg(0, "assistant", "only")], "none", ""),
        ],
    )
    def test_first_non_empty_wins(
        self, fields: dict[str, Any], messages: list[ChatMessage], source: str, text: str
    ) -> None:
        resolved = resolve_input(req(messages, **fields), 4)
        assert (resolved.source, resolved.text) == (source, text)
        assert resolved.reason == ("no-recall-input" if source == "none" else f"{source}-selected")

    def test_candidates_are_listed_in_priority_order(self) -> None:
        resolved = resolve_input(req(TAIL_USER, query_text="q", send_intent="si", target_user_floor=3), 4)
        assert [s for s, _ in resolved.candidates] == [
            "query-text", "send-intent", "target-user-floor", "chat-tail-user", "chat-last-user"
        ]

    @pytest.mark.parametrize("gen_type", ["regenerate", "swipe", "continue"])
    def test_history_types_use_the_latest_user_floor(self, gen_type: str) -> None:
        resolved = resolve_input(req(TAIL_USER, generation_type=gen_type, send_intent="ignored"), 4)
        assert (resolved.source, resolved.text, resolved.target_user_floor) == ("chat-last-user", "tail user", 5)
        assert not resolved.synthetic

    def test_history_type_with_explicit_target(self) -> None:
        resolved = resolve_input(req(TAIL_USER, generation_type="regenerate", target_user_floor=3), 4)
        assert (resolved.text, resolved.target_user_floor) == ("second user", 3)

    def test_normal_send_never_guesses_a_floor(self) -> None:
        """Departure 1 (fixes reference §7 item 1): no target is inferred for a normal send."""
        resolved = resolve_input(req(CHAT, send_intent="brand new text"), 4)
        assert resolved.target_user_floor is None and resolved.text == "brand new text"

    def test_hidden_user_messages_count(self) -> None:
        messages = [msg(0, "user", "hidden one", hidden=True), msg(1, "assistant", "a")]
        assert latest_user_floor(messages) == 0
        assert build_recent_lines(messages, 4) == ["[user]: hidden one", "[assistant]: a"]

    def test_authoritative_when_query_differs_from_floor(self) -> None:
        resolved = resolve_input(req(TAIL_USER, query_text="other", target_user_floor=5), 4)
        assert resolved.authoritative and resolved.floor_text == "tail user"
        assert not resolve_input(req(TAIL_USER, target_user_floor=5), 4).authoritative


class TestRecentLines:
    def test_limit_and_system_messages(self) -> None:
        assert build_recent_lines(CHAT, 3) == ["[assistant]: first reply", "[user]: second user",
                                               "[assistant]: second reply"]
        assert build_recent_lines(CHAT, 0) == []
        assert build_recent_lines(CHAT, 20)[0] == "[user]: first user"

    def test_synthetic_line_appended_and_oldest_dropped(self) -> None:
        lines = build_recent_lines(CHAT, 2, "new text")
        assert lines == ["[assistant]: second reply", "[user]: new text"]
        assert build_recent_lines(TAIL_USER, 2, "tail user") == ["[assistant]: second reply", "[user]: tail user"]

    def test_plot_blocks_removed_from_user_text(self) -> None:
        text = "Hi <plot>secret plan</plot> there <note a='1'>n</note><state>s</state><plot-log>x\ny</plot-log>"
        assert strip_plot_blocks(text) == "Hi  there"
        lines = build_recent_lines([msg(0, "user", text), msg(1, "assistant", "<plot>kept</plot>")], 4)
        assert lines == ["[user]: Hi  there", "[assistant]: <plot>kept</plot>"]

    def test_scenario_55_override_with_synthetic_line(self) -> None:
        """55: override "权威输入" (source send-intent) over a chat whose tail says "旧的 chat tail" → that text,
        source send-intent, not authoritative (no target floor), bound "", synthetic line appended."""
        resolved = resolve_input(
            req([msg(0, "user", "旧的 chat tail")], override_text="权威输入", override_source="send-intent"), 4
        )
        assert (resolved.text, resolved.source, resolved.authoritative, resolved.floor_text) == (
            "权威输入", "send-intent", False, ""
        )
        assert resolved.recent_lines == ("[user]: 旧的 chat tail", "[user]: 权威输入")
        assert resolved.synthetic

    def test_scenario_54_authoritative_input(self, tmp_path: Any) -> None:
        """54: a pending send intent "刚触发发送的新输入" over the chat tail "旧的 chat tail", target 0 → recall
        with the send-intent text, ``authoritative_input_used``, bound text = the floor's text, synthetic line.
        Adaptation: the reference needs ``recallUseAuthoritativeGenerationInput``; with explicit input
        (departure 1) the text the host sends is always the query. Freezing across two hooks and overwriting
        the host's prompt parameters are host plumbing and do not apply."""
        store = Store(tmp_path / "s.sqlite3")
        try:
            from memory_recall.ingest.messages import ingest_messages

            messages = [msg(0, "user", "旧的 chat tail")]
            ingest_messages(store, "c", messages, now_ms=1)
            controller = RecallController(store, RecallSettings(), renderer=lambda r, s: _Text("[记忆] 块"))
            resp = controller.run_recall(
                req(messages, send_intent="刚触发发送的新输入", target_user_floor=0, now_ms=10)
            )
            assert (resp.recall_input, resp.input_source, resp.target_user_floor) == (
                "刚触发发送的新输入", "send-intent", 0
            )
            assert resp.authoritative_input_used
            assert resp.recent_lines[-1] == "[user]: 刚触发发送的新输入"
            assert resp.record is not None and resp.record.bound_user_floor_text == "旧的 chat tail"
            assert resp.record.authoritative_input_used
        finally:
            store.close()


class _Text:
    def __init__(self, text: str) -> None:
        self.text = text
        self.blocks: list[object] = []
        self.omitted: list[object] = []


class TestRequestValidation:
    @pytest.mark.parametrize(
        ("data", "field"),
        [
            ({"chat_id": ""}, "chat_id"),
            ({"chat_id": "a/b"}, "chat_id"),
            ({"chat_id": 5}, "chat_id"),
            ({"generation_type": "reroll"}, "generation_type"),
            ({"target_user_floor": -1}, "target_user_floor"),
            ({"target_user_floor": "3"}, "target_user_floor"),
            ({"dry_run": "yes"}, "dry_run"),
            ({"strict": 1}, "strict"),
            ({"now_ms": -5}, "now_ms"),
            ({"messages": [{"floor": 0, "role": "narrator", "text": "x"}]}, "messages.0.role"),
            ({"messages": [{"floor": 0, "role": "user", "text": "a"}, {"floor": 0, "role": "user", "text": "b"}]},
             "messages"),
            ({"unknown_key": 1}, "unknown_key"),
            ({"active_owner_keys": "character:ann"}, "active_owner_keys"),
            ({"options": {"selection": 3}}, "options.selection"),
            ({"messages": [{"floor": 0, "role": "assistant", "text": "a"}], "target_user_floor": 0},
             "target_user_floor"),
        ],
    )
    def test_every_error_names_its_field(self, data: dict[str, Any], field: str) -> None:
        with pytest.raises(InputError) as err:
            parse_request({"chat_id": "c", **data})
        assert err.value.field == field

    def test_settings_overrides_are_validated(self, tmp_path: Any) -> None:
        store = Store(tmp_path / "s.sqlite3")
        try:
            controller = RecallController(store, RecallSettings())
            with pytest.raises(InputError) as err:
                controller.run_recall({"chat_id": "c", "messages": [msg(0, "user", "hi")],
                                       "options": {"selection": {"max_recall_nodes": -3}}})
            assert err.value.field == "options" and "max_recall_nodes" in err.value.reason
        finally:
            store.close()

    def test_json_round_trip(self) -> None:
        request = req(TAIL_USER, generation_type="swipe", target_user_floor=5, active_owner_keys=["character:ann"])
        assert RecallRequest.model_validate_json(request.model_dump_json()) == request
        assert parse_request(request.model_dump(mode="json")) == request
