"""The controller machine's waiting-trigger rule (W1), judged in the simulator.

A TriggerSnapshot call with wait names a `call` at the trigger; the machine
answers it (AnswerTrigger) when the snapshot ends, COMPLETE or FAILED (by its
deadline, an unreachable node, a restore that overtook it). The answer comes
once, with the snapshot as it finished: its status is the one of the
snapshot's newest Finished record, and that record is durable when the
answer goes out, so what a client is told survives a controller crash. A
crash forgets the calls the controller had (their clients see the connection
drop, and never get an answer), and once the cluster settles no call is left
unanswered.
"""

from __future__ import annotations

from collections.abc import Sequence

from snapmesh.protocol.controller import journal as records
from snapmesh.protocol.controller.effects import AnswerTrigger
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb

FINISHED = (pb.Snapshot.COMPLETE, pb.Snapshot.FAILED)


class TriggerCheck:
    def __init__(self) -> None:
        self.waiting: dict[int, str] = {}  # call -> the snapshot it waits for
        self.calls = 0
        self._finished: dict[str, records.Finished] = {}  # snapshot -> its newest durable Finished record
        self._read = 0  # how much of the durable journal `_finished` has read

    def call(self, snapshot_id: str) -> int:
        """A name for the next waiting trigger (the machine's `call`), owed an answer unless refused."""
        self.calls += 1
        self.waiting[self.calls] = snapshot_id
        return self.calls

    def refused(self, call: int) -> None:
        del self.waiting[call]  # the trigger started nothing: the machine owes it nothing

    def answered(self, effect: AnswerTrigger, durable: Sequence[records.Record]) -> str:
        """Judge the answer, once `durable` is the journal's durable part; returns what the faults count."""
        for record in durable[self._read:]:
            if type(record) is records.Finished:
                self._finished[record.snapshot_id] = record
        self._read = len(durable)
        for call in effect.calls:
            if call not in self.waiting:
                raise Violation(f"trigger: call {call} answered twice, or after its controller crashed, or never taken")
            sid = self.waiting.pop(call)  # type: ignore[call-overload]
            outcome = effect.outcome
            if not isinstance(outcome, pb.Snapshot) or outcome.snapshot_id != sid or outcome.status not in FINISHED:
                said = f"{outcome.snapshot_id} {pb.Snapshot.Status.Name(outcome.status)}" if isinstance(
                    outcome, pb.Snapshot) else repr(outcome)
                raise Violation(f"trigger: a waiting call for {sid} was answered {said}")
            record = self._finished.get(sid)
            if record is None:
                raise Violation(f"trigger: a waiting call for {sid} was answered before its outcome was durable")
            if (record.status, record.reason) != (outcome.status, outcome.reason):
                raise Violation(
                    f"trigger: a waiting call for {sid} was answered {pb.Snapshot.Status.Name(outcome.status)}"
                    f" ({outcome.reason!r}); the journal finished it {pb.Snapshot.Status.Name(record.status)}"
                    f" ({record.reason!r})"
                )
        return f"waiting trigger answered {_outcome(effect.outcome)}"  # type: ignore[arg-type]

    def crashed(self) -> None:
        self.waiting.clear()

    def settled(self) -> None:
        if self.waiting:
            raise Violation(f"trigger: waiting calls never answered: {sorted(self.waiting.items())}")


def _outcome(snapshot: pb.Snapshot) -> str:
    if snapshot.status == pb.Snapshot.COMPLETE:
        return "COMPLETE"
    reason = snapshot.reason
    for kind in ("deadline", "restored to", "initiator", "node"):
        if reason.startswith(kind):
            return f"FAILED: {'StartSnapshot failed' if kind in ('initiator', 'node') else kind}"
    return f"FAILED: {reason}"
