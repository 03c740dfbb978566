"""Run a fault campaign: a real cluster, the bank workload, a snapshot every
`snapshot_every` seconds, and the seeded schedule of faults
(snapmesh.chaos.schedule), on either kind of cluster:

- local processes under the supervisor, a TCP proxy in front of every node
  (snapmesh.chaos.local.LocalBackend, the default);
- the Docker compose stack of deploy/compose (snapmesh.chaos.compose.ComposeBackend,
  `snapmesh chaos --compose`).

This module is what both share: the schedule, each fault's sequence (apply,
hold, repair, restart), the time to recover, quiescence, and the outcome the
checks judge. A backend only says how to do one thing to its cluster: kill a
node, pause it, cut its streams, fill its disk, and so on (`Backend` below).

Each fault is applied, held, repaired, and then timed until the cluster has
recovered: until a snapshot triggered after the repair is COMPLETE (the whole
cluster serving, every channel flowing again, the controller answering).
Then `quiesce` heals everything, stops the load, waits until every logged send
is received and no snapshot is in progress, and stops the cluster cleanly;
`snapmesh.chaos.checks` judges what is left on disk.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

from snapmesh.app import App, load_app
from snapmesh.chaos import appmode
from snapmesh.chaos import schedule as sched
from snapmesh.settings.config import ClusterConfig, hosted
from snapmesh.load.background import BackgroundLoad
from snapmesh.bank.logs import figures
from snapmesh.chaos.deliveries import Deliveries
from snapmesh.settings.security import Identity
from snapmesh.checking.snapshots import list_all
from snapmesh.processes.supervisor import SupervisorError
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RECOVERY_TIMEOUT_S = 60.0  # longest wait for a COMPLETE snapshot after a repair
SETTLE_TIMEOUT_S = 120.0  # longest wait, when quiescing, for every send to be received
DISK_FULL_EXIT_TIMEOUT_S = 30.0  # a node whose disk is full must stop within this


@dataclass
class Options:
    seed: int = 1
    duration: float = 120.0  # seconds of faults
    nodes: int = 4
    balance: int = 10_000
    deadline: float = 5.0  # the controller's snapshot deadline (local; the stack's file says its own)
    snapshot_every: float = 1.0
    workdir: Path = Path("chaos-run")
    compose: bool = False  # the Docker compose stack instead of local processes
    hosts: bool = False  # the multi-host bench (snapmesh.chaos.hosts), with the network faults
    app: str = ""  # an app's workload instead of the bank's (snapmesh.chaos.appmode); "": the bank
    mode: str = ""  # every node's snapshot_mode (local processes); "": the cluster file's default
    topology: str = ""  # the channels (snapmesh.settings.topologies, drawn from `seed`; local processes); "": mesh


class FaultNotApplied(Exception):
    """A backend could not apply a fault and left the cluster as it was: the fault is skipped, with this reason."""


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
    faults_s: float | None = None  # how long the faults ran (past `duration` when the first round took longer)
    app: App | None = None  # the app the nodes ran (None: the bank)
    settled: pb.Snapshot | None = None  # an app's snapshot once faults stopped and every send was received
    keys: Any = None  # kvshard: the client's KeyTally (snapmesh.chaos.appmode)
    mode: str = "classic"  # the nodes' snapshot_mode, as their cluster file says
    app_params: dict[str, Any] = field(default_factory=dict)  # the app's params as the nodes got them (config.hosted)


class Backend(Protocol):
    """How to do things to one kind of cluster. Every method returns once the
    thing is done (a killed process is gone, a started one SERVING); a start
    that fails raises SupervisorError. `config`, `direct_address` and
    `client_identity` are what BackgroundLoad.for_cluster needs."""

    name: str  # "local" or "compose"
    config: ClusterConfig
    ids: list[str]
    data_dir: Path  # where the logs and snapshots are once `stop` returns (the checks read them there)
    client_identity: Identity | None
    controller_address: str
    deadline: float  # the controller's snapshot deadline
    disk_skip: str  # why full-disk faults cannot be applied ("" when they can), known after `start`

    def start(self, disk_node: str) -> None: ...  # the cluster, `disk_node` on a small disk
    def channel(self, address: str) -> grpc.Channel: ...
    def direct_address(self, node: str) -> str: ...
    def kill_node(self, node: str) -> None: ...  # SIGKILL, gone
    def start_nodes(self, nodes: tuple[str, ...]) -> None: ...  # all at once, each on its log, SERVING
    def node_alive(self, node: str) -> bool: ...
    def pause_node(self, node: str) -> None: ...
    def resume_node(self, node: str) -> None: ...
    def cut_streams(self, node: str) -> None: ...  # reset every channel stream into the node
    def block(self, node: str) -> None: ...  # a partition
    def unblock(self, node: str) -> None: ...
    def kill_controller(self) -> None: ...
    def start_controller(self) -> None: ...
    def fill_disk(self) -> None: ...  # the next write of the disk node must fail
    def free_disk(self) -> None: ...
    def wait_exit(self, node: str, timeout: float) -> int | None: ...  # its exit status; None: still running
    def second_instance(self, node: str) -> tuple[int, str]: ...  # another `snapmesh node` there: (exit, stderr)
    def read_logs(self) -> dict[str, list[dict]]: ...  # every node's log as it is now
    def heal(self) -> None: ...  # undo any fault left half-done
    def stop(self) -> dict[str, int | None]: ...  # SIGTERM everything; node -> exit status; logs to data_dir
    def teardown(self) -> str: ...  # leave nothing behind (always runs); what was left, if anything


def fresh_dir(path: Path) -> Path:
    work = Path(path).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


class Campaign:
    """`backend_class(options, workdir, say)` makes the cluster's backend."""

    def __init__(self, options: Options, backend_class: Callable[..., Backend],
                 say: Callable[[str], None] = print) -> None:
        self.o = options
        self.say = say
        self.rng = random.Random(f"run:{options.seed}")
        self.work = fresh_dir(options.workdir)
        self.backend = backend_class(options, self.work, say)
        self.ids = self.backend.ids
        self.disk_node = sched.disk_node(options.seed, self.ids)
        self.outcome = Outcome(options, self.backend.data_dir, self.backend.config.topology.channels,
                               self.backend.config.expected_total, mode=self.backend.config.snapshot_mode,
                               app_params=dict(hosted(self.backend.config).params))
        self.app = self.outcome.app = load_app(options.app) if options.app else None
        self._channels: list[grpc.Channel] = []
        self._stop_triggers = threading.Event()
        self._faults_running = False
        self._lock = threading.Lock()

    def _stub(self, kind, address: str):
        channel = self.backend.channel(address)
        self._channels.append(channel)
        return kind(channel)

    # -------------------------------------------------------------- the run

    def run(self) -> Outcome:
        try:
            self.backend.start(self.disk_node)
            if self.backend.disk_skip:
                self.say(f"note: {self.backend.disk_skip}: full-disk faults skipped")
            self.controller = self._stub(pb_grpc.ControllerStub, self.backend.controller_address)
            if self.app is not None:
                self.load = appmode.load(self)
            else:
                self.load = BackgroundLoad.for_cluster(self.backend, callers=1, interval=0.05, batch=2,
                                                       max_amount=20, seed=self.o.seed, timeout=10.0)
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
            if self.app is not None:
                self.outcome.transfers = {"ok": s.accepted, "refused": s.refused, "failed": s.failed}
            else:  # the bank's refused: insufficient funds; any other refusal failed, as a transfer given up on
                funds = s.refusals("FAILED_PRECONDITION")
                self.outcome.transfers = {"ok": s.accepted, "refused": funds, "failed": s.refused - funds + s.failed}
            self._quiesce()
        finally:
            for channel in self._channels:
                channel.close()
            if left := self.backend.teardown():
                self.outcome.problems.append(left)
        return self.outcome

    def _apply_schedule(self) -> None:
        begin = time.monotonic()
        for fault in sched.faults(self.o.seed, self.ids, disk_node=self.disk_node, network=self.o.hosts):
            # The first round (every kind once) always runs, however long it takes: a short
            # run on a slow cluster still covers every kind.
            if fault.index >= len(sched.kinds(self.o.hosts)) and time.monotonic() - begin + fault.gap > self.o.duration:
                break
            time.sleep(fault.gap)
            record = FaultRecord(fault.index, fault.kind, fault.nodes, round(time.monotonic() - begin, 2))
            self.outcome.faults.append(record)
            if fault.kind == sched.FULL_DISK and self.backend.disk_skip:
                record.skipped = self.backend.disk_skip
                continue
            self.say(f"[{record.at:7.1f}s] fault {fault.index}: {fault.kind} {' '.join(fault.nodes)}".rstrip())
            try:
                repaired = getattr(self, f"_fault_{fault.kind}", self._fault_network)(fault)
            except FaultNotApplied as exc:
                record.skipped = str(exc)
                self.say(f"          skipped: {exc}")
                continue
            record.recover_s = self._recovered(repaired, fault)
            self.outcome.faults_s = round(time.monotonic() - begin, 1)

    # ------------------------------------------------------------ the faults

    def _restart(self, *nodes: str) -> None:
        """Start nodes that were killed, all at once; a failure is a problem, and one more try."""
        self.outcome.restarts += len(nodes)
        for attempt in (1, 2):
            try:
                self.backend.start_nodes(nodes)
                return
            except SupervisorError as exc:
                self.outcome.problems.append(f"restart of {' '.join(nodes)} failed (attempt {attempt}): {exc}")
                for node in nodes:
                    self.backend.kill_node(node)
        raise SupervisorError(f"{' '.join(nodes)} did not restart twice; the campaign cannot go on: "
                              f"{self.outcome.problems[-2:]}")

    def _fault_kill(self, fault: sched.Fault) -> float:
        for node in fault.nodes:
            self.backend.kill_node(node)
        repaired = time.monotonic()
        self._restart(*fault.nodes)
        return repaired

    _fault_kill_two = _fault_kill

    def _fault_kill_initiator(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        self._trigger(node, during_faults=True)
        return self._fault_kill(fault)

    def _fault_pause(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        self.backend.pause_node(node)
        time.sleep(fault.hold)
        self.backend.resume_node(node)
        return time.monotonic()

    def _fault_cut_streams(self, fault: sched.Fault) -> float:
        self.backend.cut_streams(fault.nodes[0])
        return time.monotonic()

    def _fault_partition(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        self.backend.block(node)
        time.sleep(fault.hold)
        self.backend.unblock(node)
        return time.monotonic()

    def _fault_network(self, fault: sched.Fault) -> float:
        """A network fault of the multi-host bench: applied, held, healed (the hosts backend only)."""
        applied = self.backend.network_fault(fault)
        time.sleep(fault.hold)
        self.backend.heal_network(applied)
        return time.monotonic()

    def _fault_full_disk(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        self.backend.fill_disk()
        status = self.backend.wait_exit(node, DISK_FULL_EXIT_TIMEOUT_S)
        if status is None:
            self.outcome.problems.append(f"full disk: {node} still ran {DISK_FULL_EXIT_TIMEOUT_S:g} s after its "
                                         "disk filled up")
            self.backend.kill_node(node)
        elif status != 1:
            self.outcome.problems.append(f"full disk: {node} exited {status}, expected 1")
        self.backend.free_disk()
        repaired = time.monotonic()
        self._restart(node)
        return repaired

    def _fault_kill_controller(self, fault: sched.Fault) -> float:
        self._trigger(self.rng.choice(self.ids), during_faults=True)
        self.backend.kill_controller()
        repaired = time.monotonic()
        self.outcome.restarts += 1
        try:
            self.backend.start_controller()
        except SupervisorError as exc:
            self.outcome.problems.append(f"restart of the controller failed: {exc}")
            self.backend.start_controller()
        return repaired

    def _fault_second_instance(self, fault: sched.Fault) -> float:
        (node,) = fault.nodes
        status, stderr = self.backend.second_instance(node)
        if status == 2:
            self.outcome.second_instances += 1
        else:
            self.outcome.problems.append(f"a second {node} on its data dir exited {status}, expected 2: "
                                         f"{stderr.strip()[-300:]}")
        return time.monotonic()

    def _fault_retry(self, fault: sched.Fault) -> float:
        """The same request_id before and after the node's SIGKILL: one answer, one send."""
        if self.app is not None:
            return appmode.retry_fault(self, fault)
        (node,) = fault.nodes
        stub = self._stub(pb_grpc.NodeStub, self.backend.direct_address(node))
        request = pb.TransferRequest(to=self.backend.config.topology.outgoing(node)[0], amount=1,
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
                                                   timeout=self.backend.deadline + 10 if wait else 3)
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

    def _quiesce(self) -> None:
        self.backend.heal()
        for node in self.ids:
            if not self.backend.node_alive(node):
                self.outcome.problems.append(f"{node} was not running when the faults ended")
                self._restart(node)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        # By msg id, whatever the app: the framework's count, not the bank's.
        while (unreceived := Deliveries.of(self.backend.read_logs()).unreceived) and time.monotonic() < deadline:
            time.sleep(0.5)
        if unreceived:
            self.outcome.settle_error = f"{len(unreceived)} sends not received after {SETTLE_TIMEOUT_S:g} s, " \
                                        f"e.g. {unreceived[:3]}"
        if self.app is not None:
            self.outcome.settled = appmode.settled_snapshot(self)
        deadline = time.monotonic() + 3 * self.backend.deadline + 10
        while time.monotonic() < deadline:
            snapshots = list_all(self.controller, timeout=10)  # every page, each snapshot whole
            if all(s.status != pb.Snapshot.IN_PROGRESS for s in snapshots):
                break
            time.sleep(0.2)
        self.outcome.snapshots = {s.snapshot_id: s for s in snapshots}
        for node in self.ids:
            stub = self._stub(pb_grpc.NodeStub, self.backend.direct_address(node))
            self.outcome.served_balances[node] = stub.GetState(pb.GetStateRequest(), timeout=10).balance
        for node, status in self.backend.stop().items():
            if status != 0:
                self.outcome.problems.append(f"{node} exited {status} on SIGTERM, expected 0")
        logs = self.backend.read_logs()
        # The bank's checks read its figures (the bank app's nodes log bytes); an app's, its own records.
        self.outcome.logs = figures(logs) if self.app is None else logs
