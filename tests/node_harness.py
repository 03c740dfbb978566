"""Real node processes on loopback for the node tests.

- `free_ports(n)`: free loopback ports (the launcher's, below the ephemeral range).
- `write_config(...)`: a temp cluster TOML with free ports and data_dir in tmp.
- `NodeProcess`: `snapmesh node` as a child process (its own session), started,
  waited for (gRPC health SERVING), stopped (SIGTERM) or killed (SIGKILL).
- `ReportSink`: a tiny real gRPC `Controller` server (in a thread of the test
  process) that accepts `ReportState` and keeps every FullState; the other
  Controller RPCs answer UNIMPLEMENTED. The node tests use it instead of the
  real controller so they test the node alone.
- `read_log`, `money_check`: what the transfer logs say.

Every start registers its stop, so a fixture finalizer (`Cluster.close`) kills
whatever a test left running, and no process or port outlives the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapmesh.launcher import free_ports
from snapmesh.launcher import port_is_free as launcher_port_is_free
from snapmesh import wal
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent


def port_is_free(port: int) -> bool:
    return launcher_port_is_free("127.0.0.1", port)


def write_config(
    tmp_path: Path,
    node_ids: list[str],
    *,
    balance: int = 1000,
    channels: list[tuple[str, str]] | None = None,
    proxied: tuple[str, ...] = (),
    deadline: float = 10,
) -> tuple[Path, dict]:
    """Write `cluster.toml`; returns (path, ports). For a node in `proxied`, the
    node listens on `ports[id]["listen"]` while peers dial `ports[id]["port"]`,
    where a test puts its proxy."""
    needed = 2 + 3 * len(node_ids)
    pool = iter(free_ports(needed))
    ports: dict = {"controller": next(pool), "controller_metrics": next(pool)}
    lines = [f'data_dir = "{tmp_path / "data"}"', f"initial_balance = {balance}"]
    if channels is not None:
        lines.append("channels = [" + ", ".join(f'["{a}", "{b}"]' for a, b in channels) + "]")
    lines += [
        "",
        "[controller]",
        'host = "127.0.0.1"',
        f"port = {ports['controller']}",
        f"metrics_port = {ports['controller_metrics']}",
        f"snapshot_deadline_s = {deadline}",
    ]
    for node_id in node_ids:
        entry = {"port": next(pool), "metrics": next(pool), "listen": next(pool)}
        ports[node_id] = entry
        lines += [
            "",
            "[[nodes]]",
            f'id = "{node_id}"',
            'host = "127.0.0.1"',
            f"port = {entry['port']}",
            f"metrics_port = {entry['metrics']}",
        ]
        if node_id in proxied:
            lines.append(f"listen_port = {entry['listen']}")
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, ports


# ----------------------------------------------------------------- processes


class NodeProcess:
    def __init__(self, config: Path, node_id: str, address: str, log_dir: Path) -> None:
        self.config = config
        self.node_id = node_id
        self.address = address  # what clients dial (the proxy, for a proxied node)
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def output_path(self) -> Path:
        return self.log_dir / f"{self.node_id}.out"

    def start(self, *, wait: bool = True, listen_address: str | None = None) -> NodeProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        out = open(self.output_path, "ab")
        out.write(f"---- start #{self.starts}\n".encode())
        out.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "snapmesh.cli", "node", "--config", str(self.config), "--id", self.node_id],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # signals to it never reach pytest
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        out.close()
        if wait:
            wait_serving(listen_address or self.address, proc=self.proc, what=f"node {self.node_id}", output=self.output_path)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not go. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError(f"node {self.node_id} did not stop within {timeout}s of SIGTERM") from None
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        return self.output_path.read_text(errors="replace") if self.output_path.exists() else ""


def wait_serving(address: str, *, proc: subprocess.Popen | None = None, what: str = "", output: Path | None = None,
                 timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc is not None and proc.poll() is not None:
                text = output.read_text(errors="replace") if output else ""
                raise AssertionError(f"{what} exited with {proc.returncode} before serving:\n{text}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} at {address} not SERVING within {timeout}s")
            time.sleep(0.05)


def run_node_once(config: Path, node_id: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    """Run `snapmesh node` expecting it to exit by itself (start-up errors)."""
    return subprocess.run(
        [sys.executable, "-m", "snapmesh.cli", "node", "--config", str(config), "--id", node_id],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------- a real gRPC controller


class ReportSink(pb_grpc.ControllerServicer):
    """Accepts ReportState and keeps the states; `refuse` makes it answer UNAVAILABLE."""

    def __init__(self, port: int) -> None:
        self.states: dict[str, dict[str, pb.FullState]] = defaultdict(dict)
        self.calls = 0
        self.refuse = False
        self._lock = threading.Condition()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ControllerServicer_to_server(self, self.server)
        bound = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert bound == port, f"cannot bind the report sink on {port}"
        self.server.start()

    def ReportState(self, request: pb.FullState, context: grpc.ServicerContext) -> pb.ReportStateResponse:
        with self._lock:
            self.calls += 1
            if self.refuse:
                context.abort(grpc.StatusCode.UNAVAILABLE, "refusing on purpose")
            copy = pb.FullState()
            copy.CopyFrom(request)
            self.states[request.snapshot_id][request.node_id] = copy
            self._lock.notify_all()
        return pb.ReportStateResponse()

    def wait_for(self, snapshot_id: str, nodes: set[str], timeout: float = 20.0) -> dict[str, pb.FullState]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while set(self.states[snapshot_id]) != nodes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"snapshot {snapshot_id}: reports from {sorted(self.states[snapshot_id])}, wanted {sorted(nodes)}"
                    )
                self._lock.wait(left)
            return dict(self.states[snapshot_id])

    def close(self) -> None:
        self.server.stop(0).wait(5)


# ------------------------------------------------------------------- cluster


class Cluster:
    """Nodes + a report sink from one config; `close()` kills everything."""

    def __init__(self, tmp_path: Path, node_ids: list[str], *, balance: int = 1000,
                 channels: list[tuple[str, str]] | None = None, proxied: tuple[str, ...] = (),
                 deadline: float = 10) -> None:
        self.tmp_path = tmp_path
        self.node_ids = node_ids
        self.balance = balance
        self.config, self.ports = write_config(
            tmp_path, node_ids, balance=balance, channels=channels, proxied=proxied, deadline=deadline
        )
        self.data_dir = tmp_path / "data"
        self.sink = ReportSink(self.ports["controller"])
        self.nodes = {
            node_id: NodeProcess(self.config, node_id, f"127.0.0.1:{self.ports[node_id]['port']}", tmp_path)
            for node_id in node_ids
        }
        self.proxied = proxied
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def total(self) -> int:
        return self.balance * len(self.node_ids)

    def direct_address(self, node_id: str) -> str:
        entry = self.ports[node_id]
        return f"127.0.0.1:{entry['listen'] if node_id in self.proxied else entry['port']}"

    def start(self, *node_ids: str) -> None:
        """Start the nodes (all at once), then wait until each is SERVING."""
        chosen = node_ids or self.node_ids
        for node_id in chosen:
            self.nodes[node_id].start(wait=False)
        for node_id in chosen:
            node = self.nodes[node_id]
            wait_serving(self.direct_address(node_id), proc=node.proc, what=f"node {node_id}", output=node.output_path)

    def stub(self, node_id: str) -> pb_grpc.NodeStub:
        """A client stub that dials the node directly (not through a proxy)."""
        if node_id not in self._channels:
            self._channels[node_id] = grpc.insecure_channel(self.direct_address(node_id))
        return pb_grpc.NodeStub(self._channels[node_id])

    def log_path(self, node_id: str) -> Path:
        return self.data_dir / f"{node_id}.log.jsonl"

    def logs(self) -> dict[str, list[dict]]:
        return {node_id: read_log(self.log_path(node_id)) for node_id in self.node_ids}

    def balances(self) -> dict[str, int]:
        return {n: self.stub(n).GetState(pb.GetStateRequest(), timeout=5).balance for n in self.node_ids}

    def wait_settled(self, timeout: float = 30.0) -> dict[str, list[dict]]:
        """Wait until every logged send has its recv; returns the logs."""
        deadline = time.monotonic() + timeout
        while True:
            logs = self.logs()
            report = money_check(logs)
            if not report["unreceived"]:
                return logs
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(report['unreceived'])} sends never received, e.g. {report['unreceived'][:5]}")
            time.sleep(0.1)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        for node in self.nodes.values():
            node.kill()
        self.sink.close()


def read_log(path: Path) -> list[dict]:
    """A node's whole log: its sealed segments (if any), then the active one at `path`."""
    node_id = path.name[: -len(wal.ACTIVE_SUFFIX)]
    names = os.listdir(path.parent) if path.parent.exists() else []
    records = []
    for name in wal.segment_order(names, node_id):
        for line in (path.parent / name).read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line of a running node
    return records


def money_check(logs: dict[str, list[dict]]) -> dict:
    """Sends vs recvs across all logs: each msg_id sent once, received at most once,
    and what each log's balance is."""
    sends: dict[str, dict] = {}
    recvs: dict[str, list[dict]] = defaultdict(list)
    balances: dict[str, int] = {}
    for node_id, records in logs.items():
        balance = 0
        for record in records:
            kind = record["kind"]
            if kind == "init":
                balance = record["balance"]
            elif kind == "send":
                assert record["msg_id"] not in sends, f"msg_id {record['msg_id']} sent twice"
                sends[record["msg_id"]] = record
                balance -= record["amount"]
            elif kind == "recv":
                recvs[record["msg_id"]].append(record)
                balance += record["amount"]
        balances[node_id] = balance
    return {
        "sends": sends,
        "duplicated": sorted(m for m, r in recvs.items() if len(r) > 1),
        "phantom": sorted(m for m in recvs if m not in sends),
        "mismatched": sorted(m for m, r in recvs.items() if m in sends and r[0]["amount"] != sends[m]["amount"]),
        "unreceived": sorted(m for m in sends if m not in recvs),
        "balances": balances,
    }


# ---------------------------------------------------------------------- load


class Load:
    """Background transfers: each round, every source node gets one TransferBatch
    of `batch` random 1..amount_max transfers to random neighbours. Errors (a
    node down, a stream cut) are counted, never raised: the logs are the truth."""

    def __init__(self, cluster: Cluster, *, batch: int = 50, amount_max: int = 5, seed: int = 1,
                 sources: list[str] | None = None, channels: list[tuple[str, str]] | None = None) -> None:
        import random

        self.cluster = cluster
        self.batch = batch
        self.amount_max = amount_max
        self.rng = random.Random(seed)
        self.sources = sources or cluster.node_ids
        pairs = channels or [(a, b) for a in cluster.node_ids for b in cluster.node_ids if a != b]
        self.neighbours = {n: [b for a, b in pairs if a == n] for n in cluster.node_ids}
        self.accepted = 0
        self.refused = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the load thread did not stop"

    def _run(self) -> None:
        channels = {n: grpc.insecure_channel(self.cluster.direct_address(n)) for n in self.sources}
        stubs = {n: pb_grpc.NodeStub(c) for n, c in channels.items()}
        try:
            while not self._stop.is_set():
                for src in self.sources:
                    request = pb.TransferBatchRequest(
                        transfers=[
                            pb.TransferRequest(to=self.rng.choice(self.neighbours[src]),
                                               amount=self.rng.randint(1, self.amount_max))
                            for _ in range(self.batch)
                        ]
                    )
                    try:
                        response = stubs[src].TransferBatch(request, timeout=5)
                    except grpc.RpcError:
                        self.errors += 1
                        time.sleep(0.05)
                        continue
                    ok = sum(1 for r in response.results if r.code == 0)
                    self.accepted += ok
                    self.refused += len(response.results) - ok
        finally:
            for channel in channels.values():
                channel.close()


# ----------------------------------------------------------- snapshot checks


def check_snapshot(logs: dict[str, list[dict]], states: dict[str, pb.FullState], total: int) -> None:
    """Check a snapshot's FullStates against the transfer logs: each recorded
    balance is the log's balance at the cut; each channel's in-flight list is
    exactly what the source sent before its cut and the destination received
    after its cut (and before the marker); the whole is conserved."""
    sid = next(iter(states.values())).snapshot_id
    cut_lsn: dict[str, int] = {}
    for node_id, records in logs.items():
        balance = 0
        for record in records:
            kind = record["kind"]
            if kind == "cut" and record["snapshot_id"] == sid:
                cut_lsn[node_id] = record["lsn"]
                assert record["balance"] == balance, f"{node_id}: cut says {record['balance']}, log says {balance}"
                assert states[node_id].balance == balance, f"{node_id}: reported {states[node_id].balance}, log {balance}"
                break
            if kind == "init":
                balance = record["balance"]
            elif kind == "send":
                balance -= record["amount"]
            elif kind == "recv":
                balance += record["amount"]
        assert node_id in cut_lsn, f"{node_id} has no cut for {sid}"
    sent_before_cut = {
        r["msg_id"]
        for node_id, records in logs.items()
        for r in records
        if r["kind"] == "send" and r["lsn"] < cut_lsn[node_id]
    }
    grand = 0
    for node_id, state in states.items():
        grand += state.balance
        records = logs[node_id]
        for channel in state.channels:
            assert channel.dst == node_id
            marker = [r["lsn"] for r in records if r["kind"] == "marker_recv" and r["src"] == channel.src
                      and r["snapshot_id"] == sid]
            assert len(marker) == 1, f"{channel.src}->{node_id}: {len(marker)} markers for {sid}"
            expected = [r for r in records if r["kind"] == "recv" and r["src"] == channel.src
                        and cut_lsn[node_id] < r["lsn"] < marker[0]]
            got = [(t.msg_id, t.amount, t.seq) for t in channel.in_flight]
            assert got == [(r["msg_id"], r["amount"], r["seq"]) for r in expected], f"{channel.src}->{node_id}"
            assert all(m in sent_before_cut for m, _, _ in got)
            grand += sum(t.amount for t in channel.in_flight)
    # Every transfer sent before its sender's cut and not received before its receiver's cut is in flight.
    received_before_cut = {
        r["msg_id"] for node_id, records in logs.items() for r in records
        if r["kind"] == "recv" and r["lsn"] < cut_lsn[node_id]
    }
    in_flight = {t.msg_id for s in states.values() for c in s.channels for t in c.in_flight}
    assert sent_before_cut - received_before_cut == in_flight
    assert grand == total, f"snapshot {sid} total {grand} != {total}"
