"""A cluster with one host per process: the controller and every node in its own
network namespace (snapmesh.hosts.net), started by the supervisor on its host.

    with HostsCluster(work, nodes=4, tls=True) as hc:
        hc.cluster                      # the supervisor.Cluster (kill_node, ...)
        hc.controller_address           # 10.231.X.2:50050, dialled from this machine
        cut = hc.network.apply(hc.plan.partition(["p1"], ["p2", "p3"]))
        hc.network.heal(cut)

The cluster file names the hosts (`controller`, `p1`, ...), each on the same
ports: peers dial each other by name, which each host's hosts file resolves.
This machine is no host: it dials the hosts' addresses (the certificates, with
`tls`, carry both the name and the address). Stopping (or leaving the `with`)
stops the processes, then removes the network.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.hosts.net import Network
from snapmesh.hosts.plan import Bench
from snapmesh.processes.supervisor import STARTUP_TIMEOUT_S, Cluster

CONTROLLER_PORT, CONTROLLER_METRICS = 50050, 9100
NODE_PORT, NODE_METRICS = 50051, 9101


def write_hosts_cluster(path: str | os.PathLike[str], *, nodes: int, data_dir: str | os.PathLike[str],
                        deadline: float = 10.0, initial_balance: int = 1000, snapshot_mode: str | None = None,
                        settings: Mapping[str, Any] | None = None) -> Path:
    """A full-mesh cluster file whose hosts are `controller`, `p1` ... `pN`."""
    document: dict[str, Any] = {
        "data_dir": str(Path(data_dir).resolve()),
        "initial_balance": int(initial_balance),
        **(settings or {}),
    }
    if snapshot_mode is not None:
        document["snapshot_mode"] = snapshot_mode
    document["controller"] = {"host": "controller", "port": CONTROLLER_PORT, "metrics_port": CONTROLLER_METRICS,
                              "snapshot_deadline_s": float(deadline)}
    document["nodes"] = [{"id": f"p{i}", "host": f"p{i}", "port": NODE_PORT, "metrics_port": NODE_METRICS}
                         for i in range(1, nodes + 1)]
    return cluster_config.write(path, document, comment="Written by snapmesh.hosts.cluster: one host per process")


class HostsCluster:
    def __init__(self, work_dir: str | os.PathLike[str], *, nodes: int = 4, tls: bool = False,
                 run_id: str | None = None, controller_args: Sequence[str] = (), deadline: float = 10.0,
                 initial_balance: int = 1000, snapshot_mode: str | None = None,
                 settings: Mapping[str, Any] | None = None, startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        self.work = Path(work_dir).resolve()
        self.tls = tls
        self.node_ids = [f"p{i}" for i in range(1, nodes + 1)]
        self.network = Network(["controller", *self.node_ids], run_id=run_id, log_dir=self.work / "data" / "logs")
        self.config_path = write_hosts_cluster(self.work / "cluster.toml", nodes=nodes, data_dir=self.work / "data",
                                               deadline=deadline, initial_balance=initial_balance,
                                               snapshot_mode=snapshot_mode, settings=settings)
        self._controller_args = list(controller_args)
        self._startup_timeout = startup_timeout
        self.cluster: Cluster | None = None

    @property
    def run_id(self) -> str:
        return self.network.run_id

    @property
    def plan(self) -> Bench:
        return self.network._bench()

    @property
    def controller_address(self) -> str:
        return self._cluster().controller_address

    def _cluster(self) -> Cluster:
        if self.cluster is None:
            raise RuntimeError("the hosts cluster is not started")
        return self.cluster

    def start(self, before: Callable[[Cluster], None] | None = None) -> HostsCluster:
        """The network, then every process on its host (each SERVING); on a failure everything is
        removed. `before(cluster)` runs once the supervisor's Cluster exists, before any process starts."""
        try:
            self.network.up()
            tls_dir = None
            if self.tls:
                tls_dir = self.work / "tls"
                security.write_certs(self._addressed(cluster_config.load(self.config_path)), tls_dir)
            self.cluster = Cluster(self.config_path, tls_dir=tls_dir, hosts=self.network.hosts,
                                   controller_args=self._controller_args, startup_timeout=self._startup_timeout)
            if before is not None:
                before(self.cluster)
            self.cluster.start()
        except BaseException:
            self.stop()
            raise
        return self

    def addressed_config(self) -> cluster_config.ClusterConfig:
        """The running cluster's config with each host's address for its name: what this
        machine (no host, no hosts file) dials."""
        return self._addressed(self._cluster().config)

    def _addressed(self, cfg: cluster_config.ClusterConfig) -> cluster_config.ClusterConfig:
        """The config with each host's address for its host name: what the certificates must carry
        (their DNS name is the process's name, which is its host name too)."""
        hosts = self.network.hosts
        return dataclasses.replace(
            cfg,
            controller=dataclasses.replace(cfg.controller, host=hosts["controller"].address),
            nodes=tuple(dataclasses.replace(n, host=hosts[n.id].address) for n in cfg.nodes),
        )

    def stop(self) -> list[str]:
        """Stop every process, then remove the network; what is left of the run (normally nothing)."""
        try:
            if self.cluster is not None:
                self.cluster.stop()
        finally:
            left = self.network.down()
        return left

    def __enter__(self) -> HostsCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
