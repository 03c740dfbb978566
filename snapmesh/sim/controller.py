"""The controller process in the simulator: the production machine, a journal, the restore calls.

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
  File, Forget      nothing: the simulator keeps no snapshot files (a restart replays the journal)
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

Controller faults: crash (reports on the way are lost), a report sent again
whose copy arrives only after a restore began (refused: its epoch is stale), and restart (the
journal replayed: finished snapshots come back, those in progress get a fresh
deadline and fail "controller restarted" unless their reports come in, and a
RESTORING restore resumes at every node). RestoreSnapshot calls come from their
own generator (`restore_rng`): bursts of concurrent calls, new keys joining the
running restore, retries with the same key (while it runs, after it ended, and
after a controller restart), a key reused for another snapshot, snapshots that
cannot be restored. A key that started or joined a restore never starts another
while the gate's window holds it, across controller restarts too.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any, Protocol

from snapmesh.protocol.controller import machine
from snapmesh.protocol.controller import journal as records
from snapmesh.protocol.node import core
from snapmesh.protocol import hybrid, overtake
from snapmesh.protocol.reports import report_message
from snapmesh.protocol.controller import restoregate
from snapmesh.protocol.node import machine as node_mod
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.topology import Topology
from snapmesh.protocol.controller.tracker import COMPLETE, FAILED, InvalidReport, Now, Tracker, TrackerError, DuplicateReport
from snapmesh.sim import apps
from snapmesh.sim.disk import Disk
from snapmesh.sim.invariants import Checker, Violation
from snapmesh.sim.journal import SimJournal
from snapmesh.sim.network import Network
from snapmesh.sim.restore_answers import AnswerCheck
from snapmesh.sim.restarts import RestartCheck, kind_of_failure
from snapmesh.sim.retention import RetentionCheck
from snapmesh.v1 import snapmesh_pb2 as pb

DEADLINE = 3.0  # the controller's snapshot deadline (simulated seconds)


class Cluster(Protocol):
    """What the simulated controller uses of the world (snapmesh/sim/world.py)."""

    ids: list[str]
    channels: list[tuple[str, str]]
    balances: Mapping[str, int]
    mode: str
    now: float
    app: Any  # a snapmesh.app.App, or None (the bank)
    app_params: Mapping[str, Any]
    nodes: dict[str, node_mod.Node | None]
    disks: Mapping[str, Disk]
    network: Network
    checker: Checker
    faults: Counter[str]

    @property
    def wall(self) -> float: ...

    def route(self, node_id: str) -> None: ...

    def crash(self, node_id: str, rng: random.Random) -> None: ...


class SimController:
    def __init__(self, world: Cluster, seed: int) -> None:
        self.world = world
        self.faults: Counter[str] = world.faults
        self.topology = Topology.build(world.ids, world.channels)
        self.expected_total = sum(world.balances.values())
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
        # RestoreSnapshot calls (see the module doc), and what the fuzzer checks of the answers.
        self.restore_rng = random.Random(seed * 104_729 + 2)
        # Reports taken whose answer is lost: the node sends them again, and the copy
        # is late, arriving once a restore has begun (the controller must refuse it).
        self.resend_rng = random.Random(seed * 104_729 + 3)
        self.resent: deque[tuple[str, core.FullState, int]] = deque(maxlen=8)
        self.restoring: str | None = None  # the snapshot of the restore started and not yet settled
        self.settling = False  # the restore ended (RestoreDone), the machine not yet told it settled
        self.key_snapshot: dict[str, str] = {}  # key -> the snapshot its first call named
        self.answered: dict[str, str] = {}  # key -> the snapshot of the restore it started or joined (never forgotten)
        self.answered_at: dict[str, int] = {}  # key -> the journal's length once its record is in
        self.keys_at_restart: set[str] = set()  # the keys answered before the newest controller restart
        self.restarts = RestartCheck(DEADLINE)  # the machine's S1, judged (sim/restarts.py)
        self.next_restore_key = 0
        self.answers = AnswerCheck()  # the machine's R5, judged

    def _machine(self) -> machine.Controller:
        app = self.world.app
        tracker = Tracker(
            topology=self.topology, expected_total=self.expected_total, deadline_s=DEADLINE,
            snapshot_mode=hybrid.wire_mode(self.world.mode),  # a hybrid node reports as overtake (H1)
            checker=AppChecker(app.name, app, params=self.world.app_params) if app is not None else None,
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
                self.world.route(effect.node)
        elif kind is machine.RestoreAt:
            self.journal.shown_epoch = max(self.journal.shown_epoch, effect.request.epoch)
            self.parts[effect.node] = effect.request
        elif kind is machine.RestoreDone:
            self.settling = True  # settled at the next restore_one (the engine awaits the record)
        elif kind is machine.AnswerRestore:
            self.answers.answered(effect, self.answered_at, len(self.journal.durable))
        else:  # pragma: no cover
            raise TypeError(f"unrouted effect {effect!r}")

    def _judge(self, effects: list[machine.Effect]) -> bool:
        """The machine's decisions in one step: every FAILED snapshot brings an abort for every
        node of the topology, and only those; each Retire keeps the rule. True if one completed."""
        failed = {e.snapshot.snapshot_id for e in effects if type(e) is machine.Finished and e.snapshot.status == FAILED}
        aborted: dict[str, set[str]] = {}
        for effect in effects:
            if type(effect) is machine.AbortAt:
                if effect.snapshot_id not in failed or effect.node in aborted.get(effect.snapshot_id, ()):
                    raise Violation(f"AbortAt {effect.node} for {effect.snapshot_id}, which did not just fail there")
                aborted.setdefault(effect.snapshot_id, set()).add(effect.node)
            elif type(effect) is machine.Retire:
                self.retention.retire(effect.snapshot_id, self.machine.all(), self._protected())
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
            reports = self.recorded[sid]
            self.world.checker.check_complete(sid, reports, snapshot.epoch)
            if self.world.app is not None:  # the controller's verdict agrees with the checker's (A2)
                apps.agrees(snapshot)
                if any(c.in_flight for c in snapshot.channels):
                    self.faults["snapshot complete with app messages in flight"] += 1
            if not snapshot.conserved:
                raise Violation(f"snapshot {sid}: the controller's total {snapshot.total} != {snapshot.expected_total}")
            if hybrid.wire_mode(self.world.mode) == "overtake" and self._overtaken(reports):
                self.faults["overtaken transfers recorded"] += 1
            return
        assert snapshot.status == FAILED
        kind = kind_of_failure(snapshot.reason)
        if kind in ("deadline", "controller restarted"):
            self.restarts.expired(sid, kind, self.world.now)
        self.faults[f"snapshot failed: {kind}"] += 1

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
        try:
            self.machine.trigger(f"s{self.next_snapshot}", rng.choice(self.world.ids), self.now(),
                                 broadcast=self.broadcast)
        except machine.TooManySnapshots as exc:
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
        message = report_message(state, epoch=epoch)
        current = self.machine.epoch
        try:
            _, duplicate = self.machine.reported(message, self.now())
        except machine.StaleReport:
            self.faults["stale report refused"] += 1
            return
        except (InvalidReport, DuplicateReport) as exc:
            raise Violation(f"{node_id}: the controller refused its report of {state.snapshot_id}: {exc}") from None
        except TrackerError:
            return  # too late (the snapshot failed): the node's part is dropped
        if 0 < epoch < current:
            raise Violation(f"{node_id}: the controller in epoch {current} took a report of epoch {epoch}")
        if not duplicate:
            self.recorded.setdefault(state.snapshot_id, {})[node_id] = state
        if self.resend_rng.random() < 0.2:
            self.resent.append((node_id, state, epoch))
        self.carry_out()

    def tick(self) -> None:
        if self.up:
            self.machine.tick(self.now())
            self.carry_out()

    def crash(self) -> None:
        self.faults["controller crash"] += self.up
        self.up = False
        self.reports.clear()
        self.journal.crash()
        self.answers.crashed()

    def restart(self) -> None:
        """A new controller process: the machine rebuilt from the journal."""
        self.up = True
        self.machine = self._machine()
        self.retention.restarted()
        now = self.now()
        self.journal.crash()  # a new process: whatever was pending is gone
        replayed = self.machine.replayed(self.journal.durable, now)  # S1: deadlines from `now` too
        self.journal.restarted({s.snapshot_id: s.status for s in self.machine.all()}, self.machine.epoch)
        self.restarts.replayed(replayed, self.machine.all(), now.mono)
        # A key whose record was still pending was never answered: the machine rightly forgot it.
        self.answered = {k: v for k, v in self.answered.items() if self.answered_at[k] <= len(self.journal.durable)}
        self.keys_at_restart = set(self.answered)
        # ... and a key it forgot may start another snapshot's restore: which snapshot it names is open again
        self.key_snapshot = {k: v for k, v in self.key_snapshot.items() if k in self.answered}
        self.parts.clear()
        self.waiting.clear()
        self.settling = False  # a RestoreDone not yet carried out: its record may be durable or lost
        if self.machine.to_resume:  # the replay says a restore was under way
            self.machine.resume(self.machine.get(self.machine.to_resume))
        else:
            self.restoring = None
        self.carry_out()
        if self.retention.keep:
            self.retention.settled(self.machine.all(), self._protected())

    # -- restore

    def restore_one(self, rng: random.Random, crash: bool = True) -> None:
        """The controller's RestoreState reaches one node that has not taken its part yet
        (or, once the restore ended, the machine hears it settled)."""
        if self.restoring is None or not self.up:
            return
        if self.settling:
            self.settling = False
            self.restoring = None
            self.machine.restore_settled()
            self.carry_out()
            return
        ready = sorted(n for n in self.parts if self.world.nodes[n] is not None)
        if not ready:
            return
        node_id = rng.choice(ready)
        request = self.parts.pop(node_id)
        node = self.world.nodes[node_id]
        in_flight, app = apps.restore_part(request, app=self.world.app is not None)  # an app's: state and payloads too
        if app and in_flight:
            self.faults["restore part with app messages in flight"] += 1
        self.waiting[node_id] = request  # the node's RestoreReply answers it (`restored`)
        node.restore(  # type: ignore[union-attr]
            snapshot_id=request.snapshot_id, epoch=request.epoch, tally=request.balance, in_flight=in_flight,
            reply_to=request, **app,
        )
        self.world.route(node_id)  # its EndStreams ends the older epoch's connections
        if crash and rng.random() < 0.25:
            self.faults["crash during a restore"] += 1
            self.world.crash(node_id, rng)

    def restored(self, node_id: str, reply: node_mod.RestoreReply) -> None:
        """`node_id`'s RestoreReply: the answer goes back (a call this process no longer waits for is gone)."""
        if self.waiting.get(node_id) is not reply.to:
            return
        del self.waiting[node_id]
        if self.up:
            answer = pb.RestoreStateResponse(epoch=reply.epoch, balance=reply.tally)
            self.machine.node_restored(node_id, answer, self.now())
            self.carry_out()

    def crashed(self, node_id: str) -> None:
        """`node_id` died: a restore answer it owed is lost, and its part is sent again."""
        waiting = self.waiting.pop(node_id, None)
        if waiting is not None and self.up:
            self.parts[node_id] = waiting

    def start_restore(self, rng: random.Random) -> None:
        complete = [s.snapshot_id for s in self.machine.all() if s.status == COMPLETE]
        if not self.up or self.restoring is not None or not complete:
            return
        sid = rng.choice(complete)
        if isinstance(self.machine.restore(self.machine.get(sid), "", self.now()), restoregate.Start):
            self._started(sid, "")

    def _started(self, sid: str, key: str) -> None:
        """The machine said Start: it rolls back to `sid` in a new epoch."""
        if self.restoring is not None:
            raise Violation(f"restore: a second restore ({sid}) started while the restore of {self.restoring} runs")
        if key in self.answered and len(self.answered) <= self.machine.gate.keys_kept:
            raise Violation(
                f"restore: request_id {key!r} rolled back a second time (to {sid}); it already started or joined"
                f" the restore of {self.answered[key]}"
            )
        self.restoring = sid
        self.faults["restore"] += 1
        self.reports.extendleft(self.resent)  # the late copies arrive now, from the epoch before
        self.resent.clear()
        self.parts.clear()
        self.waiting.clear()
        self.carry_out()
        if key:
            self.answered[key] = sid
            self.answered_at[key] = self.journal.appended  # its RESTORING record

    def restore_calls(self, *, always: bool = False) -> None:
        """Clients call RestoreSnapshot: one call, a retry, or a burst of concurrent calls."""
        rng = self.restore_rng
        ids = self.machine.ids()
        if (not always and rng.random() >= 0.04) or not self.up or not ids:
            return
        for _ in range(rng.choice([1, 1, 2, 3])):
            keys = list(self.key_snapshot)
            roll = rng.random()
            if keys and roll < 0.4:  # a retry of an earlier call
                key = rng.choice(keys)
                sid = self.key_snapshot[key]
            elif keys and roll < 0.5:  # an earlier key, another snapshot
                key, sid = rng.choice(keys), self._restore_target(rng, ids)
            elif self.restoring is not None and roll < 0.65:  # a new key for the restore that runs: it joins
                self.next_restore_key += 1
                key, sid = f"k{self.next_restore_key}", self.restoring
            else:
                sid = self._restore_target(rng, ids)
                key = ""
                if rng.random() < 0.7:
                    self.next_restore_key += 1
                    key = f"k{self.next_restore_key}"
            self.restore_call(sid, key)

    def _restore_target(self, rng: random.Random, ids: list[str]) -> str:
        """Mostly a COMPLETE snapshot (so calls start, join, get answers and Busy), sometimes
        any, now and then one that does not exist."""
        complete = [sid for sid in ids if self.machine.status(sid) == COMPLETE]
        roll = rng.random()
        if complete and roll < 0.85:
            return rng.choice(complete)
        return "gone" if roll > 0.97 else rng.choice(ids)

    def restore_call(self, sid: str, key: str) -> None:
        known = self.key_snapshot.get(key) if key else None
        snapshot = self.machine.get(sid) if sid in self.machine.ids() else None
        call = self.answers.call(sid, key)
        decision = self.machine.restore(snapshot, key, self.now(), snapshot_id=sid, call=call)
        self.answers.decided(call, decision)
        kind = type(decision)
        if kind is restoregate.Start:
            if key:  # the gate did not know the key (never durable, or out of its window): it is this restore's now
                self.key_snapshot[key] = sid
            self._started(sid, key)
            self.faults["restore call started a restore"] += 1
        elif kind is restoregate.Join:
            if self.restoring != sid:
                raise Violation(f"restore: a call for {sid} joined the restore of {self.restoring}")
            self.faults["restore call joined the running restore"] += 1
            if key and key not in self.answered:  # the key is this restore's from now on, journaled
                if decision.joined_key != key:
                    raise Violation(f"restore: the new key {key!r} joined the restore of {sid} unjournaled")
                self.key_snapshot[key] = sid
                self.answered[key] = sid
                self.answered_at[key] = self.journal.appended + 1  # its joined record, journaled just below
                self.faults["restore call joined under its own key"] += 1
                if self.settling:
                    self.faults["restore call joined under its own key after the restore ended"] += 1
            self.carry_out()
            if decision.joined_key and not any(  # R4: answered only once its joined record is durable
                type(r) is records.Joined and r.request_id == key
                for r in reversed([*self.journal.durable[-4:], *self.journal.pending][-4:])
            ):
                raise Violation(f"restore: {key!r} joined the restore of {sid} and no joined record is journaled")
        elif kind is restoregate.Answer:
            if decision.result is None or decision.result.snapshot_id != sid:
                raise Violation(f"restore: a retry of {key!r} for {sid} was answered {decision.result!r}")
            self.faults["restore retry answered, not rolled back"] += 1
            self.carry_out()
            if key in self.keys_at_restart:
                self.faults["restore retry answered across a controller restart"] += 1
        elif kind is restoregate.Busy:
            if self.restoring is None or self.restoring == sid:
                raise Violation(f"restore: a call for {sid} refused busy while {self.restoring} runs")
            self.faults["restore refused: another restore runs"] += 1
        elif decision.code == "INVALID_ARGUMENT":
            if known is None or known == sid:
                raise Violation(f"restore: {key!r} for {sid} refused: {decision.message}")
            self.faults["restore refused: key of another snapshot"] += 1
        elif decision.code == "NOT_FOUND":
            if snapshot is not None:
                raise Violation(f"restore: {sid}, which exists, refused NOT_FOUND: {decision.message}")
            self.faults["restore refused: no such snapshot"] += 1
        else:
            self.faults["restore refused: not restorable"] += 1
