"""The `snapmesh.v1.Node` gRPC service: a thin adapter over the engine.

Each RPC validates what the core cannot, decodes protobuf into the core's own
messages (the engine never sees protobuf), makes one synchronous engine call,
then waits until the log holds what it did before answering: a response never
runs ahead of the disk. A client's answer is the node machine's `Reply` (node
rule N11): this module only turns it into a response. Why the core refused a
command maps to a status code in one table, `REFUSAL_STATUS` (edge.py's
`REFUSAL_CODE`); the node's epoch fence (EpochFenced) to FAILED_PRECONDITION
(stale) or UNAVAILABLE. An app's commands (Submit, SubmitBatch) are calls of
the node's `Edge` (edge.py), which an embedding program calls alike: this
module turns its `Refused` into the status it names. The RPCs an app answers
itself (v1 Transfer, TransferBatch, GetState) go to the extra edge its App
names (extra_edge.py), loaded by name: this module knows no app.

Who may call what is snapmesh.settings.access, checked before a handler runs:
StartSnapshot, AbortSnapshot and RestoreState answer only the controller's
certificate (AUTH2: a restore's state and in-flight messages are the snapshot's
the controller names, never a caller's); a Channel stream only its `src`'s (AUTH3,
checked here, as the request names it).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Iterable, Iterator, Sequence

import grpc

from snapmesh.app import Refused as AppRefused
from snapmesh.services.node.channels import AckWriter, read_or_end
from snapmesh.services.node import extra_edge
from snapmesh.services.node.edge import (  # noqa: F401  (MAX_COMMAND_BYTES: the limit is named from here too)
    MAX_COMMAND_BYTES, REFUSAL_CODE, Edge,
)
from snapmesh.services.node.engine import AppMessage, Engine
from snapmesh.services.node.extra_edge import MAX_BATCH  # noqa: F401  (the limit is named from here too)
from snapmesh.services.node.blockshelf import shelf_dir
from snapmesh.services.node.heldblocks import HeldBlocks, MissingRestoreBlocks
from snapmesh.services.node.frames import check_payload_runs, payloads, run_payloads
from snapmesh.services.node.translog import LogClosedError
from snapmesh.protocol import carriedblocks, chunking
from snapmesh.protocol.node import core
from snapmesh.protocol.node.link import GapError
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.node.epochs import EpochFenced
from snapmesh.protocol.node.fence import FenceRefused
from snapmesh.protocol.node.effects import Reply, ReplyBatch, RestoreReply
from snapmesh.serving import credentials
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_OK = grpc.StatusCode.OK.value[0]

# Why the core refused a client's request -> the status the client gets (the edge's table, as gRPC codes).
REFUSAL_STATUS: dict[core.Refusal, grpc.StatusCode] = {kind: grpc.StatusCode[name] for kind, name in REFUSAL_CODE.items()}


class NodeServicer(pb_grpc.NodeServicer):
    def __init__(self, engine: Engine, edge: Edge | None = None) -> None:
        self._engine = engine
        self._edge = edge or Edge(engine)  # the node process's, which an app's own service shares
        # The RPCs its app answers itself (extra_edge.py: v1 calls), loaded by the name
        # its App gives; None: the node answers them as X2 says. Raises AppError (X1).
        self._extra = extra_edge.load(engine.node.host.app, engine, self._edge)
        self._log = engine.log
        # what a restore as blocks is rebuilt from: in memory, and on disk beside the node's log (blockshelf.py)
        self._held = HeldBlocks(engine.reporter.blocks, shelf_dir(getattr(engine.log, "path", None), engine.node_id),
                                linked_from=getattr(engine.reporter, "pending_blocks", None))
        self.stopping = False
        # Acks say the channel streams into this node may carry an app's payloads in packed
        # runs; False acks as a receiver from before them did (its senders send one message each).
        self.accepts_payload_runs = True

    async def close(self) -> None:
        """The node stops (embedded.py): the held blocks' pending writes finish and their thread ends."""
        await self._held.aclose()

    async def _durable(self, lsn: int, context: grpc.aio.ServicerContext) -> None:
        """Wait until the log holds `lsn`. A log that failed or closed will never
        hold it: the client is told UNAVAILABLE (retry elsewhere or later), and
        nothing it asked for is shown as done."""
        try:
            await self._log.wait_durable(lsn)
        except LogClosedError as exc:  # LogFailedError too
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {self._engine.node_id} is stopping: {exc}")

    async def _replied(
        self, waiting: asyncio.Future, context: grpc.aio.ServicerContext
    ) -> Reply | ReplyBatch | RestoreReply:
        """The node's answer to a call, once durable. A log that failed or closed
        will never make it so: the client is told UNAVAILABLE (retry elsewhere
        or later), and nothing it asked for is shown as done."""
        try:
            return await self._engine.replied(waiting)
        except LogClosedError as exc:  # LogFailedError too
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {self._engine.node_id} is stopping: {exc}")
            raise  # pragma: no cover  (abort raises)

    # -- transfers

    async def Transfer(self, request: pb.TransferRequest, context: grpc.aio.ServicerContext) -> pb.TransferResponse:
        await self._unfenced("Transfer", context)
        answer = getattr(self._extra, "Transfer", None)
        if answer is None:
            await extra_edge.refuse_one(self._engine, context)
        return await answer(request, context)

    async def TransferBatch(
        self, request: pb.TransferBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.TransferBatchResponse:
        await self._unfenced("TransferBatch", context)
        answer = getattr(self._extra, "TransferBatch", None)
        if answer is None:
            return await extra_edge.refuse_batch(self._engine, request, context)
        return await answer(request, context)

    # -- an app's commands

    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext) -> pb.SubmitResponse:
        try:
            answer = await self._edge.submit(
                request.command, request_id=request.request_id, first_sent_unix_ms=request.first_sent_unix_ms
            )
        except AppRefused as refused:
            await context.abort(grpc.StatusCode[refused.code], refused.text)
        return pb.SubmitResponse(reply=answer.reply, replayed=answer.replayed, epoch=answer.epoch)

    async def Query(self, request: pb.QueryRequest, context: grpc.aio.ServicerContext) -> pb.QueryResponse:
        try:
            reply = await self._edge.query(request.query)
        except AppRefused as refused:
            await context.abort(grpc.StatusCode[refused.code], refused.text)
        return pb.QueryResponse(reply=reply)

    async def SubmitBatch(
        self, request: pb.SubmitBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitBatchResponse:
        items = [(item.request_id, item.command, item.first_sent_unix_ms) for item in request.items]
        try:
            answers = await self._edge.answers(items)  # the node's answers: no Reply made per item to be read once
        except AppRefused as refused:  # the whole batch (edge.py E1, E3, E6)
            await context.abort(grpc.StatusCode[refused.code], refused.text)
        response = pb.SubmitBatchResponse()
        add = response.results.add
        for answer in answers:
            if type(answer) is AppRefused:
                add(code=grpc.StatusCode[answer.code].value[0], message=answer.text)
                continue
            # Set field by field: add()'s keyword arguments cost a quarter more an item. A field
            # left at its default costs nothing to set (the wire is by field number, whatever the order).
            result = add()
            result.reply = answer.reply
            result.epoch = answer.ran_in or answer.epoch  # the epoch it ran in (edge._reply's rule)
            if answer.repeated:  # a retry's first answer
                result.replayed = True
        return response

    async def GetState(self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext) -> pb.NodeStateResponse:
        await self._unfenced("GetState", context)
        engine = self._engine
        answer = getattr(self._extra, "GetState", None)
        if answer is not None:  # the app's own answer (in its v1 fields)
            return await answer(request, context)
        state = engine.node.app_state()
        await self._durable(self._log.last_lsn, context)  # never show what a crash could take back
        response = pb.NodeStateResponse(
            node_id=engine.node_id,
            epoch=engine.node.epoch,
            snapshot_mode=getattr(engine.node, "snapshot_mode", engine.node.process.mode),  # a HybridNode's is its own
        )
        if state is not None:
            response.app, response.app_state_bytes, response.app_state_digest = engine.app_spec, len(state), digest(state)
        return response

    # -- snapshots

    async def StartSnapshot(
        self, request: pb.StartSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartSnapshotResponse:
        await self._unfenced("StartSnapshot", context)
        if not request.snapshot_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id must not be empty")
        try:
            self._engine.start_snapshot(request.snapshot_id, request.epoch)
        except EpochFenced as exc:
            await self._fenced(context, exc, "start_snapshot")
        await self._durable(self._log.last_lsn, context)
        return pb.StartSnapshotResponse()

    async def AbortSnapshot(
        self, request: pb.AbortSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortSnapshotResponse:
        await self._unfenced("AbortSnapshot", context)
        if not request.snapshot_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "snapshot_id must not be empty")
        self._engine.abort_snapshot(request.snapshot_id, request.reason)
        log.info("snapshot %s: aborted (%s)", request.snapshot_id, request.reason or "no reason given")
        await self._durable(self._log.last_lsn, context)
        return pb.AbortSnapshotResponse()

    async def Fence(self, request: pb.FenceRequest, context: grpc.aio.ServicerContext) -> pb.FenceResponse:
        """A step of a stop with a snapshot (protocol/node/fence.py F1-F3): answered once durable;
        after STOP, the node stops (`engine.stopped`) once the answer is on its way."""
        if not request.snapshot_id or request.step not in (pb.FenceRequest.FENCE, pb.FenceRequest.LIFT,
                                                           pb.FenceRequest.STOP):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a Fence call needs a snapshot_id and a step")
        engine = self._engine
        try:
            engine.fence_step(request.snapshot_id, request.step, request.lift_after_ms / 1e3)
        except FenceRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        log.info("node %s: %s for snapshot %s", engine.node_id, pb.FenceRequest.Step.Name(request.step), request.snapshot_id)
        await self._durable(self._log.last_lsn, context)
        if request.step == pb.FenceRequest.STOP and not engine.stopped.done():
            engine.stopped.set_result(request.snapshot_id)
        return pb.FenceResponse()

    async def _unfenced(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        """Refuse `rpc` UNAVAILABLE while the node's fence says so (fence.py F1, F4), counted."""
        refusal = self._engine.refusal(rpc)
        if refusal:
            self._engine.metrics.fence_refused(grpc.StatusCode.UNAVAILABLE.name)
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)

    # -- restore and epochs

    async def RestoreState(
        self, request: pb.RestoreStateRequest, context: grpc.aio.ServicerContext, received: int | None = None,
    ) -> pb.RestoreStateResponse:
        engine = self._engine
        if not request.snapshot_id or request.epoch < 2:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a restore needs a snapshot_id and an epoch >= 2")
        in_flight = []
        for channel in request.channels:
            if channel.dst != engine.node_id or channel.src not in engine.incoming:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"no channel {channel.src!r}->{channel.dst!r} into {engine.node_id}"
                )
            # (src, msg_id, seq, 0, payload): an app's message is its bytes, and nothing else
            in_flight += [(channel.src, t.msg_id, t.seq, 0, t.payload if t.HasField("payload") else None)
                          for t in channel.in_flight]
        try:  # a state as blocks is rebuilt and checked before anything changes (restoreblocks.py RB3)
            state, named = await self._held.state_of(request, as_blocks=engine.takes_blocks())
        except MissingRestoreBlocks as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{exc} (node {engine.node_id})")
        if hasattr(self._extra, "restore_args"):  # the app's reading of a restore (of its own v1 fields)
            in_flight, state = self._extra.restore_args(request, in_flight, state)
        try:
            waiting = engine.restore(request.snapshot_id, request.epoch, in_flight, state)
        except core.AppFailed as exc:  # the app cannot take the snapshot's state: the node stops (process.py)
            await context.abort(grpc.StatusCode.INTERNAL, f"node {engine.node_id} cannot restore: {exc}")
        except EpochFenced as exc:  # an older epoch's restore: stale
            await self._fenced(context, exc, "restore")
        except core.RemoteProtocolError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        reply = await self._replied(waiting, context)  # the node's RestoreReply: once durable (N8)
        self._held.restored(named)
        engine.metrics.restore_bytes.inc(request.ByteSize() if received is None else received)
        if hasattr(self._extra, "restored"):  # the app's answer (what it holds, in its v1 fields)
            return self._extra.restored(reply.epoch)
        return pb.RestoreStateResponse(epoch=reply.epoch)

    async def RestoreStateChunks(self, request_iterator, context: grpc.aio.ServicerContext) -> pb.RestoreStateResponse:
        """A RestoreStateRequest over 1 MiB, in pieces of its encoding (snapmesh.protocol.chunking),
        read as they come (carriedblocks.py CB4): it is RestoreState's. The controller's
        certificate is checked before any piece is read (the access table, AUTH2). Each block
        the pieces carry goes to the block shelf as it comes (blockshelf.py BS5; no shelf: it
        is held, and counts); the rest (a state sent whole among it) may reach
        chunking.MAX_STATE_BYTES, no more (RESOURCE_EXHAUSTED at the piece that would pass it)."""
        shelf = self._held.shelf
        reading = carriedblocks.CarriedBlocks(chunking.MAX_STATE_BYTES, message=pb.RestoreStateRequest)
        kept: list[bytes] = []
        if shelf is not None:
            shelf.begin()
        size = 0
        try:
            async for chunk in request_iterator:
                size += len(chunk.data)
                carried = reading.feed(chunk.data)
                if shelf is None:
                    kept += carried
                elif carried:  # a piece's blocks in one thread hop (a MiB is 128 of them)
                    await self._held.carried(carried)
                    reading.released(sum(len(block) for block in carried))
                if reading.held > chunking.MAX_STATE_BYTES:
                    raise chunking.StateTooLarge(f"a restore holds at most {chunking.MAX_STATE_BYTES} bytes")
            request = reading.finish()
        except chunking.StateTooLarge:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"a restore holds at most {chunking.MAX_STATE_BYTES} bytes")
        except chunking.BadChunks as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the pieces do not make a RestoreStateRequest: {exc}")
        except OSError as exc:  # the shelf is where a streamed restore's blocks wait: none changed yet
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot keep the restore's blocks: {exc}")
        request.blocks.extend(kept)
        del kept
        return await self.RestoreState(request, context, received=size)

    async def _fenced(self, context: grpc.aio.ServicerContext, exc: EpochFenced, kind: str) -> None:
        """The node refused a call of another epoch: an older one's for good
        (counted), a newer one's until this node has restored (UNAVAILABLE, retried)."""
        if exc.stale:
            self._engine.metrics.stale_epoch(kind).inc()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    # -- the channel stream src -> this node

    async def Channel(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        engine = self._engine
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {engine.node_id} is stopping")
        await self._unfenced("Channel", context)
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
        await credentials.require_peer(context, src)  # with TLS: only src's certificate may open src->here
        rx = engine.incoming[src]
        acks = AckWriter(context, accepts_payload_runs=self.accepts_payload_runs)
        try:
            # The node answers with its position (the resume point) once it is durable.
            ending = engine.opened(src, first.open.epoch, acks)  # 0 (not said): the machine's to read (N8)
        except EpochFenced as exc:
            await acks.close()
            await self._fenced(context, exc, "channel")
        conn_no = rx.conn_no
        in_runs = engine.metrics.payload_run_messages(src)
        try:
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
                    _receive(engine, src, dst, conn_no, frame.batch)
                    if frame.batch.payload_runs:
                        in_runs.inc(sum(len(run.lengths) for run in frame.batch.payload_runs))
                except GapError as exc:
                    engine.metrics.stream_errors(src, "receiver").inc()
                    log.error("%s; closing the stream (DATA_LOSS)", exc)
                    await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
                except core.RemoteProtocolError as exc:
                    engine.metrics.stream_errors(src, "receiver").inc()
                    log.error("channel %s->%s: the peer broke the protocol: %s; closing the stream", src, dst, exc)
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"protocol violation: {exc}")
                except core.AppFailed as exc:  # the engine has the node stop; the message is not acknowledged
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {engine.node_id} is stopping: {exc}")
        finally:
            await acks.close()
            rx.release(ending)


def _receive(engine: Engine, src: str, dst: str, conn_no: int, batch: pb.ChannelBatch) -> None:
    """Apply one batch: its messages and its payload runs merged by seq
    (snapmesh.proto, ChannelBatch), exactly as the same content sent one message
    each would be. A batch with runs of native numbers (what nodes from before apps
    sent) breaks the protocol before anything of it applies: a message is an app's
    bytes."""
    payload_runs = batch.payload_runs
    if batch.runs:
        raise core.RemoteProtocolError(f"channel {src}->{dst}: runs of numbers, not an app's messages: "
                                       "this node reads payloads only")
    if not payload_runs:  # a sender from before payload runs, or a receiver that did not say it reads them
        engine.receive_batch(src, conn_no, _decode(src, dst, _early_markers_first(batch.messages)))
        return
    check_payload_runs(src, dst, payload_runs)  # malformed before anything of the frame is applied
    if batch.messages:  # markers among the runs: rare (one per snapshot and channel)
        engine.receive_batch(src, conn_no, _decode_merged(src, dst, batch))
    else:  # the common frame: each payload a slice of its run's buffer
        engine.receive_payload_runs(src, conn_no, [(run.first_seq, run_payloads(run)) for run in payload_runs])


def _early_markers_first(messages: Sequence[pb.ChannelMessage]) -> Sequence[pb.ChannelMessage]:
    """Receive-side marker priority (overtake mode: a marker waits behind no data): a frame's early
    markers (seq 0, link L8: only a snapshot that overtakes sends them) are
    applied before its other messages, in their own order; every other message
    keeps its place. A merged frame (channels.py, smart batching) may carry one
    behind transfers pushed before it; it is handled at once, not after them.
    Sound by overtake.py O3: the transfers it now passes left after the
    sender's cut, so were unacknowledged then and are in its outbox (at most L);
    one past L passes the FIFO copy too, which is ignored (R6) as when the
    early copy is first in a frame the sender's outbox gave. A FIFO marker
    (classic mode, or the copy at L+1) never moves."""
    early = [i for i, m in enumerate(messages) if not m.seq and m.HasField("marker")]
    if not early or early[-1] == len(early) - 1:  # none, or already first: the frame as sent
        return messages
    moved = set(early)
    return [messages[i] for i in early] + [m for i, m in enumerate(messages) if i not in moved]


def _seq_of(item: pb.ChannelMessage | tuple[int, object]) -> int:
    return item[0] if type(item) is tuple else item.seq  # type: ignore[union-attr,index]


def _decode_merged(src: str, dst: str, batch: pb.ChannelBatch) -> Iterator[tuple[int, core.Marker | object]]:
    """The batch's messages and its payload runs' messages merged by seq, on a tie
    in that order (each list in its own order; early markers first, as in
    `_receive`; payload runs checked by `_receive`): the per-message form of the
    frame, decoded one message at a time as `_decode` does."""
    messages = ((seq, AppMessage(payload)) for run in batch.payload_runs for seq, payload in payloads(run))
    for item in heapq.merge(_early_markers_first(batch.messages), messages, key=_seq_of):
        if type(item) is tuple:
            yield item
        else:
            yield from _decode(src, dst, (item,))


def _decode(
    src: str, dst: str, messages: Iterable[pb.ChannelMessage]
) -> Iterator[tuple[int, core.Marker | object]]:
    """A frame's messages as (seq, core.Marker or AppMessage), one at a time: a
    message with no body, or one with no payload (a native number), raises
    RemoteProtocolError there, after those before it applied."""
    for message in messages:
        body = message.WhichOneof("body")
        if body == "transfer":
            transfer = message.transfer
            if not transfer.HasField("payload"):
                raise core.RemoteProtocolError(f"channel {src}->{dst}: message {message.seq} carries no payload")
            yield message.seq, AppMessage(transfer.payload, transfer.msg_id)  # msg_id "": the receiver derives it
        elif body == "marker":
            if not message.marker.snapshot_id:
                raise core.RemoteProtocolError(f"channel {src}->{dst}: marker {message.seq} has an empty snapshot id")
            yield message.seq, core.Marker(snapshot_id=message.marker.snapshot_id, last_seq=message.marker.last_seq)
        else:
            raise core.RemoteProtocolError(f"channel {src}->{dst}: message {message.seq} has no body")
