"""Faulty embedding and LLM endpoints behind the real service (fast variant of scripts/fault_test.py): each
recall degrades with the right category within its deadline, strict mode aborts, the service keeps serving."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "providers"), str(ROOT / "service")]

from servers import ChatServer, EmbeddingServer, Step  # noqa: E402
from service_live import LiveServer  # noqa: E402

from memory_recall.providers import make_embedder, make_llm  # noqa: E402
from memory_recall.providers.embedding import LocalEmbedder  # noqa: E402
from memory_recall.service import create_app  # noqa: E402
from memory_recall.settings import RecallSettings  # noqa: E402
from memory_recall.store import Store  # noqa: E402

DEADLINE_S = 0.5
#: The rest of the pipeline and the HTTP round trip on a shared 2-core machine (measured ≤ 30 ms; kept wide).
SLACK_S = 0.5
MSGS = [{"floor": i, "role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bob",
         "text": f"Ann and Bob talk about the {w} near the old lighthouse."}
        for i, w in enumerate(["key", "map", "storm", "letter"])]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[EmbeddingServer, ChatServer, dict[str, Step | None]]]:
    local = LocalEmbedder(num_threads=1)
    local.embed_passages(["warm up"])  # loads the model, so ingest embeds within the short read timeout
    emb, chat = EmbeddingServer(local), ChatServer()
    faults: dict[str, Step | None] = {"emb": None, "llm": None}
    e_next, c_next = emb.next_step, chat.next_step
    emb.next_step = lambda: e_next() or faults["emb"]  # type: ignore[method-assign]
    chat.next_step = lambda: c_next() or faults["llm"]  # type: ignore[method-assign]
    yield emb, chat, faults
    emb.close()
    chat.close()


def recall_under(servers: Any, tmp: Path, *, emb: Step | None, llm: Step | None, strict: bool) -> tuple[dict, float]:
    emb_srv, chat_srv, faults = servers
    s = RecallSettings()
    s = s.model_copy(update={
        "embedding": s.embedding.model_copy(update={
            "provider": "openai", "base_url": emb_srv.base_url, "model": "e5-test", "query_deadline_s": DEADLINE_S,
            # read_timeout bounds ingest batches; query attempts are cut to the query deadline anyway.
            "read_timeout_s": 10.0, "max_retries": 2}),
        "llm": s.llm.model_copy(update={"base_url": chat_srv.base_url, "model": "scripted", "timeout_s": DEADLINE_S}),
        "rerank": s.rerank.model_copy(update={"enabled": llm is not None}),
    })
    store = Store.open(tmp)
    embedder, chat_llm = make_embedder(s.embedding), make_llm(s.llm) if llm is not None else None
    live = LiveServer(create_app(s, store=store, embedder=embedder, llm=chat_llm)).start()
    try:
        with httpx.Client(base_url=live.url, timeout=60) as c:
            faults["emb"] = faults["llm"] = None
            ingest = c.post("/v1/chats/f/events?embed=inline",
                            json={"type": "message_added", "messages": MSGS}).json()
            assert ingest["embedding"]["status"] == "ok", ingest  # vectors stored, so recall does call the embedder
            faults["emb"], faults["llm"] = emb, llm
            ask = {"floor": 10, "role": "user", "speaker": "Ann", "text": "where is the key?"}
            t = time.perf_counter()
            r = c.post("/v1/recall", json={"chat_id": "f", "messages": [ask], "target_user_floor": 10,
                                           "strict": strict, "persist": False})
            elapsed = time.perf_counter() - t
            assert r.status_code == 200
            faults["emb"] = faults["llm"] = None
            assert c.get("/v1/health").status_code == 200
            again = c.post("/v1/recall", json={"chat_id": "f", "messages": [ask], "target_user_floor": 10,
                                               "persist": False}).json()
            assert again["status"] == "completed" and again["semantic_search_used"] is True  # recovered
        return r.json(), elapsed
    finally:
        faults["emb"] = faults["llm"] = None
        live.stop()
        store.close()
        for client in (embedder, chat_llm):
            if client is not None:
                client.close()  # type: ignore[union-attr]


EMBED_FAULTS = [
    (Step("slow", delay_s=3.0), "timeout"),
    (Step("status", status=500), "http_status"),
    (Step("malformed"), "bad_payload"),
    (Step("wrong_dim", dim=64), "dimension_mismatch"),
]


@pytest.mark.parametrize(("step", "category"), EMBED_FAULTS, ids=[c for _, c in EMBED_FAULTS])
@pytest.mark.parametrize("strict", [False, True], ids=["degrade", "strict"])
def test_embedding_fault(servers: Any, tmp_path: Path, step: Step, category: str, strict: bool) -> None:
    body, elapsed = recall_under(servers, tmp_path, emb=step, llm=None, strict=strict)
    assert elapsed < DEADLINE_S + SLACK_S
    if strict:
        assert (body["status"], body["reason"], body["failure_category"]) == (
            "aborted", "strict-mode-violation", category)
        assert body["injection_text"] == ""
    else:
        assert body["status"] == "completed"
        assert (body["retrieval_status"], body["semantic_search_used"], body["failure_category"]) == (
            "lexical_fallback", False, category)


@pytest.mark.parametrize("step", [Step("content", content="not json at all"),
                                  Step("slow", delay_s=3.0, content='{"selected_keys": []}')], ids=["garbage", "slow"])
def test_llm_fault_falls_back(servers: Any, tmp_path: Path, step: Step) -> None:
    body, elapsed = recall_under(servers, tmp_path, emb=None, llm=step, strict=False)
    assert elapsed < 2 * DEADLINE_S + SLACK_S
    assert body["status"] == "completed" and body["llm_status"] == "fallback"
    assert body["selected_node_ids"]


def test_llm_garbage_strict_aborts(servers: Any, tmp_path: Path) -> None:
    body, _ = recall_under(servers, tmp_path, emb=None, llm=Step("content", content="not json"), strict=True)
    assert (body["status"], body["reason"], body["failure_category"]) == (
        "aborted", "strict-mode-violation", "bad_payload")
