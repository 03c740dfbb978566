"""Reading a controller `Snapshot` message, for everyone who shows or measures one."""

from __future__ import annotations

from snapmesh.v1 import snapmesh_pb2 as pb


def duration_s(snapshot: pb.Snapshot) -> float:
    """Seconds from `started_at` to `finished_at` (0 while in progress)."""
    if not snapshot.HasField("finished_at"):
        return 0.0
    return max(0, snapshot.finished_at.ToNanoseconds() - snapshot.started_at.ToNanoseconds()) / 1e9
