"""The request-id window: the client retry keys a node remembers (pure): a retry is answered, never paid twice.

A client may send a transfer (an app node: a command) with a `request_id`; a
retry with the same id gets the first answer and sends nothing again. The node
keeps the ids it paid

W1. by age, for `REQUEST_TTL_S` seconds of wall-clock time (the caller passes
    the time in), oldest first: an id leaves the window only once it is older
    than the TTL, never because newer ones pushed it out;
W2. at most `REQUEST_CAPACITY` of them, and at most `max_bytes` bytes
    (the node setting `reply_window_bytes`, default `REPLY_WINDOW_BYTES`):
    ids, answers (a transfer's msg id, an app's reply) and digests (W5). When
    the window holds that many ids, or that many bytes, younger than the TTL, a
    request with a new id is refused (`WindowFull`, RESOURCE_EXHAUSTED) rather
    than evicting an id a client may still retry; requests without an id are
    not affected. An app's reply is known only once the app has run, so the
    bytes are checked before it runs: the window may pass `max_bytes` by one
    entry (one reply, at most `max_reply_bytes`: node rule N12);
W3. across restarts, in order: a checkpoint carries each id with its age and
    the lsn of its send record; ids recovered from send records after the
    checkpoint are as old as the restart (kept at least as long, never less);
W4. across restores: at a restore of snapshot S, the ids paid after S's cut at
    this node (send lsn > cut lsn) are forgotten, since the restore took their
    payment back (a retry pays again, in the new epoch). The ids paid before
    the cut stay. When the node no longer knows S's cut, every id it holds is
    marked doubtful: a retry of one is refused (`RequestInDoubt`,
    FAILED_PRECONDITION), never answered "paid" and never paid twice.
W5. one request per id: the window keeps a digest of what each id asked for
    (a command's bytes); the same id with
    other content is refused (INVALID_ARGUMENT, naming the id), never answered
    as a retry and never paid. The digest is rebuilt from the logged request
    (the `command` record's bytes) and kept
    in checkpoints. A checkpoint written before W5 holds none: such an id's
    digest is unknown (""), and its retry is answered as before W5, whatever
    it asks for.
W6. an app's answer says the epoch its command ran in: the window keeps it
    (a restore keeps the ids paid before its cut, so an id can be older than
    the epoch), recovery takes it from the epoch the `command` record was
    written in, checkpoints keep it. A checkpoint written before W6 holds none
    (0): the answer falls back to the node's epoch now, as before W6.

A client that sets `first_sent_unix_ms` (the wall-clock time of its first
attempt) on a retry older than the window is refused (`RequestExpired`,
FAILED_PRECONDITION) instead of being paid again: past the window the node no
longer knows whether it paid it.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from snapmesh.protocol.node import core

MAX_ID_BYTES = 128  # a longer request_id is refused (INVALID_ARGUMENT), never logged
REQUEST_TTL_S = 900.0  # 15 minutes
REQUEST_CAPACITY = 200_000
# 64 MiB: far above what 200,000 ids with small answers hold (at most 128 + ~20 + 32 bytes
# each, ~36 MB; ~18 MB for 36-character ids), so for those the id cap binds first;
# for large replies, 64 of 1 MiB, a node's memory bounded instead of growing by
# every reply of the last 15 minutes.
REPLY_WINDOW_BYTES = 64 * 2**20
IN_DOUBT = -1  # the lsn of an id whose payment a restore may have taken back (W4)


class Paid(NamedTuple):
    msg_id: str
    # the seq of the first message its command sent (0: none); an old native log's entry holds its
    # figure after it here, which that log's reader (App.old_logs) maps
    first_seq: int
    at: float  # wall-clock seconds when it was paid (or first known, W3)
    lsn: int  # its send record; IN_DOUBT after a restore whose cut is unknown
    digest: str = ""  # what the request asked for (W5); "": unknown, from before W5
    epoch: int = 0  # the epoch it was paid in (W6); 0: unknown, from before W6


def command_digest(command: bytes) -> str:
    """An app command's digest (W5): of the bytes its `command` record holds."""
    return digest_of(b"C" + command)


def digest_of(data: bytes) -> str:
    """A request's digest (W5) of the bytes that say what it asked for."""
    # 128 bits tell a client's other request from its retry; half a sha256's bytes per id.
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def entry_bytes(request_id: str, paid: Paid) -> int:
    """What one id costs the window's byte budget (W2): its id, answer and digest."""
    return len(request_id.encode()) + len(paid.msg_id) + len(paid.digest)


class WindowFull(core.LocalProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(message, core.Refusal.REQUESTS_FULL)


class RequestReused(core.LocalProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(message, core.Refusal.INVALID_INPUT)


class RequestExpired(core.LocalProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(message, core.Refusal.REQUEST_UNKNOWN)


class RequestInDoubt(core.LocalProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(message, core.Refusal.REQUEST_UNKNOWN)


class RequestWindow:
    """request_id -> Paid, oldest first (W1-W6)."""

    def __init__(
        self, paid: Iterable[tuple[str, Paid]] = (), *, ttl_s: float = REQUEST_TTL_S, capacity: int = REQUEST_CAPACITY,
        max_bytes: int = REPLY_WINDOW_BYTES,
    ) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._paid: OrderedDict[str, Paid] = OrderedDict(paid)  # oldest first, as given
        # The `at` of the first id as `expire` last saw it (-inf: look again): while the TTL's
        # horizon is below it, nothing expires, and `expire` need not look at the window at all.
        self._first_at = -math.inf
        self.bytes = sum(entry_bytes(rid, p) for rid, p in self._paid.items())  # held now (W2)

    def __len__(self) -> int:
        return len(self._paid)

    def items(self) -> list[tuple[str, Paid]]:
        return list(self._paid.items())

    def lookup(self, request_id: str, now: float, first_sent_unix_ms: int = 0, digest: str = "") -> Paid | None:
        """The first answer for a retry, None for an id to pay now. `digest`:
        the request's (transfer_digest, command_digest; W5). Raises
        RequestReused, RequestInDoubt, RequestExpired or WindowFull, or
        core.LocalProtocolError for an id over MAX_ID_BYTES (nothing changes)."""
        if len(request_id) > MAX_ID_BYTES // 4 and len(request_id.encode()) > MAX_ID_BYTES:
            raise core.LocalProtocolError(
                f"request_id is {len(request_id.encode())} bytes; the limit is {MAX_ID_BYTES}", core.Refusal.INVALID_INPUT
            )
        self.expire(now)
        paid = self._paid.get(request_id)
        if paid is not None:
            if digest and paid.digest and digest != paid.digest:  # a client's mistake, whatever became of the first
                raise RequestReused(
                    f"request_id {request_id!r} was used for another request; a retry must repeat the first request "
                    "exactly (send a new request under a new request_id)"
                )
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
        if self.bytes >= self.max_bytes:
            raise WindowFull(
                f"the request-id window holds {self.bytes} bytes of ids and answers younger than {self.ttl_s:g}s "
                f"(limit reply_window_bytes = {self.max_bytes}); retry later or send without request_id"
            )
        return None

    def paid(self, request_id: str, paid: Paid) -> None:
        old = self._paid.get(request_id)
        if old is not None:
            self.bytes -= entry_bytes(request_id, old)
            self._first_at = -math.inf  # it may have been the first
        elif not self._paid:
            self._first_at = paid.at  # the first now
        self._paid[request_id] = paid
        self._paid.move_to_end(request_id)
        self.bytes += entry_bytes(request_id, paid)

    def expire(self, now: float) -> None:
        """Forget the ids older than the TTL (W1)."""
        horizon = now - self.ttl_s
        if horizon <= self._first_at:  # the first id is younger than the TTL: so is every one
            return
        window = self._paid
        while window:
            first = next(iter(window.values()))
            if first.at >= horizon:
                self._first_at = first.at
                return
            rid, paid = window.popitem(last=False)
            self.bytes -= entry_bytes(rid, paid)
        self._first_at = -math.inf

    def restored(self, cuts: Mapping[str, int], snapshot_id: str) -> None:
        """A restore of `snapshot_id` (W4)."""
        forget_restored(self._paid, cuts, snapshot_id)
        self._first_at = -math.inf
        self.bytes = sum(entry_bytes(rid, p) for rid, p in self._paid.items())  # a restore is rare: count again

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
    return {rid: [p.msg_id, p.first_seq, p.at, p.lsn, p.digest, p.epoch] for rid, p in paid.items()}


def from_checkpoint(value: dict) -> list[tuple[str, Paid]]:
    """A checkpoint's `requests`, oldest first. An entry from before W3
    ([msg_id, first_seq]) gets `at` 0.0 (the node makes it the restart's time);
    one from before W5 and W6 ([msg_id, first_seq, at, lsn]) an unknown digest and
    epoch. Raises ValueError/TypeError for a malformed entry."""
    out = []
    for rid, entry in value.items():
        digest, epoch = "", 0
        if len(entry) == 2:
            msg_id, first_seq = entry
            at, lsn = 0.0, 0
        elif len(entry) == 4:
            msg_id, first_seq, at, lsn = entry
        else:
            msg_id, first_seq, at, lsn, digest, epoch = entry
        out.append((str(rid), Paid(str(msg_id), int(first_seq), float(at), int(lsn), str(digest), int(epoch))))
    out.sort(key=lambda item: (item[1].at, item[1].lsn))  # the checkpoint's object is in key order, not age
    return out
