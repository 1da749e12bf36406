"""Drive a SillyTavern page in Chromium the way a user does. Not a test module (imported as ``e2e_page``).

:class:`SillyTavernPage` wraps one Playwright page on a :class:`e2e_host.SillyTavernHost`. Every action clicks
or types in the real UI and returns only when SillyTavern is idle again (see :meth:`SillyTavernPage.wait_idle`);
generation actions also wait until the generation ended and the last message is rendered. The selectors of
both supported versions are the same and live in :data:`SEL`.

An init script wraps SillyTavern's ``EventEmitter.prototype.emit`` (and ``emitAndWait``) to log every event in
emission order into ``window.__e2e.events``: ``{i, name, args, t0, t1}`` where ``args`` are JSON-safe copies,
``t0`` is ``performance.now()`` at emission and ``t1`` when every listener (the extension's included) has
finished (null while one still runs). :meth:`SillyTavernPage.events` reads it; the waits use it too.
Events emitted before the wrapper is installed (the first few of page load) are not logged.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from e2e_env import E2EError
from e2e_host import SillyTavernHost
from playwright.sync_api import BrowserContext, Page
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

#: Every selector the harness uses; identical in SillyTavern 1.12.6 and 1.19.0.
SEL = {
    "textarea": "#send_textarea",
    "send": "#send_but",
    "stop": "#mes_stop",  # display:flex while a generation runs, display:none otherwise
    "options": "#options_button",  # the ☰ menu left of the input
    "regenerate": "#option_regenerate",
    "continue": "#option_continue",
    "impersonate": "#option_impersonate",
    "new_chat": "#option_start_new_chat",
    "delete_mode": "#option_delete_mes",
    "delete_mode_ok": "#dialogue_del_mes_ok",
    "delete_checkbox": ".del_checkbox",  # inside a message, shown in delete mode
    "characters_drawer": "#rightNavDrawerIcon",
    "characters_panel": "#right-nav-panel",
    "character": "#rm_print_characters_block .character_select",
    "message": '#chat .mes[mesid="{floor}"]',
    "last_message": "#chat .mes.last_mes",
    "swipe_right": "#chat .mes.last_mes .swipe_right",
    "swipe_left": "#chat .mes.last_mes .swipe_left",
    "edit": ".mes_edit",  # inside a message
    "edit_textarea": "#curEditTextarea",
    "edit_done": ".mes_edit_done",
    "edit_delete": ".mes_edit_delete",
    "popup": "dialog[open]",
    "popup_ok": "dialog[open] .popup-button-ok",
    "main_api": "#main_api",
    "connect_openai": "#api_button_openai",
    "connect_textgen": "#api_button_textgenerationwebui",
    "stream_chat": "#stream_toggle",
    "stream_text": "#streaming_textgenerationwebui",
    "extensions_settings": "#extensions_settings, #extensions_settings2",
    "extension_drawer": ".memory-recall-settings",
}

#: Chromium flags that work headless in a container without a GPU, sandbox or network.
CHROMIUM_ARGS = (
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
)

_EVENT_LOG_JS = r"""
(() => {
  if (window.__e2e) return;
  const log = { events: [], patched: false, errors: [] };
  window.__e2e = log;
  const safe = (value) => {
    if (value === undefined || value === null || typeof value !== 'object') {
      return typeof value === 'function' ? '[function]' : value;
    }
    try {
      const text = JSON.stringify(value, (key, v) => {
        if (v instanceof AbortSignal) return '[AbortSignal]';
        if (typeof Node !== 'undefined' && v instanceof Node) return '[Node]';
        if (typeof v === 'function') return '[function]';
        return v;
      });
      return text.length > 50000 ? text.slice(0, 50000) + '…' : JSON.parse(text);
    } catch (err) {
      return String(value);
    }
  };
  const wrap = (proto, method) => {
    const original = proto[method];
    proto[method] = function (name, ...args) {
      const entry = { i: log.events.length, name: String(name), args: args.map(safe), t0: performance.now(), t1: null };
      log.events.push(entry);
      let out;
      try {
        out = original.call(this, name, ...args);
      } catch (err) {
        entry.t1 = performance.now();
        entry.error = String(err);
        throw err;
      }
      Promise.resolve(out).then(
        () => { entry.t1 = performance.now(); },
        (err) => { entry.t1 = performance.now(); entry.error = String(err); },
      );
      return out;
    };
  };
  import('/lib/eventemitter.js').then(({ EventEmitter }) => {
    wrap(EventEmitter.prototype, 'emit');
    if (EventEmitter.prototype.emitAndWait) wrap(EventEmitter.prototype, 'emitAndWait');
    log.patched = true;
  }).catch((err) => log.errors.push('event log: ' + err));
})();
"""

# SillyTavern is idle: no generation (the stop button is hidden and script.js's is_send_press is false) and no
# swipe in progress. `is_send_press` is a live export of /script.js in both versions; 1.19.0 ignores a swipe
# click until its `swipeState` is back to 'none' (after the slide-in animation), 1.12.6 animates with jQuery.
_IDLE_JS = r"""
async () => {
  const stop = document.querySelector('#mes_stop');
  if (stop && getComputedStyle(stop).display !== 'none') return false;
  const script = await import('/script.js');
  if (script.is_send_press) return false;
  if (script.swipeState !== undefined && script.swipeState !== 'none') return false;
  if (window.jQuery && jQuery('#chat .mes').filter(':animated').length > 0) return false;
  return true;
}
"""

# The last message of the chat is in the DOM, with its text rendered when it has any.
_RENDERED_JS = r"""
() => {
  const chat = SillyTavern.getContext().chat;
  const last = chat.length - 1;
  if (last < 0) return true;
  const el = document.querySelector(`#chat .mes[mesid="${last}"]`);
  if (!el) return false;
  if (!String(chat[last].mes ?? '').trim()) return true;
  return (el.querySelector('.mes_text')?.textContent ?? '').trim().length > 0;
}
"""

_READY_JS = r"""
() => {
  const log = window.__e2e;
  if (!log || !log.patched || !log.events.some((e) => e.name === 'app_ready' && e.t1 !== null)) return false;
  const c = window.SillyTavern?.getContext?.();
  if (!c || !c.characters?.length || !c.name1) return false;
  if (c.onlineStatus === 'no_connection' || !c.onlineStatus) return false;
  if (document.querySelector('dialog[open]')) return false;
  return true;
}
"""


class SillyTavernPage:
    """One SillyTavern tab. Build it with :meth:`open`; ``page`` is the Playwright page for anything else.

    ``timeout`` (seconds) bounds each wait of an action. Failures raise :class:`e2e_env.E2EError` with the
    page's recent console errors, the host log tail and a screenshot path.
    """

    def __init__(self, page: Page, host: SillyTavernHost, *, timeout: float = 30.0) -> None:
        self.page = page
        self.host = host
        self.timeout = timeout
        self.console: list[tuple[str, str]] = []
        self._last_chat_created = 0.0
        self._failures = 0
        page.on("console", lambda message: self._on_console(message.type, message.text))
        page.on("pageerror", lambda error: self._on_console("pageerror", str(error)))

    # -- opening ------------------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, context: BrowserContext, host: SillyTavernHost, *, timeout: float = 30.0, wait_ready: bool = True
    ) -> SillyTavernPage:
        """A new tab on ``host``, returned once SillyTavern is ready (see :meth:`wait_ready`); with
        ``wait_ready=False`` as soon as the page has loaded (e.g. to install an extension, which reloads)."""
        st = cls.new(context, host, timeout=timeout)
        st.page.goto(host.url, wait_until="domcontentloaded")
        if wait_ready:
            st.wait_ready()
        return st

    @classmethod
    def new(cls, context: BrowserContext, host: SillyTavernHost, *, timeout: float = 30.0) -> SillyTavernPage:
        """A new, blank tab for ``host`` with the event log installed; ``page.goto(host.url, ...)`` loads it."""
        context.add_init_script(_EVENT_LOG_JS)
        return cls(context.new_page(), host, timeout=timeout)

    def reload(self) -> None:
        """Reload the page (e.g. after installing an extension) and wait until ready again."""
        self.page.reload(wait_until="domcontentloaded")
        self.wait_ready()

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Ready: ``APP_READY`` has been handled, the persona name is set, the character list is loaded, the API
        shows connected (the seeded settings auto-connect to the LLM recorder) and no popup is open."""
        self._wait_js(_READY_JS, timeout=timeout, what="SillyTavern to be ready (app_ready, characters, API)")
        self.wait_idle()

    def close(self) -> None:
        self.page.close()

    # -- reading ------------------------------------------------------------------------------------------------

    def evaluate(self, expression: str, arg: Any = None) -> Any:
        """``page.evaluate`` (a JS function expression, called with ``arg``)."""
        return self.page.evaluate(expression, arg)

    def chat(self) -> list[dict[str, Any]]:
        """A JSON copy of ``getContext().chat`` (index = floor)."""
        return list(self.evaluate("() => JSON.parse(JSON.stringify(SillyTavern.getContext().chat))"))

    def chat_id(self) -> str:
        return str(self.evaluate("() => String(SillyTavern.getContext().getCurrentChatId() ?? '')"))

    def context_value(self, key: str) -> Any:
        """One JSON-safe value of ``getContext()`` (e.g. ``'name1'``, ``'mainApi'``, ``'onlineStatus'``)."""
        return self.evaluate("(k) => JSON.parse(JSON.stringify(SillyTavern.getContext()[k] ?? null))", key)

    def extension_prompts(self) -> dict[str, Any]:
        """``getContext().extensionPrompts``: what extensions currently inject, by key."""
        return dict(self.evaluate("() => JSON.parse(JSON.stringify(SillyTavern.getContext().extensionPrompts))"))

    def mark(self) -> int:
        """Position in the event log to wait or read from (the number of events logged so far)."""
        return int(self.evaluate("() => window.__e2e.events.length"))

    def events(self, since: int = 0, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Logged events from position ``since``, optionally only those named in ``names``."""
        wanted = list(names) if names is not None else None
        return list(self.evaluate(
            "([since, names]) => window.__e2e.events.slice(since)"
            ".filter((e) => !names || names.includes(e.name))",
            [since, wanted],
        ))

    def wait_event(self, name: str, *, since: int, timeout: float | None = None, finished: bool = True,
                   arg0: Any = None, quiet: bool = False) -> dict[str, Any]:
        """The first event ``name`` logged at or after ``since`` (with first argument ``arg0`` when given,
        compared as strings because SillyTavern passes some floors as strings); with ``finished``, only once all
        its listeners have returned. On timeout: :class:`e2e_env.E2EError` with diagnostics; with ``quiet``
        (emission only, listeners not awaited) Playwright's ``TimeoutError``, for a caller that retries."""
        js = r"""
        ([since, name, finished, arg0]) => window.__e2e.events.slice(since).find((e) => e.name === name
            && (!finished || e.t1 !== null) && (arg0 === null || String(e.args[0]) === String(arg0))) ?? null
        """
        if quiet:
            limit = self.timeout if timeout is None else timeout
            handle = self.page.wait_for_function(js, arg=[since, name, False, arg0], timeout=limit * 1000, polling=100)
            return dict(handle.json_value())
        found = self._wait_js(js, [since, name, finished, arg0], timeout=timeout, what=f"event {name}")
        return dict(found)

    def extension_drawer_present(self) -> bool:
        """True when the memory-recall settings drawer is in the Extensions panel."""
        return bool(self.evaluate(
            "([host, drawer]) => [...document.querySelectorAll(host)].some((h) => h.querySelector(drawer))",
            [SEL["extensions_settings"], SEL["extension_drawer"]],
        ))

    def is_idle(self) -> bool:
        return bool(self.evaluate(_IDLE_JS))

    def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no generation runs and no swipe is under way (see ``_IDLE_JS``)."""
        self._wait_js(_IDLE_JS, timeout=timeout, what="SillyTavern to be idle (no generation running)")

    # -- chats --------------------------------------------------------------------------------------------------

    def select_character(self, name: str = "Seraphina") -> str:
        """Open the character ``name`` from the character list (its latest chat, or a new one with its greeting
        on first use); returns the chat id."""
        self.wait_idle()
        if not self.page.locator(SEL["characters_panel"]).is_visible():
            self.page.click(SEL["characters_drawer"])
        card = self.page.locator(SEL["character"]).filter(has_text=name).first
        before = self.chat_id()
        mark = self.mark()
        self._pace_chat_creation()
        card.click()
        self._wait_js(
            "([name, before]) => { const c = SillyTavern.getContext();"
            " return c.name2 === name && String(c.getCurrentChatId() ?? '') !== '' "
            "&& (String(c.getCurrentChatId()) !== before || c.chat.length > 0); }",
            [name, before], what=f"character {name} to open",
        )
        self._after_chat_change(mark)
        self._close_characters_panel()
        return self.chat_id()

    def new_chat(self, character: str = "Seraphina") -> str:
        """Start a new chat with ``character`` (*Start new chat* in the options menu, confirmed), so the test
        begins on the greeting alone; returns the new chat id, which differs from every earlier one."""
        if self.context_value("name2") != character or not self.chat_id():
            opened = self.select_character(character)
            chat = self.chat()
            # A character never chatted with opens on a new chat holding only its greeting: that one will do.
            if opened not in self.host.chats_handed_out and len(chat) == 1 and not chat[0].get("is_user"):
                self.host.chats_handed_out.add(opened)
                return opened
        previous = self.chat_id()
        self.wait_idle()
        self._pace_chat_creation()
        mark = self.mark()
        self._menu(SEL["new_chat"])
        self.page.click(SEL["popup_ok"])
        self._wait_js("(before) => String(SillyTavern.getContext().getCurrentChatId() ?? '') !== before",
                      previous, what="the new chat")
        self._after_chat_change(mark)
        self.host.chats_handed_out.add(self.chat_id())
        return self.chat_id()

    # -- generation actions ---------------------------------------------------------------------------------

    def send(self, text: str, *, stored: str | None = None) -> dict[str, Any]:
        """Type ``text`` into the input, press *Send*, wait for the reply; returns the reply message. ``stored``:
        the text SillyTavern is expected to store for it when that differs (macros such as ``{{char}}``)."""
        self.wait_idle()
        length = len(self.chat())
        self.page.fill(SEL["textarea"], text)
        mark = self.mark()
        self.page.click(SEL["send"])
        self._wait_generation(mark, what=f"the reply to {text!r}")
        chat = self.chat()
        if len(chat) < length + 2 or chat[length].get("mes") != (text if stored is None else stored) \
                or chat[-1].get("is_user"):
            self._fail(f"send({text!r}): expected the user message at floor {length} and a reply after it, "
                       f"chat has {len(chat)} messages")
        return chat[-1]

    def regenerate(self) -> dict[str, Any]:
        """*Regenerate* from the options menu; returns the new last message."""
        return self._generate_from_menu(SEL["regenerate"], "regenerate")

    def continue_(self) -> dict[str, Any]:
        """*Continue* from the options menu (extends the last reply); returns the last message."""
        return self._generate_from_menu(SEL["continue"], "continue")

    def impersonate(self) -> str:
        """*Impersonate* from the options menu; returns what it wrote into the input (it sends nothing)."""
        self._generate_from_menu(SEL["impersonate"], "impersonate")
        return str(self.page.input_value(SEL["textarea"]))

    def swipe_right(self) -> dict[str, Any]:
        """Swipe the last message right: past its last alternative this generates a new one (and waits for it),
        otherwise it shows the next stored one. Returns the last message."""
        generates = bool(self.evaluate(
            "() => { const m = SillyTavern.getContext().chat.at(-1);"
            " return (m.swipe_id ?? 0) >= (m.swipes?.length ?? 1) - 1; }"
        ))
        mark = self._swipe(SEL["swipe_right"])
        if generates:
            self._wait_generation(mark, what="the new swipe")
        else:
            self._settle()
        return self.chat()[-1]

    def swipe_left(self) -> dict[str, Any]:
        """Swipe the last message left (the previous stored alternative; no generation). Returns it."""
        self._swipe(SEL["swipe_left"])
        self._settle()
        return self.chat()[-1]

    def _swipe(self, selector: str) -> int:
        # 1.19.0 ignores a swipe click while isSwipingAllowed() is false (it logs "The swipe has been ignored");
        # that flag also drops for a moment after a swipe seems finished. Wait for it, and click again when a
        # click was ignored, as a user would. Returns the event-log mark taken before the effective click.
        for _attempt in range(3):
            self.wait_idle()
            self._wait_js(
                "async () => { const s = await import('/script.js');"
                " return typeof s.isSwipingAllowed !== 'function' || s.isSwipingAllowed(); }",
                what="swiping to be allowed",
            )
            mark = self.mark()
            self.page.click(selector)
            try:
                self.wait_event("message_swiped", since=mark, timeout=3.0, quiet=True)
            except PlaywrightTimeout:
                continue
            self.wait_event("message_swiped", since=mark)
            return mark
        self._fail(f"three clicks on {selector} swiped nothing")
        raise AssertionError("not reached")

    # -- editing ------------------------------------------------------------------------------------------------

    def edit_message(self, floor: int, text: str) -> None:
        """Edit the message at ``floor`` with the pencil button, replace its text, confirm (✓)."""
        self.wait_idle()
        message = self.page.locator(SEL["message"].format(floor=floor))
        message.locator(SEL["edit"]).click()
        self.page.fill(SEL["edit_textarea"], text)
        mark = self.mark()
        message.locator(SEL["edit_done"]).click()
        self.wait_event("message_edited", since=mark, arg0=floor)
        self._settle()

    def delete_message(self, floor: int) -> None:
        """Delete the one message at ``floor`` from its edit menu (pencil → trash → *Delete Message*; on a last
        message with several swipes this deletes the message, not only the shown swipe)."""
        self.wait_idle()
        message = self.page.locator(SEL["message"].format(floor=floor))
        message.locator(SEL["edit"]).click()
        mark = self.mark()
        message.locator(SEL["edit_delete"]).click()
        self.page.locator(SEL["popup"]).get_by_text("Delete Message", exact=True).click()
        self.wait_event("message_deleted", since=mark)
        self._settle()

    def delete_last(self, count: int) -> None:
        """Delete the last ``count`` messages with *Delete messages* mode (options menu, click the first one
        to delete, *Delete*)."""
        if count <= 0:
            return
        self.wait_idle()
        length = len(self.chat())
        if count > length:
            raise ValueError(f"cannot delete {count} of {length} messages")
        self._menu(SEL["delete_mode"])
        first = self.page.locator(SEL["message"].format(floor=length - count))
        # The click selects only once the mode shows its checkboxes.
        first.locator(SEL["delete_checkbox"]).wait_for(state="visible", timeout=self.timeout * 1000)
        first.click()
        self._wait_js("(sel) => document.querySelector(sel)?.classList.contains('selected')",
                      SEL["message"].format(floor=length - count), what="the messages to be selected")
        mark = self.mark()
        self.page.click(SEL["delete_mode_ok"])
        self.wait_event("message_deleted", since=mark)
        self._settle()

    def hide(self, start: int, end: int | None = None) -> None:
        """``/hide start[-end]``: hide those messages from the prompt (they stay in the chat, ``is_system``)."""
        end = start if end is None else end
        self.slash(f"/hide {start}" if end == start else f"/hide {start}-{end}")
        self._wait_js(
            "([a, b]) => SillyTavern.getContext().chat.slice(a, b + 1).every((m) => m.is_system === true)",
            [start, end], what=f"messages {start}-{end} to be hidden",
        )

    def slash(self, command: str) -> None:
        """Run a slash command from the input (typed and sent like a message) and wait until it is done."""
        self.wait_idle()
        self.page.fill(SEL["textarea"], command)
        self.page.click(SEL["send"])
        self._wait_js("(sel) => document.querySelector(sel).value === ''", SEL["textarea"],
                      what=f"{command!r} to be taken from the input")
        self._settle()

    # -- connection settings --------------------------------------------------------------------------------

    def use_chat_completion(self) -> None:
        """Switch the API to Chat Completion (the seeded *Custom* source) and connect."""
        self._switch_api("openai", SEL["connect_openai"])

    def use_text_completion(self) -> None:
        """Switch the API to Text Completion (the seeded OpenAI-compatible type on the recorder) and connect."""
        self._switch_api("textgenerationwebui", SEL["connect_textgen"])

    def set_streaming(self, on: bool) -> None:
        """Turn streaming on or off for the API in use (the *Streaming* checkbox of its settings)."""
        api = self.context_value("mainApi")
        selector = SEL["stream_chat"] if api == "openai" else SEL["stream_text"]
        self.evaluate("([sel, on]) => $(sel).prop('checked', on).trigger('input').trigger('change')",
                      [selector, on])
        key = "stream_openai" if api == "openai" else "streaming"
        module = "/scripts/openai.js" if api == "openai" else "/scripts/textgen-settings.js"
        setting = "oai_settings" if api == "openai" else "textgenerationwebui_settings"
        self._wait_js(
            "async ([module, setting, key, on]) => { const m = await import(module);"
            " return Boolean(m[setting]?.[key]) === on; }",
            [module, setting, key, on], what=f"streaming {'on' if on else 'off'}",
        )

    # -- extensions -------------------------------------------------------------------------------------------

    def install_extension(self, url: str) -> dict[str, Any]:
        """Install a third-party extension from a git URL through SillyTavern's own route (what *Install
        extension* calls, with the page's CSRF headers), then reload. Works on a page still starting up (it
        needs only the CSRF token, fetched first thing). Returns the route's JSON answer."""
        self._wait_js(
            "() => { try { return Boolean(SillyTavern.getContext().getRequestHeaders()['X-CSRF-Token']); }"
            " catch (err) { return false; } }",
            what="the page's CSRF token",
        )
        result = self.evaluate(
            r"""async (url) => {
                const r = await fetch('/api/extensions/install', { method: 'POST',
                    headers: SillyTavern.getContext().getRequestHeaders(), body: JSON.stringify({ url }) });
                return { status: r.status, text: await r.text() };
            }""",
            url,
        )
        if result["status"] != 200:
            self._fail(f"installing {url} answered {result['status']}: {result['text'][:500]}")
        self.reload()
        return dict(json.loads(result["text"]))

    # -- diagnostics ------------------------------------------------------------------------------------------

    def screenshot(self, path: Path) -> Path:
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def diagnostics(self) -> str:
        """Recent console errors and warnings plus the host's log tail (for failure messages)."""
        recent = [f"  [{kind}] {text[:300]}" for kind, text in self.console[-20:] if kind != "debug"]
        return "--- page console (last errors/warnings):\n" + "\n".join(recent) + "\n" + self.host.log_tail(30)

    # -- internals ----------------------------------------------------------------------------------------------

    def _on_console(self, kind: str, text: str) -> None:
        if kind in ("error", "warning", "pageerror"):
            self.console.append((kind, text))

    def _fail(self, message: str) -> None:
        self._failures += 1
        shot = self.host.workdir / f"failure-{self._failures}.png"
        try:
            self.screenshot(shot)
            where = f"\nscreenshot: {shot}"
        except PlaywrightError:
            where = ""
        raise E2EError(f"{message}{where}\n{self.diagnostics()}")

    def _wait_js(self, expression: str, arg: Any = None, *, timeout: float | None = None, what: str) -> Any:
        limit = self.timeout if timeout is None else timeout
        try:
            handle = self.page.wait_for_function(expression, arg=arg, timeout=limit * 1000, polling=100)
        except PlaywrightTimeout:
            self._fail(f"timed out after {limit:.0f}s waiting for {what}")
            raise  # not reached: _fail raises
        return handle.json_value()

    def _wait_generation(self, since: int, *, what: str) -> None:
        # GENERATION_ENDED is emitted when the stop button is hidden, which happens only after a real (not dry-run)
        # generation showed it; a stopped generation logs GENERATION_STOPPED first.
        self._wait_js(
            "(since) => window.__e2e.events.slice(since).some((e) => "
            "(e.name === 'generation_ended' || e.name === 'generation_stopped') && e.t1 !== null)",
            since, what=f"{what} (generation to end)",
        )
        self._settle()

    def _settle(self) -> None:
        self.wait_idle()
        self._wait_js(_RENDERED_JS, what="the last message to be rendered")

    def _generate_from_menu(self, selector: str, what: str) -> dict[str, Any]:
        self.wait_idle()
        mark = self.mark()
        self._menu(selector)
        self._wait_generation(mark, what=what)
        return self.chat()[-1]

    def _menu(self, selector: str) -> None:
        self.page.click(SEL["options"])
        self.page.click(selector)

    def _switch_api(self, api: str, connect: str) -> None:
        self.wait_idle()
        self.evaluate("([sel, api]) => $(sel).val(api).trigger('change')", [SEL["main_api"], api])
        self.evaluate("(sel) => $(sel).trigger('click')", connect)
        self._wait_js(
            "(api) => { const c = SillyTavern.getContext(); return c.mainApi === api"
            " && c.onlineStatus && c.onlineStatus !== 'no_connection'; }",
            api, what=f"the {api} API to connect",
        )

    def _after_chat_change(self, mark: int) -> None:
        self.wait_event("chat_id_changed", since=mark)
        self._last_chat_created = time.time()
        self._settle()

    def _pace_chat_creation(self) -> None:
        # SillyTavern 1.12.6 names a new chat after the current second: two chats started within one second
        # would share a name (and a file). Start each in a second of its own.
        if self.host.spec.chat_names_per_second:
            wait = math.floor(self._last_chat_created) + 1 - time.time()
            if wait > 0:
                time.sleep(wait)

    def _close_characters_panel(self) -> None:
        if self.page.locator(SEL["characters_panel"]).is_visible():
            self.page.click(SEL["characters_drawer"])
            self.page.locator(SEL["characters_panel"]).wait_for(state="hidden", timeout=self.timeout * 1000)
