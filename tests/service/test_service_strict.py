"""The HTTP API takes exactly what its schema says: no coercion, 404 for what the store does not hold, the schema
states the rules and every status, ``Allow`` lists every method of a path.

Each case here was accepted or mis-answered before (recorded on a fresh clone: ``"floor": false`` deleted floor
0, a recall for an unknown chat answered 200, ``message_edited`` on a missing floor created it …).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from memory_recall.store.sqlite import chat_id_pattern, validate_chat_id

CHAT = "strict-chat"


def _message(floor: Any, role: str = "user", text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"floor": floor, "role": role, "text": text, **extra}


@pytest.fixture
def client(live_server: Any) -> httpx.Client:
    """A service holding :data:`CHAT` with floors 0 (user), 1 (assistant) and 2 (user)."""
    _, client = live_server()
    story = [
        _message(0, text="Marcus hid the brass key under the third stair."),
        _message(1, "assistant", "The lighthouse keeper nods."),
        _message(2, text="Tomorrow we sail to the harbor."),
    ]
    r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "messages": story})
    assert r.status_code == 200
    return client


def _texts(client: httpx.Client) -> list[tuple[int, str]]:
    graph = client.get(f"/v1/chats/{CHAT}/export").json()
    return sorted((n["seq"], n["fields"]["summary"]) for n in graph["nodes"] if n["type"] == "message")


class TestNoCoercion:
    @pytest.mark.parametrize("floor", [False, True, "0", "3", 0.0, 4.0, None])
    def test_a_deleted_floor_is_an_integer(self, client: httpx.Client, floor: Any) -> None:
        before = _texts(client)
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_deleted", "floor": floor})
        assert (r.status_code, r.json()["error"]) == (
            422, "body.message_deleted.floor: Input should be a valid integer"
        )
        assert _texts(client) == before  # nothing deleted

    @pytest.mark.parametrize(
        ("key", "value", "message"),
        [
            ("floor", "3", "Input should be a valid integer"),
            ("floor", 3.0, "Input should be a valid integer"),
            ("floor", True, "Input should be a valid integer"),
            ("send_time_ms", False, "Input should be a valid integer"),
            ("send_time_ms", "1700000000000", "Input should be a valid integer"),
            ("hidden", 0, "Input should be a valid boolean"),
            ("hidden", "false", "Input should be a valid boolean"),
            ("text", 5, "Input should be a valid string"),
            ("speaker", False, "Input should be a valid string"),
        ],
    )
    def test_message_fields_keep_their_types(self, client: httpx.Client, key: str, value: Any, message: str) -> None:
        r = client.post(
            f"/v1/chats/{CHAT}/events", json={"type": "message_added", "messages": [{**_message(3), key: value}]}
        )
        assert (r.status_code, r.json()["error"]) == (422, f"body.message_added.messages.0.{key}: {message}")
        assert len(_texts(client)) == 3

    def test_a_path_floor_is_written_in_digits(self, client: httpx.Client) -> None:
        for floor in ("4.0", "+0", "0_0", "%200"):
            r = client.get(f"/v1/chats/{CHAT}/records/{floor}")
            assert r.status_code == 422, floor
            assert r.json()["error"] == "path.floor: Value error, must be written in decimal digits", floor

    def test_node_numbers_and_flags_keep_their_types(self, client: httpx.Client) -> None:
        for key, value in [("seq", "4"), ("importance", "5"), ("archived", 1), ("level", 1.0)]:
            r = client.post(f"/v1/chats/{CHAT}/nodes", json={"nodes": [{"id": "n1", "type": "event", key: value}]})
            assert r.status_code == 422, key
            assert r.json()["detail"][0]["loc"] == ["body", "nodes", 0, key]
        # An integer importance is a number (JSON has one number type for it).
        r = client.post(f"/v1/chats/{CHAT}/nodes", json={"nodes": [{"id": "n1", "type": "event", "importance": 5}]})
        assert r.status_code == 200


class TestNotFound:
    def test_recall_for_an_unknown_chat(self, client: httpx.Client) -> None:
        r = client.post("/v1/recall", json={"chat_id": "nobody", "messages": [_message(0)], "target_user_floor": 0})
        assert (r.status_code, r.json()["error"]) == (404, "chat_id: unknown chat 'nobody'")
        assert [c["chat_id"] for c in client.get("/v1/chats").json()["chats"]] == [CHAT]  # nothing created

    def test_delete_in_an_unknown_chat(self, client: httpx.Client) -> None:
        r = client.post("/v1/chats/nobody/events", json={"type": "message_deleted", "floor": 0})
        assert (r.status_code, r.json()["error"]) == (404, "chat_id: unknown chat 'nobody'")

    def test_delete_of_a_missing_floor(self, client: httpx.Client) -> None:
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_deleted", "floor": 7})
        assert (r.status_code, r.json()["error"]) == (404, f"floor: chat '{CHAT}' has no message at floor 7")
        assert len(_texts(client)) == 3

    def test_edit_of_a_missing_floor_creates_nothing(self, client: httpx.Client) -> None:
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_edited", "message": _message(9)})
        assert (r.status_code, r.json()["error"]) == (404, f"message.floor: chat '{CHAT}' has no message at floor 9")
        assert [floor for floor, _ in _texts(client)] == [0, 1, 2]

    def test_edit_in_an_unknown_chat(self, client: httpx.Client) -> None:
        r = client.post("/v1/chats/nobody/events", json={"type": "message_edited", "message": _message(0)})
        assert r.status_code == 404
        assert client.get("/v1/chats/nobody/stats").status_code == 404


class TestQueryWithoutMessages:
    def test_query_text_alone_recalls_from_the_chat(self, client: httpx.Client) -> None:
        r = client.post("/v1/recall", json={"chat_id": CHAT, "query_text": "Where is the brass key?"})
        body = r.json()
        assert (r.status_code, body["status"], body["reason"]) == (200, "completed", "recall-completed")
        assert "third stair" in body["injection_text"]

    def test_nothing_to_recall_for_is_an_empty_chat(self, client: httpx.Client) -> None:
        r = client.post("/v1/recall", json={"chat_id": CHAT, "query_text": "   "})
        assert (r.json()["status"], r.json()["reason"]) == ("skipped", "empty-chat")


class TestSchema:
    @pytest.fixture
    def doc(self, client: httpx.Client) -> dict[str, Any]:
        return client.get("/openapi.json").json()

    def test_chat_id_rules_are_the_validators(self, doc: dict[str, Any]) -> None:
        schema = doc["components"]["schemas"]["ChatId"]
        assert (schema["minLength"], schema["maxLength"], schema["pattern"]) == (1, 128, chat_id_pattern())
        pattern = re.compile(schema["pattern"])
        for chat_id in ["c1", "a b", "x.y", "user@host:1", "é-名前", " lead", "trail ", ".dot", "a..b", "a/b", "a\x00"]:
            try:
                validate_chat_id(chat_id)
                valid = True
            except Exception:
                valid = False
            assert bool(pattern.search(chat_id)) == valid, chat_id
        recall = doc["components"]["schemas"]["RecallRequest"]["properties"]["chat_id"]
        assert recall == {"$ref": "#/components/schemas/ChatId"}

    def test_event_message_one_of_is_declared(self, doc: dict[str, Any]) -> None:
        added = doc["components"]["schemas"]["MessageAdded"]
        assert added["oneOf"] == [{"required": ["message"]}, {"required": ["messages"]}]

    def test_every_route_declares_its_statuses_and_responses(self, doc: dict[str, Any]) -> None:
        for path, operations in doc["paths"].items():
            for method, operation in operations.items():
                statuses = set(operation["responses"])
                assert {"401", "404", "413", "421", "422", "503"} <= statuses, (method, path, statuses)
                if "requestBody" in operation:
                    assert "400" in statuses, (method, path)
                (success,) = [status for status in statuses if status.startswith("2")]
                assert success == ("202" if (method, path) == ("post", "/v1/chats/{chat_id}/sync") else "200")
                ok = operation["responses"][success]["content"]["application/json"]["schema"]
                assert "$ref" in ok, (method, path, ok)
        stats = doc["paths"]["/v1/chats/{chat_id}/stats"]["get"]["responses"]["200"]["content"]
        export = doc["paths"]["/v1/chats/{chat_id}/export"]["get"]["responses"]["200"]["content"]
        assert stats["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatStats"}
        assert export["application/json"]["schema"] == {"$ref": "#/components/schemas/StbmeExport"}

    def test_undecodable_bodies_are_declared_client_errors(self, client: httpx.Client) -> None:
        # Not UTF-8 (nor UTF-16/32, which the JSON parser detects by their first bytes): 400, declared on every
        # route that reads a body. A UTF-16 byte order mark with nothing after it: JSON that does not parse, 422.
        for raw, status, error in [
            (b"\xff\x14", 400, "body: not valid UTF-8 (byte 0)"),
            (b'{"type": "\x80"}', 400, "body: not valid UTF-8 (byte 10)"),
            (b"\xff\xfe", 422, "body.0: JSON decode error"),
        ]:
            r = client.post(f"/v1/chats/{CHAT}/events", content=raw, headers={"content-type": "application/json"})
            assert (r.status_code, r.json()["error"]) == (status, error), raw


class TestAllow:
    @pytest.mark.parametrize(
        ("path", "allow"),
        [
            (f"/v1/chats/{CHAT}/nodes", "DELETE, POST"),
            (f"/v1/chats/{CHAT}/edges", "DELETE, POST"),
            (f"/v1/chats/{CHAT}", "DELETE"),
            (f"/v1/chats/{CHAT}/sync", "GET, POST"),
            ("/v1/recall", "POST"),
        ],
    )
    def test_405_lists_every_method_of_the_path(self, client: httpx.Client, path: str, allow: str) -> None:
        r = client.request("PATCH", path)
        assert (r.status_code, r.headers["allow"]) == (405, allow)
        assert client.options(path).headers["allow"] == allow
