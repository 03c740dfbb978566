"""Mutual TLS and the control-plane token, against real processes.

Each refusal the issue names is shown on a running TLS cluster: plaintext, a
certificate from another CA, a node's certificate used to open a channel as
another node, a missing or wrong token (nothing changes). The same cluster
completing a snapshot is the control: the refusals are not "refuse everything".
Bad certificate, key and token files stop a process at start-up with exit 2 and
a line naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import stat
import subprocess
import sys

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapmesh.services.controller.process import main as controller_main
from snapmesh.services.node.process import main as node_main
from snapmesh.settings import config, security
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.settings.security import load_tls_dir, write_certs
from snapmesh.serving.credentials import open_channel
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    path = write_cluster(root / "cluster.toml", nodes=3, initial_balance=1000)
    write_certs(config.load(path), root / "tls")
    with Cluster(path, tls_dir=root / "tls") as cluster:
        yield cluster


def controller(cluster, identity) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    channel = open_channel(cluster.controller_address, identity)
    return channel, pb_grpc.ControllerStub(channel)


def call_code(rpc, request) -> grpc.StatusCode:
    try:
        rpc(request, timeout=10)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def log_kinds(cluster, node_id: str) -> list[str]:
    path = cluster.config.log_path(node_id)
    return [json.loads(line)["kind"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.cluster
def test_a_snapshot_completes_over_tls_with_the_token(tls_cluster):
    channel, stub = controller(tls_cluster, tls_cluster.client_identity)
    with channel:
        node_channel = open_channel(tls_cluster.node_address("p1"), tls_cluster.client_identity)
        with node_channel:
            pb_grpc.NodeStub(node_channel).Transfer(pb.TransferRequest(to="p2", amount=5), timeout=10)
        snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
    assert snapshot.status == pb.Snapshot.COMPLETE and snapshot.conserved
    assert len(snapshot.channels) == 6  # every node accepted every channel stream over mTLS


@pytest.mark.cluster
def test_plaintext_is_refused(tls_cluster):
    for address in (tls_cluster.controller_address, tls_cluster.node_address("p1")):
        with grpc.insecure_channel(address) as channel:
            code = call_code(health_pb2_grpc.HealthStub(channel).Check, health_pb2.HealthCheckRequest())
        assert code == grpc.StatusCode.UNAVAILABLE, address


@pytest.mark.cluster
def test_a_certificate_from_another_ca_is_refused(tls_cluster, tmp_path):
    write_certs(tls_cluster.config, tmp_path / "other")  # same names, another CA
    stranger = load_tls_dir(tmp_path / "other")
    for address in (tls_cluster.controller_address, tls_cluster.node_address("p2")):
        with open_channel(address, stranger) as channel:
            code = call_code(health_pb2_grpc.HealthStub(channel).Check, health_pb2.HealthCheckRequest())
        assert code == grpc.StatusCode.UNAVAILABLE, address
    # Trusting the real CA but presenting another CA's client certificate: refused too.
    mixed = dataclasses.replace(stranger, ca=tls_cluster.client_identity.ca)
    with open_channel(tls_cluster.controller_address, mixed) as channel:
        code = call_code(pb_grpc.ControllerStub(channel).ListSnapshots, pb.ListSnapshotsRequest())
    assert code == grpc.StatusCode.UNAVAILABLE


def open_stream_as(cluster, identity, *, src: str, dst: str) -> tuple[grpc.StatusCode | None, str]:
    """Open dst's Channel with `identity`'s certificate, claiming to be `src`."""
    with open_channel(cluster.node_address(dst), identity) as channel:
        call = pb_grpc.NodeStub(channel).Channel(iter([pb.ChannelFrame(open=pb.ChannelOpen(src=src, dst=dst))]),
                                                 timeout=10)
        try:
            for _ack in call:
                return None, "accepted"
        except grpc.RpcError as error:
            return error.code(), error.details()
    return None, "ended"


@pytest.mark.cluster
def test_a_node_certificate_cannot_open_a_channel_as_another_node(tls_cluster):
    tls = tls_cluster.config.tls
    p2 = security.load_files("p2", ca=tls.ca, cert=tls.cert_path("p2"), key=tls.key_path("p2"), token_file=None)
    code, details = open_stream_as(tls_cluster, p2, src="p3", dst="p1")
    assert code == grpc.StatusCode.PERMISSION_DENIED, details
    assert "'p3'" in details
    code, details = open_stream_as(tls_cluster, tls_cluster.client_identity, src="p2", dst="p1")
    assert code == grpc.StatusCode.PERMISSION_DENIED, details


@pytest.mark.cluster
def test_a_node_certificate_cannot_report_another_nodes_state(tls_cluster):
    tls = tls_cluster.config.tls
    p2 = security.load_files("p2", ca=tls.ca, cert=tls.cert_path("p2"), key=tls.key_path("p2"), token_file=None)
    channel, stub = controller(tls_cluster, p2)
    with channel:
        forged = pb.FullState(snapshot_id="nope", node_id="p1", balance=1)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ReportState(forged, timeout=10)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()


@pytest.mark.cluster
def test_a_missing_or_wrong_token_is_unauthenticated_and_changes_nothing(tls_cluster):
    no_token = dataclasses.replace(tls_cluster.client_identity, token=None)
    wrong_token = dataclasses.replace(tls_cluster.client_identity, token="not-the-token")
    with open_channel(tls_cluster.controller_address, tls_cluster.client_identity) as channel:
        before = pb_grpc.ControllerStub(channel).ListSnapshots(pb.ListSnapshotsRequest(), timeout=10)
    kinds_before = {n: log_kinds(tls_cluster, n) for n in tls_cluster.node_ids}

    for identity in (no_token, wrong_token):
        channel, stub = controller(tls_cluster, identity)
        with channel:
            assert call_code(stub.TriggerSnapshot, pb.TriggerSnapshotRequest(initiator="p1", wait=True)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
            # Read-only calls stay open to a client with a certificate (no protect_reads).
            assert call_code(stub.ListSnapshots, pb.ListSnapshotsRequest()) == grpc.StatusCode.OK
        with open_channel(tls_cluster.node_address("p1"), identity) as node_channel:
            node = pb_grpc.NodeStub(node_channel)
            # A node asks for no token (it holds none): the controller's certificate, which this is not.
            assert call_code(node.StartSnapshot, pb.StartSnapshotRequest(snapshot_id="intruder")) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
            assert call_code(node.AbortSnapshot, pb.AbortSnapshotRequest(snapshot_id="x", reason="x")) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
            assert call_code(node.GetState, pb.GetStateRequest()) == grpc.StatusCode.OK

    with open_channel(tls_cluster.controller_address, tls_cluster.client_identity) as channel:
        after = pb_grpc.ControllerStub(channel).ListSnapshots(pb.ListSnapshotsRequest(), timeout=10)
    assert after == before, "a refused trigger made a snapshot"
    assert {n: log_kinds(tls_cluster, n) for n in tls_cluster.node_ids} == kinds_before, "a refused call was logged"


@pytest.mark.cluster
def test_cluster_file_tls_section_and_protect_reads(tmp_path):
    """[tls] paths relative to the cluster file, [auth] protect_reads = true: reads need the token too."""
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    write_certs(config.load(path), tmp_path / "certs")
    path.write_text(path.read_text() + (
        '\n[tls]\nca = "certs/ca.pem"\ncert = "certs/{name}.pem"\nkey = "certs/{name}-key.pem"\n'
        'client_cert = "certs/client.pem"\nclient_key = "certs/client-key.pem"\n'
        '\n[auth]\ntoken_file = "certs/token"\nprotect_reads = true\n'
    ))
    with Cluster(path) as cluster:
        assert cluster.client_identity is not None and cluster.client_identity.protect_reads
        no_token = dataclasses.replace(cluster.client_identity, token=None)
        with open_channel(cluster.controller_address, no_token) as channel:
            stub = pb_grpc.ControllerStub(channel)
            assert call_code(stub.GetCluster, pb.GetClusterRequest()) == grpc.StatusCode.UNAUTHENTICATED
            # Health stays open: healthchecks carry no token.
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with open_channel(cluster.controller_address, cluster.client_identity) as channel:
            assert call_code(pb_grpc.ControllerStub(channel).GetCluster, pb.GetClusterRequest()) == grpc.StatusCode.OK


# ------------------------------------------------------------------ bad files, at start-up


@pytest.fixture()
def certs(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    write_certs(config.load(path), tmp_path / "tls")
    return path, tmp_path / "tls"


def start(monkeypatch, capsys, path, tls_dir, who: str) -> tuple[int, str]:
    monkeypatch.setenv("SNAPMESH_TLS_DIR", str(tls_dir))
    if who == "controller":
        status = controller_main(["--config", str(path)])
    else:
        status = node_main(["--config", str(path), "--id", who])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("damage", "who", "message"),
    [
        (lambda d: (d / "p1.pem").unlink(), "p1", "p1.pem: no such file"),
        (lambda d: (d / "p1-key.pem").write_text("garbage\n"), "p1", "p1-key.pem: not a PEM private key"),
        (lambda d: (d / "p1-key.pem").write_bytes((d / "p2-key.pem").read_bytes()), "p1",
         "p1-key.pem: this key does not belong to the certificate"),
        (lambda d: (d / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
         "controller", "ca.pem: not a PEM certificate"),
        (lambda d: (d / "token").write_text("\n"), "controller", "token: the token must be one line"),
        (lambda d: (d / "token").unlink(), "controller", "token: no such file"),  # a node reads none
    ],
    ids=["missing-cert", "malformed-key", "mismatched-key", "malformed-ca", "empty-token", "missing-token"],
)
def test_bad_files_stop_start_up_with_exit_2_naming_the_file(certs, monkeypatch, capsys, damage, who, message):
    path, tls_dir = certs
    damage(tls_dir)
    status, err = start(monkeypatch, capsys, path, tls_dir, who)
    assert status == 2 and message in err and str(tls_dir) in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_certificate_from_another_ca_stops_start_up(certs, tmp_path, monkeypatch, capsys):
    path, tls_dir = certs
    write_certs(config.load(path), tmp_path / "other")
    for name in ("p1.pem", "p1-key.pem"):
        (tls_dir / name).write_bytes((tmp_path / "other" / name).read_bytes())
    status, err = start(monkeypatch, capsys, path, tls_dir, "p1")
    assert status == 2 and "p1.pem: not signed by the CA" in err, err


def test_auth_without_tls_is_a_config_error(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    path.write_text(path.read_text() + '\n[auth]\ntoken_file = "token"\n')
    with pytest.raises(config.ConfigError, match=r"auth: needs a \[tls\] section"):
        config.load(path)


# ------------------------------------------------------------------ snapmesh certs


def test_certs_command_writes_named_certificates(tmp_path):
    path = write_cluster(tmp_path / "cluster.toml", nodes=3)
    result = subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "certs", "--config", str(path), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    for name in ("ca.pem", "client.pem", "client-key.pem", "token", "controller.pem", "p1.pem", "p3-key.pem"):
        assert (out / name).is_file(), name
    assert stat.S_IMODE((out / "p1-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "token").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((out / "p2.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "p2" in sans.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    assert "grpcurl: grpcurl -cacert" in result.stdout and "authorization: Bearer " in result.stdout


@pytest.mark.cluster
def test_health_checks_a_tls_server_with_tls_dir_only(tls_cluster, capsys):
    from snapmesh.commands.health import main as health_main

    tls_dir = str(tls_cluster.config.tls.ca.parent)
    address = tls_cluster.node_address("p1")
    assert health_main([address, "--tls-dir", tls_dir]) == 0
    assert "SERVING" in capsys.readouterr().out
    assert health_main([address, "--timeout", "2"]) == 1  # plaintext against a TLS server
    out = capsys.readouterr().out
    assert "NOT SERVING" in out and f"TLS is on at {address}" in out and "--tls-dir" in out


@pytest.mark.cluster
def test_a_plaintext_cli_against_tls_says_tls_is_on_and_which_flag(tls_cluster, capsys, monkeypatch):
    from snapmesh.commands.restore import main as restore_main
    from snapmesh.commands.snapshot_cli import main as snapshot_main

    monkeypatch.delenv("SNAPMESH_TLS_DIR", raising=False)
    address = tls_cluster.controller_address
    assert snapshot_main(["list", "--controller", address, "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert f"TLS is on at {address}" in err and "--tls-dir DIR" in err
    assert restore_main(["--controller", address, "--yes", "--timeout", "5", "some-id"]) == 1
    assert "TLS is on" in capsys.readouterr().err  # instead of only "Socket closed"
    tls_dir = str(tls_cluster.config.tls.ca.parent)
    assert snapshot_main(["list", "--controller", address, "--tls-dir", tls_dir]) == 0
    node = tls_cluster.node_address("p2")
    assert snapshot_main(["list", "--controller", node, "--tls-dir", tls_dir]) == 1
    assert f"{node} is node p2's address, not the controller's" in capsys.readouterr().err
