"""Reports finished snapshots to the controller (`Controller.ReportState`).

In the background, one task per snapshot: wait until everything the FullState
rests on is durable in the log, then call the controller, retrying with backoff
until it succeeds, the controller says it will never accept it, or the
snapshot is aborted. The channel path never waits for any of this.
"""

from __future__ import annotations

import asyncio
import logging
import random

import grpc

from services.node.channels import backoff_delay
from services.node.metrics import NodeMetrics
from services.node.translog import LogClosedError, TransferLog
from snapmesh import core, security
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 5.0
# The controller refused for good (unknown or already finished snapshot): retrying cannot help.
_FINAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def full_state_message(state: core.FullState, node_id: str) -> pb.FullState:
    return pb.FullState(
        snapshot_id=state.snapshot_id,
        node_id=state.node_id,
        balance=state.balance,
        channels=[
            pb.ChannelState(
                src=src,
                dst=node_id,
                in_flight=[pb.InFlightTransfer(msg_id=t.msg_id, amount=t.amount, seq=t.seq) for t in transfers],
            )
            for src, transfers in state.channels.items()
        ],
    )


class StateReporter:
    def __init__(
        self, *, address: str, log_: TransferLog, metrics: NodeMetrics, options: list,
        identity: security.Identity | None = None,  # None: plaintext
    ) -> None:
        self._identity = identity
        self._address = address
        self._log = log_
        self._metrics = metrics
        self._options = options
        self._channel: grpc.aio.Channel | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._rng = random.Random()

    def submit(self, message: pb.FullState, lsn: int) -> None:
        if self._channel is None:
            self._channel = security.open_channel(self._address, self._identity, options=self._options, aio=True)
        sid = message.snapshot_id
        task = asyncio.get_running_loop().create_task(self._report(message, lsn), name=f"report {sid}")
        self._tasks[sid] = task
        task.add_done_callback(lambda t, sid=sid: self._tasks.get(sid) is t and self._tasks.pop(sid))

    def cancel(self, snapshot_id: str) -> None:
        task = self._tasks.pop(snapshot_id, None)
        if task is not None:
            task.cancel()

    async def _report(self, message: pb.FullState, lsn: int) -> None:
        try:
            await self._log.wait_durable(lsn)
        except LogClosedError:
            return
        assert self._channel is not None
        stub = pb_grpc.ControllerStub(self._channel)
        attempt = 0
        while True:
            try:
                await stub.ReportState(message, timeout=REPORT_TIMEOUT_S)
                log.info("snapshot %s: reported state to the controller", message.snapshot_id)
                return
            except grpc.aio.AioRpcError as exc:
                self._metrics.report_failures.inc()
                if exc.code() in _FINAL_CODES:
                    log.warning(
                        "snapshot %s: the controller refused the state (%s: %s); not retrying",
                        message.snapshot_id,
                        exc.code().name,
                        exc.details(),
                    )
                    return
                delay = backoff_delay(attempt, self._rng)
                log.warning(
                    "snapshot %s: ReportState failed (%s); retrying in %.2fs",
                    message.snapshot_id,
                    exc.code().name,
                    delay,
                )
            await asyncio.sleep(delay)
            attempt += 1

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
