"""Load, fast variant of ``scripts/load_test.py``: 4 clients for 5 s against the real service (subprocess,
uvicorn on 127.0.0.1, local embedder) on a small synthetic chat: zero errors, every kind of request exercised,
every answer valid (the script validates each one) and the service's RSS sampled throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rel_crash_helpers import load_script

lt = load_script("load_test")


def test_mixed_load_has_no_errors(tmp_path: Path) -> None:
    out = lt.run_load(data_dir=tmp_path / "chat", nodes=120, clients=4, seconds=5, sample_s=1.0, log=lambda _: None)
    assert out["errors"] == 0, {k: v["first_errors"] for k, v in out["kinds"].items()}
    assert out["chat"]["node_count"] == 120 and out["chat"]["embedded_now"] > 0
    assert out["embedder"].startswith("local:")
    for kind in lt.KINDS:
        assert out["kinds"][kind]["ok"] >= 1, kind
    recalls = out["kinds"]["recall"]["ok"]
    # Each recall is a fresh one for a new floor, completed with semantic search (vectors and query agree).
    assert out["recall_status"] == {"completed": recalls}
    assert out["recall_source"] == {"fresh": recalls}
    assert out["retrieval_status"] == {"ok": recalls}
    rss = out["rss_mb"]
    assert len(rss["samples"]) >= 5 and all(mb > 0 for _, mb in rss["samples"])
    assert [t for t, _ in rss["anon_samples"]] == [t for t, _ in rss["samples"]]
    assert all(0 < anon <= mb for (_, anon), (_, mb) in zip(rss["anon_samples"], rss["samples"], strict=True))
    trend = rss["anon_trend_second_half"]  # the in-load samples of the last 2.5 s (about 2 at 1 s apart)
    assert trend is not None and 2 <= trend["samples"] < len(rss["anon_samples"])
    assert trend["growth"] == round(trend["last"] - trend["first"], 1)
    assert rss["messages_added_second_half"] <= out["kinds"]["message"]["ok"]
    # The RSS without the model file's pages: the engine maps its model at the first embedding (the warm-up's), so
    # from the sample after the warm-up on some of the file is resident.
    assert [t for t, _ in rss["without_model_samples"]] == [t for t, _ in rss["samples"]]
    pairs = list(zip(rss["without_model_samples"], rss["samples"], strict=True))
    assert pairs[0][0][1] <= pairs[0][1][1] and all(0 < rest < mb for (_, rest), (_, mb) in pairs[1:])
    assert rss["without_model_trend_second_half"]["samples"] == trend["samples"]
    # The allocator's memory in use from GET /v1/memory, with the samples (a late answer is left out): below the
    # anonymous RSS of the same moment.
    anon_at = dict(rss["anon_samples"])
    assert len(rss["heap_in_use_samples"]) >= len(rss["samples"]) - 2
    assert all(0 < used < anon_at[t] for t, used in rss["heap_in_use_samples"])
    assert rss["heap_in_use_trend_second_half"] is not None
    assert out["clean_shutdown"]


def test_mapped_rss_counts_the_resident_pages_of_the_directorys_bin_files(tmp_path: Path) -> None:
    """A 2 MiB ``.bin`` file mapped in this process counts once its pages are read (some or all of it: the kernel
    maps what the page cache holds around a fault); a mapped file of another name, or in another directory, does
    not count."""
    import mmap
    import os

    model = tmp_path / "engine" / "weights.bin"
    model.parent.mkdir()
    model.write_bytes(os.urandom(2 << 20))
    other = tmp_path / "engine" / "notes.txt"
    other.write_bytes(os.urandom(1 << 20))
    with open(model, "rb") as f, open(other, "rb") as g:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        n = mmap.mmap(g.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            sum(n[i] for i in range(0, 1 << 20, 4096))  # the other file, every page
            assert lt.mapped_rss_mb(os.getpid(), model.parent) == 0.0
            sum(m[i] for i in range(0, 1 << 20, 4096))  # the model's first 1 MiB, page by page
            assert 1.0 <= lt.mapped_rss_mb(os.getpid(), model.parent) <= 2.0
            assert lt.mapped_rss_mb(os.getpid(), tmp_path / "elsewhere") == 0.0
            assert lt.mapped_rss_mb(os.getpid(), None) == 0.0
        finally:
            m.close()
            n.close()


def test_half_trend_takes_the_in_load_samples_of_the_half() -> None:
    samples = [(0.0, 90.0), (1.0, 100.0), (2.0, 102.0), (3.0, 101.0), (4.0, 106.0), (5.0, 300.0)]
    trend = lt.half_trend(samples, 1.0, 4.5)  # (1, 4.5]: 2, 3 and 4 s; the spike at 5 s is after the load
    assert trend is not None
    low, high = trend.pop("theil_sen_95")
    # Pairwise slopes -1, 2 and 5 MiB/s: the median 2 MiB/s, over the 2 s between the first and last sample 4 MiB.
    assert trend == {"first": 102.0, "last": 106.0, "growth": 4.0, "slope_mib_per_min": 120.0, "samples": 3,
                     "theil_sen_mib_per_min": 120.0, "theil_sen_over_half_mib": 4.0}
    assert -60.0 <= low <= 120.0 <= high <= 300.0
    assert lt.half_trend(samples, 3.5, 4.5) is None  # one sample: no trend


def test_half_trend_theil_sen_ignores_a_spike_least_squares_does_not() -> None:
    """Flat samples with one 10 MiB spike (a matrix copy alive at that moment) near the end of the half."""
    samples = [(float(t), 130.0) for t in range(1, 11)]
    samples[8] = (9.0, 140.0)
    trend = lt.half_trend(samples, 0.0, 10.0)
    assert trend is not None
    assert (trend["theil_sen_mib_per_min"], trend["theil_sen_over_half_mib"], trend["growth"]) == (0.0, 0.0, 0.0)
    # Least squares: mean 131 MiB, so the spike's residual is +9 and every other one −1; the −1s cancel over t̄ = 5.5.
    # Slope = (9 − 5.5) · 10 / Σ(t − 5.5)² = 35 / 82.5 MiB/s = 25.45 MiB/min.
    assert trend["slope_mib_per_min"] == 25.45


def _run_with_trend(samples: list[tuple[float, float]] | None) -> dict[str, object]:
    """A ``run_load`` result reduced to what :func:`repeat_summary` reads: the trend of ``samples`` over (0, 10]."""
    return {"rss_mb": {"anon_trend_second_half": lt.half_trend(samples, 0.0, 10.0) if samples else None}}


def test_repeat_summary_counts_runs_by_where_their_interval_lies() -> None:
    rising = [(float(t), 100.0 + t) for t in range(1, 11)]  # 1 MiB/s: every pairwise slope 1, interval [60, 60]
    flat = [(float(t), 120.0) for t in range(1, 11)]  # interval [0, 0]: includes zero
    noisy = [(float(t), 120.0 + (2.0 if t % 2 else -2.0)) for t in range(1, 11)]  # median slope 0, interval about it
    falling = [(float(t), 200.0 - 0.5 * t) for t in range(1, 11)]
    runs = [_run_with_trend(x) for x in (rising, flat, noisy, falling)] + [_run_with_trend(None)]
    summary = lt.repeat_summary(runs)
    # Theil-Sen growth over the 9 s between the first and the last sample; the run without a trend is left out.
    assert summary == {"growth_mib": [9.0, 0.0, 0.0, -4.5], "median_mib": 0.0,
                       "above_zero": 1, "including_zero": 2, "below_zero": 1}


def test_repeat_below_one_run_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        lt.main(["--nodes", "40", "--repeat", "0"])
    assert exc.value.code == 2
    assert "--repeat must be a positive number of runs, got 0" in capsys.readouterr().err


def test_reused_chat_is_not_rebuilt(tmp_path: Path) -> None:
    first = lt.build_chat(tmp_path, 40, log=lambda _: None)
    again = lt.build_chat(tmp_path, 40, log=lambda _: None)
    assert not first["reused"] and first["embedded_now"] > 0
    assert again["reused"] and again["embedded_now"] == 0 and again["node_count"] == first["node_count"] == 40


def test_memory_per_turn_prints_the_retained_memory_per_turn(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scripts/memory_per_turn.py`` on a small chat: tracing from the first mark, one line per later mark with
    the retained memory and the KiB per turn, then the lines that hold the most."""
    for name in ("MEMORY_RECALL_CONFIG", "MEMORY_RECALL_EMBEDDING__PROVIDER"):  # the script sets them
        monkeypatch.setenv(name, "")
    mpt = load_script("memory_per_turn")
    assert mpt.main(["--messages", "30", "--turns", "2,4,6", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("turn 2: tracing starts; anonymous RSS ")
    assert [line.split(":")[0] for line in out[1:3]] == ["turn 4", "turn 6"]
    assert "KiB per turn since turn 2" in out[1] and "KiB per turn since turn 4" in out[2]
    assert out[3] == "what holds the most of it at turn 6:" and len(out) == 7


def test_parse_arm_reads_a_name_and_its_variables() -> None:
    assert lt.parse_arm("shipped") == lt.Arm("shipped", {})
    # Words as a shell splits them: values may hold '=', ':' and ',' (glibc's tunables, jemalloc's options, a path
    # list), and spaces when quoted.
    arm = lt.parse_arm("tuned GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0 "
                       "MALLOC_CONF=background_thread:true,dirty_decay_ms:1000 'NOTE=two words'")
    assert arm == lt.Arm("tuned", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0",
                                   "MALLOC_CONF": "background_thread:true,dirty_decay_ms:1000",
                                   "NOTE": "two words"})
    assert lt.parse_arm("empty-value X=") == lt.Arm("empty-value", {"X": ""})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arm", "X=1"], "--arm 'X=1': the arm needs a name before its variables"),
        (["--arm", " "], "--arm ' ': the arm needs a name before its variables"),
        (["--arm", "a X"], "--arm 'a X': 'X' is not VAR=VALUE with VAR an environment variable's name"),
        (["--arm", "a 1X=2"], "--arm 'a 1X=2': '1X=2' is not VAR=VALUE with VAR an environment variable's name"),
        (["--arm", "a X=1 X=2"], "--arm 'a X=1 X=2': X is set twice"),
        (["--arm", "a 'X=1"], "--arm \"a 'X=1\": cannot split it into words: No closing quotation"),
        (["--arm", "a", "--arm", "a X=1"], "--arm names must differ, got a, a"),
    ],
)
def test_a_bad_arm_is_a_usage_error_naming_it(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        lt.main(["--nodes", "40", *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(message)


def test_arms_alternate_and_each_runs_its_environment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two rounds of two arms against the real service: the runs alternate a, b, a, b, each service got its arm's
    variables (the heap trimmer off in one, every 0.2 s in the other: the trims its ``GET /v1/memory`` counts at the
    end), and the summary is per arm, over that arm's runs."""
    out = tmp_path / "arms.json"
    code = lt.main(["--nodes", "40", "--clients", "2", "--seconds", "1.5", "--data-dir", str(tmp_path / "chat"),
                    "--repeat", "2", "--out", str(out),
                    "--arm", "untrimmed MEMORY_RECALL_SERVICE__HEAP_TRIM_S=0",
                    "--arm", "trimmed MEMORY_RECALL_SERVICE__HEAP_TRIM_S=0.2"])
    assert code == 0
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert [r["arm"] for r in runs] == ["untrimmed", "trimmed", "untrimmed", "trimmed"]
    assert [r["arm_env"] for r in runs[:2]] == [{"MEMORY_RECALL_SERVICE__HEAP_TRIM_S": "0"},
                                              {"MEMORY_RECALL_SERVICE__HEAP_TRIM_S": "0.2"}]
    trims = [r["service_memory_end"]["heap_trims"] for r in runs]
    assert trims[0] == trims[2] == 0 and trims[1] >= 1 and trims[3] >= 1
    assert list(doc["summary"]) == ["untrimmed", "trimmed"]
    for name, summary in doc["summary"].items():
        mine = [r for r in runs if r["arm"] == name]
        assert summary == lt.repeat_summary(mine)
    printed = capsys.readouterr().out
    assert printed.count("load test [arm untrimmed] started ") == 2
    assert "anonymous RSS over the second half, arm trimmed, 2 runs (Theil-Sen): " in printed
