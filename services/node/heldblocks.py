"""The blocks a node holds for a restore sent as blocks (snapmesh/protocol/restoreblocks.py RB3).

What it holds: the state of its last report as formed (SentBlocks keeps it,
cut and named, for the next report's hashes) and the state of its last restore
sent as blocks (its blocks each checked as they were rebuilt). Both in memory,
and a copy of each on disk (blockshelf.py, BS1-BS4), written off the report's and
the restore's path by one worker thread: a node that restarted still holds the
blocks its shelf has, each checked against its name when read, and a restore
after the restart sends only the others. A block neither in memory nor on the
shelf (never written, corrupt, removed) is not held: the node refuses the
restore as blocks and gets its state whole. A state is rebuilt and checked
before the node's machine hears of the restore, so a refusal changes nothing.

A restore streamed as blocks (snapmesh/protocol/restorestream.py RS4-RS5) is
never joined in pieces: each carried block goes to the shelf as it comes
(`carried`), and a state of more than FILE_REBUILD_BYTES is rebuilt from the
shelf block by block into a file beside it, checked, and read back in one
read: the node holds one block, then the state once (the app takes one
bytes), never a list of its blocks beside their join. For an app that restores
from blocks (snapmesh.app A9, `restore_blocks`) no state is joined at all: the
blocks are kept as they are read, checked, as a BlockState (blockstate.py), which
the app, the undo base, the restore record and `restored` all hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from snapmesh.protocol import blocks, restoreblocks, restorestream
from snapmesh.protocol.blockstate import BlockState
from snapmesh.services.node.blockshelf import BlockShelf
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

# A state up to this size is rebuilt on the event loop; a larger one in a thread (hashing it is milliseconds).
INLINE_REBUILD_BYTES = 64 * 1024
# A state over this size (by its manifest) is rebuilt through a file on the shelf (RS5), never joined from a list.
FILE_REBUILD_BYTES = 8 * 1024 * 1024


class MissingRestoreBlocks(Exception):
    """A restore as blocks this node cannot rebuild (RB3): FAILED_PRECONDITION, blocks.MISSING."""


class HeldBlocks:
    def __init__(self, sent: SentBlocks, shelf_dir: Path | None = None, linked_from: Path | None = None) -> None:
        self._sent = sent
        self._restored: blocks.Named | None = None  # the last state restored as blocks
        # linked_from: the pending reports' blocks, which the shelf links rather than writes (blockshelf.py BS6)
        self.shelf = BlockShelf(shelf_dir, linked_from) if shelf_dir is not None else None
        # One worker: the shelf's writes keep their order, and never hold up a report or a restore.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="block-shelf") if self.shelf is not None else None
        self._closed = False  # after close: no more writes (a state formed or restored then is not shelved)
        if self.shelf is not None:
            sent.on_formed = lambda named: self._shelve("report", named)

    def _shelve(self, slot: str, named: blocks.Named) -> None:
        # Closed: dropped, as a write that failed is (the shelf is a cache; a restart sends what it lacks).
        if self._writer is None or self._closed:
            return
        try:
            self._writer.submit(self._keep, slot, named)
        except RuntimeError:  # closed meanwhile: a report formed in a thread (reporter.py) as the node stopped
            log.debug("node stopping: the %s state's blocks are not kept", slot)

    def _keep(self, slot: str, named: blocks.Named) -> None:
        try:
            self.shelf.keep(slot, named)  # type: ignore[union-attr]
        except OSError as exc:  # the shelf is a cache: a block not written is not held, and sent again
            log.warning("cannot keep the %s state's blocks under %s: %s", slot, self.shelf.directory, exc)  # type: ignore[union-attr]

    def flush(self) -> None:
        """Wait for the shelf's writes asked for so far (a test's)."""
        if self._writer is not None and not self._closed:
            self._writer.submit(lambda: None).result()

    def close(self) -> None:
        """Take no more writes, finish those asked for so far (each file whole, BS1: no
        temporary file is left) and end the worker thread. Blocks: `aclose` on a loop."""
        self._closed = True
        if self._writer is not None:
            self._writer.shutdown(wait=True)

    async def aclose(self) -> None:
        """`close` for the node's stop: the pending writes are files', so waited for off the
        event loop. Closed here, on the loop, first: no `_shelve` (a loop's call) submits after."""
        self._closed = True
        await asyncio.to_thread(self.close)

    async def state_of(
        self, request: pb.RestoreStateRequest, as_blocks: bool = False,
    ) -> tuple[bytes | BlockState | None, blocks.Named | None]:
        """The state `request` restores (its `state`, or rebuilt from its blocks and
        those held), and, rebuilt, its blocks for `restored`. `as_blocks`: rebuilt as a
        BlockState, never joined (the app restores from blocks). Raises MissingRestoreBlocks."""
        if not request.HasField("state_blocks"):
            return (request.state if request.HasField("state") else None), None
        get = restoreblocks.reader(self._sent.last, self._restored, shelf=self.shelf.get if self.shelf else None)
        if as_blocks:
            if self.shelf is None and len(request.state_blocks.hashes) * blocks.BLOCK_BYTES <= INLINE_REBUILD_BYTES:
                return self._rebuilt_as_blocks(request, get)
            return await asyncio.to_thread(self._rebuilt_as_blocks, request, get)
        if self.shelf is not None and len(request.state_blocks.hashes) * blocks.BLOCK_BYTES > FILE_REBUILD_BYTES:
            return await asyncio.to_thread(self._rebuilt_through_file, request, get)
        if self.shelf is None and len(request.state_blocks.hashes) * blocks.BLOCK_BYTES <= INLINE_REBUILD_BYTES:
            named, why = restoreblocks.whole_restore(request, get)
        else:  # a read from the shelf is a file's: never on the event loop
            named, why = await asyncio.to_thread(restoreblocks.whole_restore, request, get)
        if named is None:
            raise MissingRestoreBlocks(why)
        return named.state, named

    def _rebuilt_through_file(
        self, request: pb.RestoreStateRequest, get: Callable[[bytes], bytes | None],
    ) -> tuple[bytes, blocks.Named]:
        """RS5 through `<shelf>/.rebuilt.tmp`: each block written as it is checked, the
        whole read back in one read (one copy of the state). Raises MissingRestoreBlocks."""
        assert self.shelf is not None
        self.shelf.directory.mkdir(parents=True, exist_ok=True)
        path = self.shelf.directory / ".rebuilt.tmp"  # the shelf's scan removes one a crash left (BS1)
        try:
            with open(path, "wb") as out:
                bounds, why = restorestream.rebuild(request, get, out.write)
            if bounds is None:
                raise MissingRestoreBlocks(why)
            state = path.read_bytes()
        finally:
            path.unlink(missing_ok=True)
        return state, blocks.Named(state, bounds, list(request.state_blocks.hashes), {})

    @staticmethod
    def _rebuilt_as_blocks(
        request: pb.RestoreStateRequest, get: Callable[[bytes], bytes | None],
    ) -> tuple[BlockState, blocks.Named]:
        """RS5 into a list of the blocks as read and checked: no join. Raises MissingRestoreBlocks."""
        found: list[bytes] = []
        bounds, why = restorestream.rebuild(request, get, found.append)
        if bounds is None:
            raise MissingRestoreBlocks(why)
        state = BlockState(found)
        return state, blocks.Named(state, bounds, list(request.state_blocks.hashes), {})  # type: ignore[arg-type]

    async def carried(self, carried: list[bytes]) -> None:
        """Blocks a streamed restore carried: to the shelf (BS5), off the event loop."""
        shelf = self.shelf
        assert shelf is not None
        await asyncio.to_thread(lambda: [shelf.add(block) for block in carried])

    def restored(self, named: blocks.Named | None) -> None:
        """The node took the restore whose state `state_of` rebuilt as `named`."""
        if named is not None:
            self._restored = named
            self._shelve("restored", named)
