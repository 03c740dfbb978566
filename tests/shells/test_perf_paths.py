"""Work per event that must not grow with history, and the batch
path that must answer exactly as the per-transfer one did."""

from __future__ import annotations

from snapmesh.sim.retention import due as past_retention  # the fuzzer's own statement of the rule
from snapmesh.protocol.controller.tracker import Now, Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

NODES = ("p1", "p2")


def _tracker_with(finished: int) -> Tracker:
    t = bank.tracker(Topology.build(NODES, None), expected_total=200, deadline_s=5)
    for i in range(finished):
        sid = f"s{i:04d}"
        t.start(sid, "p1", Now(float(i), 1000.0 + i))
        if i % 3 == 2:
            t.fail(sid, "a node was away", Now(i + 0.5, 1000.5 + i))
        else:
            for node, src in (("p1", "p2"), ("p2", "p1")):
                t.report(bank.report(sid, node, 100,
                                     channels=[pb.ChannelState(src=src, dst=node)]), Now(i + 0.5, 1000.5 + i))
    t.start("running", "p2", Now(99.0, 2000.0))
    return t


def test_retention_scans_the_finished_snapshots_themselves_and_decides_as_before():
    t = _tracker_with(30)
    finished = t.finished()
    assert len(finished) == 30 and all(s.status != pb.Snapshot.IN_PROGRESS for s in finished)
    assert finished[0] is t.finished()[0]  # the tracker's own objects: no copy per COMPLETE
    for keep in (1, 5, 19, 20, 40):
        for protect in ("", "s0001"):
            assert past_retention(finished, keep, protect) == past_retention(t.all(), keep, protect)
    assert past_retention(finished, 5)  # something does go


def test_the_fast_record_constructors_make_the_very_records_the_dataclasses_make():
    import dataclasses
    import random

    import pytest

    from snapmesh.protocol import fastrecords, wal

    rng = random.Random(23)
    encoder = wal.Encoder("p1")
    for _ in range(2_000):
        lsn, seq, payload = rng.randrange(1, 10**12), rng.randrange(1, 10**9), wal.pack(b"%d" % rng.randrange(10**6))
        src, dst = rng.choice(["p1", "p2", "n-ü", 'q"x']), rng.choice(["p1", "p3", "z\\y"])
        msg_id = f"{src}:{dst}:{seq}" if rng.random() < 0.8 else f"m{rng.random()}"
        request_id = rng.choice(["", "", f"r{rng.randrange(10**6)}"])
        fast = fastrecords.send_record(lsn, msg_id, src, dst, seq, request_id, payload)
        slow = wal.Send(lsn=lsn, msg_id=msg_id, src=src, dst=dst, seq=seq, request_id=request_id, payload=payload)
        assert type(fast) is wal.Send and fast == slow and hash(fast) == hash(slow)
        assert encoder.record(fast) == wal.encode(slow, "p1")
        fast_r = fastrecords.recv_record(lsn, msg_id, src, dst, seq, payload)
        slow_r = wal.Recv(lsn=lsn, msg_id=msg_id, src=src, dst=dst, seq=seq, payload=payload)
        assert type(fast_r) is wal.Recv and fast_r == slow_r and encoder.record(fast_r) == wal.encode(slow_r, "p1")
    assert fastrecords.send_record(1, "a:b:1", "a", "b", 1) == wal.Send(lsn=1, msg_id="a:b:1", src="a", dst="b", seq=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seq = 1  # still immutable


def test_an_apps_records_made_and_encoded_fast_are_the_very_records_and_lines_of_the_dataclasses():
    import random

    from snapmesh.protocol import fastrecords, wal

    rng = random.Random(29)
    encoder = wal.Encoder("p1")
    texts = ["", "", "eA==", "r-1", 'q"x', "z\\y", "n-ü", "tab\there", "\x7f", "a" * 300]
    for _ in range(2_000):
        lsn, seq = rng.randrange(1, 10**12), rng.randrange(1, 10**9)
        src, dst = rng.choice(["p1", "p2", "n-ü"]), rng.choice(["p1", "p3", 'q"x'])
        msg_id = f"{src}:{dst}:{seq}" if rng.random() < 0.8 else rng.choice(texts)
        request_id, payload, command, reply = (rng.choice(texts) for _ in range(4))
        fast = fastrecords.send_record(lsn, msg_id, src, dst, seq, request_id, payload)
        slow = wal.Send(lsn=lsn, msg_id=msg_id, src=src, dst=dst, seq=seq, request_id=request_id, payload=payload)
        assert type(fast) is wal.Send and fast == slow and encoder.record(fast) == wal.encode(slow, "p1")
        fast_r = fastrecords.recv_record(lsn, msg_id, src, dst, seq, payload)
        slow_r = wal.Recv(lsn=lsn, msg_id=msg_id, src=src, dst=dst, seq=seq, payload=payload)
        assert type(fast_r) is wal.Recv and fast_r == slow_r and encoder.record(fast_r) == wal.encode(slow_r, "p1")
        fast_c = fastrecords.command_record(lsn, request_id, command, reply)
        slow_c = wal.Command(lsn=lsn, request_id=request_id, command=command, reply=reply)
        assert type(fast_c) is wal.Command and fast_c == slow_c and encoder.record(fast_c) == wal.encode(slow_c, "p1")
        assert wal.parse(encoder.record(fast_c), "here") == slow_c
    assert fastrecords.command_record(3) == wal.Command(lsn=3)  # the defaults, as the dataclass's
    assert wal.pack(b"\x00\xffx") == "AP94" and wal.unpack(wal.pack(b"abc"), "here") == b"abc"


def test_the_edge_makes_the_very_reply_the_dataclass_makes():
    import dataclasses

    import pytest

    from snapmesh.app import Reply
    from snapmesh.protocol.node.effects import Submitted
    from snapmesh.services.node.edge import _reply

    for answer, epoch in ((Submitted(b"r", 5, False, 3, (), 2), 2), (Submitted(b"", 9, True, 4), 4)):
        fast = _reply(answer)
        assert type(fast) is Reply and fast == Reply(answer.reply, answer.repeated, epoch) and hash(fast) == hash(
            Reply(answer.reply, answer.repeated, epoch))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.epoch = 1  # still immutable
