"""What may happen to a process's tally, asked by the core (snapmesh/protocol/node/core.py).

A process carries one native int, its tally (the packed fast path: the bank
keeps its accounts there). What a tally may be is its app's rule, never the
core's: the bank's rules are snapmesh/bank/rules.py's (the default, for a node
that hosts no app); a node that hosts an app (snapmesh.app) keeps its state in
its own bytes and its tally at 0 (NO_RULES).
"""

from __future__ import annotations

from typing import Protocol

from snapmesh.bank.rules import BANK


class TallyRules(Protocol):
    """What may happen to a process's tally: its app's rules, asked by the core
    (snapmesh/bank/rules.py has the bank's, the default; NO_RULES is a hosted
    app's, whose tally stays 0). The core asks once per transfer it sends."""

    def initial(self, tally: object) -> str:
        """"" if a process may start holding `tally`, else the refusal's text."""
        ...

    def payment(self, node_id: str, tally: object, held: int) -> tuple[str, bool] | None:
        """None if `node_id`, holding `held`, may send `tally`; else the refusal's
        text and whether it is for an uncovered tally (INSUFFICIENT_FUNDS)."""
        ...


class _NoTally:
    """A process whose app keeps its state in its own bytes (snapmesh.app): its tally is 0, always."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> _NoTally:
        return self  # stateless: a copy of a process shares its rules

    @staticmethod
    def initial(tally: object) -> str:
        # 0 for a new node; an app node's log written while app nodes still carried the
        # bank's tally may hold the cluster's initial number in its init record: loaded
        # as it is, never used (an app's state is its own bytes).
        return "" if type(tally) is int and tally >= 0 else f"a process that runs an app holds no tally, got {tally!r}"

    @staticmethod
    def payment(node_id: str, tally: object, held: int) -> tuple[str, bool] | None:
        return f"{node_id} runs an app: it sends no tally (got {tally!r})", False


NO_RULES: TallyRules = _NoTally()
DEFAULT_RULES: TallyRules = BANK  # a process that hosts no app runs the bank
