"""Restore: roll the whole cluster back to a COMPLETE snapshot, the I/O half.

What a restore decides (the gate, the epoch, which snapshots fail, each node's
part, the outcome) is the controller machine's (snapmesh/protocol/controller.py,
rules R1-R4). This adapter carries it out:

1. a RestoreSnapshot call is handed to the machine (with the snapshot, or
   None when there is none), which answers at once from its gate: start, join
   the running restore, a finished restore's answer, or a refusal
   (INVALID_ARGUMENT for a key too long or of another snapshot, NOT_FOUND,
   FAILED_PRECONDITION); a call that
   joins under a new key is answered once its `joined` record is durable;
2. on start: the RESTORING record is journaled in the same synchronous step,
   and no node hears of the restore before it is durable;
3. every node is sent `RestoreState{S, E+1, its recorded balance, the recorded
   channels into it}`, retrying a node that cannot be reached until
   `timeout_s` (the node's side is idempotent, so a repeat is harmless);
4. the outcome (RESTORED with each node's balance, or FAILED naming the nodes)
   is journaled, then the callers are answered.

A controller that restarts with a RESTORING record in its journal resumes that
restore (same epoch, same snapshot) before anything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import grpc

from snapmesh.protocol import controller as ctl
from snapmesh.protocol import restoregate
from snapmesh.protocol.tracker import Now, UnknownSnapshot
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

RESTORE_TIMEOUT_S = 30.0  # how long a node that cannot be reached is retried
CALL_TIMEOUT_S = 5.0
RETRY_S = 0.25


class RestoreRefused(Exception):
    """The restore cannot start; `code` is the gRPC status for the caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Engine(Protocol):
    """What the restorer uses of the controller's engine (services/controller/engine.py)."""

    machine: ctl.Controller

    def lookup(self, snapshot_id: str) -> pb.Snapshot: ...

    def journal_step(self, effects: list[ctl.Effect]) -> asyncio.Future[None] | None: ...

    async def show_step(self, effects: list[ctl.Effect], durable: asyncio.Future[None] | None) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def node_stub(self, node: str) -> pb_grpc.NodeStub: ...


class Restorer:
    """Runs the machine's one restore at a time, journaled at each step (see the module doc)."""

    def __init__(
        self,
        *,
        engine: Engine,
        clock: Callable[[], Now],
        timeout_s: float = RESTORE_TIMEOUT_S,
        on_finished: Callable[[pb.Restore], None] | None = None,
    ) -> None:
        self.engine = engine
        self.machine = engine.machine
        self._clock = clock
        self.timeout_s = timeout_s
        self._on_finished = on_finished  # each RESTORED or FAILED restore, once journaled (the metrics)
        self._running: asyncio.Task[pb.Restore] | None = None

    @property
    def last(self) -> pb.Restore | None:
        """The newest restore, as journaled."""
        return self.machine.last_restore

    def resume_if_running(self) -> None:
        """After a restart: the journal's newest restore runs again if it was RESTORING."""
        last = self.machine.last_restore
        if last is not None and last.status == pb.Restore.RESTORING:
            log.warning("restore of %s (epoch %d) was under way: resuming it", last.snapshot_id, last.epoch)
            self._running = asyncio.get_running_loop().create_task(self._run(self._resume(last)), name="restore")

    async def restore(self, snapshot_id: str, request_id: str = "") -> pb.Restore:
        """Restore `snapshot_id` (raises RestoreRefused when it cannot start).
        Check and claim are one synchronous step: nothing awaits between the
        machine's decision and `self._running` being set."""
        try:
            snapshot: pb.Snapshot | None = self.engine.lookup(snapshot_id)
        except UnknownSnapshot:
            snapshot = None  # the gate says NOT_FOUND, or answers a retry of a key that restored it
        decision = self.machine.restore(snapshot, request_id, self._clock(), snapshot_id=snapshot_id)
        if isinstance(decision, restoregate.Answer):
            return decision.result  # a retry of a finished restore: its answer, nothing rolled back
        if isinstance(decision, restoregate.Join):  # the same restore: wait for it
            durable = self.engine.journal_step(self.machine.drain())  # a new key's `joined` record (R4)
            answer = await asyncio.shield(self._running)  # type: ignore[arg-type]
            if durable is not None:
                await asyncio.shield(durable)  # the key is the restore's after a restart too
            return answer
        if isinstance(decision, (restoregate.Refuse, restoregate.Busy)):
            raise RestoreRefused(grpc.StatusCode[decision.code], decision.message)
        effects = self.machine.drain()
        durable = self.engine.journal_step(effects)  # the failed snapshots' outcomes and RESTORING
        self._running = asyncio.get_running_loop().create_task(self._run(self._start(effects, durable)), name="restore")
        return await asyncio.shield(self._running)

    async def _run(self, restore) -> pb.Restore:
        """Run the claimed restore; the machine hears it settled, whatever happens."""
        try:
            return await restore
        finally:
            self.machine.restore_settled()

    async def _start(self, effects: list[ctl.Effect], durable: asyncio.Future[None] | None) -> pb.Restore:
        finished = [e for e in effects if isinstance(e, ctl.Finished)]
        self.engine.spawn(self.engine.show_step(finished, None))  # the snapshots in progress failed
        if durable is not None:
            await asyncio.shield(durable)  # RESTORING is durable before any node hears of it
        self.engine.spawn(self.engine.show_step([e for e in effects if isinstance(e, ctl.AbortAt)], None))
        return await self._send([e for e in effects if isinstance(e, ctl.RestoreAt)])

    async def _resume(self, last: pb.Restore) -> pb.Restore:
        self.machine.resume(self.engine.lookup(last.snapshot_id))
        return await self._send([e for e in self.machine.drain() if isinstance(e, ctl.RestoreAt)])

    async def _send(self, parts: list[ctl.RestoreAt]) -> pb.Restore:
        results = await asyncio.gather(*(self._restore_node(p.node, p.request) for p in parts))
        now = self._clock()
        for part, result in zip(parts, results, strict=True):
            self.machine.node_restored(part.node, result, now)
        effects = self.machine.drain()
        done = next(e.restore for e in effects if isinstance(e, ctl.RestoreDone))
        if done.status == pb.Restore.FAILED:
            log.error("restore of %s: %s", done.snapshot_id, done.reason)
        else:
            log.info("restored %s in epoch %d", done.snapshot_id, done.epoch)
        durable = self.engine.journal_step(effects)
        if durable is not None:
            await asyncio.shield(durable)
        if self._on_finished is not None:
            self._on_finished(done)
        return done

    async def _restore_node(self, node: str, request: pb.RestoreStateRequest) -> pb.RestoreStateResponse | str:
        """The node's answer, or why it could not be restored (retried until the timeout)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.timeout_s
        while True:
            try:
                return await self.engine.node_stub(node).RestoreState(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                detail = f"{error.code().name}: {error.details()}"
                if error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                    return detail
                if loop.time() >= give_up:
                    return f"unreachable for {self.timeout_s:g}s ({detail})"
            await asyncio.sleep(RETRY_S)
