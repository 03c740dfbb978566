"""The blocks of each node's last state, in memory, so a report as blocks is rebuilt from what changed, pure.

A report as blocks (blocks.py B4) names every block of the node's state and
carries only the new ones; the rest were read from controller/blocks and hashed
again, one file per block: 8192 of them for a 64 MiB state, however little
changed. The controller keeps the state of each node's last report here, cut
into its blocks by name (B7), and rebuilds the next one from it.

KB1. A block is kept only with the name it was checked against: a whole report's
    state is cut and hashed (`blocks.names`), a rebuilt one's blocks were each
    carried and hashed, read and hashed, or taken from here.
KB2. One state per node, the last one kept, and `get` looks in the node's own
    blocks first. The memory is bounded (`max_bytes`, 32 MiB by default: the
    controller's peak is to stay within 512 MiB plus one node's state, so a
    large state is never held here): a new state pushes out the states kept
    longest, and a state over the bound is not kept at all. A block not kept is read from controller/blocks, as
    before there was this cache: slower, never wrong (KB1 holds either way).
KB3. Thread-safe for its use: each `keep` replaces a node's entry with one
    assignment, and `get` reads whichever entry is there; either is right (KB1).
"""

from __future__ import annotations

from snapmesh.protocol import blocks


DEFAULT_MAX_BYTES = 32 << 20  # KB2


class KnownBlocks:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        # node -> (state, name -> bounds); insertion order is the order kept (KB2's eviction order)
        self._by_node: dict[str, tuple[bytes, dict[bytes, tuple[int, int]]]] = {}

    @property
    def kept_bytes(self) -> int:
        return sum(len(state) for state, _ in list(self._by_node.values()))

    def keep(self, node_id: str, named: blocks.Named) -> None:
        """`named`: the node's state, its blocks' bounds and names, each checked (KB1)."""
        entry = (named.state, dict(zip(named.names, named.bounds, strict=True)))
        by_node = dict(self._by_node)  # built aside, swapped in with one assignment (KB3)
        by_node.pop(node_id, None)
        if len(named.state) <= self.max_bytes:
            room = self.max_bytes - len(named.state)
            for node in list(by_node):  # the longest kept first (KB2)
                if sum(len(state) for state, _ in by_node.values()) <= room:
                    break
                del by_node[node]
            by_node[node_id] = entry
        self._by_node = by_node

    def forget(self, node_id: str) -> None:
        self._by_node = {node: entry for node, entry in self._by_node.items() if node != node_id}

    def reader(self, node_id: str):
        """`get` for a report of `node_id`: its own last state's blocks looked at first (KB2)."""
        order = [self._by_node[node_id]] if node_id in self._by_node else []
        order += [entry for node, entry in list(self._by_node.items()) if node != node_id]

        def get(name: bytes) -> bytes | None:
            for state, where in order:
                if (bounds := where.get(name)) is not None:
                    return state[bounds[0] : bounds[1]]
            return None

        return get
