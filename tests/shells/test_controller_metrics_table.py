"""The controller's metrics move as snapmesh/protocol/controller/measures.py says (applied by services/controller/metrics.py): the
effects the engine carries out, and the refusals the machine raises."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from snapmesh.protocol.controller import machine as ctl
from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.v1 import snapmesh_pb2 as pb


def test_effects_and_refusals_move_their_metrics() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry, ["a"])
    failed = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.FAILED)
    for effect in (ctl.Finished(failed), ctl.RestoreDone(pb.Restore(status=pb.Restore.RESTORED)),
                   ctl.RestoreDone(pb.Restore(status=pb.Restore.FAILED)), ctl.Publish(failed)):
        metrics.carried_out(effect)
    for refusal in (ctl.TooManySnapshots("x"), ctl.StaleReport("y"), ctl.StaleReport("z"), ValueError("no")):
        metrics.refused(refusal)
    value = registry.get_sample_value
    assert value("snapmesh_snapshots_total", {"status": "FAILED"}) == 1
    assert value("snapmesh_snapshots_total", {"status": "COMPLETE"}) == 0
    assert value("snapmesh_restores_total", {"status": "RESTORED"}) == value("snapmesh_restores_total", {"status": "FAILED"}) == 1
    assert value("snapmesh_snapshot_triggers_refused_total") == 1
    assert value("snapmesh_stale_epoch_reports_refused_total") == 2
