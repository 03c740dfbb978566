"""What an error of a Controller RPC answers, decided: its gRPC status and details.

S1. A refusal of the pure layer (the machine's, the tracker's, the restore
    gate's, a read's, a chunked report's) names its status (`code`); its words
    are the details.
S2. A record that could not be made durable (OSError) in an RPC that journals is
    UNAVAILABLE, naming what it journals ("cannot journal the restore: ...").
S3. Anything else is no answer: the shell raises it as it is (gRPC's UNKNOWN).
S4. A WatchSnapshots watcher that fell behind is dropped with RESOURCE_EXHAUSTED,
    saying where to read what it missed (`dropped`).

The servicer (services/controller/servicer.py) only sends what `status` returns.
"""

from __future__ import annotations

from snapmesh.protocol import chunking, manifestdelta, restorestream
from snapmesh.protocol.controller import listing, restoregate
from snapmesh.protocol.controller.refusals import MissingBlocks, TooManySnapshots, UnknownInitiator
from snapmesh.protocol.controller.stopping import StopFailed, StopRefused
from snapmesh.protocol.controller.tracker import TrackerError

# What the pure layer refuses, each naming its status (`code`).
REFUSALS = (
    TrackerError, restoregate.Refused, UnknownInitiator, TooManySnapshots, chunking.ChunkError, listing.BadRequest,
    listing.TooLarge, StopRefused, StopFailed, MissingBlocks, restorestream.BlocksRefused,
    manifestdelta.MissingBase, manifestdelta.BadChange,
)


def status(error: Exception, journaled: str = "") -> tuple[str, str] | None:
    """(a grpc.StatusCode's name, the details) `error` is answered with, in an RPC
    that journals `journaled` ("": none); None when it is not an answer (S3)."""
    if isinstance(error, REFUSALS):  # S1
        return error.code, str(error)  # type: ignore[union-attr]
    if isinstance(error, OSError) and journaled:  # S2
        return "UNAVAILABLE", f"cannot journal the {journaled}: {error}"
    return None


def dropped(behind: object) -> tuple[str, str]:
    """The status a watcher that fell `behind` (its words: "fell N updates behind") is dropped with (S4)."""
    return "RESOURCE_EXHAUSTED", (
        f"this watcher {behind} and was dropped; watch again (ListSnapshots or GetSnapshot has what it missed)"
    )
