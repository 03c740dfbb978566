"""Shared pytest wiring. Fixtures live beside the tests that use them; this file
only makes skips impossible to miss."""

from __future__ import annotations

import os

# Before anything imports grpc: with gRPC's fork support on, a child forked to
# run a preexec_fn (snapmesh.processes.launcher's death signal) while this process has
# live channels restarts gRPC's poller, whose epoll fd close_fds then closes:
# the child aborts (SIGABRT) before exec, about 1 start in 25 under load
# (grpc/grpc#43055). The tests never use gRPC across a fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import sys  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from support.helpers_deploy import docker_engine_answers  # noqa: E402
from support.lanes import LANES  # noqa: E402
from support.polling import WaitTimedOut, wait_for  # noqa: E402




def pytest_configure(config: pytest.Config) -> None:
    for lane in LANES:  # each lane's conftest.py marks its tests
        config.addinivalue_line("markers", f"{lane}: a test in tests/{lane}/")


def pytest_report_header(config: pytest.Config) -> str:
    engine = "answers" if docker_engine_answers() else "does NOT answer: compose tests will be skipped"
    return f"snapmesh: Docker engine {engine}"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    terminalreporter.write_sep("!", f"{len(skipped)} TEST(S) SKIPPED", red=True, bold=True)
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"SKIPPED {report.nodeid}: {reason}", red=True)


# ---- nothing left behind: a process a test started and did not stop fails the run

_BEFORE = pytest.StashKey[dict]()
_LEAK_MARKERS = ("snapmesh.cli", "bin/snapmesh", "bench.cluster", "bench.loadgen", "prometheus --config.file",
                 "snapmesh.hosts.")  # the multi-host bench's delayers and probes


# Every process this session starts inherits this variable, so a process some
# other job on the machine runs (a long campaign, another checkout's tests) is
# never taken for one of ours, and an orphan of ours is found after reparenting.
_SESSION_VARIABLE = "PYTEST_SNAPMESH_SESSION"


def _our_processes() -> dict[int, str]:
    mark = f"{_SESSION_VARIABLE}={os.environ.get(_SESSION_VARIABLE, '')}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not any(marker in cmdline for marker in _LEAK_MARKERS):
                continue
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        found[int(entry.name)] = cmdline.strip()
    return found


# Under pytest-xdist (`make test` runs the pure lanes on two workers) a worker keeps the
# session variable it inherited from the controller and checks nothing itself: xdist
# ignores a worker's exit status, so the controller, whose check runs once every worker
# has finished, finds the processes any worker's tests left behind.
_WORKER = "PYTEST_XDIST_WORKER"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get(_WORKER):
        return
    os.environ[_SESSION_VARIABLE] = f"{os.getpid()}-{uuid.uuid4().hex}"
    session.config.stash[_BEFORE] = _our_processes()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(_WORKER):
        return
    before = session.config.stash.get(_BEFORE, {})

    def leaked_now() -> dict[int, str]:
        return {pid: cmd for pid, cmd in _our_processes().items() if pid not in before}

    try:  # children get a moment to finish exiting
        leaked = wait_for(leaked_now, until=lambda found: not found, timeout=10, interval=0.2, what="no leaked process")
    except WaitTimedOut:
        leaked = leaked_now()
    if leaked:
        lines = "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in sorted(leaked.items()))
        print(f"\nLEAKED PROCESSES (started by these tests, still running):\n{lines}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
