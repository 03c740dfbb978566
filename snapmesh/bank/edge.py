"""The bank's v1 RPCs at a node's edge: `Transfer`, `TransferBatch` and `GetState` as calls of the bank app.

A node that hosts the bank app (services/app/bank.py) answers the v1 RPCs the
bank's clients have always called with the same answers and codes as the native
bank, through a thin adapter here, the way any user's own service calls its node:

    Transfer(to, n, request_id)  -> edge.submit(b"n to", request_id=...)
    TransferBatch(items)         -> edge.submit_many([(request_id, b"n to"), ...])
    GetState                     -> the app's state (decimal ASCII) in its v1 field

It is the bank app's extra edge (services/node/extra_edge.py): the bank's App names
`BankEdge` as its `edge`, and the node shell loads it by that name, knowing no
app. The command is the bank app's compact form (its docstring): the tally as a
decimal integer, one space, the node paid; the reply is the tally after it, as
decimal ASCII, and the message the app sends is the tally as decimal ASCII. A
transfer's id is "node:dst:seq", the seq of the message it sent (Reply.first_seq).
Its v1 fields are read and written by snapmesh/bank/wire.py. A cluster file
without [app] runs the bank app too (settings/appsettings.py `hosted`): every new
node of the bank is served here. A node of another app answers the v1 calls as the
node shell does without an edge (extra_edge.py X2: INVALID_ARGUMENT, "use Submit").

Rules
-----
B2. A TransferBatch holds at most extra_edge.MAX_BATCH transfers, the node's own
    bound, checked by its check (INVALID_ARGUMENT naming the limit); an empty
    one is answered with no results. One request_id named twice in a batch:
    the second is a retry of the first (its first answer), as it always was;
    the batch goes to the edge in runs without a repeated id.
B3. A refused item of a batch carries the tally its node held when it was
    refused: the one after the last item paid before it in the batch (a
    retry's first answer aside), else the one the node held when the batch
    came in.
B4. A restore of a snapshot the bank's native nodes wrote (a tally, tallies in
    flight, no state bytes) restores as the bank app's: the tally as its state,
    each tally in flight as its message, both decimal ASCII.
B5. A log the bank's native nodes wrote (tallies in its records, no app's
    record) recovers as the bank app's, its records mapped once when read:
    the node's tally becomes the app's state, each tally in its outbox a
    message, each request id's answer the app's reply (its digest unknown, as
    for an id from before digests); the node then seals the segment, so the
    active one holds only the app's records (Recovered.reshaped):
    snapmesh/bank/oldlogs.py.
B6. GetState names the app (its spec, its state's size and digest) as any app's
    does, except on a node whose file names the bank by its own names (no [app],
    or module "bank": Engine.app_spec ""), which answers as the bank always has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import grpc

import snapmesh.bank.wire as wire
from snapmesh.app import Refused, Reply
from snapmesh.bank.formats import NODE_TALLY_KEY
from snapmesh.bank.metrics import BankMetrics
from snapmesh.protocol.appstate import digest
from snapmesh.services.node.edge import REFUSAL_CODE, Edge
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.extra_edge import refuse_oversized
from snapmesh.services.node.translog import LogClosedError
from snapmesh.v1 import snapmesh_pb2 as pb

_OK = grpc.StatusCode.OK.value[0]
# What the edge says of an answer a restore took back, and what a Transfer's client has always read.
_UNDONE = ("not done; retrying (same request_id) runs it anew", "not paid; retrying (same request_id) pays it anew")


class _Paid(NamedTuple):
    """An item paid, as wire.batch_results reads it."""

    msg_id: str
    tally: int


class _Refused(NamedTuple):
    """An item refused, as wire.batch_results reads it."""

    error: str
    tally: int


def command(dst: str, tally: int) -> bytes:
    """A transfer as the bank app's compact command."""
    return b"%d %s" % (tally, dst.encode())


class BankEdge:
    """The v1 bank RPCs of one node that hosts the bank app (rules B2-B6), over its Edge."""

    def __init__(self, engine: Engine, edge: Edge) -> None:
        self._engine = engine
        self._edge = edge
        # The bank's series (the dashboards read them), with every refusal's status at 0 from the start.
        self.metrics = BankMetrics(engine.node_id, engine.metrics.registry, set(REFUSAL_CODE.values()))
        engine.metrics.on_fence_refusal.append(lambda code: self.metrics.refused(code).inc())
        # The balance a scrape shows is the bank app's own number, published by the node's loop
        # after each step (`_observe`): setting the gauge from a snapshot() per step moved the
        # app's undo base, and the app is the loop's alone: a scrape (the metrics server's
        # thread) reads this int, never the app, which may be mid-step there.
        self._balance = 0
        self.metrics.balance.set_function(lambda: self._balance)
        engine.metric_hooks.append(self._observe)
        self._observe()
        engine.held_text = self.held_text  # the node's log lines, in their v1 words (operators grep them)

    def held(self) -> int:
        """The tally the bank app holds now."""
        return int(self._engine.node.app_state())

    def _observe(self) -> None:
        """After each step of the node, on its loop: the messages received (each a transfer), and
        the balance for a scrape (the bank app's `balance`, an int read whole with no snapshot():
        that moves the app's undo base)."""
        self.metrics.received_up_to(self._engine.node.messages_received)
        self._balance = self._engine.node.host.machine.balance

    def held_text(self) -> str:
        """What the node's log lines say it holds: "balance 970", as the bank's lines always have."""
        return f"{NODE_TALLY_KEY} {self.held()}"

    async def Transfer(self, request: pb.TransferRequest, context: grpc.aio.ServicerContext) -> pb.TransferResponse:
        dst, tally, request_id, first_sent_unix_ms = wire.transfer(request)
        try:
            reply = await self._edge.submit(command(dst, tally), request_id=request_id,
                                            first_sent_unix_ms=first_sent_unix_ms)
        except Refused as refused:
            self.metrics.refused(refused.code).inc()
            await context.abort(grpc.StatusCode[refused.code], _v1_text(refused.text))
        if not reply.replayed:
            self.metrics.sent.inc()
        return wire.transfer_response(self._msg_id(dst, reply), int(reply.reply))

    async def TransferBatch(
        self, request: pb.TransferBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.TransferBatchResponse:
        items = wire.transfers(request.transfers)
        await refuse_oversized(len(items), context)  # B2: the node's bound, in its words
        response = pb.TransferBatchResponse()
        if not items:
            return response
        held = self.held()
        answers: list[Reply | Refused] = []
        for run in _runs(items):
            try:
                answers += await self._edge.submit_many(
                    [(request_id, command(dst, tally), first_sent) for dst, tally, request_id, first_sent in run])
            except Refused as refused:  # the whole batch (edge.py E1, E6)
                await context.abort(grpc.StatusCode[refused.code], _v1_text(refused.text))
        results: list[_Paid | _Refused] = []
        codes: list[int] = []
        paid = 0
        for (dst, _, _, _), answer in zip(items, answers, strict=True):
            if type(answer) is Refused:
                self.metrics.refused(answer.code).inc()
                codes.append(grpc.StatusCode[answer.code].value[0])
                results.append(_Refused(_v1_text(answer.text), held))
            else:
                codes.append(_OK)
                if not answer.replayed:  # a retry's answer is the tally after its first run, not now
                    held = int(answer.reply)
                    paid += 1
                results.append(_Paid(self._msg_id(dst, answer), int(answer.reply)))
        wire.batch_results(response.results, results, codes, _OK)
        self.metrics.sent.inc(paid)
        return response

    async def GetState(self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext) -> pb.NodeStateResponse:
        """The bank's GetState: its tally, once the log holds everything it rests on, and the app
        as any app's GetState names it (its spec, its state's size and digest)."""
        engine = self._engine
        held = self.held()
        try:
            await engine.log.wait_durable(engine.log.last_lsn)  # never show what a crash could take back
        except LogClosedError as exc:  # LogFailedError too
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {engine.node_id} is stopping: {exc}")
        response = wire.node_state(held, node_id=engine.node_id, epoch=engine.node.epoch,
                                   snapshot_mode=getattr(engine.node, "snapshot_mode", engine.node.process.mode))
        if engine.app_spec:  # "": the bank its file names by its own names, whose GetState has always been this
            state = str(held).encode()
            response.app, response.app_state_bytes, response.app_state_digest = engine.app_spec, len(state), digest(state)
        return response

    def restore_args(self, request: pb.RestoreStateRequest, in_flight: list[tuple],
                     state: bytes | None) -> tuple[list[tuple], bytes | None]:
        """A restore's in-flight items and state as the node takes them (B4): a native
        snapshot's (no state bytes) read from its v1 fields as the bank app's."""
        if state is not None:
            return in_flight, state
        carried = [item for channel in request.channels for item in wire.in_flight(channel.src, channel.in_flight)]
        mapped = [(src, msg_id, seq, 0, str(tally).encode() if payload is None else payload)
                  for src, msg_id, seq, tally, payload in carried]
        return mapped, str(wire.restore_request(request)).encode()

    def restored(self, epoch: int) -> pb.RestoreStateResponse:
        """A restore's answer: the tally the bank holds after it (its v1 field)."""
        return wire.restore_response(epoch, self.held())

    def _msg_id(self, dst: str, reply: Reply) -> str:
        return f"{self._engine.node_id}:{dst}:{reply.first_seq}"


def _runs(items: Sequence[tuple[str, int, str, int]]) -> list[list[tuple[str, int, str, int]]]:
    """`items` cut where a request_id repeats (B2): each run names an id once."""
    runs: list[list[tuple[str, int, str, int]]] = [[]]
    seen: set[str] = set()
    for item in items:
        request_id = item[2]
        if request_id and request_id in seen:
            runs.append([])
            seen = set()
        if request_id:
            seen.add(request_id)
        runs[-1].append(item)
    return runs


def _v1_text(text: str) -> str:
    """A refusal's text as the bank's clients have always read it."""
    return text.replace(*_UNDONE) if text.startswith("taken back by the restore") else text

