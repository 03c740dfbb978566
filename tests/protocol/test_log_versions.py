"""The app's name and version in a node's log, and a replay that is never silent about them.

One node, no peers, a stack app whose commands push and pop: its log is made by
the production node machine, its recovery is the production recovery
(snapmesh/protocol/node/recovery.py, and services/node/recovery.py for the
segments on disk).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapmesh.app import App
from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.effects import Append, Seal
from snapmesh.protocol.node.machine import Node
from snapmesh.services.node import recovery as disk


class Stack:
    """Pop answers the item pushed last; `sort` makes snapshot() sort the list (it then does not round-trip)."""

    sort = False
    pop_first = False  # "changed code": pop answers the oldest item

    def __init__(self, info):
        self.items: list[int] = []

    def on_command(self, command, ctx):
        if command == b"pop":
            return str(self.items.pop(0 if self.pop_first else -1) if self.items else -1).encode()
        self.items.append(int(command))
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return json.dumps(sorted(self.items) if self.sort else self.items).encode()

    def restore(self, state):
        self.items = json.loads(state)


def stack(version: int = 1, **kind) -> App:
    return App(name="stack", new=type("S", (Stack,), kind), version=version)


def write(app: App, commands: list[bytes], segments: list[list[wal.Record]] | None = None,
          segment_records: int = 10**6) -> list[list[wal.Record]]:
    """Run a node over `segments` (the log so far; none: a new node) and `commands`: the log's segments after."""
    segments = segments or [[]]
    node = Node(node_id="p1", incoming=(), outgoing=(), app=app, segment_records=segment_records,
                recovered=recover(app, segments[-1]))
    for command in [None, *commands]:
        if command is not None:
            node.submit(command)
        for effect in node.drain():
            if isinstance(effect, Append):
                segments[-1].append(effect.record)
            elif isinstance(effect, Seal):
                segments.append([effect.checkpoint])
        node.durable(node.last_lsn)
        node.drain()
    return segments


def recover(app: App, records: list[wal.Record]) -> recovery.Recovered:
    return recovery.recover([(f"p1.log:{n}", r) for n, r in enumerate(records, 1)], node_id="p1",
                            incoming=(), outgoing=(), app=app)


def test_init_and_checkpoint_records_name_the_app_and_its_version():
    segments = write(stack(version=3), [b"1", b"2", b"3", b"pop"] * 3, segment_records=4)
    assert len(segments) > 2
    init, checkpoint = segments[0][0], segments[1][0]
    assert (init.app, init.version) == ("stack", 3) and (checkpoint.app, checkpoint.version) == ("stack", 3)
    for record in (init, checkpoint):
        line = wal.encode(record, "p1")
        assert '"app":"stack","version":3' in line and wal.parse(line, "f:1") == record
    assert recover(stack(version=3), segments[-1]).app_version == 3


def test_a_log_from_before_versions_reads_as_version_1_and_a_restart_names_it_once():
    old = '{"node":"p1","lsn":1,"kind":"init","balance":0}\n'  # today's main writes no app and no version
    record = wal.parse(old, "p1.log:1")
    assert (record.app, record.version) == ("", 0)
    # Written today it has its mark, empty (the default app), and no 0 figure: it reads the same.
    assert wal.encode(record, "p1") == '{"node":"p1","lsn":1,"kind":"init","app":""}\n'
    assert wal.parse(wal.encode(record, "p1"), "p1.log:1") == record
    assert recover(stack(), [record]).app_version == 1
    segments = write(stack(), [b"4"], [[record]])
    assert [type(r).KIND for r in segments[0]] == ["init", "version", "restart", "command"]
    assert (segments[0][1].app, segments[0][1].version) == ("stack", 1)
    again = write(stack(), [], segments)
    assert [type(r).KIND for r in again[0][4:]] == ["restart"], "the version is named: no second version record"


@pytest.mark.parametrize("segment_records", [10**6, 4])
def test_a_log_of_another_version_refuses_to_start_with_one_line(segment_records):
    segments = write(stack(version=1), [b"1", b"2", b"pop"] * 2, segment_records=segment_records)
    with pytest.raises(recovery.OtherVersion) as caught:
        recover(stack(version=2), segments[-1])
    line = str(caught.value)
    print(line)
    assert "\n" not in line
    assert "the log holds records of app 'stack' version 1; this code is app 'stack' version 2" in line
    assert "start the code of version 1 again" in line and "restore a stop snapshot" in line
    with pytest.raises(recovery.OtherVersion, match="holds records of app 'stack' version 1; this code is app 'other'"):
        recover(App(name="other", new=Stack), segments[-1])


def on_disk(tmp_path: Path, segments: list[list[wal.Record]]) -> Path:
    first = 1
    for n, segment in enumerate(segments):
        name = wal.active_name("p1") if n == len(segments) - 1 else wal.sealed_name("p1", first)
        (tmp_path / name).write_text("".join(wal.encode(r, "p1") for r in segment))
        first = segment[-1].lsn + 1
    return tmp_path / wal.active_name("p1")


def disk_recover(app: App, path: Path) -> recovery.Recovered:
    return disk.recover(path, "p1", incoming=(), outgoing=(), repair=False, app=app)


def test_a_snapshot_that_does_not_round_trip_is_named_as_the_cause(tmp_path):
    app = stack(sort=True)
    segments = write(app, [b"5", b"9", b"2", b"pop", b"pop"], segment_records=4)
    path = on_disk(tmp_path, segments)
    with pytest.raises(disk.NonDeterministicError) as caught:
        disk_recover(app, path)
    line = str(caught.value)
    print(line)
    assert "replied" in line and "from the log's start instead, the app makes every logged send" in line
    assert "snapshot()/restore() do not round-trip the state the machine depends on" in line
    (tmp_path / wal.sealed_name("p1", 1)).unlink()  # the log no longer holds its start: no claim
    with pytest.raises(disk.NonDeterministicError, match="code changed .*bump its version.* or it is not determ"):
        disk_recover(app, path)


def test_changed_code_under_the_same_version_says_bump_the_version_and_the_ways_on(tmp_path):
    segments = write(stack(), [b"5", b"9", b"2", b"pop", b"pop"], segment_records=4)
    path = on_disk(tmp_path, segments)
    with pytest.raises(disk.NonDeterministicError) as caught:
        disk_recover(stack(pop_first=True), path)
    line = str(caught.value)
    print(line)
    assert "from the log's start it diverges too" in line
    assert "the app's code changed (then bump its version) or it is not deterministic" in line
    assert "start the code of version 1 again, or restore a stop snapshot" in line
    (tmp_path / "one").mkdir()
    single = on_disk(tmp_path / "one", write(stack(), [b"5", b"9", b"pop"]))  # one segment: replayed from its start
    with pytest.raises(disk.NonDeterministicError, match="replied b'5'; the log holds b'9'.*code changed"):
        disk_recover(stack(pop_first=True), single)


def test_a_log_of_another_version_is_refused_on_disk_too(tmp_path):
    path = on_disk(tmp_path, write(stack(version=2), [b"1"]))
    with pytest.raises(disk.OtherVersionError, match="version 2; this code is app 'stack' version 3"):
        disk_recover(stack(version=3), path)
