"""The benchmark harness (issue 8) on a tiny graph: it runs end to end and writes the JSON the issue defines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reliability.rel_crash_helpers import load_script  # tests/ is on sys.path (no __init__.py)

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


def test_bench_after_write_times_the_event_in_wall_and_cpu_time(tmp_path: Path) -> None:
    """``scripts/bench_after_write.py`` on a 300-node graph: every figure of the issue's table, in wall time and in
    process CPU time (the event's CPU time leaves out the commit's wait for the disk). A turn's event is its ingest
    plus its refresh, turn by turn, so the event's percentiles lie above each part's."""
    baw: Any = load_script("bench_after_write")
    r = baw.bench_size(300, turns=5, warm=3, store_dir=tmp_path, profile="default")
    assert r["nodes"] == 300 and r["profile"] == "default" and r["refresh"] is True
    for key in ("warm_ms", "ingest_ms", "refresh_ms", "event_ms", "recall_ms", "after_write_ms",
                "warm_cpu_ms", "ingest_cpu_ms", "refresh_cpu_ms", "event_cpu_ms", "recall_cpu_ms"):
        _check_pct(r[key])
    for kind in ("", "_cpu"):
        event, ingest, refresh = (r[f"{part}{kind}_ms"] for part in ("event", "ingest", "refresh"))
        assert event["p50"] > max(ingest["p50"], refresh["p50"]) and event["p95"] > max(ingest["p95"], refresh["p95"])
    # The refresh's parts: each part of a turn lies within that turn's refresh, so each percentile of a part lies
    # at or below the refresh's (a percentile is monotone in the samples).
    parts = r["refresh_parts_ms"]
    assert sorted(parts) == ["bm25", "derived", "snapshot"]
    for part in parts.values():
        _check_pct(part)
        assert part["p50"] <= r["refresh_ms"]["p50"] and part["p95"] <= r["refresh_ms"]["p95"]
    # Every turn's recall found the snapshot the event's refresh had brought up to date (without the refresh the
    # recall's own get applies the delta).
    assert r["snapshot_how"] == {"cached": 5}
    # Each turn's after-write recall is paired with the same recall run again right after it, warm.
    _check_pct(r["paired_warm_ms"])
    pairs = np.array(r["paired_turns_ms"])
    assert pairs.shape == (5, 2) and (pairs > 0).all()
    assert float(np.percentile(pairs[:, 0], 50)) == pytest.approx(r["recall_ms"]["p50"], abs=0.01)
    assert float(np.percentile(pairs[:, 1], 50)) == pytest.approx(r["paired_warm_ms"]["p50"], abs=0.01)
    assert float(np.median(pairs[:, 0] / pairs[:, 1])) == pytest.approx(r["paired_ratio"], abs=0.011)
    cpu = np.array(r["paired_turns_cpu_ms"])
    assert cpu.shape == (5, 2) and (cpu > 0).all()
    assert float(np.median(cpu[:, 0] / cpu[:, 1])) == pytest.approx(r["paired_cpu_ratio"], abs=0.011)
    # Five new messages, and the entity node of the name they bring (Mira), made by the first.
    assert r["event"] == "add" and r["nodes_added"] == 6


def test_bench_after_write_edits_one_message_in_place(tmp_path: Path) -> None:
    """``--event edit``: every turn rewrites the same message, so the chat gains no message node; the first edit's
    new text brings the name Mira, whose entity node is the one node added. Each turn's recall still finds the
    snapshot brought up to date by the event's refresh."""
    baw: Any = load_script("bench_after_write")
    r = baw.bench_size(300, turns=3, warm=2, store_dir=tmp_path, profile="default", event="edit")
    assert r["event"] == "edit" and r["nodes_added"] == 1
    assert r["snapshot_how"] == {"cached": 3}
    for key in ("ingest_ms", "refresh_ms", "event_ms", "recall_ms"):
        _check_pct(r[key])


def test_bench_after_write_removes_a_message_each_turn(tmp_path: Path) -> None:
    """``--event remove``: every turn deletes the message ``REMOVE_BACK`` floors before the last (the later ones
    move down a floor), so the chat loses one message node a turn; each recall finds the snapshot the event's
    refresh brought up to date."""
    baw: Any = load_script("bench_after_write")
    r = baw.bench_size(300, turns=3, warm=2, store_dir=tmp_path, profile="default", event="remove")
    assert r["event"] == "remove" and r["nodes_added"] == -3
    assert r["snapshot_how"] == {"cached": 3}
    for key in ("ingest_ms", "refresh_ms", "event_ms", "recall_ms"):
        _check_pct(r[key])


def test_bench_after_write_mixes_new_edited_and_deleted_messages(tmp_path: Path) -> None:
    """``--event mix``: a new message, an edit and a deletion in turn. Over six turns the chat gains two message
    nodes and the entity of the name they bring (Mira) and loses two; ``by_kind`` times each kind's two turns."""
    baw: Any = load_script("bench_after_write")
    r = baw.bench_size(300, turns=6, warm=2, store_dir=tmp_path, profile="default", event="mix")
    assert r["event"] == "mix" and r["nodes_added"] == 1
    assert r["snapshot_how"] == {"cached": 6}
    assert list(r["by_kind"]) == ["add", "edit", "remove"]
    pairs = np.array(r["paired_turns_ms"])
    for offset, kind in enumerate(r["by_kind"].values()):
        assert kind["turns"] == 2
        _check_pct(kind["event_ms"])
        # The kind's turns are every third one from its place: its ratio is the median of those turns' pairs.
        mine = pairs[offset::3]
        assert kind["paired_ratio"] == pytest.approx(float(np.median(mine[:, 0] / mine[:, 1])), abs=0.011)
    r1 = baw.bench_size(300, turns=2, warm=2, store_dir=tmp_path, profile="default", event="remove")
    assert list(r1["by_kind"]) == ["remove"] and r1["by_kind"]["remove"]["turns"] == 2
    one = np.array(r1["paired_turns_ms"])
    assert r1["by_kind"]["remove"]["paired_ratio"] == pytest.approx(float(np.median(one[:, 0] / one[:, 1])), abs=0.011)
