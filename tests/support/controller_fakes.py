"""Stand-ins for the controller's in-process shell tests (a real engine, journal and store,
no gRPC server): `CallContext`, a plaintext call's context (no certificate, a peer
address; an abort fails the test), and `QuietNode`, a node stub that accepts every
StartSnapshot and does nothing else."""

from __future__ import annotations

from snapmesh.v1 import snapmesh_pb2 as pb


class CallContext:
    """A plaintext call's context: no certificate, a peer address."""

    def auth_context(self) -> dict:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


class QuietNode:
    async def StartSnapshot(self, request, timeout, wait_for_ready=False):
        return pb.StartSnapshotResponse()
