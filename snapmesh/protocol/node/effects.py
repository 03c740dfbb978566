"""What the node machine (`snapmesh.protocol.node.machine.Node`) hands its shell.

Effects come out of `Node.drain()`, in order; the shell carries each out
(services/node/engine.py, the fault simulator, the tests):

  Append(record)            write it to the log
  Seal(first, checkpoint)   seal the active segment; the checkpoint opens the next
  Transmit(dst, conn_no, entries)
  Ack(src, conn_no, seq)
  Finished(state, lsn, ...) the part, its epoch, wall times and digest: keep it safe
                            from a crash, now (the only effect that hands it out)
  Report(snapshot_id)       send the part kept at Finished to the controller
  ReportCancelled(snapshot_id)
  Reply(to, answer, taken_back)    a client's call is answered (node rule N11)
  ReplyBatch(to, taken_back)       a batch of them, in one answer
  RestoreReply(to, epoch)    a restore call is answered: its records are durable (N8)
  EndStreams(outgoing, incoming, reason)  a restore: these channels' connections
                            carry the older epoch; end them (N8)

`Submitted` is a command's answer. All are NamedTuples: immutable, and cheap
to make on the per-message path.
"""

from __future__ import annotations

from typing import NamedTuple

from snapmesh.protocol.node import core
from snapmesh.protocol import wal
from snapmesh.protocol.node.link import Entry


# `fast_new(Cls, (field, ...))` makes the NamedTuple `Cls(field, ...)` without its Python-level
# __new__ (a lambda): the same object at about half the cost, for the per-message path.
fast_new = tuple.__new__


class Append(NamedTuple):
    record: wal.Record


class Seal(NamedTuple):
    """Every record before the checkpoint belongs to the segment that began at
    `first_lsn`; `checkpoint` opens the next segment. One effect, because seal
    and checkpoint must reach the disk together (the shell writes the
    checkpoint to a new file and renames): a shell cannot do one without the other."""

    first_lsn: int
    checkpoint: wal.Checkpoint

    @property
    def next_lsn(self) -> int:
        return self.checkpoint.lsn


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
    to `lsn`, which are not durable yet. `Report(snapshot_id)` follows once they
    are (or `ReportCancelled`). `epoch`: the node's when it finished; the wall
    times (ns, 0: unknown, as for a cut from before a restart) feed the
    controller's statistics only. `digest`: the SHA-256 (hex) of an app's state,
    as its cut record holds it ("": no app state), so it is hashed once here."""

    state: core.FullState
    lsn: int
    epoch: int = 1
    cut_at_ns: int = 0
    done_at_ns: int = 0
    digest: str = ""


class Report(NamedTuple):
    """Send the part kept at `Finished`: everything it rests on is durable."""

    snapshot_id: str


class ReportCancelled(NamedTuple):
    snapshot_id: str


class Reply(NamedTuple):
    """Answer the client call `to` (the caller's token) with `answer`: it is
    durable. `taken_back`: the snapshot whose restore took it back since ("": it
    stands), which the client must hear as not done, never as done."""

    to: object
    answer: Submitted
    taken_back: str = ""


class ReplyBatch(NamedTuple):
    """Answer the batch call `to`: every answer it waited for is durable;
    `taken_back` holds, per answer in the order given, what Reply's does."""

    to: object
    taken_back: tuple[str, ...]


class RestoreReply(NamedTuple):
    """Answer the restore call `to` (the caller's token): the restore, or for a
    repeat everything logged when it came, is durable (N8), so a crash cannot
    take back what the controller is told. `epoch`: the node's right after the restore."""

    to: object
    epoch: int


class EndStreams(NamedTuple):
    """End every connection of these channels: they carry the epoch a restore
    left (N8), and the links start again at seq 1. An outgoing one opens again
    in the new epoch; an incoming one waits for its sender to."""

    outgoing: tuple[str, ...]
    incoming: tuple[str, ...]
    reason: str


Effect = (
    Append | Seal | Transmit | Ack | Finished | Report | ReportCancelled | Reply | ReplyBatch | RestoreReply | EndStreams
)


class Submitted(NamedTuple):
    """An app command's answer (Node.submit): reply once `lsn` is durable, unless
    the node says a restore since `epoch` took it back. `repeated`: a retry."""

    reply: bytes
    lsn: int
    repeated: bool = False
    epoch: int = 1
    sent_to: tuple[str, ...] = ()  # the channels the step sent on: flow control slows this client on those only
    # The epoch the command ran in (requests.py W6): a retry's may be older than
    # `epoch`, which the rule above needs as the epoch of this answer. 0: not known.
    ran_in: int = 0
    first_seq: int = 0  # the seq of the first message the step sent, on its channel (0: none, or not known)
