"""Snapshot bookkeeping for the controller, as a pure object (sans-I/O).

The tracker knows the topology and the money that should exist. It is told when
a snapshot starts, when a node reports its part (a FullState), and what time it
is; it answers with the snapshot as it now stands. It never reads a clock, opens
a socket or sleeps: `now` (seconds since the epoch) is always an argument, and
`next_deadline()` tells the caller when to come back with `expire(now)`.

Rules
-----
T1. A snapshot is IN_PROGRESS from `start` until every node of the topology has
    reported, when it becomes COMPLETE, or until its deadline passes (or the
    caller fails it), when it becomes FAILED. COMPLETE and FAILED are final.
T2. A report is accepted only for an IN_PROGRESS snapshot, from a node of the
    topology that has not reported yet, and must describe exactly the node's
    incoming channels (every one, once, with dst = the node) and only positive
    amounts. A refused report changes nothing.
T3. A COMPLETE snapshot lists every node and every channel of the topology, in
    topology order; total = recorded balances + in-flight amounts; conserved
    means total == expected_total.
T4. A FAILED snapshot's reason names what went wrong: on expiry, the nodes that
    did not report.

Errors: `UnknownSnapshot` (no such id), `InvalidReport` (the report is
malformed for this topology), `DuplicateReport` (this node already reported),
`NotInProgress` (the snapshot already finished). The gRPC servicer maps them to
NOT_FOUND, INVALID_ARGUMENT, ALREADY_EXISTS and FAILED_PRECONDITION.
`TrackerMisuse` is a caller bug (a duplicate snapshot id, an unknown initiator).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from snapmesh.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

IN_PROGRESS = pb.Snapshot.IN_PROGRESS
COMPLETE = pb.Snapshot.COMPLETE
FAILED = pb.Snapshot.FAILED


class TrackerError(Exception):
    """Base of the errors a refused report raises."""


class UnknownSnapshot(TrackerError):
    pass


class InvalidReport(TrackerError):
    pass


class DuplicateReport(TrackerError):
    pass


class NotInProgress(TrackerError):
    pass


class TrackerMisuse(Exception):
    """The caller misused the tracker (its own bug, not a remote's)."""


@dataclass(slots=True)
class _Pending:
    snapshot: pb.Snapshot  # IN_PROGRESS; nodes filled in as reports arrive
    started_at: float
    deadline: float
    reports: dict[str, pb.FullState] = field(default_factory=dict)


class Tracker:
    def __init__(self, *, topology: Topology, expected_total: int, deadline_s: float) -> None:
        if deadline_s <= 0:
            raise TrackerMisuse(f"deadline must be positive, got {deadline_s!r}")
        self.topology = topology
        self.expected_total = expected_total
        self.deadline_s = deadline_s
        self._incoming = {n: set(topology.incoming(n)) for n in topology.nodes}
        self._pending: dict[str, _Pending] = {}
        self._finished: dict[str, pb.Snapshot] = {}

    # -- queries

    def get(self, snapshot_id: str) -> pb.Snapshot:
        if snapshot_id in self._pending:
            return _copy(self._pending[snapshot_id].snapshot)
        if snapshot_id in self._finished:
            return _copy(self._finished[snapshot_id])
        raise UnknownSnapshot(f"no snapshot {snapshot_id!r}")

    def all(self) -> list[pb.Snapshot]:
        """Every known snapshot, ordered by id (ids sort by start time)."""
        ids = sorted([*self._pending, *self._finished])
        return [self.get(i) for i in ids]

    @property
    def in_progress(self) -> int:
        return len(self._pending)

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self._pending.values()), default=None)

    # -- inputs

    def start(self, snapshot_id: str, initiator: str, now: float) -> pb.Snapshot:
        if not snapshot_id:
            raise TrackerMisuse("snapshot id must be non-empty")
        if snapshot_id in self._pending or snapshot_id in self._finished:
            raise TrackerMisuse(f"snapshot {snapshot_id!r} already exists")
        if initiator not in self._incoming:
            raise TrackerMisuse(f"initiator {initiator!r} is not a node of the topology")
        snapshot = pb.Snapshot(
            snapshot_id=snapshot_id,
            initiator=initiator,
            status=IN_PROGRESS,
            expected_total=self.expected_total,
            started_at=_timestamp(now),
        )
        self._pending[snapshot_id] = _Pending(snapshot=snapshot, started_at=now, deadline=now + self.deadline_s)
        return _copy(snapshot)

    def restore(self, snapshot: pb.Snapshot) -> None:
        """Take back a finished snapshot (loaded from disk after a restart)."""
        if snapshot.status not in (COMPLETE, FAILED):
            raise TrackerMisuse(f"snapshot {snapshot.snapshot_id!r} is not finished")
        if not snapshot.snapshot_id or snapshot.snapshot_id in self._pending:
            raise TrackerMisuse(f"cannot restore snapshot {snapshot.snapshot_id!r}")
        self._finished[snapshot.snapshot_id] = _copy(snapshot)

    def report(self, state: pb.FullState, now: float) -> pb.Snapshot:
        """Accept one node's part; returns the snapshot (COMPLETE once all reported)."""
        pending = self._check_report(state)
        pending.reports[state.node_id] = _copy(state)
        pending.snapshot.nodes.add(node_id=state.node_id, balance=state.balance)
        if len(pending.reports) < len(self.topology.nodes):
            return _copy(pending.snapshot)
        return self._complete(pending, now)

    def fail(self, snapshot_id: str, reason: str, now: float) -> pb.Snapshot | None:
        """Fail an IN_PROGRESS snapshot; None if it is unknown or already finished."""
        pending = self._pending.get(snapshot_id)
        if pending is None:
            return None
        return self._finish(pending, FAILED, reason, now)

    def expire(self, now: float) -> list[pb.Snapshot]:
        """Fail every snapshot whose deadline has passed, naming the missing nodes."""
        expired = [p for p in self._pending.values() if p.deadline <= now]
        failed = []
        for pending in sorted(expired, key=lambda p: p.snapshot.snapshot_id):
            missing = [n for n in self.topology.nodes if n not in pending.reports]
            reason = (
                f"deadline of {self.deadline_s:g}s passed; "
                f"no report from {', '.join(missing)} ({len(missing)} of {len(self.topology.nodes)} nodes)"
            )
            failed.append(self._finish(pending, FAILED, reason, now))
        return failed

    # -- internals

    def _check_report(self, state: pb.FullState) -> _Pending:
        if not state.snapshot_id:
            raise InvalidReport("snapshot_id is empty")
        if not state.node_id:
            raise InvalidReport("node_id is empty")
        if state.node_id not in self._incoming:
            raise InvalidReport(f"node {state.node_id!r} is not in the topology")
        finished = self._finished.get(state.snapshot_id)
        if finished is not None:
            if finished.status == COMPLETE:
                raise DuplicateReport(f"snapshot {state.snapshot_id!r} is already complete")
            raise NotInProgress(f"snapshot {state.snapshot_id!r} already failed: {finished.reason}")
        pending = self._pending.get(state.snapshot_id)
        if pending is None:
            raise UnknownSnapshot(f"no snapshot {state.snapshot_id!r}")
        if state.node_id in pending.reports:
            raise DuplicateReport(f"node {state.node_id!r} already reported snapshot {state.snapshot_id!r}")
        if state.balance < 0:
            raise InvalidReport(f"node {state.node_id!r} reported a negative balance {state.balance}")
        expected = self._incoming[state.node_id]
        seen: set[str] = set()
        for channel in state.channels:
            name = f"{channel.src}->{channel.dst}"
            if channel.dst != state.node_id:
                raise InvalidReport(f"node {state.node_id!r} reported channel {name}, which does not end at it")
            if channel.src not in expected:
                raise InvalidReport(f"channel {name} is not in the topology")
            if channel.src in seen:
                raise InvalidReport(f"channel {name} is reported twice")
            seen.add(channel.src)
            for item in channel.in_flight:
                if item.amount <= 0:
                    raise InvalidReport(f"channel {name}: transfer {item.msg_id!r} has amount {item.amount}")
        missing = sorted(expected - seen)
        if missing:
            names = ", ".join(f"{src}->{state.node_id}" for src in missing)
            raise InvalidReport(f"node {state.node_id!r} did not report its incoming channel(s) {names}")
        return pending

    def _complete(self, pending: _Pending, now: float) -> pb.Snapshot:
        snapshot = pending.snapshot
        del snapshot.nodes[:]
        total = 0
        for node in self.topology.nodes:
            balance = pending.reports[node].balance
            snapshot.nodes.add(node_id=node, balance=balance)
            total += balance
        by_channel = {(c.src, c.dst): c for r in pending.reports.values() for c in r.channels}
        for src, dst in self.topology.channels:
            in_flight = by_channel[(src, dst)].in_flight
            snapshot.channels.add(src=src, dst=dst, in_flight=in_flight)
            total += sum(item.amount for item in in_flight)
        snapshot.total = total
        snapshot.conserved = total == self.expected_total
        reason = "" if snapshot.conserved else f"total {total} != expected {self.expected_total}"
        return self._finish(pending, COMPLETE, reason, now)

    def _finish(self, pending: _Pending, status: int, reason: str, now: float) -> pb.Snapshot:
        snapshot = pending.snapshot
        snapshot.status = status
        snapshot.reason = reason
        snapshot.finished_at.CopyFrom(_timestamp(now))
        del self._pending[snapshot.snapshot_id]
        self._finished[snapshot.snapshot_id] = snapshot
        return _copy(snapshot)


def duration_s(snapshot: pb.Snapshot) -> float:
    """Seconds from start to finish (0 while in progress)."""
    if not snapshot.HasField("finished_at"):
        return 0.0
    start = snapshot.started_at.seconds + snapshot.started_at.nanos / 1e9
    end = snapshot.finished_at.seconds + snapshot.finished_at.nanos / 1e9
    return max(0.0, end - start)


def new_snapshot_id(now: float, suffix: Iterable[int]) -> str:
    """A time-ordered id: UTC start time to the microsecond, then a random suffix.

    `suffix` is random bytes from the caller, so ids stay unique across restarts
    and several controllers without the tracker drawing randomness itself.
    """
    micros = int(round(now * 1_000_000))
    whole, fraction = divmod(micros, 1_000_000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(whole))  # formatting only, no clock
    return f"{stamp}.{fraction:06d}Z-{bytes(suffix).hex()}"


def _timestamp(now: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(round(now * 1e9)))
    return ts


def _copy(message):
    clone = type(message)()
    clone.CopyFrom(message)
    return clone
