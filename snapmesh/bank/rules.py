"""The bank's rules on a node's tally, pure: what the node's core asks before it moves one.

The node layer carries one native int64 per node and per message, its tally
(snapmesh/bank/formats.py). The bank keeps its money there, so the bank's rules
are about it: a payment is a positive int, a node cannot pay more than it holds,
and a node starts with a non-negative balance. The generic core
(snapmesh/protocol/node/core.py) knows none of this: it asks its `TallyRules`
(`BANK`, here, for a bank node; `core.NO_RULES` for a node that runs an app,
whose tally stays 0). A method says nothing ("" or None) when the rule
holds, else the refusal's text, the one the bank's clients have always read.
"""

from __future__ import annotations


class BankRules:
    """The bank's answers to core.TallyRules. Stateless: one instance serves every node."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> BankRules:
        return self  # stateless: a copy of a process shares its rules

    @staticmethod
    def initial(tally: object) -> str:
        """What is wrong with a node's starting balance ("" if nothing)."""
        if isinstance(tally, int) and not isinstance(tally, bool) and tally >= 0:
            return ""
        return f"initial balance must be a non-negative integer, got {tally!r}"

    @staticmethod
    def payment(node_id: str, tally: object, held: int) -> tuple[str, bool] | None:
        """None when node `node_id`, whose balance is `held`, may pay `tally`; else
        the refusal's text and whether it is for insufficient funds (True) or for
        an amount that is no positive int (False). Once per transfer: no allocation
        on the way that lets it go."""
        if not isinstance(tally, int) or isinstance(tally, bool) or tally <= 0:
            return f"amount must be a positive integer, got {tally!r}", False
        if tally > held:
            return f"{node_id} cannot send {tally}: balance is {held}", True
        return None


BANK = BankRules()

