"""Latency at a stated utilisation: the pace search, run-queue waits, and where a snapshot waited.

A latency figure taken with the machine 97% busy measures the CPU queue, not the
protocol (queueing: at utilisation u a queue waits about u / (1 - u) service
times). So these phases do not pace at a fraction of another phase's peak: they
search for the offered rate at which the whole machine is *measured* to be about
`target` busy **while snapshots run** (each step of the search takes back-to-back
snapshots, as the figures do, for one window), then take the snapshots there, and
record beside each figure:

  - the machine's busy fraction while the snapshots ran (`/proc/stat`);
  - each process's run-queue wait, field 2 of `/proc/<pid>/schedstat` (ns spent
    runnable but not running, of its main thread, which runs the event loop a
    marker waits on), as a fraction of the window: a hop's delay splits into
    CPU queueing and the rest;
  - per snapshot, from the controller's statistics: trigger to each node's cut
    (`start_delay_ms`), and the last cut to COMPLETE (the last report accepted);
    that tail split by the node whose report came in last: its recording (its
    cut to its last marker in) and its report's way (done to accepted);
  - from the controller's metrics read before and after: its journal's waits
    (trigger -> Started durable, completing report -> COMPLETE durable; neither
    is in the statistics, which stop at the last report accepted) and rounds.

The search is `find_pace`: pure, it calls `measure(rate) -> busy fraction`, so the
loopback mesh and the phase on hosts search the same way. A search is short (at
most SEARCH_STEPS windows) and cannot promise the target: the busy fraction the
snapshots then ran at decides. A phase more than VALID_WITHIN away from its
target is marked invalid (`util_valid` 0 beside its figures, INVALID in what it
prints): its latencies measure another load than the one named, not to be quoted.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.calls import paced_callers
from bench.observe import machine_busy_s
from snapmesh.checking.scrape import samples

TARGETS = (0.5, 0.8)  # the utilisations the issue states its goals at
TOLERANCE = 0.05  # a pace within this of the target is found
SEARCH_STEPS = 5  # windows at most; each is settle + one window on a shared machine
VALID_WITHIN = 0.1  # snapshots that ran further than this from the target busy fraction: the phase is invalid


def util_suffix(target: float) -> str:
    return f"util{target * 100:.0f}"


def valid(busy: float, target: float) -> bool:
    """Did the snapshots run at the target busy fraction (within VALID_WITHIN)? A nan did not."""
    return abs(busy - target) <= VALID_WITHIN


def validity(busy: float, target: float) -> str:
    """What the output says after a phase's figures: nothing, or that they are not to be quoted."""
    if valid(busy, target):
        return ""
    return (f" INVALID: the snapshots ran at {busy:.0%} busy, more than {VALID_WITHIN:g} from the target "
            f"{target:.0%}; not to be quoted")


@dataclass(frozen=True)
class Pace:
    rate: float  # offered transfers/s in all
    busy: float  # the machine's busy fraction measured at that rate
    idle_busy: float  # ... with no load at all (other tenants, the cluster's own timers)
    steps: int

    def found(self, target: float) -> bool:
        return abs(self.busy - target) <= TOLERANCE


def find_pace(measure: Callable[[float], float], target: float, *, start: float, steps: int = SEARCH_STEPS,
              idle: float | None = None) -> Pace:
    """The offered rate at which `measure` says the machine is `target` busy.

    Busy fraction grows about linearly with the rate until the machine saturates,
    so each step takes the secant through the idle point and the last measurement;
    growth is capped at 4x per step, so a noisy low reading cannot overshoot into
    saturation, where the line no longer holds. Returns the closest pace seen."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target utilisation must be between 0 and 1, got {target}")
    if start <= 0:
        raise ValueError(f"start rate must be positive, got {start}")
    idle_busy = measure(0.0) if idle is None else idle
    if idle_busy >= target - TOLERANCE:
        steps = 1  # busy already with no load (other tenants): no pace reaches the target; say so at `start`
    rate, best = start, None
    for step in range(1, steps + 1):
        busy = measure(rate)
        if best is None or abs(busy - target) < abs(best.busy - target):
            best = Pace(rate, busy, idle_busy, step)
        if abs(busy - target) <= TOLERANCE:
            break
        slope = (busy - idle_busy) / rate
        if slope > 0:
            wanted = (target - idle_busy) / slope
        else:  # noise hid the load's share: step the way the reading points
            wanted = rate * 4 if busy < target else rate / 4
        rate = min(max(wanted, rate / 4), rate * 4)
    assert best is not None
    return Pace(best.rate, best.busy, idle_busy, step)


def runq_wait_ns(pid: int) -> int:
    """Field 2 of /proc/<pid>/schedstat: ns the main thread waited on a run queue (0 if gone)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class RunQueue:
    """Run-queue waits of named processes between `start()` and `stop()`."""

    pids: dict[str, int]
    _start: dict[str, int] = field(default_factory=dict)

    def start(self) -> None:
        self._start = {name: runq_wait_ns(pid) for name, pid in self.pids.items()}

    def stop(self, elapsed_s: float) -> dict[str, float]:
        """Each process's run-queue wait as a fraction of `elapsed_s`."""
        return {name: (runq_wait_ns(pid) - self._start.get(name, 0)) / 1e9 / elapsed_s
                for name, pid in self.pids.items()} if elapsed_s > 0 else {}


RUNQ_FIGURES = ("runq_wait_nodes_mean", "runq_wait_nodes_max", "runq_wait_controller")


def wait_figures(waits: dict[str, float]) -> dict[str, float]:
    """Run-queue wait fractions summed up: the nodes' mean and worst, the controller's."""
    nodes = [v for k, v in waits.items() if k != "controller"]
    return {
        "runq_wait_nodes_mean": sum(nodes) / len(nodes) if nodes else float("nan"),
        "runq_wait_nodes_max": max(nodes, default=float("nan")),
        "runq_wait_controller": waits.get("controller", float("nan")),
    }


def split(snapshot) -> tuple[list[float], float]:
    """A COMPLETE snapshot's statistics: trigger to each node's cut (ms), and from the
    last cut to COMPLETE (ms; the reports' way back and the controller's journal)."""
    cuts = [n.start_delay_ms for n in snapshot.stats.nodes]
    last = max(cuts, default=0.0)
    return cuts, max(0.0, snapshot.stats.end_to_end_duration_ms - last)


def split_figures(snapshots: list, p99: Callable[[list[float]], float]) -> dict[str, float]:
    """p99 over snapshots of: trigger to a node's cut (every node), trigger to the last cut, last cut to COMPLETE."""
    every, last, tail = [], [], []
    for snapshot in snapshots:
        cuts, rest = split(snapshot)
        every += cuts
        last.append(max(cuts, default=0.0))
        tail.append(rest)
    return {"trigger_to_cut_p99_ms": p99(every), "trigger_to_last_cut_p99_ms": p99(last),
            "last_cut_to_complete_p99_ms": p99(tail)}


TAIL_FIGURES = ("last_node_recording_p99_ms", "last_node_report_p99_ms")


def last_node(snapshot):
    """The node whose report completed the snapshot: accepted last (cut + recording + report time), or None."""
    return max(snapshot.stats.nodes, default=None,
               key=lambda n: n.start_delay_ms + n.recording_duration_ms + n.report_time_ms)


def tail_figures(snapshots: list, p99: Callable[[list[float]], float]) -> dict[str, float]:
    """p99 over snapshots of the last node's recording (cut -> last marker in) and report (done -> accepted)."""
    nodes = [n for n in map(last_node, snapshots) if n is not None]
    return {"last_node_recording_p99_ms": p99([n.recording_duration_ms for n in nodes]),
            "last_node_report_p99_ms": p99([n.report_time_ms for n in nodes])}


JOURNAL_STEPS = ("trigger", "complete")
JOURNAL_FIGURES = ("journal_trigger_wait_p99_ms", "journal_complete_wait_p99_ms", "journal_syncs_per_snapshot",
                   "journal_records_per_sync")


@dataclass(frozen=True)
class JournalRead:
    """The controller's journal metrics at one moment (services/controller/metrics.py)."""

    syncs: float
    records: float
    snapshots: float  # finished, COMPLETE or FAILED
    waits: dict[str, dict[float, float]]  # step -> cumulative observations per bucket bound (inf the last)


def read_journal(metrics_address: str) -> JournalRead:
    syncs = records = snapshots = 0.0
    waits: dict[str, dict[float, float]] = {step: {} for step in JOURNAL_STEPS}
    for sample in samples(metrics_address):
        if sample.name == "snapmesh_controller_journal_syncs_total":
            syncs = sample.value
        elif sample.name == "snapmesh_controller_journal_records_total":
            records = sample.value
        elif sample.name == "snapmesh_snapshots_total":
            snapshots += sample.value
        elif sample.name == "snapmesh_controller_journal_wait_seconds_bucket" and sample.labels["step"] in waits:
            waits[sample.labels["step"]][float(sample.labels["le"])] = sample.value
    return JournalRead(syncs, records, snapshots, waits)


def bucket_p99(before: dict[float, float], after: dict[float, float]) -> float:
    """The bound (s) of the histogram bucket holding the nearest-rank 99th percentile of what
    was observed between two reads: the p99 is at most this (nan: nothing observed; past
    the last finite bound: that bound, the p99 is at least it)."""
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(math.inf, 0.0)
    if total <= 0:
        return float("nan")
    rank = min(total, int(0.99 * total) + 1)
    finite = [le for le in counts if le != math.inf]
    return next((le for le in finite if counts[le] >= rank), finite[-1] if finite else float("nan"))


def journal_figures(before: JournalRead, after: JournalRead) -> dict[str, float]:
    """Between two reads: each journal hop's p99 wait (ms, a bucket bound: `bucket_p99`),
    rounds per snapshot finished and records per round."""
    snapshots, syncs = after.snapshots - before.snapshots, after.syncs - before.syncs
    figures = {f"journal_{step}_wait_p99_ms": bucket_p99(before.waits[step], after.waits[step]) * 1e3
               for step in JOURNAL_STEPS}
    figures["journal_syncs_per_snapshot"] = syncs / snapshots if snapshots > 0 else float("nan")
    figures["journal_records_per_sync"] = (after.records - before.records) / syncs if syncs > 0 else float("nan")
    return figures


def busy_over(seconds: float) -> float:
    """The whole machine's busy fraction over the next `seconds`."""
    return busy_while(lambda: time.sleep(seconds))


def busy_while(action: Callable[[], object]) -> float:
    """The whole machine's busy fraction while `action` runs."""
    start, at = machine_busy_s(), time.perf_counter()
    action()
    elapsed = time.perf_counter() - at
    return (machine_busy_s() - start) / (elapsed * (os.cpu_count() or 1)) if elapsed > 0 else float("nan")


def search_on(loadgen, nodes: int, target: float, start: float, settle_s: float, say: Callable[[str], None],
              window_s: float = 3.0, snapshots: Callable[[float], object] | None = None) -> float:
    """`find_pace` with a running load generator (the phase on hosts): the pace found.
    `snapshots(seconds)` takes snapshots back to back for that long: each step is
    measured while they run (None: over a window of the load alone)."""

    def measure(rate: float) -> float:
        if rate > 0:
            loadgen.set(paced_callers(nodes), rate=rate)
        else:
            loadgen.set(0)
        time.sleep(settle_s)
        return busy_over(window_s) if snapshots is None else busy_while(lambda: snapshots(window_s))

    pace = find_pace(measure, target, start=start)
    say(f"  pace {pace.rate:,.0f}/s: {pace.busy:.0%} busy{' with snapshots' if snapshots else ''} (target {target:.0%}"
        f"{'' if pace.found(target) else ', NOT REACHED'}; idle {pace.idle_busy:.0%}, {pace.steps} steps)")
    return pace.rate


class Watch:
    """A supervisor cluster's machine busy fraction and run-queue waits from now to `stop()`."""

    def __init__(self, cluster) -> None:
        self.pids = {n: cluster.node_pid(n) for n in cluster.node_ids}
        self.pids["controller"] = cluster.controller_pid
        self.waits = {name: runq_wait_ns(pid) for name, pid in self.pids.items()}
        self.busy, self.at = machine_busy_s(), time.perf_counter()

    def stop(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.at
        waits = {name: (runq_wait_ns(pid) - self.waits[name]) / 1e9 / elapsed for name, pid in self.pids.items()}
        return {"cpu_busy": (machine_busy_s() - self.busy) / (elapsed * (os.cpu_count() or 1)), **wait_figures(waits)}
