"""`snapmesh snapshot get` of a snapshot whose states are too large to hold (4 nodes of
1 GiB: 4 GiB, past the 2 GiB a protobuf message can be): the table shows each state's
size from the answer and fetches nothing; `--json` prints the answer as it came, its
sizes and digests, with a notice, rather than fetching the states; a small snapshot's
states left out are still fetched for `--json`. A fake controller stub (no cluster:
what is checked is which calls `get` makes, and what it prints)."""

from __future__ import annotations

import argparse
import json

from snapmesh.commands import snapshot_cli
from snapmesh.v1 import snapmesh_pb2 as pb

GIB = 1024 * 1024 * 1024


class Controller:
    def __init__(self, state_bytes: int) -> None:
        self.calls: list[str] = []
        self.answer = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE, states_omitted=True)
        self.answer.app.name = "blob"
        for node in ("p1", "p2", "p3", "p4"):
            self.answer.nodes.add(node_id=node, state_bytes=state_bytes, state_omitted=True,
                                  state_digest="sha256-blocks:" + "ab" * 32)

    def GetSnapshot(self, request, timeout=None):
        self.calls.append("GetSnapshot")
        return self.answer

    def GetSnapshotChunks(self, request, timeout=None):
        self.calls.append("GetSnapshotChunks")
        whole = pb.Snapshot()
        whole.CopyFrom(self.answer)
        whole.states_omitted = False
        for node in whole.nodes:
            node.state_omitted = False
            node.state = b"x" * node.state_bytes
        data = whole.SerializeToString()
        return iter([pb.SnapshotChunk(data=data)])

    def GetCluster(self, request, timeout=None):
        self.calls.append("GetCluster")
        return pb.Cluster(nodes=[pb.NodeInfo(node_id=n) for n in ("p1", "p2", "p3", "p4")])


def get(stub, *, as_json: bool) -> int:
    return snapshot_cli._get(stub, argparse.Namespace(snapshot_id="s1", json=as_json, timeout=5.0))


def test_the_table_of_a_snapshot_of_1_gib_states_fetches_nothing_and_shows_their_sizes(capsys):
    stub = Controller(GIB)
    assert get(stub, as_json=False) == 0
    assert "GetSnapshotChunks" not in stub.calls
    assert str(GIB) in capsys.readouterr().out


def test_json_of_states_past_the_bound_prints_the_answer_as_it_came_with_a_notice(capsys):
    stub = Controller(GIB)
    assert get(stub, as_json=True) == 0
    assert stub.calls == ["GetSnapshot"]
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed["states_omitted"] is True and "states_fetched" not in printed
    assert all(int(n["state_bytes"]) == GIB for n in printed["nodes"])
    assert "4,294,967,296 bytes" in err and "GetSnapshotChunks" in err


def test_json_of_small_states_left_out_still_fetches_them(capsys):
    stub = Controller(1024)
    assert get(stub, as_json=True) == 0
    assert stub.calls == ["GetSnapshot", "GetSnapshotChunks"]
    printed = json.loads(capsys.readouterr().out)
    assert printed["states_fetched"] == ["p1", "p2", "p3", "p4"]
