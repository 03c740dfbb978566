"""The pure half: ReportStateChunks' bytes in flight are bounded per peer and in all."""

from __future__ import annotations

import pytest

from snapmesh.protocol import chunking


def test_a_peer_past_its_bound_is_refused_and_takes_nothing() -> None:
    budget = chunking.ChunkBudget(per_peer=10, total=25)
    budget.take("p1", 6)
    with pytest.raises(chunking.Busy, match="p1 already has 6 bytes"):
        budget.take("p1", 5)
    assert budget.held == 6 and budget.peer_bytes("p1") == 6
    budget.take("p2", 10)
    budget.take("p3", 9)
    with pytest.raises(chunking.Busy, match="25"):  # p4 has nothing in flight, but all together are full
        budget.take("p4", 1)
    budget.give_back("p1", 6)
    budget.take("p4", 1)
    assert budget.held == 20 and budget.peer_bytes("p1") == 0


def test_the_defaults_bound_the_controller_below_what_the_review_saw() -> None:
    budget = chunking.ChunkBudget()
    assert budget.per_peer == chunking.MAX_STATE_BYTES and budget.total < 1024 * 1024 * 1024
