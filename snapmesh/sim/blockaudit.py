"""SB4 judged: the controller's block counts and disk against what the simulation knows each needs.

The counts (blockrefs.py, blockpins.py) decide which blocks are deleted, and a
wrong one hides until a later report or restore needs the block: a pin lost
(a release of too much, or twice) deletes a block a journaled report still
names, and a stale one (a release of nothing) keeps a dead snapshot's blocks
forever. Neither breaks a state the fuzzer compares, so this audit counts
nothing: it keeps each live call's pinned names as plain sets, as the
simulated controller pins and unpins them, and after every change compares
the union of those sets, and of the kept snapshots' references, with what
BlockPins, BlockRefs and the disk say.

SB4. A block is pinned exactly when a live call (a report taken and not yet
     refused, of a snapshot neither filed nor failed; at a restart, its
     journaled report, JB3) names it; referenced exactly when a kept snapshot's
     stored form names it; and on the controller's disk exactly when it is
     either (JB2, G2): no block needed is missing, none unneeded stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from snapmesh.protocol import blocks
from snapmesh.protocol.controller.blockpins import BlockPins
from snapmesh.protocol.controller.blockrefs import BlockRefs
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb


class BlockAudit:
    def __init__(self) -> None:
        self._live: dict[tuple[str, int], frozenset[bytes]] = {}  # (snapshot, call) -> the names it pins
        self._seen: set[bytes] = set()  # every name ever pinned: where a stale pin can hide

    def pinned(self, snapshot_id: str, names: Iterable[bytes], call: int = 0) -> None:
        """`call` of the snapshot pins `names`, in place of what it pinned before (BlockPins.pin)."""
        self._live[(snapshot_id, call)] = frozenset(names)
        self._seen |= self._live[(snapshot_id, call)]

    def unpinned(self, snapshot_id: str, call: int | None = None) -> None:
        """The pins of `call` of the snapshot go (None: all its calls'), as BlockPins.unpin."""
        self._live = {key: names for key, names in self._live.items()
                      if key[0] != snapshot_id or (call is not None and key[1] != call)}

    def restarted(self) -> None:
        """A new controller process: no call of the last one pins anything now (JB3 pins again)."""
        self._live.clear()

    def check(self, pins: BlockPins, refs: BlockRefs, stored: Mapping[str, pb.Snapshot], disk: Mapping[bytes, bytes]) -> None:
        """SB4, after a change: the counts and the disk against the live calls and kept snapshots."""
        pinned = frozenset().union(*self._live.values())
        referenced = frozenset().union(*(blocks.hashes(form) for form in stored.values()))
        for name in sorted(pinned):
            if not pins.pinned(name):
                raise Violation(f"SB4: block sha256:{name.hex()} is named by a live report, but not pinned (a pin lost)")
        for name in sorted(self._seen | set(disk)):
            if pins.pinned(name) and name not in pinned:
                raise Violation(f"SB4: block sha256:{name.hex()} is pinned, but no live report names it (a stale pin)")
        if len(pins) != len(pinned):
            raise Violation(f"SB4: {len(pins)} block(s) pinned, but live reports name {len(pinned)}")
        for name in sorted(referenced):
            if not refs.referenced(name):
                raise Violation(f"SB4: block sha256:{name.hex()} is in a kept snapshot, but not referenced")
        if len(refs) != len(referenced):
            raise Violation(f"SB4: {len(refs)} block(s) referenced, but kept snapshots name {len(referenced)}")
        needed = pinned | referenced
        if lost := sorted(needed - set(disk)):
            raise Violation(f"SB4: block sha256:{lost[0].hex()} is needed, but not on the controller's disk")
        if left := sorted(set(disk) - needed):
            raise Violation(f"SB4: block sha256:{left[0].hex()} is on the controller's disk, but nothing needs it")
