"""Every misuse of the command line is one line on stderr with exit status 2, never a traceback.

Run through the installed console script in a fresh process, in a scratch working directory, as a user runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memory_recall.cli_common import OneLineParser, int_list, port_number

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).with_name("memory-recall")
THORNWICK = ROOT / "fixtures" / "chats" / "en-thornwick-manor"
CHOICES = "'demo', 'ingest', 'import', 'export', 'stats', 'serve', 'recall', 'explain', 'bench', 'eval', 'providers'"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test's environment without the user's MEMORY_RECALL_* variables, the store under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MEMORY_RECALL_")}
    env["MEMORY_RECALL_DATA_DIR"] = str(tmp_path / "store")
    env.update(extra)
    return env


def cli(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), *argv], capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path, **env), timeout=300
    )


@pytest.fixture()
def scratch(tmp_path: Path) -> Path:
    """A working directory with the input files the misuses name."""
    (tmp_path / "numeric-id.json").write_text(json.dumps(
        {"chat_id": 5, "messages": [{"floor": 0, "role": "user", "text": "hi"}]}), encoding="utf-8")
    (tmp_path / "string.json").write_text('"just a string"', encoding="utf-8")
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "empty.json").write_text("[]", encoding="utf-8")
    return tmp_path


MISUSES = [
    # eval fixtures outside the repository, or with a missing --root: was a FileNotFoundError traceback.
    (["eval", "fixtures"],
     "error: --root: no directory 'fixtures/chats' (run from the repository root or pass --root DIR)"),
    (["eval", "fixtures", "--root", "missing"],
     "error: --root: no directory 'missing' (run from the repository root or pass --root DIR)"),
    # export --out into a missing directory or onto a directory: were FileNotFoundError / IsADirectoryError.
    (["export", "--chat", "c", "--out", "missing/graph.json"],
     "error: --out: no directory 'missing' to write graph.json into"),
    (["export", "--chat", "c", "--out", "a-dir"], "error: --out: a-dir is a directory; name a file in it"),
    # bench: --sizes abc was a ValueError traceback, --sizes 2 one from the generator; --out was only
    # checked after the whole benchmark had run.
    (["bench", "--sizes", "abc"], "error: memory-recall bench: argument --sizes: must be comma-separated ints in "
     "the range [10, 10000000]. Got 'abc' instead."),
    (["bench", "--sizes", "300,2"], "error: memory-recall bench: argument --sizes: must be comma-separated ints "
     "in the range [10, 10000000]. Got '300,2' instead."),
    (["bench", "--sizes", "300", "--out", "missing/bench.json"],
     "error: --out: missing/bench.json has no directory 'missing'; name a file in an existing directory"),
    # eval locomo --out onto a file: was a FileExistsError traceback after the whole run.
    (["eval", "locomo", "empty.json", "--out", "a-file", "-q"], "error: --out: 'a-file' is a file; name a directory"),
    # eval locomo of a missing file: created the --out directory before it failed.
    (["eval", "locomo", "missing.json", "--out", "new-dir"], "error: path: no such file: missing.json"),
    # ingest: a directory was "cannot read file: Is a directory"; a numeric chat_id was silently str()-ed.
    (["ingest", "a-dir"], "error: a-dir: is a directory, not a JSON file"),
    (["ingest", "numeric-id.json"], "error: numeric-id.json: 'chat_id' must be a string, got a JSON number"),
    # import of valid JSON that is not an object: was "data: is not valid JSON" (it is valid JSON).
    (["import", "string.json", "--chat", "c"],
     "error: string.json: expected an ST-BME graph export (a JSON object), got a JSON string"),
    # import of a chat file: the error named "graph", not the file.
    (["import", "numeric-id.json", "--chat", "c"], "error: numeric-id.json: graph: has no 'nodes' list (not an "
     "ST-BME graph export, nor a wrapper holding one)"),
    # recall with an over-long option: was a pydantic ValidationError traceback.
    (["recall", "--chat", "c", "--input", "x", "--region", "r" * 201],
     "error: --region: String should have at most 200 characters"),
    (["explain", "--chat", "nope", "--input", "x"], "error: --chat: no chat 'nope' in this store"),
    # argparse errors were a usage block plus the error: now the error line alone.
    (["recall", "--chat", "c"], "error: memory-recall recall: the following arguments are required: --input"),
    (["nope"], f"error: memory-recall: argument command: invalid choice: 'nope' (choose from {CHOICES})"),
    (["stats", "--config", "a-dir"], "error: a-dir: is a directory, not a TOML file"),
    (["providers"], "error: memory-recall providers: the following arguments are required: {check}"),
    (["eval", "fixtures", "--k", "abc"],
     "error: memory-recall eval fixtures: argument --k: must be comma-separated ints. Got 'abc' instead."),
]


@pytest.mark.parametrize(("argv", "message"), MISUSES, ids=[" ".join(a)[:40] for a, _ in MISUSES])
def test_misuse_is_one_line(scratch: Path, argv: list[str], message: str) -> None:
    proc = cli(scratch, *argv)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message + "\n")
    assert not (scratch / "new-dir").exists()


class TestSettingsBeforeTheStore:
    """A command loads and validates its settings before it touches the store."""

    @pytest.mark.parametrize("argv", [
        ["ingest", str(THORNWICK / "chat.json"), "--no-embed"],
        ["stats"],
        ["export", "--chat", "c"],
        ["import", str(THORNWICK / "graph.json"), "--chat", "c", "--no-embed"],
    ])
    def test_bad_config_changes_nothing(self, tmp_path: Path, argv: list[str]) -> None:
        config = tmp_path / "bad.toml"
        config.write_text("[diffusion]\ndecay = 5\n", encoding="utf-8")
        proc = cli(tmp_path, *argv, "--config", str(config))
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr == "error: diffusion.decay: Input should be less than or equal to 1\n"
        # ingest used to write the chat, and stats/export ignored --config altogether.
        assert not (tmp_path / "store").exists()

    def test_stats_reads_the_store_the_config_names(self, tmp_path: Path) -> None:
        config = tmp_path / "settings.toml"
        config.write_text(f'[store]\ndata_dir = "{(tmp_path / "named").as_posix()}"\n', encoding="utf-8")
        proc = cli(tmp_path, "import", str(THORNWICK / "graph.json"), "--chat", "c", "--no-embed",
                   "--config", str(config))
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "named" / "memory-recall.sqlite3").is_file() and not (tmp_path / "store").exists()
        proc = cli(tmp_path, "stats", "--config", str(config))
        assert proc.returncode == 0 and proc.stdout.splitlines()[1].split()[:3] == ["c", "43", "60"]


class TestEnvironment:
    def test_misspelt_variable_is_named(self, tmp_path: Path) -> None:
        proc = cli(tmp_path, "stats", MEMORY_RECALL_DIFUSION__DECAY="0.5")
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr == (
            "error: MEMORY_RECALL_DIFUSION__DECAY: unknown setting; did you mean MEMORY_RECALL_DIFFUSION__DECAY?\n"
        )

    def test_bad_value_names_the_variable(self, tmp_path: Path) -> None:
        proc = cli(tmp_path, "stats", MEMORY_RECALL_DIFFUSION__DECAY="5")
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr == (
            "error: MEMORY_RECALL_DIFFUSION__DECAY: Input should be less than or equal to 1 "
            "(setting diffusion.decay; got '5')\n"
        )


class TestEmptyChat:
    """An empty chat is "nothing to ingest" (exit 0) and no chat is claimed or written."""

    def test_no_messages(self, tmp_path: Path) -> None:
        (tmp_path / "empty.json").write_text('{"chat_id": "e", "messages": []}', encoding="utf-8")
        proc = cli(tmp_path, "ingest", "empty.json")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "e: no messages: nothing to ingest, no chat "
                                                                  "written\n", "")
        proc = cli(tmp_path, "stats")
        assert proc.stdout == "no chats in this store\n"

    def test_only_system_messages_and_an_empty_locomo_file(self, tmp_path: Path) -> None:
        (tmp_path / "system.json").write_text(json.dumps({"chat_id": "s", "messages": [
            {"floor": 0, "role": "system", "text": "You are a narrator."}]}), encoding="utf-8")
        (tmp_path / "locomo.json").write_text("[]", encoding="utf-8")
        proc = cli(tmp_path, "ingest", "system.json")
        assert (proc.returncode, proc.stdout) == (
            0, "s: 1 messages, none from user or assistant: nothing to ingest, no chat written\n")
        proc = cli(tmp_path, "ingest", "locomo.json")
        assert (proc.returncode, proc.stdout) == (0, "locomo.json: no conversations: nothing to ingest, no chat "
                                                     "written\n")
        assert cli(tmp_path, "stats").stdout == "no chats in this store\n"


class TestArgumentTypes:
    """The ``type=`` functions the parsers use (``serve --port`` takes :func:`port_number`)."""

    def _parser(self) -> OneLineParser:
        parser = OneLineParser(prog="memory-recall serve")
        parser.add_argument("--port", type=port_number)
        parser.add_argument("--sizes", type=int_list(10, 100))
        return parser

    @pytest.mark.parametrize(("argv", "message"), [
        (["--port", "99999"], "argument --port: must be an int in the range [0, 65535]. Got '99999' instead."),
        (["--port", "-1"], "argument --port: must be an int in the range [0, 65535]. Got '-1' instead."),
        (["--port", "http"], "argument --port: must be an int in the range [0, 65535]. Got 'http' instead."),
        (["--sizes", "10,,x"], "argument --sizes: must be comma-separated ints in the range [10, 100]. "
         "Got '10,,x' instead."),
        (["--sizes", ","], "argument --sizes: must be comma-separated ints in the range [10, 100]. Got ',' instead."),
    ])
    def test_rejected(self, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
        with pytest.raises(SystemExit) as exit_:
            self._parser().parse_args(argv)
        assert exit_.value.code == 2
        assert capsys.readouterr().err == f"error: memory-recall serve: {message}\n"

    @pytest.mark.parametrize("port", ["99999", "-1", "http"])
    def test_serve_takes_a_port_number(self, tmp_path: Path, port: str) -> None:
        proc = cli(tmp_path, "serve", "--port", port)
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr == (
            f"error: memory-recall serve: argument --port: must be an int in the range [0, 65535]. Got '{port}' "
            "instead.\n"
        )

    def test_accepted(self) -> None:
        args = self._parser().parse_args(["--port", "0", "--sizes", "10, 100"])
        assert args == argparse.Namespace(port=0, sizes=(10, 100))
        assert self._parser().parse_args(["--port", "65535"]).port == 65535
