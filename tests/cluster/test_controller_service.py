"""The controller as a real process over real gRPC on loopback, alone or with nodes."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from support.cluster_helpers import controller_stub
from support.polling import WaitTimedOut, wait_for
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

COMPLETE, FAILED, IN_PROGRESS = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED, pb.Snapshot.IN_PROGRESS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three nodes and a controller, with a deadline long enough that a snapshot
    held up by a stopped node stays IN_PROGRESS for the whole test."""
    path = write_cluster(tmp_path_factory.mktemp("svc") / "cluster.toml", nodes=3, deadline=60)
    with Cluster(path) as running:
        yield running


@pytest.fixture(scope="module")
def stub(cluster):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        yield stub


def listed(stub) -> list[pb.Snapshot]:
    return list(stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=5).snapshots)


def rpc_error(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


@pytest.fixture
def held_snapshot(cluster, stub):
    """An IN_PROGRESS snapshot nobody reported yet: its initiator p1 is stopped,
    so StartSnapshot hangs and no marker ever leaves."""
    cluster.signal_node("p1", signal.SIGSTOP)
    try:
        snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=5)
        assert snapshot.status == IN_PROGRESS
        yield snapshot
    finally:
        cluster.signal_node("p1", signal.SIGCONT)


def full_state(cluster, sid: str, node: str, balance: int = 1000) -> pb.FullState:
    """A bank node's report, as the bank app's nodes send it (its balance as state bytes)."""
    sources = cluster.config.topology.incoming(node)
    return pb.FullState(
        snapshot_id=sid, node_id=node, state=str(balance).encode(), app_name="bank", app_version=1,
        channels=[pb.ChannelState(src=s, dst=node) for s in sources],
    )


# ------------------------------------------------------------------ the API


def test_get_cluster_names_every_node_with_its_addresses_and_every_channel(cluster, stub):
    answer = stub.GetCluster(pb.GetClusterRequest(), timeout=5)
    assert [(n.node_id, n.address, n.metrics_address) for n in answer.nodes] == [
        (n.id, n.address, n.metrics_address) for n in cluster.config.nodes
    ]
    assert [(c.src, c.dst) for c in answer.channels] == list(cluster.config.topology.channels)


def test_get_cluster_returns_the_snapshot_settings_the_controller_runs_with(cluster, stub):
    answer = stub.GetCluster(pb.GetClusterRequest(), timeout=5)
    settings = answer.settings
    # The cluster file's deadline (60), classic mode, no --interval, no --keep, the default limit.
    assert (settings.snapshot_mode, settings.deadline_s, settings.interval_s, settings.keep,
            settings.max_concurrent_snapshots) == ("classic", 60.0, 0.0, 0, cluster.config.controller.max_concurrent_snapshots)
    assert settings.max_concurrent_snapshots > 0
    done = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
    assert stub.GetCluster(pb.GetClusterRequest(), timeout=5).epoch == done.epoch >= 1


def test_trigger_and_wait_returns_the_complete_snapshot_which_get_and_list_serve(stub):
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
    assert snapshot.status == COMPLETE, snapshot.reason
    assert snapshot.initiator == "p2" and snapshot.conserved
    assert snapshot.total == snapshot.expected_total == 3000
    assert [n.node_id for n in snapshot.nodes] == ["p1", "p2", "p3"]
    assert len(snapshot.channels) == 6
    assert snapshot.finished_at.ToNanoseconds() >= snapshot.started_at.ToNanoseconds() > 0
    assert stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snapshot.snapshot_id), timeout=5) == snapshot
    assert snapshot in listed(stub)


def test_trigger_without_wait_returns_in_progress_and_an_empty_initiator_picks_a_node(stub):
    started = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(), timeout=5)
    assert started.status == IN_PROGRESS and started.initiator in ("p1", "p2", "p3")
    got = wait_for(lambda: stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=started.snapshot_id)),
                   until=lambda s: s.status != IN_PROGRESS, timeout=20, what="the snapshot to finish")
    assert got.status == COMPLETE and got.conserved


def test_snapshot_ids_are_unique_and_sort_in_start_order(stub):
    ids = [stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p3"), timeout=5).snapshot_id for _ in range(5)]
    assert len(set(ids)) == 5 and ids == sorted(ids)


def test_watch_streams_the_start_and_the_finish_of_a_snapshot(stub):
    updates: list[pb.Snapshot] = []
    call = stub.WatchSnapshots(pb.WatchSnapshotsRequest(), timeout=30)
    subscribed = threading.Event()

    def read() -> None:
        subscribed.set()
        try:
            for update in call:
                updates.append(update)
        except grpc.RpcError:
            pass  # cancelled below

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    subscribed.wait()
    time.sleep(0.3)  # the stream is open server-side before the trigger
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
    with contextlib.suppress(WaitTimedOut):  # checked below, once the stream is closed
        wait_for(lambda: snapshot in updates, timeout=10, what="the finished snapshot on the stream")
    call.cancel()
    reader.join(timeout=10)
    mine = [u for u in updates if u.snapshot_id == snapshot.snapshot_id]
    assert mine[0].status == IN_PROGRESS
    assert mine[-1] == snapshot


def test_metrics_count_finished_snapshots_and_their_durations(cluster, stub):
    stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
    url = f"http://{cluster.config.controller.metrics_address}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    complete = next(line for line in text.splitlines() if line.startswith('snapmesh_snapshots_total{status="COMPLETE"}'))
    assert float(complete.split()[-1]) >= 1
    assert "snapmesh_snapshot_duration_seconds_bucket" in text
    assert "snapmesh_snapshots_in_progress" in text


def test_a_complete_snapshot_carries_flink_style_stats_also_as_histograms(cluster, stub):
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
    stats = snapshot.stats
    assert sorted(n.node_id for n in stats.nodes) == ["p1", "p2", "p3"]
    for node in stats.nodes:
        assert node.start_delay_ms > 0 and node.recording_duration_ms >= 0 and node.report_time_ms > 0, node
        assert node.start_delay_ms + node.recording_duration_ms + node.report_time_ms <= (
            stats.end_to_end_duration_ms + 1
        )
    assert stats.end_to_end_duration_ms == pytest.approx(
        (snapshot.finished_at.ToNanoseconds() - snapshot.started_at.ToNanoseconds()) / 1e6
    )
    assert stats.state_size_bytes > 0
    assert stats.in_flight_messages == sum(len(c.in_flight) for c in snapshot.channels)
    text = urllib.request.urlopen(f"http://{cluster.config.controller.metrics_address}/metrics", timeout=5).read().decode()
    lines = text.splitlines()
    # Seconds, not milliseconds (Prometheus' base unit): no `_ms` histogram is left.
    assert not [line for line in lines if "_ms_" in line or "_ms{" in line or "_ms " in line]
    for name in ("start_delay", "recording_duration", "report_time"):  # per node, labelled `node`
        for node in ("p1", "p2", "p3"):
            count = next(line for line in lines if line.startswith(f'snapmesh_snapshot_{name}_seconds_count{{node="{node}"}}'))
            assert float(count.split()[-1]) >= 1, (name, node)
    mine = {n.node_id: n for n in stats.nodes}
    delays = {
        node: float(next(line for line in lines
                         if line.startswith(f'snapmesh_snapshot_start_delay_seconds_sum{{node="{node}"}}')).split()[-1])
        for node in mine
    }
    for node, seconds in delays.items():  # the sum over every snapshot so far includes this one, in seconds
        assert seconds >= mine[node].start_delay_ms / 1e3 - 1e-9, (node, seconds)
        assert seconds < 60, f"{node}: {seconds} looks like milliseconds"
    count = next(line for line in lines if line.startswith('snapmesh_snapshot_duration_seconds_count{status="COMPLETE"}'))
    assert float(count.split()[-1]) >= 1
    last = next(line for line in lines if line.startswith("snapmesh_last_complete_snapshot_timestamp_seconds "))
    assert float(last.split()[-1]) >= snapshot.finished_at.ToNanoseconds() / 1e9 - 1e-3


# ---------------------------------------------- bad arguments change nothing


def test_trigger_with_an_unknown_initiator_is_invalid_and_starts_nothing(stub):
    before = listed(stub)
    error = rpc_error(stub.TriggerSnapshot, pb.TriggerSnapshotRequest(initiator="p9", wait=True), timeout=5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "p9" in error.details()
    assert listed(stub) == before


@pytest.mark.parametrize(
    "snapshot_id, code", [("", grpc.StatusCode.INVALID_ARGUMENT), ("no-such-snapshot", grpc.StatusCode.INVALID_ARGUMENT),
                          ("../snapshots/x", grpc.StatusCode.INVALID_ARGUMENT),
                          ("20260101T000000.000000Z-00000000", grpc.StatusCode.NOT_FOUND)]
)
def test_get_snapshot_with_an_empty_or_unknown_id(stub, snapshot_id, code):
    before = listed(stub)
    error = rpc_error(stub.GetSnapshot, pb.GetSnapshotRequest(snapshot_id=snapshot_id), timeout=5)
    assert error.code() == code
    assert listed(stub) == before


def test_report_for_an_unknown_snapshot_is_not_found(cluster, stub):
    before = listed(stub)
    error = rpc_error(stub.ReportState, full_state(cluster, "20260101T000000.000000Z-00000000", "p1"), timeout=5)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert listed(stub) == before


def _bad_reports(cluster, sid):
    unknown_node = full_state(cluster, sid, "p2")
    unknown_node.node_id = "p9"
    wrong_dst = full_state(cluster, sid, "p2")
    wrong_dst.channels[0].dst = "p3"
    not_a_channel = full_state(cluster, sid, "p2")
    not_a_channel.channels[0].src = "p7"
    missing_channel = full_state(cluster, sid, "p2")
    del missing_channel.channels[0]
    uneven_run = full_state(cluster, sid, "p2")  # the app's fields wrong: 2 seqs, 1 payload
    uneven_run.outbox_runs.add(src="p2", dst=cluster.config.topology.outgoing("p2")[0], seqs=[1, 2], payloads=[b"5"])
    no_id = full_state(cluster, "", "p2")
    return [unknown_node, wrong_dst, not_a_channel, missing_channel, uneven_run, no_id]


def test_malformed_reports_are_invalid_and_leave_the_snapshot_unchanged(cluster, stub, held_snapshot):
    sid = held_snapshot.snapshot_id
    before = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=5)
    for report in _bad_reports(cluster, sid):
        error = rpc_error(stub.ReportState, report, timeout=5)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (report, error.details())
    after = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=5)
    assert after == before and after.status == IN_PROGRESS and not after.nodes


def test_a_repeated_report_is_ok_when_identical_and_already_exists_when_it_conflicts(cluster, stub, held_snapshot):
    sid = held_snapshot.snapshot_id
    # a report that does not complete the snapshot is held: answered at the snapshot's end
    first = stub.ReportState.future(full_state(cluster, sid, "p2"), timeout=120)
    try:
        before = wait_for(lambda: stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=5),
                          until=lambda s: [n.node_id for n in s.nodes] == ["p2"])
        # a node retrying after a lost answer: held with the first, nothing changes
        repeat = stub.ReportState.future(full_state(cluster, sid, "p2"), timeout=120)
        try:
            error = rpc_error(stub.ReportState, full_state(cluster, sid, "p2", balance=5), timeout=5)
            assert error.code() == grpc.StatusCode.ALREADY_EXISTS
            assert "p2" in error.details() and sid in error.details()
            assert stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=5) == before
            assert not first.done() and not repeat.done()
        finally:
            repeat.cancel()
    finally:
        first.cancel()


# ----------------------------------------------- controller alone, restarts


@pytest.fixture
def lone_controller(tmp_path):
    """A controller whose nodes were never started."""
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, deadline=5)
    lone = Cluster(path)
    try:
        lone.start_controller()
        yield lone
    finally:
        lone.stop()


def test_an_unreachable_initiator_fails_the_snapshot_with_that_reason(lone_controller):
    channel, stub = controller_stub(lone_controller.controller_address)
    with channel:
        snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=10)
        assert snapshot.status == FAILED
        assert "initiator p2 unreachable" in snapshot.reason
        report = full_state(lone_controller, snapshot.snapshot_id, "p1")
        error = rpc_error(stub.ReportState, report, timeout=5)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snapshot.snapshot_id), timeout=5) == snapshot


def test_interval_takes_periodic_snapshots(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, deadline=5)
    periodic = Cluster(path, controller_args=["--interval", "0.3"])
    try:
        periodic.start_controller()
        channel, stub = controller_stub(periodic.controller_address)
        with channel:
            snapshots = wait_for(lambda: [s for s in listed(stub) if s.status != IN_PROGRESS], until=lambda done: len(done) >= 3,
                                 timeout=15, interval=0.1, what="three finished periodic snapshots")
        # no node runs, so each one fails (after one wait for the channel), naming its initiator
        assert all(s.status == FAILED and "unreachable" in s.reason for s in snapshots)
        assert {s.initiator for s in snapshots} <= {"p1", "p2"}
    finally:
        periodic.stop()


def test_finished_snapshots_survive_a_controller_restart_and_a_corrupt_file_is_skipped(cluster):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        complete = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p3", wait=True), timeout=30)
        assert complete.status == COMPLETE
        finished_before = [s for s in listed(stub) if s.status != IN_PROGRESS]

    snapshots_dir = cluster.config.snapshots_dir
    exported = snapshots_dir / f"{complete.snapshot_id}.json"
    # written in the background, off the reply path
    wait_for(exported.exists, timeout=10, what=f"{exported} written")
    on_disk = json.loads(exported.read_text())
    assert on_disk["snapshot_id"] == complete.snapshot_id and on_disk["status"] == "COMPLETE"
    assert "expected_total" in on_disk and "finished_at" in on_disk  # snake_case names
    assert not list(snapshots_dir.glob(".*.tmp"))
    corrupt = snapshots_dir / "zz-corrupt.json"
    corrupt.write_text("{ not json")

    assert cluster.stop_controller() == 0
    cluster.start_controller()  # on the same data dir: its snapshots/ are read back
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        after = {s.snapshot_id: s for s in listed(stub)}
        for snapshot in finished_before:
            assert after[snapshot.snapshot_id] == snapshot
        served = stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=complete.snapshot_id), timeout=5)
        assert served == complete
        # and it still takes new ones
        assert stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=30).status == COMPLETE
    log_text = (cluster.log_dir / "controller.log").read_text()
    assert "zz-corrupt.json" in log_text and "WARNING" in log_text


# ---------------------------------------------------- health and reflection


def reflected_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        return {s.name for r in responses for s in r.list_services_response.service}


def test_reflection_lists_the_controller_and_node_services_and_health(cluster):
    controller = reflected_services(cluster.controller_address)
    assert {"snapmesh.v1.Controller", "grpc.health.v1.Health"} <= controller
    node = reflected_services(cluster.node_address("p1"))
    assert {"snapmesh.v1.Node", "grpc.health.v1.Health"} <= node


def test_health_says_serving_for_the_server_and_the_controller_service(cluster):
    with grpc.insecure_channel(cluster.controller_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "snapmesh.v1.Controller"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_an_unknown_initiator_is_invalid_argument_naming_the_nodes(stub):
    error = rpc_error(stub.TriggerSnapshot, pb.TriggerSnapshotRequest(initiator="zz"), timeout=5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "unknown initiator 'zz' (nodes: p1, p2, p3)"
