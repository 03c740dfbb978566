"""The node machine's steps that change what the node holds wholesale or host
an app: restore (node rule N8) and the hosted app's steps (N10); and the
node's rarer paths: overtake mode's cut (N9), clients' answers (N11) and
sealing a segment (N7). A mixin of `node.Node`, split out to keep one module
per concern short; it reads and writes the node's own fields, never anything else."""

from __future__ import annotations

import dataclasses
import hashlib
from operator import attrgetter
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

from snapmesh.protocol.node import core, requests
from snapmesh.protocol import blockstate, fastrecords, wal
from snapmesh.protocol.node.link import Receiver
from snapmesh.protocol.node.effects import (
    Append, EndStreams, Reply, ReplyBatch, ReportCancelled, RestoreReply, Seal, Submitted, fast_new,
)
from snapmesh.protocol.node.recovery import Recovered, checkpoint_fields

# An app's longest reply (node rule N12), as services/node's longest command: a
# reply is logged (base64, 4/3 of it) before it leaves, kept for retries in the
# request-id window, and must fit the 4 MiB a gRPC client takes by default.
DEFAULT_MAX_REPLY_BYTES = 1024 * 1024

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024  # a segment's bytes after its checkpoint (log_size, N7)
_EPOCH = attrgetter("epoch")  # a batch's answers' epochs, read at C speed (a batch holds up to 10,000)

class NodeSteps:
    """Mixed into `node.Node`: these methods use its fields (`process`, `senders`, `host`, ...)."""

    stopped = ""  # the stop snapshot the log ends in (`stop`; a restart's Recovered.stopped) until a restore
    last_command = 0  # the lsn of the last client command logged (-1: not known, an older log's checkpoint), F7

    # -- restore (N8)

    def restore(
        self, *, snapshot_id: str, epoch: int, in_flight: Iterable[tuple], state: bytes | None = None,
        reply_to: object = None,
    ) -> bool:
        """Enter `epoch` holding snapshot `snapshot_id`'s state here: the app's
        `state` bytes and the recorded in-flight messages towards this node,
        each (src, msg_id, seq, 0, payload) in channel order. Returns False for a repeat (already restored in `epoch`). Raises
        core.RemoteProtocolError for an older epoch, a message on a channel that
        does not exist or a state that does not fit the node; nothing changes
        then. `reply_to`: answer it by `RestoreReply` once durable (N8)."""
        deliveries = [d if len(d) == 5 else (*d, None) for d in in_flight]
        if not isinstance(state, bytes | blockstate.BlockState):  # BlockState: rebuilt as blocks (apphost.H3)
            raise core.RemoteProtocolError(f"{self.node_id}: a restore without app state for a node that runs an app")
        if not self.epochs.takes_restore(epoch, snapshot_id, deliveries, self.receivers):
            self._restore_reply(reply_to)  # the first call's records may not be durable yet
            return False
        reason = f"restored to {snapshot_id}"
        self.stopped = ""  # the stop snapshot's log is carried on: segments seal again
        self._requests.restored(self._cuts, snapshot_id)  # the ids paid after its cut were taken back
        for sid in self.process.in_progress():
            self._drain(self.process.abort_snapshot(sid))
            self._append(wal.Abort(lsn=self.last_lsn + 1, snapshot_id=sid, reason=reason))
            self._remember(sid)
        for _, sid in self._reports:  # finished in the older epoch, not yet reported: the controller would refuse them
            self._out.append(ReportCancelled(sid))
        self._reports = []
        self._recorded_at.clear()
        self._cut_wall.clear()
        self.host.restore(state)  # H3: the old instance stays if this raises
        self._append(
            wal.Restore(
                lsn=self.last_lsn + 1, snapshot_id=snapshot_id, epoch=epoch, deliveries=len(deliveries),
                state=wal.Packed(state) if state is not None else "",  # its base64 made as written
            )
        )
        me = self.node_id
        incoming, outgoing = tuple(self.receivers), tuple(self.senders)
        self._links(incoming, outgoing, None)  # before the replays: an app's replies go on the new epoch's links
        for src, msg_id, seq, _, payload in deliveries:
            self._append(
                wal.Replay(
                    lsn=self.last_lsn + 1, snapshot_id=snapshot_id, msg_id=msg_id, src=src, dst=me, seq=seq,
                    payload=wal.pack(payload),
                )
            )
            self._app_sends(self.host.message(src, payload))
        self.process = core.Process(
            node_id=me,
            incoming=incoming,
            outgoing=outgoing,
            abandoned=self._abandoned,
            mode=self.process.mode,
        )
        self._at_cut.clear()  # the recordings in progress were aborted above
        self._app_cuts.clear()
        self._cut_digests.clear()
        self.epochs.entered(epoch, snapshot_id, cut=self._cuts.get(snapshot_id))
        # Every link was replaced: a connection of the older epoch must carry nothing more.
        self._out.append(EndStreams(outgoing, incoming, f"{me} restored {snapshot_id} in epoch {epoch}"))
        self._end_step()
        self._restore_reply(reply_to)
        return True

    def _restore_reply(self, to: object) -> None:
        """The restore's answer, once all logged so far is durable (N8)."""
        if to is not None:
            answer = RestoreReply(to, self.epochs.epoch)
            self._wait_or_reply((self.last_lsn, to, answer, False))

    # -- the hosted app (N10)

    def submit(
        self, command: bytes, request_id: str = "", *, wall: float | None = None, first_sent_unix_ms: int = 0,
        reply_to: object = None,
    ) -> Submitted:
        """A client's command to the hosted app (N10), one step. Raises
        core.AppRefusal when the app refuses or raises, link.ChannelFull when a
        channel it sent on has no room for it and REPLY_TOO_LARGE (N12),
        requests.py's refusals for a request id, RESTORING while a restore is
        redone; nothing changes then, the app included (apphost.H4). A retry
        of `request_id` gets the first reply. `reply_to`: answer it by `Reply` (N11).
        Raises core.AppFailed when the app cannot be put back: the node must stop."""
        epochs = self.epochs
        if epochs.restore_incomplete:
            epochs.check_clients()
        host = self.host
        if type(command) is not bytes:
            if not isinstance(command, bytes | bytearray):
                raise core.LocalProtocolError(f"a command is bytes, got {type(command).__name__}")
            command = bytes(command)
        digest = ""
        if request_id:
            digest = requests.command_digest(command)
            first = self._retried(request_id, wall, first_sent_unix_ms, digest)
            if first is not None:  # the first reply, in the epoch it ran in (requests.py W6)
                answer = Submitted(wal.unpack(first.msg_id, request_id), max(first.lsn, 0), True, epochs.epoch,
                                   ran_in=first.epoch, first_seq=first.first_seq)
                return self._reply_when_durable(reply_to, answer)
        reply, sends = host.command(command, self._admit)
        packed = wal.pack(reply) if reply else ""
        lsn = self.last_command = self.last_lsn + 1  # _append, inline (the per-command path)
        first_seq = 0
        if sends:
            first_seq = self.senders[sends[0][0]].next_seq
            self._step_sends(lsn, request_id, wal.pack(command), packed, sends)
        else:
            self.last_lsn = lsn
            self._segment_count += 1
            self._out.append(fast_new(Append, (fastrecords.command_record(lsn, request_id, wal.pack(command), packed),)))
        if request_id:
            # An app's Paid holds its reply (base64) where an old native log's held the msg id.
            self._requests.paid(request_id, requests.Paid(packed, first_seq, self.wall, lsn, digest, epochs.epoch))
        if self._segment_count >= self.segment_records or self._segment_size >= self.segment_bytes:  # _end_step, inline
            self._seal()
        epoch = epochs.epoch
        # The channels it sent on, each once (flow control); one send, the common case, without a dict.
        sent_to = (sends[0][0],) if len(sends) == 1 else tuple(dict.fromkeys(dst for dst, _ in sends))
        answer = fast_new(Submitted, (reply, self.last_lsn, False, epoch, sent_to, epoch, first_seq))
        return answer if reply_to is None else self._reply_when_durable(reply_to, answer)

    def submit_many(
        self, items: Iterable[tuple[str, bytes, int]], wall: float | None = None,
    ) -> list[Submitted | core.LocalProtocolError]:
        """Each (request_id, command, first_sent_unix_ms) of `items`, in order, exactly as
        `submit(command, request_id, wall=wall, first_sent_unix_ms=...)` takes it: its
        answer, or the LocalProtocolError that refused it (nothing changed for that one).
        Raises core.AppFailed as `submit` does; the items after it do not run.
        Why not a loop of `submit`: a batch's common item (no request id, one send) is
        a few µs of Python, and its calls, keyword arguments and attribute lookups were a
        third of it; they are looked up once per batch here, the rest goes to `submit`."""
        results: list[Submitted | core.LocalProtocolError] = []
        answer_to = results.append
        submit, epochs, host, senders, out = self.submit, self.epochs, self.host, self.senders, self._out
        command_of, admit, pack, command_record = host.command, self._admit, wal.pack, fastrecords.command_record
        step_record, me = fastrecords.step_record, self.node_id
        for request_id, command, first_sent_unix_ms in items:
            try:
                if request_id or epochs.restore_incomplete or type(command) is not bytes:
                    answer_to(submit(command, request_id, wall=wall, first_sent_unix_ms=first_sent_unix_ms)
                              if request_id else submit(command))
                    continue
                reply, sends = command_of(command, admit)  # apphost.H4: a refusal changed nothing
            except core.LocalProtocolError as exc:
                answer_to(exc)
                continue
            # From here on as `submit` with no request id: the step's first send carrying its command.
            lsn = self.last_command = self.last_lsn + 1
            first_seq = 0
            if len(sends) == 1:  # `_step_sends` of one message, inline
                dst, payload = sends[0]
                sender = senders[dst]
                first_seq = seq = sender.next_seq
                out.append(fast_new(Append, (step_record(lsn, f"{me}:{dst}:{seq}", me, dst, seq, "", pack(payload),
                                                         pack(command), pack(reply) if reply else ""),)))
                sender.enqueue(lsn=lsn, payload=payload)
                self._segment_count += 1
                self.messages_sent += 1
                self.last_lsn = lsn
                sent_to: tuple[str, ...] = (dst,)
            else:
                if sends:
                    first_seq = senders[sends[0][0]].next_seq
                    self._step_sends(lsn, "", pack(command), pack(reply) if reply else "", sends)
                else:
                    self.last_lsn = lsn
                    self._segment_count += 1
                    out.append(fast_new(Append, (command_record(lsn, "", pack(command), pack(reply) if reply else ""),)))
                sent_to = tuple(dict.fromkeys(dst for dst, _ in sends))
            if self._segment_count >= self.segment_records or self._segment_size >= self.segment_bytes:
                self._seal()
            epoch = epochs.epoch
            answer_to(fast_new(Submitted, (reply, self.last_lsn, False, epoch, sent_to, epoch, first_seq)))
        return results

    def query(self, query: bytes) -> tuple[bytes, int, int]:
        """A client's read of the hosted app (snapmesh.app A7, apphost.H7):
        (reply, lsn, epoch). Nothing is logged and nothing changes; the answer
        rests on every step applied up to `lsn`, so the shell answers only once
        the log holds it. Raises as `submit` does (RESTORING, the app's
        refusal, REPLY_TOO_LARGE), and core.AppFailed when the app cannot be put back."""
        self.epochs.check_clients()
        host = self.host
        reply = host.query(bytes(query))
        if len(reply) > self.max_reply_bytes:
            raise core.LocalProtocolError(
                f"{self.node_id}: the app's reply to a query holds {len(reply)} bytes, over max_reply_bytes"
                f" ({self.max_reply_bytes})",
                core.Refusal.REPLY_TOO_LARGE,
            )
        return reply, self.last_lsn, self.epochs.epoch

    def _admit(self, reply: bytes, sends: list[tuple[str, bytes]]) -> None:
        """A command that ran goes through only on what it did (N12); raising takes it back (apphost.H4)."""
        if len(reply) > self.max_reply_bytes:
            raise core.LocalProtocolError(f"{self.node_id}: the app's reply holds {len(reply)} bytes, over max_reply_bytes"
                                          f" ({self.max_reply_bytes}); the command is taken back", core.Refusal.REPLY_TOO_LARGE)
        if len(sends) == 1:  # the common step: one message, no counting; check_room(1)'s test without its calls
            sender = self.senders[sends[0][0]]
            if sender.next_seq - sender.acked > sender.bound:  # unacked + 1 > bound
                sender.check_room(1)  # raises ChannelFull
            return
        counts: dict[str, int] = {}
        for dst, _ in sends:
            counts[dst] = counts.get(dst, 0) + 1
        for dst, count in counts.items():
            self.senders[dst].check_room(count)

    def received_payloads(self, src: str, conn_no: int, first_seq: int, payloads: Iterable[bytes]) -> None:
        """The app messages first_seq, first_seq + 1, ... of one frame from `src` (a payload run):
        exactly `received(src, conn_no, seq, payload=...)` of each, in order (the same drops and
        errors; what was applied before an error stays applied), without a call per message. The
        frame's end is the caller's `end_frame`."""
        receiver, process = self.receivers.get(src), self.process
        if receiver is None:
            raise core.RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        # The common run (the channel's next seqs, nothing recording): admit and passed checked once, applied at its end.
        if receiver.in_order(conn_no, first_seq) and process.quiet(src):
            lsns: list[int] = []
            try:
                self._quiet_run(src, first_seq, payloads, lsns)
            finally:  # what was applied before an error stays applied
                receiver.applied_run(first_seq, lsns)
            return
        admit, applied, me, passed = receiver.admit, receiver.applied, self.node_id, process.passed
        message, out, pack, recv_record = self.host.message, self._out, wal.pack, fastrecords.recv_record
        for seq, payload in enumerate(payloads, first_seq):
            if not admit(conn_no, seq):
                continue
            # `_app_message(src, seq, msg_id, payload)` inline (the per-message path): the app
            # first (AppFailed: nothing logged), the core's record while a snapshot records, the record
            msg_id = f"{src}:{me}:{seq}"
            sends = message(src, payload)
            if not passed(src=src, payload=payload):
                effects = process.receive(src=src, message=core.Transfer(msg_id=msg_id, seq=seq, payload=payload))
                if effects:
                    self._drain(effects)
            lsn = self.last_lsn = self.last_lsn + 1
            self._segment_count += 1
            out.append(fast_new(Append, (recv_record(lsn, msg_id, src, me, seq, pack(payload)),)))
            self.messages_received += 1
            if sends:
                self._app_sends(sends)
            applied(seq, self.last_lsn)

    def _quiet_run(self, src: str, first_seq: int, payloads: Iterable[bytes], lsns: list[int]) -> None:
        """`received_payloads`' loop for a run `in_order` while `quiet`: each message's lsn into `lsns`."""
        me, message, passed, out, pack, recv_record = self.node_id, self.host.message, self.process.passed, self._out, \
            wal.pack, fastrecords.recv_record
        for seq, payload in enumerate(payloads, first_seq):
            msg_id = f"{src}:{me}:{seq}"
            sends = message(src, payload)
            if type(payload) is not bytes:
                passed(src=src, payload=payload)  # raises for what is not bytes (a subclass passes)
            lsn = self.last_lsn = self.last_lsn + 1
            self._segment_count += 1
            out.append(fast_new(Append, (recv_record(lsn, msg_id, src, me, seq, pack(payload)),)))
            self.messages_received += 1
            if sends:
                self._app_sends(sends)
            lsns.append(self.last_lsn)

    def _app_message(self, src: str, seq: int, msg_id: str, payload: bytes) -> None:
        """An app message from `src`: the app first (AppFailed: nothing logged), then its records."""
        host = self.host
        sends = host.message(src, payload)
        process = self.process
        if not process.passed(src=src, payload=payload):  # a snapshot is recording here: the core records it
            effects = process.receive(src=src, message=core.Transfer(msg_id=msg_id, seq=seq, payload=payload))
            if effects:
                self._drain(effects)
        lsn = self.last_lsn + 1  # _append, inline (the per-message path)
        self.last_lsn = lsn
        self._segment_count += 1
        self._out.append(fast_new(Append, (fastrecords.recv_record(lsn, msg_id, src, self.node_id, seq, wal.pack(payload)),)))
        self.messages_received += 1
        if sends:
            self._app_sends(sends)

    def _step_sends(self, lsn: int, request_id: str, command: str, reply: str, sends: list[tuple[str, bytes]]) -> None:
        """A command step's sends at `lsn` on: the first `send` record carries the command
        (wal.Send: one line where a `command` and a `send` were two), the rest as `_app_sends`."""
        me, (dst, payload) = self.node_id, sends[0]
        sender = self.senders[dst]
        seq = sender.next_seq
        self._out.append(fast_new(Append, (fastrecords.step_record(
            lsn, f"{me}:{dst}:{seq}", me, dst, seq, request_id, wal.pack(payload), command, reply),)))
        sender.enqueue(lsn=lsn, payload=payload)
        self._segment_count += 1
        self.messages_sent += 1
        self.last_lsn = lsn
        if len(sends) > 1:
            self._app_sends(sends[1:])

    def _app_sends(self, sends: Iterable[tuple[str, bytes]]) -> None:
        """The messages one app step sent: a `send` record each, then onto its channel."""
        me, senders, out, pack, record = self.node_id, self.senders, self._out, wal.pack, fastrecords.send_record
        lsn = self.last_lsn
        for dst, payload in sends:  # _append, inline (the per-message path)
            sender = senders[dst]
            seq = sender.next_seq
            lsn += 1
            out.append(fast_new(Append, (record(lsn, f"{me}:{dst}:{seq}", me, dst, seq, "", pack(payload)),)))
            sender.enqueue(lsn=lsn, payload=payload)
            self._segment_count += 1
            self.messages_sent += 1
        self.last_lsn = lsn

    # -- overtake mode (N9)

    def _early_marker(self, receiver: Receiver, conn_no: int, snapshot_id: str, *, last_seq: int) -> None:
        """An early marker from `receiver.src`: it closes the channel now (core R6)."""
        if conn_no != receiver.conn_no:
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
        # The link's own entries: no object per entry at every cut.
        outbox = {dst: tuple(e for e in s.outbox if not e.snapshot_id) for dst, s in self.senders.items()}
        self._at_cut[snapshot_id] = (positions, outbox)

    def _with_cut(self, state: core.FullState) -> core.FullState:
        positions, outbox = self._at_cut.pop(state.snapshot_id)
        return dataclasses.replace(state, positions=MappingProxyType(positions), outbox=MappingProxyType(outbox))

    # -- clients' answers (N11)

    def _retried(self, request_id: str, wall: float | None, first_sent_unix_ms: int, digest: str) -> requests.Paid | None:
        """A client step's request id: the first answer of a retry, None for a
        request to carry out now; requests.py's refusals (W1-W6). `wall` moves the window's clock."""
        if wall is not None:
            self.wall = wall
        return self._requests.lookup(request_id, self.wall, first_sent_unix_ms, digest)

    def _reply_when_durable(self, to: object, answer: Any) -> Any:
        if to is not None:
            self._wait_or_reply((answer.lsn, to, answer, False))
        return answer

    def reply_batch(self, to: object, answers: Iterable[Submitted]) -> None:
        """A client waits for `answers` (steps taken without `reply_to`) together:
        one `ReplyBatch` once the log is durable up to now (N11). Up to now, not
        only to its answers' records: the batch's replies (its refusals' too) may
        show state, and no answer may show what a crash could take back."""
        self._wait_or_reply((self.last_lsn, to, tuple(answers), True))

    def _wait_or_reply(self, waiting: tuple) -> None:
        if waiting[0] <= self.durable_lsn:  # a retry's first answer, or nothing new: no fsync to wait for
            self._reply(waiting)
        else:
            self._waiting.append(waiting)

    def _replies_due(self) -> None:
        """Answer every waiting call that is durable now."""
        durable = self.durable_lsn
        still = []
        for waiting in self._waiting:
            if waiting[0] > durable:
                still.append(waiting)
            else:
                self._reply(waiting)
        self._waiting = still

    def _reply(self, waiting: tuple) -> None:
        """The answer, saying what a restore since took back (epochs.py `taken_back`)."""
        _, to, answer, batch = waiting
        if type(answer) is RestoreReply:  # the effect itself: a later restore never takes a restore back
            self._out.append(answer)
            return
        taken_back = self.taken_back  # type: ignore[attr-defined]  (node.Node's: the one rule)
        if batch:
            if not self.epochs.restored_after(min(map(_EPOCH, answer), default=0)):  # the common batch
                self._out.append(ReplyBatch(to, ("",) * len(answer)))
            else:
                self._out.append(ReplyBatch(to, tuple(taken_back(a) or "" for a in answer)))
        else:
            self._out.append(Reply(to, answer, taken_back(answer) or ""))

    # -- the app's name and version in the log (snapmesh.app, Versions)

    def _stamp(self) -> dict:
        """The app's name and version as init, checkpoint and version records carry them (the bank: none)."""
        return {"app": self.host.app.name, "version": self.host.app.version}

    def _restarted(self, recovered: Recovered) -> None:
        """A restart's records: a `version` record first if the log last named another app or version
        (recovery refuses a log of another version, so today: a log from before versions named none);
        then, for a log read in an older shape (Recovered.reshaped), a seal."""
        if (recovered.app_name, recovered.app_version) != (
            self.host.app.name, self.host.app.version
        ):
            self._append(wal.AppVersion(lsn=self.last_lsn + 1, **self._stamp()))
        self._append(wal.Restart(lsn=self.last_lsn + 1))
        self.stopped = recovered.stopped
        self.last_command = recovered.last_command  # before a seal: its checkpoint carries it (F7)
        if recovered.reshaped:  # an older shape's records, mapped when read: the next segment opens in this one
            self._seal()

    def quiet_since_cut(self, snapshot_id: str) -> bool:
        """Whether this node logged its cut of `snapshot_id` and no client command after it (fence.py F7)."""
        cut = self._cuts.get(snapshot_id)
        return cut is not None and 0 <= self.last_command < cut

    def stop(self, snapshot_id: str) -> None:
        """Stop for the COMPLETE stop snapshot `snapshot_id`: the log ends in a `stop` record,
        and the segment stays open (no seal) until a restore, so a restart finds it."""
        self._append(wal.Stop(lsn=self.last_lsn + 1, snapshot_id=snapshot_id))
        self.stopped = snapshot_id

    # -- segments (N7)

    def log_size(self, nbytes: int) -> None:
        """The active segment now holds `nbytes` bytes after its opening checkpoint
        (the log's count, buffered records included; the shell reports it after
        carrying out a step's effects): past `segment_bytes` the next step
        boundary seals it (N7). Bytes as well as records, because an app's
        records (commands, replies, messages) can be large, and a segment that
        counts only records grows without a byte limit. The checkpoint is left
        out because it is as large as the state: counted, a state larger than
        `segment_bytes` would seal the segment at every step."""
        self._segment_size = nbytes

    def _seal(self) -> None:
        """Close the active segment; open the next with a checkpoint (N7). Not while stopped:
        the `stop` record stays in the active segment, where a restart reads it."""
        if self.stopped:
            return
        state = Recovered(
            next_seq={d: s.next_seq for d, s in self.senders.items()},
            acked={d: s.acked for d, s in self.senders.items()},
            outbox={d: list(s.outbox) for d, s in self.senders.items()},
            last_received={s: r.last_seq for s, r in self.receivers.items()},
            abandoned=self._abandoned,
            requests=self._requests.as_dict(self.wall),
            cuts=self._cuts,
            epoch=self.epoch,
            restored=self.restored,
            last_command=self.last_command,
        )
        lsn = self.last_lsn + 1
        app_state = wal.Packed(self.host.snapshot(as_blocks=True))  # its base64 made as it is written (apphost.H8)
        checkpoint = wal.Checkpoint(lsn=lsn, **checkpoint_fields(state), state=app_state, **self._stamp())
        self._out.append(Seal(self.segment_first, checkpoint))
        self.segment_first = self.last_lsn = lsn
        self._segment_count = 1  # the checkpoint
        self._segment_size = 0  # until the shell reports the new segment's size (log_size)


def state_digest(state: bytes) -> str:
    """What a `cut` record holds of an app's state: sha256, hex (the checks compare it with the report's bytes)."""
    return hashlib.sha256(state).hexdigest()

