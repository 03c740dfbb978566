"""Restore (issue 10): roll the whole cluster back to a COMPLETE snapshot.

A restore to snapshot S starts epoch E+1. The controller

1. checks S (unknown: NOT_FOUND; not COMPLETE or not conserved:
   FAILED_PRECONDITION, nothing changes);
2. moves its own epoch to E+1 and fails every snapshot in progress with
   "restored to S" (their reports, from epoch E, are refused from now on);
3. journals the restore as RESTORING before any node hears of it;
4. sends every node `RestoreState{S, E+1, its recorded balance, the recorded
   channels into it}`, retrying a node that cannot be reached until
   `timeout_s`. The node's side is idempotent, so a repeat is harmless;
5. journals RESTORED (with each node's balance after) or FAILED naming the
   nodes it could not restore, then answers.

Steps 1-3 claim the restore in one synchronous step (no await between the
check and the claim), so two concurrent calls never start two restores: the
second waits for the first when it names the same snapshot, and is refused
otherwise. A call with the `request_id` of a restore already started answers
that restore (running or finished) instead of rolling back again. These
decisions are `snapmesh.protocol.restoregate.RestoreGate`'s, a pure state machine the
fault simulator drives too.

The cluster is fenced at E+1 from step 2 on, whatever happens next: a node
still in epoch E cannot open a channel to a restored node, and a controller
that restarts with a RESTORING record in its journal resumes that restore
(same epoch, same snapshot) before anything else. `plan` is pure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from services.controller import journal as J
from snapmesh.protocol import restoregate
from services.controller.tracker import COMPLETE, Tracker
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

RESTORE_TIMEOUT_S = 30.0  # how long a node that cannot be reached is retried
CALL_TIMEOUT_S = 5.0
RETRY_S = 0.25
KEYS_KEPT = restoregate.KEYS_KEPT  # the idempotency keys of the newest restores, answered from memory
MAX_KEY_BYTES = restoregate.MAX_KEY_BYTES


class RestoreRefused(Exception):
    """The restore cannot start; `code` is the gRPC status for the caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def plan(snapshot: pb.Snapshot, epoch: int) -> dict[str, pb.RestoreStateRequest]:
    """Each node's part of restoring `snapshot` in `epoch`: its recorded balance
    and the recorded state of every channel into it (in channel order)."""
    requests = {
        n.node_id: pb.RestoreStateRequest(snapshot_id=snapshot.snapshot_id, epoch=epoch, balance=n.balance)
        for n in snapshot.nodes
    }
    for channel in snapshot.channels:
        if channel.in_flight:
            requests[channel.dst].channels.append(channel)
    return requests


def problem(snapshot: pb.Snapshot) -> str:
    """Why one cannot restore `snapshot` ("" when one can)."""
    if snapshot.status != COMPLETE:
        status = pb.Snapshot.Status.Name(snapshot.status)
        return f"snapshot {snapshot.snapshot_id} is {status}, not COMPLETE"
    if not snapshot.conserved:
        return f"snapshot {snapshot.snapshot_id} is not conserved (total {snapshot.total}, expected {snapshot.expected_total})"
    return ""


def check(snapshot: pb.Snapshot) -> None:
    """Raise RestoreRefused(FAILED_PRECONDITION) for a snapshot one cannot restore."""
    why = problem(snapshot)
    if why:
        raise RestoreRefused(grpc.StatusCode.FAILED_PRECONDITION, why)


class Restorer:
    """Runs one restore at a time, journaled at each step (see the module doc)."""

    def __init__(
        self,
        *,
        tracker: Tracker,
        journal: J.Journal,
        stubs: dict[str, pb_grpc.NodeStub],
        fail_in_progress: Callable[[str], None],
        timeout_s: float = RESTORE_TIMEOUT_S,
        on_finished: Callable[[pb.Restore], None] | None = None,
        lookup: Callable[[str], pb.Snapshot] | None = None,
    ) -> None:
        self.tracker = tracker
        self._lookup = lookup or tracker.get  # finished snapshots may be in the store only
        self.journal = journal
        self.stubs = stubs
        self._fail_in_progress = fail_in_progress
        self.timeout_s = timeout_s
        self._on_finished = on_finished  # each RESTORED or FAILED restore, once journaled (the metrics)
        self.last: pb.Restore | None = None  # the newest restore, as journaled
        self._running: asyncio.Task[pb.Restore] | None = None
        self.gate = restoregate.RestoreGate(keys_kept=KEYS_KEPT, max_key_bytes=MAX_KEY_BYTES)

    def taken_back(self, last: pb.Restore | None) -> None:
        """After a restart: the journal's newest restore (its key answers a
        retry); resume it if it was RESTORING."""
        self.last = last
        if last is None:
            return
        resume = last.status == pb.Restore.RESTORING
        self.gate.taken_back(last.snapshot_id, last.request_id, last, running=resume)
        if resume:
            log.warning("restore of %s (epoch %d) was under way: resuming it", last.snapshot_id, last.epoch)
            self._running = asyncio.get_running_loop().create_task(self._run(self._drive(last)), name="restore")

    @property
    def last_restored(self) -> str:
        return self.last.snapshot_id if self.last is not None and self.last.status == pb.Restore.RESTORED else ""

    async def restore(self, snapshot_id: str, request_id: str = "") -> pb.Restore:
        """Restore `snapshot_id` (raises RestoreRefused when it cannot start).
        Check and claim are one synchronous step: nothing awaits between the
        gate's decision and `self._running` being set (issue 26.4)."""
        refused = restoregate.key_problem(request_id, MAX_KEY_BYTES)
        if refused is not None:
            raise RestoreRefused(grpc.StatusCode[refused.code], refused.message)
        snapshot = self._lookup(snapshot_id)  # UnknownSnapshot -> NOT_FOUND
        decision = self.gate.request(snapshot_id, request_id, time.time(), problem(snapshot))
        if isinstance(decision, restoregate.Answer):
            return decision.result  # a retry of a finished restore: its answer, nothing rolled back
        if isinstance(decision, restoregate.Join):
            return await asyncio.shield(self._running)  # type: ignore[arg-type]  # the same restore: wait for it
        if isinstance(decision, (restoregate.Refuse, restoregate.Busy)):
            raise RestoreRefused(grpc.StatusCode[decision.code], decision.message)
        epoch = self.tracker.epoch + 1
        self.tracker.epoch = epoch  # from here on, reports of the older epoch are refused
        self._fail_in_progress(f"restored to {snapshot_id}")
        started = pb.Restore(snapshot_id=snapshot_id, epoch=epoch, status=pb.Restore.RESTORING, request_id=request_id)
        started.started_at.FromNanoseconds(int(decision.at * 1e9))
        self.last = started
        self._running = asyncio.get_running_loop().create_task(self._run(self._start(started)), name="restore")
        return await asyncio.shield(self._running)

    async def _run(self, restore) -> pb.Restore:
        """Run the claimed restore; the gate hears its end (its newest record), whatever happens."""
        try:
            return await restore
        finally:
            self.gate.finished(self.last)

    async def _start(self, started: pb.Restore) -> pb.Restore:
        await self._journal(started)  # RESTORING is durable before any node hears of it
        return await self._drive(started)

    async def _drive(self, started: pb.Restore) -> pb.Restore:
        self.tracker.epoch = max(self.tracker.epoch, started.epoch)
        snapshot = self._lookup(started.snapshot_id)
        requests = plan(snapshot, started.epoch)
        names = sorted(requests)
        results = await asyncio.gather(*(self._restore_node(n, requests[n]) for n in names))
        done = pb.Restore()
        done.CopyFrom(started)
        failures = [f"{n}: {r}" for n, r in zip(names, results, strict=True) if isinstance(r, str)]
        if failures:
            done.status = pb.Restore.FAILED
            done.reason = "not restored on " + "; ".join(failures) + f" (the cluster is fenced at epoch {started.epoch})"
            log.error("restore of %s: %s", started.snapshot_id, done.reason)
        else:
            done.status = pb.Restore.RESTORED
            done.nodes.extend(pb.NodeBalance(node_id=n, balance=r.balance) for n, r in zip(names, results, strict=True))
            log.info("restored %s in epoch %d", started.snapshot_id, started.epoch)
        done.finished_at.FromNanoseconds(time.time_ns())
        await self._journal(done)
        if self._on_finished is not None:
            self._on_finished(done)
        return done

    async def _restore_node(self, node: str, request: pb.RestoreStateRequest) -> pb.RestoreStateResponse | str:
        """The node's answer, or why it could not be restored (retried until the timeout)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.timeout_s
        while True:
            try:
                return await self.stubs[node].RestoreState(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                detail = f"{error.code().name}: {error.details()}"
                if error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                    return detail
                if loop.time() >= give_up:
                    return f"unreachable for {self.timeout_s:g}s ({detail})"
            await asyncio.sleep(RETRY_S)

    async def _journal(self, restore: pb.Restore) -> None:
        self.last = restore
        await self.journal.append(J.Restored(restore=restore))

