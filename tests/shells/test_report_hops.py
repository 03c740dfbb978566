"""The node's hops of the path after its cut (services/node/hops.py), on a clock the
test moves: each hop is observed once per snapshot, between the right two events."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from snapmesh.services.node.hops import ReportHops
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.v1 import snapmesh_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def observed(metrics: NodeMetrics, hop: str) -> tuple[float, float]:
    """(count, sum) of one hop's histogram."""
    values = {s.name: s.value for family in metrics.registry.collect() for s in family.samples
              if s.labels.get("hop") == hop}
    return values["snapmesh_snapshot_hop_seconds_count"], values["snapmesh_snapshot_hop_seconds_sum"]


def test_each_hop_is_timed_between_its_two_events_once_and_a_retry_is_no_second_sent() -> None:
    metrics, clock = NodeMetrics("p1", CollectorRegistry()), Clock()
    hops = ReportHops(metrics, clock=clock, wall_ns=lambda: 1_700_000_000_123_000_000)
    message = pb.FullState(snapshot_id="s1", node_id="p1", cut_at_unix_ns=1_000_000_000, done_at_unix_ns=1_004_000_000)
    hops.finished(message)  # recorded: the machine's two stamps, 4 ms apart
    clock.now += 0.002
    hops.durable("s1")
    clock.now += 0.0005
    left = hops.leaving(message)
    assert message.sent_at_unix_ns == 1_700_000_000_123_000_000  # what the controller times `received` from
    clock.now += 0.010
    hops.answered(left)
    hops.answered(hops.leaving(message))  # a second attempt (a retry): answered again, no second `sent`
    for hop, count, total in (("recorded", 1, 0.004), ("persisted", 1, 0.002), ("sent", 1, 0.0005),
                              ("answered", 2, 0.010)):
        assert observed(metrics, hop) == (count, pytest.approx(total, abs=1e-9)), hop


def test_a_cut_from_before_a_restart_and_a_dropped_part_time_nothing() -> None:
    metrics, clock = NodeMetrics("p1", CollectorRegistry()), Clock()
    hops = ReportHops(metrics, clock=clock)
    hops.finished(pb.FullState(snapshot_id="s1", done_at_unix_ns=5))  # cut 0: unknown
    hops.forget("s1")  # aborted before it was durable
    hops.durable("s1")
    hops.leaving(pb.FullState(snapshot_id="s1"))
    hops.leaving(pb.FullState(snapshot_id="s2"))  # a report resumed after a restart: never finished here
    assert [observed(metrics, hop)[0] for hop in ("recorded", "persisted", "sent", "answered")] == [0, 0, 0, 0]
