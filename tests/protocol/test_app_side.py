"""The tracker and the controller machine through the app's side (appside.py): they
know none of an app's fields and add up nothing, so a side of its own (here one that
counts the nodes and items of the whole snapshot and puts the count in `total`) gets
a report's, a snapshot's and a restore's fields; and there is no default side: the
bank runs through its app's checker like any app, and an old controller's native
report is mapped by the bank's adapter as the journal is replayed."""

from __future__ import annotations

import pytest

from snapmesh.protocol.controller import machine as M
from snapmesh.protocol.controller.appside import PartRefused
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller.tracker import COMPLETE, InvalidReport, Now, Tracker, TrackerMisuse
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

NOW = Now(mono=0.0, wall=1_795_000_000.0)


class Counting:
    """A side that counts the nodes and the items in flight of a whole snapshot; it wants the count to be `expected`."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.calls: list[str] = []

    def part(self, state, items):
        self.calls.append("part")
        if state.cut_at_unix_ns < 0:
            raise PartRefused(f"node {state.node_id!r}: a cut before the epoch")

    def node(self, entry, state):
        self.calls.append("node")

    def item_columns(self, items):
        return ()

    def run_columns(self, run):
        return ()

    def add(self, in_flight, src, dst, seqs, columns, start, stop):
        for seq in seqs[start:stop]:
            in_flight.add(msg_id=f"{src}:{dst}:{seq}", seq=seq)

    def judge(self, snapshot):
        count = len(snapshot.nodes) + sum(len(c.in_flight) for c in snapshot.channels)
        snapshot.total, snapshot.expected_total, snapshot.conserved = count, self.expected, count == self.expected
        snapshot.reason = "" if snapshot.conserved else f"counted {count}, not {self.expected}"

    def old_report(self, state):
        return state

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
    t = Tracker(topology=Topology.build(["a", "b"], None), deadline_s=5, checker=side,
                snapshot_mode=mode)
    t.start("s1", "a", NOW)
    t.report(a, NOW)
    return t.report(b, NOW).snapshot


def test_a_side_of_its_own_judges_the_whole_snapshot_from_what_it_holds():
    side = Counting(expected=5)
    snapshot = complete(side, report("a", [1, 2]), report("b", [7]))
    assert snapshot.status == COMPLETE and snapshot.total == 5 and snapshot.reason == ""
    # once a report and once a node (as it reports, then in the whole snapshot), never once an item
    assert side.calls == ["part", "node", "part", "node", "node", "node"]
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
    t = Tracker(topology=Topology.build(["a", "b"], None), deadline_s=5, checker=Counting(0))
    t.start("s1", "a", NOW)
    with pytest.raises(InvalidReport, match="a cut before the epoch"):
        t.report(report("a", [1], cut_at_unix_ns=-1), NOW)
    assert not t.get("s1").nodes


def test_the_restore_carries_the_sides_fields_of_each_node():
    side = Counting(expected=3)
    t = Tracker(topology=Topology.build(["a", "b"], None), deadline_s=5, checker=side)
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


def test_there_is_no_default_side_a_tracker_without_a_checker_is_a_caller_bug():
    with pytest.raises(TrackerMisuse, match="needs the checker of the app the cluster runs"):
        Tracker(topology=Topology.build(["a", "b"], None), deadline_s=5, checker=None)  # type: ignore[arg-type]


def native_report() -> pb.FullState:
    """What the bank's native nodes reported to an older controller: its figures in
    the v1 fields (balance, amount, amounts) and no state bytes."""
    native = pb.FullState(snapshot_id="s1", node_id="b", balance=30, snapshot_mode="overtake")
    native.channels.add(src="a", dst="b").in_flight.add(msg_id="a:b:1", amount=10, seq=1)
    native.positions.add(src="a", dst="b", seq=0)
    native.outbox_runs.add(src="b", dst="a", seqs=[4], amounts=[5])
    return native


def test_an_old_journals_native_report_is_replayed_as_the_bank_apps_and_completes_as_it():
    """Old data: the journal's reader keeps the report as it was written; its replay
    hands it to the bank's adapter once, which reads it as the bank app's report, and
    the snapshot it rebuilds is the one the bank app's nodes would have given."""
    [record], _, problem = R.decode_all(R.encode(R.Reported(state=native_report(), wall=1.0)))
    assert problem is None and record.state == native_report()  # decoding maps nothing: the framework knows no app
    assert bank.checker().old_report(native_report()) == pb.FullState(
        snapshot_id="s1", node_id="b", state=b"30", app_name="bank", app_version=1, snapshot_mode="overtake",
        channels=[pb.ChannelState(src="a", dst="b", in_flight=bank.items("a", "b", [10]))],
        positions=[pb.ChannelPosition(src="a", dst="b", seq=0)],
        outbox_runs=[bank.outbox_run("b", "a", [4], [5])])
    t = bank.tracker(Topology.build(["a", "b"], None), expected_total=100, deadline_s=5, snapshot_mode="overtake")
    a = bank.report("s1", "a", 55, {"b": []}, snapshot_mode="overtake",
                    positions=[pb.ChannelPosition(src="b", dst="a", seq=3)])
    journal = [R.Started(snapshot_id="s1", initiator="a", wall=NOW.wall), R.Reported(state=a, wall=NOW.wall), record]
    assert R.replay(journal, t, NOW, skip=set()) == ([], [])
    done = t.get("s1")
    assert done.status == COMPLETE and done.conserved and done.total == 100, done.reason
    assert [(c.src, [(i.seq, i.amount) for i in c.in_flight]) for c in done.channels] == [("a", [(1, 10)]), ("b", [(4, 5)])]
    app_report = bank.report("s1", "a", 55)
    assert bank.checker().old_report(app_report) == app_report  # an app's report: as it was


def test_an_app_without_an_adapter_gets_an_old_report_as_it_is():
    from snapmesh.app import load_app
    from snapmesh.protocol.appstate import AppChecker

    checker = AppChecker("kvshard", load_app("kvshard"))
    assert checker.old_report(native_report()) == native_report()
