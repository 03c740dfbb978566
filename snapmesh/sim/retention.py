"""The fuzzer's own statement of `--keep` retention, to judge the controller machine's Retire effects.

The rule (the machine's K1 and K2, written here apart from
`snapmesh.protocol.controller.retention` so that a broken rule there disagrees with
this one): with `keep` N > 0, the finished snapshots older, in id order, than the
N newest COMPLETE ones are retired, except the one last restored and the one that
completed last in this controller run. The checker holds the machine to it:
  K1a a Retire names a finished snapshot the rule retires at that moment (not
      one of the N newest COMPLETE, not the one last restored, not the one that
      just completed), once per controller run (a restart replays the journal
      and retires afresh);
  K1b after each step that completed a snapshot, and after a restart, every
      snapshot the rule retires has been retired.
(The fuzzer's ids, s1, s2, ..., s10, do not sort in start order past s9: K2's
case, a snapshot completing with an id older than those kept, comes up in it.)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb

FINISHED = (pb.Snapshot.COMPLETE, pb.Snapshot.FAILED)


def due(snapshots: Iterable[pb.Snapshot], keep: int, protect: Collection[str] = ()) -> list[str]:
    """The ids the rule retires, sorted (none until N COMPLETE ones are newer), none of `protect`."""
    snapshots = list(snapshots)
    complete = sorted(s.snapshot_id for s in snapshots if s.status == pb.Snapshot.COMPLETE)
    if keep < 1 or len(complete) <= keep:
        return []
    oldest_kept = complete[-keep]
    return sorted(
        s.snapshot_id for s in snapshots
        if s.status in FINISHED and s.snapshot_id < oldest_kept and s.snapshot_id not in protect
    )


class RetentionCheck:
    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.retired: set[str] = set()  # in this controller run
        self.last_complete = ""  # the snapshot that completed last in this controller run (K2)

    def restarted(self) -> None:
        self.retired.clear()
        self.last_complete = ""

    def completed(self, snapshot_id: str) -> None:
        """A snapshot completed (its Finished, before the Retire effects that follow it)."""
        self.last_complete = snapshot_id

    def retire(self, snapshot_id: str, snapshots: list[pb.Snapshot], restored: str) -> None:
        """K1a, as the Retire effect is carried out (`restored`: the one last restored, or "")."""
        if snapshot_id in self.retired:
            raise Violation(f"retention: {snapshot_id} retired twice")
        if snapshot_id not in due(snapshots, self.keep, (restored, self.last_complete)):
            status = {s.snapshot_id: pb.Snapshot.Status.Name(s.status) for s in snapshots}.get(snapshot_id, "unknown")
            raise Violation(
                f"retention: {snapshot_id} ({status}) retired with keep {self.keep}, the one last restored "
                f"{restored or 'none'}, the one just completed {self.last_complete or 'none'}: the rule keeps it"
            )
        self.retired.add(snapshot_id)

    def settled(self, snapshots: list[pb.Snapshot], restored: str) -> None:
        """K1b, after a step that completed a snapshot (or a restart)."""
        missed = [sid for sid in due(snapshots, self.keep, (restored, self.last_complete)) if sid not in self.retired]
        if missed:
            raise Violation(f"retention: keep {self.keep} retires {missed}, and no Retire came for them")
