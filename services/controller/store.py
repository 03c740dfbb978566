"""Finished snapshots on disk, written off the reply path.

Two files per finished snapshot:

- `<data_dir>/controller/snapshots/<id>.pb`: the compact store of record, the
  Snapshot's protobuf bytes. The controller loads these on start.
- `<data_dir>/snapshots/<id>.json`: the proto JSON export (snake_case names) that
  the README, grpcurl users and the Spark job read. Same content; `export.py`
  renders it, and `python -m bench store` measures both.

Both are written by one background thread (`StoreWriter`), never on the way to
an answer: by the time a snapshot is handed to it, its outcome is already
durable in the journal (`journal.py`), which is what makes the answer safe. Each
file is written atomically (temporary file, fsync, rename, fsync of the
directory), so a crash leaves either no file or the whole file, and a missing
one is written again after the restart. Loading skips, with a warning naming the
file, anything it cannot read back.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from services.controller import export
from snapmesh.durable import write_atomically
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

FINISHED = (pb.Snapshot.COMPLETE, pb.Snapshot.FAILED)


def to_json(snapshot: pb.Snapshot) -> str:
    return export.snapshot_json(snapshot)


class SnapshotStore:
    def __init__(self, directory: Path, compact_directory: Path) -> None:
        self.directory = Path(directory)  # the JSON exports
        self.compact_directory = Path(compact_directory)

    def path(self, snapshot_id: str) -> Path:
        return self.directory / f"{snapshot_id}.json"

    def compact_path(self, snapshot_id: str) -> Path:
        return self.compact_directory / f"{snapshot_id}.pb"

    def save_compact(self, snapshot: pb.Snapshot) -> Path:
        return write_atomically(self.compact_path(snapshot.snapshot_id), snapshot.SerializeToString())

    def export_json(self, snapshot: pb.Snapshot) -> Path:
        return write_atomically(self.path(snapshot.snapshot_id), (to_json(snapshot) + "\n").encode("utf-8"))

    def load_all(self) -> tuple[list[pb.Snapshot], list[str]]:
        """Every readable finished snapshot, and one warning per file skipped.
        A snapshot with only a JSON file (a data dir from before the compact
        store) is read from that."""
        found: dict[str, pb.Snapshot] = {}
        warnings: list[str] = []
        for path in _listing(self.compact_directory, "*.pb"):
            try:
                snapshot = pb.Snapshot.FromString(path.read_bytes())
            except (OSError, DecodeError) as exc:
                warnings.append(f"skipping snapshot file {path}: cannot parse it: {exc}")
                continue
            if _check(snapshot, path, warnings):
                found[snapshot.snapshot_id] = snapshot
        for path in _listing(self.directory, "*.json"):
            if path.stem in found:
                continue
            try:
                snapshot = json_format.Parse(path.read_text(encoding="utf-8"), pb.Snapshot())
            except (OSError, UnicodeDecodeError, json_format.ParseError) as exc:
                warnings.append(f"skipping snapshot file {path}: cannot parse it: {exc}")
                continue
            if _check(snapshot, path, warnings):
                found[snapshot.snapshot_id] = snapshot
        return [found[k] for k in sorted(found)], warnings

    def load(self, snapshot_id: str) -> pb.Snapshot | None:
        """One filed snapshot from its compact file; None when there is none
        (or it cannot be read)."""
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            return None
        try:
            return pb.Snapshot.FromString(self.compact_path(snapshot_id).read_bytes())
        except (OSError, DecodeError):
            return None

    def filed_ids(self) -> list[str]:
        """The ids of every snapshot with a compact file, sorted."""
        return sorted(p.stem for p in _listing(self.compact_directory, "*.pb"))

    def missing_files(self, snapshot_id: str) -> tuple[bool, bool]:
        """(compact missing, JSON missing) for one snapshot."""
        return not self.compact_path(snapshot_id).exists(), not self.path(snapshot_id).exists()


def _listing(directory: Path, pattern: str) -> list[Path]:
    return sorted(directory.glob(pattern)) if directory.is_dir() else []


def _check(snapshot: pb.Snapshot, path: Path, warnings: list[str]) -> bool:
    if snapshot.snapshot_id != path.stem:
        warnings.append(
            f"skipping snapshot file {path}: it holds snapshot_id {snapshot.snapshot_id!r}, not {path.stem!r}"
        )
        return False
    if snapshot.status not in FINISHED:
        known = snapshot.status in pb.Snapshot.Status.values()
        status = pb.Snapshot.Status.Name(snapshot.status) if known else snapshot.status
        warnings.append(f"skipping snapshot file {path}: status {status} is not COMPLETE or FAILED")
        return False
    return True


def past_retention(snapshots: list[pb.Snapshot], keep: int, protect: str = "") -> list[str]:
    """Retention (`--keep N`): the finished snapshots older than the `keep` newest
    COMPLETE ones (ids sort in start order), except `protect` (the one last
    restored). Nothing goes until `keep` COMPLETE snapshots are newer."""
    complete = sorted(s.snapshot_id for s in snapshots if s.status == pb.Snapshot.COMPLETE)
    if keep < 1 or len(complete) <= keep:
        return []
    oldest_kept = complete[-keep]
    return sorted(
        s.snapshot_id for s in snapshots
        if s.status in FINISHED and s.snapshot_id < oldest_kept and s.snapshot_id != protect
    )


class StoreWriter:
    """One background thread writing finished snapshots: the compact file, then
    `on_filed(id)` (its journal records may go), then the JSON export."""

    def __init__(self, store: SnapshotStore, on_filed: Callable[[str], None]) -> None:
        self.store = store
        self._on_filed = on_filed
        self._queue: queue.SimpleQueue[tuple[pb.Snapshot, bool, bool] | str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="controller-store", daemon=True)
        self._thread.start()

    def submit(self, snapshot: pb.Snapshot, *, compact: bool = True, json: bool = True) -> None:
        self._queue.put((snapshot, compact, json))

    def discard(self, snapshot_id: str) -> None:
        """Delete the snapshot's files (retention), after whatever was submitted before."""
        self._queue.put(snapshot_id)

    def close(self) -> None:
        """Write everything submitted so far, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, str):
                for path in (self.store.compact_path(item), self.store.path(item)):
                    path.unlink(missing_ok=True)
                log.info("snapshot %s: files deleted (retention)", item)
                continue
            snapshot, compact, json = item
            sid = snapshot.snapshot_id
            try:
                if compact:
                    self.store.save_compact(snapshot)
                    self._on_filed(sid)
                if json:
                    self.store.export_json(snapshot)
            except OSError as exc:
                log.error("cannot write snapshot %s: %s (the journal still holds it)", sid, exc)
