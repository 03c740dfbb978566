"""The controller's blocks on disk: `<data_dir>/controller/blocks/<hex>`, each block once.

A block file's name is the SHA-256 of its content (snapmesh/protocol/blocks.py), so a
block is written only when no file has its name yet, and a file is never
rewritten. A new block goes to a temporary file, is fsynced and renamed; the
directory is fsynced once per `write` before it returns, so the blocks a manifest
names are durable before the manifest is written (services/controller/store.py).
An incremental snapshot thus pays one fsync per changed block, and only the first
snapshot of a state pays one per block. A crash leaves at most a temporary file
(`.<hex>.tmp`, removed by `sweep`) and blocks no manifest names (garbage, removed by
`sweep` at start: snapmesh/protocol/controller/blockrefs.py G3).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from snapmesh.serving.durable import fsync_dir


class BlockDir:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, name: bytes) -> Path:
        return self.directory / name.hex()

    def read(self, name: bytes) -> bytes | None:
        """The content of block `name` as stored (None: there is no such file)."""
        try:
            return self.path(name).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, blocks: dict[bytes, bytes]) -> tuple[int, int]:
        """Every block of `blocks` (hash -> content) that has no file yet, durably:
        (blocks written, their bytes). A file of the right name and size is taken as
        the block (a corrupt one is what `snapmesh snapshot verify` names)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        written = size = 0
        for name, block in blocks.items():
            path = self.path(name)
            try:
                if path.stat().st_size == len(block):
                    continue
            except FileNotFoundError:
                pass
            tmp = path.with_name(f".{path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            written += 1
            size += len(block)
        if written:
            fsync_dir(self.directory)
        return written, size

    def delete(self, names: Iterable[bytes]) -> int:
        """Remove the files of `names` (those there); how many were removed."""
        removed = 0
        for name in names:
            try:
                self.path(name).unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def names(self) -> set[bytes]:
        """Every block on disk (temporary files left out)."""
        if not self.directory.is_dir():
            return set()
        found = set()
        for entry in os.scandir(self.directory):
            if not entry.name.startswith("."):
                try:
                    found.add(bytes.fromhex(entry.name))
                except ValueError:
                    continue
        return found

    def sweep(self, keep: set[bytes]) -> int:
        """Remove every block not in `keep` and every temporary file (at start,
        before anything is filed); how many blocks were removed."""
        if not self.directory.is_dir():
            return 0
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                Path(entry.path).unlink(missing_ok=True)
        return self.delete(self.names() - keep)
