"""Run a fault campaign on local processes: the supervisor's cluster, a proxy in
front of every node, the bank workload, a snapshot every `snapshot_every`
seconds, and the seeded schedule of faults (snapmesh.chaos.schedule).

Each fault is applied, held, repaired, and then timed until the cluster has
recovered: until a snapshot triggered after the repair is COMPLETE (the whole
cluster serving, every channel flowing again, the controller answering).
Then `quiesce` heals everything, stops the load, waits until every logged send
is received and no snapshot is in progress, and stops the cluster cleanly;
`snapmesh.chaos.checks` judges what is left on disk.

One node's data dir is a small tmpfs (we mount it; root only, else full-disk
faults are skipped and said so) so that its disk can be filled: the tmpfs is
remounted just above what it holds, the node must stop on the failed write
(exit 1), and it restarts on its log once the tmpfs is large again. Its log
files are copied next to the others before the tmpfs is unmounted.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from snapmesh import config as cluster_config
from snapmesh.chaos import schedule as sched
from snapmesh.chaos.proxy import ChaosProxy
from snapmesh.load import BackgroundLoad
from snapmesh.node_logs import money_check, read_node_log
from snapmesh.ports import free_ports
from snapmesh.supervisor import Cluster, SupervisorError
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

DISK_SIZE = "128m"  # the small disk's size between full-disk faults
RECOVERY_TIMEOUT_S = 60.0  # longest wait for a COMPLETE snapshot after a repair
SETTLE_TIMEOUT_S = 120.0  # longest wait, when quiescing, for every send to be received
STARTUP_TIMEOUT_S = 120.0  # a restart on a loaded 2-core machine may take long; slow is not failed


@dataclass
class Options:
    seed: int = 1
    duration: float = 120.0  # seconds of faults
    nodes: int = 4
    balance: int = 10_000
    deadline: float = 5.0  # the controller's snapshot deadline
    snapshot_every: float = 1.0
    workdir: Path = Path("chaos-run")


@dataclass
class FaultRecord:
    index: int
    kind: str
    nodes: tuple[str, ...]
    at: float  # seconds since the faults began
    recover_s: float | None = None  # repair -> COMPLETE snapshot; None: never (a problem)
    skipped: str = ""  # why it was not applied


@dataclass
class Outcome:
    """Everything the checks and the table need, gathered during the run."""

    options: Options
    data_dir: Path
    channels: tuple[tuple[str, str], ...]
    total: int
    faults: list[FaultRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # restarts that failed, refusals that did not happen
    restarts: int = 0
    second_instances: int = 0  # refused with exit 2
    retries: list[tuple[str, str]] = field(default_factory=list)  # (request_id, msg_id) answered the same twice
    triggered: list[tuple[str, bool]] = field(default_factory=list)  # (snapshot id, triggered while faults ran)
    snapshots: dict[str, pb.Snapshot] = field(default_factory=dict)  # what the controller says at the end
    served_balances: dict[str, int] = field(default_factory=dict)
    transfers: dict[str, int] = field(default_factory=dict)  # ok, refused, failed
    logs: dict[str, list[dict]] = field(default_factory=dict)
    settle_error: str = ""


class Campaign:
    def __init__(self, options: Options, say: Callable[[str], None] = print) -> None:
        self.o = options
        self.say = say
        self.rng = random.Random(f"run:{options.seed}")
        work = Path(options.workdir).resolve()
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        self.work = work
        ids = [f"p{i}" for i in range(1, options.nodes + 1)]
        ports = free_ports(2 + 3 * len(ids))
        self.config_path = cluster_config.write_cluster(
            work / "cluster.toml", nodes=ids, initial_balance=options.balance, deadline=options.deadline,
            data_dir=work / "data", ports=ports[: 2 + 2 * len(ids)],
            listen_ports=dict(zip(ids, ports[2 + 2 * len(ids):], strict=True)),
        )
        self.cluster = Cluster(self.config_path, startup_timeout=STARTUP_TIMEOUT_S)
        self.ids = ids
        self.disk_node = sched.disk_node(options.seed, ids)
        self.disk = work / "small-disk"
        self.disk_mounted = False
        self.proxies: dict[str, ChaosProxy] = {}
        self.outcome = Outcome(options, self.cluster.data_dir, self.cluster.config.topology.channels,
                               options.balance * len(ids))
        self._channels: list[grpc.Channel] = []
        self._stop_triggers = threading.Event()
        self._faults_running = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------ set-up

    def _mount_disk(self) -> None:
        self.disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(self.disk)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            self.say(f"note: no tmpfs for {self.disk_node} ({done.stderr.strip()}): full-disk faults skipped")
            return
        self.disk_mounted = True
        child = self.cluster.nodes[self.disk_node]
        child.env = {**child.env, "SNAPMESH_DATA_DIR": str(self.disk)}

    def node_dir(self, node: str) -> Path:
        return self.disk if node == self.disk_node and self.disk_mounted else self.cluster.data_dir

    def _start(self) -> None:
        self._mount_disk()
        for node in self.ids:
            listen = self.cluster.config.node(node).listen_port
            self.proxies[node] = ChaosProxy(self.cluster.config.node(node).port, listen)
        self.cluster.start()
        self.controller = self._stub(pb_grpc.ControllerStub, self.cluster.controller_address)

    def _stub(self, kind, address: str):
        channel = self.cluster.security.channel(address)
        self._channels.append(channel)
        return kind(channel)

    # -------------------------------------------------------------- the run

    def run(self) -> Outcome:
        try:
            self._start()
            self.load = BackgroundLoad.for_cluster(self.cluster, callers=1, interval=0.05, batch=2, max_amount=20,
                                                   seed=self.o.seed, timeout=10.0)
            with self.load:
                trigger_thread = threading.Thread(target=self._trigger_loop, name="snapshots", daemon=True)
                trigger_thread.start()
                try:
                    self._faults_running = True
                    self._apply_schedule()
                finally:
                    self._faults_running = False
                    self._stop_triggers.set()
                    trigger_thread.join(30)
                    self.say("quiescing: load stopped, every fault repaired")
            s = self.load.stats
            self.outcome.transfers = {"ok": s.accepted, "refused": s.refused, "failed": s.failed}
            self._quiesce()
        finally:
            self._teardown()
        return self.outcome

    def _apply_schedule(self) -> None:
        begin = time.monotonic()
        for fault in sched.faults(self.o.seed, self.ids, disk_node=self.disk_node):
            if time.monotonic() - begin + fault.gap > self.o.duration:
                break
            time.sleep(fault.gap)
            record = FaultRecord(fault.index, fault.kind, fault.nodes, round(time.monotonic() - begin, 2))
            self.outcome.faults.append(record)
            if fault.kind == sched.FULL_DISK and not self.disk_mounted:
                record.skipped = "no tmpfs"
                continue
            self.say(f"[{record.at:7.1f}s] fault {fault.index}: {fault.kind} {' '.join(fault.nodes)}".rstrip())
            repaired = getattr(self, f"_fault_{fault.kind}")(fault)
            record.recover_s = self._recovered(repaired, fault)

    # ------------------------------------------------------------ the faults

    def _restart(self, node: str) -> None:
        """Start a node that was killed; a failure is a problem, and one more try."""
        self.outcome.restarts += 1
        for attempt in (1, 2):
            try:
                self.cluster.start_node(node)
                return
            except SupervisorError as exc:
                self.outcome.problems.append(f"restart of {node} failed (attempt {attempt}): {exc}")
                self.cluster.kill_node(node)
        raise SupervisorError(f"{node} did not restart twice; the campaign cannot go on: {self.outcome.problems[-2:]}")

    def _fault_kill(self, fault: sched.Fault) -> float:
        for node in fault.nodes:
            self.cluster.kill_node(node)
        repaired = time.monotonic()
        for node in fault.nodes:
            self._restart(node)
        return repaired

    _fault_kill_two = _fault_kill

    def _fault_kill_initiator(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        self._trigger(node, during_faults=True)
        return self._fault_kill(fault)

    def _fault_pause(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        self.cluster.pause_node(node)
        time.sleep(fault.hold)
        self.cluster.resume_node(node)
        return time.monotonic()

    def _fault_cut_streams(self, fault: sched.Fault) -> float:
        self.proxies[fault.nodes[0]].kill_connections()
        return time.monotonic()

    def _fault_partition(self, fault: sched.Fault) -> float:
        proxy = self.proxies[fault.nodes[0]]
        proxy.block()
        time.sleep(fault.hold)
        proxy.unblock()
        return time.monotonic()

    def _fault_full_disk(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        child = self.cluster.nodes[node]
        stat = os.statvfs(self.disk)
        used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        self._remount(f"{used // 1024 + 64}k")
        deadline = time.monotonic() + 30
        while child.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        if child.alive:
            self.outcome.problems.append(f"full disk: {node} still ran 30 s after its disk filled up")
            self.cluster.kill_node(node)
        elif child.returncode != 1:
            self.outcome.problems.append(f"full disk: {node} exited {child.returncode}, expected 1")
        self._remount(DISK_SIZE)
        repaired = time.monotonic()
        self._restart(node)
        return repaired

    def _remount(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.disk)], check=True, capture_output=True)

    def _fault_kill_controller(self, fault: sched.Fault) -> float:
        self._trigger(self.rng.choice(self.ids), during_faults=True)
        self.cluster.kill_controller()
        repaired = time.monotonic()
        self.outcome.restarts += 1
        try:
            self.cluster.start_controller()
        except SupervisorError as exc:
            self.outcome.problems.append(f"restart of the controller failed: {exc}")
            self.cluster.start_controller()
        return repaired

    def _fault_second_instance(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        child = self.cluster.nodes[node]
        argv = [sys.executable, "-m", "snapmesh.cli", "node", "--config", str(self.config_path), "--id", node]
        done = subprocess.run(argv, env=child.env, capture_output=True, text=True, timeout=60)
        if done.returncode == 2:
            self.outcome.second_instances += 1
        else:
            self.outcome.problems.append(f"a second {node} on its data dir exited {done.returncode}, expected 2: "
                                         f"{done.stderr.strip()[-300:]}")
        return time.monotonic()

    def _fault_retry(self, fault: sched.Fault) -> float:
        """The same request_id before and after the node's SIGKILL: one answer, one send."""
        (node,) = fault.nodes
        stub = self._stub(pb_grpc.NodeStub, self.cluster.direct_address(node))
        request = pb.TransferRequest(to=self.cluster.config.topology.outgoing(node)[0], amount=1,
                                     request_id=f"chaos-{self.o.seed}-{fault.index}")
        first = self._send(stub, request)
        repaired = self._fault_kill(fault)
        second = self._send(stub, request)
        if first is None or second is None:
            self.outcome.problems.append(f"retry {request.request_id} at {node}: no answer ({first}, {second})")
        elif first != second:
            self.outcome.problems.append(f"retry {request.request_id} at {node}: first answer msg_id {first}, "
                                         f"the retry's {second}")
        else:
            self.outcome.retries.append((request.request_id, first))
        return repaired

    @staticmethod
    def _send(stub, request: pb.TransferRequest) -> str | None:
        """The msg_id of an accepted transfer, retrying a busy or unreachable node for up to 20 s."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                return stub.Transfer(request, timeout=5).msg_id
            except grpc.RpcError as error:
                if error.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE,
                                        grpc.StatusCode.DEADLINE_EXCEEDED):
                    return f"{error.code().name}: {error.details()}"
                time.sleep(0.2)
        return None

    # ------------------------------------------------------------- snapshots

    def _trigger(self, initiator: str, *, during_faults: bool, wait: bool = False) -> pb.Snapshot | None:
        try:
            snap = self.controller.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator=initiator, wait=wait),
                                                   timeout=self.o.deadline + 10 if wait else 3)
        except grpc.RpcError:
            return None  # the controller is down: nothing was triggered
        with self._lock:
            self.outcome.triggered.append((snap.snapshot_id, during_faults))
        return snap

    def _trigger_loop(self) -> None:
        rng = random.Random(f"snapshots:{self.o.seed}")
        while not self._stop_triggers.wait(self.o.snapshot_every):
            self._trigger(rng.choice(self.ids), during_faults=self._faults_running)

    def _recovered(self, repaired: float, fault: sched.Fault) -> float | None:
        """Seconds from the repair until a snapshot triggered after it is COMPLETE."""
        while time.monotonic() - repaired < RECOVERY_TIMEOUT_S:
            snap = self._trigger(self.rng.choice(self.ids), during_faults=False, wait=True)
            if snap is not None and snap.status == pb.Snapshot.COMPLETE:
                return round(time.monotonic() - repaired, 3)
            time.sleep(0.1)
        self.outcome.problems.append(f"no COMPLETE snapshot within {RECOVERY_TIMEOUT_S:g} s after fault "
                                     f"{fault.index} ({fault.kind} {' '.join(fault.nodes)})")
        return None

    # ------------------------------------------------------------- quiescence

    def logs(self) -> dict[str, list[dict]]:
        return {n: read_node_log(self.node_dir(n), n) for n in self.ids}

    def _quiesce(self) -> None:
        for proxy in self.proxies.values():
            proxy.unblock()
        for node, child in self.cluster.nodes.items():
            if not child.alive:
                self.outcome.problems.append(f"{node} was not running when the faults ended")
                self._restart(node)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (unreceived := money_check(self.logs())["unreceived"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if unreceived:
            self.outcome.settle_error = f"{len(unreceived)} sends not received after {SETTLE_TIMEOUT_S:g} s, " \
                                        f"e.g. {unreceived[:3]}"
        deadline = time.monotonic() + 3 * self.o.deadline + 10
        while time.monotonic() < deadline:
            snapshots = self.controller.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10).snapshots
            if all(s.status != pb.Snapshot.IN_PROGRESS for s in snapshots):
                break
            time.sleep(0.2)
        self.outcome.snapshots = {s.snapshot_id: s for s in snapshots}
        for node in self.ids:
            stub = self._stub(pb_grpc.NodeStub, self.cluster.direct_address(node))
            self.outcome.served_balances[node] = stub.GetState(pb.GetStateRequest(), timeout=10).balance
        self.cluster.stop()
        for node, child in self.cluster.nodes.items():
            if child.returncode != 0:
                self.outcome.problems.append(f"{node} exited {child.returncode} on SIGTERM, expected 0")
        if self.disk_mounted:  # the logs where the checker and `snapmesh reconcile` read them
            for path in self.disk.glob(f"{self.disk_node}.log*.jsonl"):
                shutil.copy2(path, self.cluster.data_dir / path.name)
        self.outcome.logs = {n: read_node_log(self.cluster.data_dir, n) for n in self.ids}

    def _teardown(self) -> None:
        self.cluster.stop()
        for channel in self._channels:
            channel.close()
        for proxy in self.proxies.values():
            proxy.close()
        if self.disk_mounted:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)
            self.disk_mounted = False
