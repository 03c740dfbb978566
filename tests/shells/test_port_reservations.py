"""Ports drawn by one process are not handed to another drawing at the same time
(snapmesh.settings.ports): two test sessions on one machine used to draw the
port of a node that one of them had killed and was about to restart."""

from __future__ import annotations

import subprocess
import sys

from snapmesh.settings import ports

HOLDER = """
import sys
from snapmesh.settings import ports
assert ports._reservations.take({port})
print("held", flush=True)
sys.stdin.readline()
"""


def test_a_port_held_by_another_process_is_not_taken_until_it_exits():
    port = 1600  # below the range free_ports draws from: no session draws it
    mine = ports._Reservations()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(port=port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not mine.take(port), "a port another live process holds was taken"
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
    assert mine.take(port), "a port whose holder exited stayed locked"


def test_a_process_holds_only_its_newest_draws(monkeypatch):
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
