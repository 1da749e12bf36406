"""Every page helper of the harness against both SillyTavern versions, with what each does to the chat and to the
LLM recorder. A check of the harness itself (slow: run with ``-m slow``); the extension is not asserted on."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from e2e_llm import LLMRecorder
from e2e_service import RecallService

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_page_helpers(st_page: Any, llm: LLMRecorder) -> None:
    st_page.send("First.")
    st_page.send("Second.")
    assert [p.last_user_text() for p in llm.prompts] == ["First.", "Second."]

    # Regenerate replaces the last reply; SillyTavern first deletes it (MESSAGE_DELETED with the new length).
    mark = st_page.mark()
    before = len(st_page.chat())
    regenerated = st_page.regenerate()
    assert regenerated["mes"] == llm.prompts[-1].reply
    assert len(st_page.chat()) == before
    assert st_page.events(mark, ["message_deleted"])[0]["args"] == [before - 1]

    # A swipe past the last alternative generates; swiping back and forth between stored ones does not.
    first = regenerated["mes"]
    second = st_page.swipe_right()["mes"]
    assert second == llm.prompts[-1].reply != first
    count = len(llm.prompts)
    assert st_page.swipe_left()["mes"] == first
    assert st_page.swipe_right()["mes"] == second
    assert len(llm.prompts) == count
    assert st_page.chat()[-1]["swipes"] == [first, second]

    continued = st_page.continue_()
    assert continued["mes"].startswith(second) and continued["mes"] != second
    assert st_page.impersonate() == llm.prompts[-1].reply
    st_page.page.fill("#send_textarea", "")

    st_page.edit_message(1, "First, edited.")
    assert st_page.chat()[1]["mes"] == "First, edited."
    st_page.hide(1)
    assert st_page.chat()[1]["is_system"] is True

    length = len(st_page.chat())
    mark = st_page.mark()
    st_page.delete_message(2)
    assert len(st_page.chat()) == length - 1
    assert st_page.events(mark, ["message_deleted"])[0]["args"] == [length - 1]
    st_page.delete_last(2)
    assert len(st_page.chat()) == length - 3


def test_streaming_and_text_completion(st_page: Any, llm: LLMRecorder) -> None:
    try:
        st_page.set_streaming(True)
        assert st_page.send("Streamed.")["mes"] == llm.prompts[-1].reply
        assert llm.prompts[-1].stream and llm.prompts[-1].is_chat
        st_page.set_streaming(False)

        st_page.use_text_completion()
        assert st_page.send("Text.")["mes"] == llm.prompts[-1].reply
        assert llm.prompts[-1].path == "/v1/completions" and not llm.prompts[-1].stream
        assert "Text." in llm.prompts[-1].prompt
        st_page.set_streaming(True)
        assert st_page.send("Text streamed.")["mes"] == llm.prompts[-1].reply
        assert llm.prompts[-1].stream and not llm.prompts[-1].is_chat
    finally:
        st_page.set_streaming(False)
        st_page.use_chat_completion()
        st_page.set_streaming(False)
    st_page.send("Chat again.")
    assert llm.prompts[-1].is_chat and not llm.prompts[-1].stream


def test_service_outage_and_scripted_replies(st_page: Any, llm: LLMRecorder, recall_service: RecallService) -> None:
    recall_service.stop()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{recall_service.url}/v1/health", timeout=2)
    llm.script(["Scripted one.", "Scripted two."])
    assert st_page.send("While the service is down.")["mes"] == "Scripted one."
    recall_service.start()
    assert recall_service.get("/v1/health")["status"] == "ok"
    assert st_page.send("It is back.")["mes"] == "Scripted two."
    mark = llm.mark()
    st_page.send("Once more.")
    assert llm.wait_for(1, after=mark)[0].last_user_text() == "Once more."
