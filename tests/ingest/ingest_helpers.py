"""A short two-speaker chat the ingest tests share (not a test module; ``from ingest_helpers import BASE``)."""

from __future__ import annotations

from typing import Any

from memory_recall.model import ChatMessage

NOW = 1_767_225_600_000
T0 = 1_700_000_000_000

BASE = [
    ChatMessage(floor=0, role="user", speaker="Caroline", text="Hey Mel! Oscar says hi.", send_time_ms=T0),
    ChatMessage(floor=1, role="assistant", speaker="Melanie", text="Hi Caroline. How is Oscar?", send_time_ms=T0 + 1),
    ChatMessage(floor=2, role="user", speaker="Caroline", text='We read "Becoming Nicole" in Paris.',
                send_time_ms=T0 + 2),
    ChatMessage(floor=3, role="assistant", speaker="Melanie", text="Paris again! Lovely.", send_time_ms=T0 + 3),
    ChatMessage(floor=4, role="user", speaker="Caroline", text="Next: Lake Tahoe with Melanie.", send_time_ms=T0 + 4),
]


def write_plan(store: Any, chat_id: str, plan: Any) -> None:
    """Write an ingest plan's nodes and edges in one batch, as ``ingest_messages`` does (nothing when empty)."""
    if plan.empty:
        return
    with store.write(chat_id) as w:
        if plan.nodes:
            w.upsert_nodes(plan.nodes)
        if plan.edges:
            w.upsert_edges(plan.edges)
