"""carriedblocks.py: a report's carried blocks come out of its chunk stream as they
arrive, the rest of it parsed at the end, whatever the cuts (CB1-CB3)."""

from __future__ import annotations

import random

import pytest

from snapmesh.protocol import blocks, chunking
from snapmesh.protocol.carriedblocks import CarriedBlocks
from snapmesh.v1 import snapmesh_pb2 as pb

STATE = random.Random(7).randbytes(5 * blocks.BLOCK_BYTES + 9)


def carried() -> pb.FullState:
    report = pb.FullState(snapshot_id="s1", node_id="p1", state=STATE, state_parts=[len(STATE)],
                          channels=[pb.ChannelState(src="p2", dst="p1", in_flight=[pb.InFlightTransfer(msg_id="m", seq=3)])])
    sent, _ = blocks.referenced_report(report, set(), carry_all=True)
    assert sent is not None
    return sent


@pytest.mark.parametrize("cut", [1, 7, 1000, blocks.BLOCK_BYTES + 3, 1 << 20])
def test_any_cut_gives_the_blocks_in_order_and_the_rest(cut: int) -> None:
    sent, stream = carried(), CarriedBlocks()
    data = sent.SerializeToString()
    out: list[bytes] = []
    for i in range(0, len(data), cut):
        came = stream.feed(data[i : i + cut])
        out += came
        stream.released(sum(len(b) for b in came))
        assert stream.held <= cut + blocks.BLOCK_BYTES + 400  # CB1: a block, a cut and the rest, never the whole
    rest = stream.finish()
    assert out == list(sent.blocks) and stream.carried == len(out)
    expected = pb.FullState()
    expected.CopyFrom(sent)
    expected.ClearField("blocks")
    assert rest == expected and stream.header.snapshot_id == "s1" and stream.header.node_id == "p1"


def test_the_rest_is_bounded_not_the_blocks() -> None:
    sent = carried()
    stream = CarriedBlocks(max_bytes=2 * blocks.BLOCK_BYTES)
    stream.feed(sent.SerializeToString())  # 5 blocks carried, within a bound of 2: taken
    whole = pb.FullState(snapshot_id="s1", node_id="p1", state=STATE)
    with pytest.raises(chunking.StateTooLarge):
        CarriedBlocks(max_bytes=2 * blocks.BLOCK_BYTES).feed(whole.SerializeToString())


def test_what_is_no_report_is_refused() -> None:
    big = pb.FullState(snapshot_id="s1", node_id="p1", blocks=[bytes(blocks.BLOCK_BYTES + 1)])
    with pytest.raises(chunking.BadChunks, match="at most"):  # CB2
        CarriedBlocks().feed(big.SerializeToString())
    with pytest.raises(chunking.BadChunks, match="before"):  # CB3: a block of no report
        CarriedBlocks().feed(pb.FullState(blocks=[b"x"]).SerializeToString())
    cut = CarriedBlocks()
    cut.feed(carried().SerializeToString()[:-3])
    with pytest.raises(chunking.BadChunks, match="into a field"):
        cut.finish()
    with pytest.raises(chunking.BadChunks, match="wire type"):
        CarriedBlocks().feed(bytes([0x0B]))  # field 1, a group


def test_a_report_must_end_as_it_began() -> None:
    """CB3: the blocks written were pinned for the snapshot the report named first."""
    head = pb.FullState(snapshot_id="s1", node_id="p1", blocks=[b"x"]).SerializeToString()
    moved = CarriedBlocks()
    moved.feed(head + pb.FullState(snapshot_id="s2", state_blocks=pb.StateBlocks(hashes=[b"h"])).SerializeToString())
    with pytest.raises(chunking.BadChunks, match="changed"):
        moved.finish()
    bare = CarriedBlocks()
    bare.feed(head)
    with pytest.raises(chunking.BadChunks, match="no manifest"):
        bare.finish()
