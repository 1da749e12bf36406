"""memory-recall through a real SillyTavern in a real browser, on the default settings, once per SillyTavern
version (1.12.6 and the current release): every assertion reads the prompts SillyTavern sent to the LLM.

The memory block must reach the prompt; regenerate, swipe and continue must send it byte for byte; an edited user
message gets a fresh recall; a deleted message's memory is gone; a message with a macro replays identically;
quiet and impersonate generations carry no block; an outage of the service loses no message; a 1,000-message
chat syncs without a client timeout and recall works while its vectors are computed. Figures (time from *Send*
to the LLM request with and without the extension, block bytes per turn, sync times) are printed at the end of
the session (``e2e_figures``).
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from e2e_figures import record
from e2e_llm import LLMRecorder, Recorded
from e2e_service import RecallService
from e2e_stack import E2EStack

pytestmark = pytest.mark.e2e

HEADER = "[Memory - "
FACTS = [
    "I hid the brass key to the lighthouse under the loose third stair.",
    "The storm bell at the harbor rang twice before midnight.",
    "Captain Orla of the Gull keeps a silver map in the chapel crypt.",
]


def service_chat_id(st_chat_id: str) -> str:
    """The extension's chat id for the service (``serviceChatId`` in clients/sillytavern/lib/host.js)."""
    cleaned = re.sub(r"[^\w _\-.:@]", "_", st_chat_id).replace("..", "__")
    return re.sub(r"^[.\s]+", "", cleaned)[:128].strip()


def block_of(request: Recorded) -> str:
    """The memory block the request carries ('' when none): under Chat Completion the one message holding it."""
    if request.is_chat:
        blocks = [str(m.get("content")) for m in request.messages if str(m.get("content", "")).startswith(HEADER)]
        assert len(blocks) <= 1, blocks
        return blocks[0] if blocks else ""
    text = request.prompt
    at = text.find(HEADER)
    return "" if at < 0 else text[at:]


def record_of(service: RecallService, st_chat_id: str, floor: int) -> dict[str, Any]:
    out: dict[str, Any] = service.get(f"/v1/chats/{quote(service_chat_id(st_chat_id))}/records/{floor}")
    return dict(out["record"])


def service_texts(service: RecallService, st_chat_id: str) -> list[str]:
    """The texts of the chat's active message nodes, by floor."""
    graph = service.get(f"/v1/chats/{quote(service_chat_id(st_chat_id))}/export")
    nodes = sorted((n for n in graph["nodes"] if n["type"] == "message" and not n["archived"]), key=lambda n: n["seq"])
    return [n["fields"]["summary"] for n in nodes]


def wait_synced(st_page: Any, service: RecallService, timeout: float = 60.0) -> None:
    """Until the service holds every user/assistant message of the chat as SillyTavern shows it."""
    deadline = time.monotonic() + timeout
    while True:
        shown = [m["mes"] for m in st_page.chat() if not (m.get("extra") or {}).get("type")]
        try:
            if service_texts(service, st_page.chat_id()) == shown:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, (shown, service_texts(service, st_page.chat_id()))
        time.sleep(0.2)


def send_timed(st_page: Any, llm: LLMRecorder, text: str, stored: str | None = None) -> tuple[Recorded, float]:
    """Send ``text``; the LLM request it caused and the seconds from the click to its arrival."""
    mark = llm.mark()
    started = time.monotonic()
    st_page.send(text, stored=stored)
    (request,) = llm.wait_for(1, after=mark)
    return request, request.received_at - started


def test_memory_reaches_the_prompt_and_replays_byte_for_byte(
    e2e_stack: E2EStack, st_page: Any, llm: LLMRecorder, recall_service: RecallService
) -> None:
    version = e2e_stack.version
    for fact in FACTS:
        sent, seconds = send_timed(st_page, llm, fact)
        record(version, "send_to_llm_request_s (memory-recall on)", seconds)
        record(version, "block_bytes", len(block_of(sent).encode()))
    question = "Where did I hide the brass key to the lighthouse?"
    request, seconds = send_timed(st_page, llm, question)
    record(version, "send_to_llm_request_s (memory-recall on)", seconds)
    floor = len(st_page.chat()) - 2
    block = block_of(request)
    assert "loose third stair" in block, block
    assert question not in block  # the turn being answered is not its own memory
    assert block == record_of(recall_service, st_page.chat_id(), floor)["injection_text"]
    record(version, "block_bytes", len(block.encode()))
    # On top of the chat history: before the first chat message after the system prompt.
    if request.is_chat:
        contents = [str(m.get("content")) for m in request.messages]
        assert contents.index(block) < contents.index(FACTS[0])

    for action in (st_page.regenerate, st_page.swipe_right, st_page.continue_):
        mark = llm.mark()
        action()
        (again,) = llm.wait_for(1, after=mark)
        assert block_of(again).encode() == block.encode(), action.__name__
    assert record_of(recall_service, st_page.chat_id(), floor)["generation_count"] == 3

    # Impersonate writes the user's next line: no memory block (the previous turn's is not left behind).
    mark = llm.mark()
    st_page.impersonate()
    (imp,) = llm.wait_for(1, after=mark)
    assert block_of(imp) == ""
    st_page.page.fill("#send_textarea", "")

    # The same turn without memory-recall, for the latency figure.
    st_page.evaluate("() => { SillyTavern.getContext().extensionSettings.memory_recall.enabled = false; }")
    try:
        off, seconds = send_timed(st_page, llm, "And what about the storm bell?")
        assert block_of(off) == ""
        record(version, "send_to_llm_request_s (memory-recall off)", seconds)
    finally:
        st_page.evaluate("() => { SillyTavern.getContext().extensionSettings.memory_recall.enabled = true; }")


def test_an_edited_user_message_recalls_afresh(
    st_page: Any, llm: LLMRecorder, recall_service: RecallService
) -> None:
    for fact in FACTS:
        st_page.send(fact)
    first, _ = send_timed(st_page, llm, "Where did I hide the brass key?")
    floor = len(st_page.chat()) - 2
    assert "loose third stair" in block_of(first)
    edited = "Who keeps the silver map in the chapel crypt?"
    st_page.edit_message(floor, edited)
    mark = llm.mark()
    st_page.regenerate()
    (again,) = llm.wait_for(1, after=mark)
    assert again.last_user_text() == edited
    fresh = block_of(again)
    assert fresh != block_of(first)
    assert "Captain Orla" in fresh, fresh
    assert edited not in fresh
    rec = record_of(recall_service, st_page.chat_id(), floor)
    assert (rec["recall_input"], rec["bound_user_floor_text"], rec["injection_text"]) == (edited, edited, fresh)


def test_a_deleted_message_is_forgotten(st_page: Any, llm: LLMRecorder, recall_service: RecallService) -> None:
    secret = "The password of the vault below the mill is ORCHID-77."
    st_page.send(secret)
    for fact in FACTS:
        st_page.send(fact)
    wait_synced(st_page, recall_service)
    floor = next(i for i, m in enumerate(st_page.chat()) if m["mes"] == secret)
    st_page.delete_message(floor)  # from the middle: every later message moves down one floor
    wait_synced(st_page, recall_service)
    assert secret not in service_texts(recall_service, st_page.chat_id())
    request, _ = send_timed(st_page, llm, "What is the password of the vault below the mill?")
    assert "ORCHID" not in request.prompt
    block = block_of(request)
    assert block and "ORCHID" not in block


def test_a_message_with_a_macro_replays_identically(
    st_page: Any, llm: LLMRecorder, recall_service: RecallService
) -> None:
    for fact in FACTS:
        st_page.send(fact)
    stored = "Please tell Seraphina where the brass key is hidden."
    first, _ = send_timed(st_page, llm, "Please tell {{char}} where the brass key is hidden.", stored=stored)
    floor = len(st_page.chat()) - 2
    assert st_page.chat()[floor]["mes"] == stored
    rec = record_of(recall_service, st_page.chat_id(), floor)
    assert rec["bound_user_floor_text"] == stored
    mark = llm.mark()
    st_page.regenerate()
    (again,) = llm.wait_for(1, after=mark)
    assert block_of(again).encode() == block_of(first).encode() != b""
    assert record_of(recall_service, st_page.chat_id(), floor)["generation_count"] == 1


def test_text_completion_gets_the_block_too(
    st_page: Any, llm: LLMRecorder, recall_service: RecallService
) -> None:
    st_page.use_text_completion()
    try:
        for fact in FACTS:
            st_page.send(fact)
        request, _ = send_timed(st_page, llm, "Who keeps a silver map in the chapel crypt?")
        assert not request.is_chat
        floor = len(st_page.chat()) - 2
        block = record_of(recall_service, st_page.chat_id(), floor)["injection_text"]
        assert "Captain Orla" in block
        assert block in request.prompt
        mark = llm.mark()
        st_page.regenerate()
        (again,) = llm.wait_for(1, after=mark)
        assert block in again.prompt
    finally:
        st_page.use_chat_completion()


def test_an_outage_loses_no_message(
    e2e_stack: E2EStack, st_page: Any, llm: LLMRecorder, recall_service: RecallService
) -> None:
    st_page.send(FACTS[0])
    wait_synced(st_page, recall_service)
    recall_service.stop()
    try:
        during, seconds = send_timed(st_page, llm, FACTS[1])
        assert block_of(during) == ""  # no memory, but the generation went on
        record(e2e_stack.version, "send_to_llm_request_s (service down)", seconds)
        st_page.send(FACTS[2])
        panel = st_page.evaluate("() => document.getElementById('memory_recall_status_connection').textContent")
        assert panel.startswith("Offline"), panel
    finally:
        recall_service.start()
    # The outbox retries on its own (back-off at most 30 s); "Test connection" retries at once.
    st_page.evaluate("() => document.getElementById('memory_recall_test').click()")
    wait_synced(st_page, recall_service, timeout=45)
    request, _ = send_timed(st_page, llm, "Where did I hide the brass key?")
    assert "loose third stair" in block_of(request)


def test_a_long_chat_syncs_and_recall_works_meanwhile(
    e2e_stack: E2EStack, st_page: Any, llm: LLMRecorder, recall_service: RecallService
) -> None:
    count = 1000
    # A long chat as SillyTavern holds it: written into the open chat, saved, reopened (CHAT_CHANGED).
    st_page.evaluate(
        """async (count) => {
            const c = SillyTavern.getContext();
            const places = ['mill', 'harbor', 'chapel', 'tower', 'orchard', 'bridge', 'well', 'forge'];
            for (let i = 1; i < count; i++) {
                const user = i % 2 === 1;
                const text = i === 3 ? 'I buried the amber compass beneath the crooked willow by the north gate.'
                    : `Turn ${i}: we walked past the ${places[i % places.length]} and talked about the weather.`;
                c.chat.push({ name: user ? c.name1 : c.name2, is_user: user, is_system: false, mes: text,
                    send_date: Date.now(), extra: {}, ...(user ? {} : { swipes: [text], swipe_id: 0 }) });
            }
            await c.saveChat();
        }""",
        count,
    )
    chat_id = st_page.chat_id()
    started = time.monotonic()
    st_page.evaluate("async () => { await SillyTavern.getContext().reloadCurrentChat(); }")
    st_page.wait_idle()
    sid = quote(service_chat_id(chat_id))
    job: dict[str, Any] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            job = recall_service.get(f"/v1/chats/{sid}/sync")
        except httpx.HTTPStatusError:
            time.sleep(0.05)
            continue
        if job["messages"] == count and job["state"] != "ingesting":
            break
        time.sleep(0.05)
    ingested = time.monotonic() - started
    assert job.get("messages") == count and job["state"] in ("embedding", "done"), job
    record(e2e_stack.version, "sync_1000_messages_written_s (reopen to graph complete)", ingested)
    # Recall works now, before the vectors are there: the fact of floor 3 reaches the prompt.
    request, seconds = send_timed(st_page, llm, "Where did I bury the amber compass?")
    record(e2e_stack.version, "send_to_llm_request_s (during the 1000-message sync)", seconds)
    record(e2e_stack.version, "first_recall_after_reopen_s", time.monotonic() - started)
    status = st_page.evaluate("() => document.getElementById('memory_recall_status_recall').textContent")
    error = st_page.evaluate("() => document.getElementById('memory_recall_status_error').textContent")
    assert "amber compass beneath the crooked willow" in block_of(request), (status, error, block_of(request))
    job = recall_service.get(f"/v1/chats/{sid}/sync")
    if job["state"] == "embedding":
        assert "without a vector yet" in status, status
        record(e2e_stack.version, "vectors_done_at_first_recall", job["vectors_done"])
    # Stop the background embedding here: the other tests need the cores.
    httpx.delete(f"{recall_service.url}/v1/chats/{sid}", timeout=30).raise_for_status()
    # SillyTavern's own time for a turn of this chat, for comparison.
    st_page.evaluate("() => { SillyTavern.getContext().extensionSettings.memory_recall.enabled = false; }")
    try:
        _, seconds = send_timed(st_page, llm, "And the compass, was it still there?")
        record(e2e_stack.version, "send_to_llm_request_s (1000-message chat, memory-recall off)", seconds)
    finally:
        st_page.evaluate("() => { SillyTavern.getContext().extensionSettings.memory_recall.enabled = true; }")


_SPY_JS = """(service) => {
    window.__mrSent = [];
    if (window.__mrSpy) return;
    window.__mrSpy = true;
    const original = window.fetch;
    window.fetch = (input, init = {}) => {
        const url = String(input);
        if (url.startsWith(service)) {
            let body = null;
            try { body = init.body ? JSON.parse(init.body) : null; } catch { body = init.body; }
            window.__mrSent.push({ method: init.method || 'GET', path: new URL(url).pathname, body });
        }
        return original(input, init);
    };
}"""


def sent_since_spy(st_page: Any) -> list[dict[str, Any]]:
    """The requests the page made to the service since :data:`_SPY_JS` was (re)installed."""
    return list(st_page.evaluate("() => window.__mrSent"))


def _kinds(requests: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in requests:
        if r["method"] == "GET" and r["path"].endswith("/sync"):
            continue  # progress polls of a sync run on their own clock
        body = r["body"] if isinstance(r["body"], dict) else {}
        kind = body.get("type") or body.get("generation_type") or ""
        out.append(f"{r['method']} {r['path'].rsplit('/', 1)[-1]} {kind}".strip())
    return out


def test_each_chat_action_costs_what_it_changed(
    st_page: Any, llm: LLMRecorder, recall_service: RecallService
) -> None:
    for fact in FACTS:
        st_page.send(fact)
    st_page.send("Where did I hide the brass key?")
    wait_synced(st_page, recall_service)
    st_page.evaluate(_SPY_JS, recall_service.url)

    # Regenerate: one deletion (the replaced reply) and the replayed recall, never the whole chat again.
    mark = llm.mark()
    st_page.regenerate()
    llm.wait_for(1, after=mark)
    wait_synced(st_page, recall_service)
    assert _kinds(sent_since_spy(st_page)) == [
        "POST events message_deleted", "POST recall regenerate", "POST events message_added"]

    # A streamed swipe: the placeholder of the alternative being generated never reaches the service.
    st_page.set_streaming(True)
    llm.chunk_delay_s = 0.15
    try:
        st_page.evaluate(_SPY_JS, recall_service.url)
        st_page.swipe_right()
        wait_synced(st_page, recall_service)
    finally:
        llm.chunk_delay_s = 0.0
        st_page.set_streaming(False)
    sent = sent_since_spy(st_page)
    texts = [m.get("text") for r in sent if r["path"].endswith(("/events", "/sync"))
             for m in ([r["body"]["message"]] if "message" in r["body"] else r["body"].get("messages") or [])]
    assert "..." not in texts and texts, (_kinds(sent), texts)
    assert texts[-1] == st_page.chat()[-1]["mes"]

    # /hide sends no event: the next generation's reconcile tells the service first.
    st_page.hide(1)
    st_page.evaluate(_SPY_JS, recall_service.url)
    st_page.send("What rang at the harbor?")
    first = sent_since_spy(st_page)[0]
    assert _kinds([first]) == ["POST events message_edited"]
    assert (first["body"]["message"]["floor"], first["body"]["message"]["hidden"]) == (1, True)

    # A quiet generation (an extension's background prompt) carries no memory block and asks for no recall.
    st_page.evaluate(_SPY_JS, recall_service.url)
    mark = llm.mark()
    st_page.evaluate("async () => { await SillyTavern.getContext().generateQuietPrompt('Summarize the chat.'); }")
    (quiet,) = llm.wait_for(1, after=mark)
    assert block_of(quiet) == ""
    assert not [r for r in sent_since_spy(st_page) if r["path"].endswith("/recall")]
