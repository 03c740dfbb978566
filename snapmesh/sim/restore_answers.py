"""The controller machine's answer rule (R5), judged in the simulator.

Every RestoreSnapshot call that starts or joins a restore, or retries a finished
one, is answered once (AnswerRestore), with the finished restore of the
snapshot it named, and only once its key's record is durable: what a client
is told survives a controller crash. A crash forgets the calls the controller
had (their clients see the connection drop), and once the cluster settles no
call is left unanswered.
"""

from __future__ import annotations

from collections.abc import Mapping

from snapmesh.protocol.controller import restoregate
from snapmesh.protocol.controller.effects import AnswerRestore
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb

FINISHED = (pb.Restore.RESTORED, pb.Restore.FAILED)


class AnswerCheck:
    def __init__(self) -> None:
        self.waiting: dict[int, tuple[str, str]] = {}  # call -> (the snapshot it named, its key)
        self.calls = 0

    def call(self, snapshot_id: str, key: str) -> int:
        """A name for the next call (the machine's `call`), owed an answer unless refused (`decided`)."""
        self.calls += 1
        self.waiting[self.calls] = (snapshot_id, key)
        return self.calls

    def decided(self, call: int, decision: restoregate.Decision) -> None:
        if isinstance(decision, (restoregate.Refuse, restoregate.Busy)):
            del self.waiting[call]  # refused: the machine owes it nothing

    def answered(self, effect: AnswerRestore, key_durable_at: Mapping[str, int], durable: int) -> None:
        for call in effect.calls:
            if call not in self.waiting:
                raise Violation(f"restore: call {call} answered twice, or never taken")
            sid, key = self.waiting.pop(call)
            outcome = effect.outcome
            if not isinstance(outcome, pb.Restore) or outcome.snapshot_id != sid or outcome.status not in FINISHED:
                said = f"{outcome.snapshot_id} {pb.Restore.Status.Name(outcome.status)}" if isinstance(
                    outcome, pb.Restore) else repr(outcome)
                raise Violation(f"restore: a call for {sid} (key {key!r}) was answered {said}")
            if key_durable_at.get(key, 0) > durable:
                raise Violation(f"restore: a call with key {key!r} was answered before the key's record was durable")

    def crashed(self) -> None:
        self.waiting.clear()

    def settled(self) -> None:
        if self.waiting:
            raise Violation(f"restore: calls never answered: {sorted(self.waiting.values())}")
