"""An app's log records carry no tally (wal.APP_MARKS): the node writes none, and every
reader takes a missing one as 0 on an app's record only. Old logs, which wrote 0 there,
still read the same; a native record without its tally is bad input, named by file:line."""

from __future__ import annotations

import json

import pytest

import snapmesh.bank.logs as bank_logs
from snapmesh.checking import cut, node_logs
from snapmesh.bank import v1records
from snapmesh.protocol import wal
from snapmesh.trace import shiviz
from snapmesh.trace.clocks import build_trace

DIGEST = "ab" * 32
APP_RECORDS = [
    wal.Init(lsn=1, app="kvshard", version=1),
    wal.Send(lsn=2, msg_id="a:b:1", src="a", dst="b", seq=1, payload="eA=="),
    wal.Send(lsn=3, msg_id="a:b:2", src="a", dst="b", seq=2, payload=""),  # an empty message
    wal.Recv(lsn=4, msg_id="b:a:1", src="b", dst="a", seq=1, payload="eQ=="),
    wal.Cut(lsn=5, snapshot_id="s1", digest=DIGEST),
    wal.Restore(lsn=6, snapshot_id="s1", epoch=2, deliveries=1, state="c3RhdGU="),
    wal.Replay(lsn=7, snapshot_id="s1", msg_id="b:a:1", src="b", dst="a", seq=1, payload="eQ=="),
    wal.Checkpoint(lsn=8, next_seq={"b": 3}, acked={"b": 2}, received={"b": 1}, outbox={"b": []},
                   abandoned=[], requests={}, state="c3RhdGU=", app="kvshard", version=1),
]
TALLY_KEYS = {"balance", "amount"}


def old_line(record: wal.Record, node: str = "a") -> str:
    """The line a node wrote before: the app's record with its tally's 0."""
    raw = json.loads(wal.encode(record, node))
    if record.KIND in bank_logs.TALLY_KEYS:
        raw[bank_logs.TALLY_KEYS[record.KIND]] = 0
    return json.dumps(raw) + "\n"


@pytest.mark.parametrize("record", APP_RECORDS, ids=lambda r: r.KIND + str(r.lsn))
def test_an_apps_record_is_written_without_its_tally_and_reads_back_the_same(record):
    line = wal.encode(record, "a")
    assert TALLY_KEYS.isdisjoint(json.loads(line)), line
    assert wal.Encoder("a").record(record) == line  # the hot path writes the same bytes
    assert wal.parse(line, "f:1", node_id="a") == record
    assert wal.parse(old_line(record), "f:1", node_id="a") == record  # an old log's zeros


@pytest.mark.parametrize("record", [
    v1records.Init(lsn=1), v1records.Cut(lsn=2, snapshot_id="s1"),
    v1records.Restore(lsn=3, snapshot_id="s1", epoch=2, deliveries=0),
    v1records.Init(lsn=4, tally=5),
    v1records.Send(lsn=5, msg_id="a:b:1", src="a", dst="b", seq=1, tally=3),
], ids=lambda r: r.KIND + str(r.lsn))
def test_a_native_record_keeps_its_tally_even_at_zero(record):
    line = wal.encode(record, "a")
    assert bank_logs.TALLY_KEYS[record.KIND] in json.loads(line), line
    assert wal.Encoder("a").record(record) == line
    assert v1records.parse(line, "f:1", node_id="a") == record


@pytest.mark.parametrize("line, key", [
    ('{"node":"a","lsn":1,"kind":"init"}', "balance"),
    ('{"node":"a","lsn":1,"kind":"cut","snapshot_id":"s1"}', "balance"),
    ('{"node":"a","lsn":1,"kind":"send","msg_id":"a:b:1","src":"a","dst":"b","seq":1}', "amount"),
    ('{"node":"a","lsn":1,"kind":"restore","snapshot_id":"s1","epoch":2,"deliveries":0}', "balance"),
])
def test_a_native_record_without_its_tally_is_bad_input_named_by_file_and_line(tmp_path, line, key):
    with pytest.raises(wal.CorruptRecord, match=rf"^f:3: \w+ record needs '{key}' \(the bank's v1 format\)$"):
        v1records.parse(line, "f:3", node_id="a")
    # The bank's reader of log lines as dicts (the checkers' part) says the same, naming where.
    with pytest.raises(wal.CorruptRecord, match=rf"^f:3: .*{key}"):
        bank_logs.tally_of(json.loads(line), "f:3")


def write_log(tmp_path, lines_of: dict[str, list[str]]) -> None:
    for node, lines in lines_of.items():
        (tmp_path / wal.active_name(node)).write_text("".join(lines))


def two_app_nodes(old: bool) -> dict[str, list[str]]:
    """Two app nodes, a sending to b, a cut at each: in the new shape or the old (zeros)."""
    line = old_line if old else wal.encode
    a = [wal.Init(lsn=1, app="kvshard", version=1),
         wal.Send(lsn=2, msg_id="a:b:1", src="a", dst="b", seq=1, payload="eA=="),
         wal.Cut(lsn=3, snapshot_id="s1", digest=DIGEST),
         wal.MarkerSent(lsn=4, snapshot_id="s1", src="a", dst="b", seq=2)]
    b = [wal.Init(lsn=1, app="kvshard", version=1),
         wal.Recv(lsn=2, msg_id="a:b:1", src="a", dst="b", seq=1, payload="eA=="),
         wal.MarkerRecv(lsn=3, snapshot_id="s1", src="a", dst="b", seq=2),
         wal.Cut(lsn=4, snapshot_id="s1", digest=DIGEST)]
    return {"a": [line(r, "a") for r in a], "b": [line(r, "b") for r in b]}


@pytest.mark.parametrize("old", [False, True], ids=["new", "old zeros"])
def test_the_log_readers_read_an_apps_log_with_or_without_the_zeros(tmp_path, old):
    write_log(tmp_path, two_app_nodes(old))
    logs = node_logs.read_logs(tmp_path)
    assert old or not any(TALLY_KEYS & set(r) for records in logs.values() for r in records), logs
    events = node_logs.log_events(logs, bank_logs)
    assert [e.get("balance", e.get("amount")) for e in events if e["event"] in ("node", "send", "receive", "cut")] \
        == [0] * 6, events
    read = {node: [cut.record(r, node) for r in records] for node, records in logs.items()}
    assert read["a"][1] == wal.Send(lsn=2, msg_id="a:b:1", src="a", dst="b", seq=1, payload="eA==")
    assert read["b"][3] == wal.Cut(lsn=4, snapshot_id="s1", digest=DIGEST)
    trace = build_trace(logs)
    assert [m.amount for m in trace.messages if m.kind == "transfer"] == [None]  # an app's message: no amount
    said = "\n".join(shiviz.describe(e) for e in trace.events)
    assert "balance" not in said and "amount" not in said and "None" not in said, said


def test_log_events_names_a_native_record_without_its_tally():
    with pytest.raises(node_logs.LogReadError, match=r"^a's log, lsn 1: init record needs an integer 'balance'$"):
        node_logs.log_events({"a": [{"node": "a", "lsn": 1, "kind": "init"}]}, bank_logs)
