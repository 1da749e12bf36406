"""The benchmark harness (issue 8) on a tiny graph: it runs end to end and writes the JSON the issue defines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_recall import bench
from memory_recall.pipeline.retrieve import STAGE_ORDER

#: Every stage the default "app" pipeline traces, plus the result builder.
PIPELINE_STAGES = {*STAGE_ORDER, "result"}


def _check_pct(value: object) -> None:
    assert isinstance(value, dict)
    assert isinstance(value["p50"], float) and isinstance(value["p95"], float)
    assert 0.0 < value["p50"] <= value["p95"]


def test_bench_main_writes_one_object_per_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert bench.main(["--sizes", "300", "--repeat", "1", "--first", "2", "--service", "3", "--turns", "3",
                       "--out", str(out)]) == 0
    results = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(results, list) and len(results) == 1
    r = results[0]
    assert r["nodes"] == 300 and isinstance(r["nodes"], int)
    _check_pct(r["total_ms"])
    _check_pct(r["first_recall_ms"])
    assert r["first_recall_ms"]["max"] >= r["first_recall_ms"]["p95"]
    assert set(r["stages"]) == PIPELINE_STAGES
    for stage in r["stages"].values():
        assert 0.0 <= stage["p50"] <= stage["p95"]
    assert r["snapshot_build_ms"] > 0 and r["ingest_nodes_per_s"] > 0
    assert 0 < r["peak_rss_mb"] <= r["peak_rss_after_first_mb"]
    _check_pct(r["service_recall_ms"])
    assert r["edges"] > 300  # average degree 5-10
    # The user's turn: one message event and the recall after it, its parts, beside the warm recall of the run.
    _check_pct(r["turn_ms"])
    _check_pct(r["warm_ms"])
    assert set(r["turn_parts_ms"]) == {"ingest", "embed", "snapshot", "recall"}
    for part in r["turn_parts_ms"].values():
        assert 0.0 < part["p50"] <= part["p95"]
    assert set(r["embed_single_ms"]) == {"passage", "query"}
    # The turn is the sum of its ingest, snapshot and recall parts, turn by turn, so its median is at least the
    # largest of their medians (the embedding runs in the background, beside the recall: not a part of the turn).
    parts = r["turn_parts_ms"]
    assert r["turn_ms"]["p50"] >= max(parts[name]["p50"] for name in ("ingest", "snapshot", "recall"))
    single = r["embed_single_ms"]
    assert r["turn_target_ms"] == round(r["warm_ms"]["p50"] + single["passage"]["p50"] + single["query"]["p50"]
                                        + 30.0, 3)
    assert r["turn_embedder"] in ("local", "random")
    table = capsys.readouterr().out
    assert table.splitlines()[1].split()[0] == "300"
    assert any(line.startswith("turn_ms") for line in table.splitlines())
