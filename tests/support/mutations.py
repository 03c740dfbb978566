"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

import dataclasses
import pytest
from snapmesh.protocol.controller import assembly, held, machine as controller, restoregate, restoring, retention, tracker
from snapmesh.protocol.node import link, recovery, requests
from snapmesh.protocol.controller import journal
from snapmesh.protocol.node import machine as node_mod
from snapmesh.protocol.node import effects as node_effects
from snapmesh.protocol.node import steps as node_steps
from snapmesh.protocol import wal
from snapmesh.v1 import snapmesh_pb2 as pb


def _no_resend(monkeypatch: pytest.MonkeyPatch) -> None:
    connect = link.Sender.connect

    def broken(self: link.Sender, conn_no: int) -> None:
        sent = self.sent
        connect(self, conn_no)
        self.sent = max(sent, self.acked)  # carry on after what was sent, as if the wire lost nothing

    monkeypatch.setattr(link.Sender, "connect", broken)


def _no_duplicate_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: link.Receiver, conn_no: int, seq: int) -> bool:
        if conn_no != self.conn_no:
            return False
        if seq > self.last_seq + 1:
            raise link.RemoteProtocolError("gap")
        return True  # a seq already held is applied again

    monkeypatch.setattr(link.Receiver, "admit", broken)


def _recovery_forgets_the_outbox(monkeypatch: pytest.MonkeyPatch) -> None:
    recover = recovery.recover

    def broken(*args, **kwargs):
        state = recover(*args, **kwargs)
        for dst in state.outbox:
            state.outbox[dst] = []
            state.acked[dst] = state.next_seq[dst] - 1
        return state

    monkeypatch.setattr(recovery, "recover", broken)


def _recovery_ignores_receipts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recovery does not hand the app the messages its log says it received."""
    step = recovery._Replayer.step

    def broken(self, record, where):
        if type(record).KIND != "recv":
            step(self, record, where)

    monkeypatch.setattr(recovery._Replayer, "step", broken)


def _recovery_forgets_aborts(monkeypatch: pytest.MonkeyPatch) -> None:
    apply = recovery._apply

    def broken(state, record, *args):
        if type(record).KIND == "abort":
            state.records += 1
            state.last_lsn = record.lsn
            return
        apply(state, record, *args)

    monkeypatch.setattr(recovery, "_apply", broken)


def _restore_skips_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    restore = node_mod.Node.restore

    def broken(self, *, in_flight, **kwargs):
        return restore(self, in_flight=list(in_flight)[1:], **kwargs)  # the first in-flight transfer is lost

    monkeypatch.setattr(node_mod.Node, "restore", broken)


def _recovery_ignores_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recovery does not hand the app the in-flight messages a restore replayed."""
    step = recovery._Replayer.step

    def broken(self, record, where):
        if type(record).KIND != "replay":
            step(self, record, where)

    monkeypatch.setattr(recovery._Replayer, "step", broken)


def _overtake_forgets_the_outbox(monkeypatch: pytest.MonkeyPatch) -> None:
    keep = node_mod.Node._keep_cut

    def broken(self, snapshot_id: str) -> None:
        keep(self, snapshot_id)
        positions, _ = self._at_cut[snapshot_id]
        self._at_cut[snapshot_id] = (positions, {})  # the overtaken transfers are dropped

    monkeypatch.setattr(node_mod.Node, "_keep_cut", broken)


def _overtake_positions_after_the_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    with_cut = node_mod.Node._with_cut

    def broken(self, state):
        state = with_cut(self, state)
        late = {src: r.last_seq for src, r in self.receivers.items()}  # taken at completion, not at the cut
        return dataclasses.replace(state, positions=late)

    monkeypatch.setattr(node_mod.Node, "_with_cut", broken)


def _window_by_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken window: a full window evicts its oldest id instead of refusing."""
    lookup = requests.RequestWindow.lookup

    def broken(self, request_id, now, first_sent_unix_ms=0, digest=""):
        if len(self._paid) >= self.capacity and request_id not in self._paid:
            self.bytes -= requests.entry_bytes(*self._paid.popitem(last=False))
        return lookup(self, request_id, now, 0, digest)  # and no refusal of an expired retry either

    monkeypatch.setattr(requests.RequestWindow, "lookup", broken)


def _restore_keeps_every_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken restore: it forgets no request id (a retry of a rolled-back one is not paid again)."""
    monkeypatch.setattr(requests.RequestWindow, "restored", lambda self, cuts, snapshot_id: None)
    monkeypatch.setattr(recovery.requests, "forget_restored", lambda paid, cuts, snapshot_id: None)


def _restore_claim_after_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken gate: check and claim are two steps; the claim lands only after
    the next call was handled (that call still sees no restore running and starts its own)."""
    request = restoregate.RestoreGate.request

    def broken(self, snapshot_id, request_id, now, problem="", **kwargs):
        late = self.__dict__.pop("_late_claim", None)
        decision = request(self, snapshot_id, request_id, now, problem, **kwargs)
        if isinstance(decision, restoregate.Start):
            self.running = late  # not claimed yet (the RESTORING record is being fsynced)
            self._late_claim = decision
        elif late is not None and self.running is None:
            self.running = late
        return decision

    monkeypatch.setattr(restoregate.RestoreGate, "request", broken)


def _restore_forgets_finished_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken gate: a finished restore's key is forgotten; its retry rolls back again."""

    def broken(self, result):
        claim, self.running = self.running, None
        if claim is not None:
            self._by_key.pop(claim.request_id, None)

    monkeypatch.setattr(restoregate.RestoreGate, "finished", broken)


def _restore_forgets_joined_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken gate (issue 33, bug 1): a key that joins a running restore is not
    remembered; its retry after the restore ended rolls back a second time."""
    request = restoregate.RestoreGate.request

    def broken(self, snapshot_id, request_id, now, problem="", **kwargs):
        decision = request(self, snapshot_id, request_id, now, problem, **kwargs)
        if isinstance(decision, restoregate.Join) and decision.joined_key:
            self.running_keys.remove(decision.joined_key)
            self._by_key.pop(decision.joined_key)
            return restoregate.Join(snapshot_id)
        return decision

    monkeypatch.setattr(restoregate.RestoreGate, "request", broken)


def _restore_joins_not_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken restart: the journal's `joined` records are not taken back; a key
    that joined a restore rolls back again when retried after a controller restart."""
    restores = controller.journal.restores

    def broken(records):
        found, warnings = restores(records)
        return [(restore, []) for restore, _ in found], warnings

    monkeypatch.setattr(controller.journal, "restores", broken)


def _restore_join_after_the_end_unjournaled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken machine: a key that joins a restore which has ended (its outcome not yet
    durable) is not journaled; after a controller restart its retry rolls back again."""
    restore = controller.Controller.restore

    def broken(self, snapshot, request_id, now, **kwargs):
        decision = restore(self, snapshot, request_id, now, **kwargs)
        if isinstance(decision, restoregate.Join) and self.last_restore.status != pb.Restore.RESTORING:
            self._effects = [e for e in self._effects if not isinstance(getattr(e, "record", None), journal.Joined)]
        return decision

    monkeypatch.setattr(controller.Controller, "restore", broken)


def _restore_answers_a_join_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken machine (R5): a call that joins a running restore is answered at once,
    with the restore still RESTORING, instead of with its outcome once durable."""
    answer_later = controller.Controller._answer_later

    def broken(self, decision, call, request_id):
        if isinstance(decision, restoregate.Join) and self.last_restore.status == pb.Restore.RESTORING:
            self._effects.append(controller.AnswerRestore((call,), self.last_restore))
            return
        answer_later(self, decision, call, request_id)

    monkeypatch.setattr(controller.Controller, "_answer_later", broken)


def _restore_replays_the_newest_key_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken restart (issue 33, bug 2): only the journal's newest restore is
    taken back; a retry of an older key after a restart rolls back again."""
    taken_back = controller.Controller.taken_back

    def broken(self, restores):
        taken_back(self, [(restore, []) for restore, _ in restores[-1:]])

    monkeypatch.setattr(controller.Controller, "taken_back", broken)


def _controller_takes_stale_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine takes a report of an epoch before a restore."""
    monkeypatch.setattr(controller, "stale_report", lambda report_epoch, epoch: "")


def _controller_admits_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine starts a snapshot past its admission limit (A1)."""
    trigger = controller.Controller.trigger

    def broken(self, *args, **kwargs):
        limit, self.max_concurrent = self.max_concurrent, 0
        try:
            return trigger(self, *args, **kwargs)
        finally:
            self.max_concurrent = limit

    monkeypatch.setattr(controller.Controller, "trigger", broken)


def _controller_fails_without_aborts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine fails a snapshot and tells no node to abort it."""
    finished = controller.Controller._finished

    def broken(self, snapshot):
        finished(self, snapshot)
        self._effects = [e for e in self._effects if not isinstance(e, controller.AbortAt)]

    monkeypatch.setattr(controller.Controller, "_finished", broken)


def _replay_without_the_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine's replay (S1) takes back the snapshots in progress as if no
    restart had happened: they fail as an ordinary "deadline", not "controller restarted"."""
    monkeypatch.setattr(tracker.Tracker, "restarted", lambda self, now: sorted(self._pending))


def _replay_without_a_fresh_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine's replay (S1) gives the snapshots in progress no time after the
    restart: their deadline is the restart itself, so the reports the nodes send again are too late."""
    restarted = tracker.Tracker.restarted

    def broken(self, now):
        return restarted(self, tracker.Now(mono=now.mono - self.deadline_s, wall=now.wall))

    monkeypatch.setattr(tracker.Tracker, "restarted", broken)


def _replay_forgets_the_running_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine's replay does not name the restore still RESTORING in its
    journal (`to_resume`): after a restart no node that missed its part hears of it again."""
    replayed = controller.Controller.replayed

    def broken(self, *args, **kwargs):
        found = replayed(self, *args, **kwargs)
        self.to_resume = ""
        return found

    monkeypatch.setattr(controller.Controller, "replayed", broken)


def _restore_plan_drops_a_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine's restore plan loses the first in-flight transfer of a
    channel: the fuzzer runs production's plan, so a node replays too little."""
    plan = restoring.plan

    def broken(snapshot, epoch):
        parts = plan(snapshot, epoch)
        for part in parts.values():
            for channel in part.channels:
                del channel.in_flight[:1]
        return parts

    monkeypatch.setattr(restoring, "plan", broken)


def _tracker_forgets_overtaken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's tracker completes an overtake snapshot without the senders'
    outboxes (what an early marker overtook is lost from the total)."""

    def broken(reports, side):
        return {}, {(p.src, p.dst): p.seq for r in reports for p in r.positions}

    monkeypatch.setattr(assembly, "overtake_parts", broken)


def _retention_keeps_one_too_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's retention (K1) is off by one: it keeps N-1 COMPLETE snapshots."""
    retire = retention.Retention.retire
    monkeypatch.setattr(retention.Retention, "retire", lambda self, keep, protect=(): retire(self, keep - 1, protect))


def _retention_forgets_the_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's retention (K1) retires the snapshot last restored too."""
    retire = retention.Retention.retire
    monkeypatch.setattr(retention.Retention, "retire", lambda self, keep, protect=(): retire(self, keep))


def _retention_retires_what_just_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's retention (K2) retires the snapshot a COMPLETE just finished when
    its id sorts before those kept (the fuzzer's s10 after s9)."""
    retired = controller.Controller._retired
    monkeypatch.setattr(controller.Controller, "_retired", lambda self, completed="": retired(self))


def _controller_starts_before_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine asks for StartSnapshot before the start's record (a crash
    in between leaves a node recording a snapshot the restarted controller never heard of)."""
    trigger = controller.Controller.trigger

    def broken(self, *args, **kwargs):
        snapshot = trigger(self, *args, **kwargs)
        records = [e for e in self._effects if isinstance(e, controller.Journal)]
        self._effects = [e for e in self._effects if not isinstance(e, controller.Journal)] + records
        return snapshot

    monkeypatch.setattr(controller.Controller, "trigger", broken)


def _controller_finishes_before_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine shows a snapshot's outcome before its record is in the journal."""
    finished = controller.Controller._finished

    def broken(self, snapshot):
        before = len(self._effects)
        finished(self, snapshot)
        step = self._effects[before:]
        self._effects[before:] = [e for e in step if not isinstance(e, controller.Journal)] + [
            e for e in step if isinstance(e, controller.Journal)
        ]

    monkeypatch.setattr(controller.Controller, "_finished", broken)


def _trigger_answered_before_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine answers a waiting trigger (W1) before the Journal record of the
    snapshot's outcome: a crash then takes back an end the client was told."""
    finished = controller.Controller._finished

    def broken(self, snapshot, *calls):
        before = len(self._effects)
        finished(self, snapshot, *calls)
        step = self._effects[before:]
        answers = [e for e in step if isinstance(e, controller.AnswerTrigger)]
        self._effects[before:] = answers + [e for e in step if not isinstance(e, controller.AnswerTrigger)]

    monkeypatch.setattr(controller.Controller, "_finished", broken)


def _trigger_answer_dropped_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller machine never answers a waiting trigger (W1) whose snapshot fails by its deadline."""
    tick = controller.Controller.tick

    def broken(self, now):
        expired = tick(self, now)
        self._effects = [e for e in self._effects if not isinstance(e, controller.AnswerTrigger)]
        return expired

    monkeypatch.setattr(controller.Controller, "tick", broken)


def _reply_before_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node machine answers a client before the answer's record is durable (node
    rule N11): a crash then takes back a transfer the client was told is paid."""
    monkeypatch.setattr(node_steps.NodeSteps, "_wait_or_reply", lambda self, waiting: self._reply(waiting))


def _restore_answer_before_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node machine answers RestoreState before the restore's records are durable
    (node rule N8): a crash then takes back a restore the controller was told is done."""

    def broken(self, to: object) -> None:
        if to is not None:
            self._out.append(node_effects.RestoreReply(to, self.epochs.epoch))

    monkeypatch.setattr(node_steps.NodeSteps, "_restore_reply", broken)


def _restore_keeps_the_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node machine names no connection to end at a restore (node rule N8): the
    older epoch's connections live on, though the links behind them started over."""
    restore = node_steps.NodeSteps.restore

    def broken(self, **kwargs):
        done = restore(self, **kwargs)
        self._out = [e for e in self._out if type(e) is not node_effects.EndStreams]
        return done

    monkeypatch.setattr(node_steps.NodeSteps, "restore", broken)


def _open_ignores_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node machine takes a channel opened in another epoch (node rule N8): a sender
    not restored yet delivers what the restore rolled back, or a receiver takes the new
    epoch's traffic before its own restore."""
    opened = node_mod.Node.opened
    monkeypatch.setattr(node_mod.Node, "opened", lambda self, src, conn_no, *, epoch=0: opened(self, src, conn_no))


def _report_before_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node machine says "send" for a finished part before the records it rests on
    are durable (node rule N2): a crash could keep the report and lose its marker_recv."""
    drain = node_mod.Node._drain

    def broken(self, *args, **kwargs):
        drain(self, *args, **kwargs)
        self._reports = [(0, sid) for _, sid in self._reports]  # due at the next durable(), whatever its lsn

    monkeypatch.setattr(node_mod.Node, "_drain", broken)


def _report_leaves_out_a_recorded_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's report of recorded channels only (only_recorded_channels) leaves out one that recorded messages."""
    from snapmesh.sim import controller as sim_controller
    made = sim_controller.report_message

    def broken(*args, **kwargs):
        message = made(*args, **kwargs)
        del message.channels[:1]  # the tracker reads it as empty
        return message

    monkeypatch.setattr(sim_controller, "report_message", broken)


def _held_reports_not_journaled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller answers the reports it held at COMPLETE without journaling
    them (held.py H2, H4): a crash then loses reports the nodes were told are taken."""
    release = held.HeldReports.release

    def broken(self, snapshot_id: str):
        _, calls = release(self, snapshot_id)
        return [], calls

    monkeypatch.setattr(held.HeldReports, "release", broken)


def _held_reports_never_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller journals the reports it held but never answers their calls
    (held.py H2): the nodes keep them and send them again, for ever."""
    release = held.HeldReports.release

    def broken(self, snapshot_id: str):
        records, _ = release(self, snapshot_id)
        return records, ()

    monkeypatch.setattr(held.HeldReports, "release", broken)


def _report_rests_past_its_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken node: a `report` record names a record after the marker_recv it rests on (S8)."""
    append = node_mod.Node._append

    def _append(self, record):
        if type(record) is wal.Report:
            record = dataclasses.replace(record, upto=record.upto + 1)
        return append(self, record)

    monkeypatch.setattr(node_mod.Node, "_append", _append)


MUTATIONS = {
    "report-rests-past-its-marker": _report_rests_past_its_marker,
    "controller-held-not-journaled": _held_reports_not_journaled,
    "controller-held-never-answered": _held_reports_never_answered,
    "report-leaves-out-a-recorded-channel": _report_leaves_out_a_recorded_channel,
    "controller-start-before-durable": _controller_starts_before_durable,
    "controller-finish-before-durable": _controller_finishes_before_durable,
    "controller-trigger-answer-before-durable": _trigger_answered_before_durable,
    "controller-trigger-answer-dropped": _trigger_answer_dropped_at_the_deadline,
    "controller-retention-off-by-one": _retention_keeps_one_too_few,
    "controller-retention-protect": _retention_forgets_the_restored,
    "controller-retention-just-completed": _retention_retires_what_just_completed,
    "node-reply-before-durable": _reply_before_durable,
    "node-report-before-durable": _report_before_durable,
    "node-open-ignores-epoch": _open_ignores_the_epoch,
    "node-restore-answer-before-durable": _restore_answer_before_durable,
    "node-restore-keeps-streams": _restore_keeps_the_streams,
    "controller-restore-plan": _restore_plan_drops_a_transfer,
    "controller-overtake-merge": _tracker_forgets_overtaken,
    "controller-stale-report": _controller_takes_stale_reports,
    "controller-admission": _controller_admits_everything,
    "controller-abort-on-fail": _controller_fails_without_aborts,
    "controller-replay-not-restarted": _replay_without_the_restart,
    "controller-replay-no-fresh-deadline": _replay_without_a_fresh_deadline,
    "controller-replay-no-resume": _replay_forgets_the_running_restore,
    "restore-claim-two-steps": _restore_claim_after_the_check,
    "restore-forgets-finished-keys": _restore_forgets_finished_keys,
    "restore-forgets-joined-keys": _restore_forgets_joined_keys,
    "restore-joins-not-replayed": _restore_joins_not_replayed,
    "restore-join-after-the-end": _restore_join_after_the_end_unjournaled,
    "restore-replays-newest-key-only": _restore_replays_the_newest_key_only,
    "restore-answers-join-at-once": _restore_answers_a_join_at_once,
    "request-window": _window_by_count,
    "request-restore": _restore_keeps_every_id,
    "overtake-outbox": _overtake_forgets_the_outbox,
    "overtake-positions": _overtake_positions_after_the_cut,
    "resend": _no_resend,
    "duplicate-drop": _no_duplicate_drop,
    "recovery-outbox": _recovery_forgets_the_outbox,
    "recovery-receipts": _recovery_ignores_receipts,
    "recovery-aborts": _recovery_forgets_aborts,
    "restore-replay": _restore_skips_the_replay,
    "recovery-replays": _recovery_ignores_replays,
}
