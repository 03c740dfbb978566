"""Block files written after their report is answered, pure: which pending write each reader waits for.

A report's new blocks cost the controller about 60% of its CPU on the report's
path (open, write, close and rename per block: system CPU) before it was
answered, yet their file is not what makes them durable: the report's journal
record carries them (journalblocks.py JB1, blockdir.py D8). So those files are
written after the report is answered, by one thread in batches
(services/controller/blockwriter.py), and this object says what is pending and
who must wait for what. Nothing here does I/O or takes a lock; the shell holds
one lock over every call, except `get` (BW2).

BW1. Only blocks a journal record carries are deferred (blockdir.py `write_later`),
    and only while the bytes pending stay within `max_bytes`: the pending blocks are
    held in memory until written, so past the bound a report's blocks are written
    on its path, as before (`defer` gives them back). A block already pending is not
    deferred twice (its name is its content).
BW2. Until its file is written, a pending block is read from here (`get`), by every
    reader of the block store (filing, export, GetSnapshot, verify, restore, the
    reports' own reads), and counted as held (blockdir.py D5). `get` needs no lock:
    `take` puts a block in the batch before it leaves the queue, and `written` lets
    it go only once its file is renamed into place, so a reader finds it here or in
    its file.
BW3. The writer takes the pending blocks in the order they were deferred, a batch
    at a time (`take`), and reports the batch done, written or failed (`written`).
    A batch that failed is dropped all the same: its record still makes its blocks
    durable (the replay writes them back, JB3), and the store notes them missing
    so the nodes' next reports send them whole (D5).
BW4. A deletion of some names first takes them (`claim`): those queued leave the
    queue (never written, so no file appears after its deletion as garbage), and
    those in the batch under way are waited for (returned: the caller waits until
    `in_batch` has none of them) and then deleted. A block deleted while a later
    report names it cannot happen here: the store deletes only blocks neither
    pinned nor referenced, under the lock a report pins under before it defers
    (store.py `keep`), so such a block is deferred again after its deletion.
BW5. `settle` (before a manifest names a block, before a journal rewrite drops a
    record, before a report answered without a record of its own), a durable write
    of a name pending (an unsynced rename after it would replace its durable file)
    and the controller's orderly stop wait until every block deferred before them is
    written (`mark`, then `flushed`); then settle's sync covers them (D8). A
    SIGKILL with writes pending loses none: each is carried by a live record,
    written back at the restart (JB3).
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_MAX_BYTES = 32 << 20  # BW1: at ~78 new blocks a report, hundreds of reports' worth
BATCH_BLOCKS = 256  # BW3: one batch's blocks (2 MiB): a deletion waits for at most this much


class PendingWrites:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        # name -> (the count of its deferral, content); insertion order is the deferral's (BW3)
        self._queued: dict[bytes, tuple[int, bytes]] = {}
        self._batch: dict[bytes, tuple[int, bytes]] = {}  # taken by the writer, not yet written
        self._count = 0
        self.pending_bytes = 0

    def __len__(self) -> int:
        return len(self._queued) + len(self._batch)

    def __contains__(self, name: bytes) -> bool:
        return name in self._queued or name in self._batch

    def names(self) -> set[bytes]:
        return {*self._queued, *self._batch}

    def defer(self, blocks: dict[bytes, bytes]) -> dict[bytes, bytes]:
        """Defer `blocks` (name -> content, each carried by a journal record): those to write
        now are given back, all of them past the bound (BW1), else none."""
        new = {name: block for name, block in blocks.items() if name not in self}
        size = sum(map(len, new.values()))
        if self.pending_bytes + size > self.max_bytes:
            return new
        for name, block in new.items():
            self._count += 1
            self._queued[name] = (self._count, block)
        self.pending_bytes += size
        return {}

    def get(self, name: bytes) -> bytes | None:
        """The content of pending block `name` (BW2); None: not pending."""
        entry = self._queued.get(name) or self._batch.get(name)
        return None if entry is None else entry[1]

    def take(self, limit: int = BATCH_BLOCKS) -> dict[bytes, bytes]:
        """The next batch for the writer (BW3): up to `limit` blocks, the first deferred first."""
        if self._batch:
            raise RuntimeError("a batch is being written: report it `written` before taking another")
        taken = {}
        for name in list(self._queued)[:limit]:
            self._batch[name] = self._queued[name]  # in the batch before it leaves the queue (BW2)
            taken[name] = self._queued.pop(name)[1]
        return taken

    def written(self) -> None:
        """The batch taken is done, its files renamed into place (or it failed: BW3)."""
        self.pending_bytes -= sum(len(block) for _, block in self._batch.values())
        self._batch = {}

    def claim(self, names: Iterable[bytes]) -> set[bytes]:
        """Take `names` out of the queue (BW4): those in the batch under way are returned, to be waited for."""
        if not self:
            return set()
        waiting = set()
        for name in names:
            if (entry := self._queued.pop(name, None)) is not None:
                self.pending_bytes -= len(entry[1])
            elif name in self._batch:
                waiting.add(name)
        return waiting

    def in_batch(self, names: set[bytes]) -> bool:
        """Whether the batch under way still holds any of `names` (BW4)."""
        return not self._batch.keys().isdisjoint(names)

    def mark(self) -> int:
        """The count of the last deferral so far: `flushed(mark)` once all up to it are written (BW5)."""
        return self._count

    def flushed(self, mark: int) -> bool:
        """Whether every block deferred up to `mark` is written (or claimed: BW4)."""
        return all(next(iter(pending.values()))[0] > mark for pending in (self._queued, self._batch) if pending)
