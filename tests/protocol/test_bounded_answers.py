"""Bounded answers (snapmesh/protocol/controller/answers.py), without a server: small
states are answered as they are held (BA1); past the limit every state is left out
with its size and digest (BA2); an answer that must fit loses its in-flight lists
too (BA4); the held snapshot never changes; a ListSnapshots page leaves states out
the same way; the cluster file names the limit."""

from __future__ import annotations

import hashlib

import pytest

from snapmesh.protocol.controller import answers, listing
from snapmesh.settings import config
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb

MiB = 1024 * 1024


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def app_snapshot(sid: str = "s1", sizes: tuple[int, ...] = (10, 20), in_flight: int = 0) -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id=sid, status=pb.Snapshot.COMPLETE, conserved=True, app=pb.AppCheck(spec="m:app"))
    for i, size in enumerate(sizes):
        state = bytes([i + 1]) * size
        snapshot.nodes.add(node_id=f"p{i + 1}", state=state, state_digest=digest(state))
    channel = snapshot.channels.add(src="p1", dst="p2")
    if in_flight:
        channel.in_flight.add(msg_id="p1:p2:1", seq=1, payload=b"m" * in_flight)
    return snapshot


def test_small_states_are_answered_as_held_the_same_message() -> None:
    held = app_snapshot(sizes=(1000, 2000))
    assert answers.bounded(held, state_bytes=3000) is held  # BA1: not even a copy


def test_past_the_limit_every_state_is_left_out_with_its_size_and_digest() -> None:
    held = app_snapshot(sizes=(2 * MiB, 3 * MiB))
    before = held.SerializeToString()
    answer = answers.bounded(held)  # 5 MiB in all, over the default 4 MiB
    assert answer.states_omitted and answer.ByteSize() < 4096
    assert [(n.node_id, n.HasField("state"), n.state_omitted, n.state_bytes) for n in answer.nodes] == [
        ("p1", False, True, 2 * MiB), ("p2", False, True, 3 * MiB)]
    assert [n.state_digest for n in answer.nodes] == [n.state_digest for n in held.nodes]
    assert answer.app == held.app and answer.channels == held.channels and not answer.in_flight_omitted
    assert held.SerializeToString() == before  # the held snapshot keeps its states


def test_the_limit_is_the_states_in_all_and_the_answer_must_fit_the_message() -> None:
    assert answers.bounded(app_snapshot(sizes=(600, 600)), state_bytes=1000).states_omitted  # each under, both over
    fits_not = app_snapshot(sizes=(3 * MiB, MiB))  # under answer_state_bytes, over one message
    assert answers.bounded(fits_not, state_bytes=8 * MiB).states_omitted


def test_an_answer_that_must_fit_leaves_in_flight_out_when_states_are_not_enough() -> None:
    held = app_snapshot(sizes=(MiB, MiB), in_flight=5 * MiB)
    answer = answers.bounded(held)
    assert answer.states_omitted and answer.in_flight_omitted and not answer.channels[0].in_flight
    assert answer.ByteSize() <= answers.DEFAULT_MAX_BYTES and len(held.channels[0].in_flight) == 1
    kept = answers.bounded(held, must_fit=False)  # GetSnapshot: refused by size instead (listing L4)
    assert kept.states_omitted and not kept.in_flight_omitted and len(kept.channels[0].in_flight) == 1


def test_a_bank_snapshot_is_never_changed() -> None:
    bank = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE, total=30, expected_total=30, conserved=True)
    bank.nodes.add(node_id="p1", balance=30)
    assert answers.bounded(bank, state_bytes=0) is bank


def test_a_page_lists_a_snapshot_whose_states_are_over_the_limit_without_them() -> None:
    page = listing.Page(listing.list_start(pb.ListSnapshotsRequest()), 0, state_bytes=MiB)
    small, large = app_snapshot("s1", sizes=(100, 100)), app_snapshot("s2", sizes=(MiB, MiB))
    assert page.offer(small) and page.offer(large)
    assert [s.states_omitted for s in page.response.snapshots] == [False, True]
    assert page.response.snapshots[0] == small and page.response.ByteSize() < 8192


def test_the_cluster_file_names_the_limit(tmp_path) -> None:
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    assert config.load(path).controller.answer_state_bytes == 4 * MiB
    text = path.read_text().replace("[controller]\n", "[controller]\nanswer_state_bytes = 1048576\n")
    path.write_text(text)
    assert config.load(path).controller.answer_state_bytes == MiB
    path.write_text(text.replace("= 1048576", "= -1"))
    with pytest.raises(config.ConfigError, match="controller.answer_state_bytes"):
        config.load(path)
