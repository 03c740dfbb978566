"""The request-id window: the client retry keys a node remembers (pure): a retry is answered, never paid twice.

A client may send a transfer with a `request_id`; a retry with the same id gets
the first answer and sends nothing again. The node keeps the ids it paid

W1. by age, for `REQUEST_TTL_S` seconds of wall-clock time (the caller passes
    the time in), oldest first: an id leaves the window only once it is older
    than the TTL, never because newer ones pushed it out;
W2. at most `REQUEST_CAPACITY` of them: when the window holds that many ids
    younger than the TTL, a transfer with a new id is refused
    (`WindowFull`, RESOURCE_EXHAUSTED) rather than evicting an id a client may
    still retry; transfers without an id are not affected;
W3. across restarts, in order: a checkpoint carries each id with its age and
    the lsn of its send record; ids recovered from send records after the
    checkpoint are as old as the restart (kept at least as long, never less);
W4. across restores: at a restore of snapshot S, the ids paid after S's cut at
    this node (send lsn > cut lsn) are forgotten, since the restore took their
    payment back (a retry pays again, in the new epoch). The ids paid before
    the cut stay. When the node no longer knows S's cut, every id it holds is
    marked doubtful: a retry of one is refused (`RequestInDoubt`,
    FAILED_PRECONDITION), never answered "paid" and never paid twice.

A client that sets `first_sent_unix_ms` (the wall-clock time of its first
attempt) on a retry older than the window is refused (`RequestExpired`,
FAILED_PRECONDITION) instead of being paid again: past the window the node no
longer knows whether it paid it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from snapmesh.protocol.node import core

MAX_ID_BYTES = 128  # a longer request_id is refused (INVALID_ARGUMENT), never logged
REQUEST_TTL_S = 900.0  # 15 minutes
REQUEST_CAPACITY = 200_000
IN_DOUBT = -1  # the lsn of an id whose payment a restore may have taken back (W4)


class Paid(NamedTuple):
    msg_id: str
    tally: int  # the sender's tally after it
    at: float  # wall-clock seconds when it was paid (or first known, W3)
    lsn: int  # its send record; IN_DOUBT after a restore whose cut is unknown


class WindowFull(core.LocalProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(message, core.Refusal.REQUESTS_FULL)


class RequestExpired(core.LocalProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(message, core.Refusal.REQUEST_UNKNOWN)


class RequestInDoubt(core.LocalProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(message, core.Refusal.REQUEST_UNKNOWN)


class RequestWindow:
    """request_id -> Paid, oldest first (W1-W4)."""

    def __init__(
        self, paid: Iterable[tuple[str, Paid]] = (), *, ttl_s: float = REQUEST_TTL_S, capacity: int = REQUEST_CAPACITY
    ) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._paid: OrderedDict[str, Paid] = OrderedDict(paid)  # oldest first, as given

    def __len__(self) -> int:
        return len(self._paid)

    def items(self) -> list[tuple[str, Paid]]:
        return list(self._paid.items())

    def lookup(self, request_id: str, now: float, first_sent_unix_ms: int = 0) -> Paid | None:
        """The first answer for a retry, None for an id to pay now. Raises
        RequestInDoubt, RequestExpired or WindowFull, or core.LocalProtocolError
        for an id over MAX_ID_BYTES (nothing changes)."""
        if len(request_id) > MAX_ID_BYTES // 4 and len(request_id.encode()) > MAX_ID_BYTES:
            raise core.LocalProtocolError(
                f"request_id is {len(request_id.encode())} bytes; the limit is {MAX_ID_BYTES}", core.Refusal.INVALID_INPUT
            )
        self.expire(now)
        paid = self._paid.get(request_id)
        if paid is not None:
            if paid.lsn == IN_DOUBT:
                raise RequestInDoubt(
                    f"request_id {request_id!r} was paid before a restore that may have taken it back; "
                    "check the node's state before sending it again under a new request_id"
                )
            return paid
        if first_sent_unix_ms and first_sent_unix_ms / 1000 < now - self.ttl_s:
            raise RequestExpired(
                f"request_id {request_id!r} was first sent {now - first_sent_unix_ms / 1000:.0f}s ago, "
                f"older than the request-id window ({self.ttl_s:g}s): whether it was paid is no longer known; not paid"
            )
        if len(self._paid) >= self.capacity:
            raise WindowFull(
                f"the request-id window holds {len(self._paid)} ids younger than {self.ttl_s:g}s "
                f"(limit {self.capacity}); retry later or send without request_id"
            )
        return None

    def paid(self, request_id: str, paid: Paid) -> None:
        self._paid[request_id] = paid
        self._paid.move_to_end(request_id)

    def expire(self, now: float) -> None:
        """Forget the ids older than the TTL (W1)."""
        horizon = now - self.ttl_s
        window = self._paid
        while window:
            first = next(iter(window.values()))
            if first.at >= horizon:
                return
            window.popitem(last=False)

    def restored(self, cuts: Mapping[str, int], snapshot_id: str) -> None:
        """A restore of `snapshot_id` (W4)."""
        forget_restored(self._paid, cuts, snapshot_id)

    def as_dict(self, now: float) -> OrderedDict[str, Paid]:
        """The ids younger than the TTL, oldest first (what a checkpoint keeps)."""
        self.expire(now)
        return OrderedDict(self._paid)


def forget_restored(paid: OrderedDict[str, Paid], cuts: Mapping[str, int], snapshot_id: str) -> None:
    """W4 on `paid`, in place; `cuts`: snapshot id -> the lsn of its cut here
    (the recent ones). A cut older than every one kept is older than the oldest
    kept: the ids paid after that one are forgotten, the others are in doubt."""
    cut = cuts.get(snapshot_id)
    exact = cut is not None
    if cut is None:
        cut = min(cuts.values(), default=None)
    for rid in list(paid):
        entry = paid[rid]
        if cut is not None and entry.lsn > cut:
            del paid[rid]
        elif not exact and entry.lsn != IN_DOUBT:
            paid[rid] = entry._replace(lsn=IN_DOUBT)


def to_checkpoint(paid: Mapping[str, Paid]) -> dict:
    return {rid: [p.msg_id, p.tally, p.at, p.lsn] for rid, p in paid.items()}


def from_checkpoint(value: dict) -> list[tuple[str, Paid]]:
    """A checkpoint's `requests`, oldest first. An entry from before W3
    ([msg_id, tally]) gets `at` 0.0 (the node makes it the restart's time).
    Raises ValueError/TypeError for a malformed entry."""
    out = []
    for rid, entry in value.items():
        if len(entry) == 2:
            msg_id, tally = entry
            at, lsn = 0.0, 0
        else:
            msg_id, tally, at, lsn = entry
        out.append((str(rid), Paid(str(msg_id), int(tally), float(at), int(lsn))))
    out.sort(key=lambda item: (item[1].at, item[1].lsn))  # the checkpoint's object is in key order, not age
    return out
