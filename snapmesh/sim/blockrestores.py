"""Restores as blocks in the simulator: the real forms (snapmesh/protocol/restoreblocks.py RB1-RB5), judged.

A real controller sends a node its part of a restore as blocks when the node's
last accepted report said it holds blocks (RB1): the manifest, and the contents
of only the blocks it takes the node to hold no copy of (RB2). The node
rebuilds the state from those and the blocks it holds, or refuses, changing
nothing, and gets the state whole (RB3). This class carries out both sides on
the simulator's nodes, as the real shells do:

- the controller (services/controller/nodeblocks.py): it takes a node to hold
  its last accepted report's blocks, cut as that report was, and those of a
  restore it took as blocks since; a refusal forgets them. Its notes survive
  a controller restart, which takes the blocks back from the filed and kept
  snapshots' manifests the notes name (heldseed.py HT1-HT3, RB5).
- the node (services/node/heldblocks.py, blockshelf.py): it holds the blocks
  of its last report as formed and of its last restore as blocks, in two
  slots; a crash keeps their copies on disk, unsynced, so some may be lost
  (drawn from the case's own generator), and after a restart each slot is
  every block found there (BS3, RB4).

The rule the fuzzer judges (SB for simulated blocks):
SB5. A part sent as blocks carries every block the controller does not take
     the node to hold (RB2); the node rebuilds exactly the state of the
     restore's plan, byte for byte, or refuses only when a block its manifest
     names was neither carried nor held there (RB3). A refused part goes
     whole, and the node's machine hears only of the state it restores: a
     refusal changes no node.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

from snapmesh.protocol import blocks, restoreblocks
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb

SHELF_LOSS = 0.25  # the chance a node's crash loses one block's unsynced copy (blockshelf.py BS1)


class SimRestores:
    def __init__(self, rng: random.Random, faults: Counter[str]) -> None:
        self.rng = rng  # the node crashes' losses, its own stream: the other draws stay as they were
        # The controller's side: node -> the names it takes the node to hold, and its last report's cut (memory)
        self.taken: dict[str, tuple[frozenset[bytes], tuple[int, ...]]] = {}
        # ... and its notes, which a restart reads: node -> (its last report's snapshot, its cut, its last restore's)
        self.notes: dict[str, tuple[str, tuple[int, ...], str]] = {}
        # The node's side: node -> (its last report's blocks, its last restore's), by name (memory and shelf)
        self.slots: dict[str, tuple[dict[bytes, bytes], dict[bytes, bytes]]] = {}
        self.faults = faults

    # -- the node's side

    def formed(self, node_id: str, message: pb.FullState) -> None:
        """The node formed a report of `message` (whole, its parts set): it holds that state's blocks."""
        if message.HasField("state") and message.state:
            self.slots[node_id] = (_blocks(blocks.names(message.state, message.state_parts)[0]),
                                   self.slots.get(node_id, ({}, {}))[1])

    def node_crashed(self, node_id: str) -> None:
        """The node restarts with what its shelf kept: each slot is every block found on disk (BS3)."""
        reported, restored = self.slots.pop(node_id, ({}, {}))
        kept = {name: block for name, block in {**reported, **restored}.items() if self.rng.random() >= SHELF_LOSS}
        if len(kept) < len(reported) + len(restored) - len(reported.keys() & restored.keys()):
            self.faults["held block lost in a node crash"] += 1
        if kept:
            self.slots[node_id] = (kept, dict(kept))

    # -- the controller's side

    def accepted(self, node_id: str, message: pb.FullState) -> None:
        """The controller took the node's report: it takes the node to hold its blocks (RB1, HT1)."""
        state = message.state if message.HasField("state") else b""
        parts = tuple(message.state_parts)
        if state:
            self.taken[node_id] = (frozenset(blocks.names(state, parts)[0].names), parts)
            self.notes[node_id] = (message.snapshot_id, parts, "")
        else:
            self.taken.pop(node_id, None)
            self.notes.pop(node_id, None)

    def controller_restarted(self, stored: Mapping[str, pb.Snapshot]) -> None:
        """A new controller process takes back what each node holds from its notes and the
        filed, kept snapshots' manifests they name (HT2); a snapshot not there adds nothing."""
        self.taken = {}
        for node_id, (report, parts, restored) in self.notes.items():
            names = frozenset().union(*(
                entry.state_blocks.hashes for sid in (report, restored) if sid in stored
                for entry in stored[sid].nodes if entry.node_id == node_id
            ))
            if names:
                self.taken[node_id] = (names, parts)
                self.faults["held blocks taken back at a controller restart"] += 1

    def state_for(self, node_id: str, request: pb.RestoreStateRequest) -> bytes:
        """The state the node restores for its part `request`: rebuilt from blocks where
        the controller sends them and the node can (RB2, RB3), else `request`'s, whole."""
        whole = request.state if request.HasField("state") else b""
        held, parts = self.taken.get(node_id, (frozenset(), ()))
        sent, names = restoreblocks.referenced_restore(request, held, parts)
        if sent is None:
            return whole
        where = f"SB5: the restore of {request.snapshot_id} at {node_id}"
        carried = {blocks.block_hash(block) for block in sent.blocks}
        named = list(sent.state_blocks.hashes)
        if unsent := [name for name in named if name not in held and name not in carried]:
            raise Violation(f"{where}: block sha256:{unsent[0].hex()} was neither sent nor taken to be held there "
                            f"({len(unsent)} of {len(named)})")
        reported, restored = self.slots.get(node_id, ({}, {}))
        get = restoreblocks.reader(shelf=lambda name: reported.get(name, restored.get(name)))
        rebuilt, why = restoreblocks.whole_restore(sent, get)
        if rebuilt is None:
            if all(name in carried or get(name) is not None for name in named):
                raise Violation(f"{where}: the node refused a state it was sent or holds every block of: {why}")
            self.faults["restore part refused as blocks (missing), sent whole"] += 1
            self.taken.pop(node_id, None)  # nodeblocks.py: a refusal forgets what it took the node to hold
            self.notes.pop(node_id, None)
            return whole
        if rebuilt.state != whole:
            raise Violation(f"{where}: the state rebuilt from its {len(named)} block(s) ({len(rebuilt.state)} bytes) "
                            f"is not the plan's ({len(whole)} bytes)")
        self.slots[node_id] = (reported, _blocks(rebuilt))  # heldblocks.py: the restored state's slot
        self.taken[node_id] = (held | frozenset(names), parts)
        if node_id in self.notes:
            self.notes[node_id] = (*self.notes[node_id][:2], request.snapshot_id)
        self.faults["restore part sent as blocks"] += 1
        return rebuilt.state


def _blocks(named: blocks.Named) -> dict[bytes, bytes]:
    return {name: named.state[start:end] for name, (start, end) in zip(named.names, named.bounds, strict=True)}
