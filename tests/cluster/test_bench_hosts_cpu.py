"""bench.hosts_cpu: which process of the hosts cluster the CPU went to, from /proc."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from bench.hosts_cpu import Proc, descendants, kernel_line, kernel_threads, lines, read, role, split

PY = "/venv/bin/python"


def cpu_s(proc: Proc) -> float:
    return proc.user_s + proc.system_s


@pytest.mark.parametrize("argv, expected", [
    ([PY, "-m", "snapmesh.cli", "node", "--id", "p3", "--config", "c.toml"], ("node", "node p3")),
    ([PY, "-m", "snapmesh.cli", "controller", "--config", "c.toml"], ("controller", "controller")),
    ([PY, "-m", "snapmesh.hosts.delayer", "--queue", "0", "--delay-ms", "5"], ("delayer", "delayer")),
    ([PY, "-m", "bench.loadgen"], ("loadgen", "loadgen")),
    ([PY, "-m", "bench.hosts_cpu", "--rates", "0"], ("bench", "bench")),
    # a node's config path naming a controller does not make it the controller
    ([PY, "-m", "snapmesh.cli", "node", "--id", "p1", "--config", "/tmp/controller/c.toml"], ("node", "node p1")),
])
def test_each_process_of_the_run_is_named_by_its_command_line(argv, expected) -> None:
    assert role(argv) == expected


def test_the_split_sums_each_groups_cpu_over_the_window_and_per_snapshot() -> None:
    before = {1: Proc("node", "node p1", 1.0, 0.5), 2: Proc("node", "node p2", 2.0, 0.0),
              3: Proc("controller", "controller", 0.0, 0.0)}
    after = {1: Proc("node", "node p1", 1.5, 0.7), 2: Proc("node", "node p2", 2.3, 0.1),
             3: Proc("controller", "controller", 0.2, 0.0),
             4: Proc("delayer", "delayer", 0.1, 0.2)}  # started meanwhile: all its CPU is in the window
    groups = split(before, after, seconds=2.0, snapshots=10)
    assert groups["node"]["core"] == pytest.approx((0.7 + 0.4) / 2)
    assert groups["node"]["system"] == pytest.approx(0.3 / 2)
    assert groups["node"]["ms_per_snapshot"] == pytest.approx(110.0)
    assert groups["node"]["processes"] == 2
    assert groups["controller"]["ms_per_snapshot"] == pytest.approx(20.0)
    assert groups["delayer"]["core"] == pytest.approx(0.15)
    assert math.isnan(split(before, after, 2.0, 0)["node"]["ms_per_snapshot"])  # no snapshots: no per-snapshot cost
    text = lines("w", groups, cores=2)
    assert text[0] == "w: ours 0.40 of the machine (0.80 cores)"
    assert text[1].split()[:2] == ["node", "x2"]  # the largest first


def test_a_busy_child_is_found_under_us_and_its_cpu_counted() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nsum(range(30_000_000))\ntime.sleep(30)"])
    try:
        before = read(descendants(os.getpid()))
        assert child.pid in before and os.getpid() in before
        deadline = 100
        while deadline and cpu_s(read([child.pid])[child.pid]) - cpu_s(before[child.pid]) < 0.2:
            deadline -= 1
            subprocess.run(["sleep", "0.05"], check=True)
        assert deadline, "the child's loop shows as its CPU"
    finally:
        child.kill()
        child.wait()


def test_the_kernel_threads_line_names_the_largest_spenders_in_the_window() -> None:
    before = {"ksoftirqd": 1.0, "kworker": 2.0, "jbd2": 0.5}
    after = {"ksoftirqd": 1.4, "kworker": 2.2, "jbd2": 0.5, "kswapd": 0.1}
    assert kernel_line(before, after, seconds=2.0) == (
        "  kernel threads, machine-wide (other work's too): 35.0% of a core "
        "(ksoftirqd 20.0%, kworker 10.0%, kswapd 5.0%)")
    threads = kernel_threads()  # this machine's, read for real
    assert threads and all(not name[-1:].isdigit() for name in threads)  # "kworker/0:1" counts as kworker


def test_the_counts_line_gives_each_node_counter_per_snapshot_and_node() -> None:
    from bench.hosts_cpu import COUNTED, counts_line

    before = {name: 10.0 for name, _ in COUNTED}
    after = {name: 10.0 + 8 * 4 * (i + 1) for i, (name, _) in enumerate(COUNTED)}  # 8 nodes, 4 snapshots
    assert counts_line(before, after, snapshots=4, nodes=8) == (
        "  per snapshot and node: log rounds 1.0, log records 2.0, frames sent 3.0, markers in 4.0")
