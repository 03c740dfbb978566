"""Finished snapshots on disk: `<dir>/<snapshot_id>.json`, proto JSON, snake_case.

Each file is written atomically (temporary file, fsync, rename, fsync of the
directory), so a crash leaves either the old state or the new, never half a file.
Loading skips, with a warning naming the file, anything it cannot read back.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from google.protobuf import json_format

from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

FINISHED = (pb.Snapshot.COMPLETE, pb.Snapshot.FAILED)


def to_json(snapshot: pb.Snapshot) -> str:
    return json_format.MessageToJson(
        snapshot, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


class SnapshotStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, snapshot_id: str) -> Path:
        return self.directory / f"{snapshot_id}.json"

    def save(self, snapshot: pb.Snapshot) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path(snapshot.snapshot_id)
        tmp = final.with_name(f".{final.name}.tmp")
        data = (to_json(snapshot) + "\n").encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return final

    def load_all(self) -> tuple[list[pb.Snapshot], list[str]]:
        """Every readable finished snapshot, and one warning per file skipped."""
        snapshots: list[pb.Snapshot] = []
        warnings: list[str] = []
        if not self.directory.is_dir():
            return snapshots, warnings
        for path in sorted(self.directory.glob("*.json")):
            try:
                snapshot = json_format.Parse(path.read_text(encoding="utf-8"), pb.Snapshot())
            except (OSError, UnicodeDecodeError, json_format.ParseError) as exc:
                warnings.append(f"skipping snapshot file {path}: cannot parse it: {exc}")
                continue
            if snapshot.snapshot_id != path.stem:
                warnings.append(
                    f"skipping snapshot file {path}: it holds snapshot_id {snapshot.snapshot_id!r}, not {path.stem!r}"
                )
                continue
            if snapshot.status not in FINISHED:
                known = snapshot.status in pb.Snapshot.Status.values()
                status = pb.Snapshot.Status.Name(snapshot.status) if known else snapshot.status
                warnings.append(f"skipping snapshot file {path}: status {status} is not COMPLETE or FAILED")
                continue
            snapshots.append(snapshot)
        return snapshots, warnings
