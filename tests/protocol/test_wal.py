"""snapmesh/protocol/wal.py: the one definition of the log record."""

from __future__ import annotations

import json

import pytest

from snapmesh.protocol import wal

SAMPLES = [
    wal.Init(lsn=1, app="kv", version=2, state="c3RhdGU="),
    wal.Restart(lsn=2),
    wal.Send(lsn=3, msg_id='p"1:p2:1', src='p"1', dst="p2", seq=1, payload="eA=="),
    wal.Send(lsn=4, msg_id='p"1:p2:2', src='p"1', dst="p2", seq=2, request_id="r-1", payload=""),
    wal.Send(lsn=5, msg_id="custom", src='p"1', dst="p2", seq=3, payload="eQ=="),
    wal.Recv(lsn=6, msg_id='p2:p"1:1', src="p2", dst='p"1', seq=1, payload=""),
    wal.Recv(lsn=7, msg_id="custom id", src="p2", dst='p"1', seq=2, payload="eA=="),
    wal.Cut(lsn=8, snapshot_id='s"1', digest="ab" * 32),
    wal.MarkerSent(lsn=9, snapshot_id='s"1', src='p"1', dst="p2", seq=4),
    wal.MarkerRecv(lsn=10, snapshot_id='s"1', src="p2", dst='p"1', seq=3),
    wal.Abort(lsn=11, snapshot_id="s2", reason="deadline: p3 did not report"),
    wal.Checkpoint(
        lsn=12, next_seq={"p2": 5}, acked={"p2": 2}, received={"p2": 3},
        outbox={"p2": [[3, 0, "", "eA=="], [4, 0, 's"1']]}, abandoned=['s"1', "s2"], requests={}, app="kv",
    ),
    wal.Restore(lsn=13, snapshot_id='s"1', epoch=2, deliveries=1, state=""),
    wal.Replay(lsn=14, snapshot_id='s"1', msg_id="p2:p\"1:1", src="p2", dst='p"1', seq=1, payload=""),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: f"{type(r).KIND}-{r.lsn}")
def test_every_kind_round_trips_and_the_fast_encoder_writes_the_same_bytes(record: wal.Record) -> None:
    line = wal.encode(record, 'p"1')
    assert line.endswith("}\n") and line.count("\n") == 1
    raw = json.loads(line)
    assert list(raw)[:3] == ["node", "lsn", "kind"] and raw["kind"] == type(record).KIND
    assert wal.APP_MARKS.get(raw["kind"], "kind") in raw  # the mark is written, even empty
    assert wal.parse(line, "f:1", node_id='p"1') == record
    assert wal.Encoder('p"1').record(record) == line


def test_spec_is_data_every_kind_with_ordered_typed_fields() -> None:
    assert set(wal.SPEC) == wal.KINDS
    assert wal.SPEC["send"] == (
        ("msg_id", str, True), ("src", str, True), ("dst", str, True), ("seq", int, True),
        ("request_id", str, False), ("payload", str, False), ("command", str, False), ("reply", str, False),
    )
    assert wal.SPEC["restart"] == ()
    assert wal.SPEC["checkpoint"][0] == ("next_seq", dict, True)


def test_an_empty_request_id_is_left_out() -> None:
    assert "request_id" not in wal.encode(SAMPLES[2], 'p"1')
    assert '"request_id":"r-1"' in wal.encode(SAMPLES[3], 'p"1')


@pytest.mark.parametrize("kind", sorted(wal.APP_MARKS))
def test_a_line_without_its_kinds_mark_is_older_its_fields_kept(kind: str) -> None:
    # The framework reads none of an older format's fields; its app's reader gets them all, in order.
    line = f'{{"node":"p1","lsn":3,"kind":"{kind}","balance":7,"extra":[1]}}\n'
    record = wal.parse(line, "f:3", node_id="p1")
    assert record == wal.Older(lsn=3, kind=kind, fields={"balance": 7, "extra": [1]})
    assert wal.older_format(record) and not wal.older_format(SAMPLES[0])
    assert wal.encode(record, "p1") == line


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("nope", "not a JSON record"),
        ("[1]", "not a JSON object"),
        ('{"node":"p9","lsn":1,"kind":"restart"}', "record of node 'p9'"),
        ('{"node":"p1","lsn":0,"kind":"restart"}', "lsn must be a positive integer"),
        ('{"node":"p1","lsn":true,"kind":"restart"}', "lsn must be a positive integer"),
        ('{"node":"p1","lsn":2}', "record without a kind"),
        ('{"node":"p1","lsn":2,"kind":"init","app":1}', "init record needs a string 'app'"),
        ('{"node":"p1","lsn":2,"kind":"cut","snapshot_id":5,"digest":""}', "cut record needs a string 'snapshot_id'"),
        ('{"node":"p1","lsn":2,"kind":"send","src":"p1","dst":"p2","seq":1,"payload":""}',
         "send record needs a string 'msg_id'"),
        ('{"node":"p1","lsn":2,"kind":"recv","msg_id":"m","src":"p2","dst":"p1","seq":0,"payload":""}',
         "recv seq must be >= 1"),
    ],
)
def test_a_corrupt_record_names_file_and_line(line: str, problem: str) -> None:
    with pytest.raises(wal.CorruptRecord) as info:
        wal.parse(line, "data/p1.log.jsonl:7", node_id="p1")
    assert str(info.value).startswith("data/p1.log.jsonl:7: ")
    assert problem in str(info.value)


def test_an_unknown_kind_parses_as_unknown_so_readers_skip_it() -> None:
    record = wal.parse('{"node":"p1","lsn":4,"kind":"future","x":1}', "f:4", node_id="p1")
    assert record == wal.Unknown(lsn=4, kind="future")


def test_split_lines_finds_a_torn_tail() -> None:
    lines, torn = wal.split_lines(b"a\nb\nhalf", "f")
    assert lines == [("f:1", b"a"), ("f:2", b"b")] and torn == 4
    assert wal.split_lines(b"a\n", "f") == ([("f:1", b"a")], None)


def test_segment_names() -> None:
    assert wal.active_name("p1") == "p1.log.jsonl"
    assert wal.sealed_name("p1", 1234) == "p1.log.000000001234.jsonl"
    assert wal.sealed_first_lsn("p1.log.000000001234.jsonl", "p1") == 1234
    assert wal.sealed_first_lsn("p1.log.jsonl", "p1") is None
    assert wal.sealed_first_lsn("p2.log.000000001234.jsonl", "p1") is None
