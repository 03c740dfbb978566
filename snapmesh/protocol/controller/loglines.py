"""What the controller's log says of an effect, decided: its level and its words.

The engine logs what `of` returns as it carries an effect out; the words are
users' (scripts and tests grep them), so they change only on purpose.
"""

from __future__ import annotations

from snapmesh.protocol.controller.effects import AbortAt, Call, Effect, Finished, RestoreDone
from snapmesh.protocol.controller.refusals import TooManySnapshots
from snapmesh.protocol.retry import Failed
from snapmesh.protocol.controller.tracker import COMPLETE, duration_s
from snapmesh.v1 import snapmesh_pb2 as pb


def of(effect: Effect) -> tuple[str, str] | None:
    """(a logging level's name, the line) for a finished snapshot or restore; None for another effect."""
    if isinstance(effect, Finished):
        snapshot = effect.snapshot
        if snapshot.status != COMPLETE:
            return "WARNING", f"snapshot {snapshot.snapshot_id} FAILED: {snapshot.reason}"
        verdict = "conserved" if snapshot.conserved else f"NOT conserved ({snapshot.reason})"
        return "INFO", (
            f"snapshot {snapshot.snapshot_id} COMPLETE in {duration_s(snapshot):.3f}s: total {snapshot.total}, {verdict}"
        )
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


def skipped(error: Exception) -> tuple[str, str]:
    """The line for a periodic snapshot not started: at the admission limit a
    skipped tick (the next one tries again), else a start not journaled (OSError)."""
    if isinstance(error, TooManySnapshots):
        return "WARNING", f"periodic snapshot skipped: {error}"
    return "ERROR", f"periodic snapshot: {error}"
