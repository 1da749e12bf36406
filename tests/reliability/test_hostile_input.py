"""Targeted hostile requests against the real service on 127.0.0.1: each gets its exact 4xx status with a body
naming the problem, the server keeps answering, and the stored graph of an existing chat is unchanged."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from service_live import LiveServer  # noqa: E402

from memory_recall.service import create_app  # noqa: E402
from memory_recall.settings import RecallSettings  # noqa: E402
from memory_recall.store import Store  # noqa: E402

CHAT = "kept"
MIB = 1024 * 1024
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def service() -> Iterator[httpx.Client]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp))
        server = LiveServer(create_app(RecallSettings(), store=store)).start()
        client = httpx.Client(base_url=server.url, timeout=60)
        messages = [
            {"floor": i, "role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bob",
             "text": f"Ann and Bob search the lighthouse, part {i}."}
            for i in range(4)
        ]
        assert client.post(f"/v1/chats/{CHAT}/events", json={"type": "message_added", "messages": messages}).is_success
        yield client
        client.close()
        server.stop()
        store.close()


def export_digest(client: httpx.Client) -> str:
    r = client.get(f"/v1/chats/{CHAT}/export")
    assert r.status_code == 200
    return hashlib.sha256(r.content).hexdigest()


def node(**over: object) -> dict[str, object]:
    return {"id": "h1", "type": "event", "fields": {"title": "t"}, **over}


def message(**over: object) -> dict[str, object]:
    return {"floor": 9, "role": "user", "speaker": "Ann", "text": "hi", **over}


def chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield b"x" * min(size, total - sent)
        sent += size


# (name, method, path, body bytes or iterator, headers, status, text the error must contain)
CASES: list[tuple[str, str, str, object, dict[str, str], int, str]] = [
    ("giant body", "POST", "/v1/recall", b"{" + b" " * (3 * MIB) + b"}", JSON, 413, "larger than 2097152 bytes"),
    ("deep array", "POST", "/v1/recall", b"[" * 100_000, JSON, 400, "nested too deeply"),
    ("deep object", "POST", f"/v1/chats/{CHAT}/import", b'{"a":' * 50_000, JSON, 400, "nested too deeply"),
    ("invalid utf-8", "POST", "/v1/recall", b'{"chat_id": "kept", "query_text": "\xff\xfe"}', JSON, 400,
     "not valid UTF-8"),
    ("NaN importance", "POST", f"/v1/chats/{CHAT}/nodes",
     b'{"nodes": [{"id": "h1", "type": "event", "importance": NaN, "fields": {"title": "t"}}]}', JSON, 422,
     "nodes.0.importance"),
    ("Infinity strength", "POST", f"/v1/chats/{CHAT}/edges",
     b'{"edges": [{"id": "e", "from_id": "a", "to_id": "b", "strength": Infinity}]}', JSON, 422, "strength"),
    ("unknown node type", "POST", f"/v1/chats/{CHAT}/nodes", json.dumps({"nodes": [node(type="zzz")]}).encode(),
     JSON, 422, "unknown node type 'zzz'"),
    ("NUL in speaker", "POST", f"/v1/chats/{CHAT}/events",
     json.dumps({"type": "message_added", "message": message(speaker="A\x00")}).encode(), JSON, 422, "NUL"),
    ("NUL in query text", "POST", "/v1/recall",
     json.dumps({"chat_id": CHAT, "query_text": "a\x00b"}).encode(), JSON, 422, "query_text"),
    ("NUL in an owner key", "POST", "/v1/recall",
     json.dumps({"chat_id": CHAT, "active_owner_keys": ["character:a\x00"]}).encode(), JSON, 422,
     "active_owner_keys"),
    ("message over the limit", "POST", f"/v1/chats/{CHAT}/events",
     json.dumps({"type": "message_added", "message": message(text="x" * 1_000_000)}).encode(), JSON, 422,
     "message.text"),
    ("wrong content type", "POST", "/v1/recall", b"chat_id=kept", {"content-type": "text/plain"}, 422, "body"),
    ("path ..", "GET", "/v1/chats/%2e%2e/export", None, {}, 422, "path.chat_id"),
    # %2F decodes to an extra path segment: no route matches.
    ("path a/b", "GET", "/v1/chats/a%2Fb/export", None, {}, 404, "Not Found"),
    ("overlong chat id", "GET", "/v1/chats/" + "x" * 129 + "/stats", None, {}, 422, "path.chat_id"),
    ("empty chat id in body", "POST", "/v1/recall", b'{"chat_id": ""}', JSON, 422, "chat_id"),
]


@pytest.mark.parametrize(("name", "method", "path", "body", "headers", "status", "needle"), CASES,
                         ids=[c[0] for c in CASES])
def test_hostile_request(
    service: httpx.Client, name: str, method: str, path: str, body: object, headers: dict[str, str], status: int,
    needle: str,
) -> None:
    before = export_digest(service)
    r = service.request(method, path, content=body, headers=headers)  # type: ignore[arg-type]
    assert r.status_code == status, r.text[:300]
    assert needle in r.json()["error"] or needle in json.dumps(r.json()["detail"]), r.text[:300]
    assert service.get("/v1/health").status_code == 200
    assert export_digest(service) == before


def test_chunked_giant_body_without_content_length(service: httpx.Client) -> None:
    before = export_digest(service)
    r = service.post("/v1/recall", content=chunks(3 * MIB), headers=JSON)
    assert "content-length" not in {k.lower() for k in r.request.headers}
    assert r.status_code == 413 and "larger than 2097152 bytes" in r.json()["error"]
    assert export_digest(service) == before
