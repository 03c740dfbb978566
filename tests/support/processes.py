"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

import subprocess
import threading
import sys
from collections.abc import Iterator
from pathlib import Path

from support.polling import WaitTimedOut, wait_for

REPO = Path(__file__).resolve().parents[2]


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """Each process's pid and its /proc/<pid>/stat fields after the command name (which may
    hold spaces): fields[0] is its state, fields[1] its parent; one gone meanwhile is skipped."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), stat[stat.rindex(")") + 2 :].split()


def children_of(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents = {child: int(fields[1]) for child, fields in proc_stats() if fields[0] != "Z"}
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_gone(pids, timeout: float = 15) -> set[int]:
    """The `pids` still alive after up to `timeout` s: empty once they are all gone."""
    try:
        return wait_for(lambda: {p for p in pids if alive(p)}, until=lambda left: not left, timeout=timeout,
                        what="the processes to end")
    except WaitTimedOut:
        return {p for p in pids if alive(p)}


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    # A thread, not select(): lines the reader already buffered would not wake select.
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert line, f"no line on stdout within {timeout}s"
    return line[0]


def cluster_up(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "snapmesh.cli", "cluster", "up", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
