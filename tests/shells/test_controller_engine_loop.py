"""The controller engine's one loop over the machine's effects: persist, then show or send.

A journal whose records become durable only when the test says so: nothing a
step shows (a watcher's update, the RPC's answer) or sends (StartSnapshot)
goes out before the step's record is durable, and when the record cannot be
made durable the rest of the step never goes out.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller.machine import Controller, Journal
from snapmesh.protocol.controller.tracker import COMPLETE, Now
from snapmesh.protocol.topology import Topology
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

pytestmark = [pytest.mark.timeout(60)]


class HeldJournal:
    """Each append's future resolves only when the test resolves it."""

    def __init__(self) -> None:
        self.records: list = []
        self.futures: list[asyncio.Future[None]] = []

    def append(self, record) -> asyncio.Future[None]:
        self.records.append(record)
        self.futures.append(asyncio.get_running_loop().create_future())
        return self.futures[-1]

    def barrier(self) -> asyncio.Future[None]:
        return self.append(None)


class Node:
    def __init__(self, sent: list) -> None:
        self.sent = sent

    async def StartSnapshot(self, request, timeout, wait_for_ready=False):
        self.sent.append(("StartSnapshot", request.snapshot_id))
        return pb.StartSnapshotResponse()

    async def AbortSnapshot(self, request, timeout, wait_for_ready=False):
        self.sent.append(("AbortSnapshot", request.snapshot_id))


def test_a_step_shows_and_sends_nothing_before_its_record_is_durable_and_nothing_at_all_when_it_cannot_be() -> None:
    asyncio.run(_persist_before_show())


async def _persist_before_show() -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    journal = HeldJournal()
    engine = ControllerEngine(
        config=cfg, machine=Controller(bank.tracker(cfg.topology, expected_total=cfg.expected_total, deadline_s=5)),
        journal=journal, writer=None, metrics=ControllerMetrics(CollectorRegistry()),  # type: ignore[arg-type]
    )
    sent: list[tuple[str, str]] = []
    engine.stubs = {n: Node(sent) for n in engine.nodes}  # type: ignore[misc]
    watcher = engine.watchers.subscribe().queue

    trigger = asyncio.create_task(engine.trigger(engine.nodes[0]))
    await asyncio.sleep(0.05)
    assert len(journal.records) == 1 and not trigger.done()
    assert watcher.empty() and sent == [], "shown or sent before the start was durable"
    journal.futures[0].set_result(None)
    snapshot = await trigger
    await asyncio.sleep(0.05)
    assert watcher.get_nowait().snapshot_id == snapshot.snapshot_id
    assert sent == [("StartSnapshot", snapshot.snapshot_id)]

    second = asyncio.create_task(engine.trigger(engine.nodes[1]))
    await asyncio.sleep(0.05)
    journal.futures[-1].set_exception(OSError("no space left on device"))
    with pytest.raises(OSError, match="no space left"):
        await second
    await asyncio.sleep(0.05)
    assert watcher.empty() and len(sent) == 1, "a step went on past a record that could not be made durable"
    failed = [s for s in engine.machine.all() if s.snapshot_id != snapshot.snapshot_id]
    assert [s.status for s in failed] == [pb.Snapshot.FAILED]  # the machine's start_failed, itself journaled
    assert "cannot journal the start: no space left" in failed[0].reason
    await engine.close()


class DurableJournal(HeldJournal):
    def append(self, record) -> asyncio.Future[None]:
        future = super().append(record)
        future.set_result(None)
        return future


class BackingOffNode:
    """A node whose channel is in reconnect backoff: a call fails UNAVAILABLE at once unless it
    waits for the channel (`wait_for_ready`), which then succeeds, or never does when `down`."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.calls: list[bool] = []  # wait_for_ready of each StartSnapshot

    async def StartSnapshot(self, request, timeout, wait_for_ready=False):
        self.calls.append(wait_for_ready)
        if self.down or not wait_for_ready:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="connection refused")
        return pb.StartSnapshotResponse()

    async def AbortSnapshot(self, request, timeout, wait_for_ready=False):
        pass


@pytest.mark.parametrize("down", [False, True])
def test_a_start_that_meets_a_channel_in_backoff_waits_for_it_once_before_the_snapshot_fails(down: bool) -> None:
    asyncio.run(_start_through_backoff(down))


async def _start_through_backoff(down: bool) -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    engine = ControllerEngine(
        config=cfg, machine=Controller(bank.tracker(cfg.topology, expected_total=cfg.expected_total, deadline_s=5)),
        journal=DurableJournal(), writer=None, metrics=ControllerMetrics(CollectorRegistry()),  # type: ignore[arg-type]
    )
    node = BackingOffNode(down)
    engine.stubs = {n: node for n in engine.nodes}  # type: ignore[misc]
    snapshot = await engine.trigger(engine.nodes[0])
    await asyncio.sleep(0.05)
    assert node.calls == [False, True]  # one plain call, then one that waits for the channel, no more
    status = engine.machine.get(snapshot.snapshot_id)
    if down:
        assert status.status == pb.Snapshot.FAILED
        why = f"initiator {engine.nodes[0]} unreachable: StartSnapshot failed with UNAVAILABLE: connection refused"
        assert status.reason == why
    else:
        assert status.status == pb.Snapshot.IN_PROGRESS, status.reason
    await engine.close()


class Forgetting:
    """A journal that only remembers what it was told to forget; a writer, what to delete."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []
        self.discarded: list[str] = []
        self.unpinned: list[str] = []
        self.submitted: list[tuple[str, bool, bool]] = []

    def forget(self, snapshot_id: str) -> None:
        self.forgotten.append(snapshot_id)

    def discard(self, snapshot_id: str) -> None:
        self.discarded.append(snapshot_id)

    def unpin(self, snapshot_id: str, call: int | None = None) -> None:
        self.unpinned.append(snapshot_id)

    def submit(self, snapshot: pb.Snapshot, *, compact: bool = True, json: bool = True) -> None:
        self.submitted.append((snapshot.snapshot_id, compact, json))


def test_the_replays_retire_effects_are_carried_out_by_the_engines_first_step() -> None:
    """--keep's deletions stay deleted after a restart: what the replay retires (K1)
    waits in the machine, and the engine's start carries it out like any Retire:
    its journal records are forgotten, its files deleted and its blocks unpinned."""
    asyncio.run(_replay_retires())


async def _replay_retires() -> None:
    now = Now(mono=1.0, wall=1_700_000_000.0)
    records: list[R.Record] = []  # the journal of two COMPLETE snapshots of a two-node cluster
    for sid in ("s1", "s2"):
        records += [
            R.Started(snapshot_id=sid, initiator="a", wall=now.wall),
            R.Reported(state=bank.report(sid, "a", 60,
                                         channels=[pb.ChannelState(src="b", dst="a")]), wall=now.wall),
            R.Reported(state=bank.report(sid, "b", 40,
                                         channels=[pb.ChannelState(src="a", dst="b")]), wall=now.wall),
            R.Finished(snapshot_id=sid, status=COMPLETE, reason="", wall=now.wall),
        ]
    machine = Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=5), keep=1)
    assert machine.replayed(records, now).finished == ["s2"]
    files = Forgetting()
    engine = ControllerEngine(
        config=config.load(config.DEFAULT_CONFIG), machine=machine,
        journal=files, writer=files, metrics=ControllerMetrics(CollectorRegistry()),  # type: ignore[arg-type]
    )
    assert files.forgotten == files.discarded == files.submitted == []  # nothing before the engine starts
    await engine.start()
    assert files.forgotten == files.discarded == files.unpinned == ["s1"] and files.submitted == [("s2", True, True)]
    await engine.close()


class RestoringNode:
    """RestoreState answers once the test lets it (`go`)."""

    def __init__(self, sent: list) -> None:
        self.sent = sent
        self.go = asyncio.Event()

    async def RestoreState(self, request, timeout, wait_for_ready=False):
        self.sent.append(("RestoreState", request.snapshot_id))
        await self.go.wait()
        return pb.RestoreStateResponse(epoch=request.epoch)


def _restorable(journal) -> tuple[ControllerEngine, list, list[RestoringNode]]:
    """An engine over a two-node machine holding a COMPLETE s1, its nodes' RestoreState held."""
    now = Now(mono=1.0, wall=1_700_000_000.0)
    machine = Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=5))
    machine.trigger("s1", "a", now)
    for node, other, balance in (("a", "b", 60), ("b", "a", 40)):
        machine.reported(bank.report("s1", node, balance,
                                     channels=[pb.ChannelState(src=other, dst=node)]), now)
    machine.drain()
    engine = ControllerEngine(
        config=config.load(config.DEFAULT_CONFIG), machine=machine,
        journal=journal, writer=None, metrics=ControllerMetrics(CollectorRegistry()),  # type: ignore[arg-type]
    )
    sent: list = []
    nodes = [RestoringNode(sent) for _ in engine.nodes]
    engine.stubs = dict(zip(engine.nodes, nodes, strict=True))  # type: ignore[arg-type]
    return engine, sent, nodes


def test_every_call_that_starts_or_joins_a_restore_gets_its_outcome() -> None:
    asyncio.run(_restore_answers())


async def _restore_answers() -> None:
    engine, sent, nodes = _restorable(DurableJournal())
    calls = [asyncio.create_task(engine.restore("s1", key)) for key in ("k1", "k2", "")]
    await asyncio.sleep(0.05)
    assert sorted(sent) == [("RestoreState", "s1")] * 2 and not any(c.done() for c in calls)
    for node in nodes:
        node.go.set()
    answers = await asyncio.gather(*calls)
    assert [a.status for a in answers] == [pb.Restore.RESTORED] * 3 and answers[0] == answers[1] == answers[2]
    assert await engine.restore("s1", "k2") == answers[0] and len(sent) == 2  # a retry: answered, not rolled back
    assert not engine._answers
    await engine.close()


def test_a_restore_that_cannot_be_journaled_answers_its_calls_the_error_and_sends_nothing() -> None:
    asyncio.run(_restore_unjournaled())


async def _restore_unjournaled() -> None:
    journal = HeldJournal()
    engine, sent, _ = _restorable(journal)
    first = asyncio.create_task(engine.restore("s1", "k1"))
    second = asyncio.create_task(engine.restore("s1", "k2"))
    await asyncio.sleep(0.05)
    assert [type(r).__name__ for r in journal.records] == ["Restored", "Joined"]
    for future in journal.futures:
        future.set_exception(OSError("no space left on device"))
    for call in (first, second):
        with pytest.raises(OSError, match="no space left"):
            await call
    assert sent == [] and not engine._answers
    await engine.close()


def test_a_restarted_engine_whose_clock_is_behind_names_its_snapshot_after_the_journals_and_keeps_it() -> None:
    """The machine's I1 and K2 through the shell: the engine's clock (faked, an hour
    behind the first process's) names a snapshot that sorts after every id the
    journal brought back, and with keep 2 its completion deletes an old snapshot's
    files, never its own."""
    asyncio.run(_restart_behind())


async def _restart_behind() -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    ahead, behind = Now(mono=50.0, wall=1_800_000_000.0), Now(mono=1.0, wall=1_800_000_000.0 - 3_600)

    def parts(sid: str) -> list[pb.FullState]:
        share = cfg.expected_total // len(cfg.topology.nodes)
        return [bank.report(sid, node, share,
                            channels=[pb.ChannelState(src=src, dst=node) for src in cfg.topology.incoming(node)])
                for node in cfg.topology.nodes]

    def machine() -> Controller:
        return Controller(bank.tracker(cfg.topology, expected_total=cfg.expected_total, deadline_s=5), keep=2)

    first = machine()  # the first process: three snapshots, a second apart
    for i in range(3):
        now = Now(ahead.mono + i, ahead.wall + i)
        sid = first.start(cfg.topology.nodes[0], now, bytes(8)).snapshot_id
        for state in parts(sid):
            first.reported(state, now)
    records = [e.record for e in first.drain() if isinstance(e, Journal)]
    again = machine()
    again.replayed(records, behind)
    files = Forgetting()
    engine = ControllerEngine(
        config=cfg, machine=again, journal=DurableJournalForgetting(files), writer=files,  # type: ignore[arg-type]
        metrics=ControllerMetrics(CollectorRegistry()), clock=lambda: behind,
    )
    sent: list[tuple[str, str]] = []
    engine.stubs = {n: Node(sent) for n in engine.nodes}  # type: ignore[misc]
    await engine.start()
    old = again.ids()
    assert files.discarded == [old[0]]  # the restart's retention: keep 2 of the three
    snapshot = await engine.trigger(cfg.topology.nodes[0])
    assert snapshot.snapshot_id > max(old)
    await asyncio.gather(*(engine.report(state) for state in parts(snapshot.snapshot_id)))  # held until the last
    assert engine.machine.status(snapshot.snapshot_id) == COMPLETE
    assert files.discarded == [old[0], old[1]], "the snapshot that just completed was retired"
    await engine.close()


class DurableJournalForgetting(DurableJournal):
    """Records durable at once; what it is told to forget goes to `files`."""

    def __init__(self, files: Forgetting) -> None:
        super().__init__()
        self.forget = files.forget


class ChunkTakingNode:
    """Takes a restore either way, and records which way it came."""

    def __init__(self) -> None:
        self.came: list[tuple[str, int]] = []  # (rpc, pieces)
        self.requests: list[pb.RestoreStateRequest] = []

    async def RestoreState(self, request, timeout, wait_for_ready=False):
        self.came.append(("RestoreState", 1))
        self.requests.append(request)
        return pb.RestoreStateResponse(epoch=request.epoch)

    async def RestoreStateChunks(self, chunks, timeout, wait_for_ready=False):
        pieces = [chunk.data for chunk in chunks]
        assert all(len(p) <= 1024 * 1024 for p in pieces)
        self.came.append(("RestoreStateChunks", len(pieces)))
        request = pb.RestoreStateRequest.FromString(b"".join(pieces))
        self.requests.append(request)
        return pb.RestoreStateResponse(epoch=request.epoch)


def test_a_restore_over_a_mib_goes_to_its_node_in_chunks_and_a_small_one_in_one_call() -> None:
    """A node's receive limit is sized for its clients' calls (services/node/process.py:
    rpc_budgets), so the controller sends a RestoreStateRequest over 1 MiB as pieces."""
    asyncio.run(_restore_in_chunks())


async def _restore_in_chunks() -> None:
    now, flying = Now(mono=1.0, wall=1_700_000_000.0), 80_000  # ~1.8 MB of transfers in flight into b
    machine = Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100 + flying, deadline_s=5))
    machine.trigger("s1", "a", now)
    in_flight = bank.items("a", "b", [1] * flying)
    machine.reported(bank.report("s1", "a", 60, channels=[pb.ChannelState(src="b", dst="a")]),
                     now)
    machine.reported(bank.report("s1", "b", 40,
                                 channels=[pb.ChannelState(src="a", dst="b", in_flight=in_flight)]), now)
    machine.drain()
    engine = ControllerEngine(
        config=config.load(config.DEFAULT_CONFIG), machine=machine,
        journal=DurableJournal(), writer=None, metrics=ControllerMetrics(CollectorRegistry()),  # type: ignore[arg-type]
    )
    nodes = {name: ChunkTakingNode() for name in engine.nodes}
    engine.stubs = nodes  # type: ignore[assignment]
    answer = await engine.restore("s1", "k1")
    await engine.close()
    assert answer.status == pb.Restore.RESTORED
    came = {name: node.came for name, node in nodes.items()}
    assert came["a"] == [("RestoreState", 1)]  # small: one call, as before
    assert came["b"][0][0] == "RestoreStateChunks" and came["b"][0][1] >= 2
    assert len(nodes["b"].requests[0].channels[0].in_flight) == flying  # the same request, joined
