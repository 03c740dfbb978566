"""A block is used only as its name says (services/controller/blockdir.py D5): a block the
controller keeps in memory (knownblocks.py) that does not hash to its name is taken as not
kept, so a report is rebuilt from the block's file (hashed) or refused naming it; a file of
a block's name and size that does not hash to its name is written again, not taken."""

from __future__ import annotations

import random

from snapmesh.protocol import blocks
from snapmesh.protocol.controller.knownblocks import KnownBlocks
from snapmesh.services.controller.blockdir import BlockDir, kept_reader
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


def corrupt_kept(state: bytes) -> tuple[KnownBlocks, blocks.Named]:
    """KnownBlocks holding `state`'s names over a copy whose second block is flipped (the same size)."""
    named = blocks.names(state)[0]
    start, end = named.bounds[1]
    bad = state[:start] + bytes(b ^ 0xFF for b in state[start:end]) + state[end:]
    known = KnownBlocks()
    known.keep("p1", blocks.Named(bad, named.bounds, named.names, {}))
    return known, named


def as_blocks(named: blocks.Named) -> pb.FullState:
    sent = pb.FullState(snapshot_id="s2", node_id="p1", epoch=1)
    sent.state_blocks.hashes.extend(named.names)
    return sent


def test_a_corrupt_kept_block_is_read_from_its_file_instead(tmp_path):
    state = random.Random(1).randbytes(4 * B)
    known, named = corrupt_kept(state)
    files = BlockDir(tmp_path / "blocks")
    files.write({name: state[a:b] for name, (a, b) in zip(named.names, named.bounds, strict=True)})
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files))
    assert missing == [] and whole.state == state  # the kept copy's flipped block is not in it


def test_a_corrupt_kept_block_whose_file_is_corrupt_too_is_named_missing(tmp_path):
    state = random.Random(2).randbytes(4 * B)
    known, named = corrupt_kept(state)
    files = BlockDir(tmp_path / "blocks")
    files.write({name: state[a:b] for name, (a, b) in zip(named.names, named.bounds, strict=True)})
    files.path(named.names[1]).write_bytes(bytes(B))  # the same size: only its hash tells
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files))
    assert whole is None and missing == [named.names[1]]  # the report is refused naming it (MISSING)


def test_a_file_of_the_right_size_that_does_not_hash_to_its_name_is_written_again(tmp_path):
    block = random.Random(3).randbytes(B)
    name = blocks.block_hash(block)
    files = BlockDir(tmp_path / "blocks")
    files.directory.mkdir()
    files.path(name).write_bytes(bytes(B))
    assert files.write({name: block}) == (1, B)
    assert files.read(name) == block
    assert files.write({name: block}) == (0, 0)  # a sound one is taken as it is
