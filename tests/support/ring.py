"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
import grpc
from support.binaries import grpcurl_binary
from support.polling import wait_for
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc


ROOT = Path(__file__).resolve().parents[2]


EXAMPLES = ROOT / "examples"


APP = "token_ring:app"


CLI = [sys.executable, "-m", "snapmesh.cli"]


def env_with(*paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def grpcurl_submit(address: str, command: bytes) -> subprocess.CompletedProcess:
    body = json.dumps({"command": base64.b64encode(command).decode()})
    return subprocess.run([str(grpcurl_binary()), "-plaintext", "-d", body, address, "snapmesh.v1.Node/Submit"],
                          capture_output=True, text=True, timeout=60)


def submit(address: str, command: bytes, timeout: float = 10) -> bytes:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=command), timeout=timeout).reply


def tokens(cfg: config.ClusterConfig) -> int:
    """The tokens the nodes hold now (b"has" at each)."""
    return sum(int(submit(n.address, b"has")) for n in cfg.nodes)


def held_by(cfg: config.ClusterConfig, node: str, seconds: float = 10) -> None:
    """Wait until `node` holds the token: a pass is answered once logged, and the
    token then takes a channel hop to arrive (until then every node says 0)."""
    wait_for(lambda: submit(cfg.node(node).address, b"has"), until=lambda has: has == b"1", timeout=seconds, interval=0.02,
             what=f"{node} to get the token")


def wait_serving(address: str, seconds: float = 60) -> None:
    def state():
        with grpc.insecure_channel(address) as channel:
            return pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=2)

    wait_for(state, until=lambda _: True, timeout=seconds, interval=0.3, retry_on=grpc.RpcError, what=f"{address} to serve")


class Passer:
    """Sends b"pass" to every node in turn, as fast as they answer, until stopped
    (refusals are the normal answer of the nodes without the token)."""

    def __init__(self, cfg: config.ClusterConfig) -> None:
        self.passed = 0
        self._stop = threading.Event()
        self._channels = [grpc.insecure_channel(n.address) for n in cfg.nodes]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stubs = [pb_grpc.NodeStub(c) for c in self._channels]
        while not self._stop.is_set():
            for stub in stubs:
                try:
                    stub.Submit(pb.SubmitRequest(command=b"pass"), timeout=5)
                    self.passed += 1
                except grpc.RpcError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for channel in self._channels:
            channel.close()


def checked(snapshot: pb.Snapshot) -> None:
    assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
    assert snapshot.app.spec == APP and snapshot.app.status == pb.AppCheck.CHECKED, snapshot
    assert [(i.name, i.ok) for i in snapshot.app.invariants] == [("one token", True)], snapshot.app


def in_flight(snapshot: pb.Snapshot) -> list[tuple[str, str, int, bytes]]:
    return [(c.src, c.dst, t.seq, t.payload) for c in snapshot.channels for t in c.in_flight]
