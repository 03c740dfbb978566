"""A node's manifest sent and journaled as its change from its last acknowledged report
(snapmesh/protocol/manifestdelta.py MD1-MD4, journalchanges.py JC1-JC3), on real processes:
two nodes of a blob of 16 MiB (2,048 blocks, a manifest of ~70 KB each).

- Once a report was answered takes_changes, the next one sends its manifest as its change: the
  node's report is far under one manifest, the controller journals the change as it came, and
  the snapshot stores the full manifests and verifies.
- A restarted controller holds no base: the node's change is refused ("missing base") and sent
  again with its full manifest; the snapshot completes with the states the nodes had, and the
  next report is a change again.
- A controller SIGKILLed after a snapshot whose reports were changes, its files lost, rebuilds it
  from the journal's change records into the very manifests it had stored, and it verifies.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import grpc
import pytest

from snapmesh.checking import snapshot_file
from snapmesh.commands import snapshot_cli
from snapmesh.processes.supervisor import Cluster
from snapmesh.protocol import blocks, manifestdelta
from snapmesh.protocol.controller import journal as R
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.blob_cluster import MANIFEST, blob_cluster, digests, snapshot
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture
def cluster(tmp_path):
    yield from blob_cluster(tmp_path)


def poke(cluster: Cluster, node_id: str, at: int, seed: int) -> None:
    with grpc.insecure_channel(cluster.node_address(node_id)) as channel:
        request = pb.SubmitRequest(command=f"poke {at} {seed}".encode())
        assert pb_grpc.NodeStub(channel).Submit(request, timeout=30).reply == b"ok"


def stored(cluster: Cluster, sid: str) -> Path:
    path = Path(cluster.data_dir) / "controller" / "snapshots" / f"{sid}.pb"
    return wait_for(lambda: path, until=Path.exists, timeout=60, what=f"the file of {sid}")


def manifests(cluster: Cluster, sid: str) -> dict[str, list[bytes]]:
    found = snapshot_file.read_stored(stored(cluster, sid))[0]
    return {node.node_id: list(node.state_blocks.hashes) for node in found.nodes}


def reported(cluster: Cluster, node_id: str, sid: str) -> int:
    pattern = re.compile(rf"snapshot {sid}: reported state to the controller \((\d+) bytes\)")
    found = wait_for(lambda: pattern.search(cluster.node(node_id).output()), timeout=30, what=f"{node_id}'s report")
    return int(found.group(1))


def journaled(cluster: Cluster, sid: str) -> list[pb.FullState]:
    """The reports of `sid` as the controller's journal holds them."""
    records, _, problem = R.decode_all((Path(cluster.data_dir) / "controller" / "journal").read_bytes())
    assert problem is None, problem
    return [r.sent for r in records if isinstance(r, R.Reported) and r.snapshot_id == sid and r.sent is not None]


def verified(cluster: Cluster, sid: str, capsys) -> bool:
    stored(cluster, sid)
    capsys.readouterr()
    code = snapshot_cli.main(["verify", sid, "--data-dir", str(cluster.data_dir)])
    out = capsys.readouterr().out
    return code == 0 and "each matching its hash" in out


def test_changes_are_sent_refused_after_a_restart_then_resent_whole_and_replayed_after_a_crash(cluster, capsys):
    first = snapshot(cluster).snapshot_id  # whole: the controller held nothing
    stored(cluster, first)
    poke(cluster, "p1", 100, 7)
    second = snapshot(cluster)
    assert reported(cluster, "p1", second.snapshot_id) < blocks.BLOCK_BYTES + 2048  # the block, a change of one name
    assert reported(cluster, "p2", second.snapshot_id) < 1024  # no block, no name: the change is empty
    sent = journaled(cluster, second.snapshot_id)
    assert len(sent) == 2 and all(s.HasField("state_change") and not s.HasField("state_blocks") for s in sent)
    assert {s.node_id: list(s.state_change.positions) for s in sent} == {"p1": [0], "p2": []}
    before = manifests(cluster, first)
    after = manifests(cluster, second.snapshot_id)
    assert after["p2"] == before["p2"] and after["p1"][1:] == before["p1"][1:] and after["p1"][0] != before["p1"][0]
    assert verified(cluster, second.snapshot_id, capsys)

    cluster.restart_controller()  # it holds no base now
    poke(cluster, "p2", 9000, 8)
    third = snapshot(cluster)
    for node in ("p1", "p2"):  # refused, then the full manifest
        output = cluster.node(node).output()
        assert f"snapshot {third.snapshot_id}: {manifestdelta.MISSING_BASE}" in output, output[-2000:]
        assert reported(cluster, node, third.snapshot_id) > MANIFEST
    assert verified(cluster, third.snapshot_id, capsys)
    assert all(s.HasField("state_blocks") for s in journaled(cluster, third.snapshot_id))

    poke(cluster, "p1", 5_000_000, 9)
    fourth = snapshot(cluster)
    assert reported(cluster, "p1", fourth.snapshot_id) < blocks.BLOCK_BYTES + 2048  # a change again
    assert all(s.HasField("state_change") for s in journaled(cluster, fourth.snapshot_id))
    held = manifests(cluster, fourth.snapshot_id)
    assert verified(cluster, fourth.snapshot_id, capsys)  # both files written
    assert cluster.stop_controller(signal.SIGKILL) == -signal.SIGKILL
    for path in (stored(cluster, fourth.snapshot_id), Path(cluster.data_dir) / "snapshots" / f"{fourth.snapshot_id}.json"):
        path.unlink()
    cluster.start_controller()  # the journal's change records rebuilt from their bases (JC2), filed again
    assert manifests(cluster, fourth.snapshot_id) == held
    with grpc.insecure_channel(cluster.controller_address) as channel:
        found = pb_grpc.ControllerStub(channel).GetSnapshot(
            pb.GetSnapshotRequest(snapshot_id=fourth.snapshot_id), timeout=30)
    assert digests(found) == digests(fourth)
    assert verified(cluster, fourth.snapshot_id, capsys)
