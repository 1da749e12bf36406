"""``memory-recall demo``: ingest the bundled demo roleplay chat and show what recall has to work with.

The demo chat ships inside the package (``memory_recall/data/demo_chat.json``), so the command works on a fresh
install with no files of its own. It is ingested with the same message rules users run, embedded with the
default embedder (the packaged local model when the ``local`` extra is installed), and, once the retrieve
pipeline is available, recalled for the chat's last user turn.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from typing import Any

from pydantic import ValidationError

from memory_recall.errors import InputError
from memory_recall.model.chat import ChatMessage
from memory_recall.model.graph import first_validation_error

__all__ = ["load_demo_chat", "run_demo"]

DEMO_CHAT_ID = "demo"


def load_demo_chat() -> tuple[str, list[ChatMessage]]:
    """The bundled demo chat: its title and messages."""
    raw: dict[str, Any] = json.loads(
        resources.files("memory_recall").joinpath("data/demo_chat.json").read_text(encoding="utf-8")
    )
    messages = []
    for i, m in enumerate(raw["messages"]):
        try:
            messages.append(ChatMessage.model_validate(m))
        except ValidationError as exc:
            raise first_validation_error(exc, f"demo_chat.messages[{i}]") from None
    return str(raw.get("title", "demo")), messages


def run_demo(args: argparse.Namespace) -> int:
    """Ingest (and embed) the demo chat into the store, then report; returns the exit status."""
    from memory_recall.cli import _embed, _open_store, _run_recall
    from memory_recall.ingest.messages import ingest_messages

    title, messages = load_demo_chat()
    users = [m for m in messages if m.role == "user"]
    if not users:
        raise InputError("demo_chat.messages", "the demo chat has no user message")
    store = _open_store(args)
    try:
        started = time.perf_counter()
        # The chat up to (not including) its last user turn: that turn is what recall answers.
        history = [m for m in messages if m.floor < users[-1].floor]
        report = ingest_messages(store, DEMO_CHAT_ID, history, now_ms=int(time.time() * 1000))
        took = time.perf_counter() - started
        stats = store.stats(DEMO_CHAT_ID)
        print(f"demo chat: {title!r}, {len(messages)} messages ({len(history)} before the last user turn)")
        print(
            f"ingested into chat {DEMO_CHAT_ID!r}: {stats['node_count']} nodes, {stats['edge_count']} edges "
            f"(+{report.nodes_added} nodes this run, {took * 1000:.0f} ms)"
        )
        by_type = stats.get("nodes_by_type", {})
        if by_type:
            print("nodes by type: " + ", ".join(f"{t} {c}" for t, c in sorted(by_type.items())))
        print(_embed(store, DEMO_CHAT_ID, args))
    finally:
        store.close()
    last = users[-1]
    earlier = [m for m in history if m.role != "system"][-4:]
    print(f"\nrecall for the last user turn (floor {last.floor}): {last.text}")
    recall_args = argparse.Namespace(**vars(args))
    recall_args.chat = DEMO_CHAT_ID
    recall_args.input = last.text
    recall_args.recent = [f"[{m.role}]: {m.text}" for m in earlier]
    recall_args.region = None
    recall_args.owner = None
    response = _run_recall(recall_args)
    status = response.retrieval_status + (f" ({response.failure_category})" if response.failure_category else "")
    print(f"{len(response.selected)} memories selected, retrieval {status}\n")
    print(f"{'#':>3} {'score':>7}  {'memory':<14} why (largest parts of the score)")
    for mem in response.selected:
        parts = sorted(mem["explanation"]["parts"], key=lambda p: -p["contribution"])[:2]
        why = ", ".join(f"{p['name']} {p['contribution']:.3f}" for p in parts if p["contribution"] > 0)
        text = str(mem["label"]).replace("\n", " ")
        print(f"{mem['rank']:>3} {mem['score']:>7.4f}  {mem['node_id']:<14} {why or mem['origin']}  | {text[:70]}")
    if response.injection_text:
        print("\ninjection block:\n" + response.injection_text)
    return 0
