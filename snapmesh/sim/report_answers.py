"""The controller machine's held-report rules (held.py H1-H4), judged in the simulator.

A node's ReportState call names a `call` (most do; the others go without, as a
replay's reports do). The machine holds a report that does not complete its
snapshot (H1) and answers its call at the snapshot's end (AnswerReport, H2),
with any repeat that joined it (H3); the shell answers any other call once the
step's records are durable. Each call is answered once, and only once its
report's record, or its snapshot's FAILED record, is durable (H4), so an
answered report survives a controller crash. A crash loses the calls the
controller had unanswered: their nodes kept their pending reports and send them
again to the restarted controller (`crashed` hands them back). Once the cluster
settles no call is left unanswered.
"""

from __future__ import annotations

from collections.abc import Sequence

from snapmesh.protocol.controller import journal as records
from snapmesh.protocol.controller.effects import AnswerReport
from snapmesh.protocol.node import core
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb

Sent = tuple[str, core.FullState, int]  # (node, its part, the part's epoch): what the node sends again


class ReportCheck:
    def __init__(self) -> None:
        self.waiting: dict[int, Sent] = {}  # call -> the report it carried, not yet answered
        self.calls = 0
        self._reported: set[tuple[str, str]] = set()  # (snapshot, node) with a durable Reported record
        self._failed: set[str] = set()  # snapshots with a durable FAILED record
        self._read = 0  # how much of the durable journal the two sets have read

    def call(self, sent: Sent) -> int:
        """A name for the next ReportState call (the machine's `call`), owed an answer unless refused."""
        self.calls += 1
        self.waiting[self.calls] = sent
        return self.calls

    def refused(self, call: int) -> None:
        del self.waiting[call]  # refused at once: the node drops its part (or it is stale), nothing is owed

    def answered(self, calls: Sequence[int], durable: Sequence[records.Record]) -> None:
        """Judge the answer to `calls` (an AnswerReport's, or the shell's once durable), once
        `durable` is the journal's durable part."""
        for record in durable[self._read:]:
            if type(record) is records.Reported:
                self._reported.add((record.state.snapshot_id, record.state.node_id))
            elif type(record) is records.Finished and record.status == pb.Snapshot.FAILED:
                self._failed.add(record.snapshot_id)
        self._read = len(durable)
        for call in calls:
            if call not in self.waiting:
                raise Violation(f"report: call {call} answered twice, or after its controller crashed, or never taken")
            node, state, _ = self.waiting.pop(call)
            sid = state.snapshot_id
            if (sid, node) not in self._reported and sid not in self._failed:  # H4
                raise Violation(f"report: {node}'s report of {sid} was answered before its record (or the "
                                f"snapshot's FAILED) was durable: a controller crash now would lose it")

    def answer(self, effect: AnswerReport, durable: Sequence[records.Record]) -> list[Sent]:
        """The machine's AnswerReport (H2): an error outcome means the nodes send again."""
        sent = [self.waiting[c] for c in effect.calls if c in self.waiting]  # type: ignore[index]
        self.answered(effect.calls, durable)  # type: ignore[arg-type]
        return sent if effect.outcome is not None else []

    def crashed(self) -> list[Sent]:
        """The controller died: the unanswered calls' reports, which their nodes send again."""
        again = list(self.waiting.values())
        self.waiting.clear()
        return again

    def settled(self) -> None:
        if self.waiting:
            left = sorted((call, node, part.snapshot_id) for call, (node, part, _) in self.waiting.items())
            raise Violation(f"report: calls never answered: {left}")
