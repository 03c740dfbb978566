"""The tracker and the controller machine through the app's side (appside.py): they
know none of an app's fields, so a side of its own (here one that counts items and
keeps its count in `total`) gets a report's, a snapshot's and a restore's fields,
and the bank's side (snapmesh/bank/ledger.py) is the default."""

from __future__ import annotations

import pytest

from snapmesh.bank.ledger import BankSide
from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.appside import PartRefused
from snapmesh.protocol.controller.tracker import COMPLETE, InvalidReport, Now, Tracker
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

NOW = Now(mono=0.0, wall=1_795_000_000.0)


class Counting:
    """A side whose tally counts the nodes and the items in flight; it wants the count to be `expected`."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.calls: list[str] = []

    def part(self, state, items):
        self.calls.append("part")
        if state.cut_at_unix_ns < 0:
            raise PartRefused(f"node {state.node_id!r}: a cut before the epoch")
        return {src: len(channel) for src, channel in items.items()}

    def node(self, entry, state):
        return 1

    def item_columns(self, items):
        return ()

    def run_columns(self, run):
        return ()

    def tally(self, items):
        return len(items)

    def add(self, in_flight, src, dst, seqs, columns, start, stop):
        for seq in seqs[start:stop]:
            in_flight.add(msg_id=f"{src}:{dst}:{seq}", seq=seq)
        return stop - start

    def judge(self, snapshot, tally):
        snapshot.total, snapshot.expected_total, snapshot.conserved = tally, self.expected, tally == self.expected
        snapshot.reason = "" if snapshot.conserved else f"counted {tally}, not {self.expected}"

    def restore_part(self, request, entry):
        request.state = entry.node_id.encode()

    def restored(self, entry, answer, request):
        entry.state = b"back"


def report(node: str, seqs: list[int], **fields) -> pb.FullState:
    src = "b" if node == "a" else "a"
    items = [pb.InFlightTransfer(msg_id=f"{src}:{node}:{q}", seq=q) for q in seqs]
    return pb.FullState(snapshot_id="s1", node_id=node, channels=[pb.ChannelState(src=src, dst=node, in_flight=items)],
                        **fields)


def complete(side, a: pb.FullState, b: pb.FullState, mode: str = "classic") -> pb.Snapshot:
    t = Tracker(topology=Topology.build(["a", "b"], None), expected_total=0, deadline_s=5, checker=side,
                snapshot_mode=mode)
    t.start("s1", "a", NOW)
    t.report(a, NOW)
    return t.report(b, NOW).snapshot


def test_a_side_of_its_own_keeps_its_tally_and_judges_the_snapshot():
    side = Counting(expected=5)
    snapshot = complete(side, report("a", [1, 2]), report("b", [7]))
    assert snapshot.status == COMPLETE and snapshot.total == 5 and snapshot.reason == ""
    assert side.calls == ["part", "part"]  # once a report, never once an item
    snapshot = complete(Counting(expected=9), report("a", [1, 2]), report("b", [7]))
    assert snapshot.status == COMPLETE and snapshot.reason == "counted 5, not 9"


def test_overtake_items_the_receiver_did_not_record_are_made_by_the_side():
    a = report("a", [3], snapshot_mode="overtake", positions=[pb.ChannelPosition(src="b", dst="a", seq=2)],
               outbox_runs=[pb.OutboxRun(src="a", dst="b", seqs=[4, 5])])
    b = report("b", [], snapshot_mode="overtake", positions=[pb.ChannelPosition(src="a", dst="b", seq=3)],
               outbox_runs=[pb.OutboxRun(src="b", dst="a", seqs=[3])])
    snapshot = complete(Counting(expected=5), a, b, mode="overtake")
    assert [(c.src, [t.seq for t in c.in_flight]) for c in snapshot.channels] == [("a", [4, 5]), ("b", [3])]
    assert snapshot.total == 5 and snapshot.reason == ""


def test_a_refusal_of_the_side_is_an_invalid_report_that_changes_nothing():
    t = Tracker(topology=Topology.build(["a", "b"], None), expected_total=0, deadline_s=5, checker=Counting(0))
    t.start("s1", "a", NOW)
    with pytest.raises(InvalidReport, match="a cut before the epoch"):
        t.report(report("a", [1], cut_at_unix_ns=-1), NOW)
    assert not t.get("s1").nodes


def test_the_restore_carries_the_sides_fields_of_each_node():
    side = Counting(expected=3)
    t = Tracker(topology=Topology.build(["a", "b"], None), expected_total=0, deadline_s=5, checker=side)
    m = M.Controller(t)
    m.trigger("s1", "a", NOW)
    m.reported(report("a", [1]), NOW)
    snapshot = m.reported(report("b", []), NOW).snapshot
    m.restore(snapshot, "", NOW)
    parts = {e.node: e.request for e in m.drain() if isinstance(e, M.RestoreAt)}
    assert {node: part.state for node, part in parts.items()} == {"a": b"a", "b": b"b"}
    m.node_restored("a", pb.RestoreStateResponse(epoch=2), NOW)
    done = m.node_restored("b", pb.RestoreStateResponse(epoch=2), NOW)
    assert done is not None and [(n.node_id, n.state) for n in done.nodes] == [("a", b"back"), ("b", b"back")]


def test_the_default_side_is_the_banks_and_it_refuses_an_apps_report():
    t = Tracker(topology=Topology.build(["a", "b"], None), expected_total=10, deadline_s=5)
    assert isinstance(t.side, BankSide) and t.side.expected_total == 10
    t.start("s1", "a", NOW)
    with pytest.raises(InvalidReport, match="reported an app's state; the controller runs the bank"):
        t.report(report("a", [], state=b"0"), NOW)
