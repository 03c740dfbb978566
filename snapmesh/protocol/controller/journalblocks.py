"""Reports journaled as blocks, pure: what a report that came as blocks costs the journal, and how it is read back.

A node's report may carry its state as blocks (blocks.py B4): the manifest and
the contents of only the blocks the controller does not hold. Journaling the
state rebuilt from them wrote the whole state at every report (64 MiB a node
for 64 KiB changed) and copied it several times on the controller's loop.

Rules (services/controller/servicer.py, store.py and process.py carry them out):
JB1. A report that came as blocks is journaled as it came (journal.Reported.sent):
    the manifest and the blocks it carries. The blocks it names and does not
    carry (`held`) are on disk under controller/blocks: each is referenced
    by a stored snapshot or pinned by a journaled report (JB2) when the report is
    taken, and is pinned before the record is written. The blocks a taken report
    carries are written there too, and pinned with the rest, before its record:
    the node's next report names them as held, and its snapshot may not be filed
    yet. Those its record carries are written unsynced, the record's fdatasync
    making them durable (services/controller/blockdir.py D8), and their files only
    after the report is answered (held in memory meanwhile: D12); the others, every
    block of a report that came whole (its record carries none, JB4) and those a
    chunked stream brought (written as they came, carriedblocks.py), durably. So a
    held block is durable, or carried by a live record journaled before the one
    that names it (the node names only blocks of a report answered, so journaled),
    until D8's `settle`, which runs before a filing names it and before a rewrite
    drops that record.
JB2. A pinned block is not deleted (neither by retention nor by the sweep at
    start) until its snapshot's records are dead in the journal: the snapshot is
    filed (it then references its blocks itself) or retired. So every block a
    live record names can be read back after a crash.
JB3. Read back, at start, before the sweep and before `rebuilt`, every block a live
    record carries (`carried`: those of the snapshots not loaded from their files)
    whose file is missing or does not hash to its name (an OS crash after its record
    was durable: D8) is written back, durably. Then (`rebuilt`) each such record is made
    whole from the blocks it carries and those on disk, each checked against its
    name (blocks.py B3), and every block it names is pinned again (those it
    carried are on disk too, JB1, for the node's next report). A record of a
    report that came whole pins again the blocks of its state (cut as the node
    cut it, its state_parts) that are on disk (JB1 wrote them): the node takes the
    controller to hold them, and its next report, as blocks, names them; swept,
    that report would be refused once and sent whole. A record that
    cannot be made whole (a block gone: its snapshot was retired and the journal
    not rewritten since, or the disk lost it, damaged it or cannot read it) takes
    every record of its snapshot with it, with one warning naming the snapshot, the
    node and the block, and the start goes on (process.py): a snapshot is rebuilt
    whole or not at all, never with a node missing.
JB4. A report that came whole with a large state (blockforms.py BF5) is journaled
    as its manifest carrying no block (`sent` is its listed form): every block it
    names was written and pinned before its record (JB1), so it reads back as a
    report as blocks does (JB3). A report journaled whole (a small state, or one
    an older controller wrote) still reads back as it was written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from snapmesh.protocol import blocks
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller.journal import Record, Reported
from snapmesh.v1 import snapmesh_pb2 as pb


def held(sent: pb.FullState, carried: Iterable[bytes] | None = None,
         named: frozenset[bytes] | None = None) -> frozenset[bytes]:
    """The blocks a report as blocks names and does not carry: those it takes the controller to hold (JB1).
    `carried`: the names of the blocks it carries, and `named` the set of those it names, when the
    caller has them already (each a pass over the 8192 names of 64 MiB)."""
    if carried is None:
        carried = {blocks.block_hash(block) for block in sent.blocks}
    return (named if named is not None else frozenset(sent.state_blocks.hashes)).difference(carried)


def carried(records: Iterable[Record], *, skip: Iterable[str] = ()) -> dict[bytes, bytes]:
    """The blocks the records of reports as blocks carry, by name, those their manifests
    name (the controller wrote those, JB1), for the replay to write back where an OS crash
    lost them (JB3). The records of the snapshots in `skip` (filed: their blocks were
    settled before their manifests, D8) are left out."""
    skip = set(skip)
    found: dict[bytes, bytes] = {}
    for record in records:
        if isinstance(record, Reported) and record.sent is not None and record.sent.blocks \
                and record.snapshot_id not in skip:
            named = frozenset(record.sent.state_blocks.hashes)
            for block in record.sent.blocks:
                if (name := blocks.block_hash(block)) in named:
                    found.setdefault(name, block)
    return found


def rebuilt(
    records: Iterable[Record], read: Callable[[bytes], bytes | None], *, skip: Iterable[str] = (),
    note: Callable[[pb.FullState, blockforms.BlockList], None] | None = None,
) -> tuple[list[Record], dict[str, set[bytes]], list[str]]:
    """`records` with each report journaled as blocks made whole (JB3), or listed when
    large and `note` is given (JB5), the blocks to pin again by snapshot, and one
    warning per snapshot dropped. The records of the snapshots in `skip` (loaded from
    their files: the replay skips them) are left as they are and pin nothing."""
    skip = set(skip)
    out: list[Record] = []
    pins: dict[str, set[bytes]] = {}
    gone: dict[str, str] = {}
    for record in records:
        sid = record.snapshot_id
        if isinstance(record, Reported) and record.sent is not None and sid not in skip and sid not in gone:
            whole, missing = _listed(record.sent, read, note) if note is not None else (None, [])
            if whole is None and not missing:  # small, or no `note`: whole (JB3)
                whole, missing = blocks.whole_report(record.sent, read)
            if whole is None:
                gone[sid] = (f"journal: dropping snapshot {sid}: the report of {record.sent.node_id} names "
                             f"{len(missing)} block(s) no longer stored, readable and whole "
                             f"(sha256:{missing[0].hex()}); it was retired, or the disk lost them")
                continue
            pins.setdefault(sid, set()).update(record.sent.state_blocks.hashes)
            record = Reported(state=whole, wall=record.wall, sent=record.sent)
        elif isinstance(record, Reported) and record.sent is None and sid not in skip:
            if names := _whole_blocks(record.state, read):
                pins.setdefault(sid, set()).update(names)
        out.append(record)
    for sid in gone:
        pins.pop(sid, None)
    return [r for r in out if r.snapshot_id not in gone], pins, list(gone.values())


def _whole_blocks(state: pb.FullState, read: Callable[[bytes], bytes | None]) -> set[bytes]:
    """The blocks of a report that came whole that are on disk (JB3): cut as the node cut
    it, so they are the names its next report gives. One the disk lost is not pinned: the
    node's next report naming it is refused and sent whole (B4), never taken short."""
    if not state.HasField("state") or not state.state:
        return set()
    return {name for name in blocks.names(state.state, state.state_parts)[0].names if read(name) is not None}


def _listed(
    sent: pb.FullState, read: Callable[[bytes], bytes | None], note: Callable[[pb.FullState, blockforms.BlockList], None],
) -> tuple[pb.FullState | None, list[bytes]]:
    """The listed form of a report journaled as blocks, noted (JB5); None and no names when
    its state is small (it is made whole), None and the blocks it cannot read otherwise."""
    if len(sent.state_blocks.hashes) * blocks.BLOCK_BYTES <= blockforms.LISTED_BYTES:
        return None, []
    carried = {blocks.block_hash(block): block for block in sent.blocks}

    def checked(name: bytes) -> bytes | None:
        if (block := carried.get(name)) is not None:
            return block
        block = read(name)
        return block if block is not None and blocks.block_hash(block) == name else None

    block_list, missing = blockforms.streamed(tuple(sent.state_blocks.hashes), checked, sent.state_digest)
    if block_list is None or block_list.size <= blockforms.LISTED_BYTES:
        return None, missing
    listed = blockforms.listed_report(sent, block_list.hashes)
    note(listed, block_list)
    return listed, []
