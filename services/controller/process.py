"""`snapmesh controller --config FILE [--interval S] [--deadline S]`.

Serves snapmesh.v1.Controller (plus health, reflection and Prometheus metrics)
at the controller address of the cluster file. Every snapshot is journaled in
`<data_dir>/controller/journal` as it starts, as reports come in and as it ends;
finished ones are filed in `<data_dir>/controller/snapshots/` (compact) and
exported to `<data_dir>/snapshots/` (proto JSON) in the background. On start it
loads the files, replays the journal, files what was not filed yet, and takes
back the snapshots still in progress: they complete from the nodes' re-sent
reports or fail as "controller restarted" at their deadline. Before it reads or
writes anything there it locks `<data_dir>/controller.lock` (snapmesh.serving.datalock): a
second controller on a live data dir exits 2 naming the dir and the holder's pid.
An app cluster (`--app`, else the cluster file's [app]; snapmesh.app): every
COMPLETE snapshot is judged by the app's invariants (snapmesh.protocol.appstate),
and a restore to one that breaks an invariant is refused. When the controller
cannot import the file's app it warns once and completes snapshots "unchecked";
an `--app` of its own that does not load exits 2 with one line.
Exit status: 0 after a clean stop on SIGINT/SIGTERM, 1 when it cannot bind, 2 for
bad arguments, a malformed cluster file, an --app that does not load or a data dir in use.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging

from prometheus_client import CollectorRegistry

from snapmesh.services.controller import journal as J
from snapmesh.services.controller import heldseed
from snapmesh.services.controller.engine import ControllerEngine, system_now
from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.app import load_app, v1fields
from snapmesh.protocol import blocks
from snapmesh.protocol.appstate import AppChecker, side_for
from snapmesh.protocol.controller import journalblocks, loglines
from snapmesh.protocol.controller.machine import Controller
from snapmesh.protocol.hybrid import wire_mode
from snapmesh.protocol.controller.tracker import Tracker
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security
from snapmesh.settings.argparsing import positive_float, positive_int
from snapmesh.serving.datalock import CONTROLLER, serve_holding
from snapmesh.serving.runtime import (
    CONTROLLER_RECEIVE_BYTES, Failure, ServiceHost, say, serve_until_stopped, wait_for_stop_signal,
)
from snapmesh.serving.startup import OneLineParser, Prepared, server_main
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

log = logging.getLogger("snapmesh.controller")

SERVICE_NAME = "snapmesh.v1.Controller"


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="snapmesh controller", description="Run the snapshot controller.")
    parser.add_argument("--config", metavar="FILE", help="cluster file (default: the shipped 4-node config)")
    parser.add_argument(
        "--keep", type=positive_int, metavar="N",
        help="keep the files of the N newest COMPLETE snapshots (and the one last restored); default: controller.keep, else all",
    )
    parser.add_argument(
        "--max-concurrent-snapshots", type=positive_int, metavar="N",
        help="refuse a trigger (RESOURCE_EXHAUSTED) while N snapshots are in progress; "
        "default: controller.max_concurrent_snapshots, else 32",
    )
    parser.add_argument("--app", metavar="MODULE:ATTR",
                        help="the app the nodes run, to check its invariants; default: the cluster file's [app]")
    parser.add_argument("--interval", type=positive_float, metavar="S",
                        help="also take a snapshot every S seconds (default: none, only when triggered)")
    parser.add_argument(
        "--deadline", type=positive_float, metavar="S", help="fail a snapshot not finished after S seconds "
        "(default: controller.snapshot_deadline_s)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    return server_main(_parser(), argv, _prepare)


def _prepare(args: argparse.Namespace, cfg: cluster_config.ClusterConfig) -> Prepared:
    cfg = cluster_config.with_controller(
        cfg, snapshot_deadline_s=args.deadline, keep=args.keep, max_concurrent_snapshots=args.max_concurrent_snapshots
    )
    identity = security.load_identity(cfg, cluster_config.CONTROLLER_NAME)  # None: plaintext
    checker = app_checker(cfg, explicit=args.app is not None)
    # One controller per data dir: the lock is taken before anything there is read or written.
    return "controller", lambda: serve_holding(
        cfg.data_dir, CONTROLLER, "snapmesh controller", lambda: _serve_locked(cfg, args.interval, identity, checker)
    )


def app_checker(cfg: cluster_config.ClusterConfig, *, explicit: bool) -> AppChecker:
    """The side that checks the snapshots of the app `cfg` names (appstate V4)."""
    app = cluster_config.hosted(cfg)  # a file without [app]: the bank app, its params the file's
    checker, warning = side_for(app.module, app.params, load=load_app, explicit=explicit,
                                fields_for=v1fields.for_app)
    if warning is not None:
        log.warning("%s", warning)
    return checker


async def _serve_locked(
    cfg: cluster_config.ClusterConfig, interval: float | None, identity: security.Identity | None, checker: AppChecker
) -> int:
    machine = Controller(
        Tracker(
            topology=cfg.topology,
            deadline_s=cfg.controller.snapshot_deadline_s,
            snapshot_mode=wire_mode(cfg.snapshot_mode),  # hybrid nodes report as overtake ones (protocol/hybrid.py H1)
            checker=checker,
        ),
        max_concurrent=cfg.controller.max_concurrent_snapshots, keep=cfg.controller.keep, cluster_file=str(cfg.path),
    )
    store = SnapshotStore(cfg.snapshots_dir, cfg.data_dir / "controller" / "snapshots")
    snapshots, warnings = store.load_all(listed=True)  # large states as block lists: memory follows no state size
    say(log, *loglines.loaded(len(snapshots), str(store.compact_directory), warnings))
    missing = {s.snapshot_id: m for s in snapshots if any(m := store.missing_files(s.snapshot_id))}
    machine.loaded(snapshots, missing=missing)  # the machine decides what to file again (replay.py S2)
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry, [n.id for n in cfg.nodes])
    journal = J.Journal(cfg.data_dir / "controller" / "journal", on_round=metrics.journal_round,
                        before_rewrite=store.blocks.settle)  # blockdir.py D8
    writer = StoreWriter(store, on_filed=lambda sid: engine.filed(sid))  # nothing is filed before the engine starts
    try:
        records, warnings = journal.open()
        filed = {s.snapshot_id for s in snapshots}
        # The blocks live records carry, written unsynced (blockdir.py D8), back where an OS crash lost them (JB3)
        written, unwritten = _written_back(store, journalblocks.carried(records, skip=filed))
        if written:
            warnings.append(f"wrote back {written} blocks under {store.blocks.directory} from the journal's records "
                            "(lost or damaged in a crash)")
        warnings.extend(unwritten)
        # Reports journaled as blocks made whole (a large one listed: JB5), their blocks pinned
        # again, before the sweep (journalblocks.py JB3); a block that cannot be read drops its snapshot(s) only
        machine.forms.reader = lambda: functools.partial(_checked_block, store)  # the replay's listed states (JB5)
        records, pins, dropped = journalblocks.rebuilt(records, functools.partial(_stored_block, store), skip=filed,
                                                       note=machine.forms.note)
        for sid, names in pins.items():
            store.pins.pin(sid, names)
        if swept := store.sweep():  # this controller owns the data dir (its lock): nothing is being filed
            warnings.append(swept)
        say(log, *loglines.replayed(machine.replayed(records, system_now()), warnings + dropped))
        store.grids.members(machine.topology.nodes)  # gridmemo.py GM6 (then each rescale's: engine.py)
        engine = ControllerEngine(
            config=cfg, machine=machine, journal=journal, writer=writer, metrics=metrics, identity=identity,
        )
        # what each node holds of its states' blocks, from the notes and the stored manifests (heldseed.py HT2)
        if taken := heldseed.take_back(engine.node_blocks, cfg.data_dir / "controller" / "nodeblocks",
                                       [n.id for n in cfg.nodes], heldseed.stored_manifests(store.compact_path)):
            log.info("taken back what the nodes hold of their states' blocks: %s", taken)
        service = ControllerService(engine)
        host = ServiceHost(
            bind_address=cfg.bind_address(cfg.controller),
            metrics_bind=cfg.metrics_bind(cfg.controller),
            registry=registry,
            identity=identity,
            max_receive_bytes=CONTROLLER_RECEIVE_BYTES,
        )
        host.add(pb_grpc.add_ControllerServicer_to_server, service, SERVICE_NAME)
        await engine.start()
        service.interval_s = interval or 0.0
        periodic = asyncio.create_task(engine.periodic(interval)) if interval else None
        mismatch = asyncio.create_task(service.mode_mismatch())
        try:
            return await serve_until_stopped(
                host, log, serving=lambda: log.info(
                    "serving on %s (metrics %s:%d), %d nodes, deadline %gs",
                    host.bind_address, *cfg.metrics_bind(cfg.controller), len(cfg.nodes), machine.deadline_s,
                ), stop_signal=wait_for_stop_signal, stopping=lambda sig: f"{sig.name}: stopping",
                failures=[Failure(mismatch, lambda failed: str(failed.result()), 2)],
            )
        finally:
            mismatch.cancel()
            if periodic is not None:
                periodic.cancel()
            engine.end_streams()
            await host.stop()
            await engine.close()
    finally:
        await asyncio.to_thread(writer.close)
        await journal.close()


def _checked_block(store: SnapshotStore, name: bytes) -> bytes | None:
    """Block `name` from the store's files, only as its name says (blocks.py B3; None: not so held)."""
    block = _stored_block(store, name)
    return block if block is not None and blocks.block_hash(block) == name else None


def _stored_block(store: SnapshotStore, name: bytes) -> bytes | None:
    """Block `name` as stored, for the replay (JB3). A file there that cannot be read (EIO, ...) is
    as good as none: the snapshot(s) whose reports name it are dropped, with the warning that names
    snapshot, node and block (journalblocks.py `rebuilt`), and the controller starts (a filed
    snapshot's unreadable block is judged so too: listedload.py). `read` takes it so (blockdir.py D11)."""
    return store.blocks.read(name)


def _written_back(store: SnapshotStore, carried: dict[bytes, bytes]) -> tuple[int, list[str]]:
    """The journal's blocks written back (JB3): how many, and one warning per block that could not be
    (its file there and unwritable, say): the others are still written, and the replay goes on
    (a record carrying such a block is made whole from the block it carries)."""
    try:
        return store.blocks.write(carried)[0], []
    except OSError:  # one block at a time, to write back all the others
        pass
    written, failed = 0, []
    for name, block in carried.items():
        try:
            written += store.blocks.write({name: block})[0]
        except OSError as exc:
            failed.append(f"cannot write back block sha256:{name.hex()} under {store.blocks.directory} from the "
                          f"journal: {exc}")
    return written, failed
