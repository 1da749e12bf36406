"""Git repositories over git's smart HTTP protocol on 127.0.0.1. Not a test module (``e2e_git``).

SillyTavern's *Install extension* clones with ``--depth 1``, which git's dumb HTTP protocol cannot serve, so
:class:`GitHttpServer` runs ``git http-backend`` as a CGI program for each request (``GIT_PROJECT_ROOT`` is
the served directory, ``GIT_HTTP_EXPORT_ALL`` exports every repository in it, pushes stay refused because no
request is authenticated). :func:`snapshot_repo` makes the bare repository to serve from a work tree as it is
on disk, uncommitted changes included, so a test installs the code under test rather than the last commit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from e2e_env import E2EError, ThreadedServer

_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "e2e", "GIT_AUTHOR_EMAIL": "e2e@localhost",
    "GIT_COMMITTER_NAME": "e2e", "GIT_COMMITTER_EMAIL": "e2e@localhost",
}


def _git(
    *args: str, env: dict[str, str] | None = None, input_bytes: bytes | None = None, cwd: Path | None = None
) -> str:
    done = subprocess.run(
        ["git", *args], env={**os.environ, **_GIT_IDENTITY, **(env or {})}, input=input_bytes, cwd=cwd,
        capture_output=True, check=False,
    )
    if done.returncode != 0:
        raise E2EError(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip()


def snapshot_repo(source: Path, bare: Path, *, extra_files: dict[str, str] | None = None) -> Path:
    """Create the bare repository ``bare`` whose ``main`` branch has one commit: the files of the work tree
    ``source`` that git would add (``.gitignore`` honoured, untracked files included), plus ``extra_files``
    (path in the repository → text) for paths the tree lacks (an existing file is never replaced).

    ``source`` need not be a git repository. Returns ``bare``.
    """
    if bare.exists():
        shutil.rmtree(bare)
    _git("-c", "init.defaultBranch=main", "init", "--bare", "--quiet", str(bare))
    index = bare / "e2e-snapshot.index"
    env = {"GIT_DIR": str(bare), "GIT_WORK_TREE": str(source), "GIT_INDEX_FILE": str(index)}
    _git("add", "--all", "--", ".", env=env, cwd=source)
    for rel, text in (extra_files or {}).items():
        if (source / rel).exists():
            continue
        blob = _git("hash-object", "-w", "--stdin", env=env, input_bytes=text.encode())
        _git("update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
    tree = _git("write-tree", env=env)
    commit = _git("commit-tree", tree, "-m", "e2e snapshot of the work tree", env=env)
    _git("update-ref", "refs/heads/main", commit, env=env)
    _git("symbolic-ref", "HEAD", "refs/heads/main", env=env)
    index.unlink(missing_ok=True)
    return bare


def extension_manifest(js: str, *, source_manifest: Path | None = None) -> str:
    """A SillyTavern ``manifest.json`` text whose ``js`` (and ``css``, when set) point at paths relative to the
    repository root; the other fields come from ``source_manifest`` (the extension folder's own manifest)."""
    data: dict[str, Any] = {}
    if source_manifest is not None and source_manifest.exists():
        data = json.loads(source_manifest.read_text(encoding="utf-8"))
    folder = Path(js).parent.as_posix()
    data["js"] = js
    if data.get("css"):
        data["css"] = f"{folder}/{data['css']}"
    data.setdefault("display_name", Path(js).parent.name)
    return json.dumps(data, indent=4) + "\n"


class GitHttpServer:
    """Serves every repository under ``root`` at ``http://127.0.0.1:<port>/<name>`` (clone and fetch only).

    ``start()`` binds a free port; ``url_for(name)`` is the clone URL of ``root/<name>``; ``close()`` stops.
    ``requests`` lists ``(method, path)`` of what was asked, for a failure message.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadedServer | None = None
        self.port = 0
        backend = _git("--exec-path")
        self._backend = str(Path(backend) / "git-http-backend")
        if not os.access(self._backend, os.X_OK):
            raise E2EError(f"git http-backend not found at {self._backend}")

    def start(self) -> GitHttpServer:
        owner = self

        class Handler(_CgiHandler):
            server_owner = owner

        self._server = ThreadedServer(Handler, "e2e-git-http")
        self.port = self._server.port
        return self

    def url_for(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


class _CgiHandler(BaseHTTPRequestHandler):
    server_owner: GitHttpServer
    protocol_version = "HTTP/1.0"  # one response per connection: the CGI output's length is known only at the end

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class names it so
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._cgi(b"")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self._cgi(self.rfile.read(length) if length else b"")

    def _cgi(self, body: bytes) -> None:
        owner = self.server_owner
        path, _, query = self.path.partition("?")
        owner.requests.append((self.command, path))
        env = {
            "PATH": os.environ.get("PATH", ""),
            "GIT_PROJECT_ROOT": str(owner.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "SERVER_PROTOCOL": "HTTP/1.0",
            "GATEWAY_INTERFACE": "CGI/1.1",
        }
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]  # git gzips large upload-pack bodies
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]  # protocol v2 negotiation
        done = subprocess.run([owner._backend], input=body, env=env, capture_output=True, check=False)
        head, sep, payload = done.stdout.partition(b"\r\n\r\n")
        if not sep:
            head, sep, payload = done.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name.strip(), value.strip()))
        if not sep:
            status, headers, payload = 500, [("Content-Type", "text/plain")], done.stderr
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
