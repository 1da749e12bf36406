"""One SillyTavern version with everything it runs with in the end-to-end tests. Not a test module
(``e2e_stack``); ``conftest.py`` builds one per version and session.

:meth:`E2EStack.start` brings up, in order: the LLM recorder; ``memory-recall serve`` (CORS origins: the
SillyTavern page's); SillyTavern on a fresh data root whose settings connect to the recorder and point the
extension at the service; the extension, installed by ``install_method`` (``"copy"``: its folder copied into
the user's extensions before start; ``"git"``: SillyTavern's *Install extension* route cloning a snapshot of
this work tree from a local git server); a browser tab, ready. :meth:`E2EStack.close` undoes all of it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e_env import REPO_ROOT
from e2e_git import GitHttpServer, extension_manifest, snapshot_repo
from e2e_host import (
    EXTENSION_NAME,
    EXTENSION_SOURCE,
    SILLYTAVERN_CURRENT,
    SILLYTAVERN_LEGACY,
    VERSIONS,
    SillyTavernHost,
    ensure_installed,
)
from e2e_llm import LLMRecorder
from e2e_service import RecallService

HOST_VERSIONS = (SILLYTAVERN_LEGACY, SILLYTAVERN_CURRENT)
#: How the extension gets into each host: both ways are covered, one per version (1.19.0 takes http(s) only).
INSTALL_METHOD = {SILLYTAVERN_LEGACY: "copy", SILLYTAVERN_CURRENT: "git"}
#: The extension's key in SillyTavern's extension settings (where its service URL is stored).
EXTENSION_SETTINGS_KEY = "memory_recall"
#: The repository-root manifest's ``js`` for an install from git (the extension lives in a subfolder).
REPO_EXTENSION_JS = EXTENSION_SOURCE.relative_to(REPO_ROOT).as_posix() + "/index.js"
VIEWPORT = {"width": 1280, "height": 900}


@dataclass
class E2EStack:
    """The running stack of one SillyTavern version. ``page`` is the session's tab (an
    :class:`e2e_page.SillyTavernPage`), ``context`` its Playwright browser context; ``timings`` holds seconds per
    start-up step (``install``, ``service_start`` and ``host_start`` from the parallel start, ``launch`` in all,
    then ``page_ready`` from the tab's opening, the install from git included)."""

    version: str
    workdir: Path
    llm: LLMRecorder
    service: RecallService
    host: SillyTavernHost
    install_method: str
    page: Any = None
    context: Any = None
    git: GitHttpServer | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _attach_started: float = 0.0
    _cleanup: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @classmethod
    def start(cls, version: str, workdir: Path, browser: Any, *, install_method: str | None = None) -> E2EStack:
        """:meth:`launch` then :meth:`attach`: the whole stack, a ready tab included."""
        stack = cls.launch(version, workdir, install_method=install_method)
        try:
            stack.attach(browser)
        except BaseException:
            stack.close()
            raise
        return stack

    @classmethod
    def launch(cls, version: str, workdir: Path, *, install_method: str | None = None) -> E2EStack:
        """The browser-free part: install SillyTavern (cached), start the recorder, the service and SillyTavern
        (the extension copied in for ``"copy"``; for ``"git"`` the git server with the snapshot), wait until
        both answer. Uses no Playwright object, so it may run
        in a background thread while another version's tests drive the browser. On failure, what was started is
        stopped again."""
        spec = VERSIONS[version]
        method = install_method or INSTALL_METHOD[version]
        if method not in ("copy", "git"):
            raise ValueError(f"unknown install method {method!r}")
        timings: dict[str, float] = {}
        started = time.monotonic()
        tree = ensure_installed(spec, log_path=workdir / "install.log")
        timings["install"] = time.monotonic() - started
        with contextlib.ExitStack() as cleanup:
            llm = LLMRecorder().start()
            cleanup.callback(llm.close)
            host = SillyTavernHost(spec, tree, workdir / "sillytavern")
            cleanup.callback(host.close)
            service = RecallService(workdir / "memory-recall", cors_origins=host.origins,
                                    log_path=workdir / "memory-recall.log")
            cleanup.callback(service.stop)
            stack = cls(version, workdir, llm, service, host, method, timings=timings)

            mark = time.monotonic()
            host.prepare(llm.base_url, extension_settings={EXTENSION_SETTINGS_KEY: {"url": service.url}})
            if method == "copy":
                host.install_extension_copy()
            # Both start in parallel; each wait raises with its own log tail.
            service.start(wait=False)
            host.start(wait=False)
            if method == "git":
                served = workdir / "git"
                manifest = extension_manifest(REPO_EXTENSION_JS, source_manifest=EXTENSION_SOURCE / "manifest.json")
                snapshot_repo(REPO_ROOT, served / f"{EXTENSION_NAME}.git", extra_files={"manifest.json": manifest})
                stack.git = GitHttpServer(served).start()
                cleanup.callback(stack.git.close)
            service.wait_ready()
            timings["service_start"] = time.monotonic() - mark
            host.wait_ready()
            timings["host_start"] = time.monotonic() - mark
            timings["launch"] = time.monotonic() - started
            stack._cleanup = cleanup.pop_all()
        return stack

    def begin_attach(self, browser: Any) -> None:
        """Open the session's tab and start loading SillyTavern in it without waiting (the browser loads it
        while the caller goes on, e.g. with another version's tests); :meth:`attach` finishes. A no-op once
        begun."""
        from e2e_page import SillyTavernPage

        if self.page is not None:
            return
        self._attach_started = time.monotonic()
        self.context = browser.new_context(viewport=VIEWPORT)
        self._cleanup.callback(self.context.close)
        self.page = SillyTavernPage.new(self.context, self.host)
        self.page.page.goto(self.host.url, wait_until="commit")

    def attach(self, browser: Any) -> None:
        """Make the session's tab (``page``, ``context``) ready; for ``"git"``, first install the extension
        through *Install extension* from the git server (the page needs only its CSRF token for that) and
        reload."""
        self.begin_attach(browser)
        if self.git is not None:
            self.page.install_extension(self.git.url_for(f"{EXTENSION_NAME}.git"))
        else:
            self.page.wait_ready()
        self.timings["page_ready"] = time.monotonic() - self._attach_started

    def new_tab(self, browser: Any) -> Any:
        """Another ready tab on this host, in a browser context of its own (closed with the stack)."""
        from e2e_page import SillyTavernPage

        context = browser.new_context(viewport=VIEWPORT)
        self._cleanup.callback(context.close)
        return SillyTavernPage.open(context, self.host)

    def close(self) -> None:
        """Stop everything :meth:`start` started, in reverse order."""
        self._cleanup.close()
