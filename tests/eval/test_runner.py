"""The LoCoMo runner end to end on a tiny synthetic file (2 sessions, 8 turns, 3 questions).

The embedder is a deterministic hashed bag of words and the pipeline is replaced by an injected recall
function whose ranking is fixed, so every figure below can be computed by hand; one test also runs the real
pipeline for the shape only.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory_recall.eval.runner import main, pipeline_recall, run_locomo
from memory_recall.pipeline.state import Providers, RecallQuery
from memory_recall.pipeline.visibility import current_turn_excluded
from memory_recall.settings import RecallSettings
from memory_recall.store.snapshot import GraphSnapshot

DATE_1 = "1:56 pm on 8 May, 2023"
DATE_2 = "10:00 am on 20 May, 2023"

TINY = [
    {
        "sample_id": "tiny",
        "conversation": {
            "speaker_a": "Alice",
            "speaker_b": "Bob",
            "session_1_date_time": DATE_1,
            "session_1": [
                {"speaker": "Alice", "dia_id": "D1:1", "text": "Hello there, how was your week?"},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "We adopted a beagle puppy last week."},
                {"speaker": "Alice", "dia_id": "D1:3", "text": "That sounds lovely, congratulations!"},
                {"speaker": "Bob", "dia_id": "D1:4", "text": "I also went to a guitar concert downtown."},
            ],
            "session_2_date_time": DATE_2,
            "session_2": [
                {"speaker": "Alice", "dia_id": "D2:1", "text": "I finally signed up for something new."},
                {"speaker": "Bob", "dia_id": "D2:2", "text": "Oh nice, tell me more about it."},
                {"speaker": "Alice", "dia_id": "D2:3", "text": "The pottery class meets at the studio."},
                {"speaker": "Bob", "dia_id": "D2:4", "text": "Sounds fun, enjoy it!"},
            ],
        },
        "qa": [
            {"question": "Which breed of puppy was adopted?", "answer": "beagle", "evidence": ["D1:2"],
             "category": 4},
            {"question": "Where does the pottery class meet?", "answer": "the studio", "evidence": ["D2:3"],
             "category": 1},
            {"question": "What guitar concert happened downtown?", "adversarial_answer": "none",
             "evidence": ["D1:4; D2:1", "D"], "category": 5},
        ],
    }
]

QUESTIONS = [q["question"] for q in TINY[0]["qa"]]  # type: ignore[index]


class BagOfWords:
    """Deterministic 32-d hashed bag-of-words embedder; counts the passages it embeds."""

    model_id = "fake:bow-32"
    dim = 32

    def __init__(self) -> None:
        self.passages = 0

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().split():
            v[int(hashlib.sha256(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norm = float(np.linalg.norm(v))
        v = v / norm if norm else np.eye(self.dim, dtype=np.float32)[0]
        return v.astype(np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passages += len(texts)
        return np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self._vec(text)


class ReverseFloorRecall:
    """Ranks every message node by floor descending, a character node first (it must be skipped)."""

    def __init__(self) -> None:
        self.queries: list[RecallQuery] = []
        self.ablations: list[frozenset[str]] = []
        self.excluded: list[list[str]] = []  # message nodes the current-turn rule would hide from the recall

    def __call__(
        self, snapshot: GraphSnapshot, query: RecallQuery, settings: RecallSettings, providers: Providers,
        ablate: frozenset[str],
    ) -> list[str]:
        self.queries.append(query)
        self.ablations.append(ablate)
        self.excluded.append(current_turn_excluded(snapshot, query.user_floor))
        messages = sorted((i for i in snapshot.ids if i.startswith("msg:")), key=lambda i: -int(i[4:]))
        return ["char:alice", *messages]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY), encoding="utf-8")
    return path


def _run(tiny: Path, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], ReverseFloorRecall, BagOfWords]:
    recall = ReverseFloorRecall()
    embedder = kw.pop("embedder", BagOfWords())
    metrics = run_locomo(
        tiny, ks=(1, 2), baselines=True, out=tmp_path / "out", data_dir=tmp_path / "store", embedder=embedder,
        recall_fn=recall, quiet=True, **kw,
    )
    return metrics, recall, embedder


class TestShapeAndValues:
    def test_metrics_json_is_exactly_what_run_returns(self, tiny: Path, tmp_path: Path) -> None:
        metrics, _, _ = _run(tiny, tmp_path)
        on_disk = json.loads((tmp_path / "out" / "metrics.json").read_text(encoding="utf-8"))
        assert on_disk == metrics
        assert set(metrics) == {"dataset", "unit", "questions", "k", "systems"}
        assert (metrics["dataset"], metrics["unit"], metrics["questions"], metrics["k"]) == (
            "tiny.json", "turn", 3, [1, 2]
        )
        assert list(metrics["systems"]) == ["memory-recall", "bm25", "dense", "rrf"]
        for system in metrics["systems"].values():
            assert set(system) == {
                "recall", "recall_excluding_adversarial", "recall_by_category", "recall_all", "ndcg@10", "mrr",
                "latency_ms",
            }
            assert set(system["recall"]) == {"1", "2"}
            assert set(system["recall_by_category"]) == {"1", "4", "5"}
            assert set(system["latency_ms"]) == {"p50", "p95"}
        for name in ("report.md", "recall_at_k.png", "details.json", "rankings.jsonl"):
            assert (tmp_path / "out" / name).stat().st_size > 0

    def test_injected_recall_values(self, tiny: Path, tmp_path: Path) -> None:
        # Ranking D2:4, D2:3, D2:2, D2:1, D1:4, … (char:alice skipped). Q1 (D1:2) is at rank 7: 0 at k ≤ 2,
        # RR 1/7; Q2 (D2:3) at rank 2: R@1 0, R@2 1, RR 1/2; Q3 (D1:4, D2:1; "D" dropped) at ranks 5 and 4.
        metrics, _, _ = _run(tiny, tmp_path)
        got = metrics["systems"]["memory-recall"]
        assert got["recall"] == {"1": 0.0, "2": 1 / 3}
        assert got["recall_excluding_adversarial"] == {"1": 0.0, "2": 0.5}
        assert got["recall_by_category"] == {"1": {"1": 0.0, "2": 1.0}, "4": {"1": 0.0, "2": 0.0},
                                             "5": {"1": 0.0, "2": 0.0}}
        assert got["recall_all"] == {"1": 0.0, "2": 1 / 3}
        ndcg_q3 = (1 / math.log2(5) + 1 / math.log2(6)) / (1 + 1 / math.log2(3))
        assert got["ndcg@10"] == pytest.approx((1 / math.log2(8) + 1 / math.log2(3) + ndcg_q3) / 3)
        assert got["mrr"] == pytest.approx((1 / 7 + 1 / 2 + 1 / 4) / 3)

    def test_bm25_values(self, tiny: Path, tmp_path: Path) -> None:
        # Each question's words occur in one turn only: Q1 → D1:2, Q2 → D2:3, Q3 → D1:4 (D2:1 shares none).
        metrics, _, _ = _run(tiny, tmp_path)
        got = metrics["systems"]["bm25"]
        assert got["recall"] == {"1": 2.5 / 3, "2": 2.5 / 3}
        assert got["recall_excluding_adversarial"] == {"1": 1.0, "2": 1.0}
        assert got["recall_by_category"]["5"] == {"1": 0.5, "2": 0.5}
        assert got["recall_all"] == {"1": 2 / 3, "2": 2 / 3}
        assert got["mrr"] == 1.0
        assert got["ndcg@10"] == pytest.approx((2 + 1 / (1 + 1 / math.log2(3))) / 3)

    def test_what_the_recall_function_sees(self, tiny: Path, tmp_path: Path) -> None:
        _, recall, _ = _run(tiny, tmp_path, ablate=("diffusion",))
        # memory-recall then no-diffusion for each question
        assert [q.user_message for q in recall.queries] == [q for q in QUESTIONS for _ in range(2)]
        assert recall.ablations[:2] == [frozenset(), frozenset({"diffusion"})]
        q = recall.queries[0]
        assert q.recent_lines == (
            "[user]: I finally signed up for something new.", "[assistant]: Oh nice, tell me more about it.",
            "[user]: The pottery class meets at the studio.", "[assistant]: Sounds fun, enjoy it!",
        )
        assert (q.user_floor, q.chat_id) == (8, "tiny")
        # Asked after the whole conversation (floors 0–7): the current-turn rule hides no evidence turn.
        assert recall.excluded == [[] for _ in recall.queries]
        assert q.now_ms == 1684576800000  # 20 May 2023 10:00 UTC, the last session's date

    def test_no_context(self, tiny: Path, tmp_path: Path) -> None:
        _, recall, _ = _run(tiny, tmp_path, context=False)
        assert all(q.recent_lines == () for q in recall.queries)

    def test_limit_questions(self, tiny: Path, tmp_path: Path) -> None:
        metrics, recall, _ = _run(tiny, tmp_path, limit_questions=2)
        assert metrics["questions"] == 2
        assert len(recall.queries) == 2

    def test_second_run_embeds_nothing(self, tiny: Path, tmp_path: Path) -> None:
        _, _, first = _run(tiny, tmp_path)
        assert first.passages > 0
        _, _, second = _run(tiny, tmp_path)
        assert second.passages == 0


    def test_the_settings_store_is_used_without_data_dir(self, tiny: Path, tmp_path: Path) -> None:
        settings = RecallSettings().with_overrides({"store": {"data_dir": str(tmp_path / "from-settings")}})
        run_locomo(tiny, ks=(1,), out=tmp_path / "out", settings=settings, embedder=BagOfWords(),
                   recall_fn=ReverseFloorRecall(), quiet=True)
        assert (tmp_path / "from-settings" / "memory-recall.sqlite3").is_file()


class TestRealPipeline:
    def test_shape_with_the_pipeline(self, tiny: Path, tmp_path: Path) -> None:
        metrics = run_locomo(
            tiny, ks=(1, 5), out=tmp_path / "out", data_dir=tmp_path / "store", embedder=BagOfWords(),
            recall_fn=pipeline_recall, quiet=True, ablate=("anchors",),
        )
        assert list(metrics["systems"]) == ["memory-recall", "no-anchors"]
        for system in metrics["systems"].values():
            assert all(0.0 <= v <= 1.0 for v in system["recall"].values())


class TestCommandLine:
    def test_unknown_stage_is_an_input_error(
        self, tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code = main(["locomo", str(tiny), "--ablate", "nope", "--data-dir", str(tmp_path), "--quiet"])
        assert code == 2
        assert "unknown stage" in capsys.readouterr().err


class TestControllerPath:
    def test_default_path_writes_nothing_and_is_order_independent(self, tiny: Path, tmp_path: Path) -> None:
        from memory_recall.store import Store

        first = run_locomo(
            tiny, ks=(1, 5), out=tmp_path / "a", data_dir=tmp_path / "store", embedder=BagOfWords(), quiet=True,
        )
        store = Store.open(tmp_path / "store")
        try:
            version = store.chat_version("tiny")
            assert store.list_records("tiny") == []
        finally:
            store.close()
        run_locomo(
            tiny, ks=(1, 5), out=tmp_path / "b", data_dir=tmp_path / "store", embedder=BagOfWords(), quiet=True,
            limit_questions=1,
        )
        store = Store.open(tmp_path / "store")
        try:
            assert store.chat_version("tiny") == version  # persist=False: no reinforcement, no record
            assert store.list_records("tiny") == []
        finally:
            store.close()
        rows_a = (tmp_path / "a" / "rankings.jsonl").read_text(encoding="utf-8").splitlines()
        rows_b = (tmp_path / "b" / "rankings.jsonl").read_text(encoding="utf-8").splitlines()
        # the first question ranks the same whether it is asked first of three or alone
        assert json.loads(rows_b[0])["ranked"]["memory-recall"] == json.loads(rows_a[0])["ranked"]["memory-recall"]
        assert first["systems"]["memory-recall"]["recall"]["5"] > 0.0
