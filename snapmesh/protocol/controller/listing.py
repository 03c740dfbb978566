"""What a read of snapshots answers, decided: ListSnapshots' pages and GetSnapshot's size.

The servicer (services/controller/servicer.py) fetches snapshots and answers;
this module decides, given the request and what was fetched:

L1. A request is refused before anything is read (INVALID_ARGUMENT, `BadRequest`):
    a snapshot_id that is not one (no other text reaches the store), a negative
    page_size or max_bytes, a status that is not a Snapshot.Status, a page_token
    this controller did not give for the same status filter.
L2. A listing is in id order (start order): the tracker's working set merged with
    the store's index (`Merge`), a batch of ids at a time, so no file is read but
    the ones listed.
L3. A page ends after page_size snapshots (at most MAX_PAGE_SIZE), or before it
    would pass PAGE_BYTES; page_size 0: as many as fit under PAGE_BYTES (every
    snapshot, for most clusters). A snapshot whose states pass answer_state_bytes,
    or alone larger than a page, is listed without its app states (answers.py
    BA2); one still larger than a page also without its in-flight lists
    (`in_flight_omitted`). A page that ends early carries the next_page_token:
    opaque to clients, it names the last id listed and the filter it was for.
L4. GetSnapshot refuses (RESOURCE_EXHAUSTED) an answer larger than the client
    takes (max_bytes, 0: gRPC's default 4 MiB), saying how to fetch it;
    GetSnapshotChunks sends its encoding in pieces of CHUNK_BYTES (`chunks`).
L5. A snapshot whose stored files are damaged is DATA_LOSS, not NOT_FOUND, and
    is not restored (`Damaged` says so).
L6. A snapshot is looked up in the machine's working set first, then (a read of
    the disk) in the store (`find`); one neither has is NOT_FOUND, or L5's
    DATA_LOSS when its files were found damaged (`look_up`).

Pure: no file, socket or clock; the servicer hands in the ids and the snapshots.
"""

from __future__ import annotations

import base64
import bisect
import json
from dataclasses import dataclass

from collections.abc import Callable, Iterable

from snapmesh.protocol.chunking import CHUNK_BYTES
from snapmesh.protocol.controller import answers
from snapmesh.protocol.controller.snapshot_ids import snapshot_id_problem
from snapmesh.protocol.controller.tracker import UnknownSnapshot
from snapmesh.v1 import snapmesh_pb2 as pb

# What any gRPC client takes in one message by default (grpcurl's limit too): a
# ListSnapshots page ends before it, a larger GetSnapshot answer is refused
# saying how to fetch it. The margin leaves room for the framing.
CLIENT_DEFAULT_BYTES = 4 * 1024 * 1024
PAGE_BYTES = CLIENT_DEFAULT_BYTES - 64 * 1024
MAX_PAGE_SIZE = 1000
LOAD_BATCH = 256  # filed snapshots read per trip off the event loop, for a page without a page_size


class BadRequest(Exception):
    """An argument refused before anything is read (INVALID_ARGUMENT), in words (L1)."""

    code = "INVALID_ARGUMENT"


def check_id(snapshot_id: str) -> None:
    """BadRequest for a text that is not a snapshot id, before anything is looked
    up: only ids the tracker makes ever name a file in the store (L1)."""
    if problem := snapshot_id_problem(snapshot_id):
        raise BadRequest(problem)


def check_get(request: pb.GetSnapshotRequest) -> None:
    """A GetSnapshot request's arguments: BadRequest for a bad id or max_bytes (L1)."""
    check_id(request.snapshot_id)
    if problem := max_bytes_problem(request.max_bytes):
        raise BadRequest(problem)


@dataclass(frozen=True, slots=True)
class Start:
    """Where a listing starts (after this id, "" from the first), its page_size limit
    (None: only PAGE_BYTES) and how many ids to fetch per batch."""

    after: str
    limit: int | None
    batch: int


def list_start(request: pb.ListSnapshotsRequest) -> Start:
    """The listing a ListSnapshots request asks for; raises BadRequest (L1)."""
    if request.page_size < 0:
        raise BadRequest(f"page_size must not be negative, got {request.page_size}")
    if request.status not in pb.Snapshot.Status.values():
        raise BadRequest(f"status {request.status} is not a Snapshot.Status")
    after = ""
    if request.page_token:
        after = page_after(request.page_token, request.status)
        if after is None:
            raise BadRequest(
                f"page_token {request.page_token!r} is not a next_page_token of a ListSnapshots with the "
                f"same status filter"
            )
    limit = min(request.page_size, MAX_PAGE_SIZE) if request.page_size else None
    return Start(after=after, limit=limit, batch=(limit or LOAD_BATCH - 1) + 1)  # one more: is there a next page?


def max_bytes_problem(max_bytes: int) -> str:
    """Why a GetSnapshot max_bytes is refused ("" when it is not) (L1)."""
    return f"max_bytes must not be negative, got {max_bytes}" if max_bytes < 0 else ""


def too_large(snapshot_id: str, size: int, max_bytes: int) -> str:
    """Why a GetSnapshot answer of `size` bytes is refused ("" when it fits) (L4)."""
    limit = max_bytes or CLIENT_DEFAULT_BYTES
    if size <= limit:
        return ""
    return (
        f"snapshot {snapshot_id} is {size} bytes, more than the {limit} this client takes "
        f"(max_bytes; 0 means gRPC's default 4 MiB): fetch it in pieces with GetSnapshotChunks "
        f"(`snapmesh snapshot get {snapshot_id}` does), or set max_bytes to {size} "
        f"with a client whose receive limit is that high"
    )


class Damaged(UnknownSnapshot):
    """A snapshot whose stored files are damaged (L5): not read, not restored."""

    code = "DATA_LOSS"

    def __init__(self, snapshot_id: str, why: str, *, restoring: bool = False) -> None:
        nothing = ", not restored (nothing changed)" if restoring else ""
        super().__init__(f"snapshot {snapshot_id} is damaged on disk{nothing}: {why}")


class TooLarge(Exception):
    """A GetSnapshot answer larger than the client takes (L4)."""

    code = "RESOURCE_EXHAUSTED"


def check_size(snapshot_id: str, size: int, max_bytes: int) -> None:
    """TooLarge for a GetSnapshot answer of `size` bytes the client does not take (L4)."""
    if problem := too_large(snapshot_id, size, max_bytes):
        raise TooLarge(problem)


def find(
    snapshot_id: str, held: Callable[[str], pb.Snapshot], load: Callable[[str], pb.Snapshot | None] | None,
) -> pb.Snapshot | None:
    """The working set's snapshot (`held` raises UnknownSnapshot when it has none),
    else (with `load`) the store's; None when neither has it (L6)."""
    try:
        return held(snapshot_id)
    except UnknownSnapshot:
        return load(snapshot_id) if load is not None else None


def look_up(
    snapshot_id: str, held: Callable[[str], pb.Snapshot], load: Callable[[str], pb.Snapshot | None],
    damaged: Callable[[str], str | None],
) -> pb.Snapshot:
    """`find`'s snapshot; UnknownSnapshot when there is none, Damaged when its files
    were found damaged (`damaged`: why, None or "" when they were not) (L5, L6)."""
    if (snapshot := find(snapshot_id, held, load)) is None:
        if why := damaged(snapshot_id):
            raise Damaged(snapshot_id, why)
        raise UnknownSnapshot(f"no snapshot {snapshot_id!r}")
    return snapshot


def chunks(snapshot: pb.Snapshot) -> list[pb.SnapshotChunk]:
    """GetSnapshotChunks' answer (L4): the encoding in pieces of CHUNK_BYTES, in order (one, empty, for nothing)."""
    data = snapshot.SerializeToString()
    return [pb.SnapshotChunk(data=data[i : i + CHUNK_BYTES]) for i in range(0, max(len(data), 1), CHUNK_BYTES)]


def held(ids: Iterable[str], status_of: Callable[[str], int], start: Start, status: int) -> list[str]:
    """Of the working set's `ids` (sorted), those a listing from `start` with the `status` filter names (L2)."""
    return [sid for sid in ids if sid > start.after and (not status or status_of(sid) == status)]


class Merge:
    """The ids of one listing in order (L2): the working set's (`in_memory`, sorted,
    those after the start and of the filter: `held`) and the store index's, fed a batch at a
    time. Ask the index for `batch` ids after `cursor`; `take` says which ids come next."""

    def __init__(self, in_memory: list[str], after: str, batch: int) -> None:
        self._in_memory = list(in_memory)
        self.cursor = after
        self.batch = batch
        self.done = False

    def take(self, filed: list[str]) -> list[str]:
        """The next ids, in order, given the index's `filed` after `cursor`."""
        bound = filed[-1] if len(filed) == self.batch else None  # None: the index has no more
        taken = bisect.bisect_right(self._in_memory, bound) if bound is not None else len(self._in_memory)
        ids = sorted(set(filed).union(self._in_memory[:taken]))
        del self._in_memory[:taken]
        if ids:
            self.cursor = ids[-1]
        self.done = not ids or (bound is None and not self._in_memory)
        return ids


class Page:
    """One ListSnapshots answer, filled in id order (L3): `offer` each snapshot
    listed until it says the page is full."""

    def __init__(self, start: Start, status: int, *, state_bytes: int = answers.DEFAULT_STATE_BYTES) -> None:
        self.response = pb.ListSnapshotsResponse()
        self._state_bytes = state_bytes
        self._limit = start.limit
        self._status = status
        self._size = 0

    def offer(self, snapshot: pb.Snapshot | None) -> bool:
        """Take `snapshot` (None or one of another status: skipped); False once the
        page is full, with its next_page_token set (the snapshot not taken)."""
        if snapshot is None or (self._status and snapshot.status != self._status):
            return True
        snapshots = self.response.snapshots
        if self._limit is not None and len(snapshots) >= self._limit:
            self.response.next_page_token = page_token(snapshots[-1].snapshot_id, self._status)
            return False
        snapshot = answers.bounded(snapshot, state_bytes=self._state_bytes, max_bytes=PAGE_BYTES - 8, must_fit=False)
        if (own := snapshot.ByteSize() + 8) > PAGE_BYTES:  # alone larger than a page: without its in-flight lists
            answers.leave_out_in_flight(snapshot)
            own = snapshot.ByteSize() + 8
        self._size += own
        if snapshots and self._size > PAGE_BYTES:
            self.response.next_page_token = page_token(snapshots[-1].snapshot_id, self._status)
            return False
        snapshots.append(snapshot)
        return True


def page_token(last_id: str, status: int) -> str:
    """Opaque to clients: where the next page starts, and the filter it was for."""
    raw = json.dumps({"after": last_id, "status": status}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def page_after(token: str, status: int) -> str | None:
    """The id a page token says to continue after; None for a token this
    controller did not give for this filter."""
    try:
        fields = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (ValueError, UnicodeError):
        return None
    if not isinstance(fields, dict) or fields.get("status") != status or not isinstance(fields.get("after"), str):
        return None
    return fields["after"] or None
