"""A state held as its blocks (snapmesh/protocol/blockstate.py BST1-BST3): read by slices as
the held-block reader and the shelf read it, and packed into a log record a run at a time."""

from __future__ import annotations

import base64
import random

import pytest

from snapmesh.protocol import wal
from snapmesh.protocol.blockstate import BlockState

SIZES = (8192, 8192, 100, 8192, 0, 5)


def _state() -> tuple[BlockState, bytes]:
    rng = random.Random(7)
    parts = [rng.randbytes(n) for n in SIZES]
    return BlockState(parts), b"".join(parts)


def test_a_slice_that_is_one_block_is_that_block_and_any_other_is_joined() -> None:
    state, joined = _state()
    assert len(state) == len(joined) and bytes(state) == joined and state == joined
    assert len(state.blocks) == 5  # the empty block dropped (BST1)
    assert state[8192:16384] is state.blocks[1]
    assert state[16384:16484] is state.blocks[2]
    for start, end in ((0, 10), (8000, 8400), (8190, 16500), (16480, len(joined)), (5, 5), (0, len(joined) + 9)):
        assert state[start:end] == joined[start:end], (start, end)
    with pytest.raises(TypeError):
        state[3]  # type: ignore[index]


@pytest.mark.parametrize("run", [3, 4096, 8190, 1 << 20])
def test_its_runs_are_the_state_in_order_and_its_packed_base64_is_the_joined_state_s(run: int) -> None:
    state, joined = _state()
    runs = [bytes(r) for r in state.runs(run)]
    assert b"".join(runs) == joined and all(len(r) == run for r in runs[:-1])
    packed = wal.Packed(state)  # type: ignore[arg-type]
    text = base64.b64encode(joined).decode()
    assert b"".join(packed.slices(run * 4 // 3)).decode() == text
    assert len(packed) == len(text) and packed == text and packed.text() == text
    assert wal.unpack(packed, "here") == joined and type(wal.unpack(packed, "here")) is bytes


def test_a_state_in_parts_is_packed_as_bytes_not_as_blocks() -> None:
    # A PartedState (an app's snapshot_blocks() joined, blocks.py B6) is a bytes subclass:
    # the node's init record of a large parted state packs it a slice at a time.
    from snapmesh.protocol.blocks import PartedState

    state = PartedState.of([random.Random(3).randbytes(5000), b"tail" * 700])
    packed = wal.Packed(state)
    assert b"".join(packed.slices(1024)) == base64.b64encode(bytes(state))
