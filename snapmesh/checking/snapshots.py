"""Reading a controller `Snapshot` message, for everyone who shows or measures one."""

from __future__ import annotations

import sys

from snapmesh.v1 import snapmesh_pb2 as pb


def duration_s(snapshot: pb.Snapshot) -> float:
    """Seconds from `started_at` to `finished_at` (0 while in progress)."""
    if not snapshot.HasField("finished_at"):
        return 0.0
    return max(0, snapshot.finished_at.ToNanoseconds() - snapshot.started_at.ToNanoseconds()) / 1e9


def fetch(stub, snapshot_id: str, timeout: float = 60.0) -> pb.Snapshot:
    """One snapshot of any size from a ControllerStub: its encoding in pieces
    (GetSnapshotChunks), put back together."""
    request = pb.GetSnapshotRequest(snapshot_id=snapshot_id)
    return pb.Snapshot.FromString(b"".join(chunk.data for chunk in stub.GetSnapshotChunks(request, timeout=timeout)))


def pages(stub, *, status: int = 0, page_size: int = 0, timeout: float = 60.0):
    """Every snapshot a ControllerStub lists, ListSnapshots page after page,
    oldest first (as listed: one larger than a page comes `in_flight_omitted`)."""
    token = ""
    while True:
        page = stub.ListSnapshots(pb.ListSnapshotsRequest(page_size=page_size, page_token=token, status=status),
                                  timeout=timeout)
        yield from page.snapshots
        token = page.next_page_token
        if not token:
            return


def list_all(stub, *, status: int = 0, timeout: float = 60.0) -> list[pb.Snapshot]:
    """Every snapshot whole: every page, and the ones listed without their
    in-flight transfers fetched in pieces."""
    return [fetch(stub, s.snapshot_id, timeout) if s.in_flight_omitted else s
            for s in pages(stub, status=status, timeout=timeout)]


JSON_STATES_MAX_BYTES = 512 * 1024 * 1024  # `get --json` fetches states left out up to this much in all


def fetch_states(stub, snapshot_id: str, timeout: float = 60.0, *, states: bool = True):
    """(the snapshot, the nodes whose states GetSnapshotChunks brought): GetSnapshot's
    answer, or the pieces when it is too large, leaves in-flight messages out, or
    (`states`) leaves out states of JSON_STATES_MAX_BYTES at most in all."""
    import grpc

    from snapmesh.v1 import snapmesh_pb2 as pb

    try:
        answer = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snapshot_id), timeout=timeout)
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return fetch(stub, snapshot_id, timeout), []
    left_out = sum(n.state_bytes for n in answer.nodes if n.state_omitted)
    if states and answer.states_omitted and left_out > JSON_STATES_MAX_BYTES:
        print(f"snapmesh snapshot get: the states of {snapshot_id} add up to {left_out:,} bytes, over {JSON_STATES_MAX_BYTES:,}: "
              "left out (state_bytes, state_digest kept); GetSnapshotChunks or the snapshots/ export has them",
              file=sys.stderr)
        states = False
    if not answer.in_flight_omitted and not (states and answer.states_omitted):
        return answer, []
    return fetch(stub, snapshot_id, timeout), [n.node_id for n in answer.nodes if n.state_omitted]
