"""A restore of states too large to join, streamed as blocks over real gRPC
(snapmesh/protocol/restorestream.py RS0-RS5, services/controller/nodeblocks.py,
services/node/servicer.py RestoreStateChunks, blockshelf.py BS5).

An in-process controller (a real engine, journal and block store) takes a
snapshot of two nodes whose states are 41 blocks each, reported as blocks (so
kept listed), and restores it to two real gRPC servers running the node's own
RestoreStateChunks and RestoreState, each with a block shelf on disk. The node's
joining bound (chunking.MAX_STATE_BYTES) is lowered to 16 blocks, and joining a
state of more than that raises on either side, so a restore that completes shows
that nothing joined one: the controller read its blocks one at a time, the node
wrote them to its shelf as they came and rebuilt the state through a file.
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import grpc
import pytest

from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks, chunking, restoreblocks
from snapmesh.protocol.controller import blockforms
from snapmesh.services.node import heldblocks
from snapmesh.services.node.heldblocks import HeldBlocks
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.services.node.servicer import NodeServicer
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.controller_fakes import CallContext, blob_controller

pytestmark = [pytest.mark.timeout(60)]

SIZE = 40 * blocks.BLOCK_BYTES + 100  # 41 blocks, its last one short
CAP = 16 * blocks.BLOCK_BYTES  # the node's joining bound, lowered
STATES = {node: random.Random(f"streamed {node}").randbytes(SIZE) for node in ("a", "b")}
NAMES = {node: blocks.names(state)[0].names for node, state in STATES.items()}
ON_SHELF = 30  # node a holds its first 30 blocks on its shelf, and the controller knows it


class _Engine:
    """What RestoreState asks of a node's engine: the restores it took are recorded."""

    def __init__(self, node_id: str, other: str) -> None:
        self.node_id, self.incoming = node_id, {other: None}
        self.restored: list[tuple[str, int, bytes | None]] = []
        self.metrics = SimpleNamespace(restore_bytes=SimpleNamespace(inc=lambda n: None))

    def takes_blocks(self) -> bool:  # an app with restore(bytes) only (snapmesh.app A9)
        return False

    def restore(self, snapshot_id, epoch, in_flight, state):
        self.restored.append((snapshot_id, epoch, state))
        return epoch


class _Node(NodeServicer):
    """The node's own RestoreStateChunks and RestoreState over a block shelf; its engine a recorder."""

    def __init__(self, node_id: str, other: str, shelf) -> None:  # not NodeServicer.__init__: there is no engine
        self._engine = _Engine(node_id, other)
        self._extra = None
        self._held = HeldBlocks(SentBlocks(), shelf)
        self.carried = 0
        self.calls = 0
        carried = self._held.carried

        async def counted(some: list[bytes]) -> None:
            self.carried += len(some)
            await carried(some)

        self._held.carried = counted  # type: ignore[method-assign]

    async def _replied(self, waiting, context):
        return SimpleNamespace(epoch=waiting)

    async def RestoreStateChunks(self, request_iterator, context):
        self.calls += 1
        return await super().RestoreStateChunks(request_iterator, context)

    async def RestoreState(self, request, context, received=None):
        if received is None:
            self.calls += 1
        return await super().RestoreState(request, context, received)


class _Refused(Exception):
    def __init__(self, code, details) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class _Context(CallContext):
    async def abort(self, code, details):
        raise _Refused(code, details)


def _nothing_joined(monkeypatch) -> None:
    """Joining a state over CAP raises, on the controller's side and the node's."""
    def never(*args, **kwargs):
        raise AssertionError("a listed state was joined on the controller")

    monkeypatch.setattr(blockforms.BlockForms, "state", never)
    monkeypatch.setattr(snapshot_file, "whole", never)
    monkeypatch.setattr(restoreblocks, "referenced_restore", never)
    whole_restore = restoreblocks.whole_restore

    def guarded(request, held):
        if len(request.state_blocks.hashes) * blocks.BLOCK_BYTES > CAP:
            raise AssertionError("the node joined a restore's state from a list of its blocks")
        return whole_restore(request, held)

    monkeypatch.setattr(restoreblocks, "whole_restore", guarded)
    monkeypatch.setattr(chunking, "MAX_STATE_BYTES", CAP)
    monkeypatch.setattr(heldblocks, "FILE_REBUILD_BYTES", 8 * blocks.BLOCK_BYTES)


def _report(sid: str, node: str) -> pb.FullState:
    whole = pb.FullState(snapshot_id=sid, node_id=node, state=STATES[node], app_name="blob", app_version=1,
                         holds_blocks=True, channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)])
    sent, _ = blocks.referenced_report(whole, set(), carry_all=True)
    assert sent is not None
    return sent


async def _snapshot(tmp_path):
    """The controller with a COMPLETE snapshot of listed states, and its two nodes (not serving yet)."""
    c = blob_controller(tmp_path)
    sid = (await c.engine.trigger("a")).snapshot_id
    await asyncio.wait_for(asyncio.gather(*(c.service.ReportState(_report(sid, node), CallContext())
                                            for node in ("a", "b"))), 10)
    finished = c.tracker._finished[sid]
    assert finished.status == pb.Snapshot.COMPLETE, finished.reason
    assert all(blockforms.is_listed(node) and node.state_bytes == SIZE for node in finished.nodes)
    return c, sid, {"a": _Node("a", "b", tmp_path / "a.blocks"), "b": _Node("b", "a", tmp_path / "b.blocks")}


def store_block(c, name: bytes) -> bytes:
    block = c.store.blocks.read(name)
    assert block is not None and blocks.block_hash(block) == name
    return block


async def _serve(nodes):
    """Each node on its own real gRPC server on loopback; the stubs the controller calls them by."""
    servers, stubs, opened = [], {}, []
    for node_id, node in nodes.items():
        server = grpc.aio.server()
        pb_grpc.add_NodeServicer_to_server(node, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        opened.append(channel)
        stubs[node_id] = pb_grpc.NodeStub(channel)
    return servers, stubs, opened


async def _close(c, nodes, servers, opened) -> None:
    for node in nodes.values():
        node._held.close()
    for channel in opened:
        await channel.close()
    for server in servers:
        await server.stop(0)
    await c.engine.close()
    await c.journal.close()
    c.writer.close()


async def _restore(c, sid: str, nodes) -> None:
    """RestoreSnapshot of `sid`: RESTORED, each node restored once to its state byte for byte."""
    done = await asyncio.wait_for(c.service.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=sid),
                                                            _Context()), 30)
    assert done.status == pb.Restore.RESTORED, done.reason
    for node_id, node in nodes.items():
        assert [(s, e, state == STATES[node_id]) for s, e, state in node._engine.restored] == [(sid, done.epoch, True)]


def test_a_listed_snapshot_is_restored_block_by_block_and_held_blocks_are_not_sent(tmp_path, monkeypatch) -> None:
    _nothing_joined(monkeypatch)
    asyncio.run(_restored(tmp_path))


async def _restored(tmp_path) -> None:
    c, sid, nodes = await _snapshot(tmp_path)
    for name in NAMES["a"][:ON_SHELF]:
        nodes["a"]._held.shelf.add(store_block(c, name))
    # node a holds its first ON_SHELF blocks, as the controller believes (RB5); node b holds none,
    # yet the controller believes it holds all it reported: b refuses, and is sent every block
    c.engine.node_blocks.believe("a", frozenset(NAMES["a"][:ON_SHELF]), ())
    assert c.engine.node_blocks.held("b")[0] == frozenset(NAMES["b"])
    servers, stubs, opened = await _serve(nodes)
    c.engine.stubs = stubs
    try:
        await _restore(c, sid, nodes)
        assert nodes["a"].carried == len(NAMES["a"]) - ON_SHELF  # the blocks on its shelf were not sent again
        assert nodes["b"].carried == len(set(NAMES["b"]))  # refused as blocks, then sent every one
        assert c.engine.node_blocks.streamed_blocks == nodes["a"].carried + nodes["b"].carried
        nodes["a"]._held.flush()
        assert set(NAMES["a"]) <= nodes["a"]._held.shelf.names  # it holds the restored state's blocks now
        assert not list((tmp_path / "a.blocks").glob(".*"))  # no rebuilt file left behind
    finally:
        await _close(c, nodes, servers, opened)


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_block_refuses_the_restore_before_any_node_changes(tmp_path, monkeypatch, damage) -> None:
    _nothing_joined(monkeypatch)
    asyncio.run(_refused(tmp_path, damage))


async def _refused(tmp_path, damage: str) -> None:
    c, sid, nodes = await _snapshot(tmp_path)
    bad = NAMES["b"][7]
    path = c.store.blocks.path(bad)
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"not the block" + path.read_bytes()[13:])
    servers, stubs, opened = await _serve(nodes)
    c.engine.stubs = stubs
    epoch = c.engine.machine.epoch
    try:
        with pytest.raises(_Refused) as refused:
            await asyncio.wait_for(c.service.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=sid),
                                                             _Context()), 30)
        assert refused.value.code == grpc.StatusCode.DATA_LOSS
        for named in (f"snapshot {sid}", "node b", f"sha256:{bad.hex()}", damage):
            assert named in refused.value.details
        assert [node.calls for node in nodes.values()] == [0, 0]  # no node heard of it
        assert c.engine.machine.epoch == epoch and c.engine.machine.last_restore is None
    finally:
        await _close(c, nodes, servers, opened)


def test_a_listed_snapshot_no_longer_in_memory_is_restored_from_its_file_block_by_block(tmp_path, monkeypatch) -> None:
    """Past --keep, or after a restart, the controller reads a snapshot from its file: read
    whole, its states were all joined at once (4 GiB at 1 GiB a node); read listed, none is."""
    _nothing_joined(monkeypatch)
    asyncio.run(_restored_from_file(tmp_path))


async def _restored_from_file(tmp_path) -> None:
    c, sid, nodes = await _snapshot(tmp_path)
    filed = c.store.compact_path(sid)
    for _ in range(200):
        if filed.exists() and (tmp_path / "snapshots" / f"{sid}.json").exists():
            break
        await asyncio.sleep(0.05)
    c.tracker.kept = 0
    c.tracker.filed(sid)  # it leaves memory, as one past the kept ones does
    assert sid not in c.engine.machine.ids()
    servers, stubs, opened = await _serve(nodes)
    c.engine.stubs = stubs
    try:
        await _restore(c, sid, nodes)
        assert c.engine.node_blocks.streamed_blocks == len(set(NAMES["a"])) + len(set(NAMES["b"]))
    finally:
        await _close(c, nodes, servers, opened)
