"""`snapmesh health` says what to do when its TLS and the server's differ (issue 25,
"errors that say what to do"): a real plaintext gRPC health server on loopback,
asked with a client certificate, is named as plaintext and the fix is to drop
--tls-dir. (Plaintext against a TLS server: tests/test_security.py.)"""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from snapmesh import config
from snapmesh.health import main as health_main
from snapmesh.launcher import write_config
from snapmesh.security import write_certs


@pytest.fixture
def plaintext_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_a_tls_check_of_a_plaintext_server_says_to_drop_tls_dir(plaintext_server, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SNAPMESH_TLS_DIR", raising=False)
    write_certs(config.load(write_config(tmp_path / "cluster.toml", nodes=1)), tmp_path / "tls")
    assert health_main([plaintext_server]) == 0
    assert capsys.readouterr().out == f"{plaintext_server}: SERVING\n"
    assert health_main([plaintext_server, "--tls-dir", str(tmp_path / "tls"), "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{plaintext_server}: NOT SERVING")
    assert f"{plaintext_server} does not speak TLS: drop --tls-dir" in out and len(out.splitlines()) == 1


def test_an_unreachable_server_gets_no_tls_advice(tmp_path, capsys):
    from snapmesh.ports import free_ports

    [port] = free_ports(1, "127.0.0.1")
    assert health_main([f"127.0.0.1:{port}", "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert "NOT SERVING (unreachable" in out and "TLS" not in out
