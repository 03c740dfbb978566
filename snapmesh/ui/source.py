"""Where the page's data comes from: the controller's gRPC API and, with a data
dir, the files the cluster writes. Read-only: no call here changes anything.

`ControllerDown` when the controller does not answer; `NotFound` for an unknown
snapshot id. Everything else a file can fail with becomes a note on the page
(`Source.trace_svg`, `Source.last_restore`, `Source.log_records` return None
and a reason), never an error page.

What any visitor can make it do is bounded: a text that is not a snapshot id is
NotFound without a call; an id the controller does not know is remembered as
such for UNKNOWN_KEPT_S; a picture is drawn from the log lines around its cut
only, at most `window_bytes` of each node's log (`snapmesh.trace.logs.read_around`),
one at a time (`Busy` meanwhile), and
both the pictures and the reasons there is none are kept (the newest TRACES_KEPT
and NO_PICTURE_KEPT). The logs of a stuck snapshot are read by one visitor at a
time, a block of a file at a time, parsing only the lines that name it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from snapmesh.protocol.controller.snapshot_ids import snapshot_id_problem
from snapmesh.settings import security
from snapmesh.serving import credentials
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 3.0
NODE_TIMEOUT_S = 0.5  # a paused node must not stall the page
TRACES_KEPT = 8  # pictures kept drawn
NO_PICTURE_KEPT = 256  # reasons a picture could not be drawn, kept
UNKNOWN_KEPT = 4096  # ids the controller said it does not know, kept ...
UNKNOWN_KEPT_S = 30.0  # ... for this long
MAX_PAGES = 100  # of ListSnapshots, where the controller pages its answer


class ControllerDown(RuntimeError):
    """The controller does not answer; the message says where and why."""


class NotFound(LookupError):
    pass


class Busy(RuntimeError):
    """Another picture is being drawn (one at a time): ask again shortly."""


class Source:
    def __init__(
        self, controller: str, identity: security.Identity | None = None, data_dir: Path | None = None,
        window_bytes: int | None = None,
    ):
        """`window_bytes`: of each node's log, how much a picture reads around its
        cut (None: snapmesh.trace.logs.WINDOW_BYTES)."""
        self.controller = controller
        self.identity = identity
        self.data_dir = data_dir
        self.window_bytes = window_bytes
        self._channel = credentials.open_channel(controller, identity, options=CLIENT_OPTIONS)
        self._stub = pb_grpc.ControllerStub(self._channel)
        self._node_channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ui-nodes")
        self._traces: OrderedDict[str, str] = OrderedDict()  # snapshot id -> svg, the newest last
        self._no_picture: OrderedDict[str, str] = OrderedDict()  # snapshot id -> why it has no picture
        self._unknown: OrderedDict[str, float] = OrderedDict()  # snapshot id -> when the controller did not know it
        self._drawing = threading.Lock()  # one picture at a time
        self._reading = threading.Lock()  # one reader of the logs for a stuck snapshot at a time
        self._journal_cache: tuple[Any, tuple[pb.Restore | None, str]] | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for channel in self._node_channels.values():
            channel.close()
        self._channel.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise NotFound(error.details()) from None
            from snapmesh.commands.client_errors import explain  # what to change: TLS on or off, a node's address

            raise ControllerDown(
                f"the controller at {self.controller} does not answer: {explain(error, self.controller, self.identity)}"
            ) from None

    # ---------------------------------------------------------------- controller

    def snapshots(self) -> list[pb.Snapshot]:
        """Every snapshot the controller lists, following its pages when it pages them
        (`next_page_token`; an API without it answers everything at once), at most
        MAX_PAGES pages."""
        found: list[pb.Snapshot] = []
        request = pb.ListSnapshotsRequest()
        for _ in range(MAX_PAGES):
            answer = self._call(self._stub.ListSnapshots, request)
            found.extend(answer.snapshots)
            token = getattr(answer, "next_page_token", "")
            if not token:
                break
            request = pb.ListSnapshotsRequest(page_token=token)
        return found

    def snapshot(self, snapshot_id: str) -> pb.Snapshot:
        """The controller's snapshot; NotFound, without asking it, for a text that is
        not a snapshot id or an id it did not know a moment ago."""
        if problem := snapshot_id_problem(snapshot_id):
            raise NotFound(problem)
        now = time.monotonic()
        with self._lock:
            asked = self._unknown.get(snapshot_id)
            if asked is not None and now - asked < UNKNOWN_KEPT_S:
                raise NotFound(f"no snapshot {snapshot_id!r}")
        try:
            return self._call(self._stub.GetSnapshot, pb.GetSnapshotRequest(snapshot_id=snapshot_id))
        except NotFound:
            with self._lock:
                _keep(self._unknown, snapshot_id, now, UNKNOWN_KEPT)
            raise

    def cluster(self) -> pb.Cluster:
        return self._call(self._stub.GetCluster, pb.GetClusterRequest())

    @property
    def tls_dir(self) -> str | None:
        """Where the client's certificate came from (the restore command names it); None: plaintext."""
        if self.identity is None or self.identity.files is None:
            return None
        return str(self.identity.files[0].parent)

    def export(self, snapshot: pb.Snapshot) -> bytes:
        """A finished snapshot's proto JSON: the controller's file in the data dir when
        there is one (with its checksum), else the same printing of `snapshot`."""
        if self.data_dir is not None:
            try:  # the id is a checked snapshot id (Source.snapshot): no path in it
                return (self.data_dir / "snapshots" / f"{snapshot.snapshot_id}.json").read_bytes()
            except OSError:
                pass  # not written yet, or retention removed it: print the controller's answer
        from snapmesh.services.controller.export import snapshot_json

        return snapshot_json(snapshot).encode()

    # ---------------------------------------------------------------- nodes

    def node_epochs(self, cluster: pb.Cluster) -> dict[str, int | None]:
        """Each node's epoch (GetState), None for a node that does not answer in time."""

        def one(node: pb.NodeInfo) -> int | None:
            with self._lock:
                channel = self._node_channels.get(node.address)
                if channel is None:
                    channel = credentials.open_channel(node.address, self.identity, options=CLIENT_OPTIONS)
                    self._node_channels[node.address] = channel
            try:
                return pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=NODE_TIMEOUT_S).epoch
            except grpc.RpcError:
                return None

        nodes = list(cluster.nodes)
        return dict(zip((n.node_id for n in nodes), self._pool.map(one, nodes), strict=True))

    # ---------------------------------------------------------------- files (--data-dir)

    def last_restore(self, cluster: pb.Cluster | None = None) -> tuple[pb.Restore | None, str]:
        """The newest restore: the controller's answer (`Cluster.last_restore`), else,
        with a data dir, its journal's newest; (None, why) without one. The journal
        is read again only when it changed (size, mtime)."""
        if cluster is not None and cluster.HasField("last_restore"):
            return cluster.last_restore, ""
        if self.data_dir is None:
            return None, "none"
        from snapmesh.protocol.controller import journal as J

        path = self.data_dir / "controller" / "journal"
        try:
            stat = path.stat()
            key = (stat.st_size, stat.st_mtime_ns)
            if self._journal_cache is not None and self._journal_cache[0] == key:
                return self._journal_cache[1]
            data = path.read_bytes()
        except OSError as exc:
            return None, f"cannot read {path}: {exc.strerror or exc}"
        records, _, _ = J.decode_all(data)
        restore = J.last_restore(records)
        answer = (restore, "" if restore is not None else "none")
        self._journal_cache = (key, answer)
        return answer

    def log_records(self, node_ids: list[str], snapshot_id: str) -> tuple[dict[str, list[dict]] | None, str]:
        """Each node's log records of `snapshot_id` in its last sealed segment and its
        active file (where an IN_PROGRESS snapshot's records are); (None, why) without
        readable logs, or while another page reads them (one reader at a time, a file
        at a time: the page then shows the controller's view)."""
        if self.data_dir is None:
            return None, "no --data-dir: the controller's view only (which nodes reported)"
        from snapmesh.checking.node_logs import log_files

        if not self._reading.acquire(blocking=False):
            return None, "the logs are being read for another visitor: the controller's view for now"
        from snapmesh.trace.logs import lines_naming

        needle = f'"{snapshot_id}"'.encode()
        found: dict[str, list[dict]] = {}
        try:
            for node in node_ids:
                found[node] = []
                for path in log_files(self.data_dir, node)[-2:]:  # a block at a time: a segment can be large
                    found[node] += _records(lines_naming(path, needle))
        except OSError as exc:
            return None, f"the logs in {self.data_dir} cannot be read: {exc.strerror or exc}"
        finally:
            self._reading.release()
        return found, ""

    def trace_svg(self, snapshot_id: str, caption: tuple[str, ...] = ()) -> tuple[str | None, str]:
        """The space-time picture (`snapmesh trace`) around a COMPLETE snapshot's cut
        (the caller asks the controller first), drawn from the log lines around it,
        `caption` under it (an app's describe of the snapshot).
        Drawn once per snapshot (what happened around a past cut does not change), and
        one at a time: Busy while another is drawn. A reason there is none is kept too."""
        if self.data_dir is None:
            return None, "no --data-dir: the logs the picture is drawn from are not readable here"
        if (known := self._drawn(snapshot_id)) is not None:
            return known
        if not self._drawing.acquire(blocking=False):
            raise Busy("another picture is being drawn; ask again in a moment")
        try:
            if (known := self._drawn(snapshot_id)) is not None:  # drawn while this one waited
                return known
            return self._draw(snapshot_id, caption)
        finally:
            self._drawing.release()

    def _drawn(self, snapshot_id: str) -> tuple[str | None, str] | None:
        with self._lock:
            if snapshot_id in self._traces:
                self._traces.move_to_end(snapshot_id)
                return self._traces[snapshot_id], ""
            if snapshot_id in self._no_picture:
                return None, self._no_picture[snapshot_id]
        return None

    def _draw(self, snapshot_id: str, caption: tuple[str, ...] = ()) -> tuple[str | None, str]:
        from snapmesh.trace.clocks import TraceError, build_trace
        from snapmesh.trace.layout import LayoutError, layout
        from snapmesh.trace.logs import LogError, read_around
        from snapmesh.trace.svg import render_svg

        try:
            window = {} if self.window_bytes is None else {"window_bytes": self.window_bytes}
            trace = build_trace(read_around(self.data_dir, snapshot_id, **window))
            svg = render_svg(layout(trace, chosen=snapshot_id), title=f"snapshot {snapshot_id}", caption=caption)
        except (LogError, TraceError, LayoutError, OSError) as exc:
            with self._lock:
                _keep(self._no_picture, snapshot_id, f"no picture: {exc}", NO_PICTURE_KEPT)
            return None, f"no picture: {exc}"
        with self._lock:
            _keep(self._traces, snapshot_id, svg, TRACES_KEPT)
        return svg, ""


def _records(lines) -> list[dict]:
    """The lines that parse as records (a line that does not is skipped: the page
    only looks for which nodes recorded and which markers came)."""
    found = []
    for raw in lines:
        try:
            found.append(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    return found


def _keep(kept: OrderedDict, key: str, value, most: int) -> None:
    """Put `key` in `kept` as its newest entry, dropping the oldest past `most`."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > most:
        kept.popitem(last=False)
