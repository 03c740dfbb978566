"""A controller and its nodes in this process, for the client commands' tests: each
node reports the app it is told to, and the commands it is sent are counted."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent import futures

import grpc

from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc


class _Node(pb_grpc.NodeServicer):
    def __init__(self, node_id: str, app: str, cluster: FakeCluster) -> None:
        self.node_id, self.app, self.cluster = node_id, app, cluster

    def GetState(self, request, context):
        return pb.NodeStateResponse(node_id=self.node_id, app=self.app)

    def Submit(self, request, context):
        self.cluster.commands += 1
        return pb.SubmitResponse(reply=b"")

    def SubmitBatch(self, request, context):
        self.cluster.commands += len(request.items)
        return pb.SubmitBatchResponse(results=[pb.SubmitResult(reply=b"") for _ in request.items])


class FakeCluster(pb_grpc.ControllerServicer):
    """A controller and a full mesh of nodes, each on its own loopback port
    (`with FakeCluster({"p1": app, "p2": app}) as cluster:`; a str: every node of
    p1, p2 reports it in GetState); `commands` counts the commands sent to any node (Submit, SubmitBatch)."""

    def __init__(self, apps: Mapping[str, str] | str) -> None:
        self.apps = dict.fromkeys(("p1", "p2"), apps) if isinstance(apps, str) else dict(apps)
        self.commands = 0
        self.servers: list[grpc.Server] = []
        self.address = self._serve(lambda server: pb_grpc.add_ControllerServicer_to_server(self, server))
        self.nodes = {node: self._serve(lambda server, node=node, app=app:
                                        pb_grpc.add_NodeServicer_to_server(_Node(node, app, self), server))
                      for node, app in self.apps.items()}

    def _serve(self, add) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        add(server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        self.servers.append(server)
        return address

    def __enter__(self) -> FakeCluster:
        return self

    def __exit__(self, *exc_info) -> None:
        for server in self.servers:
            server.stop(0)

    def GetCluster(self, request, context):
        return pb.Cluster(nodes=[pb.NodeInfo(node_id=n, address=a) for n, a in self.nodes.items()],
                          channels=[pb.ChannelId(src=s, dst=d) for s in self.nodes for d in self.nodes if s != d])

    def TriggerSnapshot(self, request, context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "not in this test")
