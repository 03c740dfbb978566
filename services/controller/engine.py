"""The shell around the controller machine: feed `snapmesh.protocol.controller.Controller` events, carry out its effects.

Every input (a trigger, a report, a deadline, a restore call, a StartSnapshot
that failed) is one synchronous call on the machine, then its effects are
carried out here:

    Journal(record)    -> the journal file (group-committed); appended in the same
                          synchronous step as the change, before anything awaits
    Barrier()          -> wait for everything journaled so far
    Publish(snapshot)  -> the WatchSnapshots watchers   } only once the step's
    StartAt(node, ...) -> StartSnapshot at that node    } records are durable
    Finished(snapshot) -> metrics, waiters, watchers, the file writer
    AbortAt(node, ...) -> AbortSnapshot at that node (the machine emits one per node
                          for a FAILED snapshot, after its Finished)
    Retire(snapshot_id) -> the file writer deletes its files
    RestoreAt, RestoreDone -> the restorer (services/controller/restorer.py)

Durability before answers: nothing that shows a change (an RPC answer, a
watcher update, StartSnapshot) goes out before that change's record is durable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable

import grpc

from services.controller import journal as J
from services.controller.metrics import ControllerMetrics
from services.controller.restorer import Restorer
from services.controller.store import StoreWriter
from snapmesh.protocol import controller as ctl
from snapmesh.protocol import controller_journal as records
from snapmesh.protocol.tracker import COMPLETE, FAILED, Now, Tracker, UnknownSnapshot, duration_s, new_snapshot_id
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings import security
from snapmesh.settings.config import ClusterConfig
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 2.0
# The updates one WatchSnapshots watcher may have queued. A watcher that falls
# this far behind is dropped with RESOURCE_EXHAUSTED (it watches again and
# reads what it missed with ListSnapshots or GetSnapshot).
WATCH_QUEUE = 1_000


class FellBehind:
    """Put in a dropped watcher's queue in place of what it had not read."""


TooManySnapshots = ctl.TooManySnapshots  # a trigger past the admission limit (the machine's rule A1)


def system_now() -> Now:
    return Now(mono=time.monotonic(), wall=time.time())


class ControllerEngine:
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
        machine: ctl.Controller | None = None,  # the journal already replayed into it (else a fresh one)
    ) -> None:
        self.identity = identity
        self.config = config
        self.tracker = tracker
        self.machine = machine if machine is not None else ctl.Controller(tracker)
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
        self._watchers: set[asyncio.Queue[pb.Snapshot | FellBehind | None]] = set()
        self.watch_queue = WATCH_QUEUE
        self._background: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self._last_start = 0.0
        # Started or finished in the machine, journal record not yet durable: not to be shown.
        self._unsettled: dict[str, asyncio.Future[None]] = {}
        self.restorer: Restorer | None = None

    # -- lifecycle

    async def start(self) -> None:
        for node in self.config.nodes:
            channel = security.open_channel(node.address, self.identity, options=CLIENT_OPTIONS, aio=True)
            self._channels.append(channel)
            self._stubs[node.id] = pb_grpc.NodeStub(channel)
        self._timer = asyncio.create_task(self._expiry_loop(), name="snapshot-deadlines")
        self.restorer = Restorer(engine=self, clock=self._clock, on_finished=self.metrics.restored)
        self.restorer.resume_if_running()

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

    # -- carrying out effects

    def journal_step(self, effects: list[ctl.Effect]) -> asyncio.Future[None] | None:
        """Append every record of one step (call with no await since the machine
        changed); returns when the last of them is durable (None: no record)."""
        durable = None
        for effect in effects:
            if isinstance(effect, ctl.Journal):
                durable = self.journal.append(effect.record)
                if isinstance(effect.record, (records.Started, records.Finished)):
                    self._unsettled[effect.record.snapshot_id] = durable
            elif isinstance(effect, ctl.Barrier):
                durable = self.journal.barrier()
        return durable

    async def show_step(self, effects: list[ctl.Effect], durable: asyncio.Future[None] | None) -> None:
        """The rest of a step's effects, in order; what shows a change waits for
        `durable` (an OSError from it propagates, and what is left does not go out)."""
        for effect in effects:
            if isinstance(effect, (ctl.Journal, ctl.Barrier)):
                continue
            if isinstance(effect, ctl.Finished):
                sid = effect.snapshot.snapshot_id
                await self._after_finish(effect.snapshot, self._unsettled.get(sid) or _resolved())
                continue
            if durable is not None:
                await asyncio.shield(durable)
            if isinstance(effect, ctl.Publish):
                self._publish(effect.snapshot)
            elif isinstance(effect, ctl.AbortAt):
                self.spawn(self._abort_at(effect))
            elif isinstance(effect, ctl.Retire):  # after the COMPLETE that retires it is durable
                self.writer.discard(effect.snapshot_id)
            elif isinstance(effect, ctl.StartAt):
                self.spawn(self._start_at(effect.node, effect.snapshot_id, effect.epoch))
            else:
                raise TypeError(f"not an effect this step carries out: {effect!r}")

    def node_stub(self, node: str) -> pb_grpc.NodeStub:
        return self._stubs[node]

    async def carry_out(self, effects: list[ctl.Effect]) -> None:
        await self.show_step(effects, self.journal_step(effects))

    # -- snapshots

    async def trigger(self, initiator: str) -> pb.Snapshot:
        """Start a snapshot at `initiator` (a node of the topology): journaled
        before StartSnapshot leaves and before this returns. Raises
        TooManySnapshots, changing nothing, at the admission limit (the machine's A1)."""
        now = self._clock()
        # Ids sort in start order, even for two starts within one clock tick.
        wall = max(now.wall, self._last_start + 1e-6)
        self._last_start = wall
        snapshot_id = new_snapshot_id(wall, os.urandom(4))
        try:
            snapshot = self.machine.trigger(snapshot_id, initiator, Now(mono=now.mono, wall=wall))
        except TooManySnapshots as exc:
            self.metrics.refused_triggers.inc()
            raise TooManySnapshots(
                f"{exc} (controller.max_concurrent_snapshots in {self.config.path}, or snapmesh controller "
                f"--max-concurrent-snapshots N); retry once one finishes"
            ) from None
        self._done[snapshot_id] = asyncio.get_running_loop().create_future()
        effects = self.machine.drain()
        durable = self.journal_step(effects)
        self.metrics.in_progress.set(self.machine.in_progress)
        self._wake.set()
        try:
            await self._settle(snapshot_id, durable)
        except OSError as exc:
            self.machine.start_failed(snapshot_id, f"cannot journal the start: {exc}", self._clock())
            failed = self.machine.drain()
            self.spawn(self.show_step(failed, self.journal_step(failed)))
            raise
        await self.show_step(effects, durable)
        log.info("snapshot %s started at %s", snapshot_id, initiator)
        return snapshot

    async def report(self, state: pb.FullState) -> None:
        """A node's part: journaled (with the snapshot's outcome when it completes
        it) before this returns. Raises TrackerError for a refused report and
        OSError when it cannot be journaled."""
        self.machine.reported(state, self._clock())
        effects = self.machine.drain()
        durable = self.journal_step(effects)
        finish = [e for e in effects if isinstance(e, ctl.Finished)]
        await self.show_step(finish, None)  # the outcome's own record is in the same group commit
        if durable is not None:
            await asyncio.shield(durable)
        await self.show_step([e for e in effects if isinstance(e, ctl.Publish)], durable)

    async def wait_finished(self, snapshot_id: str) -> pb.Snapshot:
        future = self._done.get(snapshot_id)
        if future is None:
            await self._shown([snapshot_id])
            return self.lookup(snapshot_id)
        return await asyncio.shield(future)

    def lookup(self, snapshot_id: str) -> pb.Snapshot:
        """The snapshot from the tracker's working set, else from the store;
        UnknownSnapshot when neither has it."""
        try:
            return self.machine.get(snapshot_id)
        except UnknownSnapshot:
            snapshot = self.writer.store.load(snapshot_id)
            if snapshot is None:
                raise
            return snapshot

    async def _start_at(self, initiator: str, snapshot_id: str, epoch: int) -> None:
        try:
            await self._stubs[initiator].StartSnapshot(
                pb.StartSnapshotRequest(snapshot_id=snapshot_id, epoch=epoch),
                timeout=self.tracker.deadline_s,
            )
        except grpc.aio.AioRpcError as error:
            reason = (
                f"initiator {initiator} unreachable: StartSnapshot failed with "
                f"{error.code().name}: {error.details()}"
            )
            self.machine.start_failed(snapshot_id, reason, self._clock())
            await self.carry_out(self.machine.drain())

    async def _expiry_loop(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.machine.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self._clock().mono)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            self.machine.tick(self._clock())
            await self.carry_out(self.machine.drain())  # each outcome journaled in the same step

    async def _settle(self, snapshot_id: str, durable: asyncio.Future[None] | None) -> None:
        if durable is None:
            return
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
        self.metrics.in_progress.set(self.machine.in_progress)
        if snapshot.status == COMPLETE:
            self.metrics.observe(snapshot)
        if snapshot.status == FAILED:
            log.warning("snapshot %s FAILED: %s", snapshot.snapshot_id, snapshot.reason)
        else:
            verdict = "conserved" if snapshot.conserved else f"NOT conserved ({snapshot.reason})"
            log.info(
                "snapshot %s COMPLETE in %.3fs: total %d, %s",
                snapshot.snapshot_id, duration_s(snapshot), snapshot.total, verdict,
            )
        self.writer.submit(snapshot)  # the files, off the reply path
        self._publish(snapshot)
        future = self._done.pop(snapshot.snapshot_id, None)
        if future is not None and not future.done():
            future.set_result(snapshot)

    async def _abort_at(self, effect: ctl.AbortAt) -> None:
        request = pb.AbortSnapshotRequest(snapshot_id=effect.snapshot_id, reason=effect.reason)
        try:
            await self._stubs[effect.node].AbortSnapshot(request, timeout=ABORT_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            log.info("AbortSnapshot %s at %s: %s", effect.snapshot_id, effect.node, error.code().name)

    def _publish(self, snapshot: pb.Snapshot) -> None:
        for queue in list(self._watchers):
            try:
                queue.put_nowait(snapshot)
            except asyncio.QueueFull:
                self._watchers.discard(queue)
                log.warning("a WatchSnapshots watcher fell %d updates behind: dropped", self.watch_queue)
                _replace_all(queue, FellBehind())

    def spawn(self, coro) -> None:
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


def _resolved() -> asyncio.Future[None]:
    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


def _replace_all(queue: asyncio.Queue, item) -> None:
    """Empty `queue` and put `item` in it (it always fits then)."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(item)
