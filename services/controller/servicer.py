"""The Controller gRPC service: RPCs in, the engine's calls out (services/controller/engine.py).

Requests are checked and turned into the engine's events; the machine's error
kinds become status codes here (NOT_FOUND, INVALID_ARGUMENT, ALREADY_EXISTS,
FAILED_PRECONDITION), and the answers are paged and sized for gRPC clients.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
from collections.abc import AsyncIterator

import grpc

from snapmesh.services.controller.engine import ControllerEngine, FellBehind, TooManySnapshots
from snapmesh.services.controller.restorer import RestoreRefused
from snapmesh.protocol import chunking
from snapmesh.protocol.controller.machine import StaleReport
from snapmesh.protocol.controller.snapshot_ids import snapshot_id_problem
from snapmesh.protocol.controller.tracker import (
    DuplicateReport,
    InvalidReport,
    NotInProgress,
    TrackerError,
    UnknownSnapshot,
)
from snapmesh.settings import config as cluster_config
from snapmesh.serving import credentials
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

_ERROR_CODES: dict[type[TrackerError], grpc.StatusCode] = {
    UnknownSnapshot: grpc.StatusCode.NOT_FOUND,
    InvalidReport: grpc.StatusCode.INVALID_ARGUMENT,
    DuplicateReport: grpc.StatusCode.ALREADY_EXISTS,
    NotInProgress: grpc.StatusCode.FAILED_PRECONDITION,
    StaleReport: grpc.StatusCode.FAILED_PRECONDITION,
}

# What any gRPC client takes in one message by default (grpcurl's limit too): a
# ListSnapshots page ends before it, a larger GetSnapshot answer is refused
# saying how to fetch it. The margin leaves room for the framing.
CLIENT_DEFAULT_BYTES = 4 * 1024 * 1024
PAGE_BYTES = CLIENT_DEFAULT_BYTES - 64 * 1024
MAX_PAGE_SIZE = 1000
SNAPSHOT_CHUNK_BYTES = chunking.CHUNK_BYTES
LOAD_BATCH = 256  # filed snapshots read per trip off the event loop, for a page without a page_size


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, engine: ControllerEngine) -> None:
        self.engine = engine
        self._chunk_budget = chunking.ChunkBudget()  # ReportStateChunks' bytes in flight, per peer and in all
        self.interval_s = 0.0  # periodic snapshots (main sets it): GetCluster tells clients

    async def mode_mismatch(self, retry_s: float = 0.5) -> str:
        """Ask every node its snapshot_mode and its app (GetState, retried until it
        answers); return the first disagreement with the controller's, in words.
        Never returns while every node agrees (a mixed cluster is refused, not run)."""
        config = self.engine.config
        mine = config.snapshot_mode
        my_app = "" if cluster_config.runs_bank(config.app) else config.app.module
        waiting = set(self.engine.stubs)
        while waiting:
            for node in sorted(waiting):
                try:
                    state = await self.engine.stubs[node].GetState(pb.GetStateRequest(), timeout=2)
                except grpc.aio.AioRpcError:
                    continue
                waiting.discard(node)
                theirs = state.snapshot_mode or "classic"
                if theirs != mine:
                    return (
                        f"{config.path}: snapshot_mode: the controller runs {mine!r} but node {node!r} runs "
                        f"{theirs!r}; every process must read the same snapshot_mode"
                    )
                if state.app != my_app:
                    return (
                        f"{config.path}: [app]: the controller runs {cluster_config.app_named(my_app)} but node "
                        f"{node!r} runs {cluster_config.app_named(state.app)}; every process must run the same app"
                    )
            if waiting:
                await asyncio.sleep(retry_s)
        await asyncio.Event().wait()  # all agree: nothing to report, ever
        return ""

    async def RestoreSnapshot(self, request: pb.RestoreSnapshotRequest, context) -> pb.Restore:
        await _check_id(request.snapshot_id, context)
        damaged = await self._damage(request.snapshot_id)
        if damaged:
            await context.abort(
                grpc.StatusCode.DATA_LOSS,
                f"snapshot {request.snapshot_id} is damaged on disk, not restored (nothing changed): {damaged}",
            )
        try:
            return await self.engine.restore(request.snapshot_id, request.request_id)
        except UnknownSnapshot as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except RestoreRefused as exc:
            await context.abort(exc.code, str(exc))
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot journal the restore: {exc}")

    async def _damage(self, snapshot_id: str) -> str:
        """Why the stored files of `snapshot_id` are damaged ("" when intact or
        not written yet): found so at start-up, or checked now (off the loop)."""
        store = self.engine.writer.store
        if snapshot_id in store.damaged:
            return store.damaged[snapshot_id]
        return await asyncio.to_thread(store.damage, snapshot_id)

    # -- RPCs

    async def TriggerSnapshot(self, request: pb.TriggerSnapshotRequest, context) -> pb.Snapshot:
        nodes = self.engine.nodes
        initiator = request.initiator or self.engine.rng.choice(nodes)
        if initiator not in nodes:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown initiator {initiator!r} (nodes: {', '.join(nodes)})",
            )
        try:
            snapshot = await self.engine.trigger(initiator, broadcast=request.broadcast)
        except TooManySnapshots as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot journal the snapshot: {exc}")
        if not request.wait:
            return snapshot
        return await self.engine.wait_finished(snapshot.snapshot_id)

    async def _snapshot(self, request: pb.GetSnapshotRequest, context) -> pb.Snapshot:
        await _check_id(request.snapshot_id, context)
        if request.max_bytes < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"max_bytes must not be negative, got {request.max_bytes}")
        try:
            snapshot = self.engine.lookup(request.snapshot_id)
        except UnknownSnapshot as exc:
            damaged = self.engine.writer.store.damaged
            if request.snapshot_id in damaged:
                why = damaged[request.snapshot_id]
                await context.abort(grpc.StatusCode.DATA_LOSS, f"snapshot {request.snapshot_id} is damaged on disk: {why}")
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        await self.engine.durable()  # what was read is what the journal holds
        return snapshot

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
        # page_size 0: as many as fit under PAGE_BYTES (every snapshot, for most clusters).
        limit = min(request.page_size, MAX_PAGE_SIZE) if request.page_size else None
        page = pb.ListSnapshotsResponse()
        size = 0
        async for snapshot in self._listed(after, request.status, (limit or LOAD_BATCH - 1) + 1):
            if limit is not None and len(page.snapshots) >= limit:
                page.next_page_token = _page_token(page.snapshots[-1].snapshot_id, request.status)
                break
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
        await self.engine.durable()  # what was read is what the journal holds
        return page

    async def _listed(self, after: str, status: int, batch: int) -> AsyncIterator[pb.Snapshot]:
        """The snapshots after the id `after` with `status` (0: any), in id order:
        the tracker's working set, and the store's index for those that left it.
        No file is read but the ones listed, `batch` at a time, off the event loop."""
        store, machine = self.engine.writer.store, self.engine.machine
        in_memory = [sid for sid in machine.ids() if sid > after]
        if status:
            in_memory = [sid for sid in in_memory if machine.status(sid) == status]
        held = set(in_memory)
        cursor = after
        while True:
            filed = store.index.after(cursor, status, batch)
            bound = filed[-1] if len(filed) == batch else None  # None: the index has no more
            taken = bisect.bisect_right(in_memory, bound) if bound is not None else len(in_memory)
            ids = sorted(set(filed).union(in_memory[:taken]))
            del in_memory[:taken]
            if not ids:
                return
            loaded = await asyncio.to_thread(_load_each, store, [sid for sid in ids if sid not in held])
            for sid in ids:
                snapshot = self._held(sid) if sid in held else loaded[sid]
                if snapshot is None and sid in held:  # it left the working set meanwhile
                    snapshot = await asyncio.to_thread(store.load, sid)
                if snapshot is not None and (not status or snapshot.status == status):
                    yield snapshot
            cursor = ids[-1]
            if bound is None and not in_memory:
                return

    def _held(self, snapshot_id: str) -> pb.Snapshot | None:
        try:
            return self.engine.machine.get(snapshot_id)
        except UnknownSnapshot:
            return None

    async def WatchSnapshots(self, request: pb.WatchSnapshotsRequest, context) -> AsyncIterator[pb.Snapshot]:
        watch_queue = self.engine.watch_queue
        queue: asyncio.Queue[pb.Snapshot | FellBehind | None] = asyncio.Queue(maxsize=watch_queue)
        self.engine.watchers.add(queue)
        try:
            while (snapshot := await queue.get()) is not None:
                if isinstance(snapshot, FellBehind):
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"this watcher fell {watch_queue} updates behind and was dropped; watch again "
                        "(ListSnapshots or GetSnapshot has what it missed)",
                    )
                yield snapshot
        finally:
            self.engine.watchers.discard(queue)

    async def GetCluster(self, request: pb.GetClusterRequest, context) -> pb.Cluster:
        engine = self.engine
        return pb.Cluster(
            nodes=[
                pb.NodeInfo(node_id=n.id, address=n.address, metrics_address=n.metrics_address)
                for n in engine.config.nodes
            ],
            channels=[pb.ChannelId(src=s, dst=d) for s, d in engine.topology.channels],
            last_restore=engine.machine.last_restore,  # the snapshot page's "last restore"
            settings=pb.SnapshotSettings(
                snapshot_mode=engine.snapshot_mode,
                deadline_s=engine.deadline_s,
                interval_s=self.interval_s,
                keep=engine.machine.keep,
                max_concurrent_snapshots=engine.machine.max_concurrent,
            ),
            epoch=engine.machine.epoch,
        )

    async def ReportState(self, request: pb.FullState, context) -> pb.ReportStateResponse:
        await credentials.require_peer(context, request.node_id)  # with TLS: a node reports only its own state
        await _check_id(request.snapshot_id, context)
        try:
            await self.engine.report(request)
        except TrackerError as exc:
            if isinstance(exc, StaleReport):
                self.engine.metrics.stale_reports.inc()
            await context.abort(_ERROR_CODES[type(exc)], str(exc))
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot journal the report: {exc}")
        return pb.ReportStateResponse()

    async def ReportStateChunks(self, request_iterator, context) -> pb.ReportStateResponse:
        """A FullState too large for one message, in pieces (snapmesh.protocol.chunking):
        reassembled, it takes the ReportState path. With TLS only a
        node's certificate may send one (checked before any chunk is read); the
        bytes held are bounded per peer and in all, and a chunk past a bound
        ends the stream at once (RESOURCE_EXHAUSTED)."""
        names = credentials.peer_names(context)
        if names is None:
            peer = context.peer().rsplit(":", 1)[0]  # plaintext: the address, without the port
        else:
            nodes = sorted(names & set(self.engine.nodes))
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


async def _check_id(snapshot_id: str, context) -> None:
    """INVALID_ARGUMENT, before anything is looked up, for a text that is not a
    snapshot id: only ids the tracker makes ever name a file in the store."""
    if problem := snapshot_id_problem(snapshot_id):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)


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


def _load_each(store, snapshot_ids: list[str]) -> dict[str, pb.Snapshot | None]:
    return {sid: store.load(sid) for sid in snapshot_ids}
