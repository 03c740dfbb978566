"""The blocks of a node's pending reports, each kept once: `<reports dir>/blocks/<hex>`.

A pending report (pendingreports.py `PendingReports`) of a large state was a whole
copy of it, written and synced at every snapshot: 64 MiB for 64 KiB changed,
on the report's path. Now the file of a state of more than INLINE_BYTES holds
its manifest (`FullState.state_blocks`, no `state`), and its blocks are files
named by their SHA-256 (snapmesh/protocol/blocks.py), written only when no
file has that name yet: a report writes the blocks that changed since the last.

Rules:
RK1. A report's new blocks are carried in its own file (snapmesh/protocol/savedblocks.py
    SV1-SV3), which the save writes (a temporary file, its fdatasync, the rename, the
    directory's fsync) before the round writes the records it rests on: the round
    syncs nothing else for it (no syncfs(2), which waited for every process's dirty
    pages). `collect` then writes them here in place and syncs them, off the report's
    path; only then do later saves stop carrying them (SV2). A block file cut short by
    a crash is either named by no report (swept at load) or carried by one (written
    whole again at load, SV3); RK3 checks every block read all the same. In place, not
    a temporary file renamed: a rename per block made the first report of a large
    state (8192 blocks at 64 MiB) take seconds.
RK2. A block no pending report names and that is not of the last state saved is
    garbage: a save finds it, and `collect` deletes it (and writes the carried
    blocks, RK1), after the save's round
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
RK7. The manifest's encoding (its `state_blocks` field, 34 bytes a name) is kept from
    the last save and patched where names changed: encoding 8,192 names afresh for
    each report's file cost ~0.5 ms at 64 MiB, whatever changed. A state of another
    number of blocks, or after a save that failed half way, is encoded whole.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from itertools import compress
from operator import ne
from pathlib import Path

from snapmesh.protocol import blocks, savedblocks
from snapmesh.protocol.blockstate import BlockState
from snapmesh.serving.durable import sync_renamed
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

INLINE_BYTES = 64 * 1024  # a state up to this size stays in its report's file
# RK7: the encodings of a StateBlocks' 32-byte hash (its field's tag and length) and of FullState.state_blocks' tag
_ENTRY = pb.StateBlocks(hashes=[bytes(32)]).SerializeToString()[:-32]
_ENTRY_BYTES = len(_ENTRY) + 32
_STATE_BLOCKS_TAG = pb.FullState(state_blocks=pb.StateBlocks(hashes=[b"x"])).SerializeToString()[:-4]


class ReportBlocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # written whole and synced (by `collect`, or found and synced by `sweep`): never carried (SV1)
        self._on_disk: set[bytes] = set()
        self._named: dict[str, frozenset[bytes]] = {}  # pending report -> its blocks (RK2)
        self._last: blocks.Named | None = None  # the last state saved (RK2, RK4)
        self.hashed = 0  # blocks hashed in all (the others' hashes were reused, RK4)
        self._garbage: set[bytes] = set()  # on disk and needed by nothing: `collect`'s (RK2)
        self._last_set: frozenset[bytes] | None = None  # the last state's names, as `_named` holds them (RK6)
        self._forgotten: list[frozenset[bytes]] = []  # the blocks of reports forgotten since the last save (RK6)
        self._lock = threading.Lock()  # a save, and each of `collect`'s deletes (RK2)
        self._entries: bytearray | None = None  # RK7: the last state's names as StateBlocks encodes them
        # carried by a save's file, not yet durable here: name -> the block, until `collect` syncs it (SV2)
        self._unsettled: dict[bytes, bytes | memoryview] = {}

    def path(self, name: bytes) -> Path:
        return self.directory / name.hex()

    def save(
        self, snapshot_id: str, state: bytes | BlockState, parts: tuple[int, ...], made: blocks.Named | None = None,
    ) -> tuple[blocks.Named, list[tuple[bytes, bytes | memoryview]]]:
        """The blocks of `state` (cut into `parts`) its report's file carries (RK1, SV1),
        and those nothing needs now found (RK2): the state cut and named (`made`: as
        the node's cut named it, taken as it is, RK4), and the carried (name, block)s."""
        with self._lock:
            return self._save(snapshot_id, state, parts, made)

    def _save(
        self, snapshot_id: str, state: bytes | BlockState, parts: tuple[int, ...], made: blocks.Named | None,
    ) -> tuple[blocks.Named, list[tuple[bytes, bytes | memoryview]]]:
        named, hashed = blocks.names(state, parts, self._last, made)
        self.hashed += hashed
        # RK5: a state held as its blocks is read a block at a time (the block itself), never joined
        whole = named.state
        view = whole if type(whole) is BlockState else memoryview(whole)
        names, bounds = named.names, named.bounds
        last, last_set = self._last, self._last_set
        # RK6: the blocks that differ from the last state's at their index (the others are durable or unsettled)
        changed: Iterable[int] = range(len(names)) if last is None or len(last.names) != len(names) \
            else list(compress(range(len(names)), map(ne, names, last.names)))
        kept = frozenset(names)
        new, again = savedblocks.carried(names, changed, self._on_disk, self._unsettled, kept)
        unsettled = self._unsettled
        carried: list[tuple[bytes, bytes | memoryview]] = [(name, unsettled[name]) for name in again]
        for i in new:
            start, end = bounds[i]
            block = view[start:end]  # a BlockState's block itself (BST2), else a view of the state
            carried.append((names[i], block))
            unsettled[names[i]] = block
        on_disk = self._on_disk
        self._last_set = kept
        self._named[snapshot_id] = kept
        self._last = named
        self._encode(names, changed, same=last is not None and type(changed) is not range)
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
        return named, carried

    def _encode(self, names: list[bytes], changed: Iterable[int], same: bool) -> None:
        """RK7: `_entries` for `names`, patched at `changed` (`same`: as many as the last)."""
        entries, self._entries = self._entries, None  # None until done: a save that fails encodes whole next
        if not same or entries is None or len(entries) != _ENTRY_BYTES * len(names):
            entries = bytearray(_ENTRY.join([b"", *names]))
        else:
            for i in changed:
                at = _ENTRY_BYTES * i + len(_ENTRY)
                entries[at:at + 32] = names[i]
        if len(entries) == _ENTRY_BYTES * len(names):  # every name 32 bytes: else `manifest` encodes them
            self._entries = entries

    def manifest_body(self, message: pb.FullState, names: list[bytes]) -> bytes:
        """`manifest(message, names)`'s encoding, its names from the last save's (RK7)."""
        entries = self._entries
        if entries is None or len(entries) != _ENTRY_BYTES * len(names):
            return manifest(message, names).SerializeToString()
        return blocks.without_state(message).SerializeToString() + _STATE_BLOCKS_TAG + _varint(len(entries)) + entries

    @property
    def garbage(self) -> int:
        """How many blocks `collect` would delete now."""
        return len(self._garbage)

    @property
    def unsettled(self) -> int:
        """How many blocks `collect` would delete or write here now (RK1, RK2)."""
        return len(self._garbage) + len(self._unsettled)

    def collect(self) -> int:
        """Write here and sync the carried blocks still needed (RK1, SV2), then delete the
        blocks that are garbage (RK2), each under the lock and only while still garbage;
        how many were deleted. Any thread; never the round's. A write or sync that fails
        is logged: its blocks stay unsettled, carried again."""
        try:
            self._settle()
        except OSError as exc:  # carried again by the next save (SV2); never durable here meanwhile
            log.warning("%s: cannot write the blocks the pending reports carry: %s", self.directory, exc)
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

    def _settle(self) -> None:
        """SV2: the carried blocks still needed, written in place and synced, then durable."""
        with self._lock:
            unsettled = list(self._unsettled.items())
            needed = [(name, block) for name, block in unsettled if self._needed(name)]
            for name, _ in unsettled:
                if not self._needed(name):
                    del self._unsettled[name]  # nothing names it any more: never written
        if not needed:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        directory = str(self.directory)
        paths = [_write_in_place(f"{directory}/{name.hex()}", memoryview(block)) for name, block in needed]
        sync_renamed(self.directory, paths)
        with self._lock:
            for name, block in needed:
                self._on_disk.add(name)
                if self._unsettled.get(name) is block:
                    del self._unsettled[name]
                if not self._needed(name):  # forgotten meanwhile (RK2)
                    self._garbage.add(name)

    def _needed(self, name: bytes) -> bool:
        """Whether the last state or a pending report names `name` (under the lock)."""
        return (self._last_set is not None and name in self._last_set) or \
            any(name in held for held in list(self._named.values()))  # `forget` may run on the loop meanwhile

    def forget(self, snapshot_id: str) -> None:
        """The report of `snapshot_id` is no longer pending: its blocks go at the next save
        unless the last state or another pending report names them (RK2)."""
        names = self._named.pop(snapshot_id, None)
        if names is not None:
            self._forgotten.append(names)  # RK6: the next save looks at them

    def state(self, names: list[bytes], carried: dict[bytes, bytes] | None = None) -> tuple[bytes | None, str]:
        """The state the blocks `names` make (RK3), or None and why not; `carried`: the
        blocks its report's file carries (checked already), taken first (SV3)."""
        parts = []
        carried = carried or {}
        for name in names:
            if name in carried:
                parts.append(carried[name])
                continue
            try:
                block = self.path(name).read_bytes()
            except FileNotFoundError:
                return None, f"block sha256:{name.hex()} is missing"
            if blocks.block_hash(block) != name:
                return None, f"block sha256:{name.hex()} does not hash to its name"
            parts.append(block)
        return b"".join(parts), ""

    def sweep(self, pending: dict[str, list[bytes]], carried: dict[bytes, bytes] | None = None) -> None:
        """At load: `pending` (snapshot id -> its blocks) are the reports found, `carried`
        their files' blocks (checked); those are written here whole (SV3), every other
        block file, and any temporary one a crash left, goes (RK2), and what stays is
        synced: durable, never carried (SV1)."""
        self._named = {sid: frozenset(names) for sid, names in pending.items()}
        self._on_disk, self._garbage, self._forgotten = set(), set(), []
        self._unsettled = {}
        if carried:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name, block in carried.items():  # over a file a crash cut short, if any
                _write_in_place(str(self.path(name)), memoryview(block))
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
        sync_renamed(self.directory, [self.path(name) for name in self._on_disk])

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
    """`data` as the file `path`, unsynced and in place (RK1): its caller syncs it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return Path(path)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def manifest(message: pb.FullState, names: list[bytes]) -> pb.FullState:
    """`message` with its state as the manifest of its blocks (what the report's file holds)."""
    out = blocks.without_state(message)  # not a copy of the state only to clear it
    out.state_blocks.hashes.extend(names)
    return out
