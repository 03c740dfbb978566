"""A node's epoch: which calls it lets through, and which restore it takes (node rule N8).

The cluster's epoch goes up by one with every restore. A node is in one epoch
at a time. The node machine's events carry the epoch they come from and ask
this one object themselves (a shell never asks first):

- `check(epoch)` / `fence(epoch)`: a call of an older epoch (a snapshot start,
  a channel's open, a restore) is stale, refused for good; one of a newer
  epoch, or any while this node's restore is unfinished, waits until this
  node has restored (the caller asks again later); `check` raises EpochFenced;
- `check_clients()` / `fence_clients()`: clients' commands wait while a
  restore cut short by a crash is redone (the app's state is not the restored
  one yet); `check_clients` raises LocalProtocolError (Refusal.RESTORING);
- `takes_restore(epoch, snapshot_id)`: a restore into a newer epoch, or the
  unfinished one, is done; a repeat of the one done is a no-op; an older epoch,
  or another snapshot in this epoch, is refused;
- `taken_back(lsn, epoch)`: did a restore since the answer (given in `epoch`)
  take back what the node applied at `lsn` (its snapshot's cut here is before
  `lsn`)? A client's transfer answered only once durable asks this first: a
  restore between its answer and its durability rolled it back, so it must not
  be answered "paid". The node keeps the last `RESTORES_KEPT` restores (epoch,
  lsn of the cut), nothing per transfer; past them, the answer is
  conservatively "taken back" (a retry with the same request id, answered in
  the new epoch, then gets the window's answer).

A connection's own number (link `conn_no`) is another thing: it names one
connection of one channel, and the link fences older ones (link L6).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from snapmesh.protocol.node.core import LocalProtocolError, Refusal, RemoteProtocolError


RESTORES_KEPT = 8  # restores remembered for `taken_back`; a transfer waits for its fsync, not for 8 restores


class Restored(NamedTuple):
    """One restore this node did: the epoch it entered, the restored
    snapshot, and the lsn of that snapshot's cut here (None: unknown, older
    than every cut kept)."""

    epoch: int
    snapshot_id: str
    cut: int | None


class Fenced(NamedTuple):
    """Why the node will not take a call now. `stale`: from an older epoch,
    refused for good; otherwise the caller asks again later (a newer epoch, or
    this node's restore is not finished yet)."""

    stale: bool
    reason: str


class EpochFenced(RemoteProtocolError):
    """A call the epoch fence refuses; nothing changed. `stale`: from an older
    epoch, refused for good (FAILED_PRECONDITION); otherwise the caller asks
    again later (UNAVAILABLE)."""

    def __init__(self, fenced: Fenced) -> None:
        super().__init__(fenced.reason)
        self.stale = fenced.stale


@dataclass(slots=True)
class EpochState:
    node_id: str
    epoch: int = 1  # the cluster epoch this node is in
    restored: str = ""  # the snapshot restored into `epoch`, if any
    restore_incomplete: bool = False  # cut short by a crash: it must be done again
    # The last RESTORES_KEPT restores, oldest first, and the newest one dropped from them.
    restores: deque[Restored] = field(default_factory=deque)
    forgotten: Restored | None = None

    def fence(self, epoch: int, what: str = "") -> Fenced | None:
        """May a call of the cluster's `epoch` (`what` names it) go on? None: yes."""
        if epoch < self.epoch:
            return Fenced(True, f"{what} is from epoch {epoch}; {self.node_id} is in epoch {self.epoch}")
        if epoch > self.epoch or self.restore_incomplete:
            return Fenced(False, f"{self.node_id} has not restored epoch {epoch} yet")
        return None

    def check(self, epoch: int, what: str = "") -> None:
        """`fence`, as an event's first step: raises EpochFenced when the call may not go on."""
        fenced = self.fence(epoch, what)
        if fenced is not None:
            raise EpochFenced(fenced)

    def fence_clients(self) -> Fenced | None:
        """May a client's transfer go on? None: yes."""
        if self.restore_incomplete:
            return Fenced(False, f"{self.node_id} is finishing a restore")
        return None

    def check_clients(self) -> None:
        """`fence_clients`, as a client step's first step: raises LocalProtocolError (RESTORING)."""
        if self.restore_incomplete:
            raise LocalProtocolError(f"{self.node_id} is finishing a restore", Refusal.RESTORING)

    def takes_restore(
        self, epoch: int, snapshot_id: str, deliveries: list[tuple], incoming: Collection[str]
    ) -> bool:
        """Is a restore of `snapshot_id` into `epoch` (and the `deliveries`
        (src, msg_id, seq, 0, payload) to replay) to be done? False for a repeat
        of the one done. Raises RemoteProtocolError for an older epoch, another
        snapshot than the one restored into this epoch, or a delivery on no
        channel in `incoming`, without a msg id or without bytes."""
        if epoch < self.epoch:
            raise EpochFenced(Fenced(True, f"{self.node_id} is in epoch {self.epoch}; a restore for epoch {epoch} is stale"))
        if epoch == self.epoch and not self.restore_incomplete:
            if self.restored and self.restored != snapshot_id:
                raise RemoteProtocolError(f"{self.node_id} restored {self.restored!r} in epoch {epoch}, not {snapshot_id!r}")
            return False
        for src, msg_id, _, carried, payload in deliveries:
            if src not in incoming or carried != 0 or not isinstance(payload, bytes) or not msg_id:
                raise RemoteProtocolError(f"{self.node_id}: cannot replay {msg_id!r} ({carried}) from {src!r}")
        return True

    def entered(self, epoch: int, snapshot_id: str, *, cut: int | None = None) -> None:
        """The restore of `snapshot_id` into `epoch` is done; `cut` is the lsn
        of the snapshot's cut here (None: unknown)."""
        self.epoch, self.restored, self.restore_incomplete = epoch, snapshot_id, False
        self.restores.append(Restored(epoch, snapshot_id, cut))
        if len(self.restores) > RESTORES_KEPT:
            self.forgotten = self.restores.popleft()

    def restored_after(self, epoch: int) -> bool:
        """Whether a restore known here entered an epoch after `epoch`: if not,
        `taken_back` is None for every answer given in `epoch` or later."""
        if self.forgotten is not None and self.forgotten.epoch > epoch:
            return True
        return any(restore.epoch > epoch for restore in self.restores)

    def taken_back(self, lsn: int, epoch: int) -> str | None:
        """The snapshot whose restore, after an answer given in `epoch`, took
        back what was applied at `lsn` (logged after its cut), or None: it stands."""
        for restore in self.restores:
            if restore.epoch > epoch and (restore.cut is None or restore.cut < lsn):
                return restore.snapshot_id
        if self.forgotten is not None and self.forgotten.epoch > epoch:
            return self.forgotten.snapshot_id  # past what is kept: not known to stand
        return None
