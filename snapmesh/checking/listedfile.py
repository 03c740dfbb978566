"""A stored snapshot's manifests read a block at a time: its states never joined.

A `.pb` (and, over EXPORT_INLINE_BYTES of states, its JSON export) holds each app
node's state as a manifest of blocks under `controller/blocks/<hex>`
(snapshot_file.py). Joining every state to check the file held them all at once,
and encoding the whole form for its checksum held them again: at 64 MiB a node and
four nodes, `snapshot verify` peaked at 4.4 times the states. Here each block is
read, checked and let go before the next; the controller's listed reads
(services/controller/listedload.py) and `snapshot verify` (snapshot_file.check)
both read through `checked_blocks`.

LF1. `scan` reads every block a manifest names once, in order, and checks it
     against its name; a block that is missing or not as named is a
     blocks.BlockProblem (snapshot, node, hash, why), every one of them named, as
     `blocks.whole_form` names them.
LF2. From the same reads, each state's size and its digest in the form of its
     entry's `state_digest` (statedigest.py SD2): no block is read twice for them.
LF3. `listed` is the stored form as the controller's listed form
     (snapmesh/protocol/controller/blockforms.py BF1): each manifest with its
     state's size as `state_bytes`, so its whole form's checksum can be hashed a
     block at a time (wholedigest.py) and a lazy View (lazystates.py) sizes it
     without a read.
LF4. `checked_blocks` gives a listed state's blocks one at a time, each checked
     against its name: the first that is not raises NotAsNamed naming it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from snapmesh.protocol import blocks, statedigest
from snapmesh.v1 import snapmesh_pb2 as pb

Read = Callable[[bytes], "bytes | None"]  # a block's name -> its content as stored, None: no such file


class NotAsNamed(LookupError):
    """A block missing or not as named (LF4): `problem` names it."""

    def __init__(self, problem: blocks.BlockProblem) -> None:
        self.problem = problem
        super().__init__(str(problem))


def directory_reader(directory: Path) -> Read:
    """The blocks under `directory`, as stored (unchecked)."""
    where = os.fspath(directory)  # str paths: pathlib would intern every name

    def read(name: bytes) -> bytes | None:
        try:
            with open(os.path.join(where, name.hex()), "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    return read


def _problem(snapshot_id: str, entry: pb.NodeBalance, name: bytes, block: bytes | None) -> blocks.BlockProblem | None:
    if block is None:
        why = "missing"
    elif (got := blocks.block_hash(block)) != name:
        why = f"corrupt: its content hashes to sha256:{got.hex()}"
    else:
        return None
    return blocks.BlockProblem(snapshot_id=snapshot_id, node_id=entry.node_id, hash=name, why=why)


def checked_blocks(snapshot_id: str, read: Read) -> Callable[[pb.NodeBalance], Iterator[bytes]]:
    """A listed entry -> its blocks' contents, in order, each checked against its name (LF4)."""

    def blocks_of(entry: pb.NodeBalance) -> Iterator[bytes]:
        for name in entry.state_blocks.hashes:
            block = read(name)
            if (problem := _problem(snapshot_id, entry, name, block)) is not None:
                raise NotAsNamed(problem)
            yield block  # type: ignore[misc]  (None is a problem)

    return blocks_of


@dataclass
class Scan:
    """What `scan` found, by entry index of each node that holds a manifest."""

    sizes: dict[int, int] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)  # in the form of the entry's digest (LF2)
    problems: list[blocks.BlockProblem] = field(default_factory=list)


def scan(stored: pb.Snapshot, read: Read) -> Scan:
    """Every block of `stored`'s manifests read once and checked (LF1, LF2)."""
    found = Scan()
    for index, entry in enumerate(stored.nodes):
        if not entry.HasField("state_blocks"):
            continue
        hasher, size = statedigest.Hasher.like(entry.state_digest), 0
        for name in entry.state_blocks.hashes:
            block = read(name)
            if (problem := _problem(stored.snapshot_id, entry, name, block)) is not None:
                found.problems.append(problem)
                continue
            assert block is not None
            hasher.update(block, name)  # checked against its name: a whole grid block's hash is its name
            size += len(block)
        found.sizes[index], found.digests[index] = size, hasher.text()
    return found


def listed(stored: pb.Snapshot, sizes: dict[int, int]) -> pb.Snapshot:
    """`stored` (not changed) in the listed form, its manifests sized (LF3)."""
    out = pb.Snapshot()
    out.CopyFrom(stored)  # manifests, not states
    for index, size in sizes.items():
        out.nodes[index].state_bytes = size
    return out
