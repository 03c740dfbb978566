"""bench/results.json is shared by every benchmark: each merges its own keys in."""

from __future__ import annotations

import json
from pathlib import Path

from bench import results
from bench.observe import Sample, busy_fraction


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


def test_busy_fraction_of_the_machine_between_two_samples() -> None:
    start = Sample(at=10.0, metrics={}, cpu={}, machine=100.0)
    end = Sample(at=14.0, metrics={}, cpu={}, machine=106.0)  # 6 busy CPU-seconds in 4 s
    assert busy_fraction(start, end, cores=2) == 0.75
    assert busy_fraction(start, start, cores=2) != busy_fraction(start, start, cores=2)  # no time: NaN, not 0 or 1
