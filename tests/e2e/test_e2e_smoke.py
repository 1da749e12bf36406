"""Smoke test of the end-to-end harness, once per SillyTavern version: the page loads with the extension (copied
in for 1.12.6, installed through *Install extension* from git for 1.19.0), every sent message reaches the LLM
as the last user message of its own request, and *Regenerate* sends one more request for the same turn."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_llm import LLMRecorder
from e2e_stack import E2EStack

pytestmark = pytest.mark.e2e


def test_harness_smoke(e2e_stack: E2EStack, st_page: Any, llm: LLMRecorder) -> None:
    # The extension is loaded, by the install method of this version.
    assert st_page.extension_drawer_present(), "memory-recall settings drawer missing from the Extensions panel"
    installed = e2e_stack.host.extensions_dir / "memory-recall"
    assert (installed / ".git").is_dir() == (e2e_stack.install_method == "git")

    sent = ["Where are we?", "Who are you?", "Can I stand up yet?"]
    for text in sent:
        reply = st_page.send(text)
        assert reply["mes"] == f"Reply {llm.generation_count}."
    prompts = llm.prompts
    assert len(prompts) == 3
    assert [p.last_user_text() for p in prompts] == sent
    assert all(p.is_chat and not p.stream for p in prompts)

    st_page.regenerate()
    prompts = llm.prompts
    assert len(prompts) == 4
    assert prompts[3].last_user_text() == sent[-1]
    chat = st_page.chat()
    assert [m["mes"] for m in chat if m["is_user"]] == sent
    assert chat[-1]["mes"] == prompts[3].reply
