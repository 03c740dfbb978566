"""The controller's snapshot path holds about one node's state at a time, never all of
them (docs/bench-cluster.md, the controller's peak): an in-process engine on a real
journal and block store, four nodes each reporting a state of 8 MiB as blocks by
stream (every block carried at first, a few the second time), the bounds lowered
(the joining bound and the kept blocks' to 1 MiB, the stream's write window to
256 KiB), and an invariant that reads every node's state. Over both snapshots
(their reports, the invariant, the answers of GetSnapshot and ListSnapshots, the
`.pb` file and the JSON export) no state over the bound is joined (`blocks.joined`
raises for one), no whole form of a snapshot with listed states is built
(`BlockForms.whole` raises), and tracemalloc's peak stays under three states: the
invariant's read of one (its blocks and their join: two) and the windows. Before,
each state was joined and kept, and filing encoded all four joined (32 MiB here).
The second snapshot's reports read only the blocks that changed (the others' sizes
are known from the first). Then, out of memory, both are read back from their files for GetSnapshot and
ListSnapshots without a state joined."""

from __future__ import annotations

import asyncio
import random
import tracemalloc

import pytest

from snapmesh.app import App, View
from snapmesh.protocol import blocks, chunking
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.controller import blockforms
from snapmesh.services.controller import servicer
from snapmesh.services.controller.listedload import load_listed
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb
from support.controller_fakes import CallContext, blob_controller

pytestmark = [pytest.mark.timeout(120)]

MIB = 1024 * 1024
SIZE = 8 * MIB + 100
NODES = ("a", "b", "c", "d")
BOUND = MIB  # JOINED_MAX_BYTES and the kept blocks' bound, lowered
READ: list[int] = []  # the invariant's reads, by size
READS: list[int] = []  # blocks each report listed unjoined read (blockforms.streamed)


def same_size(view: View) -> list[str]:
    """Each state read and let go before the next (`for state in values()` keeps the last one
    while the next is read: two at once, so an app's peak is its own to keep)."""
    for node in view.states:
        READ.append(len(view.states[node]))
    return [] if len(set(READ)) == 1 else [f"sizes differ: {READ}"]


APP = App(name="blob", new=lambda info: None, invariants={"every blob the same size": same_size})


@pytest.fixture
def guarded(monkeypatch) -> None:
    joined, whole = blocks.joined, blockforms.BlockForms.whole

    def no_large_join(sent, read, known=None):
        if len(sent.state_blocks.hashes) * blocks.BLOCK_BYTES > BOUND:
            raise AssertionError(f"the state of {sent.node_id} ({len(sent.state_blocks.hashes)} blocks) was joined")
        return joined(sent, read, known)

    def no_whole(self, snapshot):
        if blockforms.listed(snapshot):
            raise AssertionError(f"snapshot {snapshot.snapshot_id} was built whole: every state joined at once")
        return whole(self, snapshot)

    streamed = blockforms.streamed

    def counted(hashes, read, said="", sized=None):
        def reading(name):
            READS[-1] += 1
            return read(name)

        READS.append(0)
        return streamed(hashes, reading, said, sized)

    monkeypatch.setattr(blockforms, "streamed", counted)
    monkeypatch.setattr(blocks, "joined", no_large_join)
    monkeypatch.setattr(blockforms.BlockForms, "whole", no_whole)
    monkeypatch.setattr(servicer, "JOINED_MAX_BYTES", BOUND)
    monkeypatch.setattr(servicer, "KNOWN_MAX_BYTES", BOUND)
    monkeypatch.setattr(chunking, "WRITE_WINDOW_BYTES", 256 * 1024)


def test_the_snapshot_path_holds_one_state_at_a_time(tmp_path, guarded) -> None:
    asyncio.run(_two_snapshots(tmp_path))


async def _chunks(chunks: list[pb.StateChunk]):
    for chunk in chunks:
        yield chunk


async def _two_snapshots(tmp_path) -> None:
    c = blob_controller(tmp_path, app=APP, nodes=NODES)
    c.service._known.max_bytes = BOUND
    rng = random.Random(7)
    states = {node: rng.randbytes(SIZE) for node in NODES}
    formers = {node: SentBlocks(chunking.WRITE_WINDOW_BYTES) for node in NODES}
    peaks, sids = [], []
    for round_ in range(2):
        sid = (await c.engine.trigger("a")).snapshot_id
        sids.append(sid)
        streams = {}
        for node in NODES:  # built before tracing: the nodes' side
            report = pb.FullState(snapshot_id=sid, node_id=node, state=states[node], app_name="blob", app_version=1,
                                  state_digest=digest(states[node]),  # as a node hashes it at its cut
                                  channels=[pb.ChannelState(src=other, dst=node) for other in NODES if other != node])
            sent, names = formers[node].form(report)
            assert sent.HasField("state_blocks") and (round_ == 1) == (len(sent.blocks) < len(sent.state_blocks.hashes))
            streams[node] = (list(chunking.split_state(sent, 64 * 1024)), names)
        del report, sent
        READ.clear()
        READS.clear()
        tracemalloc.start()
        try:
            answers = await asyncio.gather(*(c.service.ReportStateChunks(_chunks(streams[n][0]), CallContext())
                                             for n in NODES))
            got = await c.service.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), CallContext())
            page = await c.service.ListSnapshots(pb.ListSnapshotsRequest(), CallContext())
            for _ in range(400):  # filed: the `.pb` and the JSON export
                if c.store.missing_files(sid) == (False, False):
                    break
                await asyncio.sleep(0.05)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        for node, answer in zip(NODES, answers, strict=True):
            formers[node].accepted(answer, streams[node][1])
        assert c.tracker._finished[sid].status == pb.Snapshot.COMPLETE, c.tracker._finished[sid].reason
        assert READ == [SIZE] * len(NODES), "the invariant did not read every state"
        blocks_each = -(-SIZE // blocks.BLOCK_BYTES)
        # the second time, the blocks of each node's last state are counted unread (BF6): the new one is read
        assert len(READS) == len(NODES)  # the reports run at once: the reads in all
        assert sum(READS) == (blocks_each * len(NODES) if round_ == 0 else len(NODES)), READS
        assert all(node.state_omitted and not node.HasField("state") for node in got.nodes)
        assert any(s.snapshot_id == sid for s in page.snapshots)
        assert c.store.missing_files(sid) == (False, False), "not filed"
        filed = c.store.load(sid)  # its checksum (its manifests': filingsum.py) and every block checked
        assert filed is not None and {n.node_id: n.state for n in filed.nodes} == states
        assert all(n.state_digest == digest(states[n.node_id]) for n in filed.nodes)
        for node in NODES:  # a few blocks change for the second snapshot
            state = bytearray(states[node])
            state[1000:1100] = rng.randbytes(100)
            states[node] = bytes(state)
    # the invariant reads one state (its blocks, then their join); the windows and the rest are small
    # (and what the process's tables do meanwhile: pathlib interns each block file's name, and
    # a worker that ran other tests first has a large table to grow: a few MiB, whatever the states)
    assert max(peaks) < 3 * SIZE, f"tracemalloc peaks {peaks} over three states of {SIZE}"
    await _from_the_files(c, sids)
    await c.engine.close()
    await c.journal.close()
    c.writer.close()


async def _from_the_files(c, sids: list[str]) -> None:
    """GetSnapshot and ListSnapshots of snapshots the controller no longer holds read their
    files listed (listedload.py): no whole form is read (`blocks.whole_form` raises), each
    block is read and let go, and a block changed on disk sends the read to `load`, which
    finds it corrupt."""
    for sid in sids:
        c.tracker._finished.pop(sid)  # out of the working set: only the files have it
    real_whole_form = blocks.whole_form
    blocks.whole_form = _no_whole_form
    try:
        tracemalloc.start()
        try:
            got = [await c.service.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), CallContext()) for sid in sids]
            page = await c.service.ListSnapshots(pb.ListSnapshotsRequest(), CallContext())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        blocks.whole_form = real_whole_form
    assert peak < SIZE, f"tracemalloc peak {peak} reading the files back (four states of {SIZE})"
    for answer in [*got, *page.snapshots]:
        assert answer.status == pb.Snapshot.COMPLETE and len(answer.nodes) == len(NODES)
        assert all(n.state_omitted and n.state_bytes == SIZE and not n.HasField("state") for n in answer.nodes)
    assert [s.snapshot_id for s in page.snapshots] == sids
    listed = load_listed(c.store, sids[1])
    assert listed is not None and all(blockforms.is_listed(n) and n.state_bytes == SIZE for n in listed.nodes)
    name = listed.nodes[0].state_blocks.hashes[5]
    c.store.blocks.path(name).write_bytes(b"changed behind the controller's back")
    assert load_listed(c.store, sids[1]) is None  # left to `load`, which finds the block corrupt
    assert c.store.load(sids[1]) is None


def _no_whole_form(stored, read):
    raise AssertionError(f"snapshot {stored.snapshot_id} was read whole from its file")
