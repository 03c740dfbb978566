"""A call's retry policy (snapmesh/protocol/retry.py, T1-T3), and the ones the controller
machine's effects carry: which failures are final, how long and how often a call is tried,
and what a call given up on is called."""

from __future__ import annotations

from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.effects import ABORT, RESTORE
from snapmesh.protocol.controller.tracker import Now
from snapmesh.protocol.retry import PAUSE_S, Failed, Retry
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

DOWN = Failed("UNAVAILABLE", "connection refused")
NO = Failed("FAILED_PRECONDITION", "restoring epoch 1 into epoch 1")


def test_a_refusal_is_final_t1() -> None:
    assert RESTORE.again(NO, 1, 0.0) is None and RESTORE.again(Failed("INVALID_ARGUMENT", "x"), 1, 0.0) is None
    assert RESTORE.gave_up(NO) == "FAILED_PRECONDITION: restoring epoch 1 into epoch 1"


def test_any_other_failure_is_tried_again_until_for_s_or_tries_t2() -> None:
    assert RESTORE.again(DOWN, 1, 0.0) == PAUSE_S and RESTORE.again(DOWN, 100, 29.9) == PAUSE_S
    assert RESTORE.again(DOWN, 101, 30.0) is None
    assert RESTORE.gave_up(DOWN) == "unreachable for 30s (UNAVAILABLE: connection refused)"
    assert ABORT.again(DOWN, 1, 0.0) is None  # one try
    start = Retry(5.0, 3.0, tries=2, wait=True)
    assert start.again(DOWN, 1, 0.1) == 0.0 and start.again(DOWN, 2, 0.2) is None  # at once, waiting for the channel
    assert [start.waits(1), start.waits(2), RESTORE.waits(2)] == [False, True, False]


def test_the_first_try_waits_its_timeout_a_later_one_at_most_for_s_t3() -> None:
    start = Retry(10.0, 3.0, tries=2, wait=True)
    assert (start.timeout(1), start.timeout(2)) == (10.0, 3.0)
    assert (RESTORE.timeout(1), RESTORE.timeout(7)) == (5.0, 5.0)


def test_the_machine_sends_a_start_with_its_deadline_and_names_what_a_call_gave_up_on() -> None:
    now = Now(mono=1.0, wall=1_700_000_000.0)
    m = M.Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=7.0))
    m.trigger("s1", "a", now)
    [start] = [e for e in m.drain() if isinstance(e, M.StartAt)]
    assert start.retry == Retry(7.0, 3.0, tries=2, wait=True)
    m.start_unreachable("s1", "a", DOWN, now)
    assert m.get("s1").reason == "initiator a unreachable: StartSnapshot failed with UNAVAILABLE: connection refused"
    for sid, node, balance in (("s2", "a", 60), ("s2", "b", 40)):
        if node == "a":
            m.trigger(sid, "a", now)
        m.reported(bank.report(sid, node, balance,
                               channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)]), now)
    m.restore(m.get("s2"), "", now)
    m.node_restored("a", pb.RestoreStateResponse(), now)
    done = m.node_restored("b", DOWN, now)
    assert done.status == pb.Restore.FAILED
    assert done.reason == (
        "not restored on b: unreachable for 30s (UNAVAILABLE: connection refused) (the cluster is fenced at epoch 2)"
    )


def test_each_call_names_its_rpc_and_request_and_its_answer_is_the_machines() -> None:
    now = Now(mono=1.0, wall=1_700_000_000.0)
    m = M.Controller(bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=7.0))
    m.trigger("s1", "a", now)
    [start] = [e for e in m.drain() if isinstance(e, M.StartAt)]
    assert (start.rpc, start.request) == ("StartSnapshot", pb.StartSnapshotRequest(snapshot_id="s1", epoch=1))
    m.called(start, pb.StartSnapshotResponse(), now)
    assert m.drain() == [] and m.get("s1").status == pb.Snapshot.IN_PROGRESS
    m.called(start, DOWN, now)
    aborts = [e for e in m.drain() if isinstance(e, M.AbortAt)]
    assert m.get("s1").status == pb.Snapshot.FAILED and [a.node for a in aborts] == ["a", "b"]
    assert (aborts[0].rpc, aborts[0].request.reason) == ("AbortSnapshot", m.get("s1").reason)
    m.called(aborts[0], DOWN, now)  # an abort given up on changes nothing
    assert m.drain() == []
