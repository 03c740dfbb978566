"""`snapmesh replay --app module:attr DATA_DIR`: the recorded history replayed through code, offline.

The data dirs are written by production node machines over in-memory links
(tests/support/applog.py); tests/cluster/test_replay_cluster.py runs it on a
data dir a real kvshard cluster recorded.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from snapmesh import cli
from snapmesh.app import load_app
from snapmesh.services.app import kvshard
from support.applog import record

KVSHARD = Path(kvshard.__file__).read_text()
# One line planted in a copy of kvshard: the handoff carries something that is not the
# state's (an object's address), so a replay sends other bytes than the log holds.
HANDOFF = 'ctx.send(dst, encode({"type": "handoff", "key": key, **entry}))'
PLANTED = 'ctx.send(dst, encode({"type": "handoff", "key": key, **entry, "n": id(object()) % 997}))'
NODES = ("p1", "p2", "p3")


@pytest.fixture
def app_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("kvcopy")]:
        del sys.modules[name]


def kvshard_dir(directory: Path, *, segment_records: int = 10**6, app=kvshard.app) -> Path:
    workload = kvshard.workload([_info(n) for n in NODES], random.Random(2))
    logs = record(app, NODES, workload, steps=600, seed=2, segment_records=segment_records, snapshots=5)
    return logs.write(directory)


def _info(node):
    from snapmesh.app import NodeInfo

    return NodeInfo(node_id=node, peers_out=tuple(n for n in NODES if n != node),
                    peers_in=tuple(n for n in NODES if n != node))


def replay(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["replay", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("segment_records", [10**6, 40])
def test_the_code_that_wrote_the_logs_reproduces_them(tmp_path, capsys, segment_records):
    data = kvshard_dir(tmp_path / "data", segment_records=segment_records)
    code, out, err = replay(capsys, "--app", "kvshard", str(data))
    print(out, err)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == list(NODES)
    assert all(": ok, " in line and "cut(s) reproduce their recorded state" in line for line in lines)
    if segment_records == 40:
        assert "from init and from 3 checkpoint(s)" in out, "each checkpoint is a start of its own"
    assert any(" 0 cut(s)" not in line for line in lines)


def test_a_planted_nondeterminism_in_a_copy_of_kvshard_names_the_node_and_position(tmp_path, app_dir, capsys):
    assert KVSHARD.count(HANDOFF) == 1
    (app_dir / "kvcopy.py").write_text(KVSHARD.replace(HANDOFF, PLANTED))
    data = kvshard_dir(tmp_path / "data")
    code, out, err = replay(capsys, "--app", "kvcopy:app", str(data))
    print(out)
    assert code == 1 and err == ""
    diverged = [line for line in out.splitlines() if line.startswith("p") and ": ok, " not in line]
    assert diverged, out
    node = diverged[0].split(":")[0]
    assert f"{node}.log.jsonl:" in diverged[0] and ": lsn " in diverged[0]
    assert "sent b'{\"created_at\"" in diverged[0] and "the log holds b'{\"created_at\"" in diverged[0]
    assert "code changed (then bump its version) or it is not deterministic" in diverged[0]
    assert f'{{"node":"{node}","lsn":' in out.split(diverged[0])[1].splitlines()[1], "the record itself follows"


SORTED_STACK = """
import json
from snapmesh.app import App


class Stack:
    def __init__(self, info):
        self.items = []

    def on_command(self, command, ctx):
        if command == b"pop":
            return str(self.items.pop() if self.items else -1).encode()
        self.items.append(int(command))
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):  # the bug: the order pop() depends on is not kept
        return json.dumps(sorted(self.items)).encode()

    def restore(self, state):
        self.items = json.loads(state)


app = App(name="stack", new=Stack)
"""


def test_a_snapshot_that_does_not_round_trip_is_named(tmp_path, app_dir, capsys):
    (app_dir / "kvcopy_stack.py").write_text(SORTED_STACK)
    commands = [("p1", c) for c in (b"5", b"9", b"2", b"1", b"pop")] * 40
    record(load_app("kvcopy_stack:app"), ["p1"], commands, steps=300, segment_records=7).write(tmp_path / "data")
    code, out, _ = replay(capsys, "--app", "kvcopy_stack:app", str(tmp_path / "data"))
    print(out)
    assert code == 1
    assert "p1.log." in out and "replaying the command" in out
    assert "snapshot()/restore() do not round-trip the state the machine depends on" in out


@pytest.mark.parametrize(("argv", "expected"), [
    (["--app", "kvshard", "/no/such/dir"], "snapmesh replay: no such directory: /no/such/dir\n"),
    (["--app", "nosuchmod:app", "{tmp}"], "snapmesh replay: --app nosuchmod:app: no module named 'nosuchmod'"),
    (["--app", "kvshard", "{tmp}"], "snapmesh replay: {tmp} holds no node log (<node>.log.jsonl)\n"),
    (["{tmp}"], "snapmesh replay: the following arguments are required: --app\n"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, expected):
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) if "--app" not in argv else _nothing():
        code, out, err = replay(capsys, *argv)
        assert code == 2 and out == ""
        assert err.startswith(expected.format(tmp=tmp_path)) and err.count("\n") == 1, err
    if "--app" not in argv:
        assert capsys.readouterr().err == expected


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_state_that_differs_at_a_cut_is_named_with_both_digests(tmp_path, app_dir, capsys):
    # The same steps, but snapshot() encodes the state otherwise: every send agrees, the cuts do not.
    assert KVSHARD.count('encode({"keys": self.keys,') == 1
    # snapshot_blocks() (A8) would stand in for snapshot(): the copy has none, so its snapshot() is the state.
    assert KVSHARD.count("def snapshot_blocks(") == 1
    changed = KVSHARD.replace('encode({"keys": self.keys,', 'encode({"v": 2, "keys": self.keys,')
    (app_dir / "kvcopy_enc.py").write_text(changed.replace("def snapshot_blocks(", "def _no_blocks("))
    data = kvshard_dir(tmp_path / "data")
    code, out, _ = replay(capsys, "--app", "kvcopy_enc:app", str(data))
    print(out)
    assert code == 1
    assert "replaying" not in out, "the sends agree"
    assert "replayed to its cut (" in out and "the cut recorded sha256:" in out
