"""bench.calls.latency_run: back to back, or one snapshot started every `every_s`."""

from __future__ import annotations

import time

from bench.calls import latency_run
from snapmesh.v1 import snapmesh_pb2 as pb


class Controller:
    """Answers each TriggerSnapshot COMPLETE after `takes_s`, noting when each started."""

    def __init__(self, takes_s: float) -> None:
        self.takes_s = takes_s
        self.started: list[float] = []

    def TriggerSnapshot(self, request, timeout):  # noqa: N802 - the gRPC stub's name
        self.started.append(time.perf_counter())
        time.sleep(self.takes_s)
        return pb.Snapshot(snapshot_id=f"s{len(self.started)}", status=pb.Snapshot.COMPLETE)


def gaps(controller: Controller) -> list[float]:
    return [b - a for a, b in zip(controller.started, controller.started[1:], strict=False)]


def test_back_to_back_starts_each_snapshot_when_the_one_before_ends() -> None:
    controller = Controller(takes_s=0.01)
    slept: list[float] = []
    client, _, failed, _ = latency_run(controller, 5, 10.0, {}, sleep=slept.append)
    assert len(client) == 5 and failed == 0
    assert slept == []  # no wait between them


# Bounds below are one-sided where the machine's load could move them: a sleep never ends
# early, but on a busy machine anything can end late.
def test_every_s_starts_one_snapshot_per_interval_and_times_only_the_snapshot() -> None:
    controller = Controller(takes_s=0.0)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    client, _, failed, _ = latency_run(controller, 5, 10.0, {}, every_s=0.2, sleep=sleep)
    assert len(client) == 5 and failed == 0
    assert all(g >= 0.2 - 0.002 for g in gaps(controller))  # the cadence, not the latency
    assert len(slept) == 4 and all(0 < s <= 0.2 for s in slept)  # no wait before the first
    assert max(client) < 200  # ms: the wait between snapshots is in none of their latencies


def test_a_snapshot_slower_than_the_interval_is_followed_at_once() -> None:
    controller = Controller(takes_s=0.05)
    slept: list[float] = []
    client, _, _, _ = latency_run(controller, 3, 10.0, {}, every_s=0.02, sleep=slept.append)
    assert len(client) == 3 and slept == []


def test_the_cap_stops_the_run_even_between_snapshots() -> None:
    controller = Controller(takes_s=0.0)
    started = time.perf_counter()
    client, _, _, _ = latency_run(controller, 100, 0.25, {}, every_s=0.1)
    assert 1 <= len(client) <= 4 and time.perf_counter() - started < 2.0
