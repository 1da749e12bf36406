"""OpenAPI-driven fuzzing: hypothesis builds requests for every operation of ``/openapi.json`` — bodies from the
operation's JSON schema (in and out of its bounds), random JSON, malformed bytes and hostile path values — and
sends them to a real uvicorn server. No request may answer 5xx. The generators live in ``fuzz_requests.py``
(shared with ``scripts/fuzz_service.py``, the 10,000-request run)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fuzz_requests import FUZZ_CHAT, operations, request_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_live import LiveServer

from memory_recall.service import create_app
from memory_recall.settings import RecallSettings
from memory_recall.store import Store

MIN_REQUESTS = 300
#: Deeper runs: MEMORY_RECALL_FUZZ_EXAMPLES=5000 pytest tests/service/test_service_fuzz.py
EXAMPLES = max(MIN_REQUESTS, int(os.environ.get("MEMORY_RECALL_FUZZ_EXAMPLES", "420")))


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
