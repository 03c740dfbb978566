"""Where the page's data comes from: the controller's gRPC API and, with a data
dir, the files the cluster writes. Read-only: no call here changes anything.

`ControllerDown` when the controller does not answer; `NotFound` for an unknown
snapshot id. Everything else a file can fail with becomes a note on the page
(`Source.trace_svg`, `Source.last_restore`, `Source.log_records` return None
and a reason), never an error page.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from snapmesh import security
from snapmesh.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 3.0
NODE_TIMEOUT_S = 0.5  # a paused node must not stall the page


class ControllerDown(RuntimeError):
    """The controller does not answer; the message says where and why."""


class NotFound(LookupError):
    pass


class Source:
    def __init__(self, controller: str, identity: security.Identity | None = None, data_dir: Path | None = None):
        self.controller = controller
        self.identity = identity
        self.data_dir = data_dir
        self._channel = security.open_channel(controller, identity, options=CLIENT_OPTIONS)
        self._stub = pb_grpc.ControllerStub(self._channel)
        self._node_channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ui-nodes")
        self._trace_cache: tuple[Any, str] | None = None  # (key, svg)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for channel in self._node_channels.values():
            channel.close()
        self._channel.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(error.details()) from None
            raise ControllerDown(
                f"the controller at {self.controller} does not answer: {error.code().name}: {error.details()}"
            ) from None

    # ---------------------------------------------------------------- controller

    def snapshots(self) -> list[pb.Snapshot]:
        return list(self._call(self._stub.ListSnapshots, pb.ListSnapshotsRequest()).snapshots)

    def snapshot(self, snapshot_id: str) -> pb.Snapshot:
        return self._call(self._stub.GetSnapshot, pb.GetSnapshotRequest(snapshot_id=snapshot_id))

    def cluster(self) -> pb.Cluster:
        return self._call(self._stub.GetCluster, pb.GetClusterRequest())

    # ---------------------------------------------------------------- nodes

    def node_epochs(self, cluster: pb.Cluster) -> dict[str, int | None]:
        """Each node's epoch (GetState), None for a node that does not answer in time."""

        def one(node: pb.NodeInfo) -> int | None:
            with self._lock:
                channel = self._node_channels.get(node.address)
                if channel is None:
                    channel = security.open_channel(node.address, self.identity, options=CLIENT_OPTIONS)
                    self._node_channels[node.address] = channel
            try:
                return pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=NODE_TIMEOUT_S).epoch
            except grpc.RpcError:
                return None

        nodes = list(cluster.nodes)
        return dict(zip((n.node_id for n in nodes), self._pool.map(one, nodes), strict=True))

    # ---------------------------------------------------------------- files (--data-dir)

    def last_restore(self) -> tuple[pb.Restore | None, str]:
        """The newest restore in the controller's journal; (None, why) without one."""
        if self.data_dir is None:
            return None, "unknown (give --data-dir to read the controller's journal)"
        from services.controller import journal as J

        path = self.data_dir / "controller" / "journal"
        try:
            data = path.read_bytes()
        except OSError as exc:
            return None, f"cannot read {path}: {exc.strerror or exc}"
        records, _, _ = J.decode_all(data)
        restore = J.last_restore(records)
        return restore, "" if restore is not None else "none"

    def log_records(self, node_ids: list[str]) -> tuple[dict[str, list[dict]] | None, str]:
        """Every node's log records; (None, why) without a data dir or readable logs."""
        if self.data_dir is None:
            return None, "no --data-dir: the controller's view only (which nodes reported)"
        from snapmesh.node_logs import LogReadError, read_logs

        try:
            return read_logs(self.data_dir, node_ids), ""
        except (LogReadError, OSError) as exc:
            return None, f"the logs in {self.data_dir} cannot be read: {exc}"

    def trace_svg(self, snapshot_id: str) -> tuple[str | None, str]:
        """The space-time picture (`snapmesh trace`) around `snapshot_id`'s cut."""
        if self.data_dir is None:
            return None, "no --data-dir: the logs the picture is drawn from are not readable here"
        from snapmesh.trace.clocks import TraceError, build_trace
        from snapmesh.trace.layout import LayoutError, layout
        from snapmesh.trace.logs import LogError, read_data_dir
        from snapmesh.trace.svg import render_svg

        try:
            key = (snapshot_id, tuple(sorted((p.name, p.stat().st_size) for p in self.data_dir.glob("*.jsonl"))))
            if self._trace_cache is not None and self._trace_cache[0] == key:
                return self._trace_cache[1], ""
            trace = build_trace(read_data_dir(self.data_dir))
            svg = render_svg(layout(trace, chosen=snapshot_id), title=f"snapshot {snapshot_id}")
        except (LogError, TraceError, LayoutError, OSError) as exc:
            return None, f"no picture: {exc}"
        self._trace_cache = (key, svg)
        return svg, ""
