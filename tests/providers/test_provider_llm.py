"""Chat LLM: one attempt per call against a scripted chat-completions server on 127.0.0.1, the rerank prompt
of reference §3.15 and the tolerant answer parser."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from servers import ChatServer, Step, free_port

from memory_recall.errors import ConfigError, InputError, LLMUnavailable
from memory_recall.providers.llm import (
    CONTEXT_REVIEW_HEADER,
    TARGET_HEADER,
    ChatLLM,
    OpenAIChatLLM,
    OwnerScore,
    build_rerank_messages,
    make_llm,
    parse_rerank_answer,
    request_rerank,
)
from memory_recall.settings import LLMSettings

SLACK_S = 0.5
VALID = (
    '{"selected_keys": ["R2", "R1"], "reason": "scene", "active_owner_keys": ["character:alice"], '
    '"active_owner_scores": [{"ownerKey": "character:alice", "score": 0.9, "reason": "pov"}]}'
)
NODE_IDS = ["evt-7f3a9c", "char-alice-01", "pov-bob-22"]
CANDIDATES = [
    "[R1] 类型=事件, 作用域=客观, 时间=未标注, title: The ford flooded (评分=0.812)",
    "[R2] 类型=角色, 作用域=客观, name: Alice (评分=0.640)",
    "[R3] 类型=主观记忆, 作用域=POV | character:Bob, summary: Bob distrusts Alice (评分=0.511)",
]


@pytest.fixture()
def llm(chat_server: ChatServer) -> Iterator[OpenAIChatLLM]:
    client = OpenAIChatLLM(base_url=chat_server.base_url, model="scripted", api_key="sk-llm")
    yield client
    client.close()


def _messages() -> list[dict[str, str]]:
    return build_rerank_messages(
        context_lines=["[user]: We ride north.", "[assistant]: The river is high.", "[user]: Cross it?"],
        user_message="Cross it?",
        candidate_lines=CANDIDATES,
        owner_lines=["- ownerKey=character:alice; ownerName=Alice; score=0.8; reasons=named"],
        max_nodes=2,
    )


class TestOneAttempt:
    """Each call makes exactly one request, whatever the answer."""

    @pytest.mark.parametrize(
        ("step", "category"),
        [
            (Step("status", status=500), "http_status"),
            (Step("status", status=429), "http_status"),
            (Step("refusal"), "refusal"),
            (Step("filtered"), "refusal"),
            (Step("content", content=""), "refusal"),
            (Step("content", content="   "), "refusal"),
            (Step("content", content="I think R1 and R2 are best."), "bad_payload"),
            (Step("content", content='{"selected_keys": ["R1"'), "bad_payload"),
            (Step("raw", body=b"<html>gateway</html>"), "bad_payload"),
            (Step("raw", body=b'{"id": "x", "choices": []}'), "bad_payload"),
            (Step("content", content='{"answer": "R1"}'), "unknown_keys"),
        ],
    )
    def test_failure_categories(
        self, chat_server: ChatServer, llm: OpenAIChatLLM, step: Step, category: str
    ) -> None:
        chat_server.push(step, Step("content", content=VALID))  # a retry would succeed: there must be none
        with pytest.raises(LLMUnavailable) as info:
            request_rerank(llm, _messages(), deadline_s=5.0)
        assert info.value.category == category
        assert chat_server.post_count == 1

    @pytest.mark.parametrize(
        "content",
        [VALID, f"```json\n{VALID}\n```", f"Sure! Here is my selection:\n{VALID}\nHope this helps."],
        ids=["plain", "fenced", "prose"],
    )
    def test_valid_answers(self, chat_server: ChatServer, llm: OpenAIChatLLM, content: str) -> None:
        chat_server.push(Step("content", content=content))
        answer = request_rerank(llm, _messages(), deadline_s=5.0)
        assert answer.selected_keys == ["R2", "R1"]
        assert answer.active_owner_scores == (OwnerScore("character:alice", 0.9, "pov"),)
        assert answer.protocol == "candidate-keys-v1"
        assert chat_server.post_count == 1

    def test_slow_answer_times_out_within_deadline(self, chat_server: ChatServer, llm: OpenAIChatLLM) -> None:
        chat_server.push(Step("slow", delay_s=5.0, content=VALID))
        start = time.monotonic()
        with pytest.raises(LLMUnavailable) as info:
            llm.complete(_messages(), deadline_s=0.5)
        assert info.value.category == "timeout"
        assert time.monotonic() - start < 0.5 + SLACK_S
        assert chat_server.post_count == 1

    def test_connection_refused(self) -> None:
        with OpenAIChatLLM(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m") as dead:
            start = time.monotonic()
            with pytest.raises(LLMUnavailable) as info:
                dead.complete([{"role": "user", "content": "hi"}], deadline_s=1.0)
        assert info.value.category == "connect"
        assert time.monotonic() - start < 1.0 + SLACK_S

    def test_request_shape(self, chat_server: ChatServer, llm: OpenAIChatLLM) -> None:
        chat_server.push(Step("content", content=VALID))
        llm.complete(_messages(), deadline_s=5.0)
        (req,) = chat_server.posts()
        assert req.path == "/v1/chat/completions"
        assert req.headers["Authorization"] == "Bearer sk-llm"
        assert req.body["model"] == "scripted"
        assert req.body["temperature"] == 0.0
        assert req.body["response_format"] == {"type": "json_object"}
        assert [m["role"] for m in req.body["messages"]] == ["system", "user"]

    def test_prompt_has_short_keys_never_node_ids(self, chat_server: ChatServer, llm: OpenAIChatLLM) -> None:
        chat_server.push(Step("content", content=VALID))
        llm.complete(_messages(), deadline_s=5.0)
        sent = json.dumps(chat_server.posts()[0].body, ensure_ascii=False)
        assert "[R1]" in sent and "[R2]" in sent and "[R3]" in sent
        for node_id in NODE_IDS:
            assert node_id not in sent

    def test_invalid_deadline(self, llm: OpenAIChatLLM) -> None:
        with pytest.raises(InputError):
            llm.complete([], deadline_s=0)

    def test_protocol(self, llm: OpenAIChatLLM) -> None:
        assert isinstance(llm, ChatLLM)


class TestMockTransport:
    def test_non_string_content(self) -> None:
        body = {"choices": [{"message": {"content": [{"type": "text"}]}, "finish_reason": "stop"}]}
        transport = httpx.MockTransport(lambda r: httpx.Response(200, json=body))
        with OpenAIChatLLM(base_url="http://mock/v1", model="m", transport=transport) as client:
            with pytest.raises(LLMUnavailable) as info:
                client.complete([], deadline_s=1)
        assert info.value.category == "bad_payload"

    def test_truncated_json_hint(self) -> None:
        body = {"choices": [{"message": {"content": '{"selected_keys": ["R'}, "finish_reason": "length"}]}
        transport = httpx.MockTransport(lambda r: httpx.Response(200, json=body))
        with OpenAIChatLLM(base_url="http://mock/v1", model="m", transport=transport) as client:
            with pytest.raises(LLMUnavailable, match="truncated") as info:
                client.complete([], deadline_s=1)
        assert info.value.category == "bad_payload"

    def test_plain_text_mode(self) -> None:
        body = {"choices": [{"message": {"content": "pong"}, "finish_reason": "stop"}]}
        seen: list[dict[str, Any]] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(json.loads(request.content))
            return httpx.Response(200, json=body)

        with OpenAIChatLLM(
            base_url="http://mock/v1/chat/completions",
            model="m",
            json_mode=False,
            max_tokens=3,
            transport=httpx.MockTransport(handler),
        ) as client:
            assert client.complete([{"role": "user", "content": "ping"}], deadline_s=1) == "pong"
        assert "response_format" not in seen[0] and seen[0]["max_tokens"] == 3


class TestBuildRerankMessages:
    def test_layout(self) -> None:
        system, user = _messages()
        assert system["role"] == "system" and user["role"] == "user"
        text = user["content"]
        review = text.index(CONTEXT_REVIEW_HEADER)
        target = text.index(TARGET_HEADER)
        assert review < target < text.index("Cross it?", target) < text.index("[R1]") < text.index("[R3]")
        assert "[user]: We ride north.\n---\n[assistant]: The river is high." in text
        assert "candidate_count=3" in text
        assert "ownerKey=character:alice" in text
        assert "at most 2" in system["content"]
        assert "selected_keys" in system["content"] and "active_owner_scores" in system["content"]

    def test_owner_cap_is_min_4_max_nodes(self) -> None:
        many = build_rerank_messages(
            context_lines=[], user_message="hi", candidate_lines=[], owner_lines=[], max_nodes=12
        )
        assert "up to 4 " in many[0]["content"]
        few = build_rerank_messages(
            context_lines=[], user_message="hi", candidate_lines=[], owner_lines=[], max_nodes=2
        )
        assert "up to 2 " in few[0]["content"]

    def test_no_owner_note_and_single_context_line(self) -> None:
        _, user = build_rerank_messages(
            context_lines=["[user]: only"],
            user_message="only",
            candidate_lines=CANDIDATES[:1],
            owner_lines=[],
            max_nodes=3,
        )
        text = user["content"]
        assert CONTEXT_REVIEW_HEADER not in text
        assert TARGET_HEADER + "\n[user]: only" in text
        assert "return []" in text
        assert "candidate_count=1" in text

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"max_nodes": 0}, "max_nodes"),
            ({"max_nodes": True}, "max_nodes"),
            ({"candidate_lines": ["evt-7f3a9c: the ford"]}, "candidate_lines[0]"),
            ({"owner_lines": "x"}, "owner_lines"),
        ],
    )
    def test_invalid(self, kwargs: dict[str, Any], field: str) -> None:
        params: dict[str, Any] = {
            "context_lines": [],
            "user_message": "hi",
            "candidate_lines": [],
            "owner_lines": [],
            "max_nodes": 3,
        }
        params.update(kwargs)
        with pytest.raises(InputError) as info:
            build_rerank_messages(**params)
        assert info.value.field == field


class TestParseRerankAnswer:
    def test_legacy_ids(self) -> None:
        answer = parse_rerank_answer('{"selected_ids": ["evt-1", "evt-2"]}')
        assert answer.selected_keys is None
        assert answer.selected_ids == ["evt-1", "evt-2"]
        assert answer.protocol == "legacy-selected-ids"

    def test_raw_values_kept(self) -> None:
        answer = parse_rerank_answer('{"selected_keys": "R1", "reason": 3}')
        assert answer.selected_keys == "R1"  # not a list: the rerank stage decides (invalid-candidate)
        assert answer.reason == "3"
        assert parse_rerank_answer('{"selected_keys": []}').selected_keys == []

    def test_owner_scores_list_forms_and_clamp(self) -> None:
        answer = parse_rerank_answer(
            json.dumps(
                {
                    "selected_keys": ["R1"],
                    "active_owner_scores": [
                        {"ownerKey": "character:alice", "score": 1.7, "reason": "x"},
                        {"owner": "Bob", "score": -0.2},
                        {"owner_name": "Carol", "score": "0.5"},
                        {"score": 0.4},
                        {"ownerKey": "character:dan", "score": "high"},
                        "junk",
                    ],
                }
            )
        )
        assert answer.active_owner_scores == (
            OwnerScore("character:alice", 1.0, "x"),
            OwnerScore("Bob", 0.0),
            OwnerScore("Carol", 0.5),
        )

    def test_owner_scores_dict_form(self) -> None:
        answer = parse_rerank_answer(
            '{"active_owner_keys": ["character:alice"], '
            '"active_owner_scores": {"character:alice": 0.92, "user:me": 2}}'
        )
        assert answer.active_owner_keys == ["character:alice"]
        assert answer.active_owner_scores == (OwnerScore("character:alice", 0.92), OwnerScore("user:me", 1.0))

    @pytest.mark.parametrize("text", ["", "no json here", "[1, 2]", '{"selected_keys": ['])
    def test_bad_payload(self, text: str) -> None:
        with pytest.raises(LLMUnavailable) as info:
            parse_rerank_answer(text)
        assert info.value.category == "bad_payload"

    @pytest.mark.parametrize("text", ["{}", '{"keys": ["R1"]}', 'Result: {"answer": 1}'])
    def test_unknown_keys(self, text: str) -> None:
        with pytest.raises(LLMUnavailable) as info:
            parse_rerank_answer(text)
        assert info.value.category == "unknown_keys"

    def test_first_object_after_prose_with_braces(self) -> None:
        answer = parse_rerank_answer('Picked {two} items {} of them: {"selected_keys": ["R1"]} done')
        assert answer.selected_keys == ["R1"]


class TestMakeLLM:
    def test_not_configured(self) -> None:
        assert make_llm(LLMSettings()) is None

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"base_url": "http://127.0.0.1:1/v1"}, "llm.model"),
            ({"model": "m"}, "llm.base_url"),
            ({"base_url": "localhost:8080", "model": "m"}, "llm.base_url"),
        ],
    )
    def test_half_configured(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            make_llm(LLMSettings(**kwargs))
        assert info.value.field == field

    def test_from_settings(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MY_LLM_KEY", "sk-9")
        llm = make_llm(
            LLMSettings(
                base_url="http://127.0.0.1:1/v1", model="m", api_key_env="MY_LLM_KEY", temperature=0.3
            ),
            max_tokens=1920,
        )
        assert llm is not None
        assert (llm.api_key, llm.temperature, llm.max_tokens, llm.url) == (
            "sk-9",
            0.3,
            1920,
            "http://127.0.0.1:1/v1/chat/completions",
        )
