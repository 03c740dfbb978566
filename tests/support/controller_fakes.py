"""Stand-ins for the controller's in-process shell tests (a real engine, journal and store,
no gRPC server): `blob_controller`, such an engine and servicer for two nodes;
`CallContext`, a plaintext call's context (no certificate, a peer address; an abort
fails the test); `QuietNode`, a node stub that accepts every StartSnapshot and
does nothing else; and `bank_pair_engine`, an engine of a two-node bank cluster over
a given journal whose writer files nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from snapmesh.app import App
from snapmesh.protocol.appstate import AppChecker
from snapmesh.protocol.controller.machine import Controller
from snapmesh.protocol.controller.tracker import Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.services.controller import journal as J
from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank


class CallContext:
    """A plaintext call's context: no certificate, a peer address."""

    def auth_context(self) -> dict:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


class QuietNode:
    async def StartSnapshot(self, request, timeout, wait_for_ready=False):
        return pb.StartSnapshotResponse()


@dataclass
class BlobController:
    """A controller's engine and servicer in this process over a real journal and store
    under `tmp_path`, for nodes a and b (a <-> b) hosting a blob app with no invariant;
    its writer never files, so the journal keeps every snapshot's frames."""

    engine: ControllerEngine
    service: ControllerService
    store: SnapshotStore
    writer: StoreWriter
    journal: J.Journal
    tracker: Tracker


def blob_controller(tmp_path: Path, deadline_s: float = 30.0, app: App | None = None,
                    nodes: tuple[str, ...] = ("a", "b")) -> BlobController:
    """`BlobController`'s; `app`: the app its checker judges with (default: the blob app, no invariant);
    `nodes`: every one with a channel to every other (default: a and b)."""
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    journal = J.Journal(tmp_path / "controller" / "journal")
    journal.open()
    channels = tuple((src, dst) for src in nodes for dst in nodes if src != dst)
    tracker = Tracker(topology=Topology(nodes=nodes, channels=channels), deadline_s=deadline_s,
                      checker=AppChecker("blob:app", app or App(name="blob", new=lambda info: None)))
    engine = ControllerEngine(config=config.load(config.DEFAULT_CONFIG), machine=Controller(tracker),
                              journal=journal, writer=writer, metrics=ControllerMetrics(CollectorRegistry()))
    engine.stubs = {n: QuietNode() for n in engine.nodes}  # type: ignore[misc]
    return BlobController(engine, ControllerService(engine), store, writer, journal, tracker)


class Unfiled:
    """A store writer that files nothing: what the journal holds is all there is."""

    def submit(self, snapshot) -> None:
        pass


def bank_pair_engine(journal: J.Journal, metrics: ControllerMetrics) -> ControllerEngine:
    """An engine over `journal` (opened) for bank nodes a and b (a <-> b) holding 100 in all,
    its writer `Unfiled`, its nodes `QuietNode`s; its reports: `bank_reports.pair_report`."""
    tracker = bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=30)
    engine = ControllerEngine(config=config.load(config.DEFAULT_CONFIG), machine=Controller(tracker),
                              journal=journal, writer=Unfiled(), metrics=metrics)  # type: ignore[arg-type]
    engine.stubs = {n: QuietNode() for n in engine.nodes}  # type: ignore[misc]
    return engine
