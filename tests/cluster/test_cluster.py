"""Whole clusters (controller + nodes as real processes) under load.

Every test that starts a cluster runs twice: plaintext, and with mutual TLS and
the control-plane token (`tls` in the test id), every client presenting the
cluster's client certificate and token.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from support.cluster_helpers import check_against_logs, controller_stub
from snapmesh.settings import config
from snapmesh.settings.config import write_cluster
from snapmesh.load.background import BackgroundLoad
from snapmesh.settings.security import write_certs
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

COMPLETE, FAILED = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED
DEADLINE_S = 3.0


@pytest.fixture(params=[False, True], ids=["plaintext", "tls"])
def tls(request) -> bool:
    return request.param


@pytest.fixture()
def make_cluster(tmp_path, tls):
    def make(tmp_path, **options) -> Cluster:
        options.setdefault("deadline", DEADLINE_S)
        path = write_cluster(tmp_path / "cluster.toml", **options)
        if not tls:
            return Cluster(path)
        write_certs(config.load(path), tmp_path / "tls")
        return Cluster(path, tls_dir=tmp_path / "tls")

    return make


def assert_consistent_with_logs(cluster: Cluster, snapshots: list[pb.Snapshot]) -> None:
    """The one checker (snapmesh/checking/logcheck.py): the nodes' logs against every snapshot."""
    report = check_against_logs(cluster, snapshots)
    assert report.transfers > 0 and len(report.snapshots) >= len(snapshots)


def trigger_all(stub, initiators, timeout: float = 30) -> list[pb.Snapshot]:
    """Start one snapshot per initiator at the same moment; wait for all of them."""
    results: dict[int, pb.Snapshot | Exception] = {}
    barrier = threading.Barrier(len(initiators))

    def one(index: int, initiator: str) -> None:
        barrier.wait()
        try:
            results[index] = stub.TriggerSnapshot(
                pb.TriggerSnapshotRequest(initiator=initiator, wait=True), timeout=timeout
            )
        except grpc.RpcError as error:
            results[index] = error

    threads = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(initiators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snapshots = [results[i] for i in range(len(initiators))]
    for snapshot in snapshots:
        assert isinstance(snapshot, pb.Snapshot), snapshot
    return snapshots


def assert_complete_and_conserved(snapshot: pb.Snapshot, cluster: Cluster) -> None:
    assert snapshot.status == COMPLETE, f"{snapshot.snapshot_id}: {snapshot.reason}"
    assert snapshot.conserved and snapshot.total == cluster.config.expected_total, snapshot
    assert [n.node_id for n in snapshot.nodes] == list(cluster.config.topology.nodes)
    assert [(c.src, c.dst) for c in snapshot.channels] == list(cluster.config.topology.channels)


def test_concurrent_snapshots_from_every_initiator_under_load_are_complete_and_consistent(tmp_path, make_cluster):
    with make_cluster(tmp_path, nodes=4, initial_balance=1000) as cluster:
        channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
        with channel, BackgroundLoad.for_cluster(cluster, seed=11, batch=20, max_amount=20, interval=0.01) as load:
            time.sleep(0.5)
            snapshots = []
            for _ in range(3):
                snapshots += trigger_all(stub, ["p1", "p2", "p3", "p4", "p1"])
                time.sleep(0.2)
            load.stop()
            assert load.stats.accepted > 100, load.stats
        assert len({s.snapshot_id for s in snapshots}) == 15
        for snapshot in snapshots:
            assert_complete_and_conserved(snapshot, cluster)
        assert any(c.in_flight for s in snapshots for c in s.channels), "the load never left money in flight"
        assert_consistent_with_logs(cluster, snapshots)


@pytest.mark.parametrize("tls", [False], ids=["plaintext"])
def test_overtake_mode_snapshots_under_load_are_complete_and_consistent(tmp_path, make_cluster):
    with make_cluster(tmp_path, nodes=4, initial_balance=1000, snapshot_mode="overtake") as cluster:
        channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
        with channel, BackgroundLoad.for_cluster(cluster, seed=7, batch=50, max_amount=20, interval=0.0) as load:
            time.sleep(0.5)
            snapshots = trigger_all(stub, ["p1", "p2", "p3", "p4"])
            for _ in range(4):
                snapshots += trigger_all(stub, ["p2"])
            load.stop()
            assert load.stats.accepted > 100, load.stats
        for snapshot in snapshots:
            assert_complete_and_conserved(snapshot, cluster)
        assert any(c.in_flight for s in snapshots for c in s.channels), "the load never left money in flight"
        check_against_logs(cluster, snapshots)


def test_a_ring_cluster_takes_consistent_snapshots_under_load(tmp_path, make_cluster):
    with make_cluster(tmp_path, nodes=4, topology="ring", initial_balance=500) as cluster:
        channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
        with channel, BackgroundLoad.for_cluster(cluster, seed=5, batch=20, max_amount=10, interval=0.01) as load:
            time.sleep(0.3)
            snapshots = trigger_all(stub, ["p1", "p3"])
            snapshots += trigger_all(stub, ["p2", "p4", "p2"])
            load.stop()
        assert load.stats.accepted > 0
        for snapshot in snapshots:
            assert_complete_and_conserved(snapshot, cluster)
            assert len(snapshot.channels) == 4
        assert_consistent_with_logs(cluster, snapshots)


def test_a_stopped_node_fails_the_snapshot_at_the_deadline_and_the_next_one_completes(tmp_path, make_cluster):
    with make_cluster(tmp_path, nodes=3) as cluster:
        channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
        with channel:
            cluster.signal_node("p3", signal.SIGSTOP)
            try:
                started = time.monotonic()
                failed = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
                waited = time.monotonic() - started
            finally:
                cluster.signal_node("p3", signal.SIGCONT)
            assert failed.status == FAILED
            assert "p3" in failed.reason and "deadline" in failed.reason
            assert DEADLINE_S - 0.2 <= waited < DEADLINE_S + 3, waited

            after = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p3", wait=True), timeout=30)
            assert_complete_and_conserved(after, cluster)
            # the failed one stays failed, and is kept
            got = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=failed.snapshot_id), timeout=5)
            assert got == failed
        assert (cluster.config.snapshots_dir / f"{failed.snapshot_id}.json").exists()


def test_the_app_runs_against_a_cluster_and_every_snapshot_is_conserved(tmp_path, make_cluster):
    import io

    from snapmesh.bank.workload import WorkloadParams, run_workload

    with make_cluster(tmp_path, nodes=3, initial_balance=300) as cluster:
        out = io.StringIO()
        params = WorkloadParams(duration=3, transfer_interval=0.05, snapshot_every=0.7, seed=3, max_amount=100)
        summary = run_workload(cluster.controller_address, params, out=out, identity=cluster.client_identity)
    text = out.getvalue()
    assert summary.exit_code == 0, text
    assert summary.transfers_made > 50 and len(summary.complete) >= 3, text
    assert "CONSERVED" in text and "all snapshots conserved: yes" in text
    assert text.splitlines()[0].startswith("bank workload: seed 3")


def test_the_app_exits_1_with_a_clear_message_when_the_controller_is_unreachable():
    import subprocess
    import sys

    from snapmesh.settings.ports import free_ports

    [port] = free_ports(1)
    result = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "app", "--controller", f"127.0.0.1:{port}", "--duration", "1"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1  # unreachable: 1, as every client command
    assert f"cannot reach the controller at 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_app_stops_on_a_signal_with_its_summary(tmp_path, make_cluster, tls, sig):
    import subprocess
    import sys

    with make_cluster(tmp_path, nodes=3) as cluster:
        app = subprocess.Popen(
            [sys.executable, "-m", "snapmesh.cli", "app", "--controller", cluster.controller_address,
             "--duration", "120", "--snapshot-every", "0.5", "--seed", "5",
             *(["--tls-dir", str(tmp_path / "tls")] if tls else [])],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            lines = []
            for line in app.stdout:  # wait until it has made transfers and finished a snapshot
                lines.append(line)
                if "CONSERVED" in line:
                    break
            app.send_signal(sig)
            rest, _ = app.communicate(timeout=30)
        finally:
            if app.poll() is None:
                app.kill()
                app.wait()
    text = "".join(lines) + rest
    assert app.returncode == 0, text
    assert "stopped by a signal" in text and "all snapshots conserved: yes" in text, text
    assert "Traceback" not in text


def test_a_controller_whose_snapshot_mode_differs_from_the_nodes_exits_2_naming_the_file_and_field(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, deadline=DEADLINE_S)
    other = tmp_path / "overtake.toml"
    other.write_text(path.read_text().replace("initial_balance", 'snapshot_mode = "overtake"\ninitial_balance', 1))
    with Cluster(path, controller=False):
        done = subprocess.run([sys.executable, "-m", "snapmesh.cli", "controller", "--config", str(other)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{other}: snapshot_mode: the controller runs 'overtake' but node 'p1' runs 'classic'" in done.stderr
