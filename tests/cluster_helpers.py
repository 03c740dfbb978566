"""Client stubs shared by the tests that talk to real controller and node processes.

`identity`: a TLS cluster's client identity (`Cluster.client_identity`); None: plaintext.
"""

from __future__ import annotations

import grpc

from snapmesh import security
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc


def controller_stub(address: str, identity=None) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    channel = security.open_channel(address, identity)
    return channel, pb_grpc.ControllerStub(channel)


def node_stub(address: str, identity=None, server_name: str | None = None) -> tuple[grpc.Channel, pb_grpc.NodeStub]:
    """`server_name`: the name the node's certificate holds, when dialling an address it does not (a container IP)."""
    channel = security.open_channel(address, identity, server_name=server_name)
    return channel, pb_grpc.NodeStub(channel)
