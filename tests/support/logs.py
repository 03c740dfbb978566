"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

from snapmesh.bank import v1records
from snapmesh.protocol import wal


# p2 starts s1 while p1's transfer of 10 is on the wire: it is in flight on p1->p2.
P1 = [
    v1records.Init(lsn=1, tally=100),
    v1records.Send(lsn=2, msg_id="p1:p2:1", src="p1", dst="p2", seq=1, tally=10),
    wal.MarkerRecv(lsn=3, snapshot_id="s1", src="p2", dst="p1", seq=1),
    v1records.Cut(lsn=4, snapshot_id="s1", tally=90),
    wal.MarkerSent(lsn=5, snapshot_id="s1", src="p1", dst="p2", seq=2),
    v1records.Send(lsn=6, msg_id="p1:p2:3", src="p1", dst="p2", seq=3, tally=5),
]


P2 = [
    v1records.Init(lsn=1, tally=100),
    v1records.Cut(lsn=2, snapshot_id="s1", tally=100),
    wal.MarkerSent(lsn=3, snapshot_id="s1", src="p2", dst="p1", seq=1),
    v1records.Recv(lsn=4, msg_id="p1:p2:1", src="p1", dst="p2", seq=1, tally=10),
    wal.MarkerRecv(lsn=5, snapshot_id="s1", src="p1", dst="p2", seq=2),
    v1records.Recv(lsn=6, msg_id="p1:p2:3", src="p1", dst="p2", seq=3, tally=5),
]
