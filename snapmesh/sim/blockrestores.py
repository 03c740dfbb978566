"""Restores as blocks in the simulator: the real forms (snapmesh/protocol/restoreblocks.py RB1-RB3), judged.

A real controller sends a node its part of a restore as blocks when the node's
last accepted report said it holds blocks (RB1): the manifest, and the contents
of only the blocks that report's state did not have (RB2). The node rebuilds
the state from those and the blocks it holds (its last report as formed, its
last restore as blocks: services/node/heldblocks.py), or refuses, changing
nothing, and gets the state whole (RB3). This class carries out both sides on
the simulator's nodes: what the controller takes each node to hold (its last
report taken, cut as that report was; lost in a controller crash, so a part
goes whole), and what each node holds (lost in a node crash: a node that
restarted holds nothing and refuses).

The rule the fuzzer judges (SB for simulated blocks):
SB5. A part sent as blocks carries every block the node was not taken to hold
     (RB2); the node rebuilds exactly the state of the restore's plan, byte for
     byte, or refuses only when a block its manifest names was neither carried
     nor held there (RB3). A refused part goes whole, and the node's machine
     hears only of the state it restores: a refusal changes no node.
"""

from __future__ import annotations

from collections import Counter

from snapmesh.protocol import blocks, restoreblocks
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb


class SimRestores:
    def __init__(self, faults: Counter[str]) -> None:
        self.taken: dict[str, tuple[frozenset[bytes], tuple[int, ...]]] = {}  # node -> its last report taken: names, cut
        self.sent: dict[str, blocks.Named] = {}  # node -> the state of its last report as formed (the node's memory)
        self.restored: dict[str, blocks.Named] = {}  # node -> its last state restored as blocks (the node's memory)
        self.faults = faults

    def formed(self, node_id: str, message: pb.FullState) -> None:
        """The node formed a report of `message` (whole, its parts set): it holds that state's blocks."""
        if message.HasField("state") and message.state:
            self.sent[node_id] = blocks.names(message.state, message.state_parts)[0]

    def accepted(self, node_id: str, message: pb.FullState) -> None:
        """The controller took the node's report: a restore sends it only what that state lacks (RB1)."""
        state = message.state if message.HasField("state") else b""
        parts = tuple(message.state_parts)
        self.taken[node_id] = (frozenset(blocks.names(state, parts)[0].names) if state else frozenset(), parts)

    def node_crashed(self, node_id: str) -> None:
        """A node that restarted holds nothing (heldblocks.py: memory only)."""
        self.sent.pop(node_id, None)
        self.restored.pop(node_id, None)

    def controller_crashed(self) -> None:
        """A new controller process knows no node's last report until it takes one: its parts go whole."""
        self.taken.clear()

    def state_for(self, node_id: str, request: pb.RestoreStateRequest) -> bytes:
        """The state the node restores for its part `request`: rebuilt from blocks where
        the controller sends them and the node can (RB2, RB3), else `request`'s, whole."""
        whole = request.state if request.HasField("state") else b""
        held, parts = self.taken.get(node_id, (frozenset(), ()))
        sent, _ = restoreblocks.referenced_restore(request, held, parts)
        if sent is None:
            return whole
        where = f"SB5: the restore of {request.snapshot_id} at {node_id}"
        carried = {blocks.block_hash(block) for block in sent.blocks}
        named = list(sent.state_blocks.hashes)
        if unsent := [name for name in named if name not in held and name not in carried]:
            raise Violation(f"{where}: block sha256:{unsent[0].hex()} was neither sent nor in the node's last report taken "
                            f"({len(unsent)} of {len(named)})")
        get = restoreblocks.reader(self.sent.get(node_id), self.restored.get(node_id))
        rebuilt, why = restoreblocks.whole_restore(sent, get)
        if rebuilt is None:
            if all(name in carried or get(name) is not None for name in named):
                raise Violation(f"{where}: the node refused a state it was sent or holds every block of: {why}")
            self.faults["restore part refused as blocks (missing), sent whole"] += 1
            return whole
        if rebuilt.state != whole:
            raise Violation(f"{where}: the state rebuilt from its {len(named)} block(s) ({len(rebuilt.state)} bytes) "
                            f"is not the plan's ({len(whole)} bytes)")
        self.restored[node_id] = rebuilt
        self.faults["restore part sent as blocks"] += 1
        return rebuilt.state
