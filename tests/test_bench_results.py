"""bench/results.json is shared by every benchmark: each merges its own keys in."""

from __future__ import annotations

import json
from pathlib import Path

from bench import results
from bench.overtake import _busy_between


def test_merge_keeps_other_benchmarks_keys_and_stamps_the_run(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"reconcile_small_wall_s": 8.453, "unary_rtt_p99_ms": 9.0, "date": "old"}))
    results.merge({"unary_rtt_p99_ms": 1.234567, "snapshots_complete_32n_overtake": 7}, path)
    merged = json.loads(path.read_text())
    assert merged["reconcile_small_wall_s"] == 8.453  # another benchmark's key survives
    assert merged["unary_rtt_p99_ms"] == 1.2346  # replaced, rounded
    assert merged["snapshots_complete_32n_overtake"] == 7
    assert merged["date"] != "old" and merged["date"].endswith("Z")
    assert "cores" in merged["machine"]


def test_merge_starts_a_missing_or_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text("{torn")
    results.merge({"cluster_rate_4n": 1.0}, path)
    assert json.loads(path.read_text())["cluster_rate_4n"] == 1.0


def test_busy_fraction_from_two_proc_stat_readings() -> None:
    assert _busy_between((1000, 400), (2000, 650)) == 0.75  # 250 of 1,000 jiffies idle
    assert _busy_between((0, 0), (0, 0)) != _busy_between((0, 0), (0, 0))  # no reading: NaN, not 0 or 1
