"""Snapshot bookkeeping for the controller, as a pure object (sans-I/O).

The tracker knows the topology and the app's side (appside.py: `checker`, the
checker of the app the cluster runs, the bank's too: the tracker keeps no figure
of its own and reads no app's fields). It is told when
a snapshot starts, when a node reports its part (a FullState), and what time it
is; it answers with the snapshot as it now stands. It never reads a clock, opens
a socket or sleeps: `now` is always an argument, a `Now` pair of readings: `mono`
(a monotonic clock, for deadlines, so a clock step cannot fire or hold one) and
`wall` (seconds since the epoch, only for displayed timestamps and statistics).
`next_deadline()` tells the caller when (monotonic) to come back with `expire(now)`.

Rules
-----
T1. A snapshot is IN_PROGRESS from `start` until every node of the topology has
    reported, when it becomes COMPLETE, or until its deadline passes (or the
    caller fails it), when it becomes FAILED. COMPLETE and FAILED are final.
T2. A report is accepted only for an IN_PROGRESS snapshot, from a node of the
    topology that has not reported yet, and must describe exactly the node's
    incoming channels (each once, with dst = the node: every one, or with
    `only_recorded_channels` those it recorded messages on, every other one
    empty), and the app's side must find its fields right. A refused report
    changes nothing. A repeat of a report already taken (the same node entry and
    the same recorded messages, an empty channel listed or not: a node retrying
    after a lost answer) is accepted as a duplicate and changes nothing, also once the
    snapshot is COMPLETE; a repeat that differs is refused, naming the node and snapshot.
T3. A COMPLETE snapshot lists every node and every channel of the topology, in
    topology order; the app's side judges it from its states and payloads (fills
    its verdict fields and the reason) before it is final.
T4. A FAILED snapshot's reason names what went wrong: on expiry, the nodes that
    did not report; for a snapshot the controller took back from its journal
    after a restart (`restarted`), it starts with "controller restarted".
T5. Statistics (`Snapshot.stats`, Flink's vocabulary) are derived from the
    reports and the wall-clock times only; they never change a status.
T6. An app cluster (`checker`; snapmesh/protocol/appstate.py): the COMPLETE snapshot keeps
    the nodes' state bytes and in-flight payloads, judged by the app's invariants.
T7. A report costs the tracker its node and the channels it lists, not the node's
    in-degree: a channel left out of a report of recorded channels only is empty.
T8. Completing costs the nodes and the channels that hold messages, not every
    channel: a COMPLETE snapshot is kept compact (channel_list.py), with its
    topology, and every channel is listed (T3) only in what the tracker hands out.
T9. A large state that came as its block list (blockforms.py, `forms`; or whole,
    listed since, BF5) is kept as that list, never as bytes: the snapshot the
    tracker's report, fail and expire give (the machine's effects: answers,
    watchers, files) holds it so (BF1's listed form), what `get` and `all` give
    holds it whole, and the app's invariants read it by block (lazystates.py L3).

Errors: `UnknownSnapshot` (no such id), `InvalidReport` (the report is
malformed for this topology), `DuplicateReport` (this node already reported
something else), `NotInProgress` (the snapshot already failed). The gRPC
servicer maps them to NOT_FOUND, INVALID_ARGUMENT, ALREADY_EXISTS and
FAILED_PRECONDITION.
`TrackerMisuse` is a caller bug (a duplicate snapshot id, an unknown initiator).
"""

from __future__ import annotations

import operator
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from snapmesh.protocol import lazystates, statedigest
from snapmesh.protocol.appstate import without_figures
from snapmesh.protocol.controller.appside import AppSide, PartRefused
from snapmesh.protocol.controller import blockforms, channel_list, reportsize
from snapmesh.protocol.controller.assembly import add_node_stats, incoming, recorded_channels, timestamp
from snapmesh.protocol.controller.assembly import duration_s  # noqa: F401  (the tracker's, as it was)
from snapmesh.protocol.controller.retention import Retention
from snapmesh.protocol.controller.snapshot_ids import new_snapshot_id, snapshot_id_problem  # noqa: F401  (the tracker's ids)
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

IN_PROGRESS = pb.Snapshot.IN_PROGRESS
COMPLETE = pb.Snapshot.COMPLETE
FAILED = pb.Snapshot.FAILED

_SEQ = operator.attrgetter("seq")


class TrackerError(Exception):
    """Base of the errors a refused report raises; `code` names the gRPC status the
    caller gets (as restoregate's decisions do: the shell only looks it up)."""

    code = "FAILED_PRECONDITION"


class UnknownSnapshot(TrackerError):
    code = "NOT_FOUND"


class InvalidReport(TrackerError):
    code = "INVALID_ARGUMENT"


class DuplicateReport(TrackerError):
    code = "ALREADY_EXISTS"


class NotInProgress(TrackerError):
    code = "FAILED_PRECONDITION"


class TrackerMisuse(Exception):
    """The caller misused the tracker (its own bug, not a remote's)."""


class Now(NamedTuple):
    mono: float  # monotonic clock, seconds: deadlines only
    wall: float  # seconds since the epoch: displayed timestamps and statistics only


class Reported(NamedTuple):
    snapshot: pb.Snapshot
    duplicate: bool  # an identical repeat of a report already taken: nothing changed


@dataclass(slots=True)
class _Pending:
    snapshot: pb.Snapshot  # IN_PROGRESS; nodes and stats.nodes filled in as reports arrive
    deadline: float  # monotonic
    restarted: bool = False  # taken back from the journal after a controller restart
    reports: dict[str, pb.FullState] = field(default_factory=dict)
    # Per channel, the seqs dst recorded, read once at the report.
    recorded: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # each report's encoded size, once known (`_fill`)


# The finished snapshots the tracker holds in memory (a bounded working set). Older ones
# leave once they are in their file (`filed`); the controller reads them from
# the store.
FINISHED_KEPT = 1_000


class Tracker:
    def __init__(
        self,
        *,
        topology: Topology,
        deadline_s: float,
        checker: AppSide,  # the app's side (T6); the bank's is its app's AppChecker too
        snapshot_mode: str = "classic",
        kept: int = FINISHED_KEPT,
    ) -> None:
        if deadline_s <= 0:
            raise TrackerMisuse(f"deadline must be positive, got {deadline_s!r}")
        if checker is None:
            raise TrackerMisuse("a tracker needs the checker of the app the cluster runs (the bank's too)")
        self.topology = topology
        self.snapshot_mode = snapshot_mode
        self.deadline_s = deadline_s
        self._incoming = incoming(topology)
        self._channels = channel_list.ChannelList(topology)
        self._pending: dict[str, _Pending] = {}
        self._finished: dict[str, pb.Snapshot] = {}  # in the order they finished (or were loaded)
        self._compact: dict[str, channel_list.ChannelList] = {}  # T8: the COMPLETE ones kept compact, with their channels
        self._filed: set[str] = set()  # finished ones in the store: may leave memory
        self._retention = Retention()  # which of the finished ones `--keep` retires
        self.kept = kept
        self.epoch = 1  # the cluster's epoch: one more per restore; older reports are refused
        self.side: AppSide = checker
        self.forms = blockforms.BlockForms()  # T9: the shell notes listed reports and reads their blocks

    def adopt(self, topology: Topology) -> None:
        """Run on another node set from here on (a rescale's restore starts: no snapshot is pending)."""
        assert not self._pending, "a topology adopted with snapshots pending"
        self.topology = topology
        self._incoming = incoming(topology)
        self._channels = channel_list.ChannelList(topology)

    # -- queries

    def get(self, snapshot_id: str) -> pb.Snapshot:
        if snapshot_id in self._pending:
            return _copy(self._pending[snapshot_id].snapshot)
        if snapshot_id in self._finished:
            return self.forms.whole(self._handed_out(snapshot_id))  # T9: whole to a reader
        raise UnknownSnapshot(f"no snapshot {snapshot_id!r}")

    def listed(self, snapshot_id: str) -> pb.Snapshot:
        """`get`, its large states as block lists (T9): for a reader that leaves them out."""
        if snapshot_id in self._pending:
            return _copy(self._pending[snapshot_id].snapshot)
        if snapshot_id in self._finished:
            return self._handed_out(snapshot_id)
        raise UnknownSnapshot(f"no snapshot {snapshot_id!r}")

    def all(self) -> list[pb.Snapshot]:
        """Every known snapshot, ordered by id (ids sort by start time)."""
        return [self.get(i) for i in self.ids()]

    def ids(self) -> list[str]:
        """Every known snapshot's id, in order."""
        return sorted([*self._pending, *self._finished])

    def status(self, snapshot_id: str) -> int:
        """A known snapshot's status, without copying it."""
        if snapshot_id in self._pending:
            return pb.Snapshot.IN_PROGRESS
        return self._finished[snapshot_id].status

    def finished(self) -> list[pb.Snapshot]:
        """The finished snapshots themselves, not copies (read them, never change
        them; compact, T8): retention scans these on every COMPLETE, and copying every
        kept snapshot there made each completion cost grow with the snapshots kept."""
        return list(self._finished.values())

    @property
    def in_progress(self) -> int:
        return len(self._pending)

    def pending_ids(self) -> list[str]:
        return sorted(self._pending)

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self._pending.values()), default=None)

    # -- inputs

    def start(self, snapshot_id: str, initiator: str, now: Now, *, epoch: int | None = None) -> pb.Snapshot:
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
            started_at=timestamp(now.wall),
            epoch=self.epoch if epoch is None else epoch,
        )
        self._pending[snapshot_id] = _Pending(snapshot=snapshot, deadline=now.mono + self.deadline_s)
        return _copy(snapshot)

    def restarted(self, now: Now) -> list[str]:
        """After a restart, every snapshot still IN_PROGRESS (taken back from the
        journal) gets a fresh deadline from `now`, and fails as "controller
        restarted" if its reports do not come in by then. Returns their ids."""
        for pending in self._pending.values():
            pending.restarted = True
            pending.deadline = now.mono + self.deadline_s
        return sorted(self._pending)

    def filed(self, snapshot_id: str) -> None:
        """`snapshot_id` is in the store: past the `kept` newest finished
        snapshots, the filed ones leave memory (oldest first)."""
        if snapshot_id in self._finished:
            self._filed.add(snapshot_id)
        excess = len(self._finished) - self.kept
        if excess <= 0:
            return
        leaving = []  # found from the oldest on, without copying the working set
        for sid in self._finished:
            if sid in self._filed:
                leaving.append(sid)
                if len(leaving) == excess:
                    break
        for sid in leaving:
            self._retention.remove(sid, self._finished.pop(sid).status == COMPLETE)
            self._filed.discard(sid)
            self._compact.pop(sid, None)

    def retired(self, keep: int, protect: Collection[str] = ()) -> list[str]:
        """`--keep keep`: the finished snapshots in memory older than the `keep` newest
        COMPLETE ones, none of `protect`, that no earlier call returned (the rules,
        retention.py, over `finished()`), in id order."""
        return self._retention.retire(keep, protect)

    def restore(self, snapshot: pb.Snapshot) -> None:
        """Take back a finished snapshot (loaded from disk after a restart; it
        counts as filed, and leaves memory at the next `filed`)."""
        if snapshot.status not in (COMPLETE, FAILED):
            raise TrackerMisuse(f"snapshot {snapshot.snapshot_id!r} is not finished")
        if not snapshot.snapshot_id or snapshot.snapshot_id in self._pending:
            raise TrackerMisuse(f"cannot restore snapshot {snapshot.snapshot_id!r}")
        earlier = self._finished.get(snapshot.snapshot_id)
        if earlier is not None:
            self._retention.remove(snapshot.snapshot_id, earlier.status == COMPLETE)
        self._finished[snapshot.snapshot_id] = _copy(snapshot)
        self._compact.pop(snapshot.snapshot_id, None)  # a file's: every channel listed
        self._retention.add(snapshot.snapshot_id, snapshot.status == COMPLETE)
        self._filed.add(snapshot.snapshot_id)

    def report(self, state: pb.FullState, now: Now) -> Reported:
        """Accept one node's part; returns the snapshot (COMPLETE once all reported)."""
        pending, items = self._check_report(state)
        if pending is None:  # listed (T9): the caller reads nothing of it
            sid = state.snapshot_id
            return Reported(_copy(self._pending[sid].snapshot) if sid in self._pending else self._handed_out(sid),
                            duplicate=True)
        # Kept as it came, not copied: a report is the caller's to hand over (the
        # servicer's request, never touched again), and an app's state in it is
        # the bulk of a snapshot, copied once more into the snapshot at its end.
        pending.reports[state.node_id] = state
        for src, channel_items in items.items():  # the channels reported; the others are empty (T7)
            pending.recorded[(src, state.node_id)] = list(map(_SEQ, channel_items))
        self.side.node(pending.snapshot.nodes.add(node_id=state.node_id), state)
        add_node_stats(pending.snapshot, state, now.wall, list(items.values()))
        if len(pending.reports) < len(self.topology.nodes):
            return Reported(_copy(pending.snapshot), duplicate=False)
        return Reported(self._complete(pending, now), duplicate=False)

    def fail(self, snapshot_id: str, reason: str, now: Now) -> pb.Snapshot | None:
        """Fail an IN_PROGRESS snapshot; None if it is unknown or already finished."""
        pending = self._pending.get(snapshot_id)
        if pending is None:
            return None
        return self._finish(pending, FAILED, reason, now)

    def expire(self, now: Now) -> list[pb.Snapshot]:
        """Fail every snapshot whose deadline has passed, naming the missing nodes."""
        expired = [p for p in self._pending.values() if p.deadline <= now.mono]
        failed = []
        for pending in sorted(expired, key=lambda p: p.snapshot.snapshot_id):
            missing = [n for n in self.topology.nodes if n not in pending.reports]
            absent = f"no report from {', '.join(missing)} ({len(missing)} of {len(self.topology.nodes)} nodes)"
            if pending.restarted:
                reason = f"controller restarted; {absent} within {self.deadline_s:g}s of the restart"
            else:
                reason = f"deadline of {self.deadline_s:g}s passed; {absent}"
            failed.append(self._finish(pending, FAILED, reason, now))
        return failed

    # -- internals

    def _check_report(self, state: pb.FullState) -> tuple[_Pending | None, dict[str, list]]:
        """The snapshot the report belongs to (None for an identical repeat) and each
        channel's items, by source. A protobuf item is a new Python
        object at every access; the lists made here serve every later pass over them."""
        if not state.snapshot_id:
            raise InvalidReport("snapshot_id is empty")
        if not state.node_id:
            raise InvalidReport("node_id is empty")
        if state.node_id not in self._incoming:
            raise InvalidReport(f"node {state.node_id!r} is not in the topology")
        finished = self._finished.get(state.snapshot_id)
        if finished is not None:
            if finished.status == COMPLETE:
                entry = next(n for n in finished.nodes if n.node_id == state.node_id)
                if self._same_part(state, entry, [c for c in finished.channels if c.dst == state.node_id]):
                    return None, {}
                # Overtake: the channels shown were merged from the senders' outboxes too (O3),
                # so a repeat (a call that timed out while held) is known by its entry alone.
                if self.snapshot_mode == "overtake" and \
                        without_figures(blockforms.comparable(self._entry(state))) == \
                        without_figures(blockforms.comparable(entry)):
                    return None, {}
                raise DuplicateReport(
                    f"node {state.node_id!r} already reported snapshot {state.snapshot_id!r} (now complete) "
                    "with a different state"
                )
            raise NotInProgress(f"snapshot {state.snapshot_id!r} already failed: {finished.reason}")
        pending = self._pending.get(state.snapshot_id)
        if pending is None:
            raise UnknownSnapshot(f"no snapshot {state.snapshot_id!r}")
        if state.node_id in pending.reports:
            earlier = pending.reports[state.node_id]
            if self._same_part(state, self._entry(earlier), earlier.channels):
                return None, {}
            raise DuplicateReport(
                f"node {state.node_id!r} already reported snapshot {state.snapshot_id!r} with a different state"
            )
        mode = state.snapshot_mode or "classic"
        if mode != self.snapshot_mode:
            raise InvalidReport(
                f"node {state.node_id!r} runs snapshot_mode {mode!r}, the controller {self.snapshot_mode!r}: "
                "every process must read the same snapshot_mode from the cluster file"
            )
        expected = self._incoming[state.node_id]
        seen: dict[str, list] = {}
        for channel in state.channels:
            name = f"{channel.src}->{channel.dst}"
            if channel.dst != state.node_id:
                raise InvalidReport(f"node {state.node_id!r} reported channel {name}, which does not end at it")
            if channel.src not in expected:
                raise InvalidReport(f"channel {name} is not in the topology")
            if channel.src in seen:
                raise InvalidReport(f"channel {name} is reported twice")
            seen[channel.src] = list(channel.in_flight)
        if mode == "overtake":
            _check_overtake_parts(state, expected)
        if len(seen) < len(expected) and not state.only_recorded_channels:  # seen is a subset of expected
            names = ", ".join(f"{src}->{state.node_id}" for src in sorted(expected - seen.keys()))
            raise InvalidReport(f"node {state.node_id!r} did not report its incoming channel(s) {names}")
        try:
            self.side.part(state, seen)
        except PartRefused as exc:
            raise InvalidReport(str(exc)) from None
        return pending, seen

    def _complete(self, pending: _Pending, now: Now) -> pb.Snapshot:
        """T3 and T8: every node, and only the channels that hold messages, in topology order."""
        snapshot, side = pending.snapshot, self.side
        del snapshot.nodes[:]
        for node in self.topology.nodes:
            pending.sizes[node] = self._fill(snapshot.nodes.add(), pending.reports[node])
        recorded_channels(snapshot.channels, list(pending.reports.values()), pending.recorded, side,
                          self._channels, overtake=self.snapshot_mode == "overtake")
        lazystates.with_reader(self.forms.state, lambda: side.judge(snapshot), self.forms.fold)  # T9: by block
        self._compact[snapshot.snapshot_id] = self._channels
        return self._finish(pending, COMPLETE, snapshot.reason, now)

    def _fill(self, entry: pb.NodeBalance, report: pb.FullState) -> int:
        """Fill a COMPLETE snapshot's entry for the node of `report`: its id, an app's
        state bytes and their digest (T6), then the app's side's fields. The report's
        encoded size (reportsize.py: its state is not encoded again to measure it)."""
        entry.node_id = report.node_id
        size = None
        if (listed := self.forms.of(report)) is not None:  # T9
            self.forms.fill(entry, listed)
            size = reportsize.listed_size(report, listed.size)
        elif report.HasField("state"):
            data, size = reportsize.state_and_size(report)  # each read of a bytes field is a copy: one here
            # of the bytes, in the form the node's cut record holds (statedigest.py SD2): the checks compare the two
            entry.state, entry.state_digest = data, statedigest.of(data, like=report.state_digest)
        self.side.node(entry, report)
        return report.ByteSize() if size is None else size

    def _entry(self, report: pb.FullState) -> pb.NodeBalance:
        entry = pb.NodeBalance()
        self._fill(entry, report)
        return entry

    def _same_part(self, state: pb.FullState, entry: pb.NodeBalance, channels) -> bool:
        """Whether a report records what an earlier one did, kept as `entry` and
        `channels` (timestamps aside). A COMPLETE snapshot's entry and items also
        carry the v1 figures an app's adapter read from their bytes at the verdict
        (appstate.py V3): the bytes are what the node reported, so the figures are
        left out of the comparison where there are bytes."""
        def key(channels):  # an empty channel says nothing a report that leaves it out does not
            return sorted((c.src, without_figures(c).SerializeToString(deterministic=True)) for c in channels if len(c.in_flight))

        mine, theirs = (without_figures(blockforms.comparable(e)) for e in (self._entry(state), entry))  # BF4
        return mine == theirs and key(state.channels) == key(channels)

    def _finish(self, pending: _Pending, status: int, reason: str, now: Now) -> pb.Snapshot:
        snapshot = pending.snapshot
        snapshot.status = status
        snapshot.reason = reason
        snapshot.finished_at.CopyFrom(timestamp(now.wall))
        stats = snapshot.stats
        elapsed_ns = snapshot.finished_at.ToNanoseconds() - snapshot.started_at.ToNanoseconds()
        stats.end_to_end_duration_ms = max(0, elapsed_ns) / 1e6
        stats.state_size_bytes = sum(pending.sizes.get(n) or self._size(r) for n, r in pending.reports.items())
        stats.in_flight_messages = sum(n.in_flight_messages for n in stats.nodes)
        stats.in_flight_bytes = sum(n.in_flight_bytes for n in stats.nodes)
        del self._pending[snapshot.snapshot_id]
        self._finished[snapshot.snapshot_id] = snapshot
        self._retention.add(snapshot.snapshot_id, status == COMPLETE)
        return self._handed_out(snapshot.snapshot_id)  # listed (T9): the effects' answers and files

    def _size(self, report: pb.FullState) -> int:
        """A report's encoded size as it came whole (a listed one's by its block list)."""
        listed = self.forms.of(report)
        return report.ByteSize() if listed is None else reportsize.listed_size(report, listed.size)

    def _handed_out(self, snapshot_id: str) -> pb.Snapshot:
        """A finished snapshot as it leaves the tracker: a copy, every channel listed (T3, T8),
        its listed states as block lists (T9)."""
        snapshot = self._finished[snapshot_id]
        channels = self._compact.get(snapshot_id)
        return _copy(snapshot) if channels is None else channels.expand(snapshot)


def _copy(message):
    clone = type(message)()
    clone.CopyFrom(message)
    return clone


def _check_overtake_parts(state: pb.FullState, incoming: set[str]) -> None:
    """Overtake mode: a position for every incoming channel, an outbox only on the
    node's own outgoing channels, each once, packed seqs positive and increasing
    (T2; the app's side checks its own columns)."""
    node = state.node_id
    positions = {p.src for p in state.positions if p.dst == node}
    if positions != incoming or len(state.positions) != len(incoming):
        raise InvalidReport(f"node {node!r} must report one position per incoming channel, got {sorted(positions)}")
    reported: set[str] = set()
    for channel in [*state.outbox, *state.outbox_runs]:
        if channel.src != node:
            raise InvalidReport(f"node {node!r} reported the outbox of {channel.src}->{channel.dst}, not its own")
        if channel.dst in reported:
            raise InvalidReport(f"node {node!r} reported the outbox of {node}->{channel.dst} twice")
        reported.add(channel.dst)
    for run in state.outbox_runs:
        seqs = list(run.seqs)
        if not all(map(operator.lt, seqs, seqs[1:])) or (seqs and seqs[0] == 0):
            raise InvalidReport(f"outbox_runs {node}->{run.dst}: seqs must be positive and increasing")

