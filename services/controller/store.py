"""Finished snapshots on disk, written off the reply path.

Two files per finished snapshot:

- `<data_dir>/controller/snapshots/<id>.pb`: the compact store of record, the
  Snapshot's protobuf bytes, each app node's state as a manifest of block hashes
  (snapmesh/protocol/blocks.py), each block stored once under
  `<data_dir>/controller/blocks/<hex>` (`BlockDir`) however many snapshots hold it.
  The controller loads these on start.
- `<data_dir>/snapshots/<id>.json`: the proto JSON export (snake_case names) that
  the README, grpcurl users and the Spark job read. Same content; `export.py`
  renders it, and `python -m bench store` measures both. States of more than
  EXPORT_INLINE_BYTES in all are exported as the `.pb` holds them: manifests
  naming the blocks under `controller/blocks`.

Both are written by one background thread (`StoreWriter`), never on the way to
an answer: by the time a snapshot is handed to it, its outcome is already
durable in the journal (`journal.py`), which is what makes the answer safe. Each
file is written atomically (temporary file, fsync, rename, fsync of the
directory), so a crash leaves either no file or the whole file, and a missing
one is written again after the restart. Both files carry the checksum of the
snapshot's content (snapmesh/checking/snapshot_file.py), and are marked as
carrying it: a marked file without one is damaged; an unmarked one without one
(written before checksums) loads as before. Loading skips, with a warning naming the
file, anything it cannot read back or whose checksum does not match, and
remembers in `damaged` each snapshot it found no intact file of, so that asking
for it says DATA_LOSS, naming the file, rather than "unknown".

The store keeps an index of its filed snapshots, id -> status (`FiledIndex`):
built by `load_all` at start, kept up to date as files are written and deleted.
A filtered ListSnapshots pages through it without reading a file or listing the
directory; only the snapshots of the page are read (off the event loop).

Blocks are written before the manifest that names them, and counted per stored
snapshot (`BlockRefs`, snapmesh/protocol/controller/blockrefs.py). Deleting a
snapshot (retention) removes its files, durably, and only then the blocks no
other stored snapshot references. The counts are rebuilt from the manifests by
`load_all`; then the controller's `sweep` removes the blocks no manifest names:
what a deletion or a filing cut short by a crash left behind. So a crash anywhere in either leaves
every stored snapshot's blocks in place. Blocks a journaled report names are
pinned (`pin`; snapmesh/protocol/controller/journalblocks.py JB1, JB2) until its
snapshot is filed or retired (`StoreWriter.unpin`): neither a deletion nor the
sweep removes a pinned block. The blocks a report carried are written and
pinned when it is taken (`keep`), not when its snapshot is filed: the node's
next report names them as held, and the snapshot may not be filed yet. Those its
journal record carries itself are written unsynced (blockdir.py D8): each filing
settles them (one syncfs) before its manifest is written, off the reply path.

A snapshot handed in with its large states as block lists (the tracker's listed
form, snapmesh/protocol/controller/blockforms.py) is filed as it is: its
manifests are the stored form's, their blocks already on disk and pinned (`keep`),
so nothing is cut or hashed again. Its checksum (filingsum.py) is the stored
form's when both files hold manifests (over EXPORT_INLINE_BYTES of states), no
block read; else the whole form's, its blocks read a block at a time (`reader`,
each checked against its name): the whole form is never built (wholedigest.py).
Each listed state's digest is the one the node's report said (FullState.state_digest,
taken unhashed on the reply path): checked here against the bytes (its blocks read),
and filed as they hash.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from snapmesh.services.controller import export
from snapmesh.services.controller.blockdir import BlockDir
from snapmesh.services.controller.filingsum import filing_checksum
from snapmesh.services.controller.gridmemo import GridMemo
from snapmesh.services.controller.listedload import listed_form
from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller.blockpins import BlockPins
from snapmesh.protocol.controller.blockrefs import BlockRefs
from snapmesh.serving.durable import fsync_dir, write_atomically
from snapmesh.protocol.appstate import clear_old_figures
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

FINISHED = (pb.Snapshot.COMPLETE, pb.Snapshot.FAILED)
# States up to this size in all are in the JSON export (base64); larger ones are
# exported as their manifests, which name the blocks under controller/blocks: a
# copy of every state in base64 is 4/3 of them again at every snapshot, however
# little changed (the answers' default limit, snapmesh/protocol/controller/answers.py).
EXPORT_INLINE_BYTES = 4 * 1024 * 1024
PARTS_KEPT = 64  # snapshots whose reports' parts are kept until they are filed (`note_parts`)


class FiledIndex:
    """Id -> status of every filed snapshot, and the ids in order, in all and per
    status. Thread-safe: the writer's thread adds and removes, the event loop reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: dict[str, int] = {}
        self._ordered: dict[int, list[str]] = {0: []}  # status -> sorted ids; 0: every status

    def add(self, snapshot_id: str, status: int) -> None:
        with self._lock:
            if self._status.get(snapshot_id) == status:
                return
            self._remove(snapshot_id)
            self._status[snapshot_id] = status
            for key in (0, status):
                ids = self._ordered.setdefault(key, [])
                if not ids or ids[-1] < snapshot_id:
                    ids.append(snapshot_id)  # the usual case: a new id sorts last
                else:
                    bisect.insort(ids, snapshot_id)

    def remove(self, snapshot_id: str) -> None:
        with self._lock:
            self._remove(snapshot_id)

    def _remove(self, snapshot_id: str) -> None:
        status = self._status.pop(snapshot_id, None)
        if status is None:
            return
        for key in (0, status):
            ids = self._ordered[key]
            i = bisect.bisect_left(ids, snapshot_id)
            if i < len(ids) and ids[i] == snapshot_id:
                del ids[i]

    def after(self, after: str, status: int = 0, count: int = 100) -> list[str]:
        """Up to `count` ids greater than `after` ("" : from the first), in order;
        `status` 0: any status."""
        with self._lock:
            ids = self._ordered.get(status, [])
            start = bisect.bisect_right(ids, after) if after else 0
            return ids[start : start + count]

    def status(self, snapshot_id: str) -> int | None:
        return self._status.get(snapshot_id)

    def __len__(self) -> int:
        return len(self._status)


class SnapshotStore:
    def __init__(self, directory: Path, compact_directory: Path) -> None:
        self.directory = Path(directory)  # the JSON exports
        self.compact_directory = Path(compact_directory)
        self.damaged: dict[str, str] = {}  # by load_all: snapshot id -> why no file of it is intact
        self.index = FiledIndex()  # by load_all and every write and delete here
        self.blocks = BlockDir(self.compact_directory.parent / "blocks")
        self.refs = BlockRefs()  # by load_all and every write and delete here (the writer's thread)
        self.pins = BlockPins()  # the blocks journaled reports name (`pin`)
        self._refs_lock = threading.Lock()  # refs and pins: the writer's thread changes them, a report pins
        self._parts: dict[str, dict[str, tuple[int, ...]]] = {}  # snapshot id -> node -> its report's parts
        self._parts_lock = threading.Lock()
        self._lacking: set[bytes] = set()  # blocks a report named and this store lacked: written again when filed
        # Listed states' blocks by name (blockforms.py; the controller's servicer sets it): a reader per state read
        self.reader: Callable[[], Callable[[bytes], bytes | None]] | None = None
        # A block's size by its name, known from a read checked against it (the servicer sets it): filingsum FS5.
        # Made once per filing, as `reader` is: a lookup per block that is one dict's `get`, no Python step
        self.sized: Callable[[], Callable[[bytes], int | None]] | None = None
        self.grids = GridMemo()  # each node's last off-grid state filing checked (filingsum FS6)

    def lacks(self, names: list[bytes]) -> None:
        """Blocks that stored snapshots reference and that are not on disk (or not as
        named), found by a report that named them: the next filing that has them
        writes them again (`file_compact` looks at no file of a referenced block)."""
        with self._parts_lock:
            self._lacking.update(names)

    def note_parts(self, snapshot_id: str, node_id: str, parts: tuple[int, ...]) -> None:
        """How the report of `node_id` cut its state (blocks.py B6), for the filing of
        `snapshot_id`: its blocks are then the node's, and its next report's unchanged
        blocks are held here. Kept for the last PARTS_KEPT snapshots (one that
        never files, a failed one, is forgotten so)."""
        with self._parts_lock:
            self._parts.setdefault(snapshot_id, {})[node_id] = parts
            while len(self._parts) > PARTS_KEPT:
                del self._parts[next(iter(self._parts))]

    def pin(self, snapshot_id: str, names: set[bytes] | frozenset[bytes], call: int = 0) -> list[bytes]:
        """Keep `names` on disk for a report of `snapshot_id` journaled as blocks
        (journalblocks.py JB1): the names that are on disk durably neither by a
        stored snapshot's reference nor by a pin; when there are any, nothing is pinned."""
        with self._refs_lock:
            missing = list(self.pins.unpinned(self.refs.unreferenced(names)))
            if not missing:
                self.pins.pin(snapshot_id, names, call)
            return missing

    def keep(self, snapshot_id: str, names: set[bytes] | frozenset[bytes], carried: dict[bytes, bytes],
             call: int, *, in_record: bool = False) -> None:
        """A report of `snapshot_id` taken (as blocks, or whole) and about to be journaled:
        `call` pins every block it names (`names`), and the blocks it `carried`
        (name -> content) are written under controller/blocks before its record
        (journalblocks.py JB1): durably, or, `in_record` (its record carries them
        itself), unsynced and after the report is answered, made durable by
        the record until they are settled (blockdir.py D8, D12). So the node's next report may name them at once,
        before this snapshot is filed. Pinned first: a deletion under way then either
        removed a file before (written again here) or sees the pin (`_delete_unheld`).
        A write that fails lets the call's pins go (its report is never journaled)."""
        with self._refs_lock:
            self.pins.pin(snapshot_id, names, call)
        try:
            (self.blocks.write_later if in_record else self.blocks.write)(carried)  # D12: later, in_record
        except OSError:
            self.unpin(snapshot_id, call)
            raise

    def keep_carried(self, snapshot_id: str, carried: dict[bytes, bytes], call: int) -> None:
        """`keep` for some of the blocks a report carries, as its stream brings them
        (snapmesh/protocol/carriedblocks.py): `call` pins them too, and they are written,
        durably, before its record. A write that fails lets the call's pins go, as `keep`'s."""
        with self._refs_lock:
            self.pins.add(snapshot_id, carried, call)
        try:
            self.blocks.write(carried)
        except OSError:
            self.unpin(snapshot_id, call)
            raise

    def unpin(self, snapshot_id: str, call: int | None = None) -> int:
        """The snapshot's records are dead (filed or retired, journalblocks.py JB2; `call`: only that
        call's report, refused, so never journaled): the pins go, and the blocks
        neither pinned nor referenced now with them. How many blocks went."""
        with self._refs_lock:  # each call's pins narrowed by the references first (heldsets.py HS4)
            freed = self.pins.unpin(snapshot_id, call, self.refs.unreferenced)
        return self._delete_unheld(freed)

    def _delete_unheld(self, names: set[bytes]) -> int:
        """Delete those of `names` that nothing pins or references, asked and done under
        the lock a report pins under (`keep`): a block pinned meanwhile stays."""
        with self._refs_lock:
            return self.blocks.delete(self.pins.unpinned(self.refs.unreferenced(names)))

    def path(self, snapshot_id: str) -> Path:
        return self.directory / f"{snapshot_id}.json"

    def compact_path(self, snapshot_id: str) -> Path:
        return self.compact_directory / f"{snapshot_id}.pb"

    def save_compact(self, snapshot: pb.Snapshot) -> str:
        """Write the blocks the store lacks, then the compact file; returns the checksum it carries."""
        return self.file_compact(snapshot)[0]

    def file_compact(self, snapshot: pb.Snapshot) -> tuple[str, pb.Snapshot, int]:
        """`save_compact`, the stored form it wrote (the export's, for large states),
        and the states' bytes in all (from the blocks: a read of a state is a copy)."""
        with self._parts_lock:
            parts = self._parts.pop(snapshot.snapshot_id, {})
        stored, named = _stored_form(snapshot, parts)
        listed = set().union(*(node.state_blocks.hashes for node in snapshot.nodes if blockforms.is_listed(node)))
        # A block a stored snapshot already references is on disk, durably (it was
        # written before that manifest): no look at its file, unless a report found
        # it lacking. On a second snapshot of a mostly unchanged state, that is every
        # block but the changed ones.
        with self._parts_lock:
            lacking, self._lacking = self._lacking, set()
        unreferenced = self.refs.unreferenced(named)  # in bulk: a name's look-up goes through each snapshot's set
        new = {name: block for name, block in named.items() if name in unreferenced or name in lacking}
        if lacking & listed and self.reader is not None:  # a listed state's blocks were written at `keep`, but lost
            read = self.reader()
            new.update({name: block for name in lacking & listed if (block := read(name)) is not None})
        written, size = self.blocks.write(new)
        self.blocks.settle()  # blockdir.py D8: the blocks reports' records made durable, before a manifest names them
        if written:
            log.info("snapshot %s: %d new blocks (%d bytes) of %d", snapshot.snapshot_id, written, size,
                     len(named) + len(listed))
        inline = sum(len(named[name]) for original, node in zip(snapshot.nodes, stored.nodes, strict=True)
                     if not blockforms.is_listed(original) for name in node.state_blocks.hashes)
        size = inline + sum(node.state_bytes for node in snapshot.nodes if blockforms.is_listed(node))
        # both files hold manifests past EXPORT_INLINE_BYTES: the checksum is theirs, no block read
        digest = filing_checksum(snapshot, stored, self.reader() if self.reader is not None else None,
                                 of_stored=size > EXPORT_INLINE_BYTES, raw=self.blocks.read,
                                 sized=self.sized() if self.sized is not None else None, memo=self.grids)
        data = snapshot_file.sealed_with(stored, digest)
        with self._refs_lock:  # before the file: a crash leaves garbage, never a gap
            freed = self.refs.hold(snapshot.snapshot_id, named.keys() | listed)
        write_atomically(self.compact_path(snapshot.snapshot_id), data)
        self._delete_unheld(freed)
        self.index.add(snapshot.snapshot_id, snapshot.status)
        return digest, stored, size

    def delete(self, snapshot_id: str) -> int:
        """Both files of `snapshot_id` (retention), durably, then the blocks no
        other stored snapshot references; it leaves the index first. How many blocks went."""
        self.index.remove(snapshot_id)
        for path in (self.compact_path(snapshot_id), self.path(snapshot_id)):
            path.unlink(missing_ok=True)
        for directory in (self.compact_directory, self.directory):
            if directory.is_dir():
                fsync_dir(directory)
        with self._refs_lock:
            freed = self.refs.drop(snapshot_id)
        return self._delete_unheld(freed)

    def export_json(
        self, snapshot: pb.Snapshot, digest: str = "", stored: pb.Snapshot | None = None, state_bytes: int = -1,
    ) -> Path:
        """Write the JSON export (`digest`: the snapshot's checksum, when known):
        `snapshot_file.sealed_json` of the export, rendered with the checksum in
        place rather than rendered and then copied to put it in. With `stored`
        (`file_compact`'s), states of more than EXPORT_INLINE_BYTES in all are
        exported as `stored` has them: each node's manifest of blocks, which
        are the files `<data>/controller/blocks/<hex>` (the checksum is still the
        whole snapshot's, as in the `.pb`). `state_bytes`: the states' size, when known."""
        if stored is not None and (state_bytes if state_bytes >= 0 else _state_bytes(snapshot)) > EXPORT_INLINE_BYTES:
            snapshot = stored
        elif blockforms.listed(snapshot):  # inline: its states' bytes, read by block
            snapshot = blockforms.BlockForms(self.reader).whole(snapshot)
            for node, kept in zip(snapshot.nodes, stored.nodes if stored is not None else (), strict=False):
                node.state_digest = kept.state_digest  # as filed: the bytes' (filingsum.py FS1)
        text = export.snapshot_json(snapshot, digest or snapshot_file.checksum(snapshot))  # stored: its own (filingsum.py)
        return write_atomically(self.path(snapshot.snapshot_id), (text + "\n").encode("utf-8"))

    def damage(self, snapshot_id: str) -> str:
        """Why a stored file of `snapshot_id` is damaged now ("" when every file
        there is intact, or none is written yet); names the file."""
        for path in (self.compact_path(snapshot_id), self.path(snapshot_id)):
            if path.exists() and (why := snapshot_file.damage(path)):
                return why
        return ""

    def load_all(self, listed: bool = False) -> tuple[list[pb.Snapshot], list[str]]:
        """Every readable finished snapshot, and one warning per file skipped.
        A snapshot with only a JSON file (a data dir from before the compact
        store) is read from that. `listed` (the controller's start): each `.pb` as this
        version writes it is read listed (listedload.py `listed_form`: every block read and
        checked, one at a time, large states kept as block lists); any other file whole."""
        found: dict[str, pb.Snapshot] = {}
        warnings: list[str] = []
        self.damaged = {}
        for path in [*_listing(self.compact_directory, "*.pb"), *_listing(self.directory, "*.json")]:
            if path.stem in found:
                continue
            try:
                stored, marked = snapshot_file.read_stored(path)
                if path.suffix == ".pb":  # its blocks stay, readable or not, while its file does
                    self.refs.hold(path.stem, blocks.hashes(stored))
                snapshot = listed_form(self, path.stem, stored, marked) if listed and path.suffix == ".pb" else None
                checked = snapshot is not None  # against its checksum, every block against its name
                snapshot = snapshot if checked else snapshot_file.whole(stored, path)
            except snapshot_file.Unreadable as exc:
                warnings.append(f"skipping snapshot file {path}: cannot parse it: {exc}")
                self.damaged.setdefault(path.stem, str(exc))
                continue
            if not checked and (problem := snapshot_file.checksum_problem(snapshot, marked, stored)):
                warnings.append(f"skipping snapshot file {path}: {problem}")
                self.damaged.setdefault(path.stem, f"{path}: {problem}")
                continue
            snapshot.ClearField("checksum")  # the controller's copy: answers carry none
            clear_old_figures(snapshot)  # an app's from before the v1 figures were its adapter's
            if _check(snapshot, path, warnings):
                found[snapshot.snapshot_id] = snapshot
                self.damaged.pop(snapshot.snapshot_id, None)
                if path.suffix == ".pb":
                    self.index.add(snapshot.snapshot_id, snapshot.status)
        return [found[k] for k in sorted(found)], warnings

    def sweep(self) -> str:
        """After `load_all`, by the controller that owns the data dir, before it files
        anything: remove the blocks no stored snapshot names and no journaled report
        pins (what a deletion or a filing cut short left). What it did, for the log ("" : nothing). Never by a
        reader of someone else's store: a filing under way writes blocks before the
        manifest that names them."""
        on_disk = self.blocks.names()
        keep = on_disk - self.pins.unpinned(self.refs.unreferenced(on_disk))
        if swept := self.blocks.sweep(keep):
            return (f"removed {swept} blocks under {self.blocks.directory} that no stored snapshot names "
                    "(left by a deletion or a filing cut short)")
        return ""

    def load(self, snapshot_id: str) -> pb.Snapshot | None:
        """One filed snapshot from its compact file; None when there is none
        (or it cannot be read). A file whose checksum fails it, or that holds
        another snapshot than its name, is remembered in `damaged`."""
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            return None
        path = self.compact_path(snapshot_id)
        try:
            stored, marked = snapshot_file.read_stored(path)
            snapshot = snapshot_file.whole(stored, path)
        except (OSError, snapshot_file.Unreadable):
            return None
        problem = snapshot_file.checksum_problem(snapshot, marked, stored)
        if not problem and snapshot.snapshot_id != snapshot_id:
            problem = f"holds snapshot_id {snapshot.snapshot_id!r}, not {snapshot_id!r}"
        if problem:
            self.damaged.setdefault(snapshot_id, f"{path}: {problem}")
            return None
        snapshot.ClearField("checksum")  # the controller's copy: answers carry none
        clear_old_figures(snapshot)  # an app's from before the v1 figures were its adapter's
        return snapshot

    def missing_files(self, snapshot_id: str) -> tuple[bool, bool]:
        """(compact missing, JSON missing) for one snapshot."""
        return not self.compact_path(snapshot_id).exists(), not self.path(snapshot_id).exists()


def _state_bytes(snapshot: pb.Snapshot) -> int:
    return blockforms.state_bytes(snapshot)


def _stored_form(snapshot: pb.Snapshot, parts=None) -> tuple[pb.Snapshot, dict[bytes, bytes]]:
    """blocks.stored_form, of a snapshot whose listed states (blockforms.py) are
    manifests already: they stay so, without the size the listed form notes."""
    stored, named = blocks.stored_form(snapshot, parts or {})
    for node in stored.nodes:
        if node.HasField("state_blocks"):
            node.ClearField("state_bytes")
    return stored, named


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


class _Unpin(NamedTuple):
    snapshot_id: str
    call: int | None  # None: every call's


class StoreWriter:
    """One background thread writing finished snapshots: the compact file, then
    `on_filed(id)` (its journal records may go), then the JSON export."""

    def __init__(self, store: SnapshotStore, on_filed: Callable[[str], None]) -> None:
        self.store = store
        self._on_filed = on_filed
        self._queue: queue.SimpleQueue[tuple[pb.Snapshot, bool, bool] | str | _Unpin | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="controller-store", daemon=True)
        self._thread.start()

    def submit(self, snapshot: pb.Snapshot, *, compact: bool = True, json: bool = True) -> None:
        self._queue.put((snapshot, compact, json))

    def discard(self, snapshot_id: str) -> None:
        """Delete the snapshot's files (retention), after whatever was submitted before."""
        self._queue.put(snapshot_id)

    def unpin(self, snapshot_id: str, call: int | None = None) -> None:
        """The snapshot's journal records are dead: its pins go (`SnapshotStore.unpin`),
        after whatever was submitted before (its filing, which references its blocks)."""
        self._queue.put(_Unpin(snapshot_id, call))

    def close(self) -> None:
        """Write everything submitted so far and the block files pending (blockdir.py D12), then stop."""
        self._queue.put(None)
        self._thread.join()
        self.store.blocks.close()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, _Unpin):
                try:
                    self.store.unpin(item.snapshot_id, item.call)
                except OSError as exc:  # garbage until the next start's sweep
                    log.error("snapshot %s: cannot delete the blocks its journal records pinned: %s",
                              item.snapshot_id, exc)
                continue
            if isinstance(item, str):
                try:
                    blocks_gone = self.store.delete(item)
                except OSError as exc:
                    log.error("cannot delete snapshot %s: %s", item, exc)
                    continue
                log.info("snapshot %s: files and %d blocks deleted (retention)", item, blocks_gone)
                continue
            snapshot, compact, json = item
            sid = snapshot.snapshot_id
            try:
                digest, stored, size = "", None, -1
                if compact:
                    digest, stored, size = self.store.file_compact(snapshot)
                    self._on_filed(sid)
                if json:
                    if stored is None and (size := _state_bytes(snapshot)) > EXPORT_INLINE_BYTES:
                        stored = _stored_form(snapshot)[0]  # its `.pb`, and so its blocks, are filed
                    self.store.export_json(snapshot, digest, stored, size)
            except OSError as exc:
                log.error("cannot write snapshot %s: %s (the journal still holds it)", sid, exc)
            except Exception:  # a bug must not stop every later snapshot's files
                log.exception("cannot write snapshot %s (the journal still holds it)", sid)
