"""The blocks of a node's pending reports, each kept once: `<reports dir>/blocks/<hex>`.

A pending report (reporter.py `PendingReports`) of a large state was a whole
copy of it, written and synced at every snapshot: 64 MiB for 64 KiB changed,
on the report's path. Now the file of a state of more than INLINE_BYTES holds
its manifest (`FullState.state_blocks`, no `state`), and its blocks are files
named by their SHA-256 (snapmesh/protocol/blocks.py), written only when no
file has that name yet: a report writes the blocks that changed since the last.

Rules:
RK1. A report's blocks are written (in place, unsynced) before its manifest file,
    in the same log round, whose one sync makes both durable (translog.py); the
    paths written are the round's to sync where there is no syncfs. A crash
    before that sync loses the report as a crash lost the whole file before:
    `load` drops a manifest whose blocks are not all there, or not as named,
    with a warning. In place, not a temporary file renamed: a block file cut
    short by a crash is named by no manifest (the save that wrote it had not
    written its own yet, and an earlier one's blocks are on disk and never
    written again), so `sweep` deletes it at load; and a rename per block made
    the first report of a large state (8192 blocks at 64 MiB) take seconds on
    its path.
RK2. A block no pending report names and that is not of the last state saved is
    garbage: a save finds it, and `collect` deletes it, after the save's round
    (the reporter's, in a thread: an unlink is I/O, tens of them a report, and the
    round is on the report's path); `sweep` deletes it at load. The last state's
    blocks stay, so the next report's unchanged ones are not written again. A save
    and `collect` take one lock, and `collect` deletes only a block still garbage
    under it, a name at a time: a block a later save names again is kept, never
    deleted under it, and a save waits for one unlink at most.
RK3. A state is rebuilt only through its blocks' names: each block file read is
    checked against its name.
RK4. The hashes of the last state saved are reused for the next one's blocks that
    did not change (blocks.py B5: compared at memory speed, not hashed); a state
    the node's cut named already (snapmesh/protocol/node/cutnames.py) is neither.
RK5. A state the node's cut kept as its blocks (a BlockState, node/apphost.py H8) is
    saved from them: each new block written is the block itself (blockstate.BST2),
    and the state is never joined or copied whole for its save.
RK6. A save follows what changed, not the state's size: the blocks it writes are
    found among those whose name differs from the last state's at the same index
    (every block of the last state has its file: RK2 keeps them), and the garbage
    among the last state's blocks that changed, the blocks of the reports forgotten
    since the last save and the garbage not yet deleted; each kept out if the new
    state or a pending report names it (the same set as "every file minus what is
    kept", RK2, reached without a set of every block the last state and the pending
    reports name). A state of another number of blocks is compared by sets.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from itertools import compress
from operator import ne
from pathlib import Path

from snapmesh.protocol import blocks
from snapmesh.protocol.blockstate import BlockState
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

INLINE_BYTES = 64 * 1024  # a state up to this size stays in its report's file


class ReportBlocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._on_disk: set[bytes] = set()  # written by a save of this process, or found by `sweep`
        self._named: dict[str, frozenset[bytes]] = {}  # pending report -> its blocks (RK2)
        self._last: blocks.Named | None = None  # the last state saved (RK2, RK4)
        self.hashed = 0  # blocks hashed in all (the others' hashes were reused, RK4)
        self._garbage: set[bytes] = set()  # on disk and needed by nothing: `collect`'s (RK2)
        self._last_set: frozenset[bytes] | None = None  # the last state's names, as `_named` holds them (RK6)
        self._forgotten: list[frozenset[bytes]] = []  # the blocks of reports forgotten since the last save (RK6)
        self._lock = threading.Lock()  # a save, and each of `collect`'s deletes (RK2)

    def path(self, name: bytes) -> Path:
        return self.directory / name.hex()

    def save(
        self, snapshot_id: str, state: bytes | BlockState, parts: tuple[int, ...], made: blocks.Named | None = None,
    ) -> tuple[blocks.Named, list[Path]]:
        """Write the blocks of `state` (cut into `parts`) that have no file yet (RK1),
        then delete those nothing needs now (RK2): the state cut and named (`made`: as
        the node's cut named it, taken as it is, RK4), and the files written."""
        with self._lock:
            return self._save(snapshot_id, state, parts, made)

    def _save(
        self, snapshot_id: str, state: bytes | BlockState, parts: tuple[int, ...], made: blocks.Named | None,
    ) -> tuple[blocks.Named, list[Path]]:
        named, hashed = blocks.names(state, parts, self._last, made)
        self.hashed += hashed
        written: list[Path] = []
        # RK5: a state held as its blocks is read a block at a time (the block itself), never joined
        whole = named.state
        view = whole if type(whole) is BlockState else memoryview(whole)
        directory = str(self.directory)
        on_disk, names, bounds = self._on_disk, named.names, named.bounds
        last, last_set = self._last, self._last_set
        # RK6: the blocks that differ from the last state's at their index (the others have files)
        changed: Iterable[int] = range(len(names)) if last is None or len(last.names) != len(names) \
            else list(compress(range(len(names)), map(ne, names, last.names)))
        for i in changed:
            name = names[i]
            if name in on_disk:  # its file is there (an older state's), or a block twice in this state
                continue
            if not written:
                self.directory.mkdir(parents=True, exist_ok=True)
            start, end = bounds[i]
            written.append(_write_in_place(f"{directory}/{name.hex()}", memoryview(view[start:end])))
            on_disk.add(name)
        kept = self._last_set = frozenset(names)
        self._named[snapshot_id] = kept
        self._last = named
        # RK6: what may have stopped being needed since the last save: the last state's blocks
        # this one changed, the blocks of the reports forgotten since, and what was garbage
        forgotten, self._forgotten = self._forgotten, []
        if last_set is None or type(changed) is range:
            candidates = set(self._garbage) if last_set is None else self._garbage | (last_set - kept)
        else:
            candidates = self._garbage | {last.names[i] for i in changed}  # type: ignore[union-attr]
        for old in forgotten:
            if old is not last_set:  # the last state's: its changed blocks are in already
                candidates |= old - kept
        pending = list(self._named.values())  # `forget` may run on the loop meanwhile
        self._garbage = {name for name in candidates
                         if name in on_disk and name not in kept and not any(name in held for held in pending)}
        return named, written

    @property
    def garbage(self) -> int:
        """How many blocks `collect` would delete now."""
        return len(self._garbage)

    def collect(self) -> int:
        """Delete the blocks that are garbage (RK2), each under the lock and only while
        still garbage; how many were deleted. Any thread; never the round's."""
        deleted = 0
        with self._lock:
            names = list(self._garbage)
        for name in names:
            with self._lock:
                if name not in self._garbage:
                    continue
                self._garbage.discard(name)
                deleted += self._delete({name})
        return deleted

    def forget(self, snapshot_id: str) -> None:
        """The report of `snapshot_id` is no longer pending: its blocks go at the next save
        unless the last state or another pending report names them (RK2)."""
        names = self._named.pop(snapshot_id, None)
        if names is not None:
            self._forgotten.append(names)  # RK6: the next save looks at them

    def state(self, names: list[bytes]) -> tuple[bytes | None, str]:
        """The state the blocks `names` make (RK3), or None and why not."""
        parts = []
        for name in names:
            try:
                block = self.path(name).read_bytes()
            except FileNotFoundError:
                return None, f"block sha256:{name.hex()} is missing"
            if blocks.block_hash(block) != name:
                return None, f"block sha256:{name.hex()} does not hash to its name"
            parts.append(block)
        return b"".join(parts), ""

    def sweep(self, pending: dict[str, list[bytes]]) -> None:
        """At load: `pending` (snapshot id -> its blocks) are the reports found; every
        other block file, and any temporary one a crash left, goes (RK2)."""
        self._named = {sid: frozenset(names) for sid, names in pending.items()}
        self._on_disk, self._garbage, self._forgotten = set(), set(), []
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            try:
                name = bytes.fromhex(path.name)
            except ValueError:
                path.unlink(missing_ok=True)  # a temporary file: never renamed into place
                continue
            self._on_disk.add(name)
        self._delete(self._on_disk - self._kept())

    def _kept(self) -> set[bytes]:
        kept = set(self._last.names) if self._last is not None else set()
        for names in list(self._named.values()):  # `forget` may run on the loop meanwhile
            kept.update(names)
        return kept

    def _delete(self, names: set[bytes]) -> int:
        deleted = 0
        for name in names:
            try:
                os.unlink(self.path(name))
                deleted += 1
            except FileNotFoundError:
                pass
            except OSError as exc:  # garbage until the next sweep
                log.warning("%s: cannot delete an unused block of a pending report: %s", self.path(name), exc)
                continue
            self._on_disk.discard(name)
        return deleted


def _write_in_place(path: str, data: memoryview) -> Path:
    """`data` as the file `path`, unsynced and in place (RK1): the round syncs it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return Path(path)


def manifest(message: pb.FullState, names: list[bytes]) -> pb.FullState:
    """`message` with its state as the manifest of its blocks (what the report's file holds)."""
    out = blocks.without_state(message)  # not a copy of the state only to clear it
    out.state_blocks.hashes.extend(names)
    return out
