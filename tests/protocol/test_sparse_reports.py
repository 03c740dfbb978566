"""Reports that list only the channels that recorded something (FullState.only_recorded_channels):
a node's report grows with what was in flight, not with its channels, and the controller
knows the empty ones from the topology (tracker rule T2). A COMPLETE snapshot still lists
every channel (T3), the same snapshot as from reports that list every channel, and a
report from a node before the field (every channel listed, or refused for one left out)
is read as it always was. The cluster runs the bank app (tests/support/bank_reports.py)."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller.tracker import COMPLETE, DuplicateReport, InvalidReport, Now, Tracker
from snapmesh.protocol.node import core
from snapmesh.protocol.reports import report_message
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

NODES = ("p1", "p2", "p3", "p4")
NOW = Now(mono=10.0, wall=1_700_000_000.0)
IN_FLIGHT = {"p3": {"p1": [5, 7]}, "p1": {"p4": [2]}}  # by receiver, by sender: the amounts recorded
BALANCES = {"p1": 90, "p2": 100, "p3": 88, "p4": 108}  # with the 14 in flight: 400


def tracker() -> Tracker:
    return bank.tracker(Topology.build(NODES), expected_total=100 * len(NODES), deadline_s=5.0)


def report(t: Tracker, node: str, *, sparse: bool) -> pb.FullState:
    """The node's part; `sparse`: only the channels that recorded something, as a node of today sends it."""
    message = bank.report("s1", node, BALANCES[node], only_recorded_channels=sparse)
    for src in t.topology.incoming(node):
        amounts = IN_FLIGHT.get(node, {}).get(src, [])
        if amounts or not sparse:
            message.channels.add(src=src, dst=node, in_flight=bank.items(src, node, amounts))
    return message


def complete(sparse_nodes: set[str]) -> pb.Snapshot:
    t = tracker()
    t.start("s1", "p1", NOW)
    for node in NODES:
        done = t.report(report(t, node, sparse=node in sparse_nodes), NOW).snapshot
    assert done.status == COMPLETE and done.conserved, done.reason
    return done


def test_sparse_reports_give_the_snapshot_of_full_ones_every_channel_listed() -> None:
    full, sparse, mixed = complete(set()), complete(set(NODES)), complete({"p1", "p3"})
    assert sum(len(report(tracker(), n, sparse=True).channels) for n in NODES) == 2  # of 12 channels
    assert [(c.src, c.dst) for c in sparse.channels] == list(Topology.build(NODES).channels)  # all 12, in order
    assert sparse.channels == full.channels == mixed.channels
    assert sparse.nodes == full.nodes == mixed.nodes and sparse.total == full.total == 400
    p1_p3 = next(c for c in sparse.channels if (c.src, c.dst) == ("p1", "p3"))
    assert [t.amount for t in p1_p3.in_flight] == [5, 7]


def test_an_old_report_that_leaves_a_channel_out_is_still_refused_a_sparse_one_still_checked() -> None:
    t = tracker()
    t.start("s1", "p1", NOW)
    old = report(t, "p3", sparse=False)
    del old.channels[1]  # p2->p3, empty: an old node must list it
    with pytest.raises(InvalidReport, match=r"did not report its incoming channel\(s\) p2->p3"):
        t.report(old, NOW)
    bad = report(t, "p3", sparse=True)
    bad.channels.add(src="p1", dst="p3")
    with pytest.raises(InvalidReport, match="p1->p3 is reported twice"):
        t.report(bad, NOW)
    bad = report(t, "p3", sparse=True)
    bad.channels.add(src="p9", dst="p3")
    with pytest.raises(InvalidReport, match="p9->p3 is not in the topology"):
        t.report(bad, NOW)
    assert not t.get("s1").nodes  # nothing changed
    assert not t.report(report(t, "p3", sparse=True), NOW).duplicate


def test_a_repeat_listing_the_empty_channels_or_not_is_the_same_report_before_and_after_complete() -> None:
    t = tracker()
    t.start("s1", "p1", NOW)
    t.report(report(t, "p3", sparse=True), NOW)
    assert t.report(report(t, "p3", sparse=False), NOW).duplicate  # the same recorded messages
    for node in ("p1", "p2", "p4"):
        t.report(report(t, node, sparse=False), NOW)
    assert t.get("s1").status == COMPLETE
    assert t.report(report(t, "p3", sparse=True), NOW).duplicate
    assert t.report(report(t, "p1", sparse=True), NOW).duplicate
    differs = report(t, "p3", sparse=True)
    differs.channels[0].in_flight[0].payload = bank.money(6)
    with pytest.raises(DuplicateReport, match="different state"):
        t.report(differs, NOW)


def test_a_node_reports_only_the_channels_it_recorded_messages_on() -> None:
    part = core.FullState(snapshot_id="s1", node_id="p3", state=b"88", app="bank", version=1,
                          channels={"p1": [core.Transfer(msg_id="p1:p3:1", seq=1, payload=b"5")],
                                    "p2": [], "p4": []})
    message = report_message(part)
    assert message.only_recorded_channels and message.state == b"88"
    assert [(c.src, [t.payload for t in c.in_flight]) for c in message.channels] == [("p1", [b"5"])]


def test_a_sparse_report_costs_the_tracker_its_recorded_channels_not_its_in_degree() -> None:
    """T7: what the tracker keeps of a pending snapshot's channels is the ones reported
    (a full report's empty ones included), not one entry per channel of the node."""
    t = tracker()
    t.start("s1", "p1", NOW)
    for node in ("p1", "p2", "p3"):
        t.report(report(t, node, sparse=True), NOW)
    assert sorted(t._pending["s1"].recorded) == [("p1", "p3"), ("p4", "p1")]  # of the 9 channels into p1-p3
    done = t.report(report(t, "p4", sparse=False), NOW).snapshot  # a full report: its 3 channels, listed
    assert done.status == COMPLETE and len(done.channels) == 12 and done.total == 400
