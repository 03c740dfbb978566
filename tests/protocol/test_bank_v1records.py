"""snapmesh/bank/v1records.py: the bank's native records, read from `wal.Older` and written back."""

from __future__ import annotations

import json

import pytest

from snapmesh.bank import v1records
from snapmesh.protocol import wal

SAMPLES = [
    v1records.Init(lsn=1, tally=100),
    wal.Restart(lsn=2),
    v1records.Send(lsn=3, msg_id='p"1:p2:1', src='p"1', dst="p2", seq=1, tally=7),
    v1records.Send(lsn=4, msg_id='p"1:p2:2', src='p"1', dst="p2", seq=2, tally=1, request_id="r-1"),
    v1records.Recv(lsn=6, msg_id='p2:p"1:1', src="p2", dst='p"1', seq=1, tally=3),
    v1records.Cut(lsn=8, snapshot_id='s"1', tally=96),
    wal.MarkerSent(lsn=9, snapshot_id='s"1', src='p"1', dst="p2", seq=4),
    v1records.Checkpoint(
        lsn=12, tally=96, next_seq={"p2": 5}, acked={"p2": 2}, received={"p2": 3},
        outbox={"p2": [[3, 1, ""], [4, 0, 's"1']]}, abandoned=['s"1', "s2"], requests={"r-1": ['p"1:p2:2', 99]},
        restored="s0", restored_tally=90,
    ),
    v1records.Restore(lsn=13, snapshot_id="s0", epoch=2, tally=90, deliveries=1),
    v1records.Replay(lsn=14, snapshot_id="s0", msg_id="p2:p\"1:1", src="p2", dst='p"1', seq=1, tally=6),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: f"{type(r).KIND}-{r.lsn}")
def test_a_native_record_round_trips_through_wal_as_older(record: wal.Record) -> None:
    line = v1records.encode(record, 'p"1')
    assert wal.encode(record, 'p"1') == wal.Encoder('p"1').record(record) == line
    raw = json.loads(line)
    assert wal.APP_MARKS.get(raw["kind"], "") not in raw  # no mark: the framework reads it as older
    parsed = wal.parse(line, "f:1", node_id='p"1')
    assert wal.older_format(parsed) == (type(record) in v1records.BY_KIND.values())
    assert v1records.decode(parsed, "f:1") == record == v1records.parse(line, "f:1")


def test_the_tally_keys_are_the_v1_formats() -> None:
    assert v1records.TALLY_KEYS == {"init": "balance", "checkpoint": "balance", "cut": "balance",
                                    "restore": "balance", "send": "amount", "recv": "amount", "replay": "amount"}
    line = v1records.encode(SAMPLES[2], "p1")
    assert line.index('"seq"') < line.index('"amount"')  # where the native node wrote it
    assert "request_id" not in line and '"request_id":"r-1"' in v1records.encode(SAMPLES[3], "p1")
    fast = v1records.Encoder('p"1')
    assert fast.send(3, 'p"1', "p2", 1, 7, 'p"1:p2:1') == v1records.encode(SAMPLES[2], 'p"1')
    assert fast.recv(6, "p2", 'p"1', 1, 3, 'p2:p"1:1') == v1records.encode(SAMPLES[4], 'p"1')


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"node":"p1","lsn":2,"kind":"init"}', "init record needs 'balance'"),
        ('{"node":"p1","lsn":2,"kind":"cut","snapshot_id":5,"balance":1}', "cut record needs 'snapshot_id' of type str"),
        ('{"node":"p1","lsn":2,"kind":"send","msg_id":"m","src":"p1","dst":"p2","seq":1,"amount":0}',
         "send amount must be >= 1"),
        ('{"node":"p1","lsn":2,"kind":"recv","msg_id":"m","src":"p2","dst":"p1","seq":0,"amount":1}',
         "recv seq must be >= 1"),
        ('{"node":"p1","lsn":2,"kind":"init","balance":true}', "init record needs 'balance' of type int"),
        ('{"node":"p1","lsn":2,"kind":"init","balance":1,"colour":"red"}', "unknown fields ['colour']"),
    ],
)
def test_a_bad_native_line_names_file_and_line(line: str, problem: str) -> None:
    with pytest.raises(wal.CorruptRecord) as info:
        v1records.parse(line, "data/p1.log.jsonl:7", node_id="p1")
    assert str(info.value).startswith("data/p1.log.jsonl:7: ")
    assert problem in str(info.value)


def test_a_native_record_as_the_current_kind_drops_only_the_tally() -> None:
    send = SAMPLES[3]
    assert v1records.current(send, payload="MQ==") == wal.Send(
        lsn=4, msg_id='p"1:p2:2', src='p"1', dst="p2", seq=2, request_id="r-1", payload="MQ==")
    assert v1records.current(wal.Restart(lsn=2)) == wal.Restart(lsn=2)
