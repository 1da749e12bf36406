"""The command line: ingest, import, export, stats, demo, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memory_recall.cli import VERSION_NOTE, main
from memory_recall.ingest.stbme import import_stbme
from memory_recall.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "chats"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestIngest:
    def test_chat_file_counts_and_idempotence(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        chat = FIXTURES / "en-saltmere-harbor" / "chat.json"
        data = json.loads(chat.read_text(encoding="utf-8"))
        code, out, _ = run(capsys, "ingest", str(chat), "--data-dir", str(tmp_path), "--no-embed", "-q")
        assert code == 0
        with Store.open(tmp_path) as store:
            stats = store.stats(data["chat_id"])
        n_messages = len([m for m in data["messages"] if m["role"] != "system"])
        assert stats["nodes_by_type"]["message"] == n_messages
        first = out.splitlines()[0]
        assert first.startswith(f"{data['chat_id']}: {len(data['messages'])} messages → {stats['node_count']} nodes")
        # A second ingest of the same file writes nothing.
        code, out, _ = run(capsys, "ingest", str(chat), "--data-dir", str(tmp_path), "--no-embed", "-q")
        assert code == 0 and "(+0 nodes, +0 edges" in out.splitlines()[0]

    def test_embeds_once_then_from_nothing(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        chat = tmp_path / "chat.json"
        chat.write_text(json.dumps({"chat_id": "tiny", "messages": [
            {"floor": 0, "role": "user", "speaker": "Ann", "text": "Meet me at the Old Mill."},
            {"floor": 1, "role": "assistant", "speaker": "Bo", "text": "I'll bring the lantern."},
        ]}), encoding="utf-8")
        code, out, _ = run(capsys, "ingest", str(chat), "--data-dir", str(tmp_path), "-q")
        lines = out.splitlines()
        assert code == 0
        # 2 messages + 2 speakers + 1 entity ("Old Mill") = 5 nodes, each embedded once.
        assert lines[1] == (
            "tiny: embeddings (local:multilingual-e5-small-q4): 5 embedded, 0 from cache, 0 already up to date"
        )
        code, out, _ = run(capsys, "ingest", str(chat), "--data-dir", str(tmp_path), "-q")
        assert out.splitlines()[1].endswith("0 embedded, 0 from cache, 5 already up to date")


class TestImportExport:
    def test_round_trip_through_the_store(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        graph_file = FIXTURES / "zh-bell-tower" / "graph.json"
        code, out, _ = run(
            capsys, "import", str(graph_file), "--chat", "bell", "--data-dir", str(tmp_path), "--no-embed"
        )
        original = import_stbme(graph_file, now_ms=0)
        assert code == 0
        assert out.splitlines()[0] == f"bell: imported {len(original.nodes)} nodes, {len(original.edges)} edges"
        target = tmp_path / "out.json"
        code, _, _ = run(capsys, "export", "--chat", "bell", "--out", str(target), "--data-dir", str(tmp_path))
        assert code == 0
        assert import_stbme(target, now_ms=0) == original

    def test_stats_lists_chats(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        graph_file = FIXTURES / "en-thornwick-manor" / "graph.json"
        run(capsys, "import", str(graph_file), "--chat", "b-chat", "--data-dir", str(tmp_path), "--no-embed")
        run(capsys, "import", str(graph_file), "--chat", "a-chat", "--data-dir", str(tmp_path), "--no-embed")
        code, out, _ = run(capsys, "stats", "--data-dir", str(tmp_path))
        lines = out.splitlines()
        assert code == 0 and lines[0].split() == ["chat", "nodes", "edges", "last", "write", "(UTC)", "version"]
        assert [line.split()[0] for line in lines[1:3]] == ["a-chat", "b-chat"]
        with Store.open(tmp_path) as store:
            versions = [str(store.chat_version(c)) for c in ("a-chat", "b-chat")]
        assert [line.split()[-1] for line in lines[1:3]] == versions
        # The version is the store's clock, not a per-chat count: the output says so.
        assert lines[3] == VERSION_NOTE and len(lines) == 4


class TestErrors:
    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["ingest", "/no/such/file.json"], "error: /no/such/file.json: file not found"),
            (["stats", "--chat", "nope"], "error: --chat: no chat 'nope' in this store"),
            (["export", "--chat", "../x"], "error: chat_id: must not contain path separators ('/' at 2)"),
            (["import", "{bad}", "--chat", "c"], "error: {bad}: file not found"),
        ],
    )
    def test_one_line_errors(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
    ) -> None:
        code, out, err = run(capsys, *argv, "--data-dir", str(tmp_path))
        assert code == 2 and out == "" and err == message + "\n"

    def test_invalid_json_and_bad_message(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        bad = tmp_path / "bad.json"
        bad.write_text("{not json", encoding="utf-8")
        code, _, err = run(capsys, "ingest", str(bad), "--data-dir", str(tmp_path))
        assert code == 2 and err.startswith(f"error: {bad}: not valid JSON")
        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps({"chat_id": "c", "messages": [{"floor": -1, "role": "user", "text": "x"}]}))
        code, _, err = run(capsys, "ingest", str(wrong), "--data-dir", str(tmp_path))
        assert code == 2 and err == "error: messages[0].floor: Input should be greater than or equal to 0\n"


def test_demo_console_script(tmp_path: Path) -> None:
    """The README's first command, through the installed console script."""
    env = {**os.environ, "MEMORY_RECALL_DATA_DIR": str(tmp_path)}
    exe = Path(sys.executable).with_name("memory-recall")
    proc = subprocess.run([str(exe), "demo", "-q"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "demo chat: 'The Verity Locket at Thornwick Manor', 30 messages (28 before the last user turn)"
    assert lines[1].startswith("ingested into chat 'demo': ")
    assert "recall for the last user turn (floor 28): *I keep my face still.*" in proc.stdout
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["score", "order", "memory"])
    rows = lines[header + 1 : lines.index("", header)]
    selected = [line.split()[2] for line in rows]
    # Memories of the chat before the recalled turn only, at most max_recall_nodes (12) of them.
    assert 0 < len(selected) <= 12 and "msg:28" not in selected and "msg:29" not in selected


class TestRecallCommands:
    def test_recall_and_explain(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        graph_file = FIXTURES / "en-thornwick-manor" / "graph.json"
        run(capsys, "import", str(graph_file), "--chat", "t", "--data-dir", str(tmp_path), "--no-embed")
        code, out, _ = run(
            capsys, "recall", "--chat", "t", "--input", "What do we know about Tobias Reed?",
            "--owner", "character:erin", "--data-dir", str(tmp_path), "--json",
        )
        assert code == 0
        response = json.loads(out)
        assert response["status"] == "completed" and response["source"] == "fresh"
        # No embedding model for this chat's vectors: the recall degrades to lexical and says so.
        assert response["semantic_search_used"] is False
        ids = response["selected_node_ids"]
        assert "char-tobias" in ids and "ev-marcus-confession" not in ids  # a secret Erin must not know
        assert response["injection_text"].startswith("[")
        assert response["record_persisted"] is False  # no target floor: nothing is persisted
        code, out, _ = run(
            capsys, "explain", "--chat", "t", "--input", "What do we know about Tobias Reed?",
            "--owner", "character:erin", "--data-dir", str(tmp_path),
        )
        lines = out.splitlines()
        assert code == 0 and lines[0].split()[:4] == ["stage", "ms", "in", "out"]
        stages = [line.split()[0] for line in lines[1 : lines.index("")]]
        assert stages[:3] == ["context", "visibility", "query_plan"]
        # Highest printed score first, ties by node id.
        best = min(response["selected"], key=lambda m: (-float(f"{m['score']:.4f}"), m["node_id"]))
        first = next(line for line in lines if line.startswith("#1 "))
        assert first.startswith(f"#1 {best['node_id']} (")

    def test_serve_refuses_public_bind_without_token(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("MEMORY_RECALL_SERVICE__TOKEN", raising=False)
        code, out, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path))
        assert code == 2 and out == ""
        assert err.startswith("error: ") and "MEMORY_RECALL_SERVICE__TOKEN" in err and err.count("\n") == 1


def test_bench_writes_the_issue_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code, _, _ = run(capsys, "bench", "--sizes", "300", "--repeat", "1", "--out", str(out))
    assert code == 0
    rows = json.loads(out.read_text(encoding="utf-8"))
    assert [r["nodes"] for r in rows] == [300]
    row = rows[0]
    assert set(row["total_ms"]) == {"p50", "p95"} and row["total_ms"]["p50"] <= row["total_ms"]["p95"]
    assert {"context", "scoring", "result"} <= set(row["stages"])
    for key in ("snapshot_build_ms", "ingest_nodes_per_s", "peak_rss_mb"):
        assert isinstance(row[key], float) and row[key] > 0


def test_providers_check_reports_each_provider(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "settings.toml"
    config.write_text('[embedding]\nprovider = "local"\n', encoding="utf-8")
    code, out, _ = run(capsys, "providers", "check", "--config", str(config))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].split()[:4] == ["embedding", "local", "ok", "local:multilingual-e5-small-q4"]
    assert lines[0].endswith("384 dimensions")
    assert lines[1].split()[:4] == ["llm", "none", "not", "configured"]


class TestServeTokenFile:
    """``serve --token-file``: the token from a file (the served token itself: tests/service/test_service_safety.py)."""

    @pytest.mark.parametrize(("text", "problem"), [("", "is empty"), ("\n", "is empty"),
                                                   ("a\nb\n", "holds more than one line")])
    def test_unusable_token_file_is_one_line(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
    ) -> None:
        token = tmp_path / "token"
        token.write_text(text, encoding="utf-8")
        code, out, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", "0", "--token-file", str(token),
                             "--data-dir", str(tmp_path / "data"))
        assert (code, out) == (2, "")
        assert err == f"error: service.token_file: the token file {str(token)!r} {problem}\n"
        assert not (tmp_path / "data").exists()  # refused before the store is opened

    def test_missing_token_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        missing = tmp_path / "none"
        code, _, err = run(capsys, "serve", "--token-file", str(missing), "--data-dir", str(tmp_path))
        assert code == 2
        assert err == (f"error: service.token_file: cannot read the token file {str(missing)!r}: "
                       "No such file or directory\n")

    def test_token_and_token_file_exclude_each_other(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--token", "x", "--token-file", "y"])
        assert exit_.value.code == 2
        assert "argument --token-file: not allowed with argument --token" in capsys.readouterr().err

    def test_help_says_token_is_visible_in_ps(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit):
            main(["serve", "--help"])
        assert "visible to every user in ps" in " ".join(capsys.readouterr().out.split())
