"""The restore's plan: whether a snapshot can be restored, and each node's part (rule R3).

Pure: the controller machine (machine.py) asks `problem` before the gate starts
a restore, and sends each node the part `plan` and `with_app_fields` make.
"""

from __future__ import annotations

from snapmesh.protocol import appstate, restorestream
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller.appside import AppSide
from snapmesh.protocol.controller.tracker import COMPLETE
from snapmesh.v1 import snapmesh_pb2 as pb


def plan(snapshot: pb.Snapshot, epoch: int) -> dict[str, pb.RestoreStateRequest]:
    """Each node's part of restoring `snapshot` in `epoch`, as far as every app's is
    the same: an app's state bytes and the recorded state of every channel into it
    (in channel order). The app's side adds its own fields (`with_app_fields`).
    A listed state (blockforms.py BF1) is sent as its manifest (restorestream.py RS1)."""
    requests = {
        n.node_id: pb.RestoreStateRequest(
            snapshot_id=snapshot.snapshot_id, epoch=epoch, state=n.state if n.HasField("state") else None
        )
        for n in snapshot.nodes
    }
    for n in snapshot.nodes:
        if blockforms.is_listed(n):
            restorestream.listed_part(requests[n.node_id], n)
    for channel in snapshot.channels:
        if channel.in_flight:
            requests[channel.dst].channels.append(channel)
    return requests


def with_app_fields(
    requests: dict[str, pb.RestoreStateRequest], snapshot: pb.Snapshot, side: AppSide
) -> dict[str, pb.RestoreStateRequest]:
    """`plan`'s requests, each with the app's fields of its node's entry in `snapshot` (R3)."""
    for entry in snapshot.nodes:
        if entry.node_id in requests:
            side.restore_part(requests[entry.node_id], entry)
    return requests


def problem(snapshot: pb.Snapshot) -> str:
    """Why one cannot restore `snapshot` ("" when one can)."""
    if snapshot.status != COMPLETE:
        status = pb.Snapshot.Status.Name(snapshot.status)
        return f"snapshot {snapshot.snapshot_id} is {status}, not COMPLETE"
    if appstate.carries_v1(snapshot) and not snapshot.conserved:
        return f"snapshot {snapshot.snapshot_id} is not conserved (total {snapshot.total}, expected {snapshot.expected_total})"
    broken = appstate.failed_invariants(snapshot)
    if broken:
        names = ", ".join(repr(b.name) for b in broken)
        return f"snapshot {snapshot.snapshot_id} breaks the app's invariant(s) {names}: {snapshot.reason}"
    return ""
