"""The controller as one pure machine: the tracker, the cluster epoch, the restore gate and plan.

The gRPC controller (services/controller/engine.py) and the fault simulator
(snapmesh/sim) drive this same object. It never reads a clock, opens a socket
or writes a file: time comes in as `Now`, and what is to happen comes out as
effects, taken with `drain()` after each event.

Events in:
  trigger(snapshot_id, initiator, now, broadcast=False, call=None)
                                         a snapshot starts at `initiator`, or with
                                         `broadcast` at every node (B1) (raises
                                         UnknownInitiator, A2, or TooManySnapshots at
                                         the admission limit `max_concurrent`, A1,
                                         changing nothing); a `call` waits for its end (W1)
  start(initiator, now, entropy, ...)    a client's trigger: the machine names the snapshot
                                         and ("" initiator) draws the node, then `trigger`
  stop(initiator, now, entropy, call)    a stop with a snapshot (stopping.py ST1-ST5): Fence
                                         calls first, the snapshot once every node is fenced
  start_failed(snapshot_id, reason, now) StartSnapshot (or journaling the start) failed
  start_unreachable(snapshot_id, node, detail, now)
                                         StartSnapshot at `node` failed: the reason names it
                                         as the initiator, or as a node of a broadcast
  reported(state, now, call=None)        a node's FullState (raises the TrackerError kinds;
                                         StaleReport for one of an epoch before the cluster's);
                                         with a `call`, held until its snapshot ends (held.py H1-H4)
  tick(now)                              time passed: snapshots past their deadline fail
  restore(snapshot, request_id, now, call)
                                         a RestoreSnapshot call (the gate decides; snapshot
                                         None with snapshot_id: there is no such snapshot);
                                         `call` names it in its AnswerRestore (R5)
  resume(snapshot)                       after a restart: the journal's RESTORING restore runs again
                                         (`to_resume` names its snapshot; the shell loads it)
  node_restored(node, answer, now)       a node took its part (or why it could not)
  called(effect, answer, now)            a node's answer to a call an effect asked for (or the
                                         Failed its retry gave up on): start_unreachable or node_restored
  restore_settled()                      the restore's last record is durable: its calls are answered
  unjournaled(effects, error, now)       a record could not be made durable: `effects`, from
                                         its Journal on, were not carried out (J1-J3)
  loaded(snapshots, missing)             at a restart, the finished snapshots read from their
                                         files, and which files of them are missing (replay.py S2)
  replayed(records, now)                 then the journal read back (replay.py S1-S4):
                                         returns a `Replayed`, what it took back
  filed(snapshot_id)                     the snapshot's compact file is written (it may leave memory)

Reads (no change): get(id), all(), ids(), status(id), in_progress, to_resume,
topology, deadline_s, timer(now); shells read through these, not through `tracker`.

Effects out (in order; the shell carries them out in that order):
  Journal(record)        append this record; every effect after it in the same
                         drain shows the change, so it waits until the record is durable
  Barrier()              wait until everything journaled so far is durable
  StartAt(node, sid, epoch)   send StartSnapshot
  Finished(snapshot)     a snapshot ended: metrics, watchers, its file
  AnswerTrigger(calls, outcome)  answer these TriggerSnapshot calls (W1): the snapshot
                         ended, or the error that kept its end from being durable
  AbortAt(node, sid, reason)  a FAILED snapshot: send AbortSnapshot to this node
                         (one per node of the topology, after its Finished)
  Publish(snapshot)      show the snapshot's new state to watchers
  RestoreAt(node, request)    send this node its part of the restore
  Adopt(topology)        a rescale's restore started on the cluster file's node set
                         (restoring.py R7): call its nodes from here on
  RestoreDone(restore)   the restore ended (RESTORED or FAILED), as journaled: once
                         carried out, the shell says restore_settled()
  AnswerReport(calls, outcome)  answer these held ReportState calls (held.py H2)
  AnswerRestore(calls, outcome)  answer these RestoreSnapshot calls: the restore, or the
                         error that kept it from being durable
  Retire(snapshot_id)    retention (K1, K2): delete the snapshot's files (and forget its records)
  File(snapshot, compact, json)  write these files of the snapshot (replay.py S2, S3)
  Forget(snapshot_id)    the snapshot is filed: its journal records are dead (`filed`, S2)
A call to a node (StartAt, AbortAt, RestoreAt: its `rpc`, `request` and how it
is tried again, `retry`) comes back as `called`: the answer, or a retry.Failed.

Admission (Flink's max-concurrent-checkpoints):
A1. With `max_concurrent` N > 0, a trigger while N snapshots are in progress is
    refused and starts nothing, so a trigger rate the cluster cannot follow is
    answered at once instead of piling up markers and reports.
A2. A trigger naming a node outside the topology (a remote's mistake, not the
    tracker's misuse) is refused, starting nothing, before A1 is asked.

Retention (`--keep N`, `keep`; the rules' statement: retention.py):
K1. The finished snapshots older than the N newest COMPLETE ones (ids sort in
    start order) are retired, each once, except the one last restored (it goes
    once another restore replaced it). The rule runs on every COMPLETE (its
    Retire effects follow its Finished) and once after a restart (`replayed`),
    so the files of snapshots that are not worth keeping are never filed again.
K2. A COMPLETE never retires the snapshot it completed, whatever its id says
    (it may go at a later COMPLETE).

Waiting for a snapshot's end (TriggerSnapshot with wait):
W1. A trigger's `call` is answered by the snapshot's end, right after the end's
    Journal record (so once its outcome is durable) and before anything else the
    end does (Finished, AnswerReport): AnswerTrigger(calls, snapshot). The shell
    carries a step's effects out in one call once its records are durable, so
    nothing on the loop sees the difference; what the order decides is whose
    coroutine the next loop turn resumes first (the waiting trigger's, then the
    watchers' and the held reports'), and that the files are handed to their
    thread after the answer. The call is named at the trigger, so no snapshot can
    end before its wait began; one whose end cannot be journaled answers the error (J3).

Restart (`loaded`, then `replayed`): rules S1-S4 in replay.py, which decides what
is filed again and what is forgotten; no shell touches the tracker for it. The id
clock continues after the newest id brought back (snapshot_ids.py I1), so a start
after the restart sorts after every snapshot before it, the wall clock behind or not.

Broadcast trigger (Flink and Hazelcast Jet signal every source at once):
B1. With `broadcast`, the trigger emits one StartAt per node of the topology, the
    named initiator first, instead of one at the initiator. Chandy-Lamport allows
    any number of initiators of one snapshot: a node started after a marker for
    it already arrived ignores the start (core R4), so each node still cuts once
    and each channel still carries one marker. What it saves is the marker hop
    from the initiator to the others on the way to every cut. The journal's
    Started record is the same either way: after a restart the nodes' re-sent
    reports finish the snapshot, and nothing is started again.

Reports held until their snapshot ends, H1-H4 (one log round per snapshot): held.py,
a collaborator (`held`); `holding(call)` says whether a report's call waits for it.

Restore rules R1-R5 (one restore at a time): restoring.py, mixed in here.
Stop with a snapshot, ST1-ST5: stopping.py, a collaborator (`stopping`); its FenceAt
calls come back as `called`.

A record that cannot be made durable ends its step (`unjournaled`):
J1. A snapshot whose Started record is not durable fails ("cannot journal the start").
J2. A restore whose Restored record is not durable settles with the error: its
    calls are answered the error, and a retry of its key gets the restore as it was.
J3. A call that joined under a key whose Joined record is not durable, and a call
    whose answer (AnswerRestore, AnswerTrigger) was not carried out, is answered the error.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from snapmesh.protocol.controller import blockforms, journal, replay, restoregate
from snapmesh.protocol.controller.effects import (  # noqa: F401  (RestoreDone: the shells' ctl.RestoreDone)
    AbortAt, Adopt, AnswerReport, AnswerRestore, AnswerTrigger, Barrier, Call, Effect, Finished, Journal, Publish,
    RestoreAt, RestoreDone, Retire, StartAt, start_retry,
)
from snapmesh.protocol.controller.held import HeldReports
from snapmesh.protocol.controller.refusals import (  # noqa: F401  (the shells' ctl.TooManySnapshots...)
    StaleReport, TooManySnapshots, UnknownInitiator, stale_report,
)
from snapmesh.protocol.controller.replay import File, Forget, Replayed  # noqa: F401  (File: the shells' ctl.File)
from snapmesh.protocol.controller.restoring import Restoring
from snapmesh.protocol.controller.snapshot_ids import StartClock
from snapmesh.protocol.controller.stopping import FenceAt, Stopping
from snapmesh.protocol.controller.tracker import COMPLETE, Now, Reported, Tracker, TrackerError
from snapmesh.protocol.retry import Failed
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb


# ------------------------------------------------------------------ the machine


class Controller(Restoring):
    def __init__(
        self,
        tracker: Tracker,
        *,
        keys_kept: int = restoregate.KEYS_KEPT,
        max_key_bytes: int = restoregate.MAX_KEY_BYTES,
        max_concurrent: int = 0,  # A1: at most this many snapshots in progress (0: no limit)
        keep: int = 0,  # K1: the COMPLETE snapshots whose files are kept (0: all)
        cluster_file: str = "",  # the file that sets the limits: A1's refusal says how to raise it ("": it does not)
    ) -> None:
        if max_concurrent < 0:
            raise ValueError(f"max_concurrent must not be negative, got {max_concurrent}")
        if keep < 0:
            raise ValueError(f"keep must not be negative, got {keep}")
        self.max_concurrent = max_concurrent
        self.keep = keep
        self._raise_limit = cluster_file and (
            f" (controller.max_concurrent_snapshots in {cluster_file}, or snapmesh controller "
            "--max-concurrent-snapshots N); retry once one finishes"
        )
        self.tracker = tracker
        self.gate = restoregate.RestoreGate(keys_kept=keys_kept, max_key_bytes=max_key_bytes)
        self.last_restore: pb.Restore | None = None  # the newest restore, as journaled
        self.to_resume = ""  # set by `replayed`: the snapshot of a restore still RESTORING, for `resume`
        self._loaded: set[str] = set()  # by `loaded`: the snapshots in their files at a restart
        self._missing: dict[str, tuple[bool, bool]] = {}  # by `loaded`: of those, the files not there
        self._parts: dict[str, pb.RestoreStateRequest] = {}  # the running restore's, by node
        self._answers: dict[str, pb.RestoreStateResponse | str] = {}
        self._calls: dict[Hashable, str] = {}  # the calls the running restore answers (R5), with their keys
        self._waiting: dict[str, Hashable] = {}  # W1: by snapshot, the TriggerSnapshot call its end answers
        self._effects: list[Effect] = []
        self._starts = StartClock()  # ids in start order
        self.stopping = Stopping(tracker.topology.nodes, deadline_s=tracker.deadline_s)  # ST1-ST6: a stop under way
        self.held = HeldReports()  # H1-H4: reports whose record waits for their snapshot's end

    @property
    def epoch(self) -> int:
        """The cluster's epoch: one more per restore; reports of an older one are refused."""
        return self.tracker.epoch

    def drain(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects

    # -- snapshots

    def start(self, initiator: str, now: Now, entropy: bytes, *, broadcast: bool = False,
              call: Hashable = None) -> pb.Snapshot:
        """A client's trigger: at `initiator`, or ("") at a node drawn by `entropy` (8
        random bytes); its id is the start time (each after the last: StartClock) and
        the first 4 of them. Then `trigger`."""
        nodes = self.tracker.topology.nodes
        initiator = initiator or nodes[int.from_bytes(entropy[4:8], "big") % len(nodes)]
        snapshot_id, wall = self._starts.start(now.wall, entropy[:4])
        return self.trigger(snapshot_id, initiator, Now(mono=now.mono, wall=wall), broadcast=broadcast, call=call)

    def trigger(
        self, snapshot_id: str, initiator: str, now: Now, *, broadcast: bool = False, call: Hashable = None,
    ) -> pb.Snapshot:
        nodes = self.tracker.topology.nodes
        if initiator not in nodes:  # A2
            raise UnknownInitiator(f"unknown initiator {initiator!r} (nodes: {', '.join(nodes)})")
        running = self.tracker.in_progress
        if self.max_concurrent and running >= self.max_concurrent:  # A1
            raise TooManySnapshots(f"{running} snapshots in progress, the limit is {self.max_concurrent}{self._raise_limit}")
        snapshot = self.tracker.start(snapshot_id, initiator, now)
        if call is not None:  # W1
            self._waiting[snapshot_id] = call
        starts = [initiator]
        if broadcast:  # B1
            starts += [n for n in self.tracker.topology.nodes if n != initiator]
        self._effects += [
            Journal(journal.Started(snapshot_id=snapshot_id, initiator=initiator, wall=now.wall, epoch=snapshot.epoch)),
            Publish(snapshot),
            *(StartAt(node, snapshot_id, snapshot.epoch, start_retry(self.tracker.deadline_s)) for node in starts),
        ]
        return snapshot

    def stop(self, initiator: str, now: Now, entropy: bytes, *, call: Hashable) -> str:
        """A stop with a snapshot (stopping.py): its id named now, Fence calls to every
        node; the snapshot starts once they all answered. Raises StopRefused (ST1) and
        UnknownInitiator (A2), changing nothing. `call` is answered at the stop's end."""
        nodes = self.tracker.topology.nodes
        if initiator and initiator not in nodes:  # A2
            raise UnknownInitiator(f"unknown initiator {initiator!r} (nodes: {', '.join(nodes)})")
        running = self.gate.running
        self.stopping.check(restoring=running.snapshot_id if running is not None else "")  # ST1
        initiator = initiator or nodes[int.from_bytes(entropy[4:8], "big") % len(nodes)]
        snapshot_id, wall = self._starts.start(now.wall, entropy[:4])
        self._effects += self.stopping.begin(snapshot_id, initiator, wall, call)
        return snapshot_id

    def _fence_called(self, effect: FenceAt, answer: object, now: Now) -> None:
        effects, start = self.stopping.fenced(effect, answer)
        self._effects += effects
        if start is not None:  # ST2: every node is fenced
            snapshot_id, initiator, wall = start
            try:
                self.trigger(snapshot_id, initiator, Now(mono=now.mono, wall=wall), broadcast=True)
            except (TooManySnapshots, TrackerError) as exc:  # ST3
                self._effects += self.stopping.cannot_start(str(exc))

    def start_failed(self, snapshot_id: str, reason: str, now: Now) -> pb.Snapshot | None:
        """The snapshot could not start: it fails (None if it already finished)."""
        return self._fail(snapshot_id, reason, now)

    def start_unreachable(self, snapshot_id: str, node: str, detail: Failed | str, now: Now) -> pb.Snapshot | None:
        """StartSnapshot at `node` failed (`detail`: the status, "" when unknown): the
        snapshot fails, naming `node` as its initiator or as one node of a broadcast (B1)."""
        try:
            role = "initiator" if self.tracker.get(snapshot_id).initiator == node else "node"
        except TrackerError:  # finished and left memory before its start failed
            return None
        reason = f"{role} {node} unreachable: StartSnapshot failed" + (f" with {detail}" if detail else "")
        return self.start_failed(snapshot_id, reason, now)

    def called(self, effect: Call, answer: object, now: Now) -> None:
        """A node's answer to `effect`'s call, or the Failed its retry gave up on (an abort's changes nothing)."""
        if isinstance(effect, RestoreAt):
            self.node_restored(effect.node, answer, now)  # type: ignore[arg-type]
        elif isinstance(effect, StartAt) and isinstance(answer, Failed):
            self.start_unreachable(effect.snapshot_id, effect.node, answer, now)
        elif isinstance(effect, FenceAt):
            self._fence_called(effect, answer, now)

    def reported(self, state: pb.FullState, now: Now, *, call: Hashable = None,
                 sent: pb.FullState | None = None) -> Reported:
        """A node's part (raises TrackerError, changing nothing, for a refused one:
        StaleReport first, for a report of an older epoch, R1). With a `call`, a
        part that does not complete its snapshot is held (H1, H3): `holding(call)`.
        `sent`: the report as blocks `state` was rebuilt from, journaled in its place."""
        stale = stale_report(state.epoch, self.epoch)
        if stale:
            raise StaleReport(stale)
        snapshot, duplicate = answer = self.tracker.report(state, now)
        if duplicate:
            if call is not None and self.held.holds(state.snapshot_id, state.node_id):  # H3
                self.held.join(state.snapshot_id, call)
            else:  # the first copy may still be on its way to the disk
                self._effects.append(Barrier())
            return answer
        record = journal.Reported(state=state, wall=now.wall, sent=sent)
        if snapshot.status == COMPLETE:  # H2: the held records, its own, the outcome: one group commit
            held, calls = self.held.release(state.snapshot_id)  # in the order they came: a replay completes here too
            self._effects += [*(Journal(r) for r in held), Journal(record)]
            self._finished(snapshot, calls)
        elif call is not None:  # H1
            self.held.hold(record, call)
        else:
            self._effects += [Journal(record), Publish(snapshot)]
        return answer

    def holding(self, call: Hashable) -> bool:
        """The report that came with `call` is held: an AnswerReport answers it (H2)."""
        return self.held.holding(call)

    def tick(self, now: Now) -> list[pb.Snapshot]:
        """Fail every snapshot past its deadline; the caller comes back at `next_deadline()`."""
        expired = self.tracker.expire(now)
        for snapshot in expired:
            self._finished(snapshot)
        return expired

    def next_deadline(self) -> float | None:
        return self.tracker.next_deadline()

    def timer(self, now: float) -> float | None:
        """Seconds from `now` (monotonic) until `tick` is due, 0 when it is already (None: no deadline)."""
        deadline = self.tracker.next_deadline()
        return None if deadline is None else max(0.0, deadline - now)

    def filed(self, snapshot_id: str) -> None:
        """The snapshot's compact file is written: its records are dead, and past the
        working set it may leave memory."""
        self.tracker.filed(snapshot_id)
        self._effects.append(Forget(snapshot_id))

    # -- reads

    def get(self, snapshot_id: str) -> pb.Snapshot:
        """A copy of the snapshot (raises UnknownSnapshot)."""
        return self.tracker.get(snapshot_id)

    def all(self) -> list[pb.Snapshot]:
        return self.tracker.all()

    def listed(self, snapshot_id: str) -> pb.Snapshot:
        """The snapshot with its large states as block lists (tracker T9; raises UnknownSnapshot)."""
        return self.tracker.listed(snapshot_id)

    @property
    def forms(self) -> blockforms.BlockForms:
        """The listed reports' forms (blockforms.py): the shell notes them and sets their block reader."""
        return self.tracker.forms

    def ids(self) -> list[str]:
        return self.tracker.ids()

    def status(self, snapshot_id: str) -> int:
        return self.tracker.status(snapshot_id)

    @property
    def in_progress(self) -> int:
        return self.tracker.in_progress

    @property
    def topology(self) -> Topology:
        return self.tracker.topology

    @property
    def deadline_s(self) -> float:
        """How long a snapshot may take before it fails."""
        return self.tracker.deadline_s

    def _fail(self, snapshot_id: str, reason: str, now: Now) -> pb.Snapshot | None:
        failed = self.tracker.fail(snapshot_id, reason, now)
        if failed is not None:
            self._finished(failed)
        return failed

    def _finished(self, snapshot: pb.Snapshot, calls: tuple[Hashable, ...] = ()) -> None:
        """The snapshot ended; `calls`: the held reports' (H2), their records already in the step."""
        wall = snapshot.finished_at.ToNanoseconds() / 1e9
        record = journal.Finished(snapshot_id=snapshot.snapshot_id, status=snapshot.status, reason=snapshot.reason, wall=wall)
        _, dropped = self.held.release(snapshot.snapshot_id)  # H2: a failed snapshot's, not journaled
        self._effects.append(Journal(record))
        if (call := self._waiting.pop(snapshot.snapshot_id, None)) is not None:  # W1: first, once durable
            self._effects.append(AnswerTrigger((call,), snapshot))
        self._effects.append(Finished(snapshot))
        self._effects += [AnswerReport(calls + dropped)] if calls or dropped else []
        if snapshot.status != COMPLETE:  # every node drops its recording (it may be one that never heard)
            sid, reason = snapshot.snapshot_id, snapshot.reason
            self._effects += [AbortAt(node, sid, reason) for node in self.tracker.topology.nodes]
        else:
            self._effects += [Retire(sid) for sid in self._retired(completed=snapshot.snapshot_id)]
        self._effects += self.stopping.finished(snapshot)  # ST4, ST5

    def _retired(self, *, completed: str = "") -> list[str]:
        """K1 and, at a COMPLETE, K2 for the snapshot it `completed` (the tracker keeps
        the ids sorted, so this costs the ids it retires)."""
        if not self.keep:
            return []
        restored = self.last_restore.snapshot_id if self.last_restore is not None else ""
        return self.tracker.retired(self.keep, tuple(sid for sid in (restored, completed) if sid))

    def unjournaled(self, effects: Iterable[Effect], error: Exception, now: Now) -> None:
        """A step ended at a record that cannot be made durable: `effects`, from its
        Journal on, were not carried out (J1-J3)."""
        for effect in effects:
            record = effect.record if isinstance(effect, Journal) else None
            if isinstance(record, journal.Started):
                self.start_failed(record.snapshot_id, f"cannot journal the start: {error}", now)
            elif isinstance(record, journal.Restored) and self.gate.running is not None:
                self.restore_settled(error)
            elif isinstance(record, journal.Joined):
                calls = tuple(c for c, key in self._calls.items() if key == record.request_id)
                for c in calls:
                    del self._calls[c]
                self._effects += [AnswerRestore(calls, error)] if calls else []
            elif isinstance(effect, (AnswerRestore, AnswerTrigger, AnswerReport)):
                self._effects.append(type(effect)(effect.calls, error))

    # -- after a restart

    def loaded(self, snapshots: Iterable[pb.Snapshot], *, missing: replay.Missing | None = None) -> None:
        """At a restart, before `replayed`: the finished snapshots read from their files,
        and by id which of their files (compact, JSON) is not there (replay.py S2)."""
        for snapshot in snapshots:
            self.tracker.restore(snapshot)
            self._loaded.add(snapshot.snapshot_id)
        self._missing.update(missing or {})

    def replayed(self, records: Iterable[journal.Record], now: Now) -> Replayed:
        """The journal read back after a restart at `now` (replay.py): snapshots not
        `loaded` rebuilt (`journal.replay`), the epoch, every restore taken back with
        its keys (R4), every snapshot still in progress given a fresh deadline from
        `now` (S1); then File and Forget effects (S2, S3), and retention over all the
        machine holds (S4, K1: Retire). Later starts sort after every id it holds (I1).
        A newest restore still RESTORING is named by `to_resume`: the shell `resume`s it
        once it can reach the nodes."""
        records = list(records)
        finished, warnings = journal.replay(records, self.tracker, now, skip=self._loaded)
        self._starts.after(self.tracker.ids())  # I1: the files' ids and the journal's
        restores, more = journal.restores(records)
        self.taken_back(restores)
        last = self.last_restore  # R2: RESTORING was journaled before any node heard of it, so run it again
        self.to_resume = last.snapshot_id if last is not None and last.status == pb.Restore.RESTORING else ""
        in_progress = self.tracker.restarted(now)
        retired = self._retired()
        done = replay.taken_back(finished, in_progress, warnings + more, loaded=self._loaded, retired=retired)
        self._effects += [*replay.files(done, self._missing, self.tracker.listed), *(Retire(sid) for sid in retired)]
        return done

    def taken_back(self, restores: list[tuple[pb.Restore, list[str]]]) -> None:
        """The journal's restores, oldest first, each with the keys that joined it: the
        gate answers every kept key (its window drops the oldest), the newest is
        `last_restore` (resume it with `resume` when it is RESTORING)."""
        for restore, joined in restores:
            running = restore is restores[-1][0] and restore.status == pb.Restore.RESTORING
            self.gate.taken_back(restore.snapshot_id, restore.request_id, restore, running=running, joined=joined)
            self.tracker.epoch = max(self.tracker.epoch, restore.epoch)
        self.last_restore = restores[-1][0] if restores else None
