"""An app cluster's snapshots at the controller: states and payloads kept, invariants judged (appstate V1-V3).

A two-node token ring described inline (snapmesh.app only): the tracker keeps each
node's state bytes and each in-flight payload, the checker runs the app's
invariant on every COMPLETE snapshot, a broken one refuses the restore, a
controller without the app's module completes it "unchecked", and a restore's
plan carries the states and payloads to the nodes.
"""

from __future__ import annotations

import pytest

from snapmesh.app import App, AppError, View
from snapmesh.checking import snapshot_file
from snapmesh.protocol.controller import restoreplan
from snapmesh.protocol.appstate import AppChecker, digest, side_for, view_of
from snapmesh.protocol.topology import Topology
from snapmesh.protocol.controller.tracker import COMPLETE, DuplicateReport, Now, Tracker
from snapmesh.v1 import snapmesh_pb2 as pb

NOW = Now(mono=0.0, wall=1_795_000_000.0)
TOKEN = b"token"


def one_token(view: View) -> list[str]:
    count = sum(int(state) for state in view.states.values()) + sum(p == TOKEN for *_, p in view.in_flight)
    return [] if count == 1 else [f"{count} tokens"]


APP = App(name="ring", new=lambda info: None, invariants={"one token": one_token})


def tracker(checker: AppChecker | None) -> Tracker:
    return Tracker(topology=Topology.build(["a", "b"], None), deadline_s=5, checker=checker)


def report(node: str, state: bytes, in_flight: list[bytes] = ()) -> pb.FullState:
    src = "b" if node == "a" else "a"
    items = [pb.InFlightTransfer(msg_id=f"{src}:{node}:{seq}", seq=seq, payload=p) for seq, p in enumerate(in_flight, 1)]
    return pb.FullState(snapshot_id="s1", node_id=node, state=state, channels=[pb.ChannelState(src=src, dst=node,
                                                                                              in_flight=items)])


def complete(checker: AppChecker | None, a: pb.FullState, b: pb.FullState) -> pb.Snapshot:
    machine = tracker(checker)
    machine.start("s1", "a", NOW)
    machine.report(a, NOW)
    snapshot = machine.report(b, NOW).snapshot
    assert snapshot.status == COMPLETE, snapshot.reason
    return snapshot


def test_a_token_in_flight_is_kept_with_its_seq_and_the_invariant_holds():
    snapshot = complete(AppChecker("ring:app", APP), report("a", b"0"), report("b", b"0", [TOKEN]))
    assert [(n.node_id, n.state, n.state_digest) for n in snapshot.nodes] == [
        ("a", b"0", digest(b"0")), ("b", b"0", digest(b"0"))]
    assert view_of(snapshot).in_flight == [("a", "b", 1, TOKEN)]
    assert snapshot.app.spec == "ring:app" and snapshot.app.status == pb.AppCheck.CHECKED
    assert [(i.name, i.ok, list(i.problems)) for i in snapshot.app.invariants] == [("one token", True, [])]
    # an app without an adapter of its v1 figures: they are absent, and its invariants decide
    assert not any(map(snapshot.HasField, ("total", "expected_total", "conserved")))
    assert not any(n.HasField("balance") for n in snapshot.nodes)
    assert not any(t.HasField("amount") for c in snapshot.channels for t in c.in_flight)
    assert restoreplan.problem(snapshot) == ""
    plan = restoreplan.plan(snapshot, epoch=2)
    assert plan["a"].state == b"0" and plan["b"].HasField("state")
    assert [(t.seq, t.payload) for c in plan["b"].channels for t in c.in_flight] == [(1, TOKEN)]


def test_a_second_token_breaks_the_invariant_and_refuses_the_restore():
    snapshot = complete(AppChecker("ring:app", APP), report("a", b"1"), report("b", b"0", [TOKEN]))
    assert [(i.name, i.ok, list(i.problems)) for i in snapshot.app.invariants] == [("one token", False, ["2 tokens"])]
    assert "one token" in snapshot.reason
    assert "breaks the app's invariant(s) 'one token'" in restoreplan.problem(snapshot)


def test_without_the_apps_module_the_snapshot_completes_unchecked():
    snapshot = complete(AppChecker("ring:app", None, why="no module named 'ring'"), report("a", b"5"), report("b", b"0"))
    assert snapshot.app.status == pb.AppCheck.UNCHECKED and not snapshot.app.invariants
    assert snapshot.reason == "unchecked: no module named 'ring'"
    assert restoreplan.problem(snapshot) == ""


def test_a_check_that_raises_is_a_broken_invariant_not_a_crash():
    def boom(view: View) -> list[str]:
        raise RuntimeError("bad check")

    app = App(name="ring", new=lambda info: None, invariants={"boom": boom})
    snapshot = complete(AppChecker("ring:app", app), report("a", b"1"), report("b", b"0"))
    [result] = snapshot.app.invariants
    assert not result.ok and "bad check" in result.problems[0]


def test_a_repeated_app_report_is_a_duplicate_and_a_different_state_is_refused():
    machine = tracker(AppChecker("ring:app", APP))
    machine.start("s1", "a", NOW)
    machine.report(report("a", b"1"), NOW)
    assert machine.report(report("a", b"1"), NOW).duplicate
    machine.report(report("b", b"0"), NOW)
    assert machine.report(report("a", b"1"), NOW).duplicate  # once COMPLETE too
    with pytest.raises(DuplicateReport, match="different state"):
        machine.report(report("a", b"0"), NOW)


def test_snapshot_verify_reads_an_apps_file_its_invariants_and_its_state_digests(tmp_path):
    snapshot = complete(AppChecker("ring:app", APP), report("a", b"0"), report("b", b"0", [TOKEN]))
    path = tmp_path / f"{snapshot.snapshot_id}.pb"
    path.write_bytes(snapshot_file.sealed_bytes(snapshot)[0])
    verdict = snapshot_file.check(path)
    assert verdict.ok, verdict.failed()
    assert [c.detail for c in verdict.checks if c.name == "invariants"] == ["1 of app ring:app held"]

    broken = complete(AppChecker("ring:app", APP), report("a", b"1"), report("b", b"0", [TOKEN]))
    broken.nodes[1].state = b"7"  # and a state that no longer matches its digest
    path.write_bytes(snapshot_file.sealed_bytes(broken)[0])
    failed = {c.name: c.detail for c in snapshot_file.check(path).failed()}
    assert failed["invariants"] == "one token: 2 tokens"
    assert "node b: its state does not match its digest" in failed["consistent"]


def _unloadable(spec: str) -> App:
    raise AppError(f"app {spec!r}: no module named 'ring'")


def test_an_app_that_loads_checks_its_snapshots() -> None:
    checker, warning = side_for("ring:app", {"n": 2}, load=lambda spec: APP, explicit=True)
    assert warning is None and checker is not None
    assert (checker.spec, checker.app, dict(checker.params)) == ("ring:app", APP, {"n": 2})


def test_an_app_of_the_cluster_file_that_does_not_load_completes_unchecked_saying_why_once() -> None:
    checker, warning = side_for("ring:app", {}, load=_unloadable, explicit=False)
    assert checker is not None and checker.app is None and checker.why == "app 'ring:app': no module named 'ring'"
    assert warning == ("cannot load the app ring:app (app 'ring:app': no module named 'ring'): "
                       "its snapshots complete unchecked")


def test_an_app_asked_for_by_name_that_does_not_load_is_refused() -> None:
    with pytest.raises(AppError, match="no module named 'ring'"):
        side_for("ring:app", {}, load=_unloadable, explicit=True)
