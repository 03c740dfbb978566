"""A large report streamed as it is made (chunking.stream_state): the state's blocks one at
a time, never the report's whole encoding. A first report of a GiB, every block carried, was
encoded whole and then cut into chunks: two copies more of the state at the node."""

from __future__ import annotations

import random
import tracemalloc

from snapmesh.protocol import blocks, chunking
from snapmesh.protocol.carriedblocks import CarriedBlocks
from snapmesh.v1 import snapmesh_pb2 as pb

STATE = random.Random("report stream").randbytes(64 * blocks.BLOCK_BYTES + 77)
CHUNK = 16 * 1024


def _report() -> pb.FullState:
    whole = pb.FullState(snapshot_id="s1", node_id="p1", state=STATE, app_name="blob", app_version=3, epoch=2,
                         holds_blocks=True, channels=[pb.ChannelState(src="p2", dst="p1")])
    sent, _ = blocks.referenced_report(whole, set(), carry_all=True)
    assert sent is not None and len(sent.blocks) > 1
    return sent


def test_the_streamed_chunks_parse_as_the_report_and_are_as_many_as_split_states() -> None:
    sent = _report()
    chunks = list(chunking.stream_state(sent, CHUNK))
    assert all(0 < len(c.data) <= CHUNK for c in chunks)
    assert len(chunks) == len(chunking.split_state(sent, CHUNK)) == chunking.chunk_count(sent, CHUNK)
    assert pb.FullState.FromString(b"".join(c.data for c in chunks)) == sent


def test_the_controller_reads_the_stream_as_it_comes_snapshot_and_node_first() -> None:
    sent = _report()
    reader = CarriedBlocks()
    carried = []
    for chunk in chunking.stream_state(sent, CHUNK):
        carried += reader.feed(chunk.data)
    rest = reader.finish()
    assert carried == list(sent.blocks)
    assert (rest.snapshot_id, rest.node_id, list(rest.state_blocks.hashes)) == ("s1", "p1", list(sent.state_blocks.hashes))


def test_a_report_without_blocks_still_streams_and_an_empty_one_is_one_chunk() -> None:
    whole = pb.FullState(snapshot_id="s1", node_id="p1", state=STATE)
    chunks = list(chunking.stream_state(whole, CHUNK))
    assert pb.FullState.FromString(b"".join(c.data for c in chunks)) == whole
    assert [c.data for c in chunking.stream_state(pb.FullState(), CHUNK)] == [b""]


def test_streaming_holds_a_chunk_and_a_block_not_the_reports_encoding() -> None:
    sent = _report()
    tracemalloc.start()
    try:
        for _ in chunking.stream_state(sent, CHUNK):
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * (CHUNK + blocks.BLOCK_BYTES) < len(STATE) / 2, f"{peak:,} bytes held for a {len(STATE):,}-byte state"
