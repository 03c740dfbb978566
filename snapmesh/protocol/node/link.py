"""The reliable channel under the algorithm, as two pure halves (sans-I/O).

One directed channel src->dst has a `Sender` at src and a `Receiver` at dst.
Together they turn connections that break, lose what is on the wire and come
back into the FIFO, lossless channel `core.Process` assumes. Neither half does
I/O or reads a clock: the caller passes in what happened (a connection opened,
a frame or an ack arrived, the log is durable up to lsn L) and carries out what
they return.

Rules
-----
L1. Seq. The sender numbers every message 1, 2, 3, ... (app messages and
    markers share the sequence); `enqueue` refuses nothing but a full channel.
L2. Durability first. A message leaves only once the log record behind it is
    durable (`poll(durable_lsn)`); the receiver acknowledges a seq only once
    the record of receiving it is durable (`ack_due(durable_lsn)`).
L3. Cumulative acks. An ack for seq n acknowledges 1..n. The sender keeps every
    unacknowledged message (the outbox) and drops a prefix on each ack.
L4. Resume. Each connection has a number, `conn_no`, larger than every
    earlier one's on the channel (the cluster's epoch is another thing). On
    connecting, the sender resends from its resume point: everything after the
    last ack it holds. The receiver answers with its own position (an ack).
L5. Duplicates and gaps. The receiver drops a seq it already holds (a resend)
    and refuses a seq past the next one (a gap means something was lost below
    the algorithm): `RemoteProtocolError`, the connection must be dropped.
L6. Connection fencing. A frame or ack of another connection than the current
    one is stale (its connection is gone) and is ignored.
L7. Flow control. Above `mark` unacknowledged messages the channel says so
    (`over_mark`) and the caller slows its clients; at `bound` it refuses new
    messages at once (`ChannelFull`), and nothing is queued or applied; a
    step that sends several is refused when they would take it past `bound`.
L8. Early markers (overtake mode). `notify` queues a marker that overtakes:
    `poll` puts it ahead of every queued message, once its record is durable,
    on the current connection only, and sends it once (it is a hint: if a cut
    connection loses it, the marker's FIFO copy in the outbox still follows).
    On the wire it is an Entry with seq 0, `last_seq` holding the last seq the
    sender assigned before its cut.
L9. Held early markers (hybrid mode, Flink's aligned-checkpoint-timeout). With
    `hold` set, `notify` keeps the early copy back: the marker first travels in
    its FIFO place, as in classic mode. The sender learns the time only from
    `release(now)`, so a copy's `hold` seconds start at the first release after
    its notify, and `next_release` asks for that release at once. A later
    release lets each copy due by `now` overtake (L8) unless its FIFO copy is
    already acknowledged (it arrived in order: nothing to overtake), which it
    drops. So a quiet channel behaves as classic, and a backed-up one switches
    that snapshot to overtaking `hold` seconds after the cut.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from snapmesh.protocol.node.core import LocalProtocolError, Refusal, RemoteProtocolError

# Flow control (L7). A marker waits behind everything already queued on its channel, so
# a deep outbox is snapshot latency: at saturation 20,000 gave multi-second snapshots
# (some past their deadline), 2,000 keeps them well under a second (bench/cluster.py).
DEFAULT_MARK = 2_000  # unacknowledged messages above which new messages wait
LOW_MARK = 1_000  # ... until the outbox is back at or below this
DEFAULT_BOUND = 100_000


class GapError(RemoteProtocolError):
    """A message skipped a seq: something was lost below the algorithm (L5)."""


class ChannelFull(LocalProtocolError):
    """The channel holds `bound` unacknowledged messages: the message is refused."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Refusal.CHANNEL_FULL)


class Entry(NamedTuple):
    """One message in the outbox. `lsn` is the record that must be durable before it leaves.
    (A NamedTuple: immutable, and cheap to make on the per-message path.)"""

    seq: int
    last_seq: int  # an early marker's (L8): the last seq assigned before its cut; else 0
    snapshot_id: str  # "" for a transfer (its msg_id is `src:dst:seq`)
    lsn: int = 0  # 0: recovered from the log, durable
    payload: bytes | None = None  # an app message's bytes; None: a marker


# A NamedTuple made by tuple.__new__ skips its Python-level __new__: the same object, at half the cost.
_new = tuple.__new__


class Sender:
    """The sending half of src->dst."""

    def __init__(
        self,
        *,
        src: str,
        dst: str,
        next_seq: int = 1,
        acked: int | None = None,
        outbox: list[Entry] = (),  # type: ignore[assignment]
        mark: int = DEFAULT_MARK,
        bound: int = DEFAULT_BOUND,
    ) -> None:
        self.src = src
        self.dst = dst
        self.next_seq = next_seq
        self.outbox: deque[Entry] = deque(outbox)
        self.acked = acked if acked is not None else (self.outbox[0].seq - 1 if self.outbox else next_seq - 1)
        self.mark = mark
        self.bound = bound
        self.conn_no = 0  # of the current connection; 0: none yet
        self.connected = False
        self.sent = self.acked  # highest seq transmitted on the current connection
        self.notices: list[Entry] = []  # early markers waiting to overtake (L8)
        self.hold: float | None = None  # hybrid mode: seconds an early marker is held back (L9); None: not held
        self.held: list[tuple[float | None, Entry]] = []  # (due, early marker), oldest first; due None: not timed yet
        if self.outbox and (self.outbox[0].seq != self.acked + 1 or self.outbox[-1].seq != next_seq - 1):
            raise LocalProtocolError(f"channel {src}->{dst}: outbox does not hold {self.acked + 1}..{next_seq - 1}")

    @property
    def unacked(self) -> int:
        return self.next_seq - 1 - self.acked

    @property
    def over_mark(self) -> bool:
        return self.unacked > self.mark

    def check_room(self, count: int = 1) -> None:
        """Raise ChannelFull when `count` new messages must be refused (L7): they would
        take the channel past its bound. Changes nothing."""
        if self.unacked + count > self.bound:
            more = "" if count == 1 else f"; the step sends {count} more"
            raise ChannelFull(
                f"channel {self.src}->{self.dst} holds {self.unacked} unacknowledged messages (bound {self.bound}{more})"
            )

    def enqueue(self, *, lsn: int, snapshot_id: str = "", payload: bytes | None = None) -> int:
        """Queue one message (its record is `lsn`); returns its seq."""
        seq = self.next_seq
        self.outbox.append(_new(Entry, (seq, 0, snapshot_id, lsn, payload)))  # Entry(...), the per-message path
        self.next_seq = seq + 1
        return seq

    def notify(self, *, lsn: int, snapshot_id: str, last_seq: int) -> None:
        """Queue an early marker for `snapshot_id` (L8), or hold it back (L9); its record is `lsn`."""
        if self.hold is None:
            self.notices.append(Entry(0, last_seq, snapshot_id, lsn))
        else:
            self.held.append((None, Entry(0, last_seq, snapshot_id, lsn)))

    def release(self, now: float) -> tuple[int, int]:
        """Time passed (L9): copies not timed yet are due `hold` from `now`; those due by
        `now` overtake, or are dropped when their FIFO copy (seq last_seq + 1) is
        acknowledged. Returns (how many now wait to overtake, how many were dropped)."""
        if not self.held:
            return 0, 0
        hold = self.hold or 0.0
        timed = [(now + hold if at is None else at, e) for at, e in self.held]
        self.held = [(at, e) for at, e in timed if at > now]
        due = [e for at, e in timed if at <= now]
        overtaking = [e for e in due if self.acked <= e.last_seq]
        self.notices += overtaking
        return len(overtaking), len(due) - len(overtaking)

    def next_release(self, now: float) -> float | None:
        """When `release` is next due (L9): `now` for a copy not timed yet; None when none is held."""
        if not self.held:
            return None
        return min(now if at is None else at for at, _ in self.held)

    def _take_notices(self, durable_lsn: int) -> list[Entry]:
        ready = [n for n in self.notices if n.lsn <= durable_lsn]
        if ready:
            self.notices = [n for n in self.notices if n.lsn > durable_lsn]
        return ready

    def connect(self, conn_no: int) -> None:
        """A new connection, numbered `conn_no`: resend from the resume point
        (L4); the receiver fences older connections (L6)."""
        if conn_no == self.conn_no:
            raise LocalProtocolError(f"channel {self.src}->{self.dst}: connection {conn_no} is the current one")
        self.conn_no = conn_no
        self.connected = True
        self.sent = self.acked

    def disconnect(self) -> None:
        self.connected = False

    def poll(self, durable_lsn: int, limit: int = 500) -> list[Entry]:
        """Messages to transmit now, in seq order: after the last sent, durable (L2)."""
        if not self.connected:
            return []
        start = self.sent - self.acked  # index in the outbox of the first unsent entry
        out: list[Entry] = self._take_notices(durable_lsn) if self.notices else []
        early = len(out)
        outbox = self.outbox
        while start < len(outbox) and len(out) < limit + early:
            entry = outbox[start]
            if entry.lsn > durable_lsn:
                break
            out.append(entry)
            start += 1
        if len(out) > early:
            self.sent = out[-1].seq
        return out

    def on_ack(self, conn_no: int, seq: int) -> bool:
        """A cumulative ack (L3). Returns False when it was stale (L6)."""
        if conn_no != self.conn_no or not self.connected:
            return False
        if seq >= self.next_seq:
            raise RemoteProtocolError(f"channel {self.src}->{self.dst}: ack {seq} for a seq never sent")
        if seq < self.acked:
            # A receiver that acknowledged more before has lost data it promised to keep.
            raise RemoteProtocolError(f"channel {self.src}->{self.dst}: ack {seq} after {self.acked}: data loss")
        outbox = self.outbox
        while self.acked < seq:
            outbox.popleft()
            self.acked += 1
        if self.sent < seq:
            self.sent = seq  # the receiver already held these (from an earlier connection)
        return True


class Receiver:
    """The receiving half of src->dst."""

    def __init__(self, *, src: str, dst: str, last_seq: int = 0) -> None:
        self.src = src
        self.dst = dst
        self.last_seq = last_seq  # applied (logged, maybe not durable yet)
        self.conn_no = 0
        self.duplicates = 0
        # (seq, lsn) of applied messages not yet acknowledged, newest last.
        self._pending: deque[tuple[int, int]] = deque()
        self._acked = last_seq  # highest seq acknowledged on the current connection
        self._owed = False  # the current connection is owed an ack (its open, or new data)

    def open(self, conn_no: int, last_lsn: int) -> bool:
        """A newer connection supersedes the current one; it is owed
        our position once `last_lsn` (everything applied so far) is durable.
        An open older than the current connection is stale: False, ignored (L6)."""
        if conn_no <= self.conn_no:
            return False
        self.conn_no = conn_no
        self._pending.append((self.last_seq, last_lsn))
        self._acked = -1
        self._owed = True
        return True

    def admit(self, conn_no: int, seq: int) -> bool:
        """Should the message `seq` of a frame of connection `conn_no` be applied? False for a
        stale frame (L6) or a duplicate (L5); raises on a gap."""
        if conn_no != self.conn_no:
            return False
        if seq <= self.last_seq:
            self.duplicates += 1
            return False
        if seq != self.last_seq + 1:
            raise GapError(f"channel {self.src}->{self.dst}: got seq {seq} after {self.last_seq}")
        return True

    def in_order(self, conn_no: int, first_seq: int) -> bool:
        """Would `admit` take every message of a run from `first_seq` on, each applied before the
        next (`applied_run`)? True when it is the current connection's next seq."""
        return conn_no == self.conn_no and first_seq == self.last_seq + 1

    def applied_run(self, first_seq: int, lsns: list[int]) -> None:
        """Messages first_seq, first_seq + 1, ... were applied and logged as records `lsns`:
        `applied` of each, in order."""
        if lsns:
            last = first_seq + len(lsns) - 1
            self._pending.extend(zip(range(first_seq, last + 1), lsns, strict=True))
            self.last_seq = last
            self._owed = True

    def applied(self, seq: int, lsn: int) -> None:
        """Message `seq` was applied and logged as record `lsn`."""
        self.last_seq = seq
        self._pending.append((seq, lsn))
        self._owed = True

    def ack_due(self, durable_lsn: int) -> int | None:
        """The cumulative ack to send now (L2), or None."""
        if not self._owed:
            return None
        best = None
        pending = self._pending
        if pending and pending[-1][1] <= durable_lsn:  # all of them durable, the common case: no loop
            best = pending[-1][0]
            pending.clear()
        while pending and pending[0][1] <= durable_lsn:
            best = pending.popleft()[0]
        if best is None or best <= self._acked:
            return None
        self._acked = best
        self._owed = bool(pending)
        return best
