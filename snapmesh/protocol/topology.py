"""Directed topologies: which processes exist and which channels join them.

Chandy-Lamport needs every process reachable from every other (strongly
connected): markers only travel along channels, so a process no marker can reach
would never record, and the snapshot would never finish.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class TopologyError(ValueError):
    """The topology is malformed: unknown endpoints, self-loops, duplicates, or
    not strongly connected."""


Channel = tuple[str, str]  # (src, dst)


def channel_name(src: str, dst: str) -> str:
    return f"{src}->{dst}"


@dataclass(frozen=True, slots=True)
class Topology:
    nodes: tuple[str, ...]
    channels: tuple[Channel, ...]

    @classmethod
    def build(cls, nodes: Iterable[str], channels: Iterable[Sequence[str]] | None = None) -> Topology:
        """Validate and build; `channels=None` means the full mesh."""
        node_list = list(nodes)
        if not node_list:
            raise TopologyError("a topology needs at least one node")
        seen_nodes: set[str] = set()
        for node in node_list:
            if not isinstance(node, str) or not node:
                raise TopologyError(f"node id {node!r} is not a non-empty string")
            if node in seen_nodes:
                raise TopologyError(f"node {node!r} is listed twice")
            seen_nodes.add(node)
        if channels is None:
            pairs = [(a, b) for a in node_list for b in node_list if a != b]
        else:
            pairs = []
            for index, channel in enumerate(channels):
                if (
                    not isinstance(channel, (list, tuple))
                    or len(channel) != 2
                    or not all(isinstance(end, str) for end in channel)
                ):
                    raise TopologyError(f"channel #{index} {channel!r} is not a [src, dst] pair of node ids")
                src, dst = channel
                for end in (src, dst):
                    if end not in seen_nodes:
                        raise TopologyError(f"channel {channel_name(src, dst)} names unknown node {end!r}")
                if src == dst:
                    raise TopologyError(f"channel {channel_name(src, dst)} joins a node to itself")
                if (src, dst) in pairs:
                    raise TopologyError(f"channel {channel_name(src, dst)} is listed twice")
                pairs.append((src, dst))
        topology = cls(tuple(node_list), tuple(pairs))
        unreachable = topology.not_strongly_connected_witness()
        if unreachable is not None:
            src, dst = unreachable
            raise TopologyError(f"topology is not strongly connected: no path from {src!r} to {dst!r}")
        return topology

    def incoming(self, node: str) -> tuple[str, ...]:
        """Sources of the channels into `node`, in declaration order."""
        return tuple(src for src, dst in self.channels if dst == node)

    def outgoing(self, node: str) -> tuple[str, ...]:
        """Destinations of the channels out of `node`, in declaration order."""
        return tuple(dst for src, dst in self.channels if src == node)

    def not_strongly_connected_witness(self) -> Channel | None:
        """A pair (a, b) with no path from a to b, or None when strongly connected."""
        if len(self.nodes) < 2:
            return None
        root = self.nodes[0]
        forward = {n: [] for n in self.nodes}
        backward = {n: [] for n in self.nodes}
        for src, dst in self.channels:
            forward[src].append(dst)
            backward[dst].append(src)
        for edges, as_pair in ((forward, lambda n: (root, n)), (backward, lambda n: (n, root))):
            reached = _reachable(root, edges)
            for node in self.nodes:
                if node not in reached:
                    return as_pair(node)
        return None


def _reachable(start: str, edges: dict[str, list[str]]) -> set[str]:
    reached = {start}
    frontier = [start]
    while frontier:
        for nxt in edges[frontier.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    return reached
