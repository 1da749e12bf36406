"""What ``recall``, ``explain`` and ``stats`` print: read-only diagnostics, ranked tables in the order of the
score they print, explanations whose printed parts add up to the printed score, and tables aligned by display
width with Chinese text."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import pytest

from memory_recall.cli import main
from memory_recall.cli_common import display_width, fit
from memory_recall.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "chats"
QUESTION = ("recall", "--chat", "t", "--input", "What do we know about Tobias Reed?", "--owner", "character:erin")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def store_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A store with the Thornwick fixture graph as chat ``t`` (no vectors: lexical recall)."""
    code, _, err = run(capsys, "import", str(FIXTURES / "en-thornwick-manor" / "graph.json"), "--chat", "t",
                       "--data-dir", str(tmp_path), "--no-embed")
    assert code == 0, err
    return tmp_path


def _version(store_dir: Path, chat: str = "t") -> int:
    with Store.open(store_dir) as store:
        return store.chat_version(chat)


def _without_ms(explain_out: str) -> str:
    """The explain output without the stage table's timing column (the only part that varies by run)."""
    stages, rest = explain_out.split("\n\n", 1)
    rows = [line.split() for line in stages.splitlines()]
    assert rows[0][1] == "ms" and all(re.fullmatch(r"\d+\.\d\d", row[1]) for row in rows[1:])
    return "\n".join(" ".join(row[:1] + row[2:]) for row in rows) + "\n\n" + rest


class TestReadOnly:
    def test_recall_and_explain_change_nothing(self, store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
        before = _version(store_dir)
        outputs = [run(capsys, *QUESTION, "--data-dir", str(store_dir))[1] for _ in range(2)]
        assert outputs[0] == outputs[1]
        explain = ["explain", *QUESTION[1:], "--data-dir", str(store_dir)]
        explained = [_without_ms(run(capsys, *explain)[1]) for _ in range(2)]
        assert explained[0] == explained[1]
        assert _version(store_dir) == before
        with Store.open(store_dir) as store:
            assert store.stats("t")["record_count"] == 0

    def test_persist_writes_the_reinforcement(self, store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
        before = _version(store_dir)
        first = run(capsys, *QUESTION, "--data-dir", str(store_dir), "--persist")[1]
        assert _version(store_dir) > before
        # The reinforced importance shows in the next recall's scores.
        assert run(capsys, *QUESTION, "--data-dir", str(store_dir))[1] != first


def _recall_rows(out: str) -> tuple[list[str], list[list[str]]]:
    lines = out.splitlines()
    end = lines.index("") if "" in lines else len(lines)
    header = lines[1].split()
    return header, [line.split(None, 4) for line in lines[2:end]]


class TestRankedTables:
    def test_recall_table_is_in_printed_score_order(self, store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, *QUESTION, "--data-dir", str(store_dir))
        header, rows = _recall_rows(out)
        assert code == 0 and header == ["score", "order", "type", "node", "label"]
        assert len(rows) == 12
        keys = [(-float(r[0]), r[3]) for r in rows]
        assert keys == sorted(keys)
        # The selection order is kept as a column: every position once.
        assert sorted(int(r[1]) for r in rows) == list(range(1, 13))
        # Not the selection order here, so the sort is not a no-op.
        assert [int(r[1]) for r in rows] != list(range(1, 13))

    def test_explain_parts_add_up_to_the_printed_score(
        self, store_dir: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = run(capsys, "explain", *QUESTION[1:], "--data-dir", str(store_dir))
        _, recall_out, _ = run(capsys, *QUESTION, "--data-dir", str(store_dir), "--json")
        scores = {m["node_id"]: f"{m['score']:.4f}" for m in json.loads(recall_out)["selected"]}
        assert code == 0
        blocks = re.split(r"(?m)^#\d+ ", out.split("\n\n", 1)[1])[1:]
        assert len(blocks) == 12
        order = []
        number = r"(-?\d+\.\d{4})"
        part_row = re.compile(rf"^    (\w+)\s+{number}  ×\s+{number}  ×\s+{number}  =\s+{number}\s*$")
        for block in blocks:
            lines = block.splitlines()
            heading = re.match(r"(\S+) \(.*\): score (\d+\.\d{4}) \[weighted_score\]", lines[0])
            assert heading is not None
            node, total = heading.groups()
            assert lines[1].split() == ["part", "value", "weight", "multiplier", "contribution"]
            score_line = next(line for line in lines if line.startswith("    score "))
            parts = [part_row.match(line) for line in lines[2 : lines.index(score_line)]]
            score_row = re.match(rf"^    score\s+=\s+{number}\s*$", score_line)
            multiplier_line = next(line for line in lines if line.startswith("    multiplier "))
            assert score_row is not None and score_row.group(1) == total == scores[node]
            matched = [m for m in parts if m is not None]
            assert matched and len(matched) == len(parts)
            contributions = [float(m.group(5)) for m in matched]
            # Printed to 4 decimals: the sum is within the rounding of its terms and the total.
            assert abs(sum(contributions) - float(total)) <= 0.00005 * (len(contributions) + 1) + 1e-12
            multiplier = float(multiplier_line.split()[1])
            for m in matched:
                value, weight, mult, contribution = (float(m.group(i)) for i in (2, 3, 4, 5))
                assert mult == multiplier
                assert abs(value * weight * mult - contribution) <= 0.0005
            factors = re.findall(rf"(\w+) {number}", multiplier_line.split(" = ", 1)[1])
            product = 1.0
            for _, factor in factors:
                product *= float(factor)
            assert abs(product - multiplier) <= 0.0005
            order.append((-float(total), node))
        assert order == sorted(order)
        # Real multipliers are part of the arithmetic (not all 1).
        assert any(float(m) != 1.0 for m in re.findall(r"(?m)^    multiplier (\d+\.\d{4}) = ", out))


def _width(text: str) -> int:
    """Display width as the issue defines it (east_asian_width W/F = 2, combining marks 0), written apart from
    the implementation under test."""
    total = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        total += 2 if unicodedata.east_asian_width(ch) in "WF" else 1
    return total


class TestChineseTables:
    @pytest.fixture()
    def zh_store(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
        chat = FIXTURES / "zh-qingyun-sect" / "chat.json"
        code, _, err = run(capsys, "ingest", str(chat), "--chat", "青云宗", "--data-dir", str(tmp_path), "--no-embed")
        assert code == 0, err
        run(capsys, "ingest", str(FIXTURES / "en-saltmere-harbor" / "chat.json"), "--data-dir", str(tmp_path),
            "--no-embed")
        return tmp_path

    def _assert_aligned(self, table: list[str], *, wide: bool = True) -> None:
        assert len(table) >= 3
        assert any(_width(line) != len(line) for line in table) is wide  # wide characters are in it
        assert {_width(line) for line in table} == {_width(table[0])}

    def test_stats_table(self, zh_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, "stats", "--data-dir", str(zh_store))
        lines = out.splitlines()
        assert code == 0 and [line.split()[0] for line in lines[1:3]] == ["en-saltmere-harbor", "青云宗"]
        self._assert_aligned(lines[:3])

    def test_recall_and_explain_tables(self, zh_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
        question = json.loads((FIXTURES / "zh-qingyun-sect" / "questions.json").read_text(encoding="utf-8"))[0]
        # The reference's weights: with the default ones the chat's raw turns (ASCII ids "msg:N") lead the
        # selection, and this test is about the alignment of headings holding CJK node ids.
        config = zh_store / "app.toml"
        config.write_text('profile = "app"\n', encoding="utf-8")
        argv = ("--chat", "青云宗", "--input", question["input"], "--data-dir", str(zh_store), "--config", str(config))
        code, out, _ = run(capsys, "recall", *argv)
        lines = out.splitlines()
        assert code == 0
        self._assert_aligned(lines[1 : lines.index("")])
        code, out, _ = run(capsys, "explain", *argv)
        lines = out.splitlines()
        assert code == 0
        self._assert_aligned(lines[: lines.index("")], wide=False)  # the stage table: ASCII, aligned too
        # Each memory's parts table (its part rows and the score row), CJK node ids in the heading above it.
        tables = re.findall(r"(?m)((?:^    (?!multiplier|note).*\n)+)", out.split("\n\n", 1)[1])
        assert len(tables) == len(re.findall(r"(?m)^#\d+ ", out)) > 0
        assert any(_width(line) != len(line) for line in out.splitlines() if line.startswith("#"))
        for table in tables:
            rows = table.rstrip("\n").split("\n")
            assert {_width(line) for line in rows} == {_width(rows[0])}


class TestDisplayWidth:
    @pytest.mark.parametrize(("text", "width"), [
        ("Erin", 4), ("林舟", 4), ("ＡＢ", 4), ("e\u0301", 1), ("“引号”", 6), ("", 0), ("a\u200bb", 2),
    ])
    def test_width(self, text: str, width: int) -> None:
        assert display_width(text) == width

    @pytest.mark.parametrize(("text", "width", "align", "expected"), [
        ("林舟", 6, "<", "林舟  "),
        ("林舟", 6, ">", "  林舟"),
        ("林舟弟子报到", 7, "<", "林舟..."),  # 2 + 2 + 3: a third wide character would not fit
        ("青云宗山门", 8, "<", "青云... "),  # cut at a wide character: padded to the column
        ("a\nb\tc", 5, "<", "a b c"),
    ])
    def test_fit(self, text: str, width: int, align: str, expected: str) -> None:
        assert fit(text, width, align) == expected and display_width(expected) == width
