"""Fixtures of the end-to-end tests: a real SillyTavern (each supported version) with the memory-recall extension,
a real ``memory-recall serve``, an LLM recorder and headless Chromium.

Session scope: ``browser`` (one Chromium), ``st_version`` (parametrised over :data:`e2e_stack.HOST_VERSIONS`,
so every test taking a fixture below runs once per version; pytest groups the tests by version) and
``e2e_stack`` (one :class:`e2e_stack.E2EStack` per version, up from its first test to the end of the session).

Function scope, what tests take:

* ``st_page`` -- the session's tab (:class:`e2e_page.SillyTavernPage`) on a new chat with Seraphina, greeting
  only, the recorder cleared;
* ``llm`` -- the :class:`e2e_llm.LLMRecorder` SillyTavern is connected to, cleared;
* ``recall_service`` -- the :class:`e2e_service.RecallService` the extension calls, running (restarted when an
  earlier test stopped it);
* ``st_host`` -- the :class:`e2e_host.SillyTavernHost`, running.

Prerequisites (Chromium, node/npm/git, the 1.12.6 tarball, Playwright) missing: skip, or fail under
``MEMORY_RECALL_E2E=require`` (see :mod:`e2e_env`). A failed test's report gets a screenshot path, the page
console and the host and service log tails.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_env import find_chromium, missing
from e2e_figures import summary_lines
from e2e_host import SillyTavernHost
from e2e_llm import LLMRecorder
from e2e_service import RecallService
from e2e_stack import HOST_VERSIONS, VIEWPORT, E2EStack


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    path = find_chromium()
    if path is None:
        missing("Chromium not found (install Debian's `chromium` or set MEMORY_RECALL_E2E_CHROMIUM)")
    return path


@pytest.fixture(scope="session")
def browser(chromium_executable: str) -> Iterator[Any]:
    """One headless Chromium for the session (the system binary: Playwright's own builds are not used)."""
    try:
        from e2e_page import CHROMIUM_ARGS
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        missing(f"the Python package playwright is not installed ({exc}); pip install '.[dev]'")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_executable, args=list(CHROMIUM_ARGS))
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="session", params=HOST_VERSIONS, ids=[f"st{v}" for v in HOST_VERSIONS])
def st_version(request: pytest.FixtureRequest) -> str:
    """The SillyTavern version of the current test (the tests run once per supported version)."""
    return str(request.param)


@pytest.fixture(scope="session")
def e2e_stack(
    request: pytest.FixtureRequest, st_version: str, browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2EStack]:
    """The whole stack of ``st_version``, up from its first test to the end of the session (:class:`E2EStack`).

    The first call launches the browser-free part of every version the session's tests need, in background
    threads, so the next version's install and server start overlap with this version's tests."""
    launches = _launch_all(request.session, tmp_path_factory)
    stack = launches[st_version].result() if st_version in launches else _launch(st_version, tmp_path_factory)
    try:
        stack.attach(browser)
        _preload(browser)
        yield stack
    finally:
        stack.close()


_LAUNCHES: dict[str, concurrent.futures.Future[E2EStack]] = {}
_EXECUTOR: list[concurrent.futures.ThreadPoolExecutor] = []
_STACKS: list[E2EStack] = []


def _wanted_versions(session: pytest.Session) -> list[str]:
    """SillyTavern versions of the session's tests, in run order (``session.items`` is final by now:
    deselected tests are gone)."""
    wanted: list[str] = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        version = callspec.params.get("st_version") if callspec is not None else None
        if version is not None and version not in wanted:
            wanted.append(str(version))
    return wanted


def _launch(version: str, tmp_path_factory: pytest.TempPathFactory) -> E2EStack:
    stack = E2EStack.launch(version, tmp_path_factory.mktemp(f"e2e-{version}"))
    _STACKS.append(stack)
    return stack


def _launch_all(
    session: pytest.Session, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, concurrent.futures.Future[E2EStack]]:
    wanted = _wanted_versions(session)
    if not _EXECUTOR and wanted:
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="e2e-launch")
        _EXECUTOR.append(executor)
        for version in wanted:
            _LAUNCHES[version] = executor.submit(_launch, version, tmp_path_factory)
    return _LAUNCHES


def _preload(browser: Any) -> None:
    """Start loading the tab of every stack whose launch has finished and whose tests have not begun: its page
    load then overlaps with the tests running now."""
    for future in _LAUNCHES.values():
        if future.done() and future.exception() is None:
            future.result().begin_attach(browser)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop stacks launched ahead for tests that never ran (an interrupted or ``-x`` session)."""
    for future in _LAUNCHES.values():
        with contextlib.suppress(BaseException):
            future.result().close()  # a no-op for a stack its fixture already closed
    for executor in _EXECUTOR:
        executor.shutdown(wait=True)


@pytest.fixture
def st_host(e2e_stack: E2EStack) -> SillyTavernHost:
    """The running SillyTavern of this test's version."""
    if not e2e_stack.host.running:
        e2e_stack.host.start()
    return e2e_stack.host


@pytest.fixture
def recall_service(e2e_stack: E2EStack) -> RecallService:
    """The memory-recall service of this test's version, running (restarted if an earlier test stopped it)."""
    if not e2e_stack.service.running:
        e2e_stack.service.start()
    return e2e_stack.service


@pytest.fixture
def llm(e2e_stack: E2EStack) -> LLMRecorder:
    """The LLM recorder, cleared (no recorded requests, no scripted answers, no delays)."""
    recorder = e2e_stack.llm
    recorder.clear()
    recorder.respond_with(None)
    recorder.delay_s = recorder.chunk_delay_s = 0.0
    return recorder


@pytest.fixture
def st_page(
    e2e_stack: E2EStack, browser: Any, st_host: SillyTavernHost, recall_service: RecallService, llm: LLMRecorder
) -> Any:
    """The session's SillyTavern tab on a new chat with Seraphina (greeting only), the recorder cleared.

    A tab an earlier test left broken (closed, or not answering) is replaced by a new one. The API, streaming
    and extension settings are whatever the previous test left: tests that change them restore them.
    """
    from e2e_page import SillyTavernPage

    page = e2e_stack.page
    if page is None or page.page.is_closed() or not _healthy(page):
        if e2e_stack.context is not None:
            with contextlib.suppress(Exception):
                e2e_stack.context.close()
        e2e_stack.context = browser.new_context(viewport=VIEWPORT)
        page = e2e_stack.page = SillyTavernPage.open(e2e_stack.context, st_host)
    page.new_chat()
    llm.clear()
    _preload(browser)
    return page


def _healthy(page: Any) -> bool:
    try:
        return bool(page.is_idle())
    except Exception:  # noqa: BLE001 - any failure to talk to the page means: reopen it
        return False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, Any]:
    """On a failed e2e test, attach a screenshot path and the page console / host log tails to the report."""
    report = yield
    if report.when != "call" or not report.failed:
        return report
    stack = getattr(item, "funcargs", {}).get("e2e_stack")
    if not isinstance(stack, E2EStack) or stack.page is None:
        return report
    with contextlib.suppress(Exception):
        shot = stack.page.screenshot(stack.workdir / f"{item.name}.png".replace("/", "_"))
        report.sections.append(("e2e page", f"screenshot: {shot}\n{stack.page.diagnostics()}"))
    with contextlib.suppress(Exception):
        report.sections.append(("e2e memory-recall service", stack.service.log_tail(30)))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per SillyTavern stack brought up: where its time went (seconds)."""
    for stack in _STACKS:
        steps = ", ".join(f"{name} {seconds:.1f}" for name, seconds in stack.timings.items())
        terminalreporter.write_line(f"e2e SillyTavern {stack.version} ({stack.install_method}): {steps}")
    for line in summary_lines():
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the end-to-end tests last. Playwright's sync API keeps an event loop running in the main thread while
    the session's browser is open, and ``asyncio.run`` (which other tests call) refuses to start inside one."""
    here = Path(__file__).resolve().parent
    items.sort(key=lambda item: Path(str(item.path)).resolve().is_relative_to(here))
