"""Shared pytest wiring. Fixtures live beside the tests that use them; this file
only makes skips impossible to miss."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from helpers_deploy import docker_engine_answers


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
_LEAK_MARKERS = ("snapmesh.cli", "bin/snapmesh", "bench.cluster", "bench.loadgen", "prometheus --config.file")


def _our_processes() -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(marker in cmdline for marker in _LEAK_MARKERS):
            found[int(entry.name)] = cmdline.strip()
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _our_processes()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, {})
    deadline = time.monotonic() + 10  # children get a moment to finish exiting
    while True:
        leaked = {pid: cmd for pid, cmd in _our_processes().items() if pid not in before}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if leaked:
        lines = "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in sorted(leaked.items()))
        print(f"\nLEAKED PROCESSES (started by these tests, still running):\n{lines}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
