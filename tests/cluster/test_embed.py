"""`snapmesh.embed` in a user's own gRPC service, against real processes.

tests/support/embed_host.py is the user's program: a `shop.Shop` service of its
own (generic handlers, no proto) with its own interceptor and port, hosting node
p1 of examples/token_ring.py by `snapmesh.embed`; p2 and p3 are `snapmesh node`
processes and the controller is `snapmesh controller`. The user's interceptor
still guards the user's RPC (and not snapmesh's: the node's channels work); the
user's handler's `node.submit` passes the token, exactly once with a request id;
snapshots are COMPLETE with the invariant checked by the controller; a kill -9
of the embedding process and its restart recovers from p1's log with one token;
SIGTERM closes the node with no task left and the port free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.settings.ports import free_ports, port_is_free
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.polling import wait_for
from support.ring import EXAMPLES, ROOT, Passer, checked, env_with, tokens

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

HOST = Path(__file__).resolve().parents[1] / "support" / "embed_host.py"
KEY = (("shop-key", "open-sesame"),)


def write_app_cluster(root: Path, **kwargs) -> Path:
    path = write_cluster(root / "cluster.toml", nodes=3, data_dir=root / "data", **kwargs)
    path.write_text(path.read_text() + '\n[app]\nmodule = "token_ring:app"\n')
    return path


class Host:
    """The embedding program, a subprocess."""

    def __init__(self, path: Path, shop_port: int) -> None:
        self.path, self.shop_port = path, shop_port
        self.address = f"127.0.0.1:{shop_port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = env_with(EXAMPLES, ROOT / "tests")
        self.process = subprocess.Popen([sys.executable, str(HOST), str(self.path), "p1", str(self.shop_port)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.process.kill()
            raise AssertionError(f"the host did not start: {line!r} {self.process.stderr.read()}")

    def call(self, method: str, *, key=KEY, request_id: str = "") -> bytes:
        metadata = (*key, *((("request-id", request_id),) if request_id else ()))
        with grpc.insecure_channel(self.address) as channel:
            return channel.unary_unary(f"/shop.Shop/{method}")(b"", metadata=metadata, timeout=10)


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    path = write_app_cluster(root)
    host = Host(path, free_ports(1)[0])
    cluster = Cluster(path, env=env_with(EXAMPLES))
    try:
        cluster.start_controller()
        cluster.start("p2", "p3")
        host.start()
        yield cluster, host
    finally:
        if host.process is not None and host.process.poll() is None:
            host.process.kill()
            host.process.wait(10)
        cluster.stop()


def controller(cluster: Cluster) -> pb_grpc.ControllerStub:
    return pb_grpc.ControllerStub(grpc.insecure_channel(cluster.controller_address))


def test_the_users_interceptor_still_guards_the_users_rpc(shop):
    _, host = shop
    with pytest.raises(grpc.RpcError) as refused:
        host.call("Has", key=())
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "the shop wants its key"
    assert host.call("Has") in (b"0", b"1")


def test_the_users_handler_submits_and_snapshots_complete_with_the_invariant(shop):
    cluster, host = shop
    p1 = cluster.config.node("p1").address
    with grpc.insecure_channel(p1) as channel:  # the node's own service on the node's port
        assert pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b"has"), timeout=10).reply == b"1"
    assert host.call("Pass", request_id="shop-1") == b"passed to p2"
    assert host.call("Pass", request_id="shop-1") == b"passed to p2"  # a retry: answered, not run again
    wait_for(lambda: tokens(cluster.config), until=lambda n: n == 1, timeout=10, interval=0.05, what="one token")
    passer = Passer(cluster.config)
    try:
        stub = controller(cluster)
        for _ in range(5):
            checked(stub.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
    finally:
        passer.stop()
    assert passer.passed > 0
    wait_for(lambda: tokens(cluster.config), until=lambda n: n == 1, timeout=10, interval=0.05, what="one token")


def test_a_kill_9_of_the_embedding_process_and_its_restart_recover(shop):
    cluster, host = shop
    passer = Passer(cluster.config)
    try:
        wait_for(lambda: passer.passed, until=lambda n: n >= 3, timeout=30, interval=0.05, what="passes")
        host.process.send_signal(signal.SIGKILL)
        host.process.wait(10)
    finally:
        passer.stop()
    host.start()
    wait_for(lambda: tokens(cluster.config), until=lambda n: n == 1, timeout=30, interval=0.1,
             retry_on=grpc.RpcError, what="one token after the restart")
    checked(controller(cluster).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))


def test_sigterm_closes_the_node_with_no_task_left_and_the_port_free(shop):
    cluster, host = shop
    host.process.send_signal(signal.SIGTERM)
    out, err = host.process.communicate(timeout=60)
    assert host.process.returncode == 0, err
    assert "tasks left: 0 []" in out, (out, err)
    assert "Traceback" not in err, err
    node_port = int(cluster.config.node("p1").address.rsplit(":", 1)[1])
    assert port_is_free("127.0.0.1", node_port) and port_is_free("127.0.0.1", host.shop_port)
    assert os.path.exists(cluster.config.data_dir / "p1.lock")  # the lock file stays; the flock is gone
