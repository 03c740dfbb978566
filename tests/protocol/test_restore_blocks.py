"""A restore's state as blocks (snapmesh/protocol/restoreblocks.py RB1-RB3): the manifest
and only the blocks the node's last report lacked; rebuilt byte for byte from them and
the node's own, each checked; a block found in neither, or a digest that does not
match, is named and nothing is rebuilt."""

from __future__ import annotations

import random

from snapmesh.protocol import blocks, restoreblocks
from snapmesh.protocol.appstate import digest
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES
MIB = 1 << 20


def request(state: bytes) -> pb.RestoreStateRequest:
    return pb.RestoreStateRequest(snapshot_id="s1", epoch=3, state=state)


def test_a_16_mib_state_one_block_from_the_last_report_sends_one_block_and_rebuilds_it_byte_for_byte():
    restored = random.Random(1).randbytes(16 * MIB)  # the snapshot's state
    reported = restored[: 100 * B + 7] + b"!" + restored[100 * B + 8 :]  # the node's last report: one block changed
    held = blocks.names(reported)[0]
    sent, names = restoreblocks.referenced_restore(request(restored), set(held.names))
    assert sent is not None and not sent.HasField("state")
    assert list(sent.blocks) == [restored[100 * B : 101 * B]]
    assert names == list(sent.state_blocks.hashes) and len(names) == 2048
    # one block and the manifest (32 bytes a block, 0.4% of the state): under 1% of it
    assert sent.ByteSize() < B + 2048 * 40 < 16 * MIB // 100
    named, why = restoreblocks.whole_restore(sent, restoreblocks.reader(held))
    assert why == "" and named is not None and named.state == restored
    assert named.names == names and named.bounds[1] == (B, 2 * B)


def test_a_node_that_holds_nothing_of_it_names_the_missing_blocks_and_rebuilds_nothing():
    state = random.Random(2).randbytes(5 * B)
    held = blocks.names(state)[0]
    changed = state[: 3 * B] + b"x" * B + state[4 * B :]
    sent, _ = restoreblocks.referenced_restore(request(changed), set(held.names))
    assert sent is not None and len(sent.blocks) == 1
    named, why = restoreblocks.whole_restore(sent, restoreblocks.reader())  # restarted: nothing held
    assert named is None and why.startswith(blocks.MISSING)
    assert why.startswith(f"{blocks.MISSING}: 4 of the state of snapshot s1")
    assert f"sha256:{held.names[0].hex()}" in why


def test_a_state_whose_digest_does_not_match_is_refused():
    state = random.Random(3).randbytes(3 * B)
    held = blocks.names(state)[0]
    sent, _ = restoreblocks.referenced_restore(request(state), set(held.names[:1]))
    assert sent is not None and sent.state_digest == digest(state)
    sent.state_digest = digest(b"another")
    named, why = restoreblocks.whole_restore(sent, restoreblocks.reader(held))
    assert named is None and why.startswith(blocks.MISSING) and digest(state) in why


def test_a_block_carried_is_checked_against_its_name():
    state = random.Random(4).randbytes(2 * B)
    held = blocks.names(state[:B])[0]
    sent, _ = restoreblocks.referenced_restore(request(state), set(held.names))
    assert sent is not None and list(sent.blocks) == [state[B:]]
    sent.blocks[0] = b"y" * B  # not the block its name says: as good as none
    named, why = restoreblocks.whole_restore(sent, restoreblocks.reader(held))
    assert named is None and f"sha256:{blocks.block_hash(state[B:]).hex()}" in why


def test_a_state_goes_whole_when_none_of_its_blocks_is_held_or_there_is_none():
    state = random.Random(5).randbytes(2 * B)
    assert restoreblocks.referenced_restore(request(state), set())[0] is None
    assert restoreblocks.referenced_restore(request(state), {b"\1" * 32})[0] is None
    assert restoreblocks.referenced_restore(pb.RestoreStateRequest(snapshot_id="s1", epoch=3), {b"\1" * 32}) == (None, [])


def test_the_state_is_cut_as_the_last_report_was_so_a_part_that_grew_moves_no_block_after_it():
    first, second = random.Random(6).randbytes(3 * B + 10), random.Random(7).randbytes(4 * B)
    reported = blocks.names(first + second, (len(first), len(second)))[0]
    grown = first + b"z" * 100 + second  # the first part grew: the second one's blocks moved
    parts = (len(first) + 100, len(second))
    sent, _ = restoreblocks.referenced_restore(request(grown), set(reported.names), parts)
    assert sent is not None and len(sent.blocks) == 1  # the first part's last block only
    named, _ = restoreblocks.whole_restore(sent, restoreblocks.reader(reported))
    assert named is not None and named.state == grown
    # the plain grid (parts that do not add up): every block after the growth is new
    sent, _ = restoreblocks.referenced_restore(request(grown), set(reported.names), (1, 2))
    assert sent is not None and len(sent.blocks) == 5
