"""Every controller gate returns its documented status and reason (reference §2.2, scenarios 52, 53, 58)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from controller_helpers import CHAT, NOW, CountingPipeline, request, upto

from memory_recall.controller import REASON_TEXT, REASON_TEXT_EN, Reason, RecallController, reason_text
from memory_recall.errors import EmbeddingUnavailable, InputError
from memory_recall.model.chat import ChatMessage
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

ASSISTANT_ONLY = [ChatMessage(floor=0, role="assistant", text="Welcome to Thornwick Manor.")]


def _msgs(messages: list[ChatMessage]) -> list[ChatMessage]:
    return upto(messages, 10)


GATES: list[tuple[str, dict[str, Any], str, str]] = [
    # (case, request fields, status, reason)
    ("dry-run", {"dry_run": True}, "skipped", "dry-run"),
    ("quiet", {"generation_type": "quiet"}, "skipped", "generation-type-skipped:quiet"),
    ("impersonate", {"generation_type": "impersonate"}, "skipped", "generation-type-skipped:impersonate"),
    ("empty-chat", {"messages": []}, "skipped", "empty-chat"),
    ("no-user-floor", {"messages": ASSISTANT_ONLY, "generation_type": "regenerate"}, "skipped", "no-user-floor"),
    ("no-user-input", {"messages": ASSISTANT_ONLY}, "skipped", "no-user-input"),
    ("trivial", {"query_text": "/echo test", "target_user_floor": 10}, "skipped", "trivial-input:slash-command"),
    ("completed", {"target_user_floor": 10}, "completed", "recall-completed"),
]

#: ``reason_text`` of each gate case: (English, Chinese locale). Chinese is the reference's message (reference
#: §2.2) where it has one, else the English text.
TEXTS: dict[str, tuple[str, str]] = {
    "dry-run": ("Dry run: no recall", "Dry run: no recall"),
    "quiet": ("No recall for this generation type (quiet)", "No recall for this generation type (quiet)"),
    "impersonate": (
        "No recall for this generation type (impersonate)", "No recall for this generation type (impersonate)"
    ),
    "empty-chat": ("The chat is empty", "当前聊天为空"),
    "no-user-floor": ("No user floor is available for a history generation", "没有可用于历史生成的用户楼层"),
    "no-user-input": ("No user input is available for recall", "当前没有可用于召回的用户输入"),
    "trivial": (
        "The input is too trivial to recall for (slash-command)",
        "The input is too trivial to recall for (slash-command)",
    ),
    "completed": ("Recall completed", "召回完成"),
}

#: Locales and whether they select Chinese (a ``zh`` primary subtag, any case).
LOCALES: list[tuple[str | None, bool]] = [
    (None, False), ("en", False), ("en-US", False), ("fr-CA", False), ("zhx", False),
    ("zh", True), ("zh-CN", True), ("zh-Hant-TW", True), ("ZH-cn", True),
]


class TestGateTable:
    @pytest.mark.parametrize(("case", "fields", "status", "reason"), GATES, ids=[g[0] for g in GATES])
    @pytest.mark.parametrize("locale", [None, "en-US", "zh-CN"])
    def test_gate(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage],
        case: str, fields: dict[str, Any], status: str, reason: str, locale: str | None,
    ) -> None:
        fields = dict(fields)
        msgs = fields.pop("messages", _msgs(messages))
        resp = controller.run_recall(request(msgs, locale=locale, **fields))
        assert (resp.status, resp.reason) == (status, reason)
        assert resp.ok is (status == "completed")
        assert counting.calls == (1 if status == "completed" else 0)
        assert resp.reason_text == TEXTS[case][locale == "zh-CN"]

    def test_disabled(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        counting = CountingPipeline()
        settings = RecallSettings().with_overrides({"controller": {"enabled": False}})
        resp = RecallController(store, settings, pipeline=counting).run_recall(
            request(_msgs(messages), target_user_floor=10)
        )
        assert (resp.status, resp.reason, resp.reason_text) == ("skipped", "recall-disabled", "Recall is disabled")
        zh = RecallController(store, settings, pipeline=counting).run_recall(
            request(_msgs(messages), target_user_floor=10, locale="zh")
        )
        assert (zh.reason, zh.reason_text) == ("recall-disabled", "召回功能未启用")
        assert counting.calls == 0

    def test_disabled_per_request(self, controller: RecallController, messages: list[ChatMessage]) -> None:
        resp = controller.run_recall(request(_msgs(messages), options={"controller": {"enabled": False}}))
        assert resp.reason == Reason.DISABLED

    def test_order_disabled_beats_dry_run_beats_type_beats_empty(
        self, controller: RecallController
    ) -> None:
        base = {"dry_run": True, "generation_type": "quiet", "messages": []}
        assert controller.run_recall(request(**base, options={"controller": {"enabled": False}})).reason == (
            "recall-disabled"
        )
        assert controller.run_recall(request(**base)).reason == "dry-run"
        assert controller.run_recall(request(**{**base, "dry_run": False})).reason == (
            "generation-type-skipped:quiet"
        )

    @pytest.mark.parametrize("field", ["query_text", "override_text"])
    def test_explicit_text_without_messages_recalls(
        self, controller: RecallController, counting: CountingPipeline, field: str
    ) -> None:
        """Gate 4's departure: a chat's graph is there to recall from when the request brings the text."""
        resp = controller.run_recall(request([], **{field: "Where did Marcus hide the brass key?"}))
        assert (resp.status, resp.reason) == ("completed", "recall-completed")
        assert counting.queries == ["Where did Marcus hide the brass key?"]
        # The chat's graph answered: first the one name the question gives (Marcus, an entity anchor), then the one
        # message that asks Marcus about a key.
        assert resp.selected_node_ids[:2] == ["ent:marcus", "msg:6"]

    @pytest.mark.parametrize("blank", ["", "   ", "\n\t"])
    def test_blank_text_without_messages_is_an_empty_chat(
        self, controller: RecallController, counting: CountingPipeline, blank: str
    ) -> None:
        resp = controller.run_recall(request([], query_text=blank, override_text=blank))
        assert (resp.status, resp.reason) == ("skipped", "empty-chat")
        assert counting.calls == 0

    def test_trivial_history_floor(self, controller: RecallController) -> None:
        msgs = [ChatMessage(floor=0, role="user", text="/sys narrate"),
                ChatMessage(floor=1, role="assistant", text="x")]
        resp = controller.run_recall(request(msgs, generation_type="swipe"))
        assert (resp.status, resp.reason) == ("skipped", "trivial-input:slash-command")


class TestReasonText:
    def test_english_covers_every_reason_code(self) -> None:
        codes = [v for k, v in vars(Reason).items() if k.isupper()]
        assert {c: REASON_TEXT_EN[c] for c in codes} == {
            "recall-disabled": "Recall is disabled",
            "dry-run": "Dry run: no recall",
            "generation-type-skipped": "No recall for this generation type",
            "empty-chat": "The chat is empty",
            "no-user-floor": "No user floor is available for a history generation",
            "no-user-input": "No user input is available for recall",
            "trivial-input": "The input is too trivial to recall for",
            "persisted-record-reused": "Reused the persisted recall",
            "recall-completed": "Recall completed",
            "strict-mode-violation": "A provider failed in strict mode",
            "stage-failed": "A pipeline stage failed",
        }
        assert list(REASON_TEXT_EN) == codes

    def test_reference_chinese_table_is_unchanged(self) -> None:
        assert REASON_TEXT == {
            "recall-disabled": "召回功能未启用",
            "empty-chat": "当前聊天为空",
            "no-user-floor": "没有可用于历史生成的用户楼层",
            "no-user-input": "当前没有可用于召回的用户输入",
            "persisted-record-reused": "复用已持久化召回",
            "recall-completed": "召回完成",
        }

    @pytest.mark.parametrize(("locale", "chinese"), LOCALES, ids=[str(loc) for loc, _ in LOCALES])
    def test_locale_picks_the_language(self, locale: str | None, chinese: bool) -> None:
        assert reason_text("recall-completed", locale) == ("召回完成" if chinese else "Recall completed")
        assert reason_text("persisted-record-reused", locale) == (
            "复用已持久化召回" if chinese else "Reused the persisted recall"
        )
        # No Chinese message in the reference: English with the detail, in every locale.
        assert reason_text("generation-type-skipped:quiet", locale) == "No recall for this generation type (quiet)"
        assert reason_text("not-a-code:x", locale) == "not-a-code:x"

    @pytest.mark.parametrize(("locale", "text"), [(None, "Reused the persisted recall"), ("zh-TW", "复用已持久化召回")])
    def test_replay_text(
        self, controller: RecallController, messages: list[ChatMessage], locale: str | None, text: str
    ) -> None:
        controller.run_recall(request(upto(messages, 10), target_user_floor=10))
        resp = controller.run_recall(request(upto(messages, 11), generation_type="swipe", locale=locale, t=10))
        assert (resp.reason, resp.reason_text) == ("persisted-record-reused", text)

    @pytest.mark.parametrize(
        "locale", ["", "e", "en_US", "en-", "-en", "en--US", "en-US-", "abcdefghi", "en-abcdefghi", "中文", "en US",
                   "a" * 8 + "-abcdefgh" * 3 + "-a"],
    )
    def test_bad_locale_is_an_input_error(self, controller: RecallController, locale: str) -> None:
        with pytest.raises(InputError) as err:
            controller.run_recall({"chat_id": CHAT, "locale": locale})
        assert err.value.field == "locale"

    def test_longest_locale_is_accepted(self, controller: RecallController) -> None:
        locale = "a" * 8 + "-abcdefgh" * 3  # 35 characters
        assert len(locale) == 35
        resp = controller.run_recall({"chat_id": CHAT, "locale": locale})
        assert (resp.reason, resp.reason_text) == ("empty-chat", "The chat is empty")

    def test_non_string_locale_is_an_input_error(self, controller: RecallController) -> None:
        with pytest.raises(InputError) as err:
            controller.run_recall({"chat_id": CHAT, "locale": 5})
        assert err.value.field == "locale"


class _FailingEmbedder:
    model_id = "fake:fail-4d"
    dim = 4

    def embed_query(self, text: str) -> np.ndarray:
        raise EmbeddingUnavailable("timeout", "no answer within 1 ms")

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        raise EmbeddingUnavailable("timeout", "no answer within 1 ms")


class TestConformance:
    def test_scenario_52_history_after_normal(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage]
    ) -> None:
        """52: reference transactions let a second hook of the same generation reuse the first hook's result
        (``shouldRun false``, type ``regenerate``). Transactions and hook states are host-side plumbing and do
        not exist in a backend (each request is independent). The part that does: a second request for the
        same user floor with a history type reports its own generation type and does not retrieve again."""
        controller.run_recall(request(upto(messages, 10), target_user_floor=10))
        resp = controller.run_recall(request(upto(messages, 11), generation_type="regenerate", t=500))
        assert (resp.generation_type, resp.source, counting.calls) == ("regenerate", "persisted", 1)

    def test_scenario_53_trivial_input(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage]
    ) -> None:
        """53: ``"/echo test"`` → ``trivial:slash-command``, no recall. The trivial-skip *flag* (TTL 60 s,
        consumed by the next assistant message, skipping extraction) is host state around the host's own
        extraction and does not apply: the backend checks the trivial rule on every request's resolved text."""
        msgs = [*upto(messages, 11), ChatMessage(floor=12, role="user", text="/echo test")]
        resp = controller.run_recall(request(msgs, target_user_floor=12))
        assert (resp.status, resp.reason, counting.calls) == ("skipped", "trivial-input:slash-command", 0)
        resp = controller.run_recall(request(upto(messages, 10), send_intent="/echo test"))
        assert resp.reason == "trivial-input:slash-command"
        # a following non-trivial request is not affected by the earlier trivial one
        resp = controller.run_recall(request(upto(messages, 10), target_user_floor=10))
        assert resp.status == "completed"

    @pytest.mark.parametrize(
        ("case", "expected"),
        [
            ("no-graph", ("completed", "recall-completed")),
            ("disabled", ("skipped", "recall-disabled")),
            ("empty-chat", ("skipped", "empty-chat")),
            ("no-input", ("skipped", "no-user-input")),
        ],
    )
    def test_scenario_58_gate_order(self, store: Store, case: str, expected: tuple[str, str]) -> None:
        """58: no graph → skipped 当前无图谱 …. Adaptation: a backend has no "graph not loaded" state — an
        unknown chat is an empty graph, so the recall completes with nothing selected and nothing persisted."""
        settings = RecallSettings()
        msgs = [ChatMessage(floor=0, role="user", text="hello there")]
        fields: dict[str, Any] = {"chat_id": "unknown-chat", "target_user_floor": 0}
        if case == "disabled":
            settings = settings.with_overrides({"controller": {"enabled": False}})
        if case == "empty-chat":
            msgs, fields = [], {"chat_id": "unknown-chat"}
        if case == "no-input":
            msgs = [ChatMessage(floor=0, role="user", text="   ")]
        resp = RecallController(store, settings).run_recall(request(msgs, **fields))
        assert (resp.status, resp.reason) == expected
        if case == "no-graph":
            assert resp.selected_node_ids == [] and not resp.record_persisted
            assert store.chat_version("unknown-chat") == 0

    def test_scenario_58_embedding_timeout(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        """58: an embedding timeout → aborted. Adaptation (departure 3): non-strict recall degrades to lexical
        (completed, ``lexical_fallback``, failure category); strict mode aborts with ``strict-mode-violation``."""
        vectors = {f"msg:{m.floor}": np.eye(4, dtype=np.float32)[m.floor % 4] for m in messages}
        store.put_embeddings(CHAT, _FailingEmbedder.model_id, vectors)
        controller = RecallController(store, RecallSettings(), embedder=_FailingEmbedder())
        resp = controller.run_recall(request(upto(messages, 10), target_user_floor=10))
        assert (resp.status, resp.retrieval_status, resp.semantic_search_used) == (
            "completed", "lexical_fallback", False
        )
        assert resp.failure_category == "timeout"
        version = store.chat_version(CHAT)
        resp = controller.run_recall(request(upto(messages, 10), target_user_floor=8, strict=True, t=1))
        assert (resp.status, resp.reason, resp.failure_category) == ("aborted", "strict-mode-violation", "timeout")
        assert store.get_record(CHAT, 8) is None and store.chat_version(CHAT) == version


def test_now_defaults_to_the_clock(store: Store, chat: str, messages: list[ChatMessage]) -> None:
    controller = RecallController(store, RecallSettings(), clock=lambda: NOW + 123)
    resp = controller.run_recall(request(upto(messages, 10), target_user_floor=10).model_copy(update={"now_ms": None}))
    assert resp.record is not None and resp.record.created_at == NOW + 123
