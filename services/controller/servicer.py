"""The Controller gRPC service: a thin adapter around the tracker.

It feeds the tracker RPCs and the clock, re-arms one timer for the nearest
deadline, and carries out what follows a finished snapshot: update the metrics,
wake the waiters and watchers, hand it to the background file writer, and on
FAILED tell every node to drop what it recorded (best effort, in the background).

Durability before answers: every change to the tracker is followed, in the same
synchronous step, by its journal record; nothing that shows the change (an RPC
answer, a watcher update, StartSnapshot) goes out before that record is durable.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.controller import journal as J
from services.controller.restorer import Restorer, RestoreRefused
from services.controller.store import StoreWriter, past_retention
from services.controller.tracker import (
    COMPLETE,
    FAILED,
    DuplicateReport,
    InvalidReport,
    NotInProgress,
    Now,
    Tracker,
    TrackerError,
    UnknownSnapshot,
    duration_s,
    new_snapshot_id,
)
from snapmesh.protocol import chunking
from snapmesh.settings import security
from snapmesh.settings.config import ClusterConfig
from snapmesh.serving.runtime import CLIENT_OPTIONS
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
# Issue 26.7: the updates one WatchSnapshots watcher may have queued. A watcher
# that falls this far behind is dropped with RESOURCE_EXHAUSTED (it watches
# again and reads what it missed with ListSnapshots or GetSnapshot).
WATCH_QUEUE = 1_000

# What any gRPC client takes in one message by default (grpcurl's limit too): a
# ListSnapshots page ends before it, a larger GetSnapshot answer is refused
# saying how to fetch it. The margin leaves room for the framing.
CLIENT_DEFAULT_BYTES = 4 * 1024 * 1024
PAGE_BYTES = CLIENT_DEFAULT_BYTES - 64 * 1024
MAX_PAGE_SIZE = 1000
SNAPSHOT_CHUNK_BYTES = chunking.CHUNK_BYTES


class _FellBehind:
    """Put in a dropped watcher's queue in place of what it had not read."""


class TooManySnapshots(RuntimeError):
    """A trigger past the admission limit (issue 23): nothing was started or journaled."""


def system_now() -> Now:
    return Now(mono=time.monotonic(), wall=time.time())


class ControllerMetrics:
    """The controller's metrics (names and labels: docs/metrics.md). Durations in
    seconds; the per-node snapshot histograms carry a `node` label."""

    def __init__(self, registry: CollectorRegistry, nodes: Iterable[str] = ()) -> None:
        self.snapshots = Counter(
            "snapmesh_snapshots_total", "Finished snapshots by final status", ["status"], registry=registry
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
        # Flink's checkpoint statistics, one observation per node report (per COMPLETE snapshot below).
        seconds = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
        self.start_delay = Histogram(
            "snapmesh_snapshot_start_delay_seconds", "Per node: trigger to the node's local cut", ["node"],
            buckets=seconds, registry=registry,
        )
        self.recording = Histogram(
            "snapmesh_snapshot_recording_duration_seconds", "Per node: local cut to the last marker in", ["node"],
            buckets=seconds, registry=registry,
        )
        self.report_time = Histogram(
            "snapmesh_snapshot_report_time_seconds", "Per node: node done to the report accepted", ["node"],
            buckets=seconds, registry=registry,
        )
        counts = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
        self.node_in_flight = Histogram(
            "snapmesh_snapshot_node_in_flight_messages", "Per node: in-flight transfers recorded", ["node"],
            buckets=counts, registry=registry,
        )
        self.node_in_flight_bytes = Histogram(
            "snapmesh_snapshot_node_in_flight_bytes", "Per node: bytes of in-flight transfers recorded", ["node"],
            buckets=(0, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000), registry=registry,
        )
        self._per_node = (self.start_delay, self.recording, self.report_time, self.node_in_flight, self.node_in_flight_bytes)
        for node in nodes:  # every node's series exists from the start (0 observations)
            for histogram in self._per_node:
                histogram.labels(node)
        self.end_to_end = Histogram(
            "snapmesh_snapshot_end_to_end_duration_seconds", "Per COMPLETE snapshot: trigger to the last report",
            buckets=seconds, registry=registry,
        )
        self.state_size = Histogram(
            "snapmesh_snapshot_state_size_bytes", "Per COMPLETE snapshot: bytes of every report",
            buckets=(100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000), registry=registry,
        )
        self.stale_reports = Counter(
            "snapmesh_stale_epoch_reports_refused_total",
            "ReportState calls from an epoch before the last restore, refused",
            registry=registry,
        )
        self.last_complete = Gauge(
            "snapmesh_last_complete_snapshot_timestamp_seconds",
            "When the newest COMPLETE snapshot finished (Unix time; 0: none yet)",
            registry=registry,
        )
        self.epoch = Gauge("snapmesh_controller_epoch", "The controller's epoch (one more per restore)", registry=registry)
        self.restores = Counter(
            "snapmesh_restores_total", "Finished restores by outcome", ["status"], registry=registry
        )
        for status in ("restored", "failed"):
            self.restores.labels(status=status)
        self.refused_triggers = Counter(
            "snapmesh_snapshot_triggers_refused_total",
            "TriggerSnapshot calls (and periodic ticks) refused at the limit of snapshots in progress",
            registry=registry,
        )
        self._last_complete_s = 0.0

    def observe(self, snapshot: pb.Snapshot) -> None:
        """A COMPLETE snapshot's statistics (the per-node ones per report)."""
        stats = snapshot.stats
        for node in stats.nodes:
            self.start_delay.labels(node.node_id).observe(node.start_delay_ms / 1e3)
            self.recording.labels(node.node_id).observe(node.recording_duration_ms / 1e3)
            self.report_time.labels(node.node_id).observe(node.report_time_ms / 1e3)
            self.node_in_flight.labels(node.node_id).observe(node.in_flight_messages)
            self.node_in_flight_bytes.labels(node.node_id).observe(node.in_flight_bytes)
        self.end_to_end.observe(stats.end_to_end_duration_ms / 1e3)
        self.state_size.observe(stats.state_size_bytes)
        self.completed_at(snapshot)

    def completed_at(self, snapshot: pb.Snapshot) -> None:
        """Move the last-COMPLETE time forward to `snapshot`'s finish (never back)."""
        finished = snapshot.finished_at.ToNanoseconds() / 1e9
        if finished > self._last_complete_s:
            self._last_complete_s = finished
            self.last_complete.set(finished)

    def restored(self, restore: pb.Restore) -> None:
        self.restores.labels(status="restored" if restore.status == pb.Restore.RESTORED else "failed").inc()


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(
        self,
        *,
        config: ClusterConfig,
        tracker: Tracker,
        journal: J.Journal,
        writer: StoreWriter,
        metrics: ControllerMetrics,
        clock: Callable[[], Now] = system_now,
        rng: random.Random | None = None,
        identity: security.Identity | None = None,  # None: plaintext
        keep: int = 0,
        max_concurrent: int = 0,  # admission: at most this many snapshots in progress (0: no limit)
    ) -> None:
        self.identity = identity
        self.max_concurrent = max_concurrent
        self.config = config
        self.tracker = tracker
        self.journal = journal
        self.writer = writer
        self.metrics = metrics
        metrics.epoch.set_function(lambda: tracker.epoch)
        for snapshot in tracker.all():  # loaded from the files and the journal
            if snapshot.status == COMPLETE:
                metrics.completed_at(snapshot)
        self._clock = clock
        self._rng = rng or random.Random()
        self._nodes = list(tracker.topology.nodes)
        self._stubs: dict[str, pb_grpc.NodeStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._done: dict[str, asyncio.Future[pb.Snapshot]] = {}
        self._watchers: set[asyncio.Queue[pb.Snapshot | _FellBehind | None]] = set()
        self.watch_queue = WATCH_QUEUE
        self._background: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self._last_start = 0.0
        # Started or finished in the tracker, journal record not yet durable: not to be shown.
        self._unsettled: dict[str, asyncio.Future[None]] = {}
        self.restore_taken_back: pb.Restore | None = None  # the journal's newest restore, set before start()
        self.keep = keep  # retention: snapshot files kept (0: all)
        self._discarded: set[str] = set()
        self.restorer: Restorer | None = None
        self._chunk_budget = chunking.ChunkBudget()  # ReportStateChunks' bytes in flight (issue 26.5)

    # -- lifecycle

    async def start(self) -> None:
        for node in self.config.nodes:
            channel = security.open_channel(node.address, self.identity, options=CLIENT_OPTIONS, aio=True)
            self._channels.append(channel)
            self._stubs[node.id] = pb_grpc.NodeStub(channel)
        self._timer = asyncio.create_task(self._expiry_loop(), name="snapshot-deadlines")
        self.restorer = Restorer(
            tracker=self.tracker, journal=self.journal, stubs=self._stubs, fail_in_progress=self._fail_in_progress,
            on_finished=self.metrics.restored,
            lookup=self.lookup,
        )
        self.restorer.taken_back(self.restore_taken_back)

    async def mode_mismatch(self, retry_s: float = 0.5) -> str:
        """Ask every node its snapshot_mode (GetState, retried until it answers);
        return the first disagreement with the controller's, in words. Never
        returns while every node agrees (a mixed cluster is refused, not run)."""
        mine = self.config.snapshot_mode
        waiting = set(self._stubs)
        while waiting:
            for node in sorted(waiting):
                try:
                    state = await self._stubs[node].GetState(pb.GetStateRequest(), timeout=2)
                except grpc.aio.AioRpcError:
                    continue
                waiting.discard(node)
                theirs = state.snapshot_mode or "classic"
                if theirs != mine:
                    return (
                        f"{self.config.path}: snapshot_mode: the controller runs {mine!r} but node {node!r} runs "
                        f"{theirs!r}; every process must read the same snapshot_mode"
                    )
            if waiting:
                await asyncio.sleep(retry_s)
        await asyncio.Event().wait()  # all agree: nothing to report, ever
        return ""

    def end_streams(self) -> None:
        """End every WatchSnapshots stream (before the server drains)."""
        for queue in self._watchers:
            try:
                queue.put_nowait(None)
            except asyncio.QueueFull:
                _replace_all(queue, None)

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
        """Start a snapshot at `initiator` (a node of the topology): journaled
        before StartSnapshot leaves and before this returns. Raises
        TooManySnapshots, changing nothing, at the admission limit."""
        self._admit()
        now = self._clock()
        # Ids sort in start order, even for two starts within one clock tick.
        wall = max(now.wall, self._last_start + 1e-6)
        self._last_start = wall
        snapshot_id = new_snapshot_id(wall, os.urandom(4))
        snapshot = self.tracker.start(snapshot_id, initiator, Now(mono=now.mono, wall=wall))
        self._done[snapshot_id] = asyncio.get_running_loop().create_future()
        durable = self.journal.append(
            J.Started(snapshot_id=snapshot_id, initiator=initiator, wall=wall, epoch=snapshot.epoch)
        )
        self.metrics.in_progress.set(self.tracker.in_progress)
        self._wake.set()
        try:
            await self._settle(snapshot_id, durable)
        except OSError as exc:
            failed = self.tracker.fail(snapshot_id, f"cannot journal the start: {exc}", self._clock())
            if failed is not None:
                self._spawn(self._after_finish(failed, self._record_finish(failed)))
            raise
        self._publish(snapshot)
        self._spawn(self._start_at(initiator, snapshot_id))
        log.info("snapshot %s started at %s", snapshot_id, initiator)
        return snapshot

    def _admit(self) -> None:
        """Flink's max-concurrent-checkpoints: a snapshot starts only while fewer
        than `max_concurrent` are in progress, so a trigger rate the cluster cannot
        follow is answered at once instead of piling up markers and reports."""
        running = self.tracker.in_progress
        if self.max_concurrent and running >= self.max_concurrent:
            self.metrics.refused_triggers.inc()
            raise TooManySnapshots(
                f"{running} snapshots in progress, the limit is {self.max_concurrent} "
                f"(controller.max_concurrent_snapshots in {self.config.path}, or snapmesh controller "
                f"--max-concurrent-snapshots N); retry once one finishes"
            )

    async def wait_finished(self, snapshot_id: str) -> pb.Snapshot:
        future = self._done.get(snapshot_id)
        if future is None:
            await self._shown([snapshot_id])
            return self.lookup(snapshot_id)
        return await asyncio.shield(future)

    def lookup(self, snapshot_id: str) -> pb.Snapshot:
        """The snapshot from the tracker's working set, else from the store
        (issue 26.7); UnknownSnapshot when neither has it."""
        try:
            return self.tracker.get(snapshot_id)
        except UnknownSnapshot:
            snapshot = self.writer.store.load(snapshot_id)
            if snapshot is None:
                raise
            return snapshot

    async def _start_at(self, initiator: str, snapshot_id: str) -> None:
        try:
            await self._stubs[initiator].StartSnapshot(
                pb.StartSnapshotRequest(snapshot_id=snapshot_id, epoch=self.tracker.epoch),
                timeout=self.tracker.deadline_s,
            )
        except grpc.aio.AioRpcError as error:
            reason = (
                f"initiator {initiator} unreachable: StartSnapshot failed with "
                f"{error.code().name}: {error.details()}"
            )
            failed = self.tracker.fail(snapshot_id, reason, self._clock())
            if failed is not None:
                await self._after_finish(failed, self._record_finish(failed))

    async def _expiry_loop(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.tracker.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self._clock().mono)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            expired = self.tracker.expire(self._clock())
            pending = [(s, self._record_finish(s)) for s in expired]  # journaled in the same step
            for snapshot, durable in pending:
                await self._after_finish(snapshot, durable)

    def _record_finish(self, snapshot: pb.Snapshot) -> asyncio.Future[None]:
        """Journal a snapshot the tracker just finished (call with no await in between)."""
        wall = snapshot.finished_at.ToNanoseconds() / 1e9
        record = J.Finished(snapshot_id=snapshot.snapshot_id, status=snapshot.status, reason=snapshot.reason, wall=wall)
        durable = self.journal.append(record)
        self._unsettled[snapshot.snapshot_id] = durable
        return durable

    async def _settle(self, snapshot_id: str, durable: asyncio.Future[None]) -> None:
        self._unsettled[snapshot_id] = durable
        try:
            await asyncio.shield(durable)
        finally:
            if self._unsettled.get(snapshot_id) is durable:
                del self._unsettled[snapshot_id]

    async def _shown(self, snapshot_ids) -> None:
        """Wait until these snapshots' latest journal records are durable."""
        waits = [self._unsettled[s] for s in snapshot_ids if s in self._unsettled]
        if waits:
            await asyncio.gather(*(asyncio.shield(w) for w in waits), return_exceptions=True)

    async def _after_finish(self, snapshot: pb.Snapshot, durable: asyncio.Future[None]) -> None:
        try:
            await self._settle(snapshot.snapshot_id, durable)
        except OSError as exc:  # the journal is broken: the outcome may not survive a crash
            log.error("snapshot %s: cannot journal its outcome: %s", snapshot.snapshot_id, exc)
        status = "complete" if snapshot.status == COMPLETE else "failed"
        self.metrics.snapshots.labels(status=status).inc()
        self.metrics.duration.observe(duration_s(snapshot))
        self.metrics.in_progress.set(self.tracker.in_progress)
        if snapshot.status == COMPLETE:
            self.metrics.observe(snapshot)
        if snapshot.status == FAILED:
            log.warning("snapshot %s FAILED: %s", snapshot.snapshot_id, snapshot.reason)
            self._spawn(self._abort_everywhere(snapshot.snapshot_id, snapshot.reason))
        else:
            verdict = "conserved" if snapshot.conserved else f"NOT conserved ({snapshot.reason})"
            log.info(
                "snapshot %s COMPLETE in %.3fs: total %d, %s",
                snapshot.snapshot_id, duration_s(snapshot), snapshot.total, verdict,
            )
        self.writer.submit(snapshot)  # the files, off the reply path
        if snapshot.status == COMPLETE and self.keep:
            self._apply_retention()
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

    def _apply_retention(self) -> None:
        """`--keep N`: a newer snapshot is COMPLETE, so the files of those past
        the N newest COMPLETE ones go (never the one last restored)."""
        protect = self.restorer.last.snapshot_id if self.restorer is not None and self.restorer.last else ""
        for sid in past_retention(self.tracker.finished(), self.keep, protect):  # no copies (issue 23)
            if sid not in self._discarded:
                self._discarded.add(sid)
                self.writer.discard(sid)

    def _fail_in_progress(self, reason: str) -> None:
        """A restore began: every snapshot in progress fails with `reason`."""
        now = self._clock()
        for sid in self.tracker.pending_ids():
            failed = self.tracker.fail(sid, reason, now)
            if failed is not None:
                self._spawn(self._after_finish(failed, self._record_finish(failed)))

    async def RestoreSnapshot(self, request: pb.RestoreSnapshotRequest, context) -> pb.Restore:
        if not request.snapshot_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id is empty")
        assert self.restorer is not None, "start() first"
        damaged = await self._damage(request.snapshot_id)
        if damaged:
            await context.abort(
                grpc.StatusCode.DATA_LOSS,
                f"snapshot {request.snapshot_id} is damaged on disk, not restored (nothing changed): {damaged}",
            )
        try:
            return await self.restorer.restore(request.snapshot_id, request.request_id)
        except UnknownSnapshot as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except RestoreRefused as exc:
            await context.abort(exc.code, str(exc))
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot journal the restore: {exc}")

    async def _damage(self, snapshot_id: str) -> str:
        """Why the stored files of `snapshot_id` are damaged ("" when intact or
        not written yet): found so at start-up, or checked now (off the loop)."""
        store = self.writer.store
        if snapshot_id in store.damaged:
            return store.damaged[snapshot_id]
        return await asyncio.to_thread(store.damage, snapshot_id)

    def _publish(self, snapshot: pb.Snapshot) -> None:
        for queue in list(self._watchers):
            try:
                queue.put_nowait(snapshot)
            except asyncio.QueueFull:
                self._watchers.discard(queue)
                log.warning("a WatchSnapshots watcher fell %d updates behind: dropped", self.watch_queue)
                _replace_all(queue, _FellBehind())

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def periodic(self, interval_s: float) -> None:
        """Trigger a snapshot at a random node every `interval_s` seconds."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.trigger(self._rng.choice(self._nodes))
            except TooManySnapshots as exc:  # this tick is skipped; the next one tries again
                log.warning("periodic snapshot skipped: %s", exc)

    # -- RPCs

    async def TriggerSnapshot(self, request: pb.TriggerSnapshotRequest, context) -> pb.Snapshot:
        initiator = request.initiator or self._rng.choice(self._nodes)
        if initiator not in self._stubs:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown initiator {initiator!r} (nodes: {', '.join(self._nodes)})",
            )
        try:
            snapshot = await self.trigger(initiator)
        except TooManySnapshots as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot journal the snapshot: {exc}")
        if not request.wait:
            return snapshot
        return await self.wait_finished(snapshot.snapshot_id)

    async def _snapshot(self, request: pb.GetSnapshotRequest, context) -> pb.Snapshot:
        if not request.snapshot_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id is empty")
        if request.max_bytes < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"max_bytes must not be negative, got {request.max_bytes}")
        await self._shown([request.snapshot_id])
        try:
            return self.lookup(request.snapshot_id)
        except UnknownSnapshot as exc:
            if request.snapshot_id in self.writer.store.damaged:
                await context.abort(
                    grpc.StatusCode.DATA_LOSS,
                    f"snapshot {request.snapshot_id} is damaged on disk: {self.writer.store.damaged[request.snapshot_id]}",
                )
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

    async def GetSnapshot(self, request: pb.GetSnapshotRequest, context) -> pb.Snapshot:
        snapshot = await self._snapshot(request, context)
        limit = request.max_bytes or CLIENT_DEFAULT_BYTES
        if (size := snapshot.ByteSize()) > limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"snapshot {request.snapshot_id} is {size} bytes, more than the {limit} this client takes "
                f"(max_bytes; 0 means gRPC's default 4 MiB): fetch it in pieces with GetSnapshotChunks "
                f"(`snapmesh snapshot get {request.snapshot_id}` does), or set max_bytes to {size} "
                f"with a client whose receive limit is that high",
            )
        return snapshot

    async def GetSnapshotChunks(self, request: pb.GetSnapshotRequest, context) -> AsyncIterator[pb.SnapshotChunk]:
        snapshot = await self._snapshot(request, context)
        data = snapshot.SerializeToString()
        for i in range(0, max(len(data), 1), SNAPSHOT_CHUNK_BYTES):
            yield pb.SnapshotChunk(data=data[i : i + SNAPSHOT_CHUNK_BYTES])

    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context) -> pb.ListSnapshotsResponse:
        if request.page_size < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"page_size must not be negative, got {request.page_size}")
        if request.status not in pb.Snapshot.Status.values():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"status {request.status} is not a Snapshot.Status")
        after = ""
        if request.page_token:
            after = _page_after(request.page_token, request.status)
            if after is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"page_token {request.page_token!r} is not a next_page_token of a ListSnapshots with the "
                    f"same status filter",
                )
        await self._shown(list(self._unsettled))
        # page_size 0: as many as fit under PAGE_BYTES (every snapshot, for most clusters).
        limit = min(request.page_size, MAX_PAGE_SIZE) if request.page_size else None
        page = pb.ListSnapshotsResponse()
        size = 0
        # the tracker's working set and the snapshots that left it for the store only
        in_memory = set(self.tracker.ids())
        ids = sorted(in_memory.union(self.writer.store.filed_ids()))
        start = _bisect_after(ids, after)
        for i in range(start, len(ids)):
            sid = ids[i]
            if sid in in_memory:
                if request.status and self.tracker.status(sid) != request.status:
                    continue
                snapshot = None
            elif (snapshot := self.writer.store.load(sid)) is None or (
                request.status and snapshot.status != request.status
            ):
                continue
            if limit is not None and len(page.snapshots) >= limit:
                page.next_page_token = _page_token(page.snapshots[-1].snapshot_id, request.status)
                break
            if snapshot is None:
                snapshot = self.tracker.get(sid)
            if (own := snapshot.ByteSize() + 8) > PAGE_BYTES:  # alone larger than a page: without its in-flight lists
                for channel in snapshot.channels:
                    del channel.in_flight[:]
                snapshot.in_flight_omitted = True
                own = snapshot.ByteSize() + 8
            size += own
            if page.snapshots and size > PAGE_BYTES:
                page.next_page_token = _page_token(page.snapshots[-1].snapshot_id, request.status)
                break
            page.snapshots.append(snapshot)
        return page

    async def WatchSnapshots(self, request: pb.WatchSnapshotsRequest, context) -> AsyncIterator[pb.Snapshot]:
        queue: asyncio.Queue[pb.Snapshot | _FellBehind | None] = asyncio.Queue(maxsize=self.watch_queue)
        self._watchers.add(queue)
        try:
            while (snapshot := await queue.get()) is not None:
                if isinstance(snapshot, _FellBehind):
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"this watcher fell {self.watch_queue} updates behind and was dropped; watch again "
                        "(ListSnapshots or GetSnapshot has what it missed)",
                    )
                yield snapshot
        finally:
            self._watchers.discard(queue)

    async def GetCluster(self, request: pb.GetClusterRequest, context) -> pb.Cluster:
        last = self.restorer.last if self.restorer is not None else None
        return pb.Cluster(
            nodes=[
                pb.NodeInfo(node_id=n.id, address=n.address, metrics_address=n.metrics_address)
                for n in self.config.nodes
            ],
            channels=[pb.ChannelId(src=s, dst=d) for s, d in self.tracker.topology.channels],
            last_restore=last,  # the snapshot page's "last restore" (issue 24)
        )

    async def ReportState(self, request: pb.FullState, context) -> pb.ReportStateResponse:
        if request.epoch and request.epoch < self.tracker.epoch:
            self.metrics.stale_reports.inc()
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"a report from epoch {request.epoch}; the cluster is in epoch {self.tracker.epoch}",
            )
        await security.require_peer(context, request.node_id)  # with TLS: a node reports only its own state
        now = self._clock()
        try:
            snapshot, duplicate = self.tracker.report(request, now)
        except TrackerError as exc:
            await context.abort(_ERROR_CODES[type(exc)], str(exc))
        if duplicate:  # the first copy may still be on its way to the disk
            durable = self.journal.barrier()
        else:
            durable = self.journal.append(J.Reported(state=request, wall=now.wall))
            if snapshot.status == COMPLETE:  # its outcome goes in the same group commit
                await self._after_finish(snapshot, self._record_finish(snapshot))
        try:
            await asyncio.shield(durable)
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot journal the report: {exc}")
        if not duplicate and snapshot.status != COMPLETE:
            self._publish(snapshot)
        return pb.ReportStateResponse()

    async def ReportStateChunks(self, request_iterator, context) -> pb.ReportStateResponse:
        """A FullState too large for one message, in pieces (snapmesh.protocol.chunking):
        reassembled, it takes the ReportState path. Issue 26.5: with TLS only a
        node's certificate may send one (checked before any chunk is read); the
        bytes held are bounded per peer and in all, and a chunk past a bound
        ends the stream at once (RESOURCE_EXHAUSTED)."""
        names = security.peer_names(context)
        if names is None:
            peer = context.peer().rsplit(":", 1)[0]  # plaintext: the address, without the port
        else:
            nodes = sorted(names & set(self._nodes))
            if not nodes:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the peer's certificate names {', '.join(sorted(names)) or 'nothing'}, not a node",
                )
            peer = nodes[0]
        assembler = chunking.StateAssembler()
        held = 0
        try:
            async for chunk in request_iterator:
                size = len(chunk.data)
                self._chunk_budget.take(peer, size)
                held += size
                assembler.add(chunk)
            state = assembler.finish()
        except (chunking.StateTooLarge, chunking.Busy) as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except chunking.BadChunks as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            self._chunk_budget.give_back(peer, held)
        del assembler
        return await self.ReportState(state, context)


def _page_token(last_id: str, status: int) -> str:
    """Opaque to clients: where the next page starts, and the filter it was for."""
    raw = json.dumps({"after": last_id, "status": status}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _page_after(token: str, status: int) -> str | None:
    """The id a page token says to continue after; None for a token this
    controller did not give for this filter."""
    try:
        fields = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (ValueError, UnicodeError):
        return None
    if not isinstance(fields, dict) or fields.get("status") != status or not isinstance(fields.get("after"), str):
        return None
    return fields["after"] or None


def _bisect_after(ids: list[str], after: str) -> int:
    return bisect.bisect_right(ids, after) if after else 0


def _replace_all(queue: asyncio.Queue, item) -> None:
    """Empty `queue` and put `item` in it (it always fits then)."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(item)
