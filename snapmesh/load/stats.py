"""What a LoadGenerator counts: per node, replies, refusals by status, commands given up on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class NodeCounts:
    replies: int = 0
    refusals: Counter[str] = field(default_factory=Counter)  # gRPC status name -> commands
    given_up: int = 0  # no answer within give_up_s (or the load stopped first): the outcome is unknown


@dataclass(slots=True)
class LoadStats:
    nodes: dict[str, NodeCounts] = field(default_factory=dict)
    calls: int = 0  # answered SubmitBatch calls
    errors: int = 0  # calls that failed as a whole (a node down, a timeout), each try counted
    retries: int = 0  # sends of a request id after the first
    replayed: int = 0  # answers that were the first reply of a request id sent again
    last_error: str = ""

    def node(self, node: str) -> NodeCounts:
        counts = self.nodes.get(node)
        if counts is None:
            counts = self.nodes[node] = NodeCounts()
        return counts

    @property
    def accepted(self) -> int:
        """Commands the app answered (the bank: transfers made)."""
        return sum(c.replies for c in self.nodes.values())

    @property
    def refused(self) -> int:
        """Commands the app refused, whatever the status (the bank: mostly insufficient funds)."""
        return sum(sum(c.refusals.values()) for c in self.nodes.values())

    @property
    def failed(self) -> int:
        """Commands given up on: their outcome is unknown."""
        return sum(c.given_up for c in self.nodes.values())

    def refusals(self, code: str) -> int:
        """Commands refused with status `code` (a gRPC status name), on every node."""
        return sum(c.refusals[code] for c in self.nodes.values())

    def lines(self) -> list[str]:
        """One line per node: replies, refusals by status, commands given up on."""
        out = []
        for node, c in sorted(self.nodes.items()):
            refusals = ", ".join(f"{n} {code}" for code, n in sorted(c.refusals.items())) or "none"
            out.append(f"  {node}: {c.replies} replies; refusals: {refusals}; {c.given_up} given up")
        return out
