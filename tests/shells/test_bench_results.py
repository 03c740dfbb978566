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


def test_cpu_per_transfer_is_the_whole_machines_busy_cpu_over_the_node_counted_rate() -> None:
    from bench.observe import window_between

    name = "snapmesh_transfers_received_total"
    start = Sample(at=0.0, metrics={name: 1_000.0}, cpu={"nodes": 1.0}, machine=50.0)
    end = Sample(at=2.0, metrics={name: 41_000.0}, cpu={"nodes": 3.0}, machine=53.0)  # 20k/s, 1.5 cores busy
    window = window_between(start, end, [], 0.0)
    assert window.received_per_s == 20_000.0 and window.machine_cores == 1.5
    assert window.cpu_us_per_transfer == 75.0  # 1.5 cores x 1e6 / 20k
    assert window.cpu["other"] == 0.5  # the machine beyond our processes
    idle = window_between(start, start.__class__(at=2.0, metrics=start.metrics, cpu=start.cpu, machine=50.0), [], 0.0)
    assert idle.cpu_us_per_transfer != idle.cpu_us_per_transfer  # no transfers: NaN, not 0


def test_profile_categories_take_the_innermost_named_frame_and_set_waiting_apart(tmp_path: Path) -> None:
    from bench.profile import WAITING, categorize, shares, table

    rpc = "measured (snapmesh/serving/metrics.py:118);NodeServicer.TransferBatch (services/node/servicer.py:83)"
    core = rpc + ";Engine.transfer_batch (services/node/engine.py:90);Node.transfer (snapmesh/protocol/node/machine.py:238)"
    assert categorize(rpc) == "client RPC (servicer, edge)"
    assert categorize(core) == "core + link (pure machine)"  # the innermost frame a rule names
    assert categorize(core + ";send_record (snapmesh/protocol/wal.py:220)") == "core + link (pure machine)"  # making it
    assert categorize(core + ";Engine._run (services/node/engine.py:186);Encoder.record (snapmesh/protocol/wal.py:330)") == (
        "log encode")  # writing it
    assert categorize("_run_once (asyncio/base_events.py:1910);EpollSelector.select (selectors.py:468)") == WAITING
    raw = tmp_path / "raw.txt"
    raw.write_text(f"{core} 3\n{rpc} 1\nThread.run (threading.py:982) 4\n")
    counts, total = shares(raw)
    assert total == 8 and counts[WAITING] == 4
    text = table(counts, total)
    assert "| core + link (pure machine) | 75.0% |" in text and "4 (50% of all)" in text


def test_merge_leaves_a_non_finite_figure_out_and_names_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"cpu_us_per_transfer_4n_peak_one": 12.5, "cluster_rate_4n": 9.0}))
    results.merge({"cpu_us_per_transfer_4n_peak_one": float("nan"), "rate_over_no_time": float("inf"),
                   "cluster_rate_4n": 10.0}, path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    merged = json.loads(text)
    assert merged["cluster_rate_4n"] == 10.0
    assert "cpu_us_per_transfer_4n_peak_one" not in merged  # not the older run's value either
    assert "rate_over_no_time" not in merged
    err = capsys.readouterr().err
    assert "cpu_us_per_transfer_4n_peak_one is nan" in err and "rate_over_no_time is inf" in err
