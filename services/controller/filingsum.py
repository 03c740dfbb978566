"""The checksum a snapshot is filed with, and its listed states' digests checked: off the reply path.

A snapshot whose files hold its states as manifests (over EXPORT_INLINE_BYTES of
states in all, store.py: the `.pb` and the JSON export both) is filed with the
checksum of that stored form (snapshot_file.py): hashed from the manifests, no block
read, where hashing the whole form read every block of every state (at 64 MiB a node
and four nodes, 32,768 block files at each snapshot, however little changed). The
manifests name each block by its SHA-256, and every read of a block checks it against
its name, so that checksum still covers every block. A smaller snapshot keeps the
whole form's checksum (wholedigest.py), its states read a block at a time: its JSON
export holds the states inline, and its checksum must be the one that file's content
hashes to.

FS1. Either way, each listed state's digest (the node's own, taken unhashed on the
    reply path: blockforms.py BF6) is checked against its bytes, and the stored form
    gets the bytes' digest whatever the report said (the error logged). That check
    reads every block of a listed state (but FS5's and FS6's, which read what changed).
FS2. A block that cannot be read, or is not as named, is BlockMissing naming it: the
    snapshot is not filed then (StoreWriter logs it; the journal still holds it).
FS3. With the store's files (`raw`: a block as stored, unchecked), a listed state of a
    snapshot filed with its manifests' checksum is first read unchecked: when its bytes
    hash to the digest its report said, each block is as named (a block not as named
    would give other bytes, and so another digest); only a state that does not is read
    again, each block checked against its name (FS1, FS2). So the check hashes each
    block once, not twice.
FS5. A listed state whose digest is in the blocks form and whose manifest is on the
    grid (its blocks' sizes, each known by its name from a read checked against it
    (`sized`): BLOCK_BYTES but the last, which is not empty) is checked from its
    manifest alone: the blocks form is the SHA-256 of the grid's block names, which
    are then the manifest's. No block is read: a blob's state of blocks costs
    nothing per block at filing. Any other state is read (FS1, FS3).
FS6. A listed state whose digest is in the blocks form and that FS5 does not check
    (off the grid: an app's parts) has its grid names found by the store's GridMemo
    (gridmemo.py), which holds the node's last state found so: only the grid blocks
    whose bytes are not the same blocks at the same offsets as in that state are
    hashed, from the blocks overlapping them, each read checked against its name
    (FS2 names one that is not); the digest is the SHA-256 of the grid names and is
    checked as FS1 says. A state with a few blocks changed reads those and the ones
    sharing their grid blocks (64 MiB, 64 changed: about 200 of 8,700 blocks). An
    empty memo (a restart, a node not seen before) reads every block, first
    unchecked (FS3), then checked when the digest differs from its report's; the
    memo keeps a state only from such reads (GM1, GM5).
FS4. A digest in the blocks form (snapmesh/protocol/statedigest.py) is checked in
    that form, from the same reads, unless FS5 checks it from the manifest or FS6
    from the blocks that changed.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterator
from itertools import repeat

from snapmesh.app import BLOCK_BYTES
from snapmesh.checking import snapshot_file
from snapmesh.protocol import statedigest
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller.wholedigest import whole_digest
from snapmesh.services.controller.gridmemo import GridMemo
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

Read = Callable[[bytes], "bytes | None"]


def filing_checksum(snapshot: pb.Snapshot, stored: pb.Snapshot, read: Read | None, *, of_stored: bool,
                    raw: Read | None = None, sized: Callable[[bytes], int | None] | None = None,
                    memo: GridMemo | None = None) -> str:
    """The checksum `stored` (the stored form of `snapshot`) is filed with: of `stored`
    when `of_stored` (its files hold manifests), else of the whole form. The listed
    states' digests are checked first, and corrected in `stored` (FS1); `raw`: FS3;
    `sized`, a block's size by its name (None: not known): FS5; `memo`: FS6."""
    blocks_of = _blocks_of(snapshot.snapshot_id, read)
    if of_stored:
        for index, entry in enumerate(snapshot.nodes):
            if not blockforms.is_listed(entry):
                continue
            if _on_grid(entry, sized) and statedigest.of_names(entry.state_blocks.hashes) == entry.state_digest:
                continue  # FS5
            if memo is not None and statedigest.is_blocks(entry.state_digest):
                _checked(snapshot, stored, index, _from_memo(snapshot.snapshot_id, memo, entry, read, raw))
                continue  # FS6
            if raw is not None and _unchecked_digest(snapshot.snapshot_id, raw, entry) == entry.state_digest:
                continue  # FS3: as its report said, so each block as named
            _checked(snapshot, stored, index, _digest(blocks_of(entry), entry.state_digest))
        return snapshot_file.checksum(stored)
    found = whole_digest(snapshot, blocks_of)
    wrong = {i: got for i, got in found.states.items() if got != snapshot.nodes[i].state_digest}
    if not wrong:
        return found.checksum
    fixed = pb.Snapshot()
    fixed.CopyFrom(snapshot)  # listed: manifests, not states
    for index, got in wrong.items():
        _checked(snapshot, stored, index, got)
        fixed.nodes[index].state_digest = got
    return whole_digest(fixed, blocks_of).checksum


def _on_grid(entry: pb.NodeBalance, sized: Callable[[bytes], int | None] | None) -> bool:
    """Whether a listed entry's digest is in the blocks form and its manifest on the grid (FS5)."""
    names = entry.state_blocks.hashes
    if sized is None or not names or not entry.state_digest.startswith(statedigest.BLOCKS):
        return False
    if not all(map(operator.eq, map(sized, names[:-1]), repeat(BLOCK_BYTES))):  # a pass of C, not a step per block
        return False
    last = sized(names[-1])
    return last is not None and 0 < last <= BLOCK_BYTES and (len(names) - 1) * BLOCK_BYTES + last == entry.state_bytes


def _from_memo(snapshot_id: str, memo: GridMemo, entry: pb.NodeBalance, read: Read | None, raw: Read | None) -> str:
    """The state's blocks-form digest, its grid names found by `memo` (FS6): read checked
    when the memo holds the node's state (a few blocks), else first unchecked (FS3)."""
    if raw is not None and not memo.holds(entry.node_id):
        try:
            found = memo.found(entry.node_id, entry.state_blocks.hashes, _reader(snapshot_id, entry, raw))
        except blockforms.BlockMissing:  # not on disk: the checked reader may still hold it (FS3)
            found = None
        if found is not None and statedigest.of_names(found.grid) == entry.state_digest:
            memo.keep(entry.node_id, found)
            return entry.state_digest
    found = memo.found(entry.node_id, entry.state_blocks.hashes, _reader(snapshot_id, entry, read))
    memo.keep(entry.node_id, found)
    return statedigest.of_names(found.grid)


def _reader(snapshot_id: str, entry: pb.NodeBalance, read: Read | None) -> Callable[[bytes], bytes]:
    def block(name: bytes) -> bytes:
        if read is None or (got := read(name)) is None:
            raise blockforms.BlockMissing(f"snapshot {snapshot_id}, node {entry.node_id}, "
                                          f"block sha256:{name.hex()}: missing")
        return got

    return block


def _unchecked_digest(snapshot_id: str, raw: Read, entry: pb.NodeBalance) -> str:
    try:
        return _digest(_blocks_of(snapshot_id, raw)(entry), entry.state_digest)
    except blockforms.BlockMissing:  # not on disk: the checked reader may still hold it (FS3)
        return ""


def _digest(blocks: Iterator[bytes], like: str) -> str:
    """The digest of the state `blocks` make, in the form of `like` (statedigest.py SD2)."""
    hasher = statedigest.Hasher.like(like)
    for block in blocks:
        hasher.update(block)
    return hasher.text()


def _checked(snapshot: pb.Snapshot, stored: pb.Snapshot, index: int, got: str) -> None:
    said = snapshot.nodes[index].state_digest
    if got != said:
        log.error("snapshot %s: the state of %s hashes to %s, not to the %s its report said; filed with %s",
                  snapshot.snapshot_id, snapshot.nodes[index].node_id, got, said, got)
        stored.nodes[index].state_digest = got


def _blocks_of(snapshot_id: str, read: Read | None) -> Callable[[pb.NodeBalance], Iterator[bytes]]:
    def blocks_of(entry: pb.NodeBalance) -> Iterator[bytes]:
        block = _reader(snapshot_id, entry, read)
        for name in entry.state_blocks.hashes:
            yield block(name)

    return blocks_of
