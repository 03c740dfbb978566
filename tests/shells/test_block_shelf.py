"""A node's held blocks on disk (services/node/blockshelf.py BS1-BS4, heldblocks.py): a node
that restarted rebuilds a restore as blocks from its shelf; a block corrupt or missing
there is not held (the restore is refused as blocks, and sent whole); the shelf keeps
the blocks of its two states only."""

from __future__ import annotations

import asyncio
import random

import pytest

from snapmesh.protocol import blocks, restoreblocks
from snapmesh.protocol.controller.effects import RestoreAt
from snapmesh.services.controller.nodeblocks import NodeBlocks
from snapmesh.services.node.blockshelf import BlockShelf, shelf_dir
from snapmesh.services.node.heldblocks import HeldBlocks, MissingRestoreBlocks
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb
from support.restore_blocks import FakeNode, report, restore

pytestmark = pytest.mark.timeout(60)

B = blocks.BLOCK_BYTES


def as_blocks(state: bytes, held: frozenset[bytes]) -> pb.RestoreStateRequest:
    sent, _ = restoreblocks.referenced_restore(restore(state), held)
    return sent


def reported(directory, state: bytes) -> HeldBlocks:
    """A node whose last report's state is `state`, its shelf under `directory`, written."""
    sent = SentBlocks()
    held = HeldBlocks(sent, directory)
    sent.form(report(state))
    held.flush()
    return held


def test_a_node_that_restarted_rebuilds_a_restore_from_the_blocks_on_its_disk(tmp_path):
    state = random.Random(1).randbytes(8 * B)
    reported(tmp_path / "p1.blocks", state).close()
    older = state[: 2 * B] + b"o" * B + state[3 * B :]
    nodes = NodeBlocks()
    nodes.reported(report(state), blocks.names(state)[0].names)
    node = FakeNode(HeldBlocks(SentBlocks(), tmp_path / "p1.blocks"))  # restarted: nothing in memory
    answer = asyncio.run(nodes.restore(node, RestoreAt("p1", restore(older))))
    assert answer.epoch == 3 and node.states == [older]
    assert len(node.got) == 1 and list(node.got[0].blocks) == [b"o" * B]  # one block sent, not the state


@pytest.mark.parametrize("damage", ["corrupt", "missing", "cut short"])
def test_a_block_damaged_on_the_shelf_is_not_held_and_the_state_is_sent_whole(tmp_path, damage):
    state = random.Random(2).randbytes(4 * B)
    reported(tmp_path / "p1.blocks", state).close()
    name = blocks.names(state)[0].names[1]
    path = BlockShelf(tmp_path / "p1.blocks").path(name)
    if damage == "corrupt":  # the same size: only its hash tells
        path.write_bytes(bytes(B))
    elif damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: B // 2])
    held = HeldBlocks(SentBlocks(), tmp_path / "p1.blocks")
    with pytest.raises(MissingRestoreBlocks, match=f"sha256:{name.hex()}"):
        asyncio.run(held.state_of(as_blocks(state, frozenset(blocks.names(state)[0].names))))
    assert not path.exists()  # a corrupt one is removed: it is not held
    nodes = NodeBlocks()
    nodes.reported(report(state), blocks.names(state)[0].names)
    node = FakeNode(held)
    asyncio.run(nodes.restore(node, RestoreAt("p1", restore(state))))
    assert node.states == [state] and [r.HasField("state") for r in node.got] == [False, True]


def test_the_shelf_keeps_the_blocks_of_the_last_report_and_the_last_restore_only(tmp_path):
    first, second, third = (random.Random(seed).randbytes(4 * B) for seed in (3, 4, 5))
    held = reported(tmp_path / "p1.blocks", first)
    restored = blocks.names(second)[0]
    held.restored(restored)
    held._sent.form(report(third))  # the next report: the first's blocks go, the restore's stay
    held.flush()
    on_disk = {bytes.fromhex(p.name) for p in (tmp_path / "p1.blocks").iterdir()}
    assert on_disk == set(restored.names) | set(blocks.names(third)[0].names)
    held.close()
    # restarted: both slots start as what is on disk; the next report removes neither's until replaced
    again = HeldBlocks(SentBlocks(), tmp_path / "p1.blocks")
    again._sent.form(report(first))
    again.flush()
    on_disk = {bytes.fromhex(p.name) for p in (tmp_path / "p1.blocks").iterdir()}
    assert on_disk == set(restored.names) | set(blocks.names(third)[0].names) | set(blocks.names(first)[0].names)
    again.restored(blocks.names(first)[0])
    again.flush()
    assert {bytes.fromhex(p.name) for p in (tmp_path / "p1.blocks").iterdir()} == set(blocks.names(first)[0].names)
    again.close()


def test_a_temporary_file_left_by_a_crash_is_removed_and_no_log_means_no_shelf(tmp_path):
    (tmp_path / "p1.blocks").mkdir()
    (tmp_path / "p1.blocks" / ".ab.tmp").write_bytes(b"x")
    assert BlockShelf(tmp_path / "p1.blocks").names == frozenset()
    assert not (tmp_path / "p1.blocks" / ".ab.tmp").exists()
    assert shelf_dir(tmp_path / "p1.log.jsonl", "p1") == tmp_path / "p1.blocks"
    assert shelf_dir(None, "p1") is None
    with pytest.raises(ValueError, match="no slot 'other'"):
        BlockShelf(tmp_path / "p1.blocks").keep("other", blocks.names(b"x")[0])


def test_a_closed_shelf_has_finished_its_writes_and_takes_no_more(tmp_path):
    # The node's stop closes it (embedded.py): what was asked is written whole; a state formed
    # or restored after that is not shelved (the shelf is a cache), and asking raises nothing.
    first, later = (random.Random(seed).randbytes(4 * B) for seed in (6, 7))
    sent = SentBlocks()
    held = HeldBlocks(sent, tmp_path / "p1.blocks")
    sent.form(report(first))  # queued for the worker thread, not waited for
    asyncio.run(held.aclose())
    expected = sorted(name.hex() for name in blocks.names(first)[0].names)
    assert sorted(p.name for p in (tmp_path / "p1.blocks").iterdir()) == expected  # whole: no temporary file
    sent.form(report(later))
    held.restored(blocks.names(later)[0])
    held.flush()
    assert sorted(p.name for p in (tmp_path / "p1.blocks").iterdir()) == expected


def test_a_block_the_pending_report_wrote_is_linked_not_written_again(tmp_path):
    """BS6: a block whose file the pending report has (reportblocks.py) becomes a second name
    of that very file; one it lacks (collected since, RK2) is written from memory."""
    from snapmesh.services.node.pendingreports import PendingReports

    state = random.Random(7).randbytes(12 * B)
    pending = PendingReports(tmp_path / "p1.reports")
    pending.save_unsynced(pb.FullState(snapshot_id="s1", node_id="p1", state=state), 1, state)
    pending.blocks.collect()  # the blocks its file carried, in their directory (RK1)
    named = blocks.names(state)[0]
    gone = named.names[4]
    pending.blocks.path(gone).unlink()  # as a collection after a later save would
    shelf = BlockShelf(tmp_path / "p1.blocks", linked_from=pending.blocks.directory)
    assert shelf.keep("report", named) == (12, 0)
    for name in named.names:
        here = shelf.path(name).stat()
        if name == gone:
            assert here.st_nlink == 1 and shelf.get(name) == state[4 * B : 5 * B]
        else:
            assert here.st_ino == pending.blocks.path(name).stat().st_ino, "linked, not a second copy"
    pending.remove("s1")
    pending.blocks.collect()  # the report's names go; the shelf's stay, whole
    assert [shelf.get(name) for name in named.names] == blocks.split(state)


def test_a_report_slot_kept_by_what_changed_holds_exactly_the_slots_blocks(tmp_path):
    """BS7: a report state of as many blocks as the last writes and removes only by the
    blocks that changed; the files are still exactly the blocks some slot names (a block
    twice in a state, one the restored slot names too, one moved to another index)."""
    rng = random.Random(3)
    pool = [rng.randbytes(B) for _ in range(12)]  # few contents: blocks repeat within a state
    shelf = BlockShelf(tmp_path / "n1.blocks")
    restored = b"".join(rng.choice(pool) for _ in range(6))
    shelf.keep("restored", blocks.names(restored)[0])
    state = [rng.choice(pool) for _ in range(20)]
    for step in range(40):
        named = blocks.names(b"".join(state))[0]
        written, removed = shelf.keep("report", named)
        on_disk = {bytes.fromhex(p.name) for p in shelf.directory.iterdir()}
        assert on_disk == set(named.names) | set(blocks.names(restored)[0].names), f"step {step}"
        assert all(shelf.get(name) is not None for name in named.names)
        if step % 10 == 9:  # another count of blocks: compared whole
            state.append(rng.choice(pool))
        for _ in range(rng.randint(0, 3)):
            i, j = rng.randrange(len(state)), rng.randrange(len(state))
            state[i], state[j] = (state[j], rng.choice(pool)) if rng.random() < 0.5 else (rng.randbytes(B), state[i])
