"""Opt-in pytest plugin: the CPU seconds each test cost, for timing on a shared machine.

Wall-clock durations (``--durations``) move with whatever else the machine runs; CPU time
moves far less. Per test: this process's CPU and its reaped children's (subprocesses run
to their end), and, apart, the CPU of its live children (the test session's Spark JVM,
which py4j starts as a child and no one reaps before the end of the run). Load it with
``PYTHONPATH=$PWD:$PWD/tests .venv/bin/python -m pytest -p support.cpu_times ...``: the
table is printed at the end of the run. A grandchild that outlives its parent (a
`snapmesh reconcile` subprocess's own JVM) is counted by neither column.
"""

from __future__ import annotations

import os

import pytest

from support.processes import proc_stats

_TICK = os.sysconf("SC_CLK_TCK")
_ROWS = pytest.StashKey[list]()


def _live_children_cpu() -> float:
    """utime + stime of this process's live children (/proc/<pid>/stat fields 14, 15)."""
    me = os.getpid()
    return sum((int(fields[11]) + int(fields[12])) / _TICK for _, fields in proc_stats() if int(fields[1]) == me)


def _cpu() -> tuple[float, float]:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system, _live_children_cpu()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ROWS] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201 (a hook wrapper)
    before = _cpu()
    yield
    after = _cpu()
    item.config.stash[_ROWS].append((item.nodeid, after[0] - before[0], after[1] - before[1]))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # noqa: ANN001
    rows = config.stash[_ROWS]
    terminalreporter.write_sep("=", "CPU seconds per test: this process and reaped children, live children (JVM)")
    for nodeid, own, live in rows:
        terminalreporter.write_line(f"{own:8.2f} {live:8.2f}  {nodeid}")
    modules: dict[str, list[float]] = {}
    for nodeid, own, live in rows:
        acc = modules.setdefault(nodeid.split("::")[0], [0.0, 0.0])
        acc[0], acc[1] = acc[0] + own, acc[1] + live
    terminalreporter.write_sep("-", "per module")
    for module, (own, live) in modules.items():
        terminalreporter.write_line(f"{own:8.2f} {live:8.2f}  {module}")
    terminalreporter.write_line(f"{sum(r[1] for r in rows):8.2f} {sum(r[2] for r in rows):8.2f}  all")
