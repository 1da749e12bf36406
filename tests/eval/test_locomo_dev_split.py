"""``scripts/locomo_dev_split.py``: the development split from the public LoCoMo release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "locomo_dev_split.py"
DEV_PATH = Path(os.environ.get("LOCOMO_DEV_PATH", "../shared/datasets/locomo/locomo_dev.json"))
if not DEV_PATH.is_absolute():
    DEV_PATH = (REPO_ROOT / DEV_PATH).resolve()


def _conversation(sample_id: str, turns: int) -> dict[str, object]:
    session = [{"speaker": "Ann", "dia_id": f"D1:{i + 1}", "text": f"turn {i} – été"} for i in range(turns)]
    return {
        "sample_id": sample_id,
        "conversation": {"speaker_a": "Ann", "speaker_b": "Bo", "session_1_date_time": "1:56 pm on 8 May, 2023",
                         "session_1": session},
        "qa": [{"question": "q?", "answer": "a", "evidence": ["D1:1"], "category": 4}],
    }


def _run(*args: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_picks_the_five_dev_conversations_in_order(tmp_path: Path) -> None:
    ids = ["conv-50", "conv-43", "conv-26", "conv-44", "conv-42", "conv-30", "conv-47", "conv-41", "conv-48", "conv-49"]
    release = tmp_path / "locomo10.json"
    release.write_text(json.dumps([_conversation(s, i + 1) for i, s in enumerate(ids)]), encoding="utf-8")
    out = tmp_path / "split" / "locomo_dev.json"
    proc = _run(release, out)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"{out}: 5 conversations, 24 dialog turns, 5 questions\n"  # 3 + 2 + 8 + 5 + 6 turns
    split = json.loads(out.read_text(encoding="utf-8"))
    assert [c["sample_id"] for c in split] == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
    assert "été" in out.read_text(encoding="utf-8")  # text kept as is, not \\u-escaped


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", "not a LoCoMo file: expected a JSON array of conversations"),
        ("[1]", "not a LoCoMo file: expected a JSON array of conversations"),
        (
            json.dumps([_conversation("conv-26", 1)]),
            "conversation(s) conv-30, conv-41, conv-42, conv-43 not in the file",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, content: str, message: str) -> None:
    release = tmp_path / "locomo10.json"
    release.write_text(content, encoding="utf-8")
    proc = _run(release, tmp_path / "out.json")
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {release}: {message}\n")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.skipif(not DEV_PATH.is_file(), reason=f"LoCoMo dev split not found at {DEV_PATH}")
def test_the_split_of_the_split_is_the_same_file(tmp_path: Path) -> None:
    out = tmp_path / "locomo_dev.json"
    proc = _run(DEV_PATH, out)
    assert proc.stdout == f"{out}: 5 conversations, 2760 dialog turns, 999 questions\n"
    assert out.read_bytes() == DEV_PATH.read_bytes()
