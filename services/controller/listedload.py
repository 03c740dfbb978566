"""A filed snapshot read back in the tracker's listed form: its large states never joined.

`SnapshotStore.load` reads a `.pb` file's whole form (every state joined from its
blocks, then the whole encoded for its checksum), which is what a restore sends.
GetSnapshot and ListSnapshots of a snapshot the controller no longer holds leave
large states out of their answers (answers.py BA2) and read them only when they
fit, so they read it listed (snapmesh/protocol/controller/blockforms.py): each
state over LISTED_BYTES stays its manifest with its size (from its blocks' files),
and the file's checksum is checked: that of its manifests (filingsum.py), or that of
the whole form a block at a time (wholedigest.py); either way each block is read and
checked against its name. Whatever is not as a file this version writes (no checksum, a
checksum only an older form matches, a block missing or corrupt) is left to `load`,
which judges it and remembers the damage: the same answer, as `load` would give.
Its blocks are read as `snapshot verify` reads them (snapmesh/checking/listedfile.py).

The controller's start reads its stored snapshots so too (`listed_form`, from
`SnapshotStore.load_all(listed=True)`): read whole, two kept snapshots of 1 GiB a
node held 8 GiB, and 256 MiB a node took the controller to 6.5 GB at its start.
"""

from __future__ import annotations

import os
from collections import deque

from snapmesh.checking import listedfile, snapshot_file
from snapmesh.protocol.appstate import clear_old_figures
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller.wholedigest import WholeDigestError, whole_digest
from snapmesh.v1 import snapmesh_pb2 as pb


def load_listed(store, snapshot_id: str) -> pb.Snapshot | None:
    """`store.load(snapshot_id)`'s snapshot, its states over LISTED_BYTES as block lists (BF1)."""
    if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
        return None
    try:
        stored, marked = snapshot_file.read_stored(store.compact_path(snapshot_id))
    except (OSError, snapshot_file.Unreadable):
        return None
    listed = listed_form(store, snapshot_id, stored, marked)
    return listed if listed is not None else store.load(snapshot_id)


def listed_form(store, snapshot_id: str, stored: pb.Snapshot, marked: bool) -> pb.Snapshot | None:
    """The listed form of `stored`, the file of `snapshot_id` as read (`read_stored`), each
    block read and checked against its name and against the file's checksum, one at a time;
    None when the file is not as this version writes it (the caller's whole `load` judges it)."""
    if not marked or not stored.checksum or stored.snapshot_id != snapshot_id:
        return None
    files = store.blocks
    blocks_of = listedfile.checked_blocks(snapshot_id, files.read)  # as `snapshot verify` reads them

    listed = pb.Snapshot()
    listed.CopyFrom(stored)  # manifests, not states
    listed.ClearField("checksum")
    try:
        for entry in listed.nodes:
            if not entry.HasField("state_blocks"):
                continue
            where = os.fspath(files.directory)  # str paths: pathlib would intern every name
            size = sum(os.stat(os.path.join(where, name.hex())).st_size for name in entry.state_blocks.hashes)
            if size > blockforms.LISTED_BYTES:
                entry.state_bytes = size
            else:  # BF2: a small state is held whole
                entry.state = b"".join(blocks_of(entry))
                entry.ClearField("state_blocks")
        if snapshot_file.checksum(stored) == stored.checksum:  # of its manifests (filingsum.py)
            for entry in (entry for entry in listed.nodes if blockforms.is_listed(entry)):
                deque(blocks_of(entry), maxlen=0)  # each block checked against its name, as `load` would
        elif whole_digest(listed, blocks_of).checksum != stored.checksum:
            return None
    except (OSError, listedfile.NotAsNamed, WholeDigestError):
        return None
    clear_old_figures(listed)  # as `load`'s
    return listed
