"""A node's held blocks on disk: `<data_dir>/<node_id>.blocks/<hex>`, so a restart keeps them.

The blocks a node holds for a restore sent as blocks (heldblocks.py: its last
report's state and its last restored one) live in memory; a node that restarted
would hold none, and the restore after it would send its whole state again.
The shelf keeps a copy of them on disk:

BS1. A block's file is named by the SHA-256 of its content and written whole or
    not at all (a temporary file renamed into place, durable.py
    `write_unsynced`). No sync: a block lost or cut short by a power loss is
    caught by BS2, and then simply not held.
BS2. A block is read only through its name: `get` hashes the file, and a file
    that does not hash to its name (corrupt, cut short) is removed and not held
    (the restore then refuses as blocks, blocks.MISSING, and gets its state whole).
BS3. Bounded as the memory is: the blocks of one state per slot (the last
    report's, the last restore's); `keep` writes a slot's new blocks, then removes
    every file no slot names. After a restart each slot starts as every block
    found on disk (the union of the two before it), so what is kept stays bounded.
BS4. Thread-safe: `keep` runs in one worker thread (heldblocks.py), `get` in any;
    a file is either there whole (BS1) or not, and `get` checks it (BS2).
BS6. A block the node's pending report has just written (reportblocks.py: the same
    name, the same content, in the same file system) is linked from that file, not
    written again (`linked_from`): the first report of 64 MiB wrote 8192 files twice,
    and its 64 MiB of dirty pages a second time, for every sync on the disk after it
    to flush. A link is a name for a whole file or none; the report's file is
    unsynced as a shelf file is (BS1), and BS2 checks it on `get` all the same. One
    the report no longer has (collected since: RK2), or not yet (its file carried it,
    and the report's collection writes it there after the report is sent: RK1), is
    written from memory as before.
BS7. A slot's new state of as many blocks as its last follows what changed, not the
    state's size (as reportblocks.RK6): the blocks written are found among those whose
    name differs from the last state's at the same index, and the files removed among
    the names those replaced, each kept if any slot (a count per name: a block may be
    in a state twice) or the incoming set names it. Any other keep (another count of
    blocks, the first after a restart, the restored slot) compares every name, as before,
    and removes every file no slot names. At 64 MiB an incremental report's keep was
    five sets of 8192 names, ~1.5 ms, in a thread that takes the GIL from the report's path.
BS5. A restore streamed as blocks (restorestream.py RS4) writes each carried block
    here as it comes (`add`, named by its hash), so the node never
    holds them together; they are kept (an `incoming` slot, emptied as the next
    stream begins) until the restored state's slot names them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from itertools import compress
from operator import ne
from pathlib import Path

from snapmesh.protocol import blocks
from snapmesh.serving.durable import write_unsynced

log = logging.getLogger(__name__)

SLOTS = ("report", "restored")


class BlockShelf:
    def __init__(self, directory: Path, linked_from: Path | None = None) -> None:
        self.directory = Path(directory)
        self.linked_from = linked_from  # the pending reports' blocks (BS6); None: every block written
        self._lock = threading.Lock()  # one `keep` at a time (BS4)
        found = self._scan()
        # each slot's names, a count per name (BS7: a block may be in a state twice); BS3: after a restart
        self._slots: dict[str, Counter[bytes]] = {slot: Counter(found) for slot in SLOTS}
        self._lists: dict[str, list[bytes] | None] = dict.fromkeys(SLOTS)  # BS7: each slot's last state's names
        self._on_disk: set[bytes] = set(found)
        self._incoming: set[bytes] = set()  # BS5: blocks a restore's stream wrote, not yet in a slot

    def _scan(self) -> frozenset[bytes]:
        """Every block file on disk; temporary files left by a crash are removed."""
        if not self.directory.is_dir():
            return frozenset()
        found = set()
        for entry in os.scandir(self.directory):
            if entry.name.startswith("."):
                if entry.name.endswith(".tmp"):
                    Path(entry.path).unlink(missing_ok=True)
                continue
            try:
                name = bytes.fromhex(entry.name)
            except ValueError:
                continue
            if len(name) == 32:
                found.add(name)
        return frozenset(found)

    def path(self, name: bytes) -> Path:
        return self.directory / name.hex()

    @property
    def names(self) -> frozenset[bytes]:
        """The blocks the shelf has files of (not yet checked: BS2 checks on `get`)."""
        with self._lock:
            return frozenset(self._on_disk)

    def get(self, name: bytes) -> bytes | None:
        """Block `name`, checked against its name (BS2); None: not held."""
        try:
            block = self.path(name).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if blocks.block_hash(block) == name:
            return block
        log.warning("held block %s is corrupt (its content hashes to sha256:%s): removed, not held",
                    self.path(name), blocks.block_hash(block).hex())
        self.path(name).unlink(missing_ok=True)
        return None

    def begin(self) -> None:
        """A restore's stream begins (BS5): the blocks an earlier one wrote are no longer kept for it."""
        with self._lock:
            self._incoming = set()

    def add(self, block: bytes) -> bytes:
        """Write a block a restore's stream carried (BS5), unless there; its name. Raises
        OSError (the restore then fails: the shelf is where its blocks wait)."""
        name = blocks.block_hash(block)
        with self._lock:
            self._incoming.add(name)
            if name not in self._on_disk or not self.path(name).exists():
                self.directory.mkdir(parents=True, exist_ok=True)
                write_unsynced(self.path(name), block)
                self._on_disk.add(name)
        return name

    def keep(self, slot: str, named: blocks.Named) -> tuple[int, int]:
        """`named` is the state of `slot` now: its blocks not on disk are written (BS1),
        and the files of blocks no slot names any longer removed (BS3); (written, removed)."""
        if slot not in SLOTS:
            raise ValueError(f"block shelf {self.directory}: no slot {slot!r} (slots: {', '.join(SLOTS)})")
        with self._lock:
            last = self._lists[slot]
            if slot == "report" and last is not None and len(last) == len(named.names):
                return self._follow(slot, named, last)
            self._lists[slot] = None  # until written whole: a keep that fails is compared whole next time
            written = self._write(named, range(len(named.names)))
            self._slots[slot] = Counter(named.names)
            self._lists[slot] = list(named.names)
            if slot == "restored":
                self._incoming = set()
            keep = frozenset().union(*self._slots.values(), self._incoming)
            removed = 0
            for name in self._on_disk - keep:
                self.path(name).unlink(missing_ok=True)
                removed += 1
            self._on_disk &= keep
            return written, removed

    def _follow(self, slot: str, named: blocks.Named, last: list[bytes]) -> tuple[int, int]:
        """BS7: `keep` of a slot's state of as many blocks as its last, by the blocks that changed."""
        names = named.names
        changed = list(compress(range(len(names)), map(ne, names, last)))
        self._lists[slot] = None  # until written: a keep that fails is compared whole next time
        written = self._write(named, changed)
        counts, dropped = self._slots[slot], []
        for i in changed:
            counts[names[i]] += 1
            old = last[i]
            counts[old] -= 1
            if counts[old] <= 0:
                del counts[old]
                dropped.append(old)
        self._lists[slot] = list(names)
        removed = 0
        others = [held for other, held in self._slots.items() if other != slot]
        for name in dropped:
            if name in counts or name in self._incoming or any(name in held for held in others) \
                    or name not in self._on_disk:
                continue
            self.path(name).unlink(missing_ok=True)
            self._on_disk.discard(name)
            removed += 1
        return written, removed

    def _write(self, named: blocks.Named, among: range | list[int]) -> int:
        """The blocks at `among` (indices of `named`) with no file yet written (or linked, BS6)."""
        written = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        names, on_disk = named.names, self._on_disk
        source, here = (None if self.linked_from is None else os.fspath(self.linked_from)), os.fspath(self.directory)
        if type(among) is range:  # by set and map, not a step a block: a few are new
            absent = set(names).difference(on_disk)
            missing = compress(range(len(names)), map(absent.__contains__, names)) if absent else ()
        else:
            missing = [i for i in among if names[i] not in on_disk]
        for i in missing:
            name = names[i]
            if name in on_disk:  # twice in this state
                continue
            if source is None or not _linked(f"{source}/{name.hex()}", f"{here}/{name.hex()}"):
                start, end = named.bounds[i]
                write_unsynced(self.path(name), named.state[start:end])  # a BlockState's block itself (BST2)
            on_disk.add(name)
            written += 1
        return written


def _linked(source: str, target: str) -> bool:
    """Whether `target` is now a name of the file `source` (BS6); False: write it instead."""
    try:
        os.link(source, target)
    except FileExistsError:  # a file of this name left by an earlier run: replaced whole (BS1)
        return False
    except OSError:  # no such file (collected: RK2), another file system, no links here
        return False
    return True


def shelf_dir(log_path: object, node_id: str) -> Path | None:
    """Where node `node_id` keeps its held blocks: beside its transfer log (None: no log on disk)."""
    return Path(log_path).with_name(f"{node_id}.blocks") if isinstance(log_path, (str, Path)) else None

