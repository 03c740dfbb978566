"""A controller's report path in this process, without its engine: `report_service(tmp_path)`, a
`ControllerService` over a real store and its writer under `tmp_path`, its engine a stand-in that
holds only the writer and the tracker's `BlockForms` (all `_know` and `_whole_report` use), for
tests that hand it a node's reports (services/node/sentblocks.py) and look at what it stored;
`first_report`, a node's first report taken, so that its next comes as blocks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from snapmesh.protocol.controller.blockforms import BlockForms
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb


@dataclass
class ReportService:
    service: ControllerService
    forms: BlockForms  # the tracker's: the listed reports' sizes and digests
    store: SnapshotStore
    writer: StoreWriter  # files nothing until submitted; closed by the test

    def first_report(self, state: bytes, state_digest: str = "") -> SentBlocks:
        """Node p1's first report (snapshot s1) of `state`, whole (the controller holds none of its
        blocks), taken as ReportState takes it and answered as taking blocks: the node, whose next
        report comes as blocks."""
        node = SentBlocks()
        first, names = node.form(pb.FullState(snapshot_id="s1", node_id="p1", state=state, app_name="blob",
                                              app_version=1, state_digest=state_digest))
        assert not first.HasField("state_blocks")
        self.service._know(first, 1)
        node.accepted(pb.ReportStateResponse(takes_blocks=True), names)
        return node


def report_service(tmp_path: Path) -> ReportService:
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    forms = BlockForms()
    service = ControllerService(SimpleNamespace(writer=writer, machine=SimpleNamespace(  # type: ignore[arg-type]
        forms=forms)))
    return ReportService(service, forms, store, writer)
