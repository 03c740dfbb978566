"""The fault campaign's local cluster: the supervisor's processes, a
`ChaosProxy` in front of every node (peers dial the proxy; the load generator
and the campaign dial the node directly), the controller with a short deadline.

One node's data dir is a small tmpfs (we mount it; root only, else full-disk
faults are skipped and said so) so that its disk can be filled: the tmpfs is
remounted just above what it holds, the node must stop on the failed write
(exit 1), and it restarts on its log once the tmpfs is large again. Its log
files are copied next to the others before the tmpfs is unmounted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from snapmesh.settings import config as cluster_config
from snapmesh.chaos.campaign import Options
from snapmesh.chaos.proxy import ChaosProxy
from snapmesh.checking.node_logs import read_node_log
from snapmesh.settings.ports import free_ports
from snapmesh.processes.supervisor import Cluster

DISK_SIZE = "128m"  # the small disk's size between full-disk faults
STARTUP_TIMEOUT_S = 120.0  # a restart on a loaded 2-core machine may take long; slow is not failed


class LocalBackend:
    name = "local"

    def __init__(self, options: Options, work: Path, say: Callable[[str], None]) -> None:
        self.say = say
        ids = [f"p{i}" for i in range(1, options.nodes + 1)]
        ports = free_ports(2 + 3 * len(ids))
        self.config_path = cluster_config.write_cluster(
            work / "cluster.toml", nodes=ids, initial_balance=options.balance, deadline=options.deadline,
            data_dir=work / "data", ports=ports[: 2 + 2 * len(ids)],
            listen_ports=dict(zip(ids, ports[2 + 2 * len(ids):], strict=True)),
            snapshot_mode=options.mode or None, topology=options.topology or "mesh", topology_seed=options.seed,
        )
        self.cluster = Cluster(self.config_path, startup_timeout=STARTUP_TIMEOUT_S, app=options.app or None)
        self.config = self.cluster.config
        self.ids = ids
        self.data_dir = self.cluster.data_dir
        self.client_identity = self.cluster.client_identity
        self.controller_address = self.cluster.controller_address
        self.deadline = options.deadline
        self.disk = work / "small-disk"
        self.disk_node = ""
        self.disk_skip = "no small disk yet"
        self.proxies: dict[str, ChaosProxy] = {}

    # ------------------------------------------------------------ set-up

    def start(self, disk_node: str) -> None:
        self.disk_node = disk_node
        self.disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(self.disk)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            self.disk_skip = f"no tmpfs for {disk_node} ({done.stderr.strip() or 'mount failed'})"
        else:
            self.disk_skip = ""
            child = self.cluster.nodes[disk_node]
            child.env = {**child.env, "SNAPMESH_DATA_DIR": str(self.disk)}
        for node in self.ids:
            self.proxies[node] = ChaosProxy(self.config.node(node).port, self.config.node(node).listen_port)
        self.cluster.start()

    def _node_dir(self, node: str) -> Path:
        return self.disk if node == self.disk_node and not self.disk_skip else self.data_dir

    def channel(self, address: str) -> grpc.Channel:
        return self.cluster.security.channel(address)

    def direct_address(self, node: str) -> str:
        return self.cluster.direct_address(node)

    # ------------------------------------------------------------ the faults

    def kill_node(self, node: str) -> None:
        self.cluster.kill_node(node)

    def start_nodes(self, nodes: tuple[str, ...]) -> None:
        children = [self.cluster.nodes[node] for node in nodes]
        for child in children:
            child.start(wait=False)
        for child in children:
            child.wait_serving()

    def node_alive(self, node: str) -> bool:
        return self.cluster.nodes[node].alive

    def pause_node(self, node: str) -> None:
        self.cluster.pause_node(node)

    def resume_node(self, node: str) -> None:
        self.cluster.resume_node(node)

    def cut_streams(self, node: str) -> None:
        self.proxies[node].kill_connections()

    def block(self, node: str) -> None:
        """Every channel *into* the node refused by its proxy; its own channels out stay up."""
        self.proxies[node].block()

    def unblock(self, node: str) -> None:
        self.proxies[node].unblock()

    def kill_controller(self) -> None:
        self.cluster.kill_controller()

    def start_controller(self) -> None:
        self.cluster.start_controller()

    def fill_disk(self) -> None:
        """The tmpfs remounted just above what it holds."""
        stat = os.statvfs(self.disk)
        used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        self._remount(f"{used // 1024 + 64}k")

    def free_disk(self) -> None:
        self._remount(DISK_SIZE)

    def _remount(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.disk)], check=True, capture_output=True)

    def wait_exit(self, node: str, timeout: float) -> int | None:
        child = self.cluster.nodes[node]
        deadline = time.monotonic() + timeout
        while child.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        return None if child.alive else child.returncode

    def second_instance(self, node: str) -> tuple[int, str]:
        argv = [sys.executable, "-m", "snapmesh.cli", "node", "--config", str(self.config_path), "--id", node]
        done = subprocess.run(argv, env=self.cluster.nodes[node].env, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stderr

    # ------------------------------------------------------------ the end

    def read_logs(self) -> dict[str, list[dict]]:
        return {n: read_node_log(self._node_dir(n), n) for n in self.ids}

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.unblock()

    def stop(self) -> dict[str, int | None]:
        self.cluster.stop()
        if not self.disk_skip:  # the logs where the checker and `snapmesh reconcile` read them
            for path in self.disk.glob(f"{self.disk_node}.log*.jsonl"):
                shutil.copy2(path, self.data_dir / path.name)
        return {node: child.returncode for node, child in self.cluster.nodes.items()}

    def teardown(self) -> str:
        self.cluster.stop()
        for proxy in self.proxies.values():
            proxy.close()
        if self.disk.is_dir() and not self.disk_skip:
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)
            self.disk_skip = "unmounted"
        return ""
