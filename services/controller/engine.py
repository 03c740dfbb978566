"""The shell around the controller machine: feed `snapmesh.protocol.controller.machine.Controller` events, carry out its effects.

Every input (a trigger, a report, a deadline, a restore call, a node's answer to
a call, a file written) is one synchronous call on the machine; then `carry_out`
takes its effects (what each asks: the machine's docstring) in one loop, in
order, as etcd/raft's Ready is taken: persist, then show and send. A Journal
effect is appended at once, so the journal's order is the machine's and a
step's records share one round; every later effect of the step waits until the
record is durable, and is carried out in the call that learns it so
(services/controller/steps.py: no task, no loop turn between the journal's round
and what it held back, such as a waiting trigger's answer). Then the one timer is re-armed for the machine's next
deadline (aioquic's get_timer). Each effect first moves its metrics
(`measures.of`) and says its log line (`loglines.of`).

A record that cannot be made durable (OSError) ends its step there: nothing
after it is shown or sent, the machine hears what was not (`unjournaled`), and
the caller gets the error. Reads wait until everything journaled when they
read is durable (`durable`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from snapmesh.services.controller import journal as J
from snapmesh.services.controller.hops import ControllerHops
from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.services.controller.listedload import load_listed
from snapmesh.services.controller.nodeblocks import NodeBlocks
from snapmesh.services.controller.steps import Steps
from snapmesh.services.controller.store import StoreWriter
from snapmesh.protocol.controller import machine as ctl
from snapmesh.protocol.controller import listing, loglines, measures, restoregate
from snapmesh.protocol import restorestream
from snapmesh.protocol.controller import blockforms, restoreplan
from snapmesh.protocol.controller.tracker import COMPLETE, Now
from snapmesh.serving import calls, credentials
from snapmesh.serving.fanout import FanOut
from snapmesh.serving.runtime import CLIENT_OPTIONS, say
from snapmesh.protocol.topology import Topology
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.settings.config import ClusterConfig
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

# The updates one WatchSnapshots watcher may have queued. A watcher that falls
# this far behind is dropped with RESOURCE_EXHAUSTED (it watches again and
# reads what it missed with ListSnapshots or GetSnapshot).
WATCH_QUEUE = 1_000


def system_now() -> Now:
    return Now(mono=time.monotonic(), wall=time.time())


class ControllerEngine:
    def __init__(
        self,
        *,
        config: ClusterConfig,
        machine: ctl.Controller,  # built by the caller; at a restart, the files loaded and the journal replayed into it
        journal: J.Journal,
        writer: StoreWriter,
        metrics: ControllerMetrics,
        clock: Callable[[], Now] = system_now,
        identity: security.Identity | None = None,  # None: plaintext
    ) -> None:
        self.identity = identity
        self.config = config
        self.machine = machine
        self.journal = journal
        self.writer = writer
        self.metrics = metrics
        metrics.reading(machine)
        # from the files and the journal, listed: read whole, every kept state was joined here at once
        metrics.apply(measures.loaded(machine.listed(sid) for sid in machine.ids()))
        self._clock = clock
        self.nodes = list(machine.topology.nodes)
        self.deadline_s = machine.deadline_s
        self.stubs: dict[str, pb_grpc.NodeStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self.watchers: FanOut[pb.Snapshot] = FanOut(WATCH_QUEUE, "WatchSnapshots watcher")
        self._background: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None  # at the machine's next deadline
        self._tail: asyncio.Future[None] | None = None  # the newest record's durability
        self._steps = Steps(self._carried, self._unjournaled, lambda: self._clock().mono)  # steps under way
        if isinstance(journal, J.Journal):  # a round's waiters go on in the callback that settles it
            journal.listen(self._steps.resume)
        self._loop: asyncio.AbstractEventLoop | None = None  # by `start`: where the writer's `filed` goes
        self._calls = itertools.count()  # names each call the machine answers (restores, waiting triggers)
        self._answers: dict[int, asyncio.Future[Any]] = {}  # by call, until its AnswerRestore or AnswerTrigger
        self._read: ClusterConfig | None = None  # the cluster file as a rescale's restore read it (Adopt)
        self._hops = ControllerHops(metrics)  # the path after a node's cut, timed (services/controller/hops.py)
        self.node_blocks = NodeBlocks()  # what each node holds of its states' blocks: a restore sends the rest
        # a streamed restore's blocks (restorestream.py RS4), read from the store as they are sent
        self.node_blocks.read = lambda name: self.writer.store.blocks.read(name)

    # -- lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # The nodes never see the token: the controller's certificate is what they ask for.
        identity = self.identity.without_token() if self.identity is not None else None
        for node in self.config.nodes:
            channel = credentials.open_channel(node.address, identity, options=CLIENT_OPTIONS, aio=True)
            self._channels.append(channel)
            self.stubs[node.id] = pb_grpc.NodeStub(channel)
        if self.machine.to_resume:  # the replay's: a restore under way (its callers are gone: none waits)
            log.warning("restore of %s (epoch %d) was under way: resuming it", self.machine.to_resume, self.machine.epoch)
            self.machine.resume(self.lookup(self.machine.to_resume))
        await self.carry_out()  # the replay's File, Forget and Retire effects, and the resumed restore's parts

    def filed(self, snapshot_id: str) -> None:
        """The writer's thread: the snapshot's compact file is written (the machine hears it on the loop)."""
        try:
            self._loop.call_soon_threadsafe(self._filed, snapshot_id)  # type: ignore[union-attr]
        except RuntimeError:  # pragma: no cover  (the loop closed first: at exit)
            pass

    def _filed(self, snapshot_id: str) -> None:
        self.machine.filed(snapshot_id)
        self.carry_out()

    def end_streams(self) -> None:
        """End every WatchSnapshots stream (before the server drains)."""
        self.watchers.end()

    async def close(self) -> None:
        self.end_streams()
        self._steps.close()
        if self._timer is not None:
            self._timer.cancel()
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self.node_blocks.close)  # the notes asked for, written
        for channel in self._channels:
            await channel.close()

    # -- the loop

    def carry_out(self) -> asyncio.Future[float | None]:
        """The machine's effects, drained: its records are appended now (call with no
        await since the machine changed); the rest is carried out in order, each effect
        once the records before it are durable (steps.py), at once when none is
        journaled. Await the future to answer once all of it is durable; it gives when
        (monotonic) its last record was (None: it journaled nothing)."""
        steps: list[tuple[ctl.Effect, asyncio.Future[None] | None]] = []
        for effect in self.machine.drain():  # no await: one step, one log round
            durable = None
            if isinstance(effect, ctl.Journal):
                durable = self._tail = self.journal.append(effect.record)
            elif isinstance(effect, ctl.Barrier):
                durable = self._tail = self.journal.barrier()
            steps.append((effect, durable))
        self._arm()
        done: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        done.add_done_callback(self._ended)
        self._steps.start(steps, done)
        return done

    def _carried(self, effect: ctl.Effect, durable_at: float | None) -> None:
        """One effect of a step, its records before it durable since `durable_at` (steps.py)."""
        if isinstance(effect, ctl.AnswerTrigger):
            self._hops.answering(effect.calls, durable_at)
        self._effect(effect)

    def _unjournaled(self, effects: list[ctl.Effect], error: BaseException) -> None:
        """A step's record could not be made durable: `effects`, from it on, were not carried out."""
        self.machine.unjournaled(effects, error, self._clock())  # type: ignore[arg-type]
        self.carry_out()

    def _effect(self, effect: ctl.Effect) -> None:
        self.metrics.carried_out(effect)
        say(log, loglines.of(effect))
        if isinstance(effect, ctl.Publish):
            self.watchers.publish(effect.snapshot)
        elif isinstance(effect, (ctl.StartAt, ctl.AbortAt, ctl.RestoreAt, ctl.FenceAt)):
            self.spawn(self._call(effect))
        elif isinstance(effect, ctl.Finished):
            self._finished(effect.snapshot)
        elif isinstance(effect, ctl.Retire):  # its records go too (a replay's may not be filed yet)
            self.journal.forget(effect.snapshot_id)
            self.writer.discard(effect.snapshot_id)
            self.writer.unpin(effect.snapshot_id)  # after its files: journalblocks.py JB2
        elif isinstance(effect, ctl.File):
            self.writer.submit(effect.snapshot, compact=effect.compact, json=effect.json)
        elif isinstance(effect, ctl.Forget):
            self.journal.forget(effect.snapshot_id)
            self.writer.unpin(effect.snapshot_id)  # filed: it references its blocks (journalblocks.py JB2)
        elif isinstance(effect, ctl.Adopt):
            self._adopt(effect.topology)
        elif isinstance(effect, ctl.RestoreDone):  # durable: a retry of its keys is answered from now on
            self.machine.restore_settled()
            self.carry_out()
        elif isinstance(effect, (ctl.AnswerRestore, ctl.AnswerTrigger, ctl.AnswerReport)):
            for call in effect.calls:
                answer = self._answers.pop(call)
                if answer.done():  # its caller went away (cancelled): nobody to answer
                    continue
                if isinstance(effect.outcome, Exception):  # an AnswerReport's None: OK
                    answer.set_exception(effect.outcome)
                    answer.exception()  # retrieved here: a call that went away meanwhile is no warning
                else:
                    answer.set_result(effect.outcome)
        else:
            raise TypeError(f"not an effect the controller carries out: {effect!r}")

    async def durable(self) -> None:
        """Wait until everything journaled so far is durable (a read shows only that)."""
        tail = self._tail
        if tail is not None and not tail.done():
            await asyncio.wait({tail})

    # -- events

    async def stop(self, initiator: str = "") -> pb.Snapshot:
        """A stop with a snapshot (the machine's `stop`, stopping.py ST1-ST5): the snapshot
        once COMPLETE and every node stopped, or FAILED (the cluster runs again). Raises
        StopRefused (ST1) and UnknownInitiator at once, StopFailed at the stop's end (ST3, ST4)."""
        call = next(self._calls)
        snapshot_id = self._fed(self.machine.stop, initiator, self._clock(), os.urandom(8), call=call)
        answer = self._answer(call)
        log.info("stop with snapshot %s: fencing every node", snapshot_id)
        self.carry_out()
        try:
            return await asyncio.shield(answer)
        finally:
            self._hops.forget(call)  # a stop's answer is no trigger's `visible` (it waits for the nodes too)

    async def trigger(self, initiator: str = "", *, broadcast: bool = False, wait: bool = False) -> pb.Snapshot:
        """Start a snapshot at `initiator` (a node of the topology; "": one at
        random), or with `broadcast` at every node (the machine's B1): journaled
        before StartSnapshot leaves and before this returns; with `wait`, return
        the snapshot once it ended, as the machine answers (W1). Raises UnknownInitiator
        (the machine's A2) or TooManySnapshots at the admission limit (A1), changing nothing."""
        now = self._clock()
        call = next(self._calls) if wait else None
        snapshot = self._fed(self.machine.start, initiator, now, os.urandom(8), broadcast=broadcast, call=call)
        self._list_blocks(snapshot.snapshot_id)
        answer = None if call is None else self._answer(call)
        await self.carry_out()  # OSError: the machine failed the snapshot (J1); cancelled: the step goes on
        self.metrics.apply(measures.journal_wait("trigger", self._clock().mono - now.mono))
        log.info("snapshot %s started at %s", snapshot.snapshot_id, "every node" if broadcast else snapshot.initiator)
        if answer is None or call is None:
            return snapshot
        try:
            ended = await answer  # set by the step that made its end durable (steps.py): resumed the next loop turn
            self._hops.visible(call, ended, self._clock().mono)
            return ended
        finally:
            self._hops.forget(call)

    def _list_blocks(self, snapshot_id: str) -> None:
        """The blocks directory listed for `snapshot_id` (blockdir.py D5) in a thread while its
        nodes cut, not by its first report on the report's path (tens of milliseconds at
        32,768 blocks); a report that comes first lists it itself, or waits for this one."""
        store = getattr(self.writer, "store", None)  # a writer that files nothing has no blocks
        if store is not None and store.blocks.directory.is_dir():
            blocks = store.blocks
            self.spawn(asyncio.to_thread(blocks.listed_for, snapshot_id))

    def _answer(self, call: int) -> asyncio.Future[Any]:
        """The future the machine's answer to `call` (AnswerRestore, AnswerTrigger) settles."""
        answer = self._answers[call] = asyncio.get_running_loop().create_future()
        return answer

    async def report(self, state: pb.FullState, sent: pb.FullState | None = None) -> bool:
        """A node's part: journaled (with the snapshot's outcome when it completes
        it) before this returns. A part that does not complete its snapshot is held
        (the machine's H1-H4): its record goes with the snapshot's end, in that
        step's one log round, and this returns then. `sent`: the report as blocks
        it was rebuilt from, journaled in its place (journalblocks.py JB1). Whether
        this report's own record was journaled: not for a repeat, nor for a held one
        its snapshot's FAILED dropped (H2). Raises TrackerError for a
        refused report and OSError when it cannot be journaled."""
        now = self._clock()
        call = next(self._calls)
        snapshot, duplicate = self._fed(self.machine.reported, state, now, call=call, sent=sent)
        held = self.machine.holding(call)
        answer = self._answer(call) if held else None
        if not duplicate:
            self._hops.received(state, now)
        durable_at = await self.carry_out()  # cancelled: the step goes on all the same (steps.py)
        if answer is not None:
            await answer  # its snapshot ended, its record (or FAILED) durable
            return not duplicate and self._completed(state.snapshot_id)
        if not duplicate:
            self._hops.journaled(now, durable_at)
        if snapshot.status == COMPLETE and not duplicate:  # the report's record and the outcome, in one round
            self.metrics.apply(measures.journal_wait("complete", self._clock().mono - now.mono))
        return not duplicate

    def _completed(self, snapshot_id: str) -> bool:
        """The snapshot is COMPLETE (False: failed, or no longer known here)."""
        try:
            return self.machine.status(snapshot_id) == COMPLETE
        except KeyError:
            return False

    def _fed(self, event: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """The machine's `event`; a refusal it raises is counted (metrics.refused), then raised."""
        try:
            return event(*args, **kwargs)
        except Exception as refusal:
            self.metrics.refused(refusal)
            raise

    async def restore(self, snapshot_id: str, request_id: str = "", nodes: Sequence[str] = (),
                      listed: pb.Snapshot | None = None) -> pb.Restore:
        """A RestoreSnapshot call: the machine's gate decides (R1, R4), and the
        machine answers it (R5); `nodes` the target node set of a rescale (R7); `listed`
        what `listed_for_restore` gave for it. Raises restoregate.Refused, and OSError when the
        restore cannot be journaled."""
        call = next(self._calls)
        # find's None: the gate says NOT_FOUND, or answers a retry of a key that restored it
        snapshot = listed if listed is not None else self._restorable(snapshot_id, nodes)
        if snapshot is not None and blockforms.listed(snapshot):  # RS3: before any node hears of it
            parts = restoreplan.plan(snapshot, self.machine.epoch)
            await asyncio.to_thread(restorestream.check, snapshot_id, parts, self.writer.store.blocks.read)
        candidate = self._read_cluster_file() if nodes else None  # R7: the machine decides if it is the target's
        decision = self.machine.restore(snapshot, request_id, self._clock(), snapshot_id=snapshot_id, call=call,
                                        nodes=nodes, candidate=candidate)
        if isinstance(decision, (restoregate.Refuse, restoregate.Busy)):
            raise restoregate.Refused(decision)
        answer = self._answer(call)
        self.carry_out()
        return await asyncio.shield(answer)

    def _restorable(self, snapshot_id: str, nodes: Sequence[str]) -> pb.Snapshot | None:
        """The snapshot to restore: its large states as block lists when the machine says so
        (restorestream.py RS0: nothing joined); else `find`'s, whole."""
        listed = self.machine.listed_restore(snapshot_id, nodes)
        return listed if listed is not None else self.find(snapshot_id)

    async def listed_for_restore(self, snapshot_id: str) -> pb.Snapshot | None:
        """The snapshot a restore of `snapshot_id` takes by its block lists (RS0), its files not
        read whole for it: the machine's, or one it no longer holds read from its file listed
        (listedload.py: its checksum checked a block at a time; at 1 GiB a node, reading it whole
        joined every state at once). None: the restore reads it whole."""
        if (held := self.machine.listed_restore(snapshot_id)) is not None or snapshot_id in self.machine.ids():
            return held
        return self.machine.filed_restore(await asyncio.to_thread(self._load_listed, snapshot_id))

    def _read_cluster_file(self) -> Topology | str:
        """The controller's cluster file as it reads now (kept for Adopt), or why it cannot be read."""
        try:
            self._read = cluster_config.load(self.config.path)
        except (cluster_config.ConfigError, OSError) as exc:
            return " ".join(str(exc).split())
        return self._read.topology

    def _adopt(self, topology: Topology) -> None:
        """Adopt: call the nodes of the cluster file the machine took `topology` from."""
        assert self._read is not None and self._read.topology is topology, "an Adopt of a topology not read here"
        # the nodes only: the controller's own settings stay those it started with (its flags too)
        self.config = dataclasses.replace(self.config, nodes=self._read.nodes, topology=topology)
        self.nodes = list(topology.nodes)
        self.writer.store.grids.members(self.nodes)  # the nodes that left are forgotten (gridmemo.py GM6)
        identity = self.identity.without_token() if self.identity is not None else None
        for node in self.config.nodes:
            if node.id not in self.stubs:  # a kept node keeps its channel (its address is kept too)
                channel = credentials.open_channel(node.address, identity, options=CLIENT_OPTIONS, aio=True)
                self._channels.append(channel)
                self.stubs[node.id] = pb_grpc.NodeStub(channel)

    async def _call(self, effect: ctl.Call) -> None:
        stub = self.stubs[effect.node]
        if isinstance(effect, ctl.RestoreAt):  # as blocks to a node that holds some (nodeblocks.py)
            answer = await self.node_blocks.restore(stub, effect)
        else:
            answer = await calls.call(getattr(stub, effect.rpc), effect.request, effect.retry)
        say(log, loglines.called(effect, answer))
        self.machine.called(effect, answer, self._clock())
        self.carry_out()

    def find(self, snapshot_id: str, *, stored: bool = True) -> pb.Snapshot | None:
        """listing.find's: the machine's, else (`stored`) the store's; None when neither has it."""
        return listing.find(snapshot_id, self.machine.get, self._load if stored else None)

    def lookup(self, snapshot_id: str, *, listed: bool = False) -> pb.Snapshot:
        """listing.look_up's: UnknownSnapshot when there is none, listing.Damaged when its files are.
        `listed`: the machine's with its large states as block lists (blockforms.py), not joined."""
        held, load = (self.machine.listed, self._load_listed) if listed else (self.machine.get, self._load)
        return listing.look_up(snapshot_id, held, load, lambda sid: self.writer.store.damaged.get(sid))

    def _load_listed(self, snapshot_id: str) -> pb.Snapshot | None:
        return load_listed(self.writer.store, snapshot_id)  # listedload.py: no state joined

    def _load(self, snapshot_id: str) -> pb.Snapshot | None:
        return self.writer.store.load(snapshot_id)  # the store is reached only for a snapshot the machine lacks

    def _arm(self) -> None:
        """The one timer, re-armed after every step for the machine's next deadline."""
        if self._timer is not None:
            self._timer.cancel()
        delay = self.machine.timer(self._clock().mono)
        self._timer = None if delay is None else asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self.machine.tick(self._clock())
        self.carry_out()  # each outcome journaled in the same step

    # -- what the effects do

    def _finished(self, snapshot: pb.Snapshot) -> None:
        self.writer.submit(snapshot)  # the files, off the reply path
        self.watchers.publish(snapshot)

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Future) -> None:
        self._background.discard(task)  # type: ignore[arg-type]
        error = None if task.cancelled() else task.exception()
        if isinstance(error, OSError):  # a caller that waited for the step has it too
            log.error("cannot journal: %s (the rest of that step was not shown or sent)", error)
        elif error is not None:
            log.error("controller step failed", exc_info=error)

    async def periodic(self, interval_s: float) -> None:
        """Trigger a snapshot at a random node every `interval_s` seconds."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.trigger()
            except (ctl.TooManySnapshots, OSError) as exc:  # this tick is skipped; the next one tries again
                say(log, loglines.skipped(exc))

