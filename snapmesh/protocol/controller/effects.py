"""The controller machine's effects (snapmesh/protocol/controller/machine.py says what each asks of a shell).

One that calls a node names its `rpc` and `request`, and carries how it is
tried again (`retry`, snapmesh/protocol/retry.py): a
StartSnapshot waits up to the snapshot's deadline, and one that met an
unavailable channel waits for it once more, for START_FOR_S; an AbortSnapshot
is tried once (the node drops the recording at its own deadline anyway); a
node's part of a restore is tried for 30 s, 5 s a try (a node that restarts
takes that long to serve again).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import ClassVar

from snapmesh.protocol.controller import journal
from snapmesh.protocol.controller.replay import File, Forget
from snapmesh.protocol.retry import Retry
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

START_FOR_S = 3.0
ABORT = Retry(2.0, tries=1)
RESTORE = Retry(5.0, 30.0)


def start_retry(deadline_s: float) -> Retry:
    return Retry(deadline_s, START_FOR_S, tries=2, wait=True)


@dataclass(frozen=True, slots=True)
class Journal:
    record: journal.Record


@dataclass(frozen=True, slots=True)
class Barrier:
    pass


@dataclass(frozen=True, slots=True)
class StartAt:
    node: str
    snapshot_id: str
    epoch: int
    retry: Retry = field(default=start_retry(5.0), compare=False)  # the machine's: with its deadline
    rpc: ClassVar[str] = "StartSnapshot"

    @property
    def request(self) -> pb.StartSnapshotRequest:
        return pb.StartSnapshotRequest(snapshot_id=self.snapshot_id, epoch=self.epoch)


@dataclass(frozen=True, slots=True)
class Finished:
    snapshot: pb.Snapshot


@dataclass(frozen=True, slots=True)
class AbortAt:
    node: str
    snapshot_id: str
    reason: str
    retry: Retry = field(default=ABORT, compare=False)
    rpc: ClassVar[str] = "AbortSnapshot"

    @property
    def request(self) -> pb.AbortSnapshotRequest:
        return pb.AbortSnapshotRequest(snapshot_id=self.snapshot_id, reason=self.reason)


@dataclass(frozen=True, slots=True)
class Publish:
    snapshot: pb.Snapshot


@dataclass(frozen=True, slots=True)
class RestoreAt:
    node: str
    request: pb.RestoreStateRequest
    retry: Retry = field(default=RESTORE, compare=False)
    rpc: ClassVar[str] = "RestoreState"


@dataclass(frozen=True, slots=True)
class Adopt:
    """Run on this topology from here on (a rescale's restore started, R7): call its nodes, at the
    addresses of the cluster file it was read from."""

    topology: Topology


@dataclass(frozen=True, slots=True)
class RestoreDone:
    restore: pb.Restore


@dataclass(frozen=True, slots=True)
class AnswerRestore:
    calls: tuple[Hashable, ...]
    outcome: pb.Restore | Exception


@dataclass(frozen=True, slots=True)
class AnswerTrigger:
    calls: tuple[Hashable, ...]
    outcome: pb.Snapshot | Exception


@dataclass(frozen=True, slots=True)
class AnswerReport:
    """Answer these held ReportState calls (held.py H2): None, OK; or the error that kept it from being durable."""

    calls: tuple[Hashable, ...]
    outcome: Exception | None = None


@dataclass(frozen=True, slots=True)
class Retire:
    snapshot_id: str


Effect = (Journal | Barrier | StartAt | Finished | AbortAt | Publish | RestoreAt | Adopt | RestoreDone | AnswerRestore
          | AnswerTrigger | AnswerReport | Retire | File | Forget)
Call = StartAt | AbortAt | RestoreAt  # the effects that call a node
