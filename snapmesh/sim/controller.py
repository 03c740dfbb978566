"""The controller process in the simulator: the production machine, a journal, the restore and trigger calls.

`snapmesh.protocol.controller.machine.Controller` (the code the gRPC controller runs)
decides here too: which snapshots start, complete and fail, the cluster epoch,
which restore calls start, join, get an answer or are refused, and each node's
part of a restore (`plan`). This module only carries out its effects on the
simulated cluster, as services/controller/engine.py does on the real one:

  Journal(record)   the journal (sim/journal.py): pending until a flush makes it
                    durable, in half the cases; every later effect of the step
                    waits for it, a controller crash loses what is pending,
                    and a restart replays what is durable
  Retire            judged against the fuzzer's own retention rule (sim/retention.py)
  File, Forget      nothing: the simulator keeps no snapshot files (a restart replays the journal);
                    a COMPLETE snapshot's states are filed as blocks at its Finished
                    (sim/blockstore.py), and the checker judges the states rebuilt from them
  StartAt           the initiator (with a broadcast trigger: each node) starts
                    the snapshot, or (down, fenced) the start fails
  Finished          COMPLETE: checked against the logs (invariants C1-C3)
  AbortAt           a FAILED snapshot: the node, if up, aborts it (every node
                    of the topology must get one: checked)
  RestoreAt         the node's part waits for `restore_one`; its answer is the
                    node machine's RestoreReply (once durable), and a node that
                    crashed first gets its part again (the real restorer retries)
  RestoreDone       the restore ended; the machine hears it settled (its record
                    durable) only at the next `restore_one`, so calls can come in
                    between: a new key then joins the restore that has ended
  AnswerRestore     judged (sim/restore_answers.py): each call taken, answered once
  AnswerTrigger     judged (sim/trigger_answers.py): a waiting trigger (W1; some
                    triggers wait, drawn from their own generator, `wait_rng`)
                    is answered once, with the snapshot's final status, after
                    its Finished record is durable; one whose controller crashed never
  AnswerReport      judged (sim/report_answers.py): most reports come with a call
                    (drawn from `report_rng`), as a node's ReportState does, so
                    the machine holds those that do not complete their snapshot
                    (held.py H1-H4) and answers them at its end; a call it does not
                    hold is answered once the step's records are durable. A
                    controller crash loses the unanswered calls: their nodes send
                    the reports again to the restarted controller

Reports travel as the real ones do (sim/blockstore.py SB1-SB4): a node sends
its state as blocks once a report of its was taken, naming the blocks it takes
the controller to hold; the controller refuses one naming a block it lacks
(the node sends it whole, at once), rebuilds the others, journals them as they
came, and a restart makes them whole again from its block disk. A restore's
part goes as blocks as the real one does (sim/blockrestores.py SB5): the
manifest and the blocks the controller does not take the node to hold (what
it knows survives its restarts), rebuilt at the node from those and what it
holds (kept on its disk through a crash, a block lost now and then), or
refused and sent whole.

Controller faults: crash (reports on the way are lost), a report sent again
whose copy arrives only after a restore began (refused: its epoch is stale), and restart (the
journal replayed: finished snapshots come back, those in progress get a fresh
deadline and fail "controller restarted" unless their reports come in, and a
RESTORING restore resumes at every node). The restore's parts at the nodes and
the RestoreSnapshot calls (from their own generator, `restore_rng`) are
sim/restore_calls.py's, a mixin of this shell.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any, Protocol

from snapmesh.protocol.controller import machine
from snapmesh.protocol.node import core
from snapmesh.protocol import hybrid, overtake
from snapmesh.protocol.reports import report_message
from snapmesh.protocol.node import machine as node_mod
from snapmesh.app import v1fields
from snapmesh.protocol.appstate import AppChecker, carries_v1
from snapmesh.protocol.topology import Topology
from snapmesh.protocol.controller.stopping import FenceAt
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, InvalidReport, Now, Tracker, TrackerError, DuplicateReport
from snapmesh.sim import apps
from snapmesh.sim.blockrestores import SimRestores
from snapmesh.sim.blockstore import SimBlocks
from snapmesh.sim.disk import Disk
from snapmesh.sim.invariants import Checker, Violation
from snapmesh.sim.journal import SimJournal
from snapmesh.sim.network import Network
from snapmesh.sim.report_answers import ReportCheck, Sent
from snapmesh.sim.restore_calls import RestoreCalls
from snapmesh.sim.restarts import RestartCheck, kind_of_failure
from snapmesh.sim.trigger_answers import TriggerCheck
from snapmesh.sim.retention import RetentionCheck
from snapmesh.v1 import snapmesh_pb2 as pb

DEADLINE = 3.0  # the controller's snapshot deadline (simulated seconds)


class Cluster(Protocol):
    """What the simulated controller uses of the world (snapmesh/sim/world.py)."""

    ids: list[str]
    channels: list[tuple[str, str]]
    mode: str
    now: float
    app: Any  # a snapmesh.app.App (the bank's too)
    app_params: Mapping[str, Any]
    nodes: dict[str, node_mod.Node | None]
    fences: dict[str, Any]
    disks: Mapping[str, Disk]
    network: Network
    checker: Checker
    faults: Counter[str]

    @property
    def wall(self) -> float: ...

    def route(self, node_id: str) -> None: ...

    def crash(self, node_id: str, rng: random.Random) -> None: ...


class SimController(RestoreCalls):
    def __init__(self, world: Cluster, seed: int) -> None:
        self.world = world
        self.faults: Counter[str] = world.faults
        self.topology = Topology.build(world.ids, world.channels)
        self.journal = SimJournal(random.Random(seed * 104_729 + 6))
        self.up = True
        # Admission (the machine's A1): at most this many snapshots in progress (0: no limit).
        self.max_concurrent = random.Random(seed * 104_729 + 4).choice([0, 0, 1, 2, 3])
        # Retention (the machine's K1): the snapshot files of the `keep` newest COMPLETE ones kept (0: all).
        self.retention = RetentionCheck(random.Random(seed * 104_729 + 5).choice([0, 1, 2, 3]))
        self.machine = self._machine()
        self.reports: deque[tuple[str, core.FullState, int]] = deque()  # (node, part, its epoch) on the way here
        self.parts: dict[str, pb.RestoreStateRequest] = {}  # the running restore's parts not yet taken
        self.waiting: dict[str, pb.RestoreStateRequest] = {}  # node -> its part, taken, its RestoreReply not yet in
        self.recorded: dict[str, dict[str, core.FullState]] = {}  # snapshot -> the parts taken, as the nodes made them
        self.next_snapshot = 0
        self.broadcast = False  # every snapshot starts at every node at once (the machine's B1; fuzz --broadcast)
        self._restore_calls_begin(seed)  # RestoreSnapshot calls (sim/restore_calls.py)
        # Reports taken whose answer is lost: the node sends them again, and the copy
        # is late, arriving once a restore has begun (the controller must refuse it).
        self.resend_rng = random.Random(seed * 104_729 + 3)
        self.resent: deque[tuple[str, core.FullState, int]] = deque(maxlen=8)
        self.restoring: str | None = None  # the snapshot of the restore started and not yet settled
        self.settling = False  # the restore ended (RestoreDone), the machine not yet told it settled
        self.restarts = RestartCheck(DEADLINE)  # the machine's S1, judged (sim/restarts.py)
        # TriggerSnapshot with wait (the machine's W1): which triggers wait, from their own generator.
        self.wait_rng = random.Random(seed * 104_729 + 7)
        self.triggers = TriggerCheck()
        self.fence_calls: list[FenceAt] = []  # a stop's Fence calls not yet delivered
        self.files: list[pb.Snapshot] = []  # snapshot files a restart reads (the rescale steps' stop snapshot)
        # ReportState calls (held.py H1-H4): which reports come with a call, from their own generator.
        self.report_rng = random.Random(seed * 104_729 + 8)
        self.report_calls = ReportCheck()
        self.to_resend: list[Sent] = []  # unanswered when the controller crashed: sent again at its restart
        # Reports as blocks (sim/blockstore.py SB1-SB3), the controller's block disk and memory.
        self.blocks = SimBlocks(random.Random(seed * 104_729 + 9), self.faults)
        self.restore_blocks = SimRestores(random.Random(seed * 104_729 + 10), self.faults)  # restores as blocks (SB5)

    def _machine(self) -> machine.Controller:
        app = self.world.app
        tracker = Tracker(
            topology=self.topology, deadline_s=DEADLINE,  # an app's invariants judge
            snapshot_mode=hybrid.wire_mode(self.world.mode),  # a hybrid node reports as overtake (H1)
            checker=AppChecker(app.name, app, params=self.world.app_params,
                               fields=v1fields.for_app(app, self.world.app_params)),
        )
        return machine.Controller(tracker, max_concurrent=self.max_concurrent, keep=self.retention.keep)

    def now(self) -> Now:
        return Now(mono=self.world.now, wall=self.world.wall)

    def statuses(self) -> dict[str, str]:
        return {s.snapshot_id: pb.Snapshot.Status.Name(s.status) for s in self.machine.all()}

    # -- carrying out the machine's effects

    def carry_out(self) -> None:
        """The engine's loop: each step's effects in order, each after the records before it are durable."""
        completed = False
        while effects := self.machine.drain():
            completed |= self._judge(effects)
            needed = 0
            for effect in effects:
                kind = type(effect)
                if kind is machine.Journal:
                    needed = self.journal.append(effect.record)
                elif kind is machine.Barrier:
                    needed = self.journal.appended
                elif kind not in (machine.Publish, machine.Retire, machine.File, machine.Forget):  # no files here
                    self.journal.defer(needed, lambda effect=effect: self._effect(effect))
        if completed and self.retention.keep:
            self.retention.settled(self.machine.all(), self._protected())

    def _effect(self, effect: machine.Effect) -> None:
        kind = type(effect)
        if kind is machine.StartAt:
            self.journal.shown.setdefault(effect.snapshot_id, pb.Snapshot.IN_PROGRESS)
            self._start_at(effect)
        elif kind is machine.Finished:
            self.journal.shown[effect.snapshot.snapshot_id] = effect.snapshot.status
            self._finished(effect.snapshot)
        elif kind is machine.AbortAt:
            node = self.world.nodes[effect.node]
            if node is not None:
                node.abort_snapshot(effect.snapshot_id, effect.reason)
                self.world.fences[effect.node].lift(effect.snapshot_id)  # F2: a stop snapshot that failed
                self.world.route(effect.node)
        elif kind is machine.RestoreAt:
            self.journal.shown_epoch = max(self.journal.shown_epoch, effect.request.epoch)
            self.parts[effect.node] = effect.request
        elif kind is machine.RestoreDone:
            self.settling = True  # settled at the next restore_one (the engine awaits the record)
        elif kind is machine.AnswerRestore:
            self.answers.answered(effect, self.answered_at, len(self.journal.durable))
        elif kind is FenceAt:
            self.fence_calls.append(effect)  # delivered by the version steps (snapmesh/fuzzer/steps.py)
        elif kind is machine.AnswerTrigger:
            self.faults[self.triggers.answered(effect, self.journal.durable)] += 1
        elif kind is machine.AnswerReport:
            self.reports.extend(self.report_calls.answer(effect, self.journal.durable))
            self.faults["held reports answered at their snapshot's end"] += 1
        else:  # pragma: no cover
            raise TypeError(f"unrouted effect {effect!r}")

    def _judge(self, effects: list[machine.Effect]) -> bool:
        """The machine's decisions in one step: every FAILED snapshot brings an abort for every
        node of the topology, and only those; each Retire keeps the rule. True if one completed."""
        failed = {e.snapshot.snapshot_id for e in effects if type(e) is machine.Finished and e.snapshot.status == FAILED}
        aborted: dict[str, set[str]] = {}
        for effect in effects:
            if type(effect) is machine.Finished and effect.snapshot.status == COMPLETE:  # K2 spares it
                self.retention.completed(effect.snapshot.snapshot_id)
            elif type(effect) is machine.AbortAt:
                if effect.snapshot_id not in failed or effect.node in aborted.get(effect.snapshot_id, ()):
                    raise Violation(f"AbortAt {effect.node} for {effect.snapshot_id}, which did not just fail there")
                aborted.setdefault(effect.snapshot_id, set()).add(effect.node)
            elif type(effect) is machine.Retire:
                self.retention.retire(effect.snapshot_id, self.machine.all(), self._protected())
                self.blocks.retired(effect.snapshot_id)
                self.faults["snapshot retired (--keep)"] += 1
        for sid in failed:
            if aborted.get(sid, set()) != set(self.world.ids):
                missing = sorted(set(self.world.ids) - aborted.get(sid, set()))
                raise Violation(f"snapshot {sid} FAILED without an abort at {missing}")
        return any(type(e) is machine.Finished and e.snapshot.status == COMPLETE for e in effects)

    def journal_step(self) -> None:
        """A scheduler step: the journal may make some of what is pending durable."""
        if self.up and self.journal.step():
            self.faults["controller journal lagged"] += 1

    def _protected(self) -> str:
        last = self.machine.last_restore
        return last.snapshot_id if last is not None else ""

    def _start_at(self, effect: machine.StartAt) -> None:
        node = self.world.nodes[effect.node]
        if node is not None:
            try:
                node.start_snapshot(effect.snapshot_id, epoch=effect.epoch)  # the node's own fence (N8)
            except node_mod.EpochFenced:
                pass  # refused, changing nothing: as a down node, StartSnapshot failed
            else:
                self.world.route(effect.node)
                return
        self.machine.start_unreachable(effect.snapshot_id, effect.node, "", self.now())

    def _finished(self, snapshot: pb.Snapshot) -> None:
        sid = snapshot.snapshot_id
        if snapshot.status == COMPLETE:
            self.faults["snapshot complete"] += 1
            reports = self._from_blocks(snapshot, self.recorded[sid])
            self.world.checker.check_complete(sid, reports, snapshot.epoch)
            apps.agrees(snapshot)  # the controller's verdict agrees with the checker's (A2)
            if any(c.in_flight for c in snapshot.channels):
                self.faults["snapshot complete with app messages in flight"] += 1
            if carries_v1(snapshot) and not snapshot.conserved:  # an app without v1 figures: its invariants (above)
                raise Violation(f"snapshot {sid}: the controller's total {snapshot.total} != {snapshot.expected_total}")
            if hybrid.wire_mode(self.world.mode) == "overtake" and self._overtaken(reports):
                self.faults["overtaken transfers recorded"] += 1
            return
        assert snapshot.status == FAILED
        self.blocks.failed(sid)
        kind = kind_of_failure(snapshot.reason)
        if kind in ("deadline", "controller restarted"):
            self.restarts.expired(sid, kind, self.world.now)
        self.faults[f"snapshot failed: {kind}"] += 1

    def _from_blocks(self, snapshot: pb.Snapshot, reports: dict[str, core.FullState]) -> dict[str, core.FullState]:
        """The parts as the nodes made them, each state the one filed as blocks and rebuilt (SB1)."""
        rebuilt = self.blocks.filed(snapshot, {node: part.state for node, part in reports.items()})
        return {node: part if part.state is None else dataclasses.replace(part, state=rebuilt[node] or b"")
                for node, part in reports.items()}

    def _overtaken(self, reports: dict[str, core.FullState]) -> bool:
        """Did an early marker close a channel ahead of transfers the snapshot holds?"""
        return any(
            len(overtake.channel_state(reports, src, dst)) > len(reports[dst].channels.get(src, ()))
            for src, dst in self.world.channels
        )

    # -- snapshots

    def start_snapshot(self, rng: random.Random) -> None:
        if not self.up:
            return
        self.next_snapshot += 1
        before, limit = self.machine.in_progress, self.max_concurrent
        sid = f"s{self.next_snapshot}"
        call = self.triggers.call(sid) if self.wait_rng.random() < 0.4 else None  # W1: it waits for the end
        try:
            self.machine.trigger(sid, rng.choice(self.world.ids), self.now(), broadcast=self.broadcast, call=call)
        except machine.TooManySnapshots as exc:
            if call is not None:
                self.triggers.refused(call)
            if not limit or before < limit:
                raise Violation(
                    f"admission: a trigger refused with {before} in progress, the limit is {limit}: {exc}"
                ) from None
            self.faults["snapshot refused: too many in progress"] += 1
            return
        if limit and self.machine.in_progress > limit:
            raise Violation(f"admission: {self.machine.in_progress} snapshots in progress, the limit is {limit}")
        self.carry_out()

    def deliver_report(self) -> None:
        node_id, state, epoch = self.reports.popleft()
        if not self.up:
            return
        message, sent, pins = self._taken(node_id, report_message(state, epoch=epoch))
        current = self.machine.epoch
        call = self.report_calls.call((node_id, state, epoch)) if self.report_rng.random() < 0.8 else None
        try:
            _, duplicate = self.machine.reported(message, self.now(), call=call, sent=sent)
        except machine.StaleReport:
            self._refused(call, state.snapshot_id, pins)
            self.faults["stale report refused"] += 1
            return
        except (InvalidReport, DuplicateReport) as exc:
            raise Violation(f"{node_id}: the controller refused its report of {state.snapshot_id}: {exc}") from None
        except TrackerError:
            self._refused(call, state.snapshot_id, pins)
            return  # too late (the snapshot failed): the node's part is dropped
        self.blocks.accepted(node_id, message)  # the node takes the controller to hold its blocks
        self.restore_blocks.accepted(node_id, message)  # a restore sends it what that state lacks (RB1)
        held = call is not None and self.machine.holding(call)
        if held:
            self.faults["report held until its snapshot ends" if not duplicate else "a repeat joined a held report"] += 1
            if self.report_rng.random() < 0.1:  # the node's call timed out while held: it sends the report again (H3)
                self.reports.append((node_id, state, epoch))
        if 0 < epoch < current:
            raise Violation(f"{node_id}: the controller in epoch {current} took a report of epoch {epoch}")
        if not duplicate:
            self.recorded.setdefault(state.snapshot_id, {})[node_id] = state
        if self.resend_rng.random() < 0.2:
            self.resent.append((node_id, state, epoch))
        self.carry_out()
        if call is not None and not held:  # the shell answers once the step's records are durable (H4)
            self.journal.defer(self.journal.appended,
                               lambda: self.report_calls.answered((call,), self.journal.durable))

    def _taken(self, node_id: str, message: pb.FullState) -> tuple[pb.FullState, pb.FullState | None, int]:
        """The report as the node sends it (whole or as blocks), made whole by the controller: (the
        whole report, the form it came in when as blocks, its pins' call). One refused as MISSING
        is sent again whole at once (SB2): a round more, never a wrong state."""
        sent = self.blocks.form(node_id, message)
        self.restore_blocks.formed(node_id, message)  # the node holds the state it reported (RB3)
        whole, pins = self.blocks.take(sent)
        if whole is None:
            self.blocks.refused(node_id)
            sent = self.blocks.form(node_id, message)
            whole, pins = self.blocks.take(sent)
        assert whole is not None  # a report sent whole is its own whole form
        return whole, (sent if sent.HasField("state_blocks") else None), pins

    def _refused(self, call: int | None, snapshot_id: str = "", pins: int | None = None) -> None:
        if call is not None:
            self.report_calls.refused(call)
        if pins is not None:  # never journaled: nothing needs the blocks its call pinned kept
            self.blocks.unpin(snapshot_id, pins)

    def tick(self) -> None:
        if self.up:
            self.machine.tick(self.now())
            self.carry_out()

    def crash(self) -> None:
        self.faults["controller crash"] += self.up
        self.up = False
        self.reports.clear()
        self.journal.crash()
        self.blocks.crashed(self.journal.durable)
        self.answers.crashed()
        self.faults["waiting trigger lost in a controller crash"] += len(self.triggers.waiting) > 0
        self.triggers.crashed()
        self.to_resend += self.report_calls.crashed()

    def restart(self) -> None:
        """A new controller process: the machine rebuilt from the journal."""
        self.up = True
        self.machine = self._machine()
        self.retention.restarted()
        now = self.now()
        self.journal.crash()  # a new process: whatever was pending is gone
        self.machine.loaded(self.files)
        # S1: deadlines from `now` too; the reports journaled as blocks made whole from the block disk (journalblocks.py JB3)
        replayed = self.machine.replayed(self.blocks.replayed(self.journal.durable), now)
        self.restore_blocks.controller_restarted(self.blocks.stored)  # what each node holds, taken back (HT2)
        self.journal.restarted({s.snapshot_id: s.status for s in self.machine.all()}, self.machine.epoch)
        self.restarts.replayed(replayed, self.machine.all(), now.mono)
        self._restore_calls_restarted()
        self.parts.clear()
        self.waiting.clear()
        self.settling = False  # a RestoreDone not yet carried out: its record may be durable or lost
        if self.machine.to_resume:  # the replay says a restore was under way
            self.machine.resume(self.machine.get(self.machine.to_resume))
        else:
            self.restoring = None
        self.carry_out()
        if self.to_resend:  # the nodes whose calls died with the last process send their reports again
            self.faults["reports sent again after a controller crash"] += 1
            self.reports.extend(self.to_resend)
            self.to_resend = []
        if self.retention.keep:
            self.retention.settled(self.machine.all(), self._protected())

