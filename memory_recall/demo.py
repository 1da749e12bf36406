"""``memory-recall demo``: ingest the bundled demo roleplay chat and show what recall has to work with.

The demo chat ships inside the package (``memory_recall/data/demo_chat.json``), so the command works on a fresh
install with no files of its own. It is ingested with the same message rules users run, embedded with the
default embedder (the packaged local model when the ``local`` extra is installed), and recalled for the chat's
last user turn. The recall is read-only (no access reinforcement), so running the demo again prints the same
memories; the ingest of an unchanged chat writes nothing either.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from typing import Any

from pydantic import ValidationError

from memory_recall.cli_common import (
    Column,
    by_score,
    cli_recall,
    command_settings,
    embed_summary,
    format_table,
    ingest_chats,
    open_store,
    terminal_bars,
)
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
    """Ingest (and embed) the demo chat into the store, then recall for its last user turn (read-only: the recall
    writes nothing, so a second run prints the same memories); returns the exit status.

    ``args``: ``data_dir``, ``config`` (or ``settings``, already loaded), ``quiet``, ``no_embed``.
    """
    settings = command_settings(args)
    title, messages = load_demo_chat()
    users = [m for m in messages if m.role == "user"]
    if not users:
        raise InputError("demo_chat.messages", "the demo chat has no user message")
    bars = terminal_bars(args.quiet)
    # The chat up to (not including) its last user turn: that turn is what recall answers.
    history = [m for m in messages if m.floor < users[-1].floor]
    store = open_store(args.data_dir, settings)
    try:
        (done,) = ingest_chats(store, [(DEMO_CHAT_ID, history)], now_ms=int(time.time() * 1000), bars=bars)
        stats = store.stats(DEMO_CHAT_ID)
        print(f"demo chat: {title!r}, {len(messages)} messages ({len(history)} before the last user turn)")
        print(
            f"ingested into chat {DEMO_CHAT_ID!r}: {stats['node_count']} nodes, {stats['edge_count']} edges "
            f"(+{done.report.nodes_added} nodes this run, {done.seconds * 1000:.0f} ms)"
        )
        by_type = stats.get("nodes_by_type", {})
        if by_type:
            print("nodes by type: " + ", ".join(f"{t} {c}" for t, c in sorted(by_type.items())))
        print(embed_summary(store, DEMO_CHAT_ID, settings, skip=args.no_embed, bars=bars))
    finally:
        store.close()
    last = users[-1]
    earlier = [m for m in history if m.role != "system"][-4:]
    print(f"\nrecall for the last user turn (floor {last.floor}): {last.text}")
    response = cli_recall(
        args.data_dir, settings, chat_id=DEMO_CHAT_ID, text=last.text,
        recent=[f"[{m.role}]: {m.text}" for m in earlier],
    )
    status = response.retrieval_status + (f" ({response.failure_category})" if response.failure_category else "")
    print(f"{len(response.selected)} memories selected, retrieval {status}; by score, highest first "
          "(order: position in the selection)\n")
    rows = []
    for mem in by_score(response.selected):
        parts = sorted(mem["explanation"]["parts"], key=lambda p: (-p["contribution"], p["name"]))[:2]
        why = ", ".join(f"{p['name']} {p['contribution']:.3f}" for p in parts if p["contribution"] > 0)
        rows.append((f"{mem['score']:.4f}", mem["rank"], mem["node_id"], why or mem["origin"], mem["label"]))
    columns = (
        Column("score", ">"), Column("order", ">"), Column("memory", max_width=32),
        Column("why (largest parts of the score)", max_width=40), Column("text", max_width=70),
    )
    for line in format_table(columns, rows):
        print(line)
    if response.injection_text:
        print("\ninjection block:\n" + response.injection_text)
    return 0
