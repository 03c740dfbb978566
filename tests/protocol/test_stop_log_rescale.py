"""A log that ends in a stop, read on another node set (a rescale): snapmesh/protocol/node/stoplog.py.

p1's log was written on a 4-node mesh and ends in a stop snapshot; the node starts
again on {p1, p2} (p3, p4 removed) or on {p1, ..., p5}. Up to the stop, each
record is read on the channel it names and a checkpoint on its own channels; at
the stop only the topology's channels are kept. The same log without the stop is
still refused on the smaller node set: only a stopped log may change node sets.
"""

from __future__ import annotations

import pytest

from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery

OLD = ("p2", "p3", "p4")


def log(*, checkpoint: bool, stop: bool) -> list[wal.Record]:
    first: wal.Record
    if checkpoint:  # a later segment of the old node set: its channels are p2..p4
        first = wal.Checkpoint(lsn=1, next_seq=dict.fromkeys(OLD, 3), acked=dict.fromkeys(OLD, 2),
                               received=dict.fromkeys(OLD, 4), outbox={d: [] for d in OLD}, abandoned=[], requests={})
        seq, got = 3, 5
    else:
        first, seq, got = wal.Init(lsn=1), 1, 1
    records = [first,
               wal.Send(lsn=2, msg_id=f"p1:p4:{seq}", src="p1", dst="p4", seq=seq, payload=wal.pack(b"5")),
               wal.Recv(lsn=3, msg_id=f"p3:p1:{got}", src="p3", dst="p1", seq=got, payload=wal.pack(b"7"))]
    return records + ([wal.Stop(lsn=4, snapshot_id="S")] if stop else [])


def recover(records, nodes):
    peers = tuple(n for n in nodes if n != "p1")
    return recovery.recover([(f"p1.log:{n}", r) for n, r in enumerate(records, 1)], node_id="p1",
                            incoming=peers, outgoing=peers)


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("nodes", [("p1", "p2"), ("p1", "p2", "p3", "p4", "p5")])
def test_a_stopped_log_starts_on_another_node_set_with_the_topologys_channels(checkpoint, nodes):
    state = recover(log(checkpoint=checkpoint, stop=True), nodes)
    peers = [n for n in nodes if n != "p1"]
    assert state.stopped == "S"
    assert sorted(state.next_seq) == sorted(state.acked) == sorted(state.outbox) == sorted(state.last_received) == peers
    if "p4" in peers:  # a kept channel keeps what the log says of it until the restore starts it over
        assert state.next_seq["p4"] == (4 if checkpoint else 2)
    assert state.next_seq.get("p5", 1) == 1 and state.last_received.get("p5", 0) == 0


def test_without_the_stop_another_node_set_is_still_a_corrupt_log():
    with pytest.raises(recovery.CorruptLog, match=r"p1.log:2: send on p1->p4, not a channel out of p1"):
        recover(log(checkpoint=False, stop=False), ("p1", "p2"))
    with pytest.raises(recovery.CorruptLog, match=r"checkpoint next_seq names channels"):
        recover(log(checkpoint=True, stop=False), ("p1", "p2"))
