"""Issue 23: work per event that must not grow with history, and the batch
path that must answer exactly as the per-transfer one did."""

from __future__ import annotations

from services.controller.store import past_retention
from services.controller.tracker import Now, Tracker
from snapmesh.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

NODES = ("p1", "p2")


def _tracker_with(finished: int) -> Tracker:
    t = Tracker(topology=Topology.build(NODES, None), expected_total=200, deadline_s=5)
    for i in range(finished):
        sid = f"s{i:04d}"
        t.start(sid, "p1", Now(float(i), 1000.0 + i))
        if i % 3 == 2:
            t.fail(sid, "a node was away", Now(i + 0.5, 1000.5 + i))
        else:
            for node, src in (("p1", "p2"), ("p2", "p1")):
                t.report(pb.FullState(snapshot_id=sid, node_id=node, balance=100,
                                      channels=[pb.ChannelState(src=src, dst=node)]), Now(i + 0.5, 1000.5 + i))
    t.start("running", "p2", Now(99.0, 2000.0))
    return t


def test_retention_scans_the_finished_snapshots_themselves_and_decides_as_before():
    t = _tracker_with(30)
    finished = t.finished()
    assert len(finished) == 30 and all(s.status != pb.Snapshot.IN_PROGRESS for s in finished)
    assert finished[0] is t.finished()[0]  # the tracker's own objects: no copy per COMPLETE
    for keep in (1, 5, 19, 20, 40):
        for protect in ("", "s0001"):
            assert past_retention(finished, keep, protect) == past_retention(t.all(), keep, protect)
    assert past_retention(finished, 5)  # something does go
