"""Real node processes on loopback for the node tests, through the supervisor.

- `cluster_file(...)`: a temp cluster file (free ports, data_dir in tmp).
- `Cluster`: a `snapmesh.processes.supervisor.Cluster` of nodes only, with a `ReportSink`
  on the controller's port instead of the controller, so these tests exercise
  the node alone; plus client stubs and what the logs say.
- `ReportSink`: a tiny real gRPC `Controller` server (in a thread of the test
  process) that accepts `ReportState` and keeps every FullState; the other
  Controller RPCs answer UNIMPLEMENTED.

A fixture finalizer (`Cluster.close`) stops whatever a test left running, so no
process or port outlives the test.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent import futures
from pathlib import Path

import grpc

from support.polling import wait_for
from snapmesh.checking.logcheck import RecordedSnapshot, check_logs
import snapmesh.bank.logs as bank_logs
from snapmesh.bank.logs import figures, money_check
from snapmesh.checking.node_logs import read_logs
from snapmesh.processes import supervisor
from snapmesh.settings.config import write_cluster
from snapmesh.settings.ports import free_ports
from snapmesh.settings.ports import port_is_free as _port_is_free
from snapmesh.protocol import wal
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]


def append(log, kind: type[wal.Record], **fields) -> int:
    """Write one record of `kind` (a wal record class) with the log's next lsn to
    `log` (a snapmesh.services.node.translog.TransferLog); returns its lsn."""
    return log.append_record(kind(lsn=log.last_lsn + 1, **fields))


def append_send(log, src: str, dst: str, seq: int, amount: int) -> int:
    """A transfer's `send` record (msg_id `src:dst:seq`), as the node writes it."""
    return append(log, wal.Send, msg_id=f"{src}:{dst}:{seq}", src=src, dst=dst, seq=seq, payload=wal.pack(str(amount).encode()))


def port_is_free(port: int) -> bool:
    return _port_is_free("127.0.0.1", port)


def cluster_file(
    tmp_path: Path,
    node_ids: list[str],
    *,
    balance: int = 1000,
    channels: list[tuple[str, str]] | None = None,
    proxied: tuple[str, ...] = (),
    deadline: float = 10,
    settings: dict[str, int] | None = None,
) -> tuple[Path, dict]:
    """Write `cluster.toml`; returns (path, ports). For a node in `proxied`, the
    node listens on `ports[id]["listen"]` while peers dial `ports[id]["port"]`,
    where a test puts its proxy. `settings`: top-level keys such as channel_bound."""
    pool = free_ports(2 + 3 * len(node_ids))
    listen = pool[2 + 2 * len(node_ids):]
    ports: dict = {"controller": pool[0], "controller_metrics": pool[1]}
    for index, node_id in enumerate(node_ids):
        ports[node_id] = {"port": pool[2 + 2 * index], "metrics": pool[3 + 2 * index], "listen": listen[index]}
    path = write_cluster(
        tmp_path / "cluster.toml",
        nodes=node_ids,
        topology="mesh" if channels is None else channels,
        initial_balance=balance,
        deadline=deadline,
        data_dir=tmp_path / "data",
        ports=pool[: 2 + 2 * len(node_ids)],
        listen_ports={n: ports[n]["listen"] for n in proxied},
        settings=settings,
    )
    return path, ports


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


class Cluster(supervisor.Cluster):
    """The nodes of one cluster file under the supervisor, and a report sink on
    the controller's port; `close()` stops everything. Every fault operation
    of the supervisor (kill_node, start_node, pause_node, ...) is at hand."""

    def __init__(self, tmp_path: Path, node_ids: list[str], *, balance: int = 1000,
                 channels: list[tuple[str, str]] | None = None, proxied: tuple[str, ...] = (),
                 deadline: float = 10, settings: dict[str, int] | None = None) -> None:
        path, self.ports = cluster_file(
            tmp_path, node_ids, balance=balance, channels=channels, proxied=proxied, deadline=deadline,
            settings=settings,
        )
        super().__init__(path, controller=False)
        self.balance = balance
        self.sink = ReportSink(self.ports["controller"])
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def total(self) -> int:
        return self.balance * len(self.node_ids)

    @property
    def channels(self) -> tuple[tuple[str, str], ...]:
        return self.config.topology.channels

    def stub(self, node_id: str) -> pb_grpc.NodeStub:
        """A client stub that dials the node directly (not through a proxy)."""
        if node_id not in self._channels:
            self._channels[node_id] = grpc.insecure_channel(self.direct_address(node_id))
        return pb_grpc.NodeStub(self._channels[node_id])

    def logs(self) -> dict[str, list[dict]]:
        """The nodes' logs with the bank's figures (the nodes run the bank app: bank.logs.figures)."""
        return figures(read_logs(self.data_dir, self.node_ids))

    def balances(self) -> dict[str, int]:
        return {n: self.stub(n).GetState(pb.GetStateRequest(), timeout=5).balance for n in self.node_ids}

    def wait_settled(self, timeout: float = 30.0) -> dict[str, list[dict]]:
        """Wait until every logged send has its recv; returns the logs."""
        read: dict[str, dict[str, list[dict]]] = {}

        def unreceived() -> list:
            read["logs"] = self.logs()
            return money_check(read["logs"])["unreceived"]

        wait_for(unreceived, until=lambda sends: not sends, timeout=timeout, interval=0.1, what="every logged send received")
        return read["logs"]

    def assert_money_intact(self, timeout: float = 60) -> dict[str, list[dict]]:
        """After quiescence: every send received exactly once, nothing received that
        was not sent, the balances the nodes serve are their logs' and sum to the
        total. Returns the logs."""
        logs = self.wait_settled(timeout)
        report = money_check(logs)
        assert not report["duplicated"], f"received twice: {report['duplicated'][:5]}"
        assert not report["phantom"], f"received, never sent: {report['phantom'][:5]}"
        assert not report["mismatched"], report["mismatched"][:5]
        assert sum(report["balances"].values()) == self.total
        assert self.balances() == report["balances"]
        return logs

    def check_snapshots(self, logs: dict[str, list[dict]], *reports: dict[str, pb.FullState]) -> None:
        """The one log checker (snapmesh/checking/logcheck.py) on snapshots given as every node's FullState."""
        snapshots = [RecordedSnapshot(*bank_logs.recorded_states({n: _bank_figures(s) for n, s in states.items()},
                                                                 self.channels))
                     for states in reports]
        check_logs(logs, snapshots, channels=self.channels, total=self.total, app=bank_logs)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self.stop()
        self.sink.close()


def _bank_figures(state: pb.FullState) -> pb.FullState:
    """A bank-app node's report with the bank's figures, as the controller fills them
    (snapmesh/bank/v1fields.py): the balance from its state, an amount from each payload."""
    part = pb.FullState()
    part.CopyFrom(state)
    if part.HasField("state"):
        part.balance = int(part.state)
    for channel in part.channels:
        for item in channel.in_flight:
            if item.HasField("payload"):
                item.amount = int(item.payload)
    return part
