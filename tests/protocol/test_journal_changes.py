"""Reports journaled as their manifest's change (snapmesh/protocol/controller/journalchanges.py
JC1-JC3): read back with their full manifests, and written whole by a rewrite."""

from __future__ import annotations

import hashlib
import random

from snapmesh.protocol import blocks, manifestdelta
from snapmesh.protocol.controller import journal, journalchanges
from snapmesh.protocol.controller.journal import LiveFrames, Reported
from snapmesh.v1 import snapmesh_pb2 as pb


def _name(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def _as_blocks(sid: str, names: list[bytes], node: str = "p1") -> Reported:
    sent = pb.FullState(snapshot_id=sid, node_id=node, state_digest="sha256:d")
    sent.state_blocks.hashes.extend(names)
    return Reported(state=sent, wall=1.0, sent=sent)


def _as_change(sid: str, base_sid: str, base: list[bytes], names: list[bytes], node: str = "p1") -> Reported:
    sent = pb.FullState(snapshot_id=sid, node_id=node, state_digest="sha256:d")
    sent.state_change.CopyFrom(manifestdelta.change(base_sid, base, names))
    sent.blocks.append(b"a carried block")
    held = pb.FullState(snapshot_id=sid, node_id=node)  # as the controller holds it: listed
    held.state_blocks.hashes.extend(names)
    return Reported(state=held, wall=2.0, sent=sent)


def _decoded(records: list[Reported]) -> list[journal.Record]:
    got, _, problem = journal.decode_all(b"".join(journal.encode(r) for r in records))
    assert problem is None
    return got


def _manifests(records) -> list[tuple[str, str, list[bytes]]]:
    return [(r.state.node_id, r.snapshot_id, list(r.sent.state_blocks.hashes)) for r in records]


def test_a_chain_of_changes_reads_back_as_the_manifests_the_nodes_sent_in_journal_order():
    rng = random.Random(11)
    print("seed 11")
    s1 = [_name(rng.randrange(1000)) for _ in range(40)]
    s2 = list(s1)
    s2[3] = _name(-3)
    s3 = s2[:30] + [_name(-4)]
    other = [_name(-9)]
    records = [_as_blocks("s1", s1), _as_blocks("s1", other, node="p2"), _as_change("s2", "s1", s1, s2),
               _as_change("s3", "s2", s2, s3)]
    got = _decoded(records)
    assert got[2].sent.HasField("state_change")  # journaled as it came: the change (JC1)
    whole, gone = journalchanges.expanded(got)
    assert gone == {}
    assert _manifests(whole) == [("p1", "s1", s1), ("p2", "s1", other), ("p1", "s2", s2), ("p1", "s3", s3)]
    assert list(whole[3].sent.blocks) == [b"a carried block"] and not whole[3].sent.HasField("state_change")
    assert whole[0] is got[0]  # the others as they were


def test_a_base_journaled_whole_is_cut_as_its_node_cut_it():
    state = random.Random(2).randbytes(3 * blocks.BLOCK_BYTES + 5)
    parts = [blocks.BLOCK_BYTES + 1, 2 * blocks.BLOCK_BYTES + 4]
    base_report = pb.FullState(snapshot_id="s1", node_id="p1", state=state, state_parts=parts)
    base = blocks.names(state, parts)[0].names
    changed = base[:-1] + [_name(5)]
    got = _decoded([Reported(state=base_report, wall=1.0), _as_change("s2", "s1", base, changed)])
    whole, gone = journalchanges.expanded(got)
    assert gone == {} and list(whole[1].sent.state_blocks.hashes) == changed


def test_a_change_whose_base_is_not_there_or_does_not_fit_drops_its_snapshot_with_one_warning():
    s1 = [_name(i) for i in range(4)]
    records = _decoded([
        _as_blocks("s1", s1), journal.Started(snapshot_id="s2", initiator="p1", wall=0.0),
        _as_change("s2", "s0", s1, s1[:2]),  # a base the journal does not hold
        _as_change("s3", "s1", s1 + [_name(9)], s1),  # a base of another length
        _as_change("s4", "s1", s1, s1[:3]),
    ])
    whole, gone = journalchanges.expanded(records)
    assert set(gone) == {"s2", "s3"}
    assert "report of p1" in gone["s2"] and "'s0'" in gone["s2"] and "does not hold" in gone["s2"]
    assert "does not fit" in gone["s3"]
    assert [r.snapshot_id for r in journalchanges.kept(whole, gone)] == ["s1", "s4"]


def test_a_rewrite_writes_each_live_change_whole_so_it_needs_no_record_it_drops():
    s1 = [_name(i) for i in range(6)]
    s2 = s1[:5] + [_name(99)]
    change = _as_change("s2", "s1", s1, s2)
    live = LiveFrames(rotate_bytes=0)
    live.take([("s1", journal.encode(_as_blocks("s1", s1))), ("s2", journal.encode(change))])
    live.take([("s1", None)])  # s1 filed: its record dead
    got = _decoded_data(live.rewritten())
    assert _manifests(got) == [("p1", "s2", s2)] and list(got[0].sent.blocks) == [b"a carried block"]  # listed
    assert live.bytes == len(live.rewritten())


def test_a_change_read_back_is_written_whole_by_the_next_rewrite():
    s1 = [_name(i) for i in range(6)]
    s2 = s1[:5] + [_name(99)]
    data = journal.encode(_as_blocks("s1", s1)) + journal.encode(_as_change("s2", "s1", s1, s2))
    records, good, _ = journal.decode_all(data)
    whole, _ = journalchanges.expanded(records)
    live = LiveFrames(rotate_bytes=0)
    live.read(data[:good], records, whole)
    live.forget("s1")
    got = _decoded_data(live.rewritten())
    assert _manifests(got) == [("p1", "s2", s2)] and list(got[0].sent.blocks) == [b"a carried block"]


def _decoded_data(data: bytes):
    got, _, problem = journal.decode_all(data)
    assert problem is None
    return got


def test_a_change_whose_base_a_rewrite_dropped_is_appended_in_full_form_with_its_blocks():
    s1 = [_name(i) for i in range(6)]
    s2 = s1[:5] + [_name(99)]
    live = LiveFrames(rotate_bytes=0)
    live.take([("s1", journal.encode(_as_blocks("s1", s1)))])
    live.take([("s1", None)])  # s1 filed
    live.rewritten()
    live.rewrote()  # the file holds nothing of s1 now
    data = live.take([("s2", journal.encode(_as_change("s2", "s1", s1, s2)))])
    got = _decoded_data(data)
    assert _manifests(got) == [("p1", "s2", s2)] and list(got[0].sent.blocks) == [b"a carried block"]
    kept = live.take([("s3", journal.encode(_as_change("s3", "s2", s2, s2)))])  # its base is in the file
    assert _decoded_data(kept)[0].sent.HasField("state_change")
