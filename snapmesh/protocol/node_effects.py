"""What the node machine (`snapmesh.protocol.node.Node`) hands its shell.

Effects come out of `Node.drain()`, in order; the shell carries each out
(services/node/engine.py, the fault simulator, the tests):

  Append(record)            write it to the log
  Seal(first, next)         seal the active segment
  Transmit(dst, conn_no, entries)
  Ack(src, conn_no, seq)
  Finished(state, lsn)      keep it safe from a crash, now
  Report(state)             a FullState to the controller
  ReportCancelled(snapshot_id)

`Accepted` is a transfer's answer. All are NamedTuples: immutable, and cheap
to make on the per-message path.
"""

from __future__ import annotations

from typing import NamedTuple

from snapmesh.protocol import core, wal
from snapmesh.protocol.link import Entry


class Append(NamedTuple):
    record: wal.Record


class Seal(NamedTuple):
    """Every record before `next_lsn` belongs to the segment that began at
    `first_lsn`; the record `next_lsn` (a checkpoint) opens the next segment.
    Seal and checkpoint must reach the disk together (the shell writes the
    checkpoint to a new file and renames)."""

    first_lsn: int
    next_lsn: int


class Transmit(NamedTuple):
    dst: str
    conn_no: int  # the connection these frames belong to (link L6)
    entries: tuple[Entry, ...]


class Ack(NamedTuple):
    src: str
    conn_no: int
    seq: int


class Finished(NamedTuple):
    """This node's part of a snapshot is done; `state` rests on the records up
    to `lsn`, which are not durable yet. `Report(state)` follows once they are."""

    state: core.FullState
    lsn: int


class Report(NamedTuple):
    state: core.FullState


class ReportCancelled(NamedTuple):
    snapshot_id: str


Effect = Append | Seal | Transmit | Ack | Finished | Report | ReportCancelled


class Accepted(NamedTuple):
    """A transfer's answer; reply once `lsn` is durable, unless the node says
    a restore since `epoch` (when it was given) took it back. `repeated`: a retry."""

    msg_id: str
    balance: int
    lsn: int
    repeated: bool = False
    epoch: int = 1


class Submitted(NamedTuple):
    """An app command's answer (Node.submit), under the same rule as `Accepted`:
    reply once `lsn` is durable, unless a restore since `epoch` took it back."""

    reply: bytes
    lsn: int
    repeated: bool = False
    epoch: int = 1
