"""The `snapmesh.v1.Node` gRPC service: a thin adapter over the engine.

Each RPC validates what the core cannot, makes one synchronous engine call,
then waits until the log holds what it did before answering: a response never
runs ahead of the disk.
"""

from __future__ import annotations

import logging

import grpc

from services.node.channels import AckWriter, read_or_end
from services.node.engine import Engine, GapError
from snapmesh import core, security
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_OK = grpc.StatusCode.OK.value[0]
# A response waits at most this long for room in a full outbox (flow control);
# after that it answers anyway, so a dead peer slows clients but never hangs them.
FLOW_CONTROL_WAIT_S = 2.0


class NodeServicer(pb_grpc.NodeServicer):
    def __init__(self, engine: Engine, known_nodes: frozenset[str]) -> None:
        self._engine = engine
        self._log = engine.log
        self._known = known_nodes
        self.stopping = False

    # -- transfers

    def _refusal_code(self, to: str, amount: int) -> grpc.StatusCode:
        """The core refused a transfer: which status says why."""
        if amount <= 0 or to not in self._engine.outgoing:
            return grpc.StatusCode.INVALID_ARGUMENT
        return grpc.StatusCode.FAILED_PRECONDITION

    def _refusal_detail(self, to: str, exc: core.LocalProtocolError) -> str:
        if to == self._engine.node_id:
            return f"{to} cannot transfer to itself"
        if to not in self._known:
            return f"unknown node {to!r}"
        return str(exc)

    async def Transfer(self, request: pb.TransferRequest, context: grpc.aio.ServicerContext) -> pb.TransferResponse:
        try:
            msg_id = self._engine.transfer(request.to, request.amount)
        except core.LocalProtocolError as exc:
            code = self._refusal_code(request.to, request.amount)
            self._engine.metrics.refused(code.name).inc()
            await context.abort(code, self._refusal_detail(request.to, exc))
        balance = self._engine.process.balance
        self._engine.transfers_done(1)
        await self._log.wait_durable(self._log.last_lsn)
        await self._engine.wait_for_room({request.to}, FLOW_CONTROL_WAIT_S)
        return pb.TransferResponse(msg_id=msg_id, balance=balance)

    async def TransferBatch(
        self, request: pb.TransferBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.TransferBatchResponse:
        response = pb.TransferBatchResponse()
        add = response.results.add
        engine = self._engine
        process = engine.process
        accepted = 0
        destinations: set[str] = set()
        for item in request.transfers:
            try:
                msg_id = engine.transfer(item.to, item.amount)
            except core.LocalProtocolError as exc:
                code = self._refusal_code(item.to, item.amount)
                engine.metrics.refused(code.name).inc()
                add(code=code.value[0], message=self._refusal_detail(item.to, exc), balance=process.balance)
                continue
            add(code=_OK, msg_id=msg_id, balance=process.balance)
            accepted += 1
            destinations.add(item.to)
        engine.transfers_done(accepted)
        await self._log.wait_durable(self._log.last_lsn)
        await engine.wait_for_room(destinations, FLOW_CONTROL_WAIT_S)
        return response

    async def GetState(self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext) -> pb.NodeStateResponse:
        balance = self._engine.process.balance
        await self._log.wait_durable(self._log.last_lsn)  # never show what a crash could take back
        return pb.NodeStateResponse(node_id=self._engine.node_id, balance=balance)

    # -- snapshots

    async def StartSnapshot(
        self, request: pb.StartSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartSnapshotResponse:
        if not request.snapshot_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id must not be empty")
        self._engine.start_snapshot(request.snapshot_id)
        await self._log.wait_durable(self._log.last_lsn)
        return pb.StartSnapshotResponse()

    async def AbortSnapshot(
        self, request: pb.AbortSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortSnapshotResponse:
        if not request.snapshot_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id must not be empty")
        self._engine.abort_snapshot(request.snapshot_id, request.reason)
        log.info("snapshot %s: aborted (%s)", request.snapshot_id, request.reason or "no reason given")
        await self._log.wait_durable(self._log.last_lsn)
        return pb.AbortSnapshotResponse()

    # -- the channel stream src -> this node

    async def Channel(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        engine = self._engine
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {engine.node_id} is stopping")
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("body") != "open":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first frame of a channel must be `open`")
        src, dst = first.open.src, first.open.dst
        if dst != engine.node_id or src not in engine.incoming:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"no channel {src!r}->{dst!r} into node {engine.node_id} (incoming: {', '.join(engine.incoming)})",
            )
        await security.require_peer(context, src)  # with TLS: only src's certificate may open src->here
        rx = engine.incoming[src]
        ending = rx.claim()
        acks = None
        try:
            # Resume point: the last seq applied here, once it is on disk.
            resume = rx.last_seq
            await self._log.wait_durable(self._log.last_lsn)
            await context.write(pb.ChannelAck(acked_seq=resume))
            acks = AckWriter(context, self._log)
            while True:
                frame = await read_or_end(context, ending)
                if frame is None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, ending.result())
                if frame is grpc.aio.EOF:
                    return
                if not rx.owned_by(ending):  # pragma: no cover  (ending is set whenever ownership moves)
                    return
                if frame.WhichOneof("body") != "batch":
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "only `batch` frames may follow `open`")
                try:
                    last = engine.receive_batch(src, frame.batch.messages)
                except GapError as exc:
                    engine.metrics.stream_errors(src, "receiver").inc()
                    log.error("%s; closing the stream (DATA_LOSS)", exc)
                    await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
                except core.RemoteProtocolError as exc:
                    engine.metrics.stream_errors(src, "receiver").inc()
                    log.error("channel %s->%s: the peer broke the protocol: %s; closing the stream", src, dst, exc)
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"protocol violation: {exc}")
                acks.post(last, self._log.last_lsn)
        finally:
            if acks is not None:
                await acks.close()
            rx.release(ending)
