"""OpenAPI-driven fuzzing: hypothesis builds requests for every operation of ``/openapi.json`` — bodies from the
operation's JSON schema (in and out of its bounds), random JSON, malformed bytes and hostile path values — and
sends them to a real uvicorn server. No request may answer 5xx."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_live import LiveServer

from memory_recall.service import create_app
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

FUZZ_CHAT = "fz"
MIN_REQUESTS = 300
#: Deeper runs: MEMORY_RECALL_FUZZ_EXAMPLES=5000 pytest tests/service/test_service_fuzz.py
EXAMPLES = max(MIN_REQUESTS, int(os.environ.get("MEMORY_RECALL_FUZZ_EXAMPLES", "420")))

json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | st.text(max_size=20)
any_json = st.recursive(
    json_leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12,
)


def from_schema(schema: dict[str, Any], spec: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """A strategy for values of one JSON schema; mostly valid, sometimes just outside a bound."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(spec["components"]["schemas"][name], spec, depth + 1))
    if depth > 6:
        return json_leaf
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, spec, depth + 1) for s in schema[key]])
    if "allOf" in schema:
        return from_schema(schema["allOf"][0], spec, depth + 1)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        hi = min(int(schema.get("maxLength", 40)), 40)
        lo = min(int(schema.get("minLength", 0)), hi)
        return st.text(min_size=lo, max_size=hi) | st.sampled_from(["", " ", "..", "a/b", "\x00", "msg:0", "é漢字"])
    if kind in ("integer", "number"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        edges = [v for v in (lo, hi) if v is not None]
        edges += [v - 1 for v in edges if v == lo] + [v + 1 for v in edges if v == hi]
        ints = st.integers(min_value=lo, max_value=hi) if kind == "integer" else st.floats(lo, hi, allow_nan=False)
        return ints | st.sampled_from(edges or [0])
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items", {}), spec, depth + 1)
        if "prefixItems" in schema:
            return st.tuples(*[from_schema(s, spec, depth + 1) for s in schema["prefixItems"]]).map(list)
        return st.lists(items, min_size=min(int(schema.get("minItems", 0)), 3), max_size=3)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        fixed = {k: from_schema(v, spec, depth + 1) for k, v in props.items() if k in required}
        optional = {k: from_schema(v, spec, depth + 1) for k, v in props.items() if k not in required}
        base = st.fixed_dictionaries(fixed, optional=optional)
        if not props:
            return st.dictionaries(st.text(max_size=10), any_json, max_size=4)
        return base
    return any_json


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, item in sorted(spec["paths"].items())
        for method, op in sorted(item.items())
    ]


chat_ids = st.sampled_from([FUZZ_CHAT, "nobody", "..", ".x", " a", "a b", "漢字", "x" * 129, "%2F", "a:b@c"]) | st.text(
    min_size=1, max_size=20
)
floors = st.sampled_from(["0", "1", "4", "-1", "10000001", "x", "1.5", "99999999999999999999"]) | st.integers(
    0, 30
).map(str)


def request_for(
    data: st.DataObject, method: str, path: str, op: dict[str, Any], spec: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    url = path
    if "{chat_id}" in url:
        url = url.replace("{chat_id}", quote(data.draw(chat_ids), safe=""))
    if "{floor}" in url:
        url = url.replace("{floor}", data.draw(floors))
    kwargs: dict[str, Any] = {}
    body_schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body_schema is not None or method in ("POST", "PUT", "DELETE"):
        shape = data.draw(st.sampled_from(["schema", "schema", "schema", "json", "bytes", "none"]))
        if shape == "schema" and body_schema is not None:
            body = data.draw(from_schema(body_schema, spec))
            if isinstance(body, dict) and "chat_id" in body and data.draw(st.booleans()):
                body["chat_id"] = FUZZ_CHAT
            kwargs["content"] = json.dumps(body).encode()
        elif shape == "json":
            kwargs["content"] = json.dumps(data.draw(any_json)).encode()
        elif shape == "bytes":
            kwargs["content"] = data.draw(st.binary(max_size=64))
        if "content" in kwargs:
            kwargs["headers"] = {"content-type": data.draw(st.sampled_from(["application/json", "text/plain"]))}
    return url, kwargs


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    store = Store.open(tmp_path_factory.mktemp("fuzz"))
    app = create_app(RecallSettings(), store=store)
    server = LiveServer(app).start()
    client = httpx.Client(base_url=server.url, timeout=30)
    messages = [
        {"floor": i, "role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bob",
         "text": f"Ann asks Bob about the old lighthouse, visit {i}."}
        for i in range(6)
    ]
    client.post(f"/v1/chats/{FUZZ_CHAT}/events", json={"type": "message_added", "messages": messages})
    client.post("/v1/recall", json={"chat_id": FUZZ_CHAT, "messages": messages[:5], "target_user_floor": 4})
    spec = client.get("/openapi.json").json()
    yield client, spec
    client.close()
    server.stop()
    store.close()


def test_no_route_answers_5xx(fuzz_server: tuple[httpx.Client, dict[str, Any]]) -> None:
    client, spec = fuzz_server
    ops = operations(spec)
    assert len(ops) >= 17
    seen: Counter[tuple[str, str]] = Counter()
    statuses: Counter[int] = Counter()
    failures: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def send(data: st.DataObject) -> None:
        method, path, op = data.draw(st.sampled_from(ops))
        url, kwargs = request_for(data, method, path, op, spec)
        r = client.request(method, url, **kwargs)
        seen[(method, path)] += 1
        statuses[r.status_code] += 1
        if r.status_code >= 500:
            failures.append(f"{method} {url} {kwargs.get('content', b'')[:300]!r} -> {r.status_code} {r.text[:300]}")
        assert r.status_code < 500, failures[-1]
        if r.status_code == 422:
            body = r.json()
            assert body["error"] and isinstance(body["detail"], list) and body["detail"][0]["loc"]

    send()
    assert not failures
    assert sum(seen.values()) >= MIN_REQUESTS
    assert {(m, p) for m, p, _ in ops} == set(seen), "every operation was fuzzed"
    assert statuses[200] > 0 and statuses[422] > 0
