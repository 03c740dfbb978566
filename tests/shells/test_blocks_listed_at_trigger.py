"""The controller lists its blocks directory as a snapshot starts, not on its first report's
path (blockdir.py D5, engine.py `_list_blocks`): an in-process engine on a real block store.
A block file deleted behind the controller's back between two snapshots is known gone once
the second is triggered, before any node has reported to it; the report of the first still
lists it (as D5 did: the listing of the first snapshot)."""

from __future__ import annotations

import asyncio

import pytest

from snapmesh.protocol import blocks
from support.controller_fakes import blob_controller

pytestmark = [pytest.mark.timeout(60)]


def test_a_block_lost_between_snapshots_is_noticed_as_the_next_one_starts(tmp_path) -> None:
    asyncio.run(_noticed(tmp_path))


async def _noticed(tmp_path) -> None:
    c = blob_controller(tmp_path)
    engine, store, writer, journal = c.engine, c.store, c.writer, c.journal
    try:
        kept, lost = b"k" * blocks.BLOCK_BYTES, b"l" * blocks.BLOCK_BYTES
        store.blocks.write({blocks.block_hash(kept): kept, blocks.block_hash(lost): lost})
        first = (await engine.trigger("a")).snapshot_id
        await _listed(store, first)
        assert store.blocks.holds(blocks.block_hash(lost))

        store.blocks.path(blocks.block_hash(lost)).unlink()  # behind the controller's back
        assert store.blocks.holds(blocks.block_hash(lost))  # not looked at per block (D5)
        second = (await engine.trigger("b")).snapshot_id
        await _listed(store, second)
        assert not store.blocks.holds(blocks.block_hash(lost))
        assert store.blocks.holds(blocks.block_hash(kept))
    finally:
        await engine.close()
        await journal.close()
        writer.close()


async def _listed(store, snapshot_id: str) -> None:
    """Wait (bounded) until the directory was listed for `snapshot_id`, with no report made."""
    for _ in range(200):
        if store.blocks._listed_for == snapshot_id:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the blocks directory was not listed for {snapshot_id} at its trigger")
