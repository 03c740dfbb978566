"""The controller machine's restores, mixed into `machine.Controller` (these methods
use its fields: `gate`, `tracker`, `last_restore`, `_effects`, `_parts`, `_answers`,
`_calls`, `to_resume`, `_fail`).

Restore rules (one restore at a time, decided by `restoregate.RestoreGate`):
R1. The check and the claim are one step: `restore` decides and, on Start,
    moves the epoch to E+1 at once, so every report of epoch E is refused from
    then on, and every snapshot in progress fails "restored to S".
R2. RESTORING is journaled before any node hears of it (Journal before RestoreAt).
R3. Each node gets its recorded part (its entry's app fields, filled by the
    app's side, appside.py; an app's state bytes, or a large one's block list,
    restorestream.py RS0-RS1: `listed_restore`) and the recorded in-flight
    items of every channel into it (`plan`); the restore is RESTORED when every node took
    its part, FAILED naming the nodes that could not, and the cluster stays
    fenced at E+1 either way.
R4. A key answers its own restore (running: join it; finished: its answer, once
    that answer is durable), never starts another. A key that joins a running
    restore becomes that restore's: its `joined` record is journaled (the call
    is answered once it is durable), and after a restart every kept key, oldest
    first, is taken back with the restore it started or joined.
R6. A snapshot of an older version of the app is upgraded for the code the
    controller loaded (snapmesh/protocol/upgrade.py) before
    the gate decides: a refused upgrade (no upgrade(), a version going
    backwards, an upgrade that raises, an invariant it breaks) is the
    restore's refusal, so no epoch moves and no node hears of it. A resumed
    restore upgrades again (a pure function: the same parts).
R7. A snapshot of another node set than the controller's topology is
    rescaled for it (snapmesh/protocol/rescale.py RS1-RS7) after the upgrade
    and before the gate decides, on the same terms: a refused rescale is the
    restore's refusal, a resumed restore rescales again (a pure function).
    A target node set other than the topology is the cluster file's as read at
    the call (RS2, `candidate`); when the restore starts, the machine adopts it
    (Adopt, after the RESTORING record and before any part is sent), so a
    running controller rescales without a restart. It is not journaled: a
    controller restarted reads the same cluster file, and resumes on it.
R5. Every call that starts or joins a restore is answered by it (AnswerRestore),
    once its outcome is durable: a call of a running restore when it settles; a
    call that joins a restore that ended (its outcome not yet settled) and a
    retry of a finished one at once, each after everything journaled before it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from snapmesh.protocol import restorestream
from snapmesh.protocol.controller import journal, restoregate
from snapmesh.protocol.controller.effects import RESTORE, Adopt, AnswerRestore, Barrier, Journal, RestoreAt, RestoreDone
from snapmesh.protocol.controller.restoreplan import plan, problem, with_app_fields
from snapmesh.protocol.controller.tracker import Now, UnknownSnapshot
from snapmesh.protocol.retry import Failed
from snapmesh.protocol.topology import Topology
from snapmesh.protocol import rescale, upgrade
from snapmesh.protocol.rescale import RescaleRefused
from snapmesh.protocol.upgrade import UpgradeRefused
from snapmesh.v1 import snapmesh_pb2 as pb


class Restoring:
    """Mixed into `machine.Controller`: RestoreSnapshot calls, each node's part and the outcome."""

    def restore(
        self, snapshot: pb.Snapshot | None, request_id: str, now: Now, *, snapshot_id: str = "",
        call: Hashable = None, nodes: Sequence[str] = (), candidate: Topology | str | None = None,
    ) -> restoregate.Decision:
        """A RestoreSnapshot call for `snapshot` (R1, R4), or for `snapshot_id` when
        there is no such snapshot: the gate's decision (it alone checks the key);
        on Start the epoch moves, snapshots in progress fail, and the restore begins.
        A `call` that starts or joins it, or retries a finished one, is answered (R5).
        `nodes`: the target node set the call asked for (R7; empty: none); `candidate`:
        the controller's cluster file's topology as read for it (a str: why it could not be read)."""
        if snapshot is None:
            if not snapshot_id:
                raise ValueError("restore: no snapshot and no snapshot_id")
            decision = self.gate.request(snapshot_id, request_id, now.wall, missing=True)
        topology = self.tracker.topology
        if snapshot is not None:
            if snapshot_id and snapshot_id != snapshot.snapshot_id:
                raise ValueError(f"restore: snapshot_id {snapshot_id!r} is not the snapshot's ({snapshot.snapshot_id!r})")
            why = problem(snapshot)
            if not why:
                try:
                    snapshot = upgrade.for_side(self.tracker.side, snapshot)  # R6: before the gate, so a refusal changes nothing
                except UpgradeRefused as exc:
                    why = f"cannot restore into this code: {exc}"
            if not why:
                try:
                    topology = rescale.target_topology(self.tracker.topology, list(nodes), candidate)  # R7
                    snapshot = rescale.for_side(self.tracker.side, snapshot, topology, list(nodes))
                except RescaleRefused as exc:
                    why = f"cannot rescale: {exc}"
            decision = self.gate.request(snapshot.snapshot_id, request_id, now.wall, why)
        if isinstance(decision, restoregate.Join) and decision.joined_key:
            running = self.last_restore  # RESTORING, or already ended with its record not yet durable
            assert running is not None, "the gate joined a restore the machine does not know"
            self._effects.append(Journal(journal.Joined(request_id=decision.joined_key, epoch=running.epoch)))
        if call is not None:
            self._answer_later(decision, call, request_id)
        if not isinstance(decision, restoregate.Start):
            return decision
        epoch = self.tracker.epoch + 1
        self.tracker.epoch = epoch  # from here on, reports of the older epoch are refused
        for sid in self.tracker.pending_ids():
            self._fail(sid, f"restored to {snapshot.snapshot_id}", now)
        started = pb.Restore(
            snapshot_id=snapshot.snapshot_id, epoch=epoch, status=pb.Restore.RESTORING, request_id=request_id
        )
        started.started_at.FromNanoseconds(int(decision.at * 1e9))
        self.last_restore = started
        self._effects.append(Journal(journal.Restored(restore=started)))  # R2: before any node hears of it
        if topology is not self.tracker.topology:  # R7: the cluster file's node set, from here on
            self.tracker.adopt(topology)
            self.stopping.nodes = tuple(topology.nodes)
            self._effects.append(Adopt(topology))
        self._send_parts(snapshot, started)
        return decision

    def listed_restore(self, snapshot_id: str, nodes: Sequence[str] = ()) -> pb.Snapshot | None:
        """The snapshot a restore of `snapshot_id` takes as block lists (restorestream.py RS0),
        as the tracker holds it; None: the restore reads it whole (or the tracker has none)."""
        try:
            listed = self.tracker.listed(snapshot_id)
        except UnknownSnapshot:
            return None
        return listed if restorestream.keeps_listed(listed, self.tracker.side, nodes) else None

    def filed_restore(self, stored: pb.Snapshot | None, nodes: Sequence[str] = ()) -> pb.Snapshot | None:
        """`stored`, a snapshot the tracker no longer holds read from its file with its large
        states as block lists (services/controller/listedload.py), when a restore of it goes so
        (RS0); None: the restore reads it whole (joined, as a rescale or an upgrade needs)."""
        if stored is None or stored.snapshot_id in self.tracker.ids():
            return None
        return stored if restorestream.keeps_listed(stored, self.tracker.side, nodes) else None

    def resume(self, snapshot: pb.Snapshot) -> None:
        """After a restart: run the journal's RESTORING restore again (same epoch, same snapshot)."""
        started = self.last_restore
        assert started is not None and started.status == pb.Restore.RESTORING, "nothing to resume"
        self.tracker.epoch = max(self.tracker.epoch, started.epoch)
        self.to_resume = ""
        try:
            snapshot = upgrade.for_side(self.tracker.side, snapshot)  # R6, again
            snapshot = rescale.for_side(self.tracker.side, snapshot, self.tracker.topology, None)  # R7, again
        except (UpgradeRefused, RescaleRefused) as exc:  # the code changed since the restore began: no node can take its part
            self._parts, self._answers = {n: pb.RestoreStateRequest() for n in self.tracker.topology.nodes}, {}
            when = Now(mono=0.0, wall=started.started_at.ToNanoseconds() / 1e9)  # resume has no clock; the start's
            for node in sorted(self._parts):
                self.node_restored(node, f"cannot restore into this code: {exc}", when)
            return
        self._send_parts(snapshot, started)

    def _send_parts(self, snapshot: pb.Snapshot, started: pb.Restore) -> None:
        self._parts = with_app_fields(plan(snapshot, started.epoch), snapshot, self.tracker.side)
        self._answers = {}
        self._effects += [RestoreAt(node, self._parts[node]) for node in sorted(self._parts)]

    def node_restored(self, node: str, answer: pb.RestoreStateResponse | Failed | str, now: Now) -> pb.Restore | None:
        """`node`'s answer to its part, or the call given up on (or why it could not
        take it) (R3). Once every node answered: the restore's outcome, journaled (else None)."""
        started = self.last_restore
        if started is None or started.status != pb.Restore.RESTORING or node not in self._parts:
            return None
        self._answers[node] = RESTORE.gave_up(answer) if isinstance(answer, Failed) else answer
        if len(self._answers) < len(self._parts):
            return None
        names = sorted(self._parts)
        done = pb.Restore()
        done.CopyFrom(started)
        failures = [f"{n}: {self._answers[n]}" for n in names if isinstance(self._answers[n], str)]
        if failures:
            done.status = pb.Restore.FAILED
            done.reason = "not restored on " + "; ".join(failures) + f" (the cluster is fenced at epoch {started.epoch})"
        else:
            done.status = pb.Restore.RESTORED
            for n in names:
                self.tracker.side.restored(done.nodes.add(node_id=n), self._answers[n], self._parts[n])  # type: ignore[arg-type]
        done.finished_at.FromNanoseconds(int(round(now.wall * 1e9)))
        self.last_restore = done
        self._parts, self._answers = {}, {}
        self._effects += [Journal(journal.Restored(restore=done)), RestoreDone(done)]
        return done

    def _answer_later(self, decision: restoregate.Decision, call: Hashable, request_id: str) -> None:
        """R5: who answers `call`, and when."""
        if isinstance(decision, restoregate.Answer):
            self._effects.append(AnswerRestore((call,), decision.result))
        elif isinstance(decision, restoregate.Start) or (
            isinstance(decision, restoregate.Join) and self.last_restore.status == pb.Restore.RESTORING  # type: ignore[union-attr]
        ):
            self._calls[call] = request_id
        elif isinstance(decision, restoregate.Join):  # ended: after its outcome's record (and the key's, just appended)
            self._effects += [*([] if decision.joined_key else [Barrier()]), AnswerRestore((call,), self.last_restore)]

    def restore_settled(self, error: Exception | None = None) -> None:
        """The running restore's newest record is durable (or, with `error`, can no
        longer be, J2): the gate hears its end, a retry of its key is answered from
        now on (R4), and every call it has is answered (R5)."""
        self.gate.finished(self.last_restore)
        calls, self._calls = tuple(self._calls), {}
        if calls:
            self._effects.append(AnswerRestore(calls, error or self.last_restore))  # type: ignore[arg-type]
