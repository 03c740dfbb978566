"""The blocks a node holds for a restore sent as blocks (snapmesh/protocol/restoreblocks.py RB3).

What it holds: the state of its last report as formed (SentBlocks keeps it,
cut and named, for the next report's hashes) and the state of its last restore
sent as blocks (its blocks each checked as they were rebuilt). Both only in
memory: a node that restarted holds nothing, refuses a restore as blocks, and
gets its state whole. A state is rebuilt and checked before the node's machine
hears of the restore, so a refusal changes nothing.
"""

from __future__ import annotations

import asyncio

from snapmesh.protocol import blocks, restoreblocks
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb

# A state up to this size is rebuilt on the event loop; a larger one in a thread (hashing it is milliseconds).
INLINE_REBUILD_BYTES = 64 * 1024


class MissingRestoreBlocks(Exception):
    """A restore as blocks this node cannot rebuild (RB3): FAILED_PRECONDITION, blocks.MISSING."""


class HeldBlocks:
    def __init__(self, sent: SentBlocks) -> None:
        self._sent = sent
        self._restored: blocks.Named | None = None  # the last state restored as blocks

    async def state_of(self, request: pb.RestoreStateRequest) -> tuple[bytes | None, blocks.Named | None]:
        """The state `request` restores (its `state`, or rebuilt from its blocks and
        those held), and, rebuilt, its blocks for `restored`. Raises MissingRestoreBlocks."""
        if not request.HasField("state_blocks"):
            return (request.state if request.HasField("state") else None), None
        get = restoreblocks.reader(self._sent.last, self._restored)
        if len(request.state_blocks.hashes) * blocks.BLOCK_BYTES <= INLINE_REBUILD_BYTES:
            named, why = restoreblocks.whole_restore(request, get)
        else:
            named, why = await asyncio.to_thread(restoreblocks.whole_restore, request, get)
        if named is None:
            raise MissingRestoreBlocks(why)
        return named.state, named

    def restored(self, named: blocks.Named | None) -> None:
        """The node took the restore whose state `state_of` rebuilt as `named`."""
        if named is not None:
            self._restored = named
