"""Faulty embedding and LLM endpoints behind the real service: recall latency against the deadline, per fault.

Runs uvicorn on 127.0.0.1 with an OpenAI-compatible embedder (and, for the LLM rows, a chat LLM) pointed at the
scripted test servers of ``tests/providers/servers.py``; each fault is made sticky (every request gets it), then
``--recalls`` fresh recalls are timed. Prints fault × latency p50/max vs deadline × outcome.

    python scripts/fault_test.py [--recalls 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "providers"), str(ROOT / "tests" / "service")]

import httpx  # noqa: E402
from servers import ChatServer, EmbeddingServer, Step, free_port  # noqa: E402
from service_live import LiveServer  # noqa: E402

from memory_recall.providers import make_embedder, make_llm  # noqa: E402
from memory_recall.providers.embedding import LocalEmbedder  # noqa: E402
from memory_recall.service import create_app  # noqa: E402
from memory_recall.settings import RecallSettings  # noqa: E402
from memory_recall.store import Store  # noqa: E402

QUERY_DEADLINE_S = 1.0
LLM_TIMEOUT_S = 1.0


class Sticky:
    """Makes a scripted server answer every request with ``fault`` (``None``: normal answers)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.fault: Step | None = None
        original = server.next_step
        server.next_step = lambda: original() or self.fault


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recalls", type=int, default=10)
    args = ap.parse_args()
    embed_srv = EmbeddingServer(LocalEmbedder(num_threads=1))
    chat_srv = ChatServer()
    emb_fault, llm_fault = Sticky(embed_srv), Sticky(chat_srv)
    rows: list[tuple[str, str, float, float, float, str]] = []
    msgs = [{"floor": i, "role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bob",
             "text": f"Ann and Bob talk about the {w} near the old lighthouse."}
            for i, w in enumerate(["key", "map", "storm", "letter", "tower", "garden", "river", "sword"])]

    def run(label: str, base_url: str, *, llm: bool, strict: bool = False) -> None:
        s = RecallSettings()
        s = s.model_copy(update={
            "embedding": s.embedding.model_copy(update={
                "provider": "openai", "base_url": base_url, "model": "e5-test", "query_deadline_s": QUERY_DEADLINE_S,
                "read_timeout_s": QUERY_DEADLINE_S, "max_retries": 2}),
            "llm": s.llm.model_copy(update={"base_url": chat_srv.base_url if llm else "", "model": "scripted",
                                            "timeout_s": LLM_TIMEOUT_S}),
            "rerank": s.rerank.model_copy(update={"enabled": llm}),
        })
        embedder = make_embedder(s.embedding)
        with tempfile.TemporaryDirectory() as tmp:
            store = Store.open(Path(tmp))
            live = LiveServer(create_app(s, store=store, embedder=embedder,
                                         llm=make_llm(s.llm) if llm else None)).start()
            saved = emb_fault.fault, llm_fault.fault
            emb_fault.fault = llm_fault.fault = None
            with httpx.Client(base_url=live.url, timeout=60) as c:
                c.post("/v1/chats/f/events", json={"type": "message_added", "messages": msgs}).raise_for_status()
                emb_fault.fault, llm_fault.fault = saved
                lat: list[float] = []
                outcomes: set[str] = set()
                for i in range(args.recalls):
                    ask = {"floor": 100 + 2 * i, "role": "user", "speaker": "Ann", "text": "where is the key?"}
                    t = time.perf_counter()
                    r = c.post("/v1/recall", json={"chat_id": "f", "messages": [ask], "target_user_floor": 100 + 2 * i,
                                                   "strict": strict, "persist": False})
                    lat.append((time.perf_counter() - t) * 1000)
                    b = r.json()
                    outcomes.add(f"{r.status_code} {b.get('status')} {b.get('retrieval_status')}"
                                 f"/{b.get('failure_category') or '-'} llm={b.get('llm_status') or '-'}")
                alive = c.get("/v1/health").status_code == 200
            live.stop()
            store.close()
        deadline = (QUERY_DEADLINE_S + (LLM_TIMEOUT_S if llm else 0)) * 1000
        rows.append((label, "strict" if strict else "", statistics.median(lat), max(lat), deadline,
                     "; ".join(sorted(outcomes)) + ("" if alive else " SERVICE DOWN")))

    dead = f"http://127.0.0.1:{free_port()}/v1"
    for label, step in [("embed ok", None), ("embed slow 3 s", Step("slow", delay_s=3.0)),
                        ("embed 500", Step("status", status=500)), ("embed garbage", Step("malformed")),
                        ("embed NaN", Step("nan")), ("embed wrong dim", Step("wrong_dim", dim=64))]:
        emb_fault.fault = step
        run(label, embed_srv.base_url, llm=False)
        if step is not None and label in ("embed slow 3 s", "embed 500"):
            run(label, embed_srv.base_url, llm=False, strict=True)
    emb_fault.fault = None
    run("embed refused", dead, llm=False)
    run("embed refused", dead, llm=False, strict=True)
    for label, step in [("llm empty answer", None), ("llm garbage", Step("content", content="not json at all")),
                        ("llm slow 3 s", Step("slow", delay_s=3.0, content='{"selected_keys": []}'))]:
        llm_fault.fault = step
        run(label, embed_srv.base_url, llm=True)
    llm_fault.fault = Step("content", content="not json at all")
    run("llm garbage", embed_srv.base_url, llm=True, strict=True)
    embed_srv.close()
    chat_srv.close()
    print(f"{'fault':<16} {'mode':<6} {'p50 ms':>8} {'max ms':>8} {'deadline ms':>11}  outcome")
    for label, mode, p50, mx, dl, out in rows:
        print(f"{label:<16} {mode:<6} {p50:8.1f} {mx:8.1f} {dl:11.0f}  {out}")


if __name__ == "__main__":
    main()
