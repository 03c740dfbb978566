"""`Tracker.retired`, which `--keep` retention asks on every COMPLETE, decides as the
rule over the whole working set did (`past_retention(tracker.finished(), ...)`, each
id once): on random histories of snapshots that complete or fail out of id order,
are filed and leave memory, are restored from disk, under protected ids that
change. A failure prints the seed that reproduces it."""

from __future__ import annotations

import random

import pytest

from snapmesh.sim.retention import due as past_retention  # the fuzzer's own statement of the rule
from snapmesh.protocol.controller.retention import Retention
from snapmesh.protocol.topology import Topology
from snapmesh.protocol.controller.tracker import Now, Tracker
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

NODES = ("p1", "p2")


def _complete(t: Tracker, sid: str, now: Now) -> None:
    for node, src in (("p1", "p2"), ("p2", "p1")):
        t.report(bank.report(sid, node, 100, channels=[pb.ChannelState(src=src, dst=node)]), now)


@pytest.mark.parametrize("seed", range(150))
def test_retired_is_the_rule_over_the_working_set_each_id_once(seed: int) -> None:
    rng = random.Random(seed)
    t = bank.tracker(Topology.build(NODES, None), expected_total=200, deadline_s=5, kept=rng.choice([3, 8, 1000]))
    for i in range(rng.randint(0, 6)):  # loaded from disk after a restart
        t.restore(pb.Snapshot(snapshot_id=f"a{i:03d}", status=rng.choice([pb.Snapshot.COMPLETE, pb.Snapshot.FAILED])))
    keep = rng.choice([1, 2, 4, 10])
    discarded: set[str] = set()  # the engine's bookkeeping before `retired`
    running: list[str] = []
    for step in range(rng.randint(5, 80)):
        now = Now(float(step), 1000.0 + step)
        action = rng.random()
        if action < 0.4 or not running:
            sid = f"s{step:03d}"
            t.start(sid, "p1", now)
            running.append(sid)
        elif action < 0.85:
            sid = running.pop(rng.randrange(len(running)))  # any of them, not the oldest first
            if rng.random() < 0.75:
                _complete(t, sid, now)
            else:
                t.fail(sid, "a node was away", now)
            if rng.random() < 0.8:
                t.filed(sid)
        else:
            finished = [s.snapshot_id for s in t.finished()]
            if finished:
                t.filed(rng.choice(finished))
        candidates = [s.snapshot_id for s in t.finished()][:4]  # up to two protected at once (K1's and K2's)
        protect = tuple(rng.sample(candidates, rng.randint(0, min(2, len(candidates)))))
        expected = [s for s in past_retention(t.finished(), keep, protect) if s not in discarded]
        discarded.update(expected)
        assert t.retired(keep, protect) == expected, f"seed {seed} step {step}"


def test_a_protected_id_stays_until_it_is_no_longer_protected():
    r = Retention()
    for sid in ("a", "b", "c", "d"):
        r.add(sid, complete=True)
    assert r.retire(2, protect=("a",)) == ["b"]
    assert r.retire(2, protect=("a",)) == []
    assert r.retire(2) == ["a"]
    assert r.retire(0) == [] and r.retire(2) == []
