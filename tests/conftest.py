"""Shared pytest wiring. Fixtures live beside the tests that use them; this file
only makes skips impossible to miss."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


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
