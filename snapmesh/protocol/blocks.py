"""Content-addressed blocks: a node's state stored as a manifest of block hashes, pure.

The controller stores each app node's state at the cut as blocks
(services/controller/store.py): the state is cut into blocks of BLOCK_BYTES (the
last one shorter), each named by its SHA-256 and kept once under
`controller/blocks/<hex>` however many snapshots hold it. A snapshot's stored
form is the Snapshot with, per node, `state` unset and `state_blocks` (its
manifest: the blocks' hashes, in order) set; the in-flight messages stay in it
whole.

The rules:
B1. `stored_form` and `whole_form` are inverses: the whole form rebuilt from the
    stored form and its blocks is the Snapshot that was stored, byte for byte,
    so the snapshot's checksum (of the whole form, or of the stored form whose
    manifests name each block by its hash: snapmesh/checking/snapshot_file.py)
    covers every block, and a file from before blocks (states inline) is its
    own whole form.
B2. An empty state stays inline (there is nothing to name); so does every state
    of a snapshot with no app (the bank's).
B3. A block is only ever read through its hash: `whole_form` names each block it
    cannot find or whose content does not hash to its name (snapshot, node,
    hash), and rebuilds nothing then.
B4. A node's report may carry its state as blocks (`referenced_report`): the
    manifest, and the contents of only the blocks the node does not take the
    controller to hold. `whole_report` rebuilds the report the node made, byte
    for byte, from the blocks sent and the controller's own (each checked
    against its name); a block found in neither is named, and then nothing is
    rebuilt (the controller refuses it, MISSING; the node sends the state whole).
    The node's belief may be stale (a block retention deleted since, a
    snapshot that failed before it was filed): a refusal costs one round, never
    a wrong state.

B5. A block's hash is computed once per content at a node: `names` takes the
    hash of a block whose bytes are those of the same block of the state before
    (compared, at memory speed, rather than hashed), so a report's cost in
    hashing follows what changed. A comparison that finds them equal names the
    same content, so the hash is the one hashing would give. A state cut as the
    one before (the same size and parts: each block where it was) is compared a
    window of blocks at a time, and block by block only in a window that differs:
    the same bytes compared, in an eighth of the steps.

B6. An app that knows its structure cuts its state into parts (snapshot_blocks(),
    snapmesh/app), and each part is cut into blocks of BLOCK_BYTES (`bounds`), so
    that a change within a part changes that part's blocks only, however its
    size changed. The report says how (FullState.state_parts), and the
    controller stores the state cut the same way, so the next report's
    unchanged blocks are the ones it holds. A cut it does not know (a filing
    replayed from the journal after a restart) is the plain grid: the node's
    next report then names blocks it lacks, and is sent whole (B4), once.

B7. The controller keeps the blocks of each node's last state in memory
    (snapmesh/protocol/controller/knownblocks.py), each checked against its name
    as it came in (hashed, or compared with a block of that name), so rebuilding
    the next report reads and hashes only what it does not hold there: what changed.
B8. A node's state may be held as its blocks (blockstate.BlockState, the cut of
    node/apphost.py H8): a `Named` of it holds that BlockState, and the report
    is formed from it by slices of one block each (the block itself, BST2): no
    join, no copy of the whole; its carried blocks may stay those blocks, sent
    after the report's encoding (`referenced_report` `carried`). `names` of a
    BlockState its cut did not name joins it, once (the rare path).

Why fixed-size blocks of 8 KiB: a state that changes in place (a blob written at
offsets, kvshard's keys in ranges) changes the blocks it touches and no other;
content-defined cuts would only pay off for inserts, which shift a fixed grid.
At 8 KiB, 64 changed runs of 1 KiB in 64 MiB touch about 72 blocks (0.9% of the
state) and the manifest is 0.4% of it (32 bytes a block): under the 2% the
incremental snapshot aims for, where 16 KiB blocks would come close to it and
64 KiB ones exceed it several times. Smaller blocks would mean more files and
longer manifests for nothing measurable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from types import MappingProxyType

from snapmesh.app import BLOCK_BYTES  # noqa: F401  (the app contract's: apps cut their parts by it)
from snapmesh.protocol.blockstate import BlockState
from snapmesh.v1 import snapmesh_pb2 as pb

MISSING = "missing blocks"  # how a refused report's details start (B4)


def block_hash(block: bytes) -> bytes:
    """A block's name: the SHA-256 of its content (32 bytes; its file is the hex)."""
    return hashlib.sha256(block).digest()


class PartedState(bytes):
    """An app's state as snapshot_blocks() gave it: the parts joined, and their sizes
    in `parts` (B6). Bytes to everything else; the report carries the sizes."""

    parts: tuple[int, ...] = ()

    @classmethod
    def of(cls, parts: list[bytes]) -> PartedState:
        state = cls(b"".join(parts))  # a bytes subclass copies what it is made from: two copies (apphost.py H8's cut: none)
        state.parts = tuple(len(part) for part in parts if part)
        return state


def bounds(size: int, parts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """The (start, end) of each block of a state of `size` bytes cut into `parts`
    (their sizes; () or sizes that do not add up to `size`: one part), each part
    cut into blocks of BLOCK_BYTES, the last one shorter (B6)."""
    return [(start, end) for _, start, end in _cut(size, parts)]


def _cut(size: int, parts: Sequence[int]) -> list[tuple[tuple[int, int], int, int]]:
    """`bounds`, each block with its place: (its part's index, its offset in the part)."""
    if sum(parts) != size:
        parts = (size,)
    found = []
    start = 0
    for index, part in enumerate(parts):
        end = start + part
        found.extend(((index, i - start), i, min(i + BLOCK_BYTES, end)) for i in range(start, end, BLOCK_BYTES))
        start = end
    return found


def split(state: bytes, parts: Sequence[int] = ()) -> list[bytes]:
    """`state` in blocks, in order (`bounds`; none for b"")."""
    view = memoryview(state)
    return [bytes(view[start:end]) for start, end in bounds(len(state), parts)]


@dataclass(frozen=True, kw_only=True)
class BlockProblem:
    """A block a stored snapshot names and cannot have (B3)."""

    snapshot_id: str
    node_id: str
    hash: bytes
    why: str  # "missing", or what its content hashes to

    def __str__(self) -> str:
        return f"snapshot {self.snapshot_id}, node {self.node_id}, block sha256:{self.hash.hex()}: {self.why}"


def is_stored_form(snapshot: pb.Snapshot) -> bool:
    """Whether any node of `snapshot` holds a manifest rather than its state."""
    return any(node.HasField("state_blocks") for node in snapshot.nodes)


def stored_form(
    snapshot: pb.Snapshot, parts: Mapping[str, Sequence[int]] = MappingProxyType({}),
) -> tuple[pb.Snapshot, dict[bytes, bytes]]:
    """The stored form of the whole `snapshot` (not changed) and its blocks by hash
    (B1, B2); `parts`: node -> the parts its report cut its state into (B6)."""
    stored = pb.Snapshot()
    stored.CopyFrom(snapshot)
    blocks: dict[bytes, bytes] = {}
    for node in stored.nodes:
        if not node.HasField("state") or not node.state:
            continue
        for block in split(node.state, parts.get(node.node_id, ())):
            name = block_hash(block)
            blocks[name] = block
            node.state_blocks.hashes.append(name)
        node.ClearField("state")
    return stored, blocks


def hashes(stored: pb.Snapshot) -> set[bytes]:
    """Every block the stored form names."""
    return {name for node in stored.nodes for name in node.state_blocks.hashes}


def whole_form(
    stored: pb.Snapshot, read: Callable[[bytes], bytes | None],
) -> tuple[pb.Snapshot | None, list[BlockProblem]]:
    """The whole form of `stored` (not changed), each block by `read(hash)` (None:
    missing), and the problems of its blocks; with a problem the whole form is
    None (B3). A snapshot with no manifest is its own whole form."""
    whole = pb.Snapshot()
    whole.CopyFrom(stored)
    problems: list[BlockProblem] = []
    for node in whole.nodes:
        if not node.HasField("state_blocks"):
            continue
        parts = []
        for name in node.state_blocks.hashes:
            block = read(name)
            if block is None:
                why = "missing"
            elif (got := block_hash(block)) != name:
                why = f"corrupt: its content hashes to sha256:{got.hex()}"
            else:
                parts.append(block)
                continue
            problems.append(BlockProblem(snapshot_id=stored.snapshot_id, node_id=node.node_id, hash=name, why=why))
        node.ClearField("state_blocks")
        node.state = b"".join(parts)
    return (None, problems) if problems else (whole, [])



@dataclass(frozen=True)
class Named:
    """A state, cut into blocks (`bounds`), and their hashes: what `names` reuses."""

    state: bytes  # or a BlockState (node/apphost.py H8): read by slices of one block, never joined (B8)
    bounds: list[tuple[int, int]]
    names: list[bytes]
    # (part, offset in it) -> start, end, hash; None: not built yet (`placed` builds it from `cut`)
    places: dict[tuple[int, int], tuple[int, int, bytes]] | None
    cut: tuple[int, tuple[int, ...]] | None = None  # (size, parts) `names` cut it by; None: not cut by it

    def placed(self) -> dict[tuple[int, int], tuple[int, int, bytes]]:
        """`places`, built on first use: a state named on the same cut as the last one
        (`names`'s usual case) never needs it, and building it costs a dict entry a block."""
        if self.places is None:
            assert self.cut is not None
            places = {place: (start, end, name)
                      for (place, start, end), name in zip(_cut(*self.cut), self.names, strict=True)}
            object.__setattr__(self, "places", places)  # a cache of what the fields say: frozen all the same
        return self.places  # type: ignore[return-value]


# Blocks compared at once by `names`, as one slice of each state: 64 KiB, under the
# allocator's 128 KiB mmap threshold (a larger slice, mapped and unmapped at each
# compare, makes the compare of 64 MiB several times slower, not faster).
WINDOW_BLOCKS = 8


def names(
    state: bytes, parts: Sequence[int] = (), last: Named | None = None, made: Named | None = None,
) -> tuple[Named, int]:
    """`state` cut into `parts` (`bounds`) and its blocks' hashes, and how many it
    hashed: a block whose bytes are those of the block at the same place in `last`
    (an earlier state: the same part, the same offset in it, so a part that grew
    or shrank moves none after it) takes that block's hash unhashed (B5). `made`: the
    state named already, on this cut (the node's cut names it, node/cutnames.py), taken as it is."""
    key = (len(state), tuple(parts) if sum(parts) == len(state) else (len(state),))
    if made is not None and made.cut == key and made.state is state:
        return made, 0
    if type(state) is BlockState:  # B8: not named at its cut after all; joined, once
        state = bytes(state)
    if last is not None and last.cut == key:
        return _names_on_the_same_cut(state, key, last)
    view = memoryview(state)
    cut = _cut(*key)
    places = {}
    found: list[bytes] = []
    hashed = 0
    last_places = last.placed() if last is not None else {}
    for place, start, end in cut:
        before = last_places.get(place)
        # Sliced as bytes, not memoryviews: a memoryview compares item by item.
        if before is not None and before[1] - before[0] == end - start \
                and state[start:end] == last.state[before[0]:before[1]]:  # type: ignore[union-attr]
            name = before[2]
        else:
            name = block_hash(view[start:end])
            hashed += 1
        found.append(name)
        places[place] = (start, end, name)
    return Named(state, [(start, end) for _, start, end in cut], found, places, key), hashed


def _names_on_the_same_cut(state: bytes, key: tuple[int, tuple[int, ...]], last: Named) -> tuple[Named, int]:
    """`names` of a state cut as `last` was (the same size and parts: each block's place
    is its index, the blocks tile the state in order): WINDOW_BLOCKS blocks compared at
    once, and only the blocks of a window that differs compared one by one (and those
    that differ hashed). The same bytes as B5 compares, in fewer, larger compares."""
    view, before = memoryview(state), last.state
    bounds, found = last.bounds, list(last.names)
    hashed = 0
    for first in range(0, len(bounds), WINDOW_BLOCKS):
        window = bounds[first:first + WINDOW_BLOCKS]
        start, end = window[0][0], window[-1][1]
        if state[start:end] == before[start:end]:
            continue
        for i, (start, end) in enumerate(window, first):
            if state[start:end] != before[start:end]:
                found[i] = block_hash(view[start:end])
                hashed += 1
    return Named(state, bounds, found, None, key), hashed


def referenced_report(
    report: pb.FullState, held: set[bytes], known: Named | None = None, *, carry_all: bool = False,
    carried: list[bytes] | None = None,
) -> tuple[pb.FullState | None, set[bytes]]:
    """`report` (not changed) with its state as blocks (cut into its `state_parts`,
    B6), sending only those not in `held`, and every block of its state; None in
    place of the report when it has no state or none of its blocks is held (B4:
    then it goes whole), unless `carry_all` (as blocks all the same, each carried:
    the controller writes a stream's carried blocks as they come, never a whole
    state's bytes). `known`: `names` of the report's state and parts, when the
    caller has them. `carried`: the blocks to carry go there, in order, not into the
    report (B8: the state's own blocks, where a protobuf holds a copy; the caller
    sends them after it, chunking.stream_state)."""
    if known is None:
        state = report.state if report.HasField("state") else b""  # read once: each read is a copy
        if not state:
            return None, set()
        known = names(state, report.state_parts)[0]
    if held.isdisjoint(known.names) and not carry_all:
        return None, set(known.names)
    sent = without_state(report)
    sent.state_blocks.hashes.extend(known.names)
    listed = set(known.names)
    if absent := listed.difference(held):  # by set and map, not a step a block: a few are new
        new: set[bytes] = set()
        for i in compress(range(len(known.names)), map(absent.__contains__, known.names)):
            if (name := known.names[i]) not in new:
                new.add(name)
                start, end = known.bounds[i]
                (sent.blocks if carried is None else carried).append(known.state[start:end])
    return sent, listed


def without_state(report: pb.FullState) -> pb.FullState:
    """A copy of `report` but its `state`, field by field: CopyFrom then ClearField
    would copy the state's bytes (64 MiB at 64 MiB per node, tens of milliseconds) only
    to drop them, on every report formed as blocks. Fields this code does not know
    (a newer node's, carried as unknown fields) are not copied: a report is formed
    by the node that made it, from its own code's fields."""
    out = pb.FullState()
    for field in _FULL_STATE_FIELDS:
        name = field.name
        if field.is_repeated:
            if values := getattr(report, name):
                getattr(out, name).extend(values)
        elif field.message_type is not None:
            if report.HasField(name):
                getattr(out, name).CopyFrom(getattr(report, name))
        elif not field.has_presence or report.HasField(name):
            setattr(out, name, getattr(report, name))
    return out


_FULL_STATE_FIELDS = tuple(f for f in pb.FullState.DESCRIPTOR.fields if f.name != "state")


def whole_report(
    sent: pb.FullState, read: Callable[[bytes], bytes | None], known: Callable[[bytes], bytes | None] | None = None,
) -> tuple[pb.FullState | None, list[bytes]]:
    """The report `sent` stood for (B4), each block from those it carries or else
    `read(hash)` (the controller's; None: it has none), and the blocks found in
    neither, in manifest order; None in place of the report when there is one.
    `known(hash)`: a block already checked against its name (B7), looked up first."""
    whole, missing, _ = whole_state(sent, read, known)
    return whole, missing


def joined(
    sent: pb.FullState, read: Callable[[bytes], bytes | None], known: Callable[[bytes], bytes | None] | None = None,
) -> tuple[Named | None, list[bytes]]:
    """The state a report as blocks names and its cut, without a report built around it
    (a state set in a protobuf is copied, and so is each read of it): each block from
    those it carries, else `known` (checked already, B7), else `read` and checked against
    its name; or None and the blocks found nowhere, in manifest order (B4)."""
    carried = {block_hash(block): block for block in sent.blocks}
    parts: list[bytes] = []
    missing: list[bytes] = []
    for name in sent.state_blocks.hashes:
        block = carried.get(name)
        if block is None and known is not None:
            block = known(name)
        if block is None and (block := read(name)) is not None and block_hash(block) != name:
            block = None  # a corrupt block of the controller's is as good as none
        if block is None:
            missing.append(name)
        else:
            parts.append(block)
    if missing:
        return None, missing
    cut, start = [], 0
    for part in parts:
        cut.append((start, start + len(part)))
        start += len(part)
    return Named(b"".join(parts), cut, list(sent.state_blocks.hashes), {}), []


def whole_state(
    sent: pb.FullState, read: Callable[[bytes], bytes | None], known: Callable[[bytes], bytes | None] | None = None,
) -> tuple[pb.FullState | None, list[bytes], Named | None]:
    """`whole_report`, and its state cut as the manifest cuts it (`Named`, for B7)."""
    named, missing = joined(sent, read, known)
    if named is None:
        return None, missing, None
    whole = pb.FullState()
    whole.CopyFrom(sent)
    whole.ClearField("state_blocks")
    whole.ClearField("blocks")
    whole.state = named.state
    return whole, [], named
