"""Which stored snapshots hold each block: references for the blocks' retention, pure.

The rules (services/controller/store.py applies them):
G1. A block is referenced once per stored snapshot whose manifest names it
    (snapmesh/protocol/blocks.py), however often that manifest names it.
G2. A block may be deleted only once no stored snapshot references it: `drop`
    returns the blocks whose last reference it took, and nothing else.
    Snapshots IN_PROGRESS and restores under way hold their states whole (the
    journal and the machine's memory), never by reference, so they need no
    block on disk; they reference blocks once they are filed.
G3. The references are never persisted: they are rebuilt from the stored manifests
    at start (`hold` for each), and a block on disk that no manifest names then
    (its snapshot's deletion or filing was cut short) is garbage.
G4. Each snapshot's blocks are one set, nothing counted per block (heldsets.py HS3).
"""

from __future__ import annotations

from collections.abc import Iterable

from snapmesh.protocol.controller.heldsets import HeldSets


class BlockRefs:
    def __init__(self) -> None:
        self._held = HeldSets()  # snapshot id -> the blocks it references

    def hold(self, snapshot_id: str, blocks: Iterable[bytes]) -> set[bytes]:
        """`snapshot_id` is stored and references `blocks`, in place of what it
        referenced before: the blocks of before that nothing references now (G2)."""
        return self._held.hold(snapshot_id, blocks)

    def drop(self, snapshot_id: str) -> set[bytes]:
        """`snapshot_id` is no longer stored: the blocks nothing references now (G2)."""
        return self._held.release([snapshot_id])

    def unreferenced(self, names: Iterable[bytes]) -> set[bytes]:
        """Those of `names` no stored snapshot references (heldsets.py HS3)."""
        return self._held.unheld(names)

    def referenced(self, name: bytes) -> bool:
        return name in self._held

    def __len__(self) -> int:
        """How many distinct blocks are referenced."""
        return len(self._held)
