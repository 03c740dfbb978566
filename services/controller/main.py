"""`snapmesh controller --config FILE [--interval S] [--deadline S]`.

Serves snapmesh.v1.Controller (plus health, reflection and Prometheus metrics)
at the controller address of the cluster file. Finished snapshots are kept in
`<data_dir>/snapshots/` and loaded back on start. Exit status: 0 after a clean
stop on SIGINT/SIGTERM, 1 when it cannot bind, 2 for bad arguments or a
malformed cluster file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from prometheus_client import CollectorRegistry

from services.controller.servicer import ControllerMetrics, ControllerService
from services.controller.store import SnapshotStore
from services.controller.tracker import Tracker
from snapmesh import config as cluster_config
from snapmesh import security
from snapmesh.argparsing import parse_args
from snapmesh.runtime import ServiceHost, run_service, wait_for_stop_signal
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger("snapmesh.controller")

SERVICE_NAME = "snapmesh.v1.Controller"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh controller: {message}\n")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh controller", description="Run the snapshot controller.")
    parser.add_argument("--config", metavar="FILE", help="cluster file (default: the shipped 4-node config)")
    parser.add_argument("--interval", type=_positive, metavar="S", help="also take a snapshot every S seconds")
    parser.add_argument(
        "--deadline", type=_positive, metavar="S", help="fail a snapshot not finished after S seconds "
        "(default: controller.snapshot_deadline_s)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        cfg = cluster_config.load(args.config)
        identity = security.load_identity(cfg, cluster_config.CONTROLLER_NAME)
    except (cluster_config.ConfigError, security.SecurityError) as exc:
        print(f"snapmesh controller: {exc}", file=sys.stderr)
        return 2
    return run_service(
        "controller", lambda: serve(cfg, interval=args.interval, deadline=args.deadline, identity=identity)
    )


async def serve(
    cfg: cluster_config.ClusterConfig,
    *,
    interval: float | None,
    deadline: float | None,
    identity: security.Identity | None = None,
) -> int:
    tracker = Tracker(
        topology=cfg.topology,
        expected_total=cfg.expected_total,
        deadline_s=deadline or cfg.controller.snapshot_deadline_s,
    )
    store = SnapshotStore(cfg.snapshots_dir)
    snapshots, warnings = store.load_all()
    for warning in warnings:
        log.warning("%s", warning)
    for snapshot in snapshots:
        tracker.restore(snapshot)
    if snapshots:
        log.info("loaded %d finished snapshot(s) from %s", len(snapshots), store.directory)

    registry = CollectorRegistry()
    service = ControllerService(
        config=cfg, tracker=tracker, store=store, metrics=ControllerMetrics(registry), identity=identity
    )
    host = ServiceHost(
        bind_address=cfg.bind_address(cfg.controller),
        metrics_bind=cfg.metrics_bind(cfg.controller),
        registry=registry,
        identity=identity,
    )
    host.add(pb_grpc.add_ControllerServicer_to_server, service, SERVICE_NAME)
    await service.start()
    periodic = asyncio.create_task(service.periodic(interval)) if interval else None
    try:
        await host.start()
        log.info(
            "serving on %s (metrics %s:%d), %d nodes, deadline %gs",
            host.bind_address, *cfg.metrics_bind(cfg.controller), len(cfg.nodes), tracker.deadline_s,
        )
        sig = await wait_for_stop_signal()
        log.info("%s: stopping", sig.name)
    finally:
        if periodic is not None:
            periodic.cancel()
        service.end_streams()
        await host.stop()
        await service.close()
    return 0
