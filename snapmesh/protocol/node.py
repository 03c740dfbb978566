"""A whole node as one pure machine: the core, its links and its log positions.

`Node` composes `core.Process` (the algorithm), one `link.Sender` per outgoing
channel, one `link.Receiver` per incoming channel, and the log's positions
(last lsn handed out, last lsn durable, the active segment). Events go in as
method calls; what the node wants done comes out of `drain()` as effects. It
never does I/O and never reads a clock: `now` is an argument. The gRPC node
(services/node) and the fault simulator (snapmesh/sim/fuzz.py) drive this
same object.

Events                                    Effects
  transfer(dst, amount, request_id)         Append(record)     write it to the log
  start_snapshot / abort_snapshot           Seal(first, next)  seal the active segment
  connect(dst, epoch) / disconnect(dst)     Transmit(dst, epoch, entries)
  opened(src, epoch)                        Ack(src, epoch, seq)
  received(src, epoch, seq, ...)            Finished(state, lsn) keep it safe from a crash, now
  acked(dst, epoch, seq)                    Report(state)      a FullState to the controller
                                            ReportCancelled(snapshot_id)
  durable(lsn)
  tick(now)
  restore(snapshot_id, epoch, balance, in_flight)

Rules
-----
N1. One step, one log order. Each event applies to the core and appends its
    records in one call, so the log order is the order the core saw.
N2. Nothing leaves before its record is durable: frames (link L2), acks (L2)
    and reports wait for `durable(lsn)`. A client's answer carries the lsn the
    caller must see durable before replying. A finished part is handed out
    twice: `Finished` in the step that logs its last marker_recv (so the shell
    keeps the state before that record can reach the disk, and a crash that
    keeps the record keeps the state too: defect 8), `Report` once durable.
N3. A recording's `cut` precedes the `marker_recv` that caused it, in the same
    step: a log cut short after the marker_recv always holds the cut.
N4. Abort is logged (so a restart remembers it, defect 3), as is every
    marker; recovery abandons every snapshot id the log names.
N5. A transfer with a client `request_id` that was already paid is answered
    with the first answer and moves no money; the id is in the `send` record,
    so recovery rebuilds the map (defect 9). The ids are kept by age, across
    checkpoints and restores, as snapmesh/protocol/requests.py says (issue 26).
N6. A recording older than `recording_ttl` (by `now`) is dropped as an abort.
N7. When the active segment holds `segment_records` records, the node seals
    it between two steps and opens the next with a checkpoint (defect 5).
N8. Restore (issue 10). `restore` moves the node to a newer epoch in one step:
    snapshots in progress are aborted ("restored to S"), the epoch's links and
    outboxes are dropped, the balance is set to the recorded one, and the
    transfers recorded in flight towards this node are delivered to it, in
    channel order, as `replay` records after one `restore` record. The links
    start again at seq 1, so nothing of the older epoch can be admitted; the
    shell refuses older-epoch connections. A repeat for the current epoch is a
    no-op, an older epoch is refused; a restore cut short by a crash (fewer
    replays logged than announced) is redone from the start.
N9. Overtake mode (snapmesh/protocol/overtake.py): at a cut the node keeps, per
    incoming channel, the last seq applied and, per outgoing channel, the
    unacknowledged transfers; they go into the FullState. Each marker also
    leaves early, ahead of queued transfers (link L8); an early marker
    (seq 0) is not logged: only its effect, the cut, is. A restore (N8) keeps
    the mode.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable
from types import MappingProxyType
from typing import NamedTuple

from snapmesh.protocol import core, requests, wal
from snapmesh.protocol.link import DEFAULT_BOUND, DEFAULT_MARK, Entry, Receiver, Sender
from snapmesh.protocol.recovery import ABANDONED_WINDOW, Recovered, checkpoint_fields

DEFAULT_SEGMENT_RECORDS = 100_000

# ----------------------------------------------------------------- effects
# NamedTuples: immutable, and cheap to make on the per-message path.


class Append(NamedTuple):
    record: wal.Record


class Seal(NamedTuple):
    """Every record before `next_lsn` belongs to the segment that began at
    `first_lsn`; the record `next_lsn` (a checkpoint) opens the next segment.
    Seal and checkpoint must reach the disk together (the shell writes the
    checkpoint to a new file and renames)."""

    first_lsn: int
    next_lsn: int


class Transmit(NamedTuple):
    dst: str
    conn_no: int  # the connection these frames belong to (link L6)
    entries: tuple[Entry, ...]


class Ack(NamedTuple):
    src: str
    conn_no: int
    seq: int


class Finished(NamedTuple):
    """This node's part of a snapshot is done; `state` rests on the records up
    to `lsn`, which are not durable yet. `Report(state)` follows once they are."""

    state: core.FullState
    lsn: int


class Report(NamedTuple):
    state: core.FullState


class ReportCancelled(NamedTuple):
    snapshot_id: str


Effect = Append | Seal | Transmit | Ack | Finished | Report | ReportCancelled


class Fenced(NamedTuple):
    """Why the node will not take a call now (`Node.fence`, `Node.fence_clients`).
    `stale`: from an older epoch, refused for good; otherwise the caller asks
    again later (a newer epoch, or this node's restore is not finished yet)."""

    stale: bool
    reason: str


class Accepted(NamedTuple):
    """A transfer's answer; reply once `lsn` is durable. `repeated`: a retry."""

    msg_id: str
    balance: int
    lsn: int
    repeated: bool = False


# -------------------------------------------------------------------- node


class Node:
    """One node's whole logic (rules N1-N7 above). Drive it from one task."""

    def __init__(
        self,
        *,
        node_id: str,
        incoming: Iterable[str],
        outgoing: Iterable[str],
        recovered: Recovered,
        now: float = 0.0,
        mark: int = DEFAULT_MARK,
        bound: int = DEFAULT_BOUND,
        recording_ttl: float | None = None,
        segment_records: int = DEFAULT_SEGMENT_RECORDS,
        snapshot_mode: str = "classic",
        wall: float | None = None,
        request_ttl_s: float = requests.REQUEST_TTL_S,
        request_capacity: int = requests.REQUEST_CAPACITY,
    ) -> None:
        """`wall`: wall-clock seconds now (for the request-id window, which
        outlives restarts); `now` when not given."""
        incoming, outgoing = tuple(incoming), tuple(outgoing)
        self.node_id = node_id
        self.recording_ttl = recording_ttl
        self._mark, self._bound = mark, bound
        self.epoch = recovered.epoch
        self.restored = recovered.restored
        self.restore_incomplete = recovered.restore_incomplete
        self.restored_balance = recovered.restored_balance  # right after the last restore (its answer)
        self.segment_records = segment_records
        self._abandoned: OrderedDict[str, None] = OrderedDict(recovered.abandoned)
        self.process = core.Process(
            node_id=node_id,
            balance=recovered.balance,
            incoming=incoming,
            outgoing=outgoing,
            abandoned=self._abandoned,
            mode=snapshot_mode,
        )
        self.overtake = snapshot_mode == "overtake"
        self._at_cut: dict[str, tuple[dict[str, int], dict[str, tuple[Entry, ...]]]] = {}
        self.senders = {
            dst: Sender(
                src=node_id,
                dst=dst,
                next_seq=recovered.next_seq[dst],
                acked=recovered.acked[dst],
                outbox=recovered.outbox[dst],
                mark=mark,
                bound=bound,
            )
            for dst in outgoing
        }
        self.receivers = {src: Receiver(src=src, dst=node_id, last_seq=recovered.last_received[src]) for src in incoming}
        self.wall = now if wall is None else wall
        # An id read from a send record is as old as this restart (requests.py W3).
        self._requests = requests.RequestWindow(
            ((rid, p if p.at else p._replace(at=self.wall)) for rid, p in recovered.requests.items()),
            ttl_s=request_ttl_s,
            capacity=request_capacity,
        )
        self._cuts: OrderedDict[str, int] = OrderedDict(recovered.cuts)  # snapshot id -> lsn of its cut here
        self.last_lsn = recovered.last_lsn
        self.durable_lsn = recovered.last_lsn
        self.segment_first = recovered.last_lsn - recovered.records + 1 if not recovered.fresh else 1
        self._segment_count = recovered.records
        self._recorded_at: dict[str, float] = {}
        self._reports: list[tuple[int, core.FullState]] = []
        self._out: list[Effect] = []
        self.now = now
        # Counters the shell turns into metrics.
        self.markers_sent = self.markers_received = self.recorded_messages = 0
        self.stale_markers = self.snapshots_completed = self.transfers_received = 0
        if recovered.fresh:
            self._append(wal.Init(lsn=self.last_lsn + 1, balance=recovered.balance))
        else:
            self._append(wal.Restart(lsn=self.last_lsn + 1))

    # -- queries

    @property
    def balance(self) -> int:
        return self.process.balance

    def drain(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    def next_timer(self) -> float | None:
        if self.recording_ttl is None or not self._recorded_at:
            return None
        return min(self._recorded_at.values()) + self.recording_ttl

    # -- the epoch fence (N8)

    def fence(self, epoch: int, what: str = "") -> Fenced | None:
        """May a call of the cluster's `epoch` (a snapshot start, a channel's
        open; `what` names it) go on? None: yes. Older than this node's epoch:
        stale, refused for good. Newer, or this node's restore unfinished: not
        yet, it waits until this node has restored."""
        if epoch < self.epoch:
            return Fenced(True, f"{what} is from epoch {epoch}; {self.node_id} is in epoch {self.epoch}")
        if epoch > self.epoch or self.restore_incomplete:
            return Fenced(False, f"{self.node_id} has not restored epoch {epoch} yet")
        return None

    def fence_clients(self) -> Fenced | None:
        """Clients' transfers wait (None: go on) while a restore cut short by a
        crash is redone here: the balance is not the restored one yet."""
        if self.restore_incomplete:
            return Fenced(False, f"{self.node_id} is finishing a restore")
        return None

    # -- client events

    def transfer(
        self, dst: str, amount: int, request_id: str = "", *, wall: float | None = None, first_sent_unix_ms: int = 0
    ) -> Accepted:
        """Pay `amount` to `dst`. Raises core.LocalProtocolError (link.ChannelFull
        when the channel is at its bound; requests.py's refusals for a request id)
        and changes nothing when refused. `wall`: wall-clock seconds now."""
        if request_id:
            if wall is not None:
                self.wall = wall
            first = self._requests.lookup(request_id, self.wall, first_sent_unix_ms)
            if first is not None:
                return Accepted(first.msg_id, first.balance, max(first.lsn, 0), True)
        sender = self.senders.get(dst)
        if sender is not None:
            sender.check_room()
        seq = sender.next_seq if sender is not None else 0
        msg_id = f"{self.node_id}:{dst}:{seq}"
        if sender is not None:  # the hot path: one transfer onto its channel, no effect objects
            self.process.debit(dst=dst, amount=amount)
            lsn = self.last_lsn + 1
            # _append, inline (issue 23: the per-transfer path)
            self.last_lsn = lsn
            self._segment_count += 1
            self._out.append(
                Append(wal.send_record(lsn, msg_id, self.node_id, dst, seq, amount, request_id))
            )
            sender.enqueue(lsn=lsn, amount=amount)
        else:  # no such channel: the core refuses it, naming why
            self._drain(self.process.send_transfer(dst=dst, msg_id=msg_id, amount=amount, seq=seq), request_id=request_id)
        balance = self.process.balance
        if request_id:
            self._requests.paid(request_id, requests.Paid(msg_id, balance, self.wall, self.last_lsn))
        if self._segment_count >= self.segment_records:  # _end_step, inline
            self._seal()
        return Accepted(msg_id, balance, self.last_lsn)

    def start_snapshot(self, snapshot_id: str) -> None:
        self._drain(self.process.start_snapshot(snapshot_id))
        self._end_step()

    def abort_snapshot(self, snapshot_id: str, reason: str) -> None:
        self._drain(self.process.abort_snapshot(snapshot_id))
        self._append(wal.Abort(lsn=self.last_lsn + 1, snapshot_id=snapshot_id, reason=reason))
        self._remember(snapshot_id)
        self._recorded_at.pop(snapshot_id, None)
        self._at_cut.pop(snapshot_id, None)
        before = len(self._reports)
        self._reports = [(lsn, s) for lsn, s in self._reports if s.snapshot_id != snapshot_id]
        if len(self._reports) != before:
            self._out.append(ReportCancelled(snapshot_id))
        self._end_step()

    def tick(self, now: float) -> None:
        """Time passed: drop recordings older than the ttl (N6)."""
        self.now = now
        if self.recording_ttl is None:
            return
        for sid, at in list(self._recorded_at.items()):
            if now - at >= self.recording_ttl and self.process.phase(sid) is core.Phase.RECORDING:
                self.abort_snapshot(sid, f"not finished here within {self.recording_ttl:g}s of recording")

    # -- link events

    def connect(self, dst: str, epoch: int, resume: int | None = None) -> None:
        """A connection to `dst` opened: resend from the resume point. With
        `resume` (the receiver's answer, when the caller waited for it), start
        after what the receiver already holds."""
        sender = self.senders[dst]
        sender.connect(epoch)
        if resume is not None:
            sender.on_ack(epoch, resume)
        self._transmit(sender)

    def disconnect(self, dst: str) -> None:
        self.senders[dst].disconnect()

    def acked(self, dst: str, epoch: int, seq: int) -> None:
        sender = self.senders[dst]
        if sender.on_ack(epoch, seq):
            self._transmit(sender)

    def opened(self, src: str, epoch: int) -> None:
        """A connection from `src` opened; it gets our position once durable."""
        receiver = self.receivers.get(src)
        if receiver is None:
            raise core.RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        if receiver.open(epoch, self.last_lsn):
            self._ack(receiver)

    def received(self, src: str, epoch: int, seq: int, *, amount: int = 0, snapshot_id: str = "", msg_id: str = "") -> None:
        """One message of a frame from `src`. A stale or duplicate one is dropped;
        a gap or a protocol violation raises core.RemoteProtocolError."""
        receiver = self.receivers.get(src)
        if receiver is None:
            raise core.RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        if seq == 0 and snapshot_id and self.overtake:
            self._early_marker(receiver, epoch, snapshot_id, last_seq=amount)
            return
        if not receiver.admit(epoch, seq):
            return
        me = self.node_id
        if snapshot_id:
            effects = self.process.receive(src=src, message=core.Marker(snapshot_id=snapshot_id))
            self.markers_received += 1
            self._remember(snapshot_id)
            marker = wal.MarkerRecv(lsn=0, snapshot_id=snapshot_id, src=src, dst=me, seq=seq)
            self._drain(effects, marker_recv=marker)
        else:
            msg_id = msg_id or f"{src}:{me}:{seq}"
            if not self.process.credit(src=src, amount=amount):  # a snapshot is recording here
                effects = self.process.receive(src=src, message=core.Transfer(msg_id=msg_id, amount=amount, seq=seq))
                if effects:
                    self._drain(effects)
            lsn = self.last_lsn + 1  # _append, inline (issue 23: the per-transfer path)
            self.last_lsn = lsn
            self._segment_count += 1
            self._out.append(Append(wal.recv_record(lsn, msg_id, src, me, seq, amount)))
            self.transfers_received += 1
        receiver.applied(seq, self.last_lsn)

    def end_frame(self) -> None:
        """The end of one frame's messages: a step boundary (segments seal only there)."""
        self._end_step()

    def durable(self, lsn: int) -> None:
        """Records up to `lsn` are on disk: acks, frames and reports may leave."""
        if lsn <= self.durable_lsn:
            return
        self.durable_lsn = lsn
        for receiver in self.receivers.values():
            self._ack(receiver)
        for sender in self.senders.values():
            self._transmit(sender)
        if self._reports and self._reports[0][0] <= lsn:
            ready = [s for at, s in self._reports if at <= lsn]
            self._reports = [(at, s) for at, s in self._reports if at > lsn]
            self._out += [Report(s) for s in ready]

    # -- restore (N8)

    def restore(self, *, snapshot_id: str, epoch: int, balance: int, in_flight: Iterable[tuple[str, str, int, int]]) -> bool:
        """Enter `epoch` holding snapshot `snapshot_id`'s state here: `balance`
        and the recorded in-flight transfers towards this node, each
        (src, msg_id, seq, amount) in channel order. Returns False for a repeat
        (already restored in `epoch`). Raises core.RemoteProtocolError for an
        older epoch or a transfer on a channel that does not exist; nothing
        changes then."""
        if epoch < self.epoch:
            raise core.RemoteProtocolError(f"{self.node_id} is in epoch {self.epoch}; a restore for epoch {epoch} is stale")
        if epoch == self.epoch and not self.restore_incomplete:
            if self.restored and self.restored != snapshot_id:
                raise core.RemoteProtocolError(
                    f"{self.node_id} restored {self.restored!r} in epoch {epoch}, not {snapshot_id!r}"
                )
            return False
        deliveries = list(in_flight)
        for src, msg_id, _, amount in deliveries:
            if src not in self.receivers or amount < 1 or not msg_id:
                raise core.RemoteProtocolError(f"{self.node_id}: cannot replay {msg_id!r} ({amount}) from {src!r}")
        if balance < 0:
            raise core.RemoteProtocolError(f"{self.node_id}: a recorded balance of {balance}")
        reason = f"restored to {snapshot_id}"
        self._requests.restored(self._cuts, snapshot_id)  # the ids paid after its cut were taken back (issue 26.3)
        for sid in self.process.in_progress():
            self._drain(self.process.abort_snapshot(sid))
            self._append(wal.Abort(lsn=self.last_lsn + 1, snapshot_id=sid, reason=reason))
            self._remember(sid)
        for _, state in self._reports:  # finished in the older epoch, not yet reported: the controller would refuse them
            self._out.append(ReportCancelled(state.snapshot_id))
        self._reports = []
        self._recorded_at.clear()
        self._append(
            wal.Restore(lsn=self.last_lsn + 1, snapshot_id=snapshot_id, epoch=epoch, balance=balance, deliveries=len(deliveries))
        )
        me = self.node_id
        for src, msg_id, seq, amount in deliveries:
            self._append(
                wal.Replay(lsn=self.last_lsn + 1, snapshot_id=snapshot_id, msg_id=msg_id, src=src, dst=me, seq=seq, amount=amount)
            )
        incoming, outgoing = tuple(self.receivers), tuple(self.senders)
        self.process = core.Process(
            node_id=me,
            balance=balance + sum(d[3] for d in deliveries),
            incoming=incoming,
            outgoing=outgoing,
            abandoned=self._abandoned,
            mode=self.process.mode,
        )
        self._at_cut.clear()  # the recordings in progress were aborted above
        self.senders = {
            dst: Sender(src=me, dst=dst, next_seq=1, acked=0, outbox=[], mark=self._mark, bound=self._bound)
            for dst in outgoing
        }
        self.receivers = {src: Receiver(src=src, dst=me, last_seq=0) for src in incoming}
        self.epoch, self.restored, self.restore_incomplete = epoch, snapshot_id, False
        self.restored_balance = self.process.balance
        self._end_step()
        return True

    # -- overtake mode (N9)

    def _early_marker(self, receiver: Receiver, epoch: int, snapshot_id: str, *, last_seq: int) -> None:
        """An early marker from `receiver.src`: it closes the channel now (core R6)."""
        if epoch != receiver.epoch:
            return  # from a connection that is gone (L6)
        if receiver.last_seq > last_seq:
            # Past the sender's cut already: the marker's in-band copy (seq last_seq + 1)
            # came first and closed the channel (a resend after a reconnect can overtake
            # an early copy still on the old wire). Applying it now would cut this node
            # after transfers sent past the sender's cut; dropping it is always safe.
            self.stale_markers += 1
            return
        self._drain(self.process.receive(src=receiver.src, message=core.Marker(snapshot_id=snapshot_id)))

    def _keep_cut(self, snapshot_id: str) -> None:
        """At a cut: the positions of the incoming channels, the outboxes' transfers."""
        positions = {src: r.last_seq for src, r in self.receivers.items()}
        # The link's own entries (seq, amount): no object per entry at every cut.
        outbox = {dst: tuple(e for e in s.outbox if not e.snapshot_id) for dst, s in self.senders.items()}
        self._at_cut[snapshot_id] = (positions, outbox)

    def _with_cut(self, state: core.FullState) -> core.FullState:
        positions, outbox = self._at_cut.pop(state.snapshot_id)
        return dataclasses.replace(state, positions=MappingProxyType(positions), outbox=MappingProxyType(outbox))

    # -- internals

    def _ack(self, receiver: Receiver) -> None:
        seq = receiver.ack_due(self.durable_lsn)
        if seq is not None:
            self._out.append(Ack(receiver.src, receiver.epoch, seq))

    def _transmit(self, sender: Sender) -> None:
        while True:
            entries = sender.poll(self.durable_lsn)
            if not entries:
                return
            self._out.append(Transmit(sender.dst, sender.epoch, tuple(entries)))

    def _append(self, record: wal.Record) -> int:
        self.last_lsn = record.lsn
        self._segment_count += 1
        self._out.append(Append(record))
        return record.lsn

    def _remember(self, snapshot_id: str) -> None:
        self._abandoned[snapshot_id] = None
        self._abandoned.move_to_end(snapshot_id)
        if len(self._abandoned) > ABANDONED_WINDOW:
            self._abandoned.popitem(last=False)

    def _drain(self, effects: list[core.Effect], *, request_id: str = "", marker_recv: wal.MarkerRecv | None = None) -> None:
        me = self.node_id
        completed: list[core.FullState] = []
        for effect in effects:
            if isinstance(effect, core.MessageSent):
                sender = self.senders[effect.dst]
                message = effect.message
                lsn = self.last_lsn + 1
                seq = sender.next_seq
                if isinstance(message, core.Transfer):
                    self._append(
                        wal.Send(
                            lsn=lsn, msg_id=message.msg_id, src=me, dst=effect.dst, seq=seq,
                            amount=message.amount, request_id=request_id,
                        )
                    )
                    sender.enqueue(lsn=lsn, amount=message.amount)
                else:
                    self._append(wal.MarkerSent(lsn=lsn, snapshot_id=message.snapshot_id, src=me, dst=effect.dst, seq=seq))
                    sender.enqueue(lsn=lsn, snapshot_id=message.snapshot_id)
                    if self.overtake:
                        sender.notify(lsn=lsn, snapshot_id=message.snapshot_id, last_seq=seq - 1)
                    self.markers_sent += 1
            elif isinstance(effect, core.LocalStateRecorded):
                self._append(wal.Cut(lsn=self.last_lsn + 1, snapshot_id=effect.snapshot_id, balance=effect.balance))
                self._remember(effect.snapshot_id)
                self._cuts[effect.snapshot_id] = self.last_lsn
                if len(self._cuts) > ABANDONED_WINDOW:
                    self._cuts.popitem(last=False)
                self._recorded_at[effect.snapshot_id] = self.now
                if self.overtake:
                    self._keep_cut(effect.snapshot_id)
            elif isinstance(effect, core.ChannelRecorded):
                self.recorded_messages += len(effect.transfers)
            elif isinstance(effect, core.SnapshotCompleted):
                completed.append(effect.state)
            elif isinstance(effect, core.StaleMarkerDropped):
                self.stale_markers += 1
            else:  # pragma: no cover  (a new effect type must be routed here)
                raise TypeError(f"unrouted effect {effect!r}")
        if marker_recv is not None:  # after its cut (N3), before the report that rests on it
            self._append(
                wal.MarkerRecv(
                    lsn=self.last_lsn + 1, snapshot_id=marker_recv.snapshot_id, src=marker_recv.src,
                    dst=marker_recv.dst, seq=marker_recv.seq,
                )
            )
        for state in completed:
            self.snapshots_completed += 1
            self._recorded_at.pop(state.snapshot_id, None)
            if self.overtake:
                state = self._with_cut(state)
            self._reports.append((self.last_lsn, state))
            self._out.append(Finished(state, self.last_lsn))

    def _end_step(self) -> None:
        if self._segment_count >= self.segment_records:
            self._seal()

    def _seal(self) -> None:
        """Close the active segment; open the next with a checkpoint (N7)."""
        state = Recovered(
            balance=self.process.balance,
            next_seq={d: s.next_seq for d, s in self.senders.items()},
            acked={d: s.acked for d, s in self.senders.items()},
            outbox={d: list(s.outbox) for d, s in self.senders.items()},
            last_received={s: r.last_seq for s, r in self.receivers.items()},
            abandoned=self._abandoned,
            requests=self._requests.as_dict(self.wall),
            cuts=self._cuts,
            epoch=self.epoch,
            restored=self.restored,
            restored_balance=self.restored_balance,
        )
        lsn = self.last_lsn + 1
        self._out.append(Seal(self.segment_first, lsn))
        self.segment_first = lsn
        self._segment_count = 0
        self._append(wal.Checkpoint(lsn=lsn, **checkpoint_fields(state)))
