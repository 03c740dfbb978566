"""The node's hops of a snapshot's path after its cut (snapmesh/protocol/hops.py), timed for
`snapmesh_snapshot_hop_seconds{node, hop}` (docs/metrics.md).

    recorded   the local cut -> the last marker in (the part finished): the node
               machine's own stamps of both (`cut_at_unix_ns`, `done_at_unix_ns`, the
               wall clock its shell passes in with the monotonic one; one process)
    persisted  the part finished (`StateReporter.keep`) -> everything it rests on
               durable (`send`): the log round that writes the pending-report file
               and the marker_recv record, on this process's monotonic clock
    sent       durable -> the first ReportState call leaves (the reporter's task ran)
    answered   the call leaves -> the controller's answer (a round trip: the way
               there, the controller's journal, the way back; the attempt that
               succeeded). The controller holds a report that does not complete
               its snapshot until the last one is in (its machine's held.py), so
               only the last node's `answered` is on the snapshot's path

Each is one observation per snapshot, on this node. A report resumed after a
restart has no `persisted` or `sent` (its start is in the process before). The
reporter also stamps each attempt's wall time in the report (`sent_at_unix_ns`),
from which the controller times the way there (its hop `received`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.v1 import snapmesh_pb2 as pb


class ReportHops:
    def __init__(self, metrics: NodeMetrics, *, clock: Callable[[], float] = time.monotonic,
                 wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._metrics = metrics
        self._clock = clock
        self._wall_ns = wall_ns
        self._finished_at: dict[str, float] = {}  # snapshot id -> when its part was kept, until it is durable
        self._durable_at: dict[str, float] = {}  # snapshot id -> when it was durable, until its call first leaves

    def finished(self, message: pb.FullState) -> None:
        """The part is finished and kept (not durable yet)."""
        cut, done = message.cut_at_unix_ns, message.done_at_unix_ns
        if cut and done >= cut:  # a cut from before a restart is 0: unknown
            self._observe("recorded", (done - cut) / 1e9)
        self._finished_at[message.snapshot_id] = self._clock()

    def durable(self, snapshot_id: str) -> None:
        """What it rests on is durable: it is handed to the call."""
        now = self._clock()
        finished = self._finished_at.pop(snapshot_id, None)
        if finished is not None:
            self._observe("persisted", now - finished)
            self._durable_at[snapshot_id] = now

    def forget(self, snapshot_id: str) -> None:
        """The part was dropped (an abort) before its call left."""
        self._finished_at.pop(snapshot_id, None)
        self._durable_at.pop(snapshot_id, None)

    def leaving(self, message: pb.FullState) -> float:
        """An attempt of the call is about to leave: the report is stamped with the wall
        time, the first attempt after `durable` times the hop `sent`; the time, for `answered`."""
        message.sent_at_unix_ns = self._wall_ns()
        now = self._clock()
        durable_at = self._durable_at.pop(message.snapshot_id, None)
        if durable_at is not None:
            self._observe("sent", now - durable_at)
        return now

    def answered(self, left_at: float) -> None:
        """The controller accepted the report the attempt that left at `left_at` carried."""
        self._observe("answered", self._clock() - left_at)

    def _observe(self, hop: str, seconds: float) -> None:
        self._metrics.hop(hop).observe(max(0.0, seconds))
