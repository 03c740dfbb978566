"""Client stubs shared by the tests that talk to real controller and node processes."""

from __future__ import annotations

import grpc

from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc


def controller_stub(address: str) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.ControllerStub(channel)


def node_stub(address: str) -> tuple[grpc.Channel, pb_grpc.NodeStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.NodeStub(channel)
