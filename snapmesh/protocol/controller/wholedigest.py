"""The checksum of a listed snapshot's whole form, its states read a block at a time, pure.

A snapshot's file carries the checksum of its whole form (blockforms.py BF1: each
listed state joined in place of its block list) when its files hold the states
inline (up to 4 MiB of them; a larger one's is its manifests': filingsum.py, and
reading such a file back still may hash the whole form: an older file's checksum is
that one), and filing it used to build that
form and encode it: every node's state joined, then encoded again beside it, at
64 MiB a node eight times one node's state held at once by the controller. The
encoding of the whole form is the listed one's with each listed entry's manifest
replaced by its state's bytes field, so it can be hashed as a stream instead:
the encoding of a template (each listed state a marker of its own), with the
markers' fields and the lengths around them rewritten as they go by, and each
state's blocks fed in between as they are read. The states' own digests are
hashed on the way, from the same reads.

WD1. The checksum is sha256 over exactly the bytes `SerializeToString(deterministic=True)`
    of the whole form gives (snapshot_file.checksum): a template whose markers
    cannot be found once each, where the encoding puts them, is refused
    (WholeDigestError), never hashed otherwise.
WD2. A listed state is read by `read` (its entry -> its blocks' contents, in order);
    blocks adding up to another size than the entry's `state_bytes` are refused:
    the lengths written before them would not be theirs.
WD3. One block of a state is held at a time (what `read` yields), and no join.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from snapmesh.protocol import statedigest
from snapmesh.protocol.controller import blockforms
from snapmesh.v1 import snapmesh_pb2 as pb

_NODES = pb.Snapshot.DESCRIPTOR.fields_by_name["nodes"].number
_STATE = pb.NodeBalance.DESCRIPTOR.fields_by_name["state"].number
MARKER_BYTES = 32

Read = Callable[[pb.NodeBalance], Iterable[bytes]]


class WholeDigestError(ValueError):
    """The whole form's encoding could not be streamed as WD1 and WD2 ask."""


@dataclass(frozen=True, slots=True)
class WholeDigest:
    checksum: str  # "sha256:<hex>" of the whole form's deterministic encoding (snapshot_file.checksum)
    states: dict[int, str]  # entry index -> that listed state's digest, in its entry's form (statedigest.py)


def whole_digest(snapshot: pb.Snapshot, read: Read) -> WholeDigest:
    """The checksum of `snapshot`'s whole form and its listed states' digests (WD1-WD3)."""
    template = pb.Snapshot()
    template.CopyFrom(snapshot)  # listed: manifests, not states
    markers: list[tuple[int, bytes, bytes]] = []  # (entry index, marker, the entry's template encoding)
    for index, entry in enumerate(template.nodes):
        if not blockforms.is_listed(entry):
            continue
        entry.ClearField("state_blocks")
        entry.ClearField("state_bytes")
        entry.state = marker = hashlib.sha256(b"snapmesh whole-form marker %d " % index +
                                              snapshot.snapshot_id.encode()).digest()
        markers.append((index, marker, entry.SerializeToString(deterministic=True)))
    data = template.SerializeToString(deterministic=True)
    hasher, states, at = hashlib.sha256(), {}, 0
    for index, marker, encoded in markers:
        entry = snapshot.nodes[index]
        start, inner = _entry_at(data, marker, encoded)
        head = _varint(len(encoded))
        size = entry.state_bytes
        field = _varint(_STATE << 3 | 2) + _varint(MARKER_BYTES)  # the marker's field, as encoded
        hasher.update(data[at : start - len(head)])
        hasher.update(_varint(len(encoded) - len(field) - MARKER_BYTES + len(_varint(_STATE << 3 | 2))
                              + len(_varint(size)) + size))
        hasher.update(encoded[: inner - len(field)])
        hasher.update(_varint(_STATE << 3 | 2) + _varint(size))
        state, got = statedigest.Hasher.like(entry.state_digest), 0  # the node's form (statedigest.py SD2)
        for block in read(entry):
            hasher.update(block)
            state.update(block)
            got += len(block)
        if got != size:
            raise WholeDigestError(f"node {entry.node_id}: its blocks add up to {got} bytes, not the "
                                   f"{size} its entry says (WD2)")
        states[index] = state.text()
        at = start + inner + MARKER_BYTES
    hasher.update(data[at:])
    return WholeDigest("sha256:" + hasher.hexdigest(), states)


def _entry_at(data: bytes, marker: bytes, encoded: bytes) -> tuple[int, int]:
    """Where the entry `encoded` starts in `data`, and where its marker starts within it (WD1)."""
    inner = encoded.find(marker)
    found = data.find(marker)
    field = _varint(_STATE << 3 | 2) + _varint(MARKER_BYTES)
    start = found - inner
    if (inner < len(field) or encoded.find(marker, inner + 1) != -1 or found == -1 or data.find(marker, found + 1) != -1
            or encoded[inner - len(field) : inner] != field or data[start : start + len(encoded)] != encoded
            or data[start - len(_varint(len(encoded))) - len(_varint(_NODES << 3 | 2)) : start]
            != _varint(_NODES << 3 | 2) + _varint(len(encoded))):
        raise WholeDigestError("a listed entry's marker is not found once, as its own field, in the template (WD1)")
    return start, inner


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
