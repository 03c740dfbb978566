"""The bank's part of a trace (snapmesh/checking/trace.py, steps.py): money and its rules.

A trace's events carry one native number per node (its `node` and `cut` events) and
per transfer (`send`, `receive`, `channel_recorded`): its tally. The generic
checkers check what every app's trace has (channels, FIFO, positions, markers, cuts,
completion, each transfer received once and unchanged); what the tallies mean is the
bank's and is here, in the words its users read:

  - a transfer's amount is positive;
  - a node's balance, replayed from the trace (initial + received - sent), never
    goes negative, and each cut records the balance replayed to it;
  - money is conserved: recorded balances + in flight = the total (the initial
    balances), and, step by step, balances + the amounts on the channels.

`BANK` answers `check_trace`; `Ledger` is one per `steps.StepChecker` (it keeps
each node's balance as the events are fed). Both name the keys of the bank's trace
events (the formats' keys, as the simulator and the native logs have them), and
`BANK.logged` the log line's. Pure: events in, problems out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import snapmesh.bank.cut as bank_cut
from snapmesh.bank.formats import MESSAGE_TALLY_KEY, NODE_TALLY_KEY, RECORDED_TALLIES_KEY

Channel = tuple[str, str]


class Keys:
    """Where the bank's trace events hold a balance (`node`, `cut`), an amount (`send`,
    `receive`) and the amounts recorded on a channel (`channel_recorded`)."""

    state_key = NODE_TALLY_KEY
    content_key = MESSAGE_TALLY_KEY
    contents_key = RECORDED_TALLIES_KEY


class BankTrace(Keys):
    """The bank's rules over a whole trace, for `trace.check_trace`."""

    @staticmethod
    def logged(kind: str, value: int) -> dict[str, int]:
        """A log line's figure: an init's or a cut's balance, a send's or a receive's amount."""
        return {NODE_TALLY_KEY if kind in ("init", "cut") else MESSAGE_TALLY_KEY: value}

    @staticmethod
    def reading() -> bank_cut.Reading:
        """The bank's `cut.Reading` of the trace read as logs."""
        return bank_cut.Reading()

    @staticmethod
    def total(initial: Mapping[str, int]) -> int:
        return sum(initial.values())

    @staticmethod
    def message_problem(msg: str, amount: Any) -> str | None:
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return f"transfer {msg} has non-positive amount {amount!r}"
        return None

    @staticmethod
    def history_problems(node: str, initial: int, history: Iterable[tuple[int, str, Mapping[str, Any]]]) -> list[str]:
        """The balance replayed over a node's events in position order: never negative."""
        balance = initial
        for pos, kind, event in history:
            if kind == "send":
                balance -= event[MESSAGE_TALLY_KEY]
            elif kind == "receive":
                balance += event[MESSAGE_TALLY_KEY]
            if balance < 0:
                return [f"node {node}: balance {balance} < 0 after position {pos}"]
        return []

    @staticmethod
    def whole_problem(sid: str, rules: set[str], whole: Any, total: int) -> str | None:
        """The snapshot's whole, once it is all in: money conserved."""
        if bank_cut.CONSERVATION in rules:
            return f"snapshot {sid}: recorded balances + in-flight = {whole.observed}, but the total is {total}"
        return None


BANK = BankTrace()


class Ledger(Keys):
    """The bank's balances as a `steps.StepChecker` feeds the events one by one."""

    def __init__(self) -> None:
        self.initial: dict[str, int] = {}
        self.balances: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.initial.values())

    def declared(self, node: str, balance: int) -> None:
        self.initial[node] = self.balances[node] = balance

    def sent(self, node: str, amount: int) -> str | None:
        self.balances[node] -= amount
        return f"{node}'s balance went negative" if self.balances[node] < 0 else None

    def received(self, node: str, amount: int) -> None:
        self.balances[node] += amount

    @staticmethod
    def changed(sent: int, received: int) -> str | None:
        return f"amount changed in transit: sent {sent}" if sent != received else None

    def cut(self, node: str, recorded: int) -> str | None:
        if recorded != self.balances[node]:
            return f"recorded balance differs from the balance {self.balances[node]} at the cut"
        return None

    def now(self, on_channels: Mapping[Channel, Sequence[int]], balances: Mapping[str, int] | None = None) -> list[str]:
        """Conservation now: balances + money on channels = total, per the trace
        and, when given, per the real system (which must agree with the trace)."""
        money = sum(self.balances.values()) + sum(sum(a) for a in on_channels.values())
        if money != self.total:
            return [f"money not conserved: balances + channels = {money}, total {self.total}"]
        if balances is not None and dict(balances) != self.balances:
            return [f"balances {dict(balances)} differ from the trace's {self.balances}"]
        return []
