"""What a real controller and a real node export on /metrics: exactly the
table of docs/metrics.md, durations in seconds, the standard families (process_*,
python_*, snapmesh_build_info), gRPC server metrics per method and code, and the
controller's epoch and time of the last COMPLETE snapshot, kept across a restart."""

from __future__ import annotations

import re
import sys
import time
from importlib import metadata

import grpc
import pytest

from support.cluster_helpers import controller_stub, node_stub
from support.metrics_table import differences, documented, families, scrape, value
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    cluster = Cluster(write_cluster(tmp / "cluster.toml", nodes=3, data_dir=tmp / "data"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def activity(cluster):
    """A transfer, a refused one, a COMPLETE snapshot and a NOT_FOUND; then the scrapes."""
    channel, node = node_stub(cluster.node_address("p1"))
    with channel:
        node.Transfer(pb.TransferRequest(to="p2", amount=5), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            node.Transfer(pb.TransferRequest(to="p2", amount=-1), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel, controller = controller_stub(cluster.controller_address)
    with channel:
        snapshot = controller.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
        assert pb.Snapshot.Status.Name(snapshot.status) == "COMPLETE"
        with pytest.raises(grpc.RpcError) as missing:
            controller.GetSnapshot(pb.GetSnapshotRequest(snapshot_id="20260101T000000.000000Z-00000000"), timeout=10)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    return {
        "snapshot": snapshot,
        "controller": scrape(cluster.config.controller.metrics_address),
        "node": scrape(cluster.config.node("p1").metrics_address),
    }


def test_the_docs_table_is_exactly_what_the_processes_export(activity):
    table = documented()
    expected = {"controller": table["controller"], "node": {**table["node"], **table["bank node"]}}  # the bank's node
    for process in ("controller", "node"):
        problems = differences(expected[process], families(activity[process]))
        assert not problems, f"{process}: {problems}"


def test_durations_are_seconds_and_counters_total(activity):
    for process in ("controller", "node"):
        for name, (kind, labels) in families(activity[process]).items():
            assert not re.search(r"_ms($|_)", name), f"{process}: {name} is in milliseconds"
            if kind == "counter":
                assert name.endswith("_total"), name
            # One label name per idea: a gRPC status is `grpc_code` everywhere (grpc_server_handled_total's).
            assert "code" not in labels, f"{process}: {name} labels a gRPC status `code`, not `grpc_code`"
        assert "_created" not in activity[process]
    snapshot, text = activity["snapshot"], activity["controller"]
    for stats in snapshot.stats.nodes:  # the first snapshot: each node's one observation, in seconds
        observed = value(text, "snapmesh_snapshot_start_delay_seconds_sum", node=stats.node_id)
        assert observed == pytest.approx(stats.start_delay_ms / 1e3), stats.node_id
        assert value(text, "snapmesh_snapshot_start_delay_seconds_count", node=stats.node_id) == 1
    # One histogram of the snapshot's duration, labelled with its status as the API names it.
    # Within a microsecond: the stamps are float wall seconds (about 0.24 us apart at today's epoch).
    assert value(text, "snapmesh_snapshot_duration_seconds_sum", status="COMPLETE") == pytest.approx(
        snapshot.stats.end_to_end_duration_ms / 1e3, abs=1e-6)
    assert value(text, "snapmesh_snapshot_duration_seconds_count", status="FAILED") == 0
    assert "snapmesh_snapshot_end_to_end_duration_seconds" not in text
    assert value(text, "snapmesh_snapshots_total", status="COMPLETE") == 1
    assert value(text, "snapmesh_stale_epoch_reports_refused_total") == 0


def test_grpc_server_metrics_per_method_and_code(activity):
    text = activity["controller"]
    controller = {"grpc_service": "snapmesh.v1.Controller", "grpc_type": "unary"}
    assert value(text, "grpc_server_handled_total", grpc_method="GetSnapshot", grpc_code="NOT_FOUND", **controller) == 1
    assert value(text, "grpc_server_handled_total", grpc_method="TriggerSnapshot", grpc_code="OK", **controller) == 1
    assert value(text, "grpc_server_started_total", grpc_method="TriggerSnapshot", **controller) == 1
    assert value(text, "grpc_server_handling_seconds_count", grpc_method="TriggerSnapshot", **controller) == 1
    waited = value(text, "grpc_server_handling_seconds_sum", grpc_method="TriggerSnapshot", **controller)
    assert 0 < waited < 30  # seconds: it waited for the snapshot to finish
    # Every node reported its state: three ReportState calls, all OK.
    assert value(text, "grpc_server_handled_total", grpc_method="ReportState", grpc_code="OK", **controller) == 3

    node_text = activity["node"]
    node = {"grpc_service": "snapmesh.v1.Node", "grpc_type": "unary", "grpc_method": "Transfer"}
    assert value(node_text, "grpc_server_handled_total", grpc_code="OK", **node) == 1
    assert value(node_text, "grpc_server_handled_total", grpc_code="INVALID_ARGUMENT", **node) == 1
    assert value(node_text, "snapmesh_transfers_refused_total", node="p1", grpc_code="INVALID_ARGUMENT") == 1
    # The channel streams into p1 (from p2 and p3) are open bidirectional streams.
    stream = {"grpc_service": "snapmesh.v1.Node", "grpc_type": "bidi_stream", "grpc_method": "Channel"}
    assert value(node_text, "grpc_server_started_total", **stream) >= 2


def test_the_standard_families(cluster, activity):
    for process in ("controller", "node"):
        text = activity[process]
        assert value(text, "snapmesh_build_info", version=metadata.version("snapmesh")) == 1
        assert value(text, "process_resident_memory_bytes") > 10 * 2**20
        assert value(text, "process_cpu_seconds_total") > 0
        assert time.time() - 600 < value(text, "process_start_time_seconds") <= time.time()
        v = sys.version_info
        assert value(text, "python_info", implementation="CPython", major=str(v.major), minor=str(v.minor),
                     patchlevel=str(v.micro), version=f"{v.major}.{v.minor}.{v.micro}") == 1


def test_the_controllers_epoch_and_last_complete_snapshot_survive_a_restart(cluster, activity):
    finished = activity["snapshot"].finished_at.ToNanoseconds() / 1e9
    text = activity["controller"]
    assert value(text, "snapmesh_controller_epoch") == 1
    assert value(text, "snapmesh_last_complete_snapshot_timestamp_seconds") == pytest.approx(finished, abs=1e-3)
    assert value(text, "snapmesh_restores_total", status="RESTORED") == 0
    cluster.stop_controller()
    cluster.start_controller()
    text = scrape(cluster.config.controller.metrics_address)
    # A fresh process: its counters start again, but the last COMPLETE time comes from the stored snapshots.
    assert value(text, "snapmesh_last_complete_snapshot_timestamp_seconds") == pytest.approx(finished, abs=1e-3)
    assert value(text, "snapmesh_controller_epoch") == 1
