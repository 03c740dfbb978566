"""`snapmesh.protocol.overtake.merge` (O3), which the simulator and the controller both use
to assemble a channel in overtake mode, against its definition on random inputs:
every seq the receiver recorded or the sender's outbox holds past the receiver's
position, once, in seq order. A failure prints the seed that reproduces it."""

from __future__ import annotations

import random

import pytest

from snapmesh.protocol.node.core import Transfer
from snapmesh.protocol.overtake import merge


@pytest.mark.parametrize("seed", range(300))
def test_merge_is_the_union_past_the_position_one_per_seq_in_order(seed: int) -> None:
    rng = random.Random(seed)
    position = rng.randint(0, 20)
    first = position + 1 if rng.random() < 0.6 else rng.randint(0, 30)
    held = list(range(first, first + rng.randint(0, 12)))
    if rng.random() < 0.3:
        held = sorted(rng.sample(held, len(held) // 2 + 1)) if held else held  # gaps: the set path
    recorded = [Transfer(msg_id=f"a:b:{q}", seq=q, payload=b"%d" % q) for q in held]
    if rng.random() < 0.2:
        rng.shuffle(recorded)  # out of order: still assembled in seq order
    outbox_seqs = sorted(rng.sample(range(1, 40), rng.randint(0, 15)))
    got = merge(recorded, outbox_seqs, position, lambda q: Transfer(msg_id=f"a:b:{q}", seq=q, payload=b"%d" % q))
    expected = sorted({t.seq for t in recorded} | {q for q in outbox_seqs if q > position})
    assert [t.seq for t in got] == expected, f"seed {seed}"
    assert all(t.msg_id == f"a:b:{t.seq}" and t.payload == b"%d" % t.seq for t in got), f"seed {seed}"
