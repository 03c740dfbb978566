"""The controller's blocks on disk: `<data_dir>/controller/blocks/<hex>`, each block once.

A block file's name is the SHA-256 of its content (snapmesh/protocol/blocks.py), so a
block is written only when no file has its name yet, and a file is never
rewritten. One `write` makes all its new blocks durable with a constant number
of syncs, whatever their count (a first snapshot of 64 MiB is 8192 blocks):

D1. Every new block is written to a temporary file of its own write (`.<hex>.<n>.tmp`, n a
    count of this process's writes: two threads writing one block at once never share
    one, so neither renames the other's half-written file), unsynced.
D2. Then one sync makes them all durable: syncfs(2) of the file system
    (snapmesh/serving/durable.py `sync_files`; one fsync per file where there
    is no syncfs).
D3. Only then is each renamed to its name, and the directory fsynced once.
    So a file under a block's name is whole, crash or not.
D4. `write` returns only after D3 (and after D8's `settle` of any block of its own
    written unsynced before), and the store writes the manifest naming the blocks
    only after `write` returns and `settle` has run (services/controller/store.py):
    no manifest names a block that is not durable.
D8. A block a journal record carries itself (a report that came as blocks:
    journalblocks.py JB1) is written `durable=False`: D1's temporary file renamed to
    its name at once, neither synced. A reader never sees part of a file while the OS
    runs; an OS crash may leave the name missing, empty or partial. Until `settle`,
    the record, fdatasynced before the report is answered, is what makes the block
    durable: the replay writes back, durably, every block a live record carries whose
    file is missing or does not hash to its name, before anything reads one (JB3).
    `settle` (one syncfs, or an fsync of each such file and of the directory) makes
    every block so written durable, and runs before anything could leave such a
    block without its record: before a manifest names it (the store's filing,
    store.py), before a journal rewrite may drop the record (journal.py
    `before_rewrite`), and before a report taken without a record of its own (a
    repeat, or a held one its snapshot's FAILED dropped: held.py H2) is answered
    (servicer.py). A durable `write` that finds such a block already there settles
    it too. A report's path costs no sync for its blocks: its record's fdatasync
    covers them.

A crash leaves at most temporary files (removed by `sweep`) and whole blocks no
manifest names (garbage, removed by `sweep` at start:
snapmesh/protocol/controller/blockrefs.py G3).

D5. A block is used only as its name says. A kept block (the controller's memory,
    knownblocks.py) was checked against its name once, as it was kept (KB1: cut and
    hashed, carried and hashed, or read from here and hashed), and is immutable
    bytes from then on: `kept_reader` takes it as it is, unhashed (only a kept
    buffer that is not `bytes`, one that may be written to, is hashed on use).
    What can change behind the controller's back is a file here, so every block
    read from a file is hashed (blocks.py B3). A kept block is used only while a
    file of its name is here as far as this process knows (`holds`: the directory
    listed at start and again for each snapshot, as it starts (in a thread: engine.py
    `_list_blocks`) or at its first report if that comes first, then every `write`,
    `delete` and read that found none noted; no look at a file per block): a block
    lost is then read, found missing, and written again by the state sent whole
    (B4). A file changed in place behind the controller's back
    is found where files are read: `write` (below), the filing of a block found
    lacking, load, verify and a restore, each hashing what it reads. A file of a
    block's name and size that does not hash to its name is written again by
    `write` (one read and hash, for a block that was to be written anyway), not
    taken as the block.
D7. A listing holds no lock while it reads the directory (tens of milliseconds at
    32,768 files): a report's look-ups go on meanwhile against what was known. The
    writes, deletes and reads that found none while it ran are recorded and applied,
    in their order, over what it found; a file written before the listing read its
    name is in both, one deleted is taken out either way.
D9. The listing for each snapshot (D5) is made only when the directory's watch
    (dirwatch.py, Linux's inotify) cannot say what was removed since the last one: no
    watch, its queue overflowed (a first snapshot's 32,768 renames), or the directory
    went. Otherwise the names it saw removed are read instead, and each one held with
    no file of its name now is taken as gone (so the next report naming it is sent
    whole, B4). The watch starts just before a listing reads the directory. A listing
    took 20 ms of a core at 35,000 files, and more from the reports it raced.
D6. The bookkeeping costs no Python step per block of all the blocks named, only per
    block written: a listing is decoded in C (`names`), `lacking` and a write's
    blocks not here (`_absent`, written at once, their files not looked at) are set
    operations (`lacking` builds no set when every name is here), and the directory is
    made once, not at every write.
D10. `removals` counts what could take a held name away (every removal noted, every
    listing): a caller that checked a set of names against `holds` at one count may
    take them as still here while the count is the same, with no pass over them again
    (servicer.py `_sized`: a node's 8192 block sizes, once per report otherwise; the
    report that made them counts as their check when it found each of its names held
    or wrote it, none read from a file, and read the count before its first look-up).
    Writes do not count: a name written is never one the check found lacking. The
    writes themselves take str paths, not pathlib's (a block's cost was mostly its parsing).
D12. The blocks a report's record carries are written after the report is answered
    (`write_later`: one thread, in batches, blockwriter.py; which reader waits for
    what: snapmesh/protocol/controller/blockwrites.py BW1-BW5). Until its file is
    written a pending block is held (D5) and read from memory (`read`); a deletion
    drops it from the queue or waits for the batch writing it; `settle`, a durable
    `write` of it and `close` wait for it to be written.
D11. A file that is there but cannot be read (EIO, EACCES, a directory at a block's name)
    is as good as none to a reader (`read`: None, with a warning naming the file and the
    error, noted as gone so the next report sends the block whole), and `write` writes
    the block again in its place. One that cannot be removed is left, named, and the
    others still go, so the sweep at start never stops the controller. A rename that
    fails leaves no temporary file of that write behind and raises naming the file.
"""

from __future__ import annotations

import contextlib
import logging
import itertools
import operator
import os
import threading
from collections.abc import Callable, Collection, Iterable
from itertools import filterfalse
from pathlib import Path

from snapmesh.services.controller.blockwriter import BlockWriter
from snapmesh.services.controller.dirwatch import DirWatch
from snapmesh.protocol.blocks import block_hash
from snapmesh.serving.durable import fsync_dir, sync_files, sync_renamed

log = logging.getLogger(__name__)

_TMP_COUNT = itertools.count()  # D1: a temporary file's name, unique in this process (next() holds the GIL)
_HIDDEN = operator.methodcaller("startswith", ".")  # a temporary file (D1), or anything else hidden


def _hex(entry: str) -> bytes | None:
    try:
        return bytes.fromhex(entry)
    except ValueError:
        return None


class BlockDir:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        # The blocks whose files are here as far as this process knows (D5): listed once (`names`,
        # at start, or the first `holds`), then kept so by `write` and `delete` (None: not listed yet).
        self._on_disk: set[bytes] | None = None
        self._listed_for = ""  # the snapshot whose first report listed the directory (`listed_for`)
        self._watch = DirWatch(self.directory)  # the removals since the last listing (D9)
        self._lock = threading.Lock()  # a report's thread asks, the store's writes and deletes
        self._listing = threading.Lock()  # one report of a snapshot lists, the others wait for it
        self._listing_changes = threading.Lock()  # one `names` records the changes at a time (D7)
        self._made = False  # the directory made by a `write` of this process (D6)
        # What `write`, `delete` and `read` noted while a listing ran (D7; None: none runs)
        self._changes: list[tuple[list[bytes], list[bytes]]] | None = None
        # D8: the blocks written unsynced and not settled since, each with the count of its write
        # (a block deleted and written again while a `settle` syncs stays for the next)
        self._unsynced: dict[bytes, int] = {}
        self._writes = 0
        self._settling = threading.Lock()  # one `settle` at a time
        self._removals = 0  # D10: bumped by every removal noted and every listing
        self._later = BlockWriter(self._write_batch, self._batch_failed)  # D12: the answered reports' blocks

    def listed_for(self, snapshot_id: str) -> None:
        """List the directory again at the first report of `snapshot_id` to ask (D5): a
        file lost behind the controller's back is noticed by the next snapshot, for
        one listing a snapshot, not a stat per block of each report."""
        if self._listed_for != snapshot_id:
            with self._listing:
                if self._listed_for != snapshot_id:
                    if self._on_disk is None or not self._watched():  # D9: listed only when the watch cannot say
                        self.names()
                    self._listed_for = snapshot_id

    def _watched(self) -> bool:
        """The files removed since the last listing, as the watch saw them, noted (D9): False when
        it cannot say (the directory is listed instead). A name removed and written again since
        is still here: only a name held and with no file now is taken as gone."""
        removed = self._watch.removed()
        if removed is None:
            return False
        with self._lock:
            on_disk = self._on_disk
        where = os.fspath(self.directory)
        gone = [name for entry in filterfalse(_HIDDEN, removed) if (name := _hex(entry)) is not None
                and on_disk is not None and name in on_disk and name not in self._later
                and not os.path.exists(os.path.join(where, entry))]
        if gone:
            log.warning("%d block file(s) of %s removed behind the controller's back (sha256:%s ...): "
                        "sent whole again by the nodes that name them", len(gone), self.directory, gone[0].hex())
            self._noted(removed=gone)
        return True

    def holds(self, name: bytes) -> bool:
        """Whether a file of `name` is here as far as this process knows (D5): the
        directory is listed the first time, and the disk not looked at after that."""
        on_disk = self._on_disk
        if on_disk is None:
            self.names()
            on_disk = self._on_disk
        return name in on_disk  # type: ignore[operator]

    @property
    def removals(self) -> int:
        """How many removals and listings this process has noted (D10): while it stays the same,
        no name `holds` held has left."""
        return self._removals

    def _noted(self, added: Iterable[bytes] = (), removed: Iterable[bytes] = ()) -> None:
        with self._lock:
            if removed:
                self._removals += 1
            if self._changes is not None:  # a listing under way: applied over what it finds (`names`)
                self._changes.append((list(added), list(removed)))
            if self._on_disk is not None:
                self._on_disk.difference_update(removed)
                self._on_disk.update(added)

    def path(self, name: bytes) -> Path:
        return self.directory / name.hex()

    def read(self, name: bytes) -> bytes | None:
        """The content of block `name` as stored (None: there is no such file, noted: D5); a block
        whose file is still to be written (D12), from memory."""
        if (pending := self._later.get(name)) is not None:
            return pending
        try:  # a str path: pathlib would parse and intern each name, 8192 of them for 64 MiB
            with open(os.path.join(os.fspath(self.directory), name.hex()), "rb") as file:
                return file.read()
        except FileNotFoundError:
            self._noted(removed=[name])
            return None
        except OSError as exc:  # D11: unreadable is as good as missing, never an error on a report's path
            log.warning("block file %s cannot be read (%s): taken as missing", self.path(name), exc)
            self._noted(removed=[name])
            return None

    def write(self, blocks: dict[bytes, bytes], *, durable: bool = True) -> tuple[int, int]:
        """Every block of `blocks` (hash -> content) that has no file yet, durably
        (D1-D4): (blocks written, their bytes). A file of the right name and size is
        taken as the block once it hashes to its name (D5); a corrupt one is written again.
        `durable=False`: blocks a journal record carries, renamed unsynced (D8)."""
        if not blocks:
            return 0, 0
        if self._later and not self._later.names().isdisjoint(blocks):  # D12: its unsynced rename is not to follow
            self._later.flush()
        return self._write(blocks, durable, self._absent(blocks))

    def write_later(self, blocks: dict[bytes, bytes]) -> None:
        """`write(blocks, durable=False)` of blocks a journal record carries (D8), those with no file
        here written after the report is answered (D12); held from now on. Past the pending bound
        they are written now."""
        absent = self._absent(blocks)
        there = {name: block for name, block in blocks.items() if name not in absent}
        now = self._later.defer({name: blocks[name] for name in absent}) if absent else {}
        if len(now) < len(absent):
            self._noted(added=[name for name in absent if name not in now])
        if there or now:
            self._write({**there, **now}, False, set(now))

    def _write_batch(self, blocks: dict[bytes, bytes]) -> None:
        """A batch of the writer's (D12): none has a file here."""
        self._write(blocks, False, set(blocks))

    def _batch_failed(self, names: list[bytes], exc: OSError) -> None:
        """A batch not written (D12): its records hold the blocks (JB3); the nodes' next reports send them whole."""
        self._noted(removed=names)

    def close(self) -> None:
        """Write every block deferred (D12), then end its thread: the controller's orderly stop."""
        self._later.close()

    def _write(self, blocks: dict[bytes, bytes], durable: bool, absent: set[bytes]) -> tuple[int, int]:
        if not self._made:  # D6: once, not at every write
            self.directory.mkdir(parents=True, exist_ok=True)
            self._made = True
        where = os.fspath(self.directory)  # str paths: pathlib's parsing was most of a block's cost (D6)
        pending: list[tuple[str, str, bytes]] = []  # (temporary file, its name's path, name), not yet durable
        held: list[bytes] = []
        size = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            for name, block in blocks.items():
                if name not in absent and self._holds(name, len(block)):
                    held.append(name)
                    continue
                entry = name.hex()
                tmp = os.path.join(where, f".{entry}.{next(_TMP_COUNT)}.tmp")  # D1: this write's own
                try:
                    fd = os.open(tmp, flags, 0o644)
                except FileNotFoundError:  # the directory went behind this process's back: made again
                    self.directory.mkdir(parents=True, exist_ok=True)
                    fd = os.open(tmp, flags, 0o644)
                pending.append((tmp, os.path.join(where, entry), name))
                try:
                    view = memoryview(block)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                size += len(block)
            if pending and durable:
                sync_files(self.directory, [Path(tmp) for tmp, _, _ in pending])  # D2
        except OSError:
            for tmp, _, _ in pending:  # none is named yet (a crash leaves them to `sweep`)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        for done, (tmp, path, _) in enumerate(pending):  # D3 (D8: unsynced)
            try:
                os.replace(tmp, path)
            except OSError as exc:  # D11: the rest not named, none left behind; the blocks renamed stay whole
                for left, _, _ in pending[done:]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(left)
                raise OSError(exc.errno, f"block file {path} cannot be written: {exc.strerror}") from exc
        written = [name for _, _, name in pending]
        if durable:
            if pending:
                fsync_dir(self.directory)
            self._synced(written, held)
        else:
            with self._lock:
                for name in written:
                    self._writes += 1
                    self._unsynced[name] = self._writes
        self._noted([*held, *written])
        return len(pending), size

    def _synced(self, written: list[bytes], held: list[bytes]) -> None:
        """After a durable write (D4, D8): a block it wrote again is durable now, and one it found
        there written unsynced is settled before it returns."""
        if not self._unsynced:
            return
        with self._lock:
            for name in written:
                self._unsynced.pop(name, None)
            unsettled = not self._unsynced.keys().isdisjoint(held)
        if unsettled:
            self.settle()

    @property
    def unsynced(self) -> int:
        """How many blocks are written unsynced and not settled yet (D8), or not written yet (D12)."""
        return len(self._unsynced) + len(self._later)

    def settle(self) -> int:
        """Make every block written unsynced (D8) durable: one syncfs (or an fsync of each and of
        the directory), once those still to be written are (D12). How many blocks it settled."""
        self._later.flush()
        with self._settling:
            with self._lock:
                taken = dict(self._unsynced)
            if not taken:
                return 0
            sync_renamed(self.directory, [self.path(name) for name in taken])
            with self._lock:
                for name, count in taken.items():
                    if self._unsynced.get(name) == count:  # not written again since it was taken
                        del self._unsynced[name]
            return len(taken)

    def _absent(self, blocks: dict[bytes, bytes]) -> set[bytes]:
        """Those of `blocks` with no file here as far as this process knows: written without a
        look at a file of their name (D6); one there after all is replaced by a whole one."""
        with self._lock:
            return set() if self._on_disk is None else set(blocks).difference(self._on_disk)

    def _holds(self, name: bytes, size: int) -> bool:
        """Whether the file of `name` is the block: its size, then its hash (D5)."""
        try:
            if self.path(name).stat().st_size != size:
                return False
            if block_hash(self.path(name).read_bytes()) == name:
                return True
        except FileNotFoundError:
            return False
        except OSError as exc:  # D11: written again in its place (a directory there fails the rename, named)
            log.warning("block file %s cannot be read (%s): writing it again", self.path(name), exc)
            return False
        log.warning("block file %s does not hash to its name: writing it again", self.path(name))
        return False

    def delete(self, names: Iterable[bytes]) -> int:
        """Remove the files of `names` (those there); how many were removed."""
        names = list(names)
        self._later.claim(names)  # D12: none written after its deletion
        self._noted(removed=names)  # before the files go: none is taken as here once it is not
        if self._unsynced:
            with self._lock:
                for name in names:
                    self._unsynced.pop(name, None)
        removed = 0
        for name in names:
            try:
                self.path(name).unlink()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:  # D11: one that cannot go stays, named; the others still go
                log.warning("block file %s cannot be removed (%s): left in place", self.path(name), exc)
        return removed

    def names(self) -> set[bytes]:
        """Every block on disk (temporary files left out), which `holds` knows from then
        on (the store's sweep lists them at start, and the first report of each snapshot, D5)."""
        with self._listing_changes:  # one listing at a time records the changes (D7)
            with self._lock:
                self._changes = []
            try:
                self._watch.reset()  # D9: watched from before the listing reads, so no removal falls between
                try:
                    listed = os.listdir(self.directory)  # not under the lock: the reports' look-ups go on (D7)
                except FileNotFoundError:
                    listed = []
                # D6: decoded in C, not a Python step per file (32,768 of them at 64 MiB and four nodes)
                entries = filterfalse(_HIDDEN, listed)
                try:
                    found = set(map(bytes.fromhex, entries))
                except ValueError:  # a stray file not named as a block: each name on its own
                    found = {name for entry in filterfalse(_HIDDEN, listed) if (name := _hex(entry)) is not None}
                with self._lock:
                    on_disk = set(found)
                    for added, removed in self._changes:  # in their order, over what was listed
                        on_disk.difference_update(removed)
                        on_disk.update(added)
                    on_disk.update(self._later.names())  # D12: held, their files still to be written
                    self._on_disk = on_disk
                    self._removals += 1  # D10: what was listed may lack a name held before
            finally:
                with self._lock:
                    self._changes = None
        return found

    def lacking(self, names: Collection[bytes]) -> set[bytes]:
        """Those of `names` with no file here as far as this process knows (`holds`, for many
        names at once: one look-up each in C, D6; a set is built only when some lack)."""
        if self._on_disk is None:
            self.names()
        with self._lock:
            on_disk: set[bytes] = self._on_disk  # type: ignore[assignment]
            if on_disk.issuperset(names):  # the usual case: 8192 names at 64 MiB, each call
                return set()
            return set(names).difference(on_disk)

    def sweep(self, keep: set[bytes]) -> int:
        """Remove every block not in `keep` and every temporary file (at start,
        before anything is filed); how many blocks were removed."""
        if not self.directory.is_dir():
            return 0
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                Path(entry.path).unlink(missing_ok=True)
        return self.delete(self.names() - keep)


def kept_reader(
    kept: Callable[[bytes], bytes | None], files: BlockDir, snapshot_id: str = "",
) -> Callable[[bytes], bytes | None]:
    """`known` for blocks.whole_state: a kept block (`kept`, in memory, checked against its
    name when it was kept) only while `files` holds a file of its name (a block lost there
    is then read, found missing, and written again by the state sent whole, B4), as the
    listing at the first report of `snapshot_id` found it ("": as last listed) and the
    controller's writes and deletions since. Neither hashed again nor its file looked at
    (D5): a report of 64 MiB uses 8192 kept blocks, and each call that left the GIL waited
    to take it back behind the other reports' threads."""
    listed = not snapshot_id

    def get(name: bytes) -> bytes | None:
        nonlocal listed
        block = kept(name)
        if block is None:
            return None
        if not listed:
            files.listed_for(snapshot_id)
            listed = True
        if not files.holds(name):
            return None
        if not isinstance(block, bytes) and block_hash(block) != name:  # a mutable buffer may have changed since
            log.warning("kept block sha256:%s does not hash to its name: read from %s instead", name.hex(),
                        files.directory)
            return None
        return block

    return get
