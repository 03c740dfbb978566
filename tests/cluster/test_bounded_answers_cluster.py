"""Bounded answers on real processes: an app whose state is a blob of 5 MiB per node
(2 nodes, 10 MiB in all) against a controller whose `[controller]
answer_state_bytes` is 1 MiB, read by clients with gRPC's default 4 MiB receive
limit (grpcurl's too). Before, TriggerSnapshot with wait answered the whole 10 MiB
snapshot and every such client failed (RESOURCE_EXHAUSTED: Received message larger
than max) though the snapshot completed.

- Small states (a few bytes) are answered inline, exactly the stored snapshot.
- TriggerSnapshot wait=true answers under the limit with the states left out,
  each node's size and digest right; GetSnapshot, ListSnapshots and
  WatchSnapshots the same.
- GetSnapshotChunks streams the stored snapshot in pieces of at most 1 MiB: its
  states match the digests the answers carry.
- `snapmesh snapshot trigger --wait` and `snapshot get` exit 0; `get --json` has
  the states, fetched in pieces, and says so; grpcurl's TriggerSnapshot works.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import threading

import grpc
import pytest

from snapmesh.commands import snapshot_cli
from snapmesh.protocol import statedigest
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.binaries import grpcurl_binary
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

MiB = 1024 * 1024
BLOB = 5 * MiB
LIMIT = MiB  # answer_state_bytes

BLOB_APP = '''\
"""A node whose state is one blob: a few bytes, or 5 MiB after "grow"."""
import hashlib

from snapmesh.app import App

BLOB = 5 * 1024 * 1024


def blob(node_id, size):
    seed = hashlib.sha256(node_id.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Blob:
    def __init__(self, info):
        self.me, self.blob = info.node_id, blob(info.node_id, 16)

    def on_command(self, command, ctx):
        self.blob = blob(self.me, BLOB if command == b"grow" else 16)
        return str(len(self.blob)).encode()

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return self.blob

    def restore(self, state):
        self.blob = state


app = App(name="blob", new=Blob)
'''


def blob(node_id: str, size: int) -> bytes:  # as the app makes it
    seed = hashlib.sha256(node_id.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def digest(data: bytes) -> str:
    return statedigest.canonical(data)  # the form a node records for its size (statedigest.py SD3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    (root / "apps").mkdir()
    (root / "apps" / "blob_app.py").write_text(BLOB_APP)
    path = write_cluster(root / "cluster.toml", nodes=2, data_dir=root / "data")
    path.write_text(path.read_text().replace("[controller]\n", f"[controller]\nanswer_state_bytes = {LIMIT}\n"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "apps"), os.environ.get("PYTHONPATH")]))}
    running = Cluster(path, env=env, app="blob_app:app")
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def stub(cluster):
    with grpc.insecure_channel(cluster.controller_address) as channel:  # gRPC's default 4 MiB receive limit
        yield pb_grpc.ControllerStub(channel)


def command(cluster, node_id: str, text: bytes) -> bytes:
    with grpc.insecure_channel(cluster.node_address(node_id)) as channel:
        return pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=text), timeout=30).reply


def whole(stub, sid: str) -> tuple[pb.Snapshot, list[int]]:
    pieces = [chunk.data for chunk in stub.GetSnapshotChunks(pb.GetSnapshotRequest(snapshot_id=sid), timeout=60)]
    return pb.Snapshot.FromString(b"".join(pieces)), [len(p) for p in pieces]


def trigger(stub) -> pb.Snapshot:
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
    return snapshot


def assert_left_out(snapshot: pb.Snapshot) -> None:
    assert snapshot.states_omitted and snapshot.ByteSize() < LIMIT
    assert [(n.node_id, n.HasField("state"), n.state_omitted, n.state_bytes, n.state_digest) for n in snapshot.nodes] == [
        (node, False, True, BLOB, digest(blob(node, BLOB))) for node in ("p1", "p2")]


def test_small_states_are_answered_inline_exactly_as_stored(stub):
    answer = trigger(stub)
    assert not answer.states_omitted
    assert [(n.node_id, n.state, n.state_omitted, n.state_bytes) for n in answer.nodes] == [
        ("p1", blob("p1", 16), False, 0), ("p2", blob("p2", 16), False, 0)]
    got = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=answer.snapshot_id), timeout=30)
    assert got == whole(stub, answer.snapshot_id)[0] == answer


@pytest.fixture(scope="module")
def large(cluster, stub):
    assert [command(cluster, n, b"grow") for n in ("p1", "p2")] == [str(BLOB).encode()] * 2
    seen: list[pb.Snapshot] = []
    watch = stub.WatchSnapshots(pb.WatchSnapshotsRequest())  # a default client watching meanwhile

    def follow() -> None:
        try:
            seen.extend(s for s in watch if s.status == pb.Snapshot.COMPLETE)
        except grpc.RpcError as error:  # cancelled below; anything else fails the wait
            assert error.code() == grpc.StatusCode.CANCELLED, error

    watcher = threading.Thread(target=follow)
    watcher.start()
    try:
        answer = trigger(stub)
        wait_for(lambda: any(s.snapshot_id == answer.snapshot_id for s in seen), timeout=30,
                 what="the watcher to see the snapshot COMPLETE")
    finally:
        watch.cancel()
        watcher.join(10)
    return answer, [s for s in seen if s.snapshot_id == answer.snapshot_id][0]


def test_trigger_with_wait_answers_under_the_limit_with_sizes_and_digests(large):
    answer, watched = large
    assert_left_out(answer)
    assert_left_out(watched)


def test_get_snapshot_and_a_page_answer_the_same(stub, large):
    answer, _ = large
    got = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=answer.snapshot_id), timeout=30)
    assert_left_out(got)
    assert got == answer
    listed = [s for s in stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=30).snapshots
              if s.snapshot_id == answer.snapshot_id]
    assert len(listed) == 1
    assert_left_out(listed[0])


def test_the_streamed_call_returns_states_that_match_the_digests(stub, large):
    answer, _ = large
    snapshot, sizes = whole(stub, answer.snapshot_id)
    assert max(sizes) <= MiB and sum(sizes) > 2 * BLOB
    assert not snapshot.states_omitted
    assert [(n.node_id, digest(n.state), n.state_digest) for n in snapshot.nodes] == [
        (n.node_id, n.state_digest, n.state_digest) for n in answer.nodes]


def test_the_cli_triggers_and_gets_and_says_which_states_it_fetched(cluster, large, capsys):
    answer, _ = large
    capsys.readouterr()
    assert snapshot_cli.main(["trigger", "--wait", "--controller", cluster.controller_address]) == 0
    assert "COMPLETE" in capsys.readouterr().out
    assert snapshot_cli.main(["get", answer.snapshot_id, "--controller", cluster.controller_address]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[:2] for r in rows if r[:1] in (["p1"], ["p2"])] == [["p1", str(BLOB)], ["p2", str(BLOB)]]
    assert snapshot_cli.main(["get", answer.snapshot_id, "--json", "--controller", cluster.controller_address]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["states_fetched"] == ["p1", "p2"]
    assert [digest(base64.b64decode(n["state"])) for n in out["nodes"]] == [n.state_digest for n in answer.nodes]


def test_grpcurl_triggers_with_wait(cluster, large):
    result = subprocess.run([str(grpcurl_binary()), "-plaintext", "-max-time", "60", "-d", '{"wait": true}',
                             cluster.controller_address, "snapmesh.v1.Controller/TriggerSnapshot"],
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["status"] == "COMPLETE" and answer["states_omitted"] is True, answer
    assert [(n["node_id"], n["state_bytes"], "state" in n) for n in answer["nodes"]] == [
        ("p1", str(BLOB), False), ("p2", str(BLOB), False)]
    assert len(result.stdout) < LIMIT
