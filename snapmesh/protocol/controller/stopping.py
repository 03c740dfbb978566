"""Stop with a snapshot (TriggerSnapshotRequest.stop; Flink's stop-with-savepoint): the controller's part.

A pure collaborator the controller machine owns (machine.Controller.stopping):
it holds the one stop under way and says, as effects, which Fence calls go to
which node and when the stop's TriggerSnapshot call is answered. The machine
starts the snapshot when `fenced` says every node is fenced, and hands it every
finished snapshot (`finished`) and every Fence answer (`called`).

Rules:
ST1. A stop is refused, changing nothing, while a restore runs or another stop
     is under way (StopRefused, FAILED_PRECONDITION), one line naming it.
ST2. FENCE goes to every node first; the snapshot starts (at every node, B1) only
     once every node answered its fence. Every cut then comes after every
     node's fence, so no command a client saw accepted is after its node's cut:
     the snapshot holds every one (0 commands lost).
ST3. A fence that fails (or a snapshot that cannot start) ends the stop before
     any snapshot: LIFT at every node, and the call is answered StopFailed
     (UNAVAILABLE) naming the node and why.
ST4. The snapshot COMPLETE: STOP at every node; the call is answered with the
     snapshot once every node answered its STOP; a node that could not is named
     in a StopFailed answer instead (the snapshot stays COMPLETE).
ST5. The snapshot FAILED: LIFT at every node (their AbortSnapshot lifts it too,
     so a controller restart cannot leave a cluster fenced for a failed
     snapshot), and the call is answered with the FAILED snapshot.
ST6. A FENCE says how long it holds with no STOP (`lift_after`: the fences'
     retries, the snapshot's deadline, and as much again), so a node that missed its
     LIFT, or whose controller went away mid-stop, takes commands again.
ST7. A stop is not journaled: a controller that restarts forgets it (its call
     failed with the connection). What happens then, by where the stop was:
     fencing, before the snapshot started: nothing was journaled; every node
       lifts at `lift_after` (ST6) and the cluster runs on, no snapshot taken;
     the snapshot in progress: its Started record brings it back (S1), and it
       ends COMPLETE or FAILED as any snapshot, but no STOP or LIFT follows:
       COMPLETE, every node lifts at `lift_after` and runs on, and the
       snapshot is an ordinary one (restorable; run `--stop` again to stop);
       FAILED, its AbortSnapshot lifts every node at once (F2);
     the snapshot COMPLETE, STOP under way: the nodes that took their STOP are
       stopped (their log ends in it), the others lift at `lift_after` and run
       on, their channels to the stopped nodes filling. A new `--stop` cannot
       fence a stopped node (F4: it fails, ST3); the way on is to restore the
       stop snapshot (`snapmesh restore SID`), which loses the commands the
       lifted nodes took after they lifted.
     Node fences are never left closed: each lifts at its time (node F6).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from snapmesh.protocol.controller.effects import AnswerTrigger, Effect
from snapmesh.protocol.controller.tracker import COMPLETE
from snapmesh.protocol.retry import Failed, Retry
from snapmesh.v1 import snapmesh_pb2 as pb

FENCE = pb.FenceRequest.FENCE
LIFT = pb.FenceRequest.LIFT
STOP = pb.FenceRequest.STOP
FENCE_RETRY = Retry(5.0, 15.0)  # a node that restarts serves again within that
STEP_NAMES = {FENCE: "FENCE", LIFT: "LIFT", STOP: "STOP"}


class StopRefused(Exception):
    """ST1: a stop while a restore runs or another stop is under way; nothing changed."""

    code = "FAILED_PRECONDITION"


class StopFailed(Exception):
    """ST3, ST4: the stop ended without stopping the cluster (it runs and accepts commands again,
    ST3), or a node did not take its STOP (ST4); the words name the node."""

    code = "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class FenceAt:
    node: str
    snapshot_id: str
    step: int  # FENCE, LIFT or STOP
    lift_after: float = field(default=0.0, compare=False)  # FENCE: ST6, in seconds (0: never)
    retry: Retry = field(default=FENCE_RETRY, compare=False)
    rpc: ClassVar[str] = "Fence"

    @property
    def request(self) -> pb.FenceRequest:
        return pb.FenceRequest(snapshot_id=self.snapshot_id, step=self.step,  # type: ignore[arg-type]
                               lift_after_ms=int(self.lift_after * 1000))


@dataclass(slots=True)
class _Stop:
    snapshot_id: str
    initiator: str
    wall: float  # the snapshot's start time, as the start clock gave it
    call: Hashable
    step: int = FENCE  # the step whose answers are awaited
    waiting: set[str] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)  # "node: why", of the step awaited
    snapshot: pb.Snapshot | None = None  # once COMPLETE


class Stopping:
    """The one stop under way (ST1-ST5)."""

    def __init__(self, nodes: Sequence[str], *, deadline_s: float = 0.0) -> None:
        self.nodes = tuple(nodes)
        self.lift_after = 2 * (FENCE_RETRY.timeout_s + FENCE_RETRY.for_s + deadline_s)  # ST6
        self._stop: _Stop | None = None

    @property
    def under_way(self) -> str:
        """The snapshot id of the stop under way ("": none)."""
        return self._stop.snapshot_id if self._stop is not None else ""

    def check(self, *, restoring: str) -> None:
        """ST1: raise StopRefused when a stop cannot begin (`restoring`: the snapshot whose restore runs, "": none)."""
        if restoring:
            raise StopRefused(f"a restore to {restoring} is running: stop with a snapshot once it ends")
        if self._stop is not None:
            raise StopRefused(f"a stop with snapshot {self._stop.snapshot_id} is under way: wait for it to end")

    def begin(self, snapshot_id: str, initiator: str, wall: float, call: Hashable) -> list[Effect]:
        """A stop's trigger, once `check`ed: FENCE at every node (ST2)."""
        self.check(restoring="")
        self._stop = _Stop(snapshot_id, initiator, wall, call)
        return self._send(FENCE)

    def fenced(self, effect: FenceAt, answer: object) -> tuple[list[Effect], tuple[str, str, float] | None]:
        """A Fence call's answer: the effects, and (snapshot id, initiator, wall) when every
        node is fenced and the snapshot is to start now (ST2)."""
        stop = self._stop
        if stop is None or effect.snapshot_id != stop.snapshot_id or effect.step != stop.step:
            return [], None  # a LIFT's answer, or a stop that already ended
        stop.waiting.discard(effect.node)
        if isinstance(answer, Failed):
            stop.failed.append(f"{effect.node}: {answer}")
        if stop.waiting:
            return [], None
        if stop.step == FENCE:
            if stop.failed:
                return self.cannot_start(f"cannot fence {', '.join(stop.failed)}"), None
            stop.step = 0  # the snapshot's end is awaited now
            return [], (stop.snapshot_id, stop.initiator, stop.wall)
        # STOP answered by every node (ST4)
        self._stop = None
        if stop.failed:
            why = StopFailed(f"snapshot {stop.snapshot_id} is COMPLETE, but not every node stopped "
                             f"({'; '.join(stop.failed)}): stop those nodes yourself")
            return [AnswerTrigger((stop.call,), why)], None
        return [AnswerTrigger((stop.call,), stop.snapshot)], None  # type: ignore[arg-type]

    def cannot_start(self, why: str) -> list[Effect]:
        """ST3: the stop ends before its snapshot: LIFT everywhere, the call answered the error."""
        stop = self._stop
        assert stop is not None, "cannot_start without a stop under way"
        self._stop = None
        lifts = [FenceAt(node, stop.snapshot_id, LIFT) for node in self.nodes]
        error = StopFailed(f"stop with snapshot {stop.snapshot_id} did not start ({why}); "
                           "the cluster runs and accepts commands again")
        return [*lifts, AnswerTrigger((stop.call,), error)]

    def finished(self, snapshot: pb.Snapshot) -> list[Effect]:
        """The stop's snapshot ended: COMPLETE, STOP at every node (ST4); else LIFT and the answer (ST5)."""
        stop = self._stop
        if stop is None or snapshot.snapshot_id != stop.snapshot_id:
            return []
        if snapshot.status == COMPLETE:
            stop.snapshot = snapshot
            return self._send(STOP)
        self._stop = None
        return [*(FenceAt(node, stop.snapshot_id, LIFT) for node in self.nodes), AnswerTrigger((stop.call,), snapshot)]

    def _send(self, step: int) -> list[Effect]:
        stop = self._stop
        assert stop is not None
        stop.step, stop.waiting, stop.failed = step, set(self.nodes), []
        lift_after = self.lift_after if step == FENCE else 0.0
        return [FenceAt(node, stop.snapshot_id, step, lift_after) for node in self.nodes]
