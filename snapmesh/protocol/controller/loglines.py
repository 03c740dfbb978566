"""What the controller's log says of an effect, decided: its level and its words.

The engine logs what `of` returns as it carries an effect out, and the process
what `loaded` and `replayed` return as it starts; the words are users' (scripts
and tests grep them), so they change only on purpose.
"""

from __future__ import annotations

from snapmesh.protocol.appstate import carries_v1
from snapmesh.protocol.controller.effects import AbortAt, Call, Effect, Finished, RestoreDone
from snapmesh.protocol.controller.refusals import TooManySnapshots
from snapmesh.protocol.controller.replay import Replayed
from snapmesh.protocol.retry import Failed
from snapmesh.protocol.controller.tracker import COMPLETE, duration_s
from snapmesh.v1 import snapmesh_pb2 as pb


def of(effect: Effect) -> tuple[str, str] | None:
    """(a logging level's name, the line) for a finished snapshot or restore; None for another effect."""
    if isinstance(effect, Finished):
        snapshot = effect.snapshot
        if snapshot.status != COMPLETE:
            return "WARNING", f"snapshot {snapshot.snapshot_id} FAILED: {snapshot.reason}"
        took = f"snapshot {snapshot.snapshot_id} COMPLETE in {duration_s(snapshot):.3f}s"
        if not carries_v1(snapshot):  # an app's own words: its invariants
            return "INFO", f"{took}: {snapshot.reason or 'invariants hold'}"
        verdict = "conserved" if snapshot.conserved else f"NOT conserved ({snapshot.reason})"
        return "INFO", f"{took}: total {snapshot.total}, {verdict}"
    if isinstance(effect, RestoreDone):
        restore = effect.restore
        if restore.status == pb.Restore.FAILED:
            return "ERROR", f"restore of {restore.snapshot_id}: {restore.reason}"
        return "INFO", f"restored {restore.snapshot_id} in epoch {restore.epoch}"
    return None


def called(effect: Call, answer: object) -> tuple[str, str] | None:
    """The line for an AbortSnapshot given up on (the node drops the recording at its own
    deadline); None for any other call's answer (the machine takes those: `called`)."""
    if isinstance(effect, AbortAt) and isinstance(answer, Failed):
        return "INFO", f"AbortSnapshot {effect.snapshot_id} at {effect.node}: {answer.code}"
    return None


Line = tuple[str, str]  # a logging level's name, the words


def loaded(count: int, directory: str, warnings: list[str]) -> list[Line]:
    """The lines of the snapshot files read at a start: what did not load, then how many did (if any)."""
    lines = [("WARNING", warning) for warning in warnings]
    if count:
        lines.append(("INFO", f"loaded {count} finished snapshot(s) from {directory}"))
    return lines


def replayed(taken: Replayed, warnings: list[str]) -> list[Line]:
    """The lines of the journal read back at a start (`warnings`: the file's own, before
    the machine's): what did not fit, then what was taken back (if anything)."""
    lines = [("WARNING", warning) for warning in (*warnings, *taken.warnings)]
    if taken.finished or taken.in_progress:
        lines.append(("INFO", (
            f"journal: {len(taken.finished)} finished snapshot(s) rebuilt, {len(taken.in_progress)} still in "
            f"progress taken back ({', '.join(taken.in_progress) or 'none'})"
        )))
    return lines


def skipped(error: Exception) -> tuple[str, str]:
    """The line for a periodic snapshot not started: at the admission limit a
    skipped tick (the next one tries again), else a start not journaled (OSError)."""
    if isinstance(error, TooManySnapshots):
        return "WARNING", f"periodic snapshot skipped: {error}"
    return "ERROR", f"periodic snapshot: {error}"
