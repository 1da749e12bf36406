"""Every controller gate returns its documented status and reason (reference §2.2, scenarios 52, 53, 58)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from controller_helpers import CHAT, NOW, CountingPipeline, request, upto

from memory_recall.controller import REASON_TEXT, Reason, RecallController
from memory_recall.errors import EmbeddingUnavailable
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


class TestGateTable:
    @pytest.mark.parametrize(("case", "fields", "status", "reason"), GATES, ids=[g[0] for g in GATES])
    def test_gate(
        self, controller: RecallController, counting: CountingPipeline, messages: list[ChatMessage],
        case: str, fields: dict[str, Any], status: str, reason: str,
    ) -> None:
        fields = dict(fields)
        msgs = fields.pop("messages", _msgs(messages))
        resp = controller.run_recall(request(msgs, **fields))
        assert (resp.status, resp.reason) == (status, reason)
        assert resp.ok is (status == "completed")
        assert counting.calls == (1 if status == "completed" else 0)
        assert resp.reason_text == REASON_TEXT.get(reason.split(":")[0], reason)

    def test_disabled(self, store: Store, chat: str, messages: list[ChatMessage]) -> None:
        counting = CountingPipeline()
        settings = RecallSettings().with_overrides({"controller": {"enabled": False}})
        resp = RecallController(store, settings, pipeline=counting).run_recall(
            request(_msgs(messages), target_user_floor=10)
        )
        assert (resp.status, resp.reason, resp.reason_text) == ("skipped", "recall-disabled", "召回功能未启用")
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

    def test_trivial_history_floor(self, controller: RecallController) -> None:
        msgs = [ChatMessage(floor=0, role="user", text="/sys narrate"),
                ChatMessage(floor=1, role="assistant", text="x")]
        resp = controller.run_recall(request(msgs, generation_type="swipe"))
        assert (resp.status, resp.reason) == ("skipped", "trivial-input:slash-command")


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
