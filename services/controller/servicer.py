"""The Controller gRPC service: a thin adapter around the tracker.

It feeds the tracker RPCs and the clock, re-arms one timer for the nearest
deadline, and carries out what follows a finished snapshot: persist it, update
the metrics, wake the waiters and watchers, and on FAILED tell every node to
drop what it recorded (best effort, in the background).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.controller.store import SnapshotStore
from services.controller.tracker import (
    COMPLETE,
    FAILED,
    DuplicateReport,
    InvalidReport,
    NotInProgress,
    Tracker,
    TrackerError,
    UnknownSnapshot,
    duration_s,
    new_snapshot_id,
)
from snapmesh import security
from snapmesh.config import ClusterConfig
from snapmesh.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_ERROR_CODES: dict[type[TrackerError], grpc.StatusCode] = {
    UnknownSnapshot: grpc.StatusCode.NOT_FOUND,
    InvalidReport: grpc.StatusCode.INVALID_ARGUMENT,
    DuplicateReport: grpc.StatusCode.ALREADY_EXISTS,
    NotInProgress: grpc.StatusCode.FAILED_PRECONDITION,
}

ABORT_TIMEOUT_S = 2.0


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.snapshots = Counter(
            "snapmesh_snapshots", "Finished snapshots by final status", ["status"], registry=registry
        )
        for status in ("complete", "failed"):
            self.snapshots.labels(status=status)
        self.duration = Histogram(
            "snapmesh_snapshot_duration_seconds",
            "Time from trigger to COMPLETE or FAILED",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.in_progress = Gauge(
            "snapmesh_snapshots_in_progress", "Snapshots started and not yet finished", registry=registry
        )


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(
        self,
        *,
        config: ClusterConfig,
        tracker: Tracker,
        store: SnapshotStore,
        metrics: ControllerMetrics,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        identity: security.Identity | None = None,  # None: plaintext
    ) -> None:
        self.identity = identity
        self.config = config
        self.tracker = tracker
        self.store = store
        self.metrics = metrics
        self._clock = clock
        self._rng = rng or random.Random()
        self._nodes = list(tracker.topology.nodes)
        self._stubs: dict[str, pb_grpc.NodeStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._done: dict[str, asyncio.Future[pb.Snapshot]] = {}
        self._watchers: set[asyncio.Queue[pb.Snapshot | None]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self._last_start = 0.0

    # -- lifecycle

    async def start(self) -> None:
        for node in self.config.nodes:
            channel = security.open_channel(node.address, self.identity, options=CLIENT_OPTIONS, aio=True)
            self._channels.append(channel)
            self._stubs[node.id] = pb_grpc.NodeStub(channel)
        self._timer = asyncio.create_task(self._expiry_loop(), name="snapshot-deadlines")

    def end_streams(self) -> None:
        """End every WatchSnapshots stream (before the server drains)."""
        for queue in self._watchers:
            queue.put_nowait(None)

    async def close(self) -> None:
        self.end_streams()
        tasks = [t for t in (self._timer, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._channels:
            await channel.close()

    # -- snapshots

    async def trigger(self, initiator: str) -> pb.Snapshot:
        """Start a snapshot at `initiator` (a node of the topology)."""
        # Ids sort in start order, even for two starts within one clock tick.
        now = max(self._clock(), self._last_start + 1e-6)
        self._last_start = now
        snapshot_id = new_snapshot_id(now, os.urandom(4))
        snapshot = self.tracker.start(snapshot_id, initiator, now)
        self._done[snapshot_id] = asyncio.get_running_loop().create_future()
        self.metrics.in_progress.set(self.tracker.in_progress)
        self._publish(snapshot)
        self._wake.set()
        self._spawn(self._start_at(initiator, snapshot_id))
        log.info("snapshot %s started at %s", snapshot_id, initiator)
        return snapshot

    async def wait_finished(self, snapshot_id: str) -> pb.Snapshot:
        future = self._done.get(snapshot_id)
        if future is None:
            return self.tracker.get(snapshot_id)
        return await asyncio.shield(future)

    async def _start_at(self, initiator: str, snapshot_id: str) -> None:
        try:
            await self._stubs[initiator].StartSnapshot(
                pb.StartSnapshotRequest(snapshot_id=snapshot_id), timeout=self.tracker.deadline_s
            )
        except grpc.aio.AioRpcError as error:
            reason = (
                f"initiator {initiator} unreachable: StartSnapshot failed with "
                f"{error.code().name}: {error.details()}"
            )
            failed = self.tracker.fail(snapshot_id, reason, self._clock())
            if failed is not None:
                await self._finished(failed)

    async def _expiry_loop(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.tracker.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self._clock())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            for snapshot in self.tracker.expire(self._clock()):
                await self._finished(snapshot)

    async def _finished(self, snapshot: pb.Snapshot) -> None:
        status = "complete" if snapshot.status == COMPLETE else "failed"
        self.metrics.snapshots.labels(status=status).inc()
        self.metrics.duration.observe(duration_s(snapshot))
        self.metrics.in_progress.set(self.tracker.in_progress)
        if snapshot.status == FAILED:
            log.warning("snapshot %s FAILED: %s", snapshot.snapshot_id, snapshot.reason)
            self._spawn(self._abort_everywhere(snapshot.snapshot_id, snapshot.reason))
        else:
            verdict = "conserved" if snapshot.conserved else f"NOT conserved ({snapshot.reason})"
            log.info(
                "snapshot %s COMPLETE in %.3fs: total %d, %s",
                snapshot.snapshot_id, duration_s(snapshot), snapshot.total, verdict,
            )
        try:
            await asyncio.to_thread(self.store.save, snapshot)
        except OSError as exc:
            log.error("cannot persist snapshot %s: %s", snapshot.snapshot_id, exc)
        self._publish(snapshot)
        future = self._done.pop(snapshot.snapshot_id, None)
        if future is not None and not future.done():
            future.set_result(snapshot)

    async def _abort_everywhere(self, snapshot_id: str, reason: str) -> None:
        request = pb.AbortSnapshotRequest(snapshot_id=snapshot_id, reason=reason)

        async def tell(node: str) -> None:
            try:
                await self._stubs[node].AbortSnapshot(request, timeout=ABORT_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                log.info("AbortSnapshot %s at %s: %s", snapshot_id, node, error.code().name)

        await asyncio.gather(*(tell(n) for n in self._nodes))

    def _publish(self, snapshot: pb.Snapshot) -> None:
        for queue in self._watchers:
            queue.put_nowait(snapshot)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def periodic(self, interval_s: float) -> None:
        """Trigger a snapshot at a random node every `interval_s` seconds."""
        while True:
            await asyncio.sleep(interval_s)
            await self.trigger(self._rng.choice(self._nodes))

    # -- RPCs

    async def TriggerSnapshot(self, request: pb.TriggerSnapshotRequest, context) -> pb.Snapshot:
        initiator = request.initiator or self._rng.choice(self._nodes)
        if initiator not in self._stubs:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown initiator {initiator!r} (nodes: {', '.join(self._nodes)})",
            )
        snapshot = await self.trigger(initiator)
        if not request.wait:
            return snapshot
        return await self.wait_finished(snapshot.snapshot_id)

    async def GetSnapshot(self, request: pb.GetSnapshotRequest, context) -> pb.Snapshot:
        if not request.snapshot_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id is empty")
        try:
            return self.tracker.get(request.snapshot_id)
        except UnknownSnapshot as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context) -> pb.ListSnapshotsResponse:
        return pb.ListSnapshotsResponse(snapshots=self.tracker.all())

    async def WatchSnapshots(self, request: pb.WatchSnapshotsRequest, context) -> AsyncIterator[pb.Snapshot]:
        queue: asyncio.Queue[pb.Snapshot | None] = asyncio.Queue()
        self._watchers.add(queue)
        try:
            while (snapshot := await queue.get()) is not None:
                yield snapshot
        finally:
            self._watchers.discard(queue)

    async def GetCluster(self, request: pb.GetClusterRequest, context) -> pb.Cluster:
        return pb.Cluster(
            nodes=[
                pb.NodeInfo(node_id=n.id, address=n.address, metrics_address=n.metrics_address)
                for n in self.config.nodes
            ],
            channels=[pb.ChannelId(src=s, dst=d) for s, d in self.tracker.topology.channels],
        )

    async def ReportState(self, request: pb.FullState, context) -> pb.ReportStateResponse:
        await security.require_peer(context, request.node_id)  # with TLS: a node reports only its own state
        try:
            snapshot = self.tracker.report(request, self._clock())
        except TrackerError as exc:
            await context.abort(_ERROR_CODES[type(exc)], str(exc))
        if snapshot.status == COMPLETE:
            await self._finished(snapshot)
        else:
            self._publish(snapshot)
        return pb.ReportStateResponse()
