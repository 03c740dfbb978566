"""Clients say what to do when their TLS and the server's differ (errors
that say what to do), beyond `snapmesh snapshot`/`restore`/`app` (tested in
test_security.py and test_snapshot_cli.py): `snapmesh health` and
`snapmesh ui`'s "controller does not answer" page. Real gRPC servers on loopback,
one plaintext and one with the cluster's TLS (certificates from `write_certs`)."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from snapmesh.settings import config
from snapmesh.commands.health import main as health_main
from snapmesh.settings.config import write_cluster
from snapmesh.settings.ports import free_ports
from snapmesh.settings.security import load_tls_dir, write_certs


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hints")
    write_certs(config.load(write_cluster(root / "cluster.toml", nodes=1)), root / "tls")
    return root / "tls"


def serve(tls: Path | None):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        credentials = grpc.ssl_server_credentials(
            [((tls / "controller-key.pem").read_bytes(), (tls / "controller.pem").read_bytes())],
            root_certificates=(tls / "ca.pem").read_bytes(), require_client_auth=True)
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def plaintext_server():
    server, address = serve(None)
    yield address
    server.stop(None)


@pytest.fixture(scope="module")
def tls_server(tls_dir):
    server, address = serve(tls_dir)
    yield address
    server.stop(None)


@pytest.fixture(autouse=True)
def no_tls_from_the_environment(monkeypatch):
    monkeypatch.delenv("SNAPMESH_TLS_DIR", raising=False)


def test_a_tls_health_check_of_a_plaintext_server_says_to_drop_tls_dir(plaintext_server, tls_dir, capsys):
    assert health_main([plaintext_server]) == 0
    assert capsys.readouterr().out == f"{plaintext_server}: SERVING\n"
    assert health_main([plaintext_server, "--tls-dir", str(tls_dir), "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{plaintext_server}: NOT SERVING")
    assert f"{plaintext_server} does not speak TLS" in out and "drop --tls-dir" in out


def test_a_plaintext_health_check_of_a_tls_server_says_tls_is_on(tls_server, tls_dir, capsys):
    assert health_main([tls_server, "--tls-dir", str(tls_dir)]) == 0
    capsys.readouterr()
    assert health_main([tls_server, "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert f"TLS is on at {tls_server}" in out and "give --tls-dir DIR" in out


def test_an_unreachable_server_gets_no_tls_advice(capsys):
    [port] = free_ports(1, "127.0.0.1")
    assert health_main([f"127.0.0.1:{port}", "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert "NOT SERVING (unreachable" in out and "TLS" not in out


def test_the_ui_page_says_tls_is_on_and_which_flag(tls_server, tls_dir):
    from snapmesh.ui.source import ControllerDown, Source

    source = Source(tls_server)
    try:
        with pytest.raises(ControllerDown) as raised:
            source.cluster()
    finally:
        source.close()
    assert f"TLS is on at {tls_server}" in str(raised.value) and "--tls-dir DIR" in str(raised.value)

    source = Source(tls_server, load_tls_dir(tls_dir))  # with the certificates: past TLS, no advice
    try:
        with pytest.raises(ControllerDown) as raised:
            source.cluster()  # a health-only server: no Controller service here
    finally:
        source.close()
    assert "TLS is on" not in str(raised.value) and "UNIMPLEMENTED" in str(raised.value)


def test_the_ui_page_with_tls_against_plaintext_says_to_drop_it(plaintext_server, tls_dir):
    from snapmesh.ui.source import ControllerDown, Source

    source = Source(plaintext_server, load_tls_dir(tls_dir))
    try:
        with pytest.raises(ControllerDown) as raised:
            source.cluster()
    finally:
        source.close()
    assert f"{plaintext_server} does not speak TLS" in str(raised.value) and "drop --tls-dir" in str(raised.value)
