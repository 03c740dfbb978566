"""bench.utilisation: the pace search, run-queue waits from /proc, a snapshot's hop split."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from bench.lab import p99
from bench.utilisation import (JournalRead, Pace, bucket_p99, find_pace, journal_figures, runq_wait_ns, split,
                               split_figures, tail_figures, valid, validity, wait_figures)
from snapmesh.v1 import snapmesh_pb2 as pb


def machine(idle: float, per_rate: float):
    """A machine whose busy fraction grows linearly with the rate, saturating at 1."""
    seen: list[float] = []

    def measure(rate: float) -> float:
        seen.append(rate)
        return min(1.0, idle + per_rate * rate)

    return measure, seen


@pytest.mark.parametrize("target", [0.5, 0.8])
def test_the_search_finds_the_rate_at_the_measured_utilisation_not_a_fraction_of_a_peak(target: float) -> None:
    measure, seen = machine(idle=0.1, per_rate=1e-4)  # 0.5 at 4000/s, 0.8 at 7000/s
    pace = find_pace(measure, target, start=500.0)
    assert pace.found(target) and abs(pace.busy - target) <= 0.05
    assert pace.rate == pytest.approx((target - 0.1) / 1e-4, rel=0.15)
    assert seen[0] == 0.0  # the idle point is measured first
    assert pace.steps <= 5


def test_a_low_first_reading_cannot_push_the_search_into_saturation() -> None:
    measure, seen = machine(idle=0.0, per_rate=1e-6)  # 0.5 needs 500,000/s: far from the start
    pace = find_pace(measure, 0.5, start=100.0, steps=3)
    assert seen[1:] == [100.0, 400.0, 1600.0]  # at most 4x per step
    assert not pace.found(0.5) and pace.rate == 1600.0  # the closest seen, and it says it was not found


def test_a_machine_already_busy_without_load_is_not_paced_up_and_says_the_target_was_missed() -> None:
    measure, seen = machine(idle=0.97, per_rate=1e-4)  # other tenants keep it busy
    pace = find_pace(measure, 0.5, start=1000.0)
    assert seen == [0.0, 1000.0] and pace.rate == 1000.0 and not pace.found(0.5)


def test_a_reading_below_idle_steps_towards_the_target() -> None:
    readings = iter([0.3, 0.2, 0.9, 0.5])  # idle, then a noisy reading under it, then past, then on target
    seen: list[float] = []

    def measure(rate: float) -> float:
        seen.append(rate)
        return next(readings)

    pace = find_pace(measure, 0.5, start=100.0)
    assert seen[:3] == [0.0, 100.0, 400.0] and pace.found(0.5)


def test_the_search_refuses_a_target_it_cannot_mean() -> None:
    measure, _ = machine(0.1, 1e-4)
    with pytest.raises(ValueError, match="between 0 and 1"):
        find_pace(measure, 1.0, start=100.0)
    with pytest.raises(ValueError, match="start rate"):
        find_pace(measure, 0.5, start=0.0)


def test_run_queue_wait_is_field_2_of_schedstat_and_grows_when_processes_outnumber_cores() -> None:
    assert runq_wait_ns(2**31 - 1) == 0  # no such process
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.1)
        before = runq_wait_ns(os.getpid())
        stop = time.perf_counter() + 0.5
        while time.perf_counter() < stop:  # runnable all along, against twice as many spinners as cores
            pass
        assert runq_wait_ns(os.getpid()) > before
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_the_split_is_trigger_to_each_cut_and_last_cut_to_complete() -> None:
    snapshot = pb.Snapshot(stats=pb.SnapshotStats(end_to_end_duration_ms=20.0, nodes=[
        pb.NodeSnapshotStats(node_id="p1", start_delay_ms=2.0), pb.NodeSnapshotStats(node_id="p2", start_delay_ms=9.0)]))
    assert split(snapshot) == ([2.0, 9.0], 11.0)
    figures = split_figures([snapshot, snapshot], p99)
    assert figures == {"trigger_to_cut_p99_ms": 9.0, "trigger_to_last_cut_p99_ms": 9.0,
                       "last_cut_to_complete_p99_ms": 11.0}
    assert wait_figures({"p1": 0.1, "p2": 0.3, "controller": 0.05}) == pytest.approx(
        {"runq_wait_nodes_mean": 0.2, "runq_wait_nodes_max": 0.3, "runq_wait_controller": 0.05})
    assert Pace(1.0, 0.52, 0.1, 2).found(0.5) and not Pace(1.0, 0.6, 0.1, 2).found(0.5)


def test_the_tail_is_split_by_the_node_whose_report_came_in_last() -> None:
    def node(name: str, cut: float, recording: float, report: float) -> pb.NodeSnapshotStats:
        return pb.NodeSnapshotStats(node_id=name, start_delay_ms=cut, recording_duration_ms=recording,
                                    report_time_ms=report)

    # p2 cut last (9 ms) but p1's report came in last (2 + 10 + 5 = 17 ms): the tail is p1's
    snapshot = pb.Snapshot(stats=pb.SnapshotStats(end_to_end_duration_ms=17.0, nodes=[
        node("p1", 2.0, 10.0, 5.0), node("p2", 9.0, 1.0, 1.0)]))
    assert tail_figures([snapshot], p99) == {"last_node_recording_p99_ms": 10.0, "last_node_report_p99_ms": 5.0}
    assert all(math.isnan(v) for v in tail_figures([pb.Snapshot()], p99).values())  # no node stats: no figure


def test_the_journal_figures_are_the_p99_buckets_and_rounds_between_two_reads() -> None:
    inf = float("inf")
    # 100 triggers between the reads: 98 within 1 ms, 2 within 5 ms: the p99 (the 100th) is in the 5 ms bucket
    before = JournalRead(syncs=5, records=7, snapshots=1, waits={
        "trigger": {0.001: 3, 0.005: 3, inf: 3}, "complete": {0.001: 1, 0.005: 1, inf: 1}})
    after = JournalRead(syncs=305, records=607, snapshots=101, waits={
        "trigger": {0.001: 101, 0.005: 103, inf: 103}, "complete": {0.001: 101, 0.005: 101, inf: 101}})
    assert journal_figures(before, after) == pytest.approx({
        "journal_trigger_wait_p99_ms": 5.0, "journal_complete_wait_p99_ms": 1.0,
        "journal_syncs_per_snapshot": 3.0, "journal_records_per_sync": 2.0})
    assert bucket_p99({}, {0.001: 0, inf: 4}) == 0.001  # past the last bound: that bound (at least it)
    assert math.isnan(bucket_p99({0.001: 2, inf: 2}, {0.001: 2, inf: 2}))  # nothing observed between


def test_a_phase_more_than_a_tenth_from_its_target_is_invalid_and_says_so() -> None:
    assert valid(0.58, 0.5) and valid(0.42, 0.5) and valid(0.5, 0.5)
    assert not valid(0.61, 0.5) and not valid(0.92, 0.5) and not valid(float("nan"), 0.5)
    assert validity(0.55, 0.5) == ""
    assert validity(0.92, 0.5) == (" INVALID: the snapshots ran at 92% busy, more than 0.1 from the target 50%; "
                                   "not to be quoted")
