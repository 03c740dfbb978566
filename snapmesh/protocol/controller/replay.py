"""The controller machine's start-up, pure: what a restart reads back, and what it files again.

At a restart the shell reads the disk and reports what it found, as two events on
the machine (`machine.Controller`): `loaded`, the finished snapshots in their
files (and which of each one's two files is not there), then `replayed`, the
journal. What follows from them is decided here and comes out as effects the
engine carries out in its one loop; the shell decides none of it. No clock, file
or thread here: `now` is an argument.

Rules
-----
S1. The journal read back is one event: finished snapshots are rebuilt, the epoch
    and every restore with its keys taken back (the machine's R4), and every snapshot
    still in progress gets a fresh deadline from `now` (the restart) and fails
    "controller restarted" unless its reports come in by then (the nodes send them
    again). Its `Replayed` names what it took back.
S2. A snapshot loaded from its file is not rebuilt from the journal: its records
    there are dead (Forget), and a file of it lost since (the compact one, the
    JSON export, or both) is written again (File, naming only those).
S3. A snapshot the journal finished that no file holds is filed (File, both files);
    its records go once its compact file is written (the machine's `filed`: Forget).
S4. Retention (the machine's K1) runs once over all the machine holds after the
    replay; what it retires is neither kept nor filed again, so --keep's deletions
    stay deleted (Retire, after S2's and S3's effects).

Effects out, in this order: S2's (per loaded snapshot kept, in id order: Forget,
then its File if a file is missing), S3's File (in the journal's order), S4's
Retire (in id order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from snapmesh.v1 import snapmesh_pb2 as pb

# By snapshot id: (compact file missing, JSON export missing); a snapshot not named has both.
Missing = Mapping[str, tuple[bool, bool]]


@dataclass(frozen=True, slots=True)
class File:
    """Write the snapshot's files: the compact one (the store of record) and the JSON export."""

    snapshot: pb.Snapshot
    compact: bool = True
    json: bool = True


@dataclass(frozen=True, slots=True)
class Forget:
    """The snapshot is in its file: its journal records need not survive the next rewrite."""

    snapshot_id: str


@dataclass(frozen=True, slots=True)
class Replayed:
    """What `Controller.replayed` took back from the journal (S1)."""

    finished: list[str]  # snapshots finished in the journal, rebuilt here and kept (S4): to be filed (S3)
    in_progress: list[str]  # snapshots still in progress: a fresh deadline from the restart, in id order
    warnings: list[str]  # records that did not fit
    filed: list[str] = field(default_factory=list)  # of those loaded from their files, the ones kept (S4), in id order


def taken_back(
    finished: list[str], in_progress: list[str], warnings: list[str], *, loaded: set[str], retired: list[str]
) -> Replayed:
    """S1's summary of a replay, without what retention retired (S4)."""
    gone = set(retired)
    return Replayed(
        finished=[sid for sid in finished if sid not in gone], in_progress=in_progress,
        warnings=warnings, filed=sorted(loaded - gone),
    )


def files(replayed: Replayed, missing: Missing, get: Callable[[str], pb.Snapshot]) -> list[File | Forget]:
    """S2 and S3: what the files and the journal need after `replayed` (`get`: a snapshot the machine holds)."""
    effects: list[File | Forget] = []
    for sid in replayed.filed:
        effects.append(Forget(sid))
        compact, json = missing.get(sid, (False, False))
        if compact or json:
            effects.append(File(get(sid), compact=compact, json=json))
    return effects + [File(get(sid)) for sid in replayed.finished]
