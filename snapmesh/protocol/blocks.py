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
    so the snapshot's checksum (of the whole form, snapmesh/checking/snapshot_file.py)
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
    same content, so the hash is the one hashing would give.

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
from collections.abc import Callable
from dataclasses import dataclass

from snapmesh.v1 import snapmesh_pb2 as pb

BLOCK_BYTES = 8 * 1024
MISSING = "missing blocks"  # how a refused report's details start (B4)


def block_hash(block: bytes) -> bytes:
    """A block's name: the SHA-256 of its content (32 bytes; its file is the hex)."""
    return hashlib.sha256(block).digest()


def split(state: bytes) -> list[bytes]:
    """`state` in blocks of BLOCK_BYTES, in order (the last one shorter; none for b"")."""
    view = memoryview(state)
    return [bytes(view[i : i + BLOCK_BYTES]) for i in range(0, len(state), BLOCK_BYTES)]


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


def stored_form(snapshot: pb.Snapshot) -> tuple[pb.Snapshot, dict[bytes, bytes]]:
    """The stored form of the whole `snapshot` (not changed) and its blocks by hash (B1, B2)."""
    stored = pb.Snapshot()
    stored.CopyFrom(snapshot)
    blocks: dict[bytes, bytes] = {}
    for node in stored.nodes:
        if not node.HasField("state") or not node.state:
            continue
        for block in split(node.state):
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



def names(state: bytes, last: tuple[bytes, list[bytes]] | None = None) -> tuple[list[bytes], int]:
    """The hashes of `state`'s blocks, in order, and how many it hashed: a block
    whose bytes are those of the block at the same offset of `last` (an earlier
    state and its `names`) takes that block's hash unhashed (B5)."""
    view = memoryview(state)
    old, old_names = last if last is not None else (b"", [])
    found: list[bytes] = []
    hashed = 0
    for i, start in enumerate(range(0, len(state), BLOCK_BYTES)):
        end = start + BLOCK_BYTES
        # Sliced as bytes, not memoryviews: a memoryview compares item by item.
        if i < len(old_names) and state[start:end] == old[start:end]:
            found.append(old_names[i])
        else:
            found.append(block_hash(view[start:end]))
            hashed += 1
    return found, hashed


def referenced_report(
    report: pb.FullState, held: set[bytes], known: list[bytes] | None = None,
) -> tuple[pb.FullState | None, set[bytes]]:
    """`report` (not changed) with its state as blocks, sending only those not in
    `held`, and every block of its state; None in place of the report when it has
    no state or none of its blocks is held (B4: then it goes whole). `known`:
    the state's block hashes (`names`), when the caller has them."""
    if not report.HasField("state") or not report.state:
        return None, set()
    state = report.state
    listed = known if known is not None else names(state)[0]
    if held.isdisjoint(listed):
        return None, set(listed)
    sent = pb.FullState()
    sent.CopyFrom(report)
    sent.ClearField("state")
    sent.state_blocks.hashes.extend(listed)
    new: set[bytes] = set()
    for i, name in enumerate(listed):
        if name not in held and name not in new:
            new.add(name)
            sent.blocks.append(state[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES])
    return sent, set(listed)


def whole_report(sent: pb.FullState, read: Callable[[bytes], bytes | None]) -> tuple[pb.FullState | None, list[bytes]]:
    """The report `sent` stood for (B4), each block from those it carries or else
    `read(hash)` (the controller's; None: it has none), and the blocks found in
    neither, in manifest order; None in place of the report when there is one."""
    carried = {block_hash(block): block for block in sent.blocks}
    parts: list[bytes] = []
    missing: list[bytes] = []
    for name in sent.state_blocks.hashes:
        block = carried.get(name)
        if block is None and (block := read(name)) is not None and block_hash(block) != name:
            block = None  # a corrupt block of the controller's is as good as none
        if block is None:
            missing.append(name)
        else:
            parts.append(block)
    if missing:
        return None, missing
    whole = pb.FullState()
    whole.CopyFrom(sent)
    whole.ClearField("state_blocks")
    whole.ClearField("blocks")
    whole.state = b"".join(parts)
    return whole, []
