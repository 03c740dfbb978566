"""The fuzzer's own statement of the controller machine's restart rule (S1), to judge its replay.

After a controller restart the journal is replayed (`Controller.replayed`), and
the checker holds the machine to the rule, written here apart from the machine:
  S1a the replay takes back, as in progress, exactly the snapshots in progress
      after it;
  S1b a snapshot taken back by the newest restart fails on its deadline only
      as "controller restarted", and no sooner than a whole deadline after the
      restart (the nodes' reports, sent again, get that long); a snapshot not
      taken back fails on its deadline as "deadline".
"""

from __future__ import annotations

from snapmesh.protocol.controller.machine import Replayed
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb


def kind_of_failure(reason: str) -> str:
    """A FAILED snapshot's reason, in the few words the fault counts (and `expired`) use."""
    for kind in ("deadline", "controller restarted", "initiator"):
        if reason.startswith(kind):
            return "StartSnapshot failed" if kind == "initiator" else kind
    return reason


class RestartCheck:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.taken_back: dict[str, float] = {}  # snapshot -> when the newest restart took it back (monotonic)

    def replayed(self, replayed: Replayed, snapshots: list[pb.Snapshot], now: float) -> None:
        """S1a, right after the replay at `now`."""
        in_progress = sorted(s.snapshot_id for s in snapshots if s.status == pb.Snapshot.IN_PROGRESS)
        if replayed.in_progress != in_progress:
            raise Violation(f"restart: the replay took back {replayed.in_progress} in progress; in progress are {in_progress}")
        self.taken_back = dict.fromkeys(in_progress, now)

    def expired(self, snapshot_id: str, kind: str, now: float) -> None:
        """S1b, as a snapshot's failure on its deadline (`kind`: "deadline" or "controller restarted") is shown."""
        at = self.taken_back.get(snapshot_id)
        if (at is None) != (kind == "deadline"):
            said = "taken back at a controller restart" if at is not None else "not taken back at a restart"
            raise Violation(f"restart: snapshot {snapshot_id}, {said}, failed as {kind!r}")
        if at is not None and now < at + self.deadline:
            raise Violation(
                f"restart: snapshot {snapshot_id} failed as {kind!r} {now - at:g}s after the restart that took it"
                f" back; its deadline is {self.deadline:g}s"
            )
