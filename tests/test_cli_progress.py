"""Progress of the command line measures the work: the ingest bar counts messages as each chat commits, the
embedding bar (its own) opens with the number of nodes to embed before the first is sent and advances by
committed chunks; bars are drawn on stderr only when it is a terminal."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from memory_recall.cli_common import EMBED_CHUNK, embed_chat, ingest_chats, terminal_bars
from memory_recall.model.chat import ChatMessage
from memory_recall.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "chats"


class Recorder:
    """A :data:`~memory_recall.cli_common.BarFactory` that logs every bar event (and the embedder's calls)."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def __call__(self, desc: str, total: int, unit: str) -> Recorder:
        self.events.append(("open", desc, total, unit))
        return self

    def update(self, n: int) -> None:
        self.events.append(("update", n))

    def close(self) -> None:
        self.events.append(("close",))


class CountingEmbedder:
    """Deterministic 8-d vectors; logs each ``embed_passages`` call into the recorder's events."""

    model_id = "test:counting"
    dim = 8

    def __init__(self, log: Recorder) -> None:
        self.log = log

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.log.events.append(("embed", len(texts)))
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:8], np.uint8) for t in texts]
        vectors = np.asarray(rows, np.float32) + 1.0
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]


def _messages(name: str) -> tuple[str, list[ChatMessage]]:
    data = json.loads((FIXTURES / name / "chat.json").read_text(encoding="utf-8"))
    return data["chat_id"], [ChatMessage.model_validate(m) for m in data["messages"]]


class TestIngestBar:
    def test_counts_messages_chat_by_chat(self, tmp_path: Path) -> None:
        chats = [_messages("en-thornwick-manor"), _messages("zh-bell-tower")]
        bars = Recorder()
        with Store.open(tmp_path) as store:
            done = ingest_chats(store, chats, now_ms=1_700_000_000_000, bars=bars)
        sizes = [len(m) for _, m in chats]
        assert bars.events == [("open", "ingest", sum(sizes), "msg"), ("update", sizes[0]), ("update", sizes[1]),
                               ("close",)]
        assert [(d.chat_id, d.messages, d.exists) for d in done] == [(c, n, True) for (c, _), n in zip(chats, sizes,
                                                                                                     strict=True)]


class TestEmbeddingBar:
    def test_opens_before_work_and_steps_by_committed_chunks(self, tmp_path: Path) -> None:
        chat_id, messages = _messages("en-thornwick-manor")
        with Store.open(tmp_path) as store:
            ingest_chats(store, [(chat_id, messages)], now_ms=1_700_000_000_000, bars=Recorder())
            active = store.stats(chat_id)["node_count"] - store.stats(chat_id)["archived_count"]
            bars = Recorder()
            report = embed_chat(store, chat_id, CountingEmbedder(bars), bars=bars, chunk=EMBED_CHUNK)
            assert active > 2 * EMBED_CHUNK  # several chunks, so the steps are checked
            events = bars.events
            assert events[0] == ("open", f"embed {chat_id}", active, "node")  # before the first text is embedded
            assert events[-1] == ("close",)
            updates = [e[1] for e in events if e[0] == "update"]
            assert all(isinstance(n, int) and 0 < n <= EMBED_CHUNK for n in updates)
            assert sum(updates) == active == report.total
            # Each update follows the chunk it counts: embed, update, embed, update …
            assert [e[0] for e in events[1:-1]] == ["embed", "update"] * len(updates)
            # Nothing left: a second run embeds nothing and opens no bar.
            again = Recorder()
            embed_chat(store, chat_id, CountingEmbedder(again), bars=again, chunk=EMBED_CHUNK)
            assert again.events == []


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestTerminalOnly:
    def test_bars_draw_on_a_terminal_only(self) -> None:
        tty, pipe = FakeTerminal(), io.StringIO()
        for stream in (tty, pipe):
            bar = terminal_bars(False, stream)("embed c", 10, "node")
            bar.update(4)
            bar.close()
        assert "embed c:" in tty.getvalue() and "/10 [" in tty.getvalue()  # tqdm drew the bar
        assert pipe.getvalue() == ""
        quiet = FakeTerminal()
        bar = terminal_bars(True, quiet)("embed c", 10, "node")
        bar.update(4)
        bar.close()
        assert quiet.getvalue() == ""

    def test_piped_stderr_gets_no_progress(self, tmp_path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MEMORY_RECALL_")}
        exe = Path(sys.executable).with_name("memory-recall")
        proc = subprocess.run(
            [str(exe), "ingest", str(FIXTURES / "en-thornwick-manor" / "chat.json"), "--data-dir", str(tmp_path)],
            capture_output=True, text=True, env=env, timeout=600,
        )
        assert proc.returncode == 0 and proc.stderr == ""
        assert proc.stdout.splitlines()[1].startswith("en-thornwick-manor: embeddings (local:")


@pytest.mark.parametrize("total", [0, 1])
def test_embed_missing_announces_its_total(tmp_path: Path, total: int) -> None:
    """``embed_missing(started=…)`` is called once, before any chunk, with the total ``progress`` later uses."""
    from memory_recall.providers.cache import embed_missing

    messages = [ChatMessage(floor=0, role="user", text="Hello there")][:total]
    seen: list[tuple[str, int, int]] = []
    with Store.open(tmp_path) as store:
        ingest_chats(store, [("c", messages)], now_ms=1_700_000_000_000, bars=Recorder())
        log = Recorder()
        embed_missing(store, "c", CountingEmbedder(log), started=lambda n: seen.append(("started", n, n)),
                      progress=lambda d, t: seen.append(("progress", d, t)))
    assert seen == ([("started", 1, 1), ("progress", 1, 1)] if total else [("started", 0, 0)])
