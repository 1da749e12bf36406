"""The user's own current message is never recalled as a memory (the current-turn rule of the visibility stage, a
departure listed in docs/reference-differences.md): a recall for user floor N excludes the message nodes at
floors ≥ N, also after the host edited that message."""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_helpers import CHAT, NOW, demo_messages, request, upto

from memory_recall.controller import RecallController
from memory_recall.ingest.messages import ingest_messages
from memory_recall.store import Store

FLOOR = 10  # the last user message of the demo chat's first twelve floors
EDITED = "Hobnailed boots and a forced latch... who in this house wears hobnailed boots?"
#: The fresh lexical recall for the edited floor: msg:9 (the boot prints: "Hobnailed boots, a big man") leads.
EXPECTED = [
    "msg:9", "msg:1", "char:narrator", "msg:7", "msg:5", "ent:erin", "msg:3", "msg:8", "msg:0", "msg:2",
    "ent:ladyship", "ent:lord-thornwick-95ffa729",
]


@pytest.mark.parametrize(
    ("last_floor", "excluded"),
    [(FLOOR, 1), (FLOOR + 1, 2)],  # without / with the assistant reply that follows the edited turn
    ids=["edited-turn-is-last", "reply-after-it"],
)
def test_edited_user_message_is_not_recalled_for_its_own_floor(
    tmp_path: Path, last_floor: int, excluded: int
) -> None:
    messages = demo_messages()
    with Store(tmp_path / "store.sqlite3") as store:
        ingest_messages(store, CHAT, upto(messages, last_floor), now_ms=NOW - 1000)
        controller = RecallController(store)
        first = controller.run_recall(request(upto(messages, FLOOR), target_user_floor=FLOOR))
        assert first.status == "completed" and f"msg:{FLOOR}" not in first.selected_node_ids
        edited = messages[FLOOR].model_copy(update={"text": EDITED})
        report = controller.on_message_edited(CHAT, edited, now_ms=NOW + 10)
        assert report.record_deleted

        resp = controller.run_recall(request([*upto(messages, FLOOR - 1), edited], target_user_floor=FLOOR, t=20))

    assert (resp.status, resp.source, resp.recall_input) == ("completed", "fresh", EDITED)
    assert resp.selected_node_ids == EXPECTED
    visibility = next(t for t in resp.traces if t["name"] == "visibility")
    assert visibility["notes"]["userFloor"] == FLOOR
    assert visibility["notes"]["currentTurnExcludedCount"] == excluded
    assert EDITED not in resp.injection_text
