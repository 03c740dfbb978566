"""Reports journaled as their manifest's change, pure: how they are read back and rewritten.

A report whose manifest came as its change from an earlier report of the node
(snapmesh/protocol/manifestdelta.py MD1) is journaled as it came, as one that
came as blocks is (journalblocks.py JB1): its change, naming its base, and the
blocks it carries. The record then costs the journal what changed, not 262 KB
of names at 64 MiB a node.

JC1. A change's base is the record of the same node's report of the base
    snapshot, earlier in the same journal file: the controller takes a manifest
    as a base only once its report's own record is durable (servicer.py: a
    report that was not journaled, a repeat or one dropped with its FAILED
    snapshot, is answered takes_changes=False), and a change whose base's records
    the file no longer holds (a rewrite dropped them, its snapshot filed) is
    written in full form instead (JC3).
JC2. Read back (`expanded`), before anything else reads the records (the blocks'
    write-back and rebuild, JB3, and the replay): each change record becomes the
    record of the same report with its full manifest, in journal order, from its
    base's manifest: the base record's `sent` manifest (itself expanded first), or
    for a base journaled whole its state cut as the node cut it (blocks.names by
    its state_parts, blocks.py B6). A change whose base is not there, or does not
    fit it (MD2), takes every record of its snapshot with it, with one warning
    naming the snapshot, the node and the base, as JB3 does for a block gone.
JC3. A rewrite writes each live change record in its full form (journal.py
    ChangeFrame, `whole_frame`), and so does an append whose base's records are
    no longer in the file (LiveFrames.take): the report as the controller holds it,
    its listed manifest with the blocks the change carried (JB1: its record makes
    them durable, blockdir.py D8), or its small state whole. A record read back is
    written so too. So no record in the file needs one the file no longer holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from snapmesh.protocol import blocks, manifestdelta
from snapmesh.protocol.controller.journal import Record, Reported
from snapmesh.v1 import snapmesh_pb2 as pb


def expanded(records: Sequence[Record]) -> tuple[list[Record], dict[str, str]]:
    """`records`, each change record in its full form (JC2), one for one and in order, and
    the snapshots whose change could not be expanded, each with its warning (`kept` drops them)."""
    bases: dict[tuple[str, str], Reported] = {}  # (node, snapshot) -> its report's record, expanded
    out: list[Record] = []
    gone: dict[str, str] = {}
    for record in records:
        if isinstance(record, Reported):
            sent = record.sent
            if sent is not None and sent.HasField("state_change"):
                record, why = _expanded(record, sent, bases)
                if why:
                    gone.setdefault(sent.snapshot_id, f"journal: dropping snapshot {sent.snapshot_id}: {why}")
            bases[(record.state.node_id, record.snapshot_id)] = record
        out.append(record)
    return out, gone


def kept(records: Sequence[Record], gone: Mapping[str, str]) -> list[Record]:
    """`records` without those of the snapshots `expanded` gave up on (JC2)."""
    return [record for record in records if record.snapshot_id not in gone]


def _expanded(record: Reported, sent: pb.FullState, bases: dict[tuple[str, str], Reported]) -> tuple[Reported, str]:
    delta = sent.state_change
    base = bases.get((sent.node_id, delta.base_snapshot_id))
    where = f"the report of {sent.node_id} is a change from its report of snapshot {delta.base_snapshot_id!r}"
    if base is None:
        return record, f"{where}, which the journal does not hold"
    try:
        names = manifestdelta.applied(delta, manifest(base))
    except manifestdelta.BadChange as exc:
        return record, f"{where}, which it does not fit: {exc}"
    full = pb.FullState()
    full.CopyFrom(sent)
    full.ClearField("state_change")
    full.state_blocks.hashes.extend(names)
    return Reported(state=full, wall=record.wall, sent=full), ""


def manifest(record: Reported) -> list[bytes]:
    """The manifest of a report's record: as journaled, or its whole state cut as its node cut it (JC2)."""
    if record.sent is not None:
        return list(record.sent.state_blocks.hashes)
    state = record.state
    if not state.HasField("state") or not state.state:
        return []
    return blocks.names(state.state, state.state_parts)[0].names

