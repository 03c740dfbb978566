"""What the controller measures (snapmesh/protocol/controller/measures.py): the table
and what each effect, refusal and journal round moves, without a registry."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller import machine as ctl
from snapmesh.protocol.controller import measures as m
from snapmesh.v1 import snapmesh_pb2 as pb


def finished(status: int, nodes: dict[str, tuple[int, int, int, int, int]] | None = None, *, at_s: int = 1_700_000_000,
             size: int = 0) -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id="s1", status=status)
    snapshot.started_at.FromSeconds(at_s - 2)
    snapshot.finished_at.FromSeconds(at_s)
    snapshot.stats.state_size_bytes = size
    for node, (delay, recording, report, messages, nbytes) in (nodes or {}).items():
        snapshot.stats.nodes.add(node_id=node, start_delay_ms=delay, recording_duration_ms=recording,
                                 report_time_ms=report, in_flight_messages=messages, in_flight_bytes=nbytes)
    return snapshot


def moved(measures: list[m.Measure]) -> dict[tuple[str, str | None], float]:
    return {(x.metric, x.label): x.value for x in measures}


def test_a_failed_snapshot_is_counted_and_timed_by_status_and_nothing_else() -> None:
    assert moved(m.of(ctl.Finished(finished(pb.Snapshot.FAILED, {"a": (1, 2, 3, 4, 5)})))) == {
        ("snapshots", "FAILED"): 1, ("duration", "FAILED"): 2.0,
    }


def test_a_complete_snapshot_moves_every_per_node_histogram_in_seconds_its_size_and_the_last_complete_time() -> None:
    snapshot = finished(pb.Snapshot.COMPLETE, {"a": (1500, 250, 5, 7, 140), "b": (0, 10, 20, 0, 0)}, size=900)
    assert moved(m.of(ctl.Finished(snapshot))) == {
        ("snapshots", "COMPLETE"): 1, ("duration", "COMPLETE"): 2.0,
        ("start_delay", "a"): 1.5, ("recording_duration", "a"): 0.25, ("report_time", "a"): 0.005,
        ("node_in_flight_messages", "a"): 7, ("node_in_flight_bytes", "a"): 140,
        ("start_delay", "b"): 0.0, ("recording_duration", "b"): 0.01, ("report_time", "b"): 0.02,
        ("node_in_flight_messages", "b"): 0, ("node_in_flight_bytes", "b"): 0,
        ("state_size", None): 900, ("last_complete", None): 1_700_000_000,
    }


@pytest.mark.parametrize("status, label", [(pb.Restore.RESTORED, "RESTORED"), (pb.Restore.FAILED, "FAILED")])
def test_a_settled_restore_is_counted_by_outcome(status: int, label: str) -> None:
    assert m.of(ctl.RestoreDone(pb.Restore(status=status))) == [m.Measure("restores", 1, label)]


def test_only_the_refusals_the_metrics_count_move_them_and_other_effects_move_nothing() -> None:
    assert m.refused(ctl.TooManySnapshots("x")) == [m.Measure("refused_triggers", 1)]
    assert m.refused(ctl.StaleReport("y")) == [m.Measure("stale_reports", 1)]
    assert m.refused(ValueError("no")) == [] and m.of(ctl.Publish(pb.Snapshot())) == []


def test_a_restart_moves_the_last_complete_time_only_for_complete_snapshots_and_journal_steps_never_wait_less_than_0() -> None:
    loaded = [finished(pb.Snapshot.COMPLETE, at_s=10), finished(pb.Snapshot.FAILED, at_s=30)]
    assert m.loaded(loaded) == [m.Measure("last_complete", 10)]
    assert m.journal_round(3) == [m.Measure("journal_syncs", 1), m.Measure("journal_records", 3)]
    assert m.journal_wait("trigger", -0.001) == [m.Measure("journal_wait", 0.0, "trigger")]


def test_every_measure_names_a_metric_of_the_table_with_a_label_exactly_when_the_metric_has_one() -> None:
    complete = finished(pb.Snapshot.COMPLETE, {"a": (1, 1, 1, 1, 1)})
    every = [*m.of(ctl.Finished(complete)), *m.of(ctl.RestoreDone(pb.Restore())), *m.refused(ctl.StaleReport("x")),
             *m.refused(ctl.TooManySnapshots("x")), *m.journal_round(1), *m.journal_wait("complete", 1),
             *m.hop("visible", 0.5)]
    assert {x.metric for x in every} == set(m.METRICS) - {"in_progress", "epoch"}  # those two are read, not moved
    for x in every:
        metric = m.METRICS[x.metric]
        assert (x.label is None) == (metric.label is None), x
        if metric.label is not None and metric.label[0] != m.NODE:
            assert x.label in metric.label[1], x
    assert {metric.reads for metric in m.METRICS.values() if metric.reads} == {"in_progress", "epoch"}


def test_a_hop_is_one_of_the_controllers_never_below_0_and_an_unknown_duration_moves_nothing() -> None:
    assert m.hop("received", -0.002) == [m.Measure("hop", 0.0, "received")]  # two clocks: skew below 0 counts as 0
    assert m.hop("journaled", 0.004) == [m.Measure("hop", 0.004, "journaled")]
    assert m.hop("received", None) == []  # a report from a node that sent no stamp
    with pytest.raises(ValueError, match="no controller hop 'persisted'"):  # a node's hop, not the controller's
        m.hop("persisted", 0.1)
