"""SNAPMESH_HEALTH_PORT: the health service alone, in plaintext, beside a mutual-TLS
port (what the Helm chart's kubelet gRPC probes call; snapmesh/serving/runtime.py).

A real controller process with TLS on: its health port answers SERVING in
plaintext for the whole server and for snapmesh.v1.Controller, serves nothing
else (UNIMPLEMENTED), the main port still refuses plaintext, and a value that is
not a port stops the process at start-up with exit 2 naming the variable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from support.polling import wait_for
from snapmesh.settings import config as cluster_config
from snapmesh.settings.ports import free_ports

SNAPMESH = str(Path(sys.executable).parent / "snapmesh")


@pytest.fixture
def tls_cluster(tmp_path):
    path = cluster_config.write_cluster(tmp_path / "cluster.toml", nodes=2)
    subprocess.run([SNAPMESH, "certs", "--config", str(path), "--out", str(tmp_path / "tls")],
                   check=True, capture_output=True, timeout=60)
    return path, tmp_path / "tls"


def _env(tls_dir: Path, health: str) -> dict[str, str]:
    return {**os.environ, "SNAPMESH_TLS_DIR": str(tls_dir), "SNAPMESH_HEALTH_PORT": health}


def _health(address: str, service: str, timeout: float = 2.0) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


def test_plaintext_health_beside_tls(tls_cluster):
    path, tls_dir = tls_cluster
    cfg = cluster_config.load(path, env={})
    [health_port] = free_ports(1, "127.0.0.1")
    proc = subprocess.Popen([SNAPMESH, "controller", "--config", str(path)], env=_env(tls_dir, str(health_port)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        address = f"127.0.0.1:{health_port}"

        def serving() -> bool:
            try:
                if _health(address, "") == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            return False

        wait_for(serving, timeout=30, interval=0.2, what="the health port SERVING")
        assert _health(address, "snapmesh.v1.Controller") == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(address) as channel:
            get_cluster = channel.unary_unary("/snapmesh.v1.Controller/GetCluster", request_serializer=lambda _: b"",
                                              response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as info:
                get_cluster(None, timeout=2)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as info:  # the main port is still mutual TLS only
            _health(cfg.controller.address, "", timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("value", ["abc", "0", "70000"])
def test_bad_health_port_exits_2(tls_cluster, value):
    path, tls_dir = tls_cluster
    result = subprocess.run([SNAPMESH, "controller", "--config", str(path)], env=_env(tls_dir, value),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"SNAPMESH_HEALTH_PORT='{value}'" in result.stderr
