"""Read a node's active log segment from disk and rebuild its state.

The file side only: find the active segment (finishing a seal a crash
interrupted), cut off a torn last line, parse each line with `snapmesh.protocol.wal`
and hand the records to the pure `snapmesh.protocol.node.recovery.recover`, which the
simulator runs too. Sealed segments (`<node>.log.<first lsn>.jsonl`) are never
read here: the active one opens with a checkpoint holding everything before.

A log that cannot be trusted stops the node: `CorruptLogError` names the file
and the line, and the file is left alone for a human. The one damage that is
expected is a torn last line (a crash in the middle of a write, which was
therefore never acknowledged): it is cut off with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from snapmesh.app import App, named_object
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.apphost import Host
from snapmesh.protocol import wal
from snapmesh.protocol.node.recovery import Recovered

log = logging.getLogger(__name__)


class CorruptLogError(ValueError):
    """The log is damaged beyond a torn last line; the message is `file:line: problem`."""


class NonDeterministicError(CorruptLogError):
    """A replay through the app sent other messages than the log holds; the message names the file:line and lsn,
    and the likely cause (`diagnose`)."""


class OtherVersionError(CorruptLogError):
    """The log holds records of another version of the app than the code's; the message names both and the ways on."""


def next_path(path: Path) -> Path:
    """Where a seal writes the next segment's checkpoint before renaming it active."""
    return path.with_name(path.name + ".next")


def finish_interrupted_seal(path: Path) -> None:
    """A crash during a seal leaves `<active>.next`. If the active segment is still
    there, the seal never happened (drop the next file); if it was already renamed
    to its sealed name, the next file becomes the active segment."""
    pending = next_path(path)
    if not pending.exists():
        return
    if path.exists():
        log.warning("%s: an interrupted seal left %s; removing it", path, pending.name)
        pending.unlink()
    else:
        log.warning("%s: finishing an interrupted seal (%s becomes the active segment)", path, pending.name)
        os.replace(pending, path)


def recover(
    path: Path,
    node_id: str,
    *,
    incoming: tuple[str, ...],
    outgoing: tuple[str, ...],
    repair: bool = True,
    app: App | None = None,
    app_params: Mapping[str, Any] = MappingProxyType({}),
) -> Recovered:
    """Read the active segment at `path` (a missing or empty file means a fresh
    node). With `repair`, a torn last line is truncated and an interrupted seal
    finished, in place. With `app`, the logged inputs replay through it (None: the bank)."""
    if repair:
        finish_interrupted_seal(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    lines, torn_at = wal.split_lines(data, str(path))
    if torn_at is not None:
        log.warning(
            "%s:%d: torn last line (%d bytes, a crash mid-write): truncating it",
            path,
            len(lines) + 1,
            len(data) - torn_at,
        )
        if repair:
            with open(path, "r+b") as handle:
                handle.truncate(torn_at)
                handle.flush()
                os.fsync(handle.fileno())
    try:
        records = [(where, wal.parse(raw, where, node_id=node_id)) for where, raw in lines]
        old = old_logs(app)
        if old is not None and old.written_by(records):  # a log of an older shape: the app maps it, once
            host = Host(app, node_id=node_id, incoming=incoming, outgoing=outgoing, params=app_params)
            return old.recover(records, node_id=node_id, incoming=incoming, outgoing=outgoing, host=host)
        return recovery.recover(
            records, node_id=node_id, incoming=incoming, outgoing=outgoing,
            app=app, app_params=app_params,
        )
    except recovery.NonDeterministic as exc:
        assert app is not None  # only a replay through an app diverges
        from_checkpoint = bool(records) and type(records[0][1]) is wal.Checkpoint
        raise NonDeterministicError(
            diagnose(exc, path, node_id, app, incoming, outgoing, app_params, from_checkpoint)
        ) from None
    except recovery.OtherVersion as exc:
        raise OtherVersionError(str(exc)) from None
    except (wal.CorruptRecord, recovery.CorruptLog) as exc:
        raise CorruptLogError(str(exc)) from None


def old_logs(app: App | None) -> Any:
    """The reader of older logs `app` names (`App.old_logs`, "module:attr"), imported by name
    (the shell knows no app); None when it names none. One that does not load is CorruptLogError."""
    if app is None or not app.old_logs:
        return None
    try:
        reader = named_object(app.old_logs)
    except Exception as exc:  # the app's own code: one line, the node does not start
        raise CorruptLogError(f"app {app.name!r}: its old_logs {app.old_logs!r} does not load: "
                              f"{type(exc).__name__}: {exc}") from exc
    return reader


def whole_log(directory: Path, node_id: str) -> list[tuple[str, wal.Record]] | None:
    """Every record of `node_id`'s log in `directory`, sealed segments then the
    active one, if it still holds its start (an init at lsn 1); else None."""
    names = os.listdir(directory)
    records: list[tuple[str, wal.Record]] = []
    for name in wal.segment_order(names, node_id):
        lines, _ = wal.split_lines((directory / name).read_bytes(), str(directory / name))
        records += [(where, wal.parse(raw, where, node_id=node_id)) for where, raw in lines]
    if not records or type(records[0][1]) is not wal.Init or records[0][1].lsn != 1:
        return None
    return records


def diagnose(
    diverged: recovery.NonDeterministic, path: Path, node_id: str, app: App, incoming: tuple[str, ...],
    outgoing: tuple[str, ...], app_params: Mapping[str, Any], from_checkpoint: bool,
) -> str:
    """The refusal's one line: the divergence and its likely cause (recovery.cause). A replay
    that diverged from a checkpoint is tried again from the log's start, if the log still holds it."""
    from_start: recovery.NonDeterministic | None | bool = False
    if from_checkpoint:
        try:
            records = whole_log(path.parent, node_id)
            if records is not None:
                from_start = recovery.replay_inputs(
                    records, node_id=node_id, incoming=incoming, outgoing=outgoing, app=app, app_params=app_params
                )
        except (OSError, wal.CorruptRecord, recovery.CorruptLog) as exc:  # the diagnosis only: say the first line
            log.warning("%s: cannot replay the log from its start to name the cause: %s", path, exc)
    return recovery.cause(diverged, from_checkpoint=from_checkpoint, from_start=from_start, version=app.version)
