"""The bank remembers the commands it paid (bank.KNOWN_COMMANDS): a repeated command pays,
answers, sends and refuses exactly as its first parse did, in both forms, and the memory stays
bounded. Each machine below runs the same commands as one that remembers nothing."""

from __future__ import annotations

import random

import pytest

from snapmesh.app import Context, NodeInfo, Refused
from snapmesh.services.app import bank


def machine(balance: int) -> bank.Bank:
    return bank.Bank(NodeInfo(node_id="p1", peers_out=("p2", "p3"), peers_in=("p2",),
                              params={"initial_balance": balance}))


def step(m: bank.Bank, data: bytes) -> object:
    ctx = Context("p1", ("p2", "p3"))
    try:
        return m.on_command(data, ctx), ctx.sends, m.snapshot()
    except Refused as refused:
        return refused.code, refused.text, ctx.sends, m.snapshot()


COMMANDS = [b"1 p2", b"7 p3", b"30 p2", b"07 p2", b"1 p1", b"0 p3", b"5 nobody", b"+1 p2",
            b'{"to": "p2", "amount": 3}', b'{"to": "p3", "amount": 40}', b'{"to":"p2","amount":3}',
            b'{"to": "p1", "amount": 1}', b'{"op": "balance"}']


def test_a_repeated_command_answers_as_its_parse_did_until_the_money_runs_out(monkeypatch) -> None:
    """Commands drawn with repeats until the balance refuses some (a remembered command too):
    the same answers, sends, refusals and states as a bank that parses every command."""
    rng = random.Random(7)
    print("seed 7")
    script = [rng.choice(COMMANDS) for _ in range(300)]
    remembering = machine(600)
    got = [step(remembering, data) for data in script]
    assert remembering._known  # it remembered some: the path under test ran
    monkeypatch.setattr(bank, "KNOWN_COMMANDS", 0)  # remembers nothing: every command is parsed
    parsing = machine(600)
    assert got == [step(parsing, data) for data in script]
    assert not parsing._known
    assert any(answer[0] == "FAILED_PRECONDITION" for answer in got)  # the money ran out on the way


def test_a_remembered_command_over_the_balance_is_refused_as_the_first_time() -> None:
    m = machine(10)
    assert step(m, b"6 p2") == (b"4", [("p2", b"6")], b"4")
    assert step(m, b"6 p2") == ("FAILED_PRECONDITION", "p1 cannot send 6: balance is 4", [], b"4")
    assert step(m, b'{"to": "p3", "amount": 3}') == (b'{"balance": 1}', [("p3", b"3")], b"1")
    assert step(m, b'{"to": "p3", "amount": 3}') == (
        "FAILED_PRECONDITION", "insufficient funds: p1 has 1, asked 3", [], b"1")


@pytest.mark.parametrize("bound", [0, 3])
def test_the_banks_memory_is_bounded(bound: int, monkeypatch) -> None:
    monkeypatch.setattr(bank, "KNOWN_COMMANDS", bound)
    m = machine(10**6)
    for amount in range(1, 20):
        assert step(m, b"%d p2" % amount)[0] == b"%d" % (10**6 - amount)  # each paid back before the next
        m.on_message("p2", b"%d" % amount, Context("p1", ("p2", "p3")))
    assert len(m._known) == len(m._amounts) == bound
    assert m.snapshot() == b"%d" % 10**6  # paid out and received back the same amounts


def test_a_remembered_amount_is_received_as_read() -> None:
    m = machine(100)
    for payload in (b"12", b"12", b"3", b"12"):
        m.on_message("p2", payload, Context("p1", ("p2", "p3")))
    assert m.snapshot() == b"139" and m._amounts == {b"12": 12, b"3": 3}
    with pytest.raises(ValueError, match="the amount from p2 is not decimal ASCII"):
        m.on_message("p2", b"-1", Context("p1", ("p2", "p3")))
    assert m.snapshot() == b"139"
