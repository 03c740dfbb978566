"""The controller machine's effects (snapmesh/protocol/controller/machine.py says what each asks of a shell)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from snapmesh.protocol.controller import journal
from snapmesh.v1 import snapmesh_pb2 as pb


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


@dataclass(frozen=True, slots=True)
class Finished:
    snapshot: pb.Snapshot


@dataclass(frozen=True, slots=True)
class AbortAt:
    node: str
    snapshot_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Publish:
    snapshot: pb.Snapshot


@dataclass(frozen=True, slots=True)
class RestoreAt:
    node: str
    request: pb.RestoreStateRequest


@dataclass(frozen=True, slots=True)
class RestoreDone:
    restore: pb.Restore


@dataclass(frozen=True, slots=True)
class AnswerRestore:
    calls: tuple[Hashable, ...]
    outcome: pb.Restore | Exception


@dataclass(frozen=True, slots=True)
class Retire:
    snapshot_id: str


Effect = Journal | Barrier | StartAt | Finished | AbortAt | Publish | RestoreAt | RestoreDone | AnswerRestore | Retire
