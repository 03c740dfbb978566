"""The fault campaign on the multi-host bench (`snapmesh chaos --hosts`): the
controller and every node on a host of their own (snapmesh.hosts.cluster), and
the faults at the network layer between them.

Everything a local campaign does is done here the same way (the supervisor's
kill, pause, restart; the small tmpfs disk), except what the local one does
with a proxy in front of each node:

- `partition` (today's kind): every peer's packets to the node dropped (one
  way: the node's own channels out stay up, as the proxy's refusal did);
- `cut_streams`: the node's TCP connections from its peers reset (`ss -K`);
- the network kinds of the schedule (`net_*`): the plan's faults, held, healed.

With `--app`, every process runs the app (the cluster file's [app], and
SNAPMESH_APP over one this process has), and the load is the app's workload
(snapmesh.chaos.appmode), as on local processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from snapmesh.settings import config as cluster_config
from snapmesh.chaos import schedule as sched
from snapmesh.chaos.campaign import Options
from snapmesh.chaos.local import DISK_SIZE, STARTUP_TIMEOUT_S, LocalBackend
from snapmesh.hosts import plan as net
from snapmesh.hosts.cluster import NODE_PORT, HostsCluster
from snapmesh.hosts.plan import Fault
from snapmesh.processes.supervisor import Cluster


class HostsBackend(LocalBackend):
    name = "hosts"

    def __init__(self, options: Options, work: Path, say: Callable[[str], None]) -> None:  # noqa: D107
        self.say = say
        self.app = options.app  # every process's app: the cluster file's [app] and SNAPMESH_APP alike
        self.hosts = HostsCluster(work, nodes=options.nodes, deadline=options.deadline,
                                  initial_balance=options.balance, startup_timeout=STARTUP_TIMEOUT_S,
                                  settings={"app": {"module": options.app}} if options.app else None)
        self.config_path = self.hosts.config_path
        self.config = cluster_config.load(self.config_path, env={**os.environ, **self.app_env()})
        self.ids = list(self.hosts.node_ids)
        self.data_dir = self.config.data_dir
        self.client_identity = None
        self.deadline = options.deadline
        self.disk = work / "small-disk"
        self.disk_node = ""
        self.disk_skip = "no small disk yet"
        self.proxies = {}
        self.blocked: dict[str, Fault] = {}

    def app_env(self) -> dict[str, str]:
        return {"SNAPMESH_APP": self.app} if self.app else {}

    def give_app(self, cluster: Cluster) -> None:
        """Every process's SNAPMESH_APP is the campaign's app, over one this process has (the children
        would inherit it, and it stands in for the file's [app])."""
        for child in (cluster.controller, *cluster.nodes.values()):
            if child is not None and self.app:
                child.env = {**child.env, **self.app_env()}

    @property
    def controller_address(self) -> str:
        return self.hosts.controller_address

    @property
    def network(self):
        return self.hosts.network

    def start(self, disk_node: str) -> None:
        self.disk_node = disk_node
        self.disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(self.disk)],
                              capture_output=True, text=True)
        self.disk_skip = f"no tmpfs for {disk_node} ({done.stderr.strip() or 'mount failed'})" if done.returncode else ""

        def small_disk(cluster: Cluster) -> None:
            self.give_app(cluster)
            if not self.disk_skip:
                child = cluster.nodes[disk_node]
                child.env = {**child.env, "SNAPMESH_DATA_DIR": str(self.disk)}

        self.hosts.start(before=small_disk)
        self.cluster = self.hosts.cluster
        self.say(f"on hosts: run {self.hosts.run_id}, " + ", ".join(
            f"{h.name} {h.address}" for h in self.hosts.plan.hosts))

    # ------------------------------------------------------------ the proxy's faults, on the network

    def cut_streams(self, node: str) -> None:
        peers = [p for p in self.ids if p != node]
        subprocess.run(self.hosts.plan.cut_streams(node, NODE_PORT, peers), capture_output=True)

    def block(self, node: str) -> None:
        peers = [p for p in self.ids if p != node]
        self.blocked[node] = self.network.apply(self.hosts.plan.partition(peers, [node], one_way=True))

    def unblock(self, node: str) -> None:
        if node in self.blocked:
            self.network.heal(self.blocked.pop(node))

    # ------------------------------------------------------------ the network faults

    def network_fault(self, fault: sched.Fault) -> Fault:
        bench = self.hosts.plan
        nodes = list(fault.nodes)
        if fault.kind == net.PARTITION:
            planned = bench.partition(nodes[:1], nodes[1:])
        elif fault.kind == net.PARTITION_ONE_WAY:
            planned = bench.partition(nodes[:1], nodes[1:], one_way=True)
        elif fault.kind == net.ISOLATE:
            planned = bench.isolate(nodes[0], [p for p in self.ids if p != nodes[0]])
        elif fault.kind == net.SPLIT:
            planned = bench.split(nodes, ["controller", *(p for p in self.ids if p not in nodes)])
        elif fault.kind == net.BANDWIDTH:
            planned = bench.bandwidth(nodes[0], sched.BANDWIDTH_KBIT)
        elif fault.kind == net.DELAY:
            planned = bench.delay(nodes[0], sched.DELAY_MS)
        else:
            raise ValueError(f"not a network fault: {fault.kind}")
        return self.network.apply(planned)

    def heal_network(self, applied: Fault) -> None:
        self.network.heal(applied)

    # ------------------------------------------------------------ the rest

    def second_instance(self, node: str) -> tuple[int, str]:
        child = self.cluster.nodes[node]
        argv = [sys.executable, "-m", "snapmesh.cli", "node", "--config", str(self.config_path), "--id", node]
        done = subprocess.run(child.host.command(argv), env=child.env, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stderr

    def heal(self) -> None:
        if self.hosts.cluster is not None:
            self.network.heal_all()
        self.blocked.clear()

    def teardown(self) -> str:
        left = self.hosts.stop()  # the processes, then the network
        if self.disk.is_dir() and not self.disk_skip:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)
            self.disk_skip = "unmounted"
        return f"left behind on the machine: {', '.join(left)}" if left else ""
