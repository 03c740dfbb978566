"""The controller's start reads back the blocks of the journal's reports (journalblocks.py JB3,
services/controller/process.py): a block file there that cannot be read (an open that fails
otherwise than "no such file", as EIO would) is as good as none, for the reads and for the
write-back, so only the snapshot naming it is dropped and the start goes on. The whole start on
a real controller process: tests/cluster/test_blocks_cluster.py."""

from __future__ import annotations

import random

from snapmesh.protocol import blocks
from snapmesh.services.controller import process
from snapmesh.services.controller.store import SnapshotStore

B = blocks.BLOCK_BYTES


def unreadable_store(tmp_path) -> tuple[SnapshotStore, bytes, dict[bytes, bytes]]:
    """A store with two blocks to write back, the first of which has a file that cannot be opened."""
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    carried = {blocks.block_hash(block): block for block in (random.Random(i).randbytes(B) for i in range(2))}
    bad = next(iter(carried))
    store.blocks.directory.mkdir(parents=True)
    store.blocks.path(bad).symlink_to(bad.hex())  # open and stat fail with ELOOP
    return store, bad, carried


def test_an_unreadable_block_reads_as_none_at_the_replay(tmp_path):
    store, bad, _ = unreadable_store(tmp_path)
    assert process._stored_block(store, bad) is None
    assert process._checked_block(store, bad) is None


def test_the_write_back_writes_an_unreadable_block_again_in_its_place(tmp_path):
    store, bad, carried = unreadable_store(tmp_path)  # blockdir.py D11: the rename replaces the link
    assert process._written_back(store, carried) == (2, [])
    assert all(store.blocks.path(name).read_bytes() == block for name, block in carried.items())


def test_the_write_back_writes_every_other_block_and_names_the_one_it_cannot(tmp_path):
    store, bad, carried = unreadable_store(tmp_path)
    store.blocks.path(bad).unlink()
    store.blocks.path(bad).mkdir()  # no rename can put a file in its place
    written, warnings = process._written_back(store, carried)
    assert written == 1 and len(warnings) == 1 and bad.hex() in warnings[0], warnings
    (good, block), = [(name, block) for name, block in carried.items() if name != bad]
    assert store.blocks.path(good).read_bytes() == block
