"""A large state on the controller's report path as its block list, not its bytes, pure.

At 64 MiB a node, every whole copy of a state on the way from a report to its
answer (rebuilt, kept in the snapshot, read for its digest, copied with the
snapshot, read for the answer's size) cost more than the snapshot's own work.
So a report whose state the shell has in blocks reaches the tracker as its
manifest (`FullState.state_blocks`, no `state`, no carried blocks), with the
state's size and digest noted here (`note`), and the snapshot's entry for it
holds that manifest: `state_blocks`, `state_digest` and `state_bytes`, no
`state`: its "listed" form. The states are read by block only where they are
needed (`whole`, `lazystates.NodeStates`), through `reader`.

Rules:
BF1. A listed entry stands for the entry with `state` set to the blocks named,
    joined, and neither `state_blocks` nor `state_bytes` (`whole`): the
    snapshot handed out of the tracker for a read (get), the answer with its
    states and the files are that whole form, byte for byte as when the tracker
    held the bytes.
BF2. Only a state of more than LISTED_BYTES is listed: a small state costs
    nothing to hold, and every reader of a small one (an adapter's v1 figures,
    the bank's) reads its bytes as before.
BF3. A block is read through its name only: `whole` names a block `reader` cannot
    give (BlockMissing), and gives nothing then.
BF4. A report is compared with an earlier one by its state's size and digest,
    whichever form either came in (a node's repeat may come whole after a
    refusal), never by its bytes: equal digests are equal states.
BF5. A report that came whole with a state of more than LISTED_BYTES is listed
    as one that came as blocks is, once its blocks are written and pinned
    (journalblocks.py JB1): from that step on the tracker, the held record
    (held.py H1), the journal (JB4) and the call waiting for its snapshot's end
    hold its manifest, size and digest, not its bytes.
BF6. A report as blocks of a state too large to join (more than the shell's bound)
    is listed without its bytes ever held together (`streamed`): each block is
    read, checked against its name, counted and hashed into the digest, and let go
    before the next, so the report path holds one block of it at a time. The
    journal's replay lists such a report the same way (journalblocks.py JB5).
    With the node's digest, a block the shell knows the size of (`sized`: a block
    of the node's last listed state, checked against its name then, its file still
    there as far as it knows: blockdir.py D5) is counted without being read.
BF7. `streamed` takes no Python step per block `sized` knows: the sizes are looked up
    in one pass (`sized` is best a dict's `get`), and only the blocks it does not
    know are read, checked and counted one by one: a second snapshot of a large,
    mostly unchanged state reads only the blocks that changed.
BF8. `of` finds a report's noted block list by its snapshot and node, and takes it
    when the report's manifest is equal to the one noted (a copy, compared in C by
    the message's own equality): no tuple of its 8192 names made and hashed on the
    event loop at each of a report's look-ups. A manifest that differs (a report
    noted again with another) is looked up by its names, as before.
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any

from snapmesh.protocol.controller.foldmemo import FoldMemo
from snapmesh.v1 import snapmesh_pb2 as pb

LISTED_BYTES = 64 * 1024  # BF2
NOTES_KEPT = 256  # the reports noted and not yet looked up, at most (a refused one is never looked up)


class BlockMissing(LookupError):
    """A listed state's block that cannot be read (BF3): names the snapshot, node and block."""


@dataclass(frozen=True, slots=True)
class BlockList:
    """A state as the report path holds it: its blocks' names and sizes, in order, and its digest."""

    hashes: tuple[bytes, ...]
    sizes: tuple[int, ...]
    digest: str  # the state's digest, either form (snapmesh/protocol/statedigest.py)

    @property
    def size(self) -> int:
        return sum(self.sizes)


def is_listed(entry: pb.NodeBalance) -> bool:
    return entry.HasField("state_blocks") and not entry.HasField("state")


def listed(snapshot: pb.Snapshot) -> bool:
    """Whether any entry of `snapshot` is listed (BF1)."""
    return any(is_listed(node) for node in snapshot.nodes)


def state_bytes(snapshot: pb.Snapshot) -> int:
    """The bytes of every node's state, listed or not (a listed one by its size)."""
    return sum(node.state_bytes if is_listed(node) else len(node.state) for node in snapshot.nodes)


class BlockForms:
    def __init__(self, reader: Callable[[], Callable[[bytes], bytes | None]] | None = None) -> None:
        # The shell's: a reader of blocks by name, each checked against it (None: not held), made
        # once per state read (it may look at what it holds in memory once for all its blocks).
        self.reader = reader
        # The shell's too: the state a manifest names, when it holds it joined already
        # (the report's own: read without a copy); None when it does not.
        self.states: Callable[[tuple[bytes, ...]], bytes | None] | None = None
        self.folds = FoldMemo()  # the app's folds over listed states, kept across snapshots (lazystates L5)
        self._notes: OrderedDict[tuple[str, str, tuple[bytes, ...]], BlockList] = OrderedDict()
        # BF8: (snapshot, node) -> the manifest last noted for it (a copy) and its block list
        self._last: OrderedDict[tuple[str, str], tuple[pb.StateBlocks, BlockList]] = OrderedDict()

    def note(self, report: pb.FullState, block_list: BlockList) -> None:
        """`report` (listed: its manifest, no state) stands for a state of `block_list`."""
        key = (report.snapshot_id, report.node_id, block_list.hashes)
        self._notes[key] = block_list
        self._notes.move_to_end(key)
        while len(self._notes) > NOTES_KEPT:
            self._notes.popitem(last=False)
        manifest = pb.StateBlocks(hashes=block_list.hashes)  # BF8: the list's own names, as the key's
        self._last[report.snapshot_id, report.node_id] = (manifest, block_list)
        self._last.move_to_end((report.snapshot_id, report.node_id))
        while len(self._last) > NOTES_KEPT:
            self._last.popitem(last=False)

    def of(self, report: pb.FullState) -> BlockList | None:
        """The block list noted for a listed `report` (None: it is not listed)."""
        if report.HasField("state") or not report.HasField("state_blocks"):
            return None
        last = self._last.get((report.snapshot_id, report.node_id))
        if last is not None and last[0] == report.state_blocks:  # BF8: compared in C, no tuple of its names
            return last[1]
        key = (report.snapshot_id, report.node_id, tuple(report.state_blocks.hashes))
        found = self._notes.get(key)
        if found is None:
            raise LookupError(f"report of {report.node_id} for snapshot {report.snapshot_id} came as a manifest "
                              "whose size and digest were never noted (the shell notes them first)")
        return found

    def fill(self, entry: pb.NodeBalance, block_list: BlockList) -> None:
        """The listed form of a snapshot's entry for a state of `block_list` (BF1)."""
        entry.state_blocks.hashes.extend(block_list.hashes)
        entry.state_digest = block_list.digest
        entry.state_bytes = block_list.size

    def state(self, entry: pb.NodeBalance, snapshot_id: str = "") -> bytes:
        """The bytes a listed entry stands for, read block by block (BF3)."""
        if self.reader is None:
            raise BlockMissing(f"snapshot {snapshot_id}, node {entry.node_id}: its state is listed and "
                               "nothing reads blocks here")
        if self.states is not None and (held := self.states(tuple(entry.state_blocks.hashes))) is not None:
            return held
        read = self.reader()
        parts = []
        for name in entry.state_blocks.hashes:
            block = read(name)
            if block is None:
                raise BlockMissing(f"snapshot {snapshot_id}, node {entry.node_id}, block sha256:{name.hex()}: missing")
            parts.append(block)
        return b"".join(parts)

    def fold(self, entry: pb.NodeBalance, snapshot_id: str, key: str, fn: Callable[[bytes], Any],
             joined: bool = False) -> Any:
        """`fn` of each piece of the state a listed entry stands for (foldmemo.py FM1-FM5),
        its blocks read as `state` reads them (BF3) where a piece's result is not kept;
        `joined`: those results joined by `fn.join` (foldmemo.py FM9)."""
        if self.reader is None:
            raise BlockMissing(f"snapshot {snapshot_id}, node {entry.node_id}: its state is listed and "
                               "nothing reads blocks here")
        read = self.reader()

        def checked(name: bytes) -> bytes:
            block = read(name)
            if block is None:
                raise BlockMissing(f"snapshot {snapshot_id}, node {entry.node_id}, block sha256:{name.hex()}: missing")
            return block

        return (self.folds.fold_joined if joined else self.folds.fold)(entry.state_blocks.hashes, checked, key, fn)

    def whole(self, snapshot: pb.Snapshot) -> pb.Snapshot:
        """`snapshot` itself when nothing in it is listed, else a copy in whole form (BF1)."""
        if not listed(snapshot):
            return snapshot
        whole = pb.Snapshot()
        for field, value in snapshot.ListFields():  # field by field: the nodes are built below
            if field.name != "nodes":
                whole.MergeFrom(pb.Snapshot(**{field.name: value}))
        for node in snapshot.nodes:
            entry = whole.nodes.add()
            entry.CopyFrom(node)
            if is_listed(node):
                entry.ClearField("state_blocks")
                entry.ClearField("state_bytes")
                entry.state = self.state(node, snapshot.snapshot_id)
        return whole


def comparable(entry: pb.NodeBalance) -> pb.NodeBalance:
    """`entry` with its state as its size and digest, whichever form it is in (BF4)."""
    out = pb.NodeBalance()
    out.CopyFrom(entry)  # a listed entry, or a small one: nothing large is copied here
    if out.HasField("state"):
        out.state_bytes = len(out.state)
    out.ClearField("state")
    out.ClearField("state_blocks")
    return out


def listed_report(report: pb.FullState, hashes: Iterable[bytes]) -> pb.FullState:
    """A copy of `report` (whole, or as blocks) in listed form: its manifest, no state, no carried blocks."""
    out = pb.FullState()
    for field, value in report.ListFields():
        if field.name not in ("state", "state_blocks", "blocks"):
            out.MergeFrom(pb.FullState(**{field.name: value}))
    out.state_blocks.hashes.extend(hashes)
    return out



def streamed(
    hashes: Sequence[bytes], read: Callable[[bytes], bytes | None], said: str = "",
    sized: Callable[[bytes], int | None] | None = None,
) -> tuple[BlockList | None, list[bytes]]:
    """The block list of the state `hashes` name, each block by `read` (checked against
    its name by it; None: it has none), one block held at a time (BF6); or None and the
    names it could not read, in manifest order. `said`: the state's digest as its node
    hashed it (FullState.state_digest), taken rather than hashed again ("": hashed here);
    with it, a block `sized` knows (None: it does not) is counted unread (BF6)."""
    hasher, missing = None if said else hashlib.sha256(), []
    hashes = tuple(hashes)
    # BF7: the sizes `sized` knows in one pass of C; only the others are read, in manifest order
    sizes: list[int | None] = list(map(sized, hashes)) if hasher is None and sized is not None else [None] * len(hashes)
    for at in compress(range(len(hashes)), map(operator.is_, sizes, repeat(None))):
        block = read(hashes[at])
        if block is None:
            missing.append(hashes[at])
            continue
        sizes[at] = len(block)
        if hasher is not None:
            hasher.update(block)
    if missing:
        return None, missing
    return BlockList(hashes, tuple(sizes), said or "sha256:" + hasher.hexdigest()), []  # type: ignore[union-attr,arg-type]
