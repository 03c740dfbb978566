"""A whole node as one pure machine: the core, its links and its log positions.

`Node` composes `core.Process` (the algorithm), one `link.Sender` per outgoing
channel, one `link.Receiver` per incoming channel, and the log's positions
(last lsn handed out, last lsn durable, the active segment). Events go in as
method calls; what the node wants done comes out of `drain()` as effects. It
never does I/O and never reads a clock: `now` is an argument. The gRPC node
(services/node) and the fault simulator (snapmesh/fuzzer/fuzz.py) drive this
same object.

Events: transfer / submit (an app's command; `reply_to`: answer it with an
effect), reply_batch; start_snapshot / abort_snapshot; connect / disconnect;
opened; received; acked; durable(lsn); tick(now, wall); restore (steps.py
has it and the app's steps). Effects: effects.py.

Rules
-----
N1. One step, one log order. Each event applies to the core and appends its
    records in one call, so the log order is the order the core saw.
N2. Nothing leaves before its record is durable: frames (link L2), acks (L2),
    reports and clients' answers (N11) wait for `durable(lsn)`. A finished
    part is handed out once, with its epoch and wall times (`tick`'s `wall`:
    the cut's, the completion's): `Finished` in the step that logs its last
    marker_recv (so the shell keeps the state before that record can reach
    the disk, and a crash that keeps the record keeps the state too);
    `Report(snapshot_id)` says "send it" once durable. With `log_reports`, a
    `report` record precedes that marker_recv (the shell fills in the part it
    kept at `Finished`), so a log cut short after the marker_recv holds the
    report: the log holds it (wal.Report), resting on that marker_recv.
N3. A recording's `cut` precedes the `marker_recv` that caused it, in the same
    step: a log cut short after the marker_recv always holds the cut.
N4. Abort is logged (so a restart remembers it), as is every
    marker; recovery abandons every snapshot id the log names.
N5. A transfer with a client `request_id` already paid is answered with the
    first answer and sends nothing again; the id is in the `send` record, so
    recovery rebuilds the window (snapmesh/protocol/node/requests.py W1-W6).
N6. A recording older than `recording_ttl` (by `now`) is dropped as an abort.
N7. When the active segment holds `segment_records` records or `segment_bytes` bytes (steps.py's
    `log_size`), the node seals it between two steps and opens the next with a checkpoint
    (one `Seal` effect carries both), so recovery reads only the active segment.
N8. Restore. `restore` moves the node to a newer epoch in one step:
    snapshots in progress are aborted ("restored to S"), the epoch's links and
    outboxes are dropped, the app is restored to its recorded state, and the
    messages recorded in flight towards this node are delivered to it, in
    channel order, as `replay` records after one `restore` record. The links
    start again at seq 1, so nothing of the older epoch can be admitted. A
    repeat for the current epoch is a no-op, an older epoch is refused; a
    restore cut short by a crash (fewer replays logged than announced) is
    redone from the start. The epoch and its fence are epochs.py's, and the
    events that come from an epoch carry it (start_snapshot, opened, restore):
    the node refuses a stale one itself (EpochFenced), and a client's step
    while a restore is redone (Refusal.RESTORING). No shell asks first.
    Its answer is `RestoreReply`, once its records (a repeat's: all logged
    by then) are durable (as N11), and `EndStreams` names the connections
    of the older epoch to end (every channel's); a repeat ends none.
N9. Overtake mode (snapmesh/protocol/overtake.py): at a cut the node keeps, per
    incoming channel, the last seq applied and, per outgoing channel, the
    unacknowledged transfers; they go into the FullState. Each marker also
    leaves early, ahead of queued transfers (link L8); an early marker
    (seq 0) is not logged: only its effect, the cut, is. A restore (N8) keeps
    the mode.
N10. A hosted app (snapmesh.app; `app` given, apphost.py calls it). A
    client's command is one step: the app runs first, and only if it replies
    is one `send` record per message it sent appended, the first carrying the
    command and its reply (none sent: a `command` record); a refusal logs
    nothing. A peer's app message is one
    step: a `recv` record, then its sends. At a cut the app's snapshot() is
    taken in the same step as the `cut` record (which holds its digest) and
    rides in the FullState. Checkpoints carry snapshot(); recovery restores
    it and replays the logged inputs through the app (recovery.py). Every
    node hosts an app (the bank is services/app/bank.py): `app` is required.
N11. A client's answer is an effect. A step given `reply_to` (or a batch's
    `reply_batch`) is answered by `Reply` (`ReplyBatch`) once its lsn is
    durable, carrying whether a restore since the answer took it back
    (epochs.py `taken_back`): then it must be told "not done", never "done".
    The shell only carries the effect to the waiting client.
N12. An app's command is admitted on what it did, known only once it ran: the channels it
    sent on must have room for its sends (link L7), its reply fit `max_reply_bytes`. Else it is
    taken back (apphost.H4) and refused, naming the channel or the size and the limit; one that
    sends nothing, or to channels with room, goes on. A peer's message is never refused.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from snapmesh.protocol.node import apphost, core, requests
from snapmesh.protocol import statedigest, wal
from snapmesh.protocol.node.cutnames import CutNames
from snapmesh.protocol.node.epochs import EpochFenced, EpochState, Fenced  # noqa: F401  (EpochFenced: the shells catch it from here)
from snapmesh.protocol.node.link import DEFAULT_BOUND, DEFAULT_MARK, Entry, Receiver, Sender
from snapmesh.protocol.node.effects import (  # noqa: F401  (re-exported: the drivers name the effects through this module)
    Ack, Append, EndStreams, Effect, Finished, Reply, ReplyBatch, Report, ReportCancelled, RestoreReply, Seal,
    Submitted, Transmit,
)
from snapmesh.protocol.node.steps import DEFAULT_MAX_REPLY_BYTES, DEFAULT_SEGMENT_BYTES, NodeSteps, state_digest  # noqa: F401  (tests name it here)
from snapmesh.protocol.node.recovery import ABANDONED_WINDOW, Recovered

DEFAULT_SEGMENT_RECORDS = 100_000

# -------------------------------------------------------------------- node


class Node(NodeSteps):
    """One node's whole logic (rules N1-N12 above). Drive it from one task."""

    log_reports = False  # N2: a finished part's `report` record follows its last record (the shell sets it)

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
        segment_records: int = DEFAULT_SEGMENT_RECORDS, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        snapshot_mode: str = "classic",
        wall: float | None = None,
        request_ttl_s: float = requests.REQUEST_TTL_S,
        request_capacity: int = requests.REQUEST_CAPACITY,
        reply_window_bytes: int = requests.REPLY_WINDOW_BYTES,
        app: Any = None,
        app_params: Mapping[str, Any] | None = None, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        """`wall`: wall-clock seconds now (for the request-id window, which
        outlives restarts); `now` when not given. `app`: a snapmesh.app.App to
        host (N10, and N12's `max_reply_bytes`), required."""
        incoming, outgoing = tuple(incoming), tuple(outgoing)
        self.node_id = node_id
        if app is None:
            raise TypeError(
                f"Node {node_id!r}: `app` is required (every node hosts an app, N10; the bank is"
                " services/app/bank.py, snapmesh.app.load_app('bank'))"
            )
        self.host: apphost.Host = recovered.host or apphost.Host(
            app, node_id=node_id, incoming=incoming, outgoing=outgoing, params=app_params
        )
        # An app whose snapshot() is not bytes fails here, before anything starts; a blocks app's
        # state is held as its blocks, not joined (apphost.H8): the opening record takes it so.
        opening = self.host.snapshot(as_blocks=True)
        # snapshot id -> the app's state at its cut here (N10), its parts' sizes, its blocks named (cutnames.py)
        # (a BlockState of the app's parts when large, on the grid or off it: never joined, apphost.H8)
        self._app_cuts: dict[str, tuple[Any, tuple[int, ...], Any]] = {}
        self._cut_digests: dict[str, str] = {}  # ... and its digest, as its cut record holds it
        self._cut_names = CutNames()  # names the cut states' blocks, each part once (statedigest.py SD3)
        self.recording_ttl = recording_ttl
        self._mark, self._bound, self.max_reply_bytes = mark, bound, max_reply_bytes
        self.epochs = EpochState(
            node_id, recovered.epoch, recovered.restored, recovered.restore_incomplete
        )
        self.segment_records, self.segment_bytes = segment_records, segment_bytes
        self._abandoned: OrderedDict[str, None] = OrderedDict(recovered.abandoned)
        self.process = core.Process(
            node_id=node_id,
            incoming=incoming,
            outgoing=outgoing,
            abandoned=self._abandoned,
            mode=snapshot_mode,
        )
        self.overtake = snapshot_mode == "overtake"
        self._at_cut: dict[str, tuple[dict[str, int], dict[str, tuple[Entry, ...]]]] = {}
        self._links(incoming, outgoing, recovered)
        self.wall = now if wall is None else wall
        # An id read from a send record is as old as this restart (requests.py W3).
        self._requests = requests.RequestWindow(
            ((rid, p if p.at else p._replace(at=self.wall)) for rid, p in recovered.requests.items()),
            ttl_s=request_ttl_s, capacity=request_capacity, max_bytes=reply_window_bytes,
        )
        self._cuts: OrderedDict[str, int] = OrderedDict(recovered.cuts)  # snapshot id -> lsn of its cut here
        self.last_lsn = self.durable_lsn = recovered.last_lsn
        self.segment_first = recovered.last_lsn - recovered.records + 1 if not recovered.fresh else 1
        self._segment_count, self._segment_size = recovered.records, 0  # records; bytes after its checkpoint (log_size)
        self._recorded_at: dict[str, float] = {}
        self._reports: list[tuple[int, str]] = []  # (lsn it rests on, snapshot id), finished, not yet durable
        self._cut_wall: dict[str, float] = {}  # snapshot id -> wall seconds of its cut here (statistics)
        self.wall_seen = 0.0  # the last wall clock `tick` was given (0: none yet)
        # Client calls waiting for durability (N11): (lsn, to, answer or a batch's answers, is a batch).
        self._waiting: list[tuple[int, object, Any, bool]] = []
        self._out: list[Effect] = []
        self.now = now
        # Counters the shell turns into metrics.
        self.markers_sent = self.markers_received = self.recorded_messages = 0
        self.stale_markers = self.snapshots_completed = self.messages_received = self.messages_sent = 0
        if recovered.fresh:
            # the app's opening state, its base64 made as written
            self._append(wal.Init(lsn=self.last_lsn + 1, state=wal.Packed(opening), **self._stamp()))
        else:
            if recovered.pending_sends:  # the rest of a step a crash cut short: the replay made them again
                self._app_sends(recovered.pending_sends)
            self._restarted(recovered)  # a restart record, after a version record if the version changed

    # -- queries

    request_window_bytes = property(lambda self: self._requests.bytes, doc="Bytes the request-id window holds (W2).")

    def app_state(self) -> bytes:
        """The hosted app's state now (its snapshot())."""
        return self.host.snapshot()

    def drain(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    def next_timer(self) -> float | None:
        if self.recording_ttl is None or not self._recorded_at:
            return None
        return min(self._recorded_at.values()) + self.recording_ttl

    # -- the epoch (N8)

    epoch = property(lambda self: self.epochs.epoch, doc="The cluster epoch this node is in.")
    restored = property(lambda self: self.epochs.restored, doc="The snapshot restored into `epoch`, if any.")
    restore_incomplete = property(lambda self: self.epochs.restore_incomplete, doc="A restore cut short: redo it.")

    def fence(self, epoch: int, what: str = "") -> Fenced | None:
        """Would a call of the cluster's `epoch` go on (epochs.py)? None: yes. A
        query for tests and metrics: the events check it themselves."""
        return self.epochs.fence(epoch, what)

    def fence_clients(self) -> Fenced | None:
        """May a client's command go on (epochs.py)? None: yes."""
        return self.epochs.fence_clients()

    def taken_back(self, answer: Submitted) -> str | None:
        """The snapshot whose restore took back the command `answer` says ran, or
        None (epochs.py): the rule `Reply` carries (N11)."""
        return self.epochs.taken_back(answer.lsn, answer.epoch)

    # -- client events

    def start_snapshot(self, snapshot_id: str, *, epoch: int = 0) -> None:
        """Start `snapshot_id` here, for the controller in `epoch` (0: a caller
        that does not say). Raises EpochFenced, changing nothing, when the fence
        refuses `epoch` (N8)."""
        if epoch:
            self.epochs.check(epoch, f"snapshot {snapshot_id}")
        self._drain(self.process.start_snapshot(snapshot_id))
        self._end_step()

    def abort_snapshot(self, snapshot_id: str, reason: str) -> None:
        self._drain(self.process.abort_snapshot(snapshot_id))
        self._append(wal.Abort(lsn=self.last_lsn + 1, snapshot_id=snapshot_id, reason=reason))
        self._remember(snapshot_id)
        self._recorded_at.pop(snapshot_id, None)
        self._cut_wall.pop(snapshot_id, None)
        self._at_cut.pop(snapshot_id, None)
        self._app_cuts.pop(snapshot_id, None)
        self._cut_digests.pop(snapshot_id, None)
        before = len(self._reports)
        self._reports = [(lsn, s) for lsn, s in self._reports if s != snapshot_id]
        if len(self._reports) != before:
            self._out.append(ReportCancelled(snapshot_id))
        self._end_step()

    def tick(self, now: float, wall: float | None = None) -> None:
        """Time passed: drop recordings older than the ttl (N6). `wall`: the wall
        clock (seconds), which times a cut and a finished part for statistics (N2)."""
        self.now = now
        if wall is not None:
            self.wall_seen = wall
        if self.recording_ttl is None:
            return
        for sid, at in list(self._recorded_at.items()):
            if now - at >= self.recording_ttl and self.process.phase(sid) is core.Phase.RECORDING:
                self.abort_snapshot(sid, f"not finished here within {self.recording_ttl:g}s of recording")

    # -- link events

    def connect(self, dst: str, conn_no: int, resume: int | None = None) -> None:
        """A connection to `dst` opened: resend from the resume point. With
        `resume` (the receiver's answer, when the caller waited for it), start
        after what the receiver already holds."""
        sender = self.senders[dst]
        sender.connect(conn_no)
        if resume is not None:
            sender.on_ack(conn_no, resume)
        self._transmit(sender)

    def disconnect(self, dst: str) -> None:
        self.senders[dst].disconnect()

    def acked(self, dst: str, conn_no: int, seq: int) -> None:
        sender = self.senders[dst]
        if sender.on_ack(conn_no, seq):
            self._transmit(sender)

    def opened(self, src: str, conn_no: int, *, epoch: int = 0) -> None:
        """A connection from `src`, opened in the sender's `epoch`, gets our
        position once durable. Epoch 0 (a sender that does not say, from before
        restores) is epoch 1. Raises EpochFenced, changing nothing, when the
        fence refuses it (N8)."""
        receiver = self.receivers.get(src)
        if receiver is None:
            raise core.RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        self.epochs.check(epoch or 1, f"channel {src}->{self.node_id}")
        if receiver.open(conn_no, self.last_lsn):
            self._ack(receiver)

    def received(
        self, src: str, conn_no: int, seq: int, *, last_seq: int = 0, snapshot_id: str = "", msg_id: str = "",
        payload: bytes | None = None,
    ) -> None:
        """One message of a frame from `src`: an app message (`payload`) or a marker
        (`snapshot_id`; an early one's `last_seq`, link L8). A stale
        or duplicate one is dropped; a gap or a protocol violation raises
        core.RemoteProtocolError; an app that raises on it, core.AppFailed."""
        receiver = self.receivers.get(src)
        if receiver is None:
            raise core.RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        if seq == 0 and snapshot_id and self.overtake:
            self._early_marker(receiver, conn_no, snapshot_id, last_seq=last_seq)
            return
        if not receiver.admit(conn_no, seq):
            return
        me = self.node_id
        if snapshot_id:
            effects = self.process.receive(src=src, message=core.Marker(snapshot_id=snapshot_id))
            self.markers_received += 1
            self._remember(snapshot_id)
            marker = wal.MarkerRecv(lsn=0, snapshot_id=snapshot_id, src=src, dst=me, seq=seq)
            self._drain(effects, marker_recv=marker)
        elif payload is not None:
            self._app_message(src, seq, msg_id or f"{src}:{me}:{seq}", payload)
        else:  # a native transfer (what the bank's former native nodes sent): no app takes it
            raise core.RemoteProtocolError(f"{me} runs app {self.host.app.name!r}: a message from {src!r} without a payload")
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
        if self._waiting:
            self._replies_due()

    # -- internals

    def _links(self, incoming: tuple[str, ...], outgoing: tuple[str, ...], recovered: Recovered | None) -> None:
        """One Sender per outgoing channel, one Receiver per incoming one, where
        `recovered` left them, or at their start (a new epoch: None)."""
        me, r = self.node_id, recovered
        self.senders = {
            dst: Sender(
                src=me, dst=dst, next_seq=r.next_seq[dst] if r else 1, acked=r.acked[dst] if r else 0,
                outbox=r.outbox[dst] if r else [], mark=self._mark, bound=self._bound,
            )
            for dst in outgoing
        }
        self.receivers = {src: Receiver(src=src, dst=me, last_seq=r.last_received[src] if r else 0) for src in incoming}

    def _ack(self, receiver: Receiver) -> None:
        seq = receiver.ack_due(self.durable_lsn)
        if seq is not None:
            self._out.append(Ack(receiver.src, receiver.conn_no, seq))

    def _transmit(self, sender: Sender) -> None:
        while True:
            entries = sender.poll(self.durable_lsn)
            if not entries:
                return
            self._out.append(Transmit(sender.dst, sender.conn_no, tuple(entries)))

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

    def _drain(self, effects: list[core.Effect], *, marker_recv: wal.MarkerRecv | None = None) -> None:
        me = self.node_id
        completed: list[core.FullState] = []
        for effect in effects:
            if isinstance(effect, core.MessageSent):  # a marker: the app's messages leave by _app_sends
                sender = self.senders[effect.dst]
                message = effect.message
                lsn = self.last_lsn + 1
                seq = sender.next_seq
                self._append(wal.MarkerSent(lsn=lsn, snapshot_id=message.snapshot_id, src=me, dst=effect.dst, seq=seq))
                sender.enqueue(lsn=lsn, snapshot_id=message.snapshot_id)
                if self.overtake:
                    sender.notify(lsn=lsn, snapshot_id=message.snapshot_id, last_seq=seq - 1)
                self.markers_sent += 1
            elif isinstance(effect, core.LocalStateRecorded):
                state, parts = self.host.cut()
                digest, named = self._cut_names.digest(state, parts)
                sizes = named.cut[1] if named is not None else tuple(map(len, parts))  # counted once, at the cut
                self._app_cuts[effect.snapshot_id] = (state, sizes, named)
                cut_digest = self._cut_digests[effect.snapshot_id] = statedigest.record_text(digest)
                self._append(wal.Cut(lsn=self.last_lsn + 1, snapshot_id=effect.snapshot_id, digest=cut_digest))
                self._remember(effect.snapshot_id)
                self._cuts[effect.snapshot_id] = self.last_lsn
                if len(self._cuts) > ABANDONED_WINDOW:
                    self._cuts.popitem(last=False)
                self._recorded_at[effect.snapshot_id] = self.now
                self._cut_wall[effect.snapshot_id] = self.wall_seen
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
        logged = self.log_reports  # N2: the report records come first, so the marker_recv after them (N3) keeps them
        if marker_recv is not None and not logged:  # after its cut (N3), before the report that rests on it
            self._append(dataclasses.replace(marker_recv, lsn=self.last_lsn + 1))
        upto = self.last_lsn + (len(completed) + (marker_recv is not None) if logged else 0)  # what a part rests on
        for state in completed:
            self.snapshots_completed += 1
            self._recorded_at.pop(state.snapshot_id, None)
            if self.overtake:
                state = self._with_cut(state)
            app_state, parts, named = self._app_cuts.pop(state.snapshot_id)
            state = dataclasses.replace(state, state=app_state, parts=parts, named=named, **self._stamp())
            self._reports.append((upto, state.snapshot_id))
            cut_wall = self._cut_wall.pop(state.snapshot_id, 0.0)  # a cut from before a restart: unknown
            self._out.append(Finished(state, upto, self.epochs.epoch, _ns(cut_wall), _ns(self.wall_seen),
                                      self._cut_digests.pop(state.snapshot_id, "")))
            if logged:  # after Finished: the shell fills in the part it kept there
                self._append(wal.Report(lsn=self.last_lsn + 1, snapshot_id=state.snapshot_id, upto=upto))
        if marker_recv is not None and logged:
            self._append(dataclasses.replace(marker_recv, lsn=self.last_lsn + 1))

    def _end_step(self) -> None:
        if self._segment_count >= self.segment_records or self._segment_size >= self.segment_bytes:
            self._seal()


def _ns(wall: float) -> int:
    """Wall seconds as the report's nanoseconds (0 stays 0: unknown)."""
    return int(wall * 1e9)
