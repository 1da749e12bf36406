"""Write side: what goes into a chat's memory graph.

* :mod:`~memory_recall.ingest.messages` — chat messages → message, character and entity nodes with speaker
  and mention edges, without any LLM (edits, swipes and deletions update or retire them).
* :mod:`~memory_recall.ingest.names` — the rule-based name detector messages use.
* :mod:`~memory_recall.ingest.locomo` — the LoCoMo benchmark file → chat messages and questions.
* :mod:`~memory_recall.ingest.stbme` — ST-BME graph export import/export.

Usage::

    from memory_recall.ingest import ingest_messages, load_locomo

    for conv in load_locomo("locomo_dev.json"):
        ingest_messages(store, conv.sample_id, conv.messages, now_ms=now)
"""

from __future__ import annotations

from memory_recall.ingest.locomo import LocomoConversation, LocomoQuestion, load_locomo, parse_locomo
from memory_recall.ingest.messages import (
    GraphView,
    IngestPlan,
    IngestReport,
    character_id,
    delete_message,
    edit_message,
    entity_id,
    ingest_messages,
    load_view,
    message_id,
    parse_message_date,
    plan_deletions,
    plan_messages,
    swipe_message,
)
from memory_recall.ingest.names import KnownNames, Mention, detect_names
from memory_recall.ingest.stbme import ImportReport, export_stbme, import_stbme, import_stbme_report

__all__ = [
    "GraphView",
    "ImportReport",
    "IngestPlan",
    "IngestReport",
    "KnownNames",
    "LocomoConversation",
    "LocomoQuestion",
    "Mention",
    "character_id",
    "delete_message",
    "detect_names",
    "edit_message",
    "entity_id",
    "export_stbme",
    "import_stbme",
    "import_stbme_report",
    "ingest_messages",
    "load_locomo",
    "load_view",
    "message_id",
    "parse_locomo",
    "parse_message_date",
    "plan_deletions",
    "plan_messages",
    "swipe_message",
]
