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


def test_the_bytes_are_charged_to_the_node_the_certificate_names_or_to_the_address() -> None:
    assert chunking.charged_peer(None, ["p1"], "ipv4:127.0.0.1:5000") == "ipv4:127.0.0.1"
    assert chunking.charged_peer({"p2", "host", "p1"}, ["p1", "p2", "p3"], "ipv4:10.0.0.1:1") == "p1"
    with pytest.raises(chunking.NotANode, match="the peer's certificate names client, not a node") as refused:
        chunking.charged_peer({"client"}, ["p1"], "ipv4:10.0.0.1:1")
    assert refused.value.code == "PERMISSION_DENIED"
    with pytest.raises(chunking.NotANode, match="names nothing"):
        chunking.charged_peer(set(), ["p1"], "")


def test_an_assembler_takes_each_chunk_from_the_budget_and_releases_what_it_held() -> None:
    budget = chunking.ChunkBudget(per_peer=10, total=100)
    state = chunking.StateAssembler(budget=budget, peer="p1")
    state.add(chunking.pb.FullStateChunk(data=b"x" * 6))
    with pytest.raises(chunking.Busy) as busy:
        state.add(chunking.pb.FullStateChunk(data=b"x" * 5))  # past p1's bound: taken nowhere
    assert busy.value.code == "RESOURCE_EXHAUSTED" and budget.peer_bytes("p1") == 6
    state.release()
    assert budget.held == 0 and budget.peer_bytes("p1") == 0
    assert {chunking.BadChunks.code, chunking.StateTooLarge.code} == {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}
