"""A real SillyTavern server for the end-to-end tests. Not a test module (imported as ``e2e_host``).

Two hosts are supported (:data:`VERSIONS`): :data:`SILLYTAVERN_LEGACY` from the vendored tarball and
:data:`SILLYTAVERN_CURRENT` from the npm registry. :func:`ensure_installed` unpacks and installs a version
once into the cache (``<cache>/sillytavern-<version>``, see :func:`e2e_env.cache_dir`); later runs reuse it.

:class:`SillyTavernHost` runs one instance from the installed tree with a user data root of its own, created
empty for every instance (SillyTavern copies its default content into it at start) plus a pre-seeded
``settings.json``: no first-run welcome popup, persona ``User``, the Chat Completion API *Custom
(OpenAI-compatible)* pointed at the LLM recorder (streaming off) and auto-connect on, the way a user leaves
them after a first session. The Text Completion settings point at the same recorder, for a switch at run time.

The extension's service URL is seeded the same way (``prepare(extension_settings=...)``); installing the extension
is :meth:`SillyTavernHost.install_extension_copy` (before start) or :meth:`e2e_page.SillyTavernPage.install_extension`
(SillyTavern's own route, from a git URL).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from e2e_env import (
    ENV_TARBALL,
    REPO_ROOT,
    E2EError,
    ManagedProcess,
    cache_dir,
    free_port,
    missing,
    run,
    tail,
    wait_http,
)
from e2e_llm import MODEL_ID

SILLYTAVERN_LEGACY = "1.12.6"
SILLYTAVERN_CURRENT = "1.19.0"  # the pinned npm release; bump here only
USER_HANDLE = "default-user"  # the single user of a SillyTavern without accounts
USER_NAME = "User"
EXTENSION_NAME = "memory-recall"  # folder name under the user's extensions (what both install methods produce)
EXTENSION_SOURCE = REPO_ROOT / "clients" / "sillytavern"

_INSTALLED_MARKER = ".e2e-installed.json"
# SillyTavern reads config.yaml with its own `yaml` package: editing through it keeps comments and key order.
_WRITE_CONFIG_JS = r"""
const fs = require('fs');
const yaml = require('yaml');
const doc = yaml.parseDocument(fs.readFileSync('default/config.yaml', 'utf8'));
for (const [key, value] of Object.entries(JSON.parse(process.argv[1]))) doc.setIn(key.split('.'), value);
fs.writeFileSync('config.yaml', doc.toString());
"""


@dataclass(frozen=True)
class HostVersion:
    """How to obtain, install and configure one SillyTavern version.

    ``config``: ``config.yaml`` keys (dotted paths) set on top of ``default/config.yaml`` besides the port and
    data root. ``textgen_type`` / ``textgen_model_key``: the Text Completion API type that speaks plain OpenAI
    ``/v1/completions`` in this version and the settings key of its model name. ``webpack``: the server compiles
    frontend libraries at start (cached in ``dist/_webpack`` of the tree, warm after the first start).
    ``chat_names_per_second``: a new chat is named after the current second (two in one second collide).
    """

    version: str
    source: str  # "tarball" (the vendored file) or "npm" (npm pack sillytavern@<version>)
    top_dir: str  # the archive's top directory
    install: tuple[str, ...]
    config: Mapping[str, Any]
    textgen_type: str
    textgen_model_key: str
    webpack: bool = False
    chat_names_per_second: bool = False
    install_timeout: float = 600.0
    #: Oldest Node.js major version the release runs on (its package.json ``engines.node``).
    node_major: int = 18


_COMMON_CONFIG: dict[str, Any] = {
    "listen": False,
    "whitelistMode": True,  # loopback only, as a local user runs it
    "skipContentCheck": False,  # the fresh data root needs the default content (Seraphina) copied in
    "enableDownloadableTokenizers": False,  # no network: a tokenizer download would fail and log errors
    "enableUserAccounts": False,
}

VERSIONS: dict[str, HostVersion] = {
    SILLYTAVERN_LEGACY: HostVersion(
        version=SILLYTAVERN_LEGACY,
        source="tarball",
        top_dir="SillyTavern",
        install=("npm", "ci", "--no-audit", "--no-fund", "--omit=dev"),
        config={**_COMMON_CONFIG, "autorun": False, "enableExtensionsAutoUpdate": False,
                "extras.disableAutoDownload": True},
        # 1.12.6 has no generic OpenAI-compatible type; vLLM's is plain /v1/models + /v1/completions.
        textgen_type="vllm",
        textgen_model_key="vllm_model",
        chat_names_per_second=True,
    ),
    SILLYTAVERN_CURRENT: HostVersion(
        version=SILLYTAVERN_CURRENT,
        source="npm",
        top_dir="package",
        node_major=20,
        install=("npm", "install", "--no-audit", "--no-fund", "--omit=dev"),
        config={**_COMMON_CONFIG, "browserLaunch.enabled": False, "extensions.autoUpdate": False,
                "extensions.models.autoDownload": False, "whitelistDockerHosts": False},
        textgen_type="generic",
        textgen_model_key="generic_model",
        webpack=True,
    ),
}


def tarball_path() -> Path:
    """The vendored 1.12.6 tarball: ``$MEMORY_RECALL_E2E_SILLYTAVERN_TARBALL``, else beside the repository in
    ``shared/vendor/`` (CI clones the repository next to ``shared/``)."""
    raw = os.environ.get(ENV_TARBALL, "").strip()
    if raw:
        return Path(raw).expanduser()
    return REPO_ROOT.parent / "shared" / "vendor" / f"sillytavern-{SILLYTAVERN_LEGACY}.tar.gz"


def node_major_version() -> int | None:
    """The major version of the ``node`` on PATH (``v20.11.1`` → 20); ``None`` when it gives none."""
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    head = out.removeprefix("v").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def check_prerequisites(spec: HostVersion) -> None:
    """Skip (or fail under ``require``) when this version cannot be installed or run here."""
    for tool in ("node", "npm", "git"):
        if shutil.which(tool) is None:
            missing(f"`{tool}` is not on PATH (SillyTavern {spec.version} needs it)")
    major = node_major_version()
    if major is None or major < spec.node_major:
        missing(f"SillyTavern {spec.version} needs Node.js >= {spec.node_major}; `node --version` gives "
                f"{'no version' if major is None else major}")
    if spec.source == "tarball" and not tarball_path().is_file():
        missing(f"SillyTavern {spec.version} tarball not found at {tarball_path()} (set {ENV_TARBALL})")


@contextlib.contextmanager
def _locked(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``; yields False (lock not taken) when busy and not ``blocking``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle: TextIO = path.open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        handle.close()  # closing releases the lock


def _unpack(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tar.extractall(dest)  # noqa: S202 - a trusted, vendored archive


def ensure_installed(spec: HostVersion, *, log_path: Path) -> Path:
    """The installed tree of ``spec`` in the cache, unpacked and ``npm``-installed on first use.

    Concurrent sessions wait on a lock instead of installing twice. An interrupted install leaves no marker and
    is redone from scratch. Install output goes to ``log_path``.
    """
    check_prerequisites(spec)
    root = cache_dir()
    tree = root / f"sillytavern-{spec.version}"
    with _locked(root / f"sillytavern-{spec.version}.install.lock"):
        if (tree / _INSTALLED_MARKER).is_file():
            return tree
        staging = root / f"sillytavern-{spec.version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(tree, ignore_errors=True)
        staging.mkdir(parents=True)
        started = time.monotonic()
        if spec.source == "tarball":
            archive = tarball_path()
        else:
            run(["npm", "pack", f"sillytavern@{spec.version}", "--pack-destination", str(staging)],
                cwd=staging, log_path=log_path, timeout=300)
            archive = staging / f"sillytavern-{spec.version}.tgz"
        _unpack(archive, staging)
        unpacked = staging / spec.top_dir
        if not (unpacked / "server.js").is_file():
            raise E2EError(f"{archive} has no {spec.top_dir}/server.js")
        run(list(spec.install), cwd=unpacked, log_path=log_path, timeout=spec.install_timeout)
        marker = {"version": spec.version, "source": spec.source, "install": list(spec.install),
                  "seconds": round(time.monotonic() - started, 1)}
        (unpacked / _INSTALLED_MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        unpacked.rename(tree)
        shutil.rmtree(staging, ignore_errors=True)
        return tree


def seeded_settings(defaults: dict[str, Any], spec: HostVersion, llm_base_url: str) -> dict[str, Any]:
    """``settings.json`` of a user who finished the welcome dialog as ``User`` and chose Chat Completion,
    source *Custom (OpenAI-compatible)* at ``<llm_base_url>/v1`` with model :data:`MODEL_ID`, streaming off,
    and auto-connect; Text Completion is set up (type ``spec.textgen_type``) against the same server."""
    settings = json.loads(json.dumps(defaults))  # deep copy
    settings["firstRun"] = False
    settings["username"] = USER_NAME
    settings["main_api"] = "openai"
    power = settings.setdefault("power_user", {})
    power["auto_connect"] = True
    oai = settings.setdefault("oai_settings", {})
    oai.update({
        "chat_completion_source": "custom",
        "custom_url": f"{llm_base_url}/v1",
        "custom_model": MODEL_ID,
        "stream_openai": False,
    })
    textgen = settings.setdefault("textgenerationwebui_settings", {})
    textgen["type"] = spec.textgen_type
    textgen.setdefault("server_urls", {})[spec.textgen_type] = llm_base_url
    textgen[spec.textgen_model_key] = MODEL_ID
    textgen["streaming"] = False
    return settings


@dataclass
class SillyTavernHost:
    """One SillyTavern server of version ``spec`` on ``127.0.0.1:<port>``, data under ``workdir``.

    Life cycle: ``prepare(llm_base_url)`` (fresh data root and settings), optional
    ``install_extension_copy()``, ``start()``, ..., ``stop()``. ``start()`` after ``stop()`` restarts on the
    same port and data. The server runs from the cached tree itself, so its webpack cache stays warm; a second
    session using the same tree at the same time gets a private copy of the tree instead (slower first start).
    """

    spec: HostVersion
    tree: Path
    workdir: Path
    port: int = field(default_factory=free_port)
    #: Chat ids :meth:`e2e_page.SillyTavernPage.new_chat` handed out (by any tab): never handed out twice.
    chats_handed_out: set[str] = field(default_factory=set)
    _process: ManagedProcess | None = None
    _run_tree: Path | None = None
    _run_lock: contextlib.ExitStack | None = None

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def origins(self) -> list[str]:
        """The page origins a browser may use for this server (for a CORS allow-list)."""
        return [f"http://127.0.0.1:{self.port}", f"http://localhost:{self.port}"]

    @property
    def data_root(self) -> Path:
        return self.workdir / "data"

    @property
    def user_dir(self) -> Path:
        return self.data_root / USER_HANDLE

    @property
    def extensions_dir(self) -> Path:
        """Third-party extensions of the user (what *Install extension* writes to)."""
        return self.user_dir / "extensions"

    @property
    def log_path(self) -> Path:
        return self.workdir / "sillytavern.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    def log_tail(self, lines: int = 60) -> str:
        return f"--- last lines of {self.log_path}:\n{tail(self.log_path, lines)}"

    # -- set-up -------------------------------------------------------------------------------------------------

    def prepare(self, llm_base_url: str, *, extension_settings: Mapping[str, Any] | None = None) -> SillyTavernHost:
        """Create an empty data root with the seeded ``settings.json`` (see :func:`seeded_settings`);
        ``extension_settings`` (extension key → settings) are stored as the user would have saved them."""
        if self.data_root.exists():
            shutil.rmtree(self.data_root)
        self.user_dir.mkdir(parents=True)
        defaults = json.loads((self.tree / "default" / "content" / "settings.json").read_text(encoding="utf-8"))
        # SillyTavern 1.12.6 renders thumbnails of all 23 default backgrounds before it listens (8 s) unless the
        # thumbnail cache has a file; with one it makes each thumbnail when first asked for, as later starts do.
        thumbnails = self.user_dir / "thumbnails" / "bg"
        thumbnails.mkdir(parents=True)
        (thumbnails / ".e2e-thumbnails-on-demand").write_text("", encoding="utf-8")
        settings = seeded_settings(defaults, self.spec, llm_base_url)
        for key, value in (extension_settings or {}).items():
            settings.setdefault("extension_settings", {})[key] = json.loads(json.dumps(value))
        (self.user_dir / "settings.json").write_text(json.dumps(settings, indent=4), encoding="utf-8")
        return self

    def install_extension_copy(self, source: Path = EXTENSION_SOURCE, name: str = EXTENSION_NAME) -> Path:
        """Install an extension the manual way: copy its folder into the user's extensions (before ``start()``,
        or reload the page after). Returns the installed folder."""
        dest = self.extensions_dir / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".git", "node_modules", "__pycache__"))
        return dest

    def settings(self) -> dict[str, Any]:
        """The user's ``settings.json`` as saved by SillyTavern right now."""
        return dict(json.loads((self.user_dir / "settings.json").read_text(encoding="utf-8")))

    # -- running ------------------------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0, *, wait: bool = True) -> SillyTavernHost:
        """Write ``config.yaml`` and run ``node server.js``; with ``wait``, return once it answers HTTP (else call
        :meth:`wait_ready`). A no-op while it runs."""
        if self.running:
            return self
        if not self.user_dir.is_dir():
            raise E2EError("prepare() the host before start()")
        run_tree = self._acquire_tree()
        overrides = {**self.spec.config, "port": self.port, "dataRoot": str(self.data_root)}
        run(["node", "-e", _WRITE_CONFIG_JS, json.dumps(overrides)], cwd=run_tree, log_path=self.log_path,
            timeout=60)
        if self.spec.webpack:
            # Outside Docker the webpack cache lives in <dataRoot>/_webpack: point it at the tree's, which Docker
            # uses directly, so a fresh data root still starts with a warm cache.
            shared = run_tree / "dist" / "_webpack"
            shared.mkdir(parents=True, exist_ok=True)
            link = self.data_root / "_webpack"
            if not link.exists():
                link.symlink_to(shared, target_is_directory=True)
        # SillyTavern asks git for its own revision (shown, and part of the webpack cache key): keep git from
        # finding a repository above the tree (the cache may sit inside this repository's work tree).
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": os.pathsep.join([str(run_tree.parent), str(self.workdir)])}
        self._process = ManagedProcess(["node", "server.js"], cwd=run_tree, log_path=self.log_path, env=env,
                                       name=f"SillyTavern {self.version}").start()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Wait until the server answers HTTP (it listens only after its start-up work); on failure it is stopped
        and the error carries the log tail."""
        if self._process is None:
            raise E2EError(f"SillyTavern {self.version} is not started")
        try:
            wait_http(f"{self.url}/", timeout=timeout, process=self._process, what=f"SillyTavern {self.version}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def close(self) -> None:
        """Stop the server and release the tree (a private copy is deleted)."""
        self.stop()
        if self._run_lock is not None:
            self._run_lock.close()
            self._run_lock = None
        if self._run_tree is not None and self._run_tree != self.tree:
            shutil.rmtree(self._run_tree, ignore_errors=True)
        self._run_tree = None

    def _acquire_tree(self) -> Path:
        if self._run_tree is not None:
            return self._run_tree
        stack = contextlib.ExitStack()
        # config.yaml sits in the tree (1.12.6 reads it from the server directory only): one user at a time.
        if stack.enter_context(_locked(self.tree.with_name(self.tree.name + ".run.lock"), blocking=False)):
            self._run_lock, self._run_tree = stack, self.tree
            return self.tree
        stack.close()
        private = self.workdir / "tree"
        shutil.copytree(self.tree, private, symlinks=True, ignore=_top_level({"node_modules"}))
        (private / "node_modules").symlink_to(self.tree / "node_modules", target_is_directory=True)
        self._run_tree = private
        return private


def _top_level(names: set[str]) -> Any:
    root: list[str] = []

    def ignore(directory: str, entries: list[str]) -> list[str]:
        if not root:
            root.append(directory)
        return [e for e in entries if e in names] if directory == root[0] else []

    return ignore

