"""The bank's adapter of the v1 figures (snapmesh/bank/v1fields.py), the one the bank app names.

Over snapshots built here: a bank snapshot through the contract gets each node's
balance and each item's amount read from its bytes, and the total, expected total
and verdict; bytes the bank would not write leave every figure absent (F1), and
the app's invariant says what is wrong; another app has no adapter; a restore's
part goes to the node without the figures, and its answer has the balance after it.
"""

from __future__ import annotations

import dataclasses

import pytest

from snapmesh.app import AppError, load_app, v1fields
from snapmesh.bank.v1fields import BankFields
from snapmesh.protocol import appstate
from snapmesh.protocol.controller import restoreplan
from snapmesh.v1 import snapmesh_pb2 as pb

FIGURES = ("total", "expected_total", "conserved")
BANK = load_app("bank")


def through_the_contract(states: dict[str, bytes], in_flight: list[bytes]) -> pb.Snapshot:
    s = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE)
    for node, state in states.items():
        s.nodes.add(node_id=node, state=state, app_name="bank", app_version=1)
    channel = s.channels.add(src="a", dst="b")
    for seq, payload in enumerate(in_flight, 1):
        channel.in_flight.add(msg_id=f"a:b:{seq}", seq=seq, payload=payload)
    s.channels.add(src="b", dst="a")
    return s


def judged(snapshot: pb.Snapshot, params: dict) -> pb.Snapshot:
    checker = appstate.AppChecker("bank", BANK, params=params, fields=v1fields.for_app(BANK, params))
    checker.judge(snapshot)
    return snapshot


def test_the_adapter_is_the_one_the_app_names():
    assert BANK.v1_fields == "snapmesh.bank.v1fields:BankFields"
    assert isinstance(v1fields.for_app(BANK, {}), BankFields)
    assert v1fields.for_app(load_app("kvshard"), {}) is None  # it names none: its figures stay absent
    # any app may name one, by the same mechanism (the controller imports it by that name)
    other = dataclasses.replace(load_app("kvshard"), v1_fields="snapmesh.bank.v1fields:BankFields")
    assert isinstance(v1fields.for_app(other, {"total": 7}), BankFields)


@pytest.mark.parametrize("spec", ["snapmesh.no_such_module:Fields", "snapmesh.bank.v1fields:NoSuchClass"])
def test_an_adapter_that_cannot_be_made_is_an_app_error_naming_it(spec):
    other = dataclasses.replace(load_app("kvshard"), v1_fields=spec)
    with pytest.raises(AppError, match=f"app 'kvshard': its v1_fields '{spec}' cannot be made"):
        v1fields.for_app(other, {})
    checker, warning = appstate.side_for("kvshard", {}, load=lambda _: other, explicit=False, fields_for=v1fields.for_app)
    assert checker.app is None and warning is not None and spec in warning  # its snapshots complete unchecked
    with pytest.raises(AppError):
        appstate.side_for("kvshard", {}, load=lambda _: other, explicit=True, fields_for=v1fields.for_app)


@pytest.mark.parametrize("bad", ["snapmesh.bank.v1fields", 7])
def test_an_app_naming_its_adapter_wrongly_is_refused_as_it_is_made(bad):
    with pytest.raises(AppError, match="v1_fields must be a \"module:attr\" str or None"):
        dataclasses.replace(load_app("kvshard"), v1_fields=bad)


@pytest.mark.parametrize("in_flight, conserved", [([b"7", b"3"], True), ([b"7"], False)])
def test_a_bank_snapshot_gets_its_figures_from_its_bytes(in_flight, conserved):
    s = judged(through_the_contract({"a": b"90", "b": b"100"}, in_flight), {"initial_balance": 100})
    assert [(n.node_id, n.balance) for n in s.nodes] == [("a", 90), ("b", 100)]
    assert [t.amount for c in s.channels for t in c.in_flight] == [int(p) for p in in_flight]
    assert (s.total, s.expected_total, s.conserved) == (190 + sum(map(int, in_flight)), 200, conserved)
    assert [(i.name, i.ok) for i in s.app.invariants] == [("conserved", conserved)]  # the invariant agrees
    assert appstate.carries_v1(s) and (restoreplan.problem(s) == "") is conserved


def test_bytes_the_bank_would_not_write_leave_the_figures_absent_and_the_invariant_says_why():
    s = judged(through_the_contract({"a": b"90", "b": b"lots"}, [b"10"]), {"initial_balance": 100})
    assert not any(map(s.HasField, FIGURES)) and not any(n.HasField("balance") for n in s.nodes)
    assert not any(t.HasField("amount") for c in s.channels for t in c.in_flight)
    assert "not decimal ASCII" in s.reason and "broken" in restoreplan.problem(s)


def test_a_natively_taken_snapshot_keeps_its_figures():
    s = pb.Snapshot(snapshot_id="old", status=pb.Snapshot.COMPLETE)
    s.nodes.add(node_id="a", balance=95)
    s.channels.add(src="a", dst="b").in_flight.add(msg_id="a:b:1", seq=1, amount=5)
    BankFields({"total": 100}).fill(s)
    assert (s.nodes[0].balance, s.total, s.expected_total, s.conserved) == (95, 100, 100, True)


def test_the_restore_part_carries_no_figure_and_the_answer_has_the_balance_after_it():
    params = {"initial_balance": 100}
    s = judged(through_the_contract({"a": b"90", "b": b"100"}, [b"4", b"6"]), params)
    checker = appstate.AppChecker("bank", BANK, params=params, fields=v1fields.for_app(BANK, params))
    parts = restoreplan.with_app_fields(restoreplan.plan(s, 2), s, checker)
    assert [t.HasField("amount") for c in parts["b"].channels for t in c.in_flight] == [False, False]
    assert [t.payload for c in parts["b"].channels for t in c.in_flight] == [b"4", b"6"]
    assert [t.amount for c in s.channels for t in c.in_flight] == [4, 6]  # the snapshot keeps its figures
    answers = {}
    for node in ("a", "b"):
        checker.restored(answers.setdefault(node, pb.NodeBalance(node_id=node)), pb.RestoreStateResponse(epoch=2),
                         parts[node])
    assert {n: e.balance for n, e in answers.items()} == {"a": 90, "b": 110}


def test_a_natively_taken_snapshot_restores_as_the_bank_apps_bytes():
    s = pb.Snapshot(snapshot_id="old", status=pb.Snapshot.COMPLETE)
    s.nodes.add(node_id="a", balance=95)
    s.nodes.add(node_id="b", balance=0)
    s.channels.add(src="a", dst="b").in_flight.add(msg_id="a:b:1", seq=1, amount=5)
    params = {"total": 100}
    checker = appstate.AppChecker("bank", BANK, params=params, fields=v1fields.for_app(BANK, params))
    parts = restoreplan.with_app_fields(restoreplan.plan(s, 2), s, checker)
    assert {n: (p.state, p.balance) for n, p in parts.items()} == {"a": (b"95", 0), "b": (b"0", 0)}
    assert [(t.payload, t.HasField("amount")) for c in parts["b"].channels for t in c.in_flight] == [(b"5", False)]
    answers = {}
    for node in ("a", "b"):
        checker.restored(answers.setdefault(node, pb.NodeBalance(node_id=node)), pb.RestoreStateResponse(epoch=2),
                         parts[node])
    assert {n: e.balance for n, e in answers.items()} == {"a": 95, "b": 5}


def test_a_nodes_balance_is_filled_as_its_part_arrives():
    params = {"initial_balance": 100}
    checker = appstate.AppChecker("bank", BANK, params=params, fields=v1fields.for_app(BANK, params))
    entry = pb.NodeBalance(node_id="a")
    checker.node(entry, pb.FullState(node_id="a", state=b"90", app_name="bank", app_version=1))
    assert (entry.balance, entry.app_name) == (90, "bank")
    other = pb.NodeBalance(node_id="a")
    checker.node(other, pb.FullState(node_id="a", state=b"{}"))  # not the bank's bytes: left absent (F1)
    assert not other.HasField("balance")


def test_another_app_leaves_every_figure_absent():
    s = through_the_contract({"a": b"{}", "b": b"{}"}, [])
    appstate.AppChecker("kvshard", load_app("kvshard")).judge(s)
    assert not any(map(s.HasField, FIGURES)) and not appstate.carries_v1(s)
