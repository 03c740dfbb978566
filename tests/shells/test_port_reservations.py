"""Ports drawn by one process are not handed to another drawing at the same time
(snapmesh.settings.ports): two test sessions on one machine used to draw the
port of a node that one of them had killed and was about to restart."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from snapmesh.settings import ports

HOLDER = """
import sys
from snapmesh.settings import ports
assert ports._reservations.take({port})
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def own_lock_file(tmp_path, monkeypatch):
    """A lock file of this test's own (tempfile.gettempdir() is where it is found): the
    machine-wide one is shared with every other test session, and one running these very
    tests holds the same fixed ports for as long as it lives."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return dict(os.environ, TMPDIR=str(tmp_path))


def test_a_port_held_by_another_process_is_not_taken_until_it_exits(own_lock_file):
    port = 1600  # below the range free_ports draws from
    mine = ports._Reservations()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(port=port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=own_lock_file)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not mine.take(port), "a port another live process holds was taken"
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
    assert mine.take(port), "a port whose holder exited stayed locked"


def test_a_process_holds_only_its_newest_draws(own_lock_file, monkeypatch):
    monkeypatch.setattr(ports, "HELD_PER_PROCESS", 2)
    mine = ports._Reservations()
    base = 1500
    assert [mine.take(base + i) for i in range(3)] == [True, True, True]
    assert not mine.take(base + 2), "one process was handed the same port twice while it held it"
    assert mine.take(base), "the oldest draw beyond the limit was not let go"


def test_free_ports_are_distinct_and_held():
    drawn = ports.free_ports(8)
    assert len(set(drawn)) == 8
    assert not any(ports._reservations.take(p) for p in drawn), "a drawn port was not held by its process"
