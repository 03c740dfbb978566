"""What each node holds of its states' blocks as the controller knows it, and a restore sent so.

A node whose report says it holds blocks (FullState.holds_blocks) keeps that
state's blocks (services/node/heldblocks.py); the controller notes their names
here when it accepts the report (`reported`), and a restore then sends that
node its state as blocks: the manifest and only the blocks it lacks
(snapmesh/protocol/restoreblocks.py RB1-RB3). The node refuses a restore it
cannot rebuild (blocks.MISSING: it restarted, or formed a newer report since);
the controller then forgets what it took the node to hold and sends the state
whole at once. A restore taken as blocks adds its state's blocks to what the
node holds (it keeps them too), until its next report.

What it knows is noted on disk too (`remember_in`, heldseed.py HT1-HT3; written in
order by one worker thread, never on the event loop: a report's answer, and the
trigger's COMPLETE right behind it, do not wait for a file; `flush`, `close`): per node,
one small file naming the snapshot of its last accepted report, that report's
parts, and the snapshot of the last restore it took as blocks; a controller
that restarted takes it back from those and the stored manifests, so the first
restore after it sends only what each node lacks. A note is a belief, never
trusted for correctness (restoreblocks.py RB5): a node that lacks a block
refuses, and gets its state whole.

A part that is a manifest (a listed state, snapmesh/protocol/restorestream.py
RS1) is never joined here: the blocks the node is not taken to hold are read
from the block store one at a time (`read`: each checked against its name) and
streamed to the node's RestoreStateChunks (RS4); a node that refuses them
(blocks.MISSING) is sent every block of its state, the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from snapmesh.protocol import blocks, chunking, restoreblocks, restorestream
from snapmesh.protocol.controller.effects import RestoreAt
from snapmesh.protocol.retry import Failed
from snapmesh.serving import calls
from snapmesh.serving.durable import write_unsynced
from snapmesh.v1 import snapmesh_pb2 as pb

log = logging.getLogger(__name__)

READ_BATCH = 64  # blocks read from the store per thread hop of a streamed restore (512 KiB)


class NodeBlocks:
    def __init__(self) -> None:
        # node -> the names of its last accepted report's state and that report's parts (one assignment each)
        self._by_node: dict[str, tuple[frozenset[bytes], tuple[int, ...]]] = {}
        self.sent_bytes = 0  # restore requests' bytes sent, in all (a state as blocks: manifest and new blocks)
        self.directory: Path | None = None  # where the notes go (`remember_in`); None: memory only
        self.read: Callable[[bytes], bytes | None] | None = None  # the store's block, checked (RS1 parts)
        self.streamed_blocks = 0  # blocks streamed to nodes for RS1 parts, in all (what a held block saves)

        self._writer: ThreadPoolExecutor | None = None  # the notes' one worker (`remember_in`)

    def remember_in(self, directory: Path) -> None:
        """Note what each node holds under `directory` from now on (heldseed.py HT1)."""
        self.directory = Path(directory)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="node-notes")

    def flush(self) -> None:
        """Wait for the notes asked for so far to be written."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()

    def close(self) -> None:
        """Write the notes asked for so far, and end the worker (blocks: a thread's, or at stop)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)

    def believe(self, node_id: str, names: frozenset[bytes], parts: tuple[int, ...]) -> None:
        """After a restart: `node_id` is taken to hold `names` (heldseed.py HT2), until it says otherwise."""
        if names:
            self._by_node[node_id] = (names, parts)

    def reported(self, report: pb.FullState, names: Collection[bytes]) -> None:
        """The controller accepted `report`, whose state's blocks are `names` (RB1)."""
        if report.holds_blocks and names:
            self._by_node[report.node_id] = (frozenset(names), tuple(report.state_parts))
            self._note(report.node_id, {"report": report.snapshot_id, "parts": list(report.state_parts)})
        else:  # a node from before (or one that went back to it): whole
            self._by_node.pop(report.node_id, None)
            self._note(report.node_id, None)

    def held(self, node_id: str) -> tuple[frozenset[bytes], tuple[int, ...]]:
        return self._by_node.get(node_id, (frozenset(), ()))

    def note_path(self, node_id: str) -> Path | None:
        """The note of `node_id` (its name hex-encoded: any node id is a file name)."""
        return None if self.directory is None else self.directory / f"{node_id.encode().hex()}.json"

    def _note(self, node_id: str, note: dict[str, Any] | None, *, restored: str = "") -> None:
        """Have `node_id`'s note written (None: removed) by the worker, after those asked before."""
        path = self.note_path(node_id)
        if path is None or self._writer is None:
            return
        try:
            self._writer.submit(self._write_note, path, node_id, note, restored)
        except RuntimeError:  # closed: the controller is stopping; a note lost costs a restore sent whole
            log.debug("controller stopping: the note of node %s is not written", node_id)

    @staticmethod
    def _write_note(path: Path, node_id: str, note: dict[str, Any] | None, restored: str) -> None:
        """Write a note (None: remove it). A note is a belief (RB5): written whole or not
        at all, unsynced, and a failure to write it only costs a restore sent whole."""
        try:
            if note is None:
                path.unlink(missing_ok=True)
                return
            if restored:
                try:
                    note = {**json.loads(path.read_text()), "restored": restored}
                except (OSError, ValueError):
                    return  # no note of its report: nothing to add the restore to
            write_unsynced(path, json.dumps(note).encode())
        except OSError as exc:
            log.warning("cannot note what node %s holds in %s: %s", node_id, path, exc)

    async def restore(self, stub: Any, effect: RestoreAt) -> Any:
        """Carry out `effect`: its state as blocks to a node that holds some of them,
        whole to any other and after a refusal naming a missing block (RB3)."""
        held, parts = self.held(effect.node)
        log.debug("restore at %s: it holds %d blocks", effect.node, len(held))
        if restorestream.is_listed(effect.request):
            return await self._streamed(stub, effect, held, parts)
        if held and effect.request.HasField("state") and effect.request.state:
            sent, names = await asyncio.to_thread(restoreblocks.referenced_restore, effect.request, held, parts)
            if sent is not None:
                log.info("restore at %s: its state as blocks, %d of %d sent", effect.node, len(sent.blocks),
                         len(sent.state_blocks.hashes))
                answer = await calls.call(_rpc(stub, sent), sent, effect.retry)
                if not (isinstance(answer, Failed) and answer.code == "FAILED_PRECONDITION"
                        and answer.details.startswith(blocks.MISSING)):
                    self._sent(answer, sent)
                    if not isinstance(answer, Failed) and self._by_node.get(effect.node) == (held, parts):
                        # the node holds the restored state's blocks too (heldblocks.py), until it restarts
                        self._by_node[effect.node] = (held | frozenset(names), parts)
                        self._note(effect.node, {}, restored=effect.request.snapshot_id)
                    return answer
                log.info("restore at %s: %s; sending the state whole", effect.node, answer.details)
                self._by_node.pop(effect.node, None)
                self._note(effect.node, None)
        answer = await calls.call(_rpc(stub, effect.request), effect.request, effect.retry)
        self._sent(answer, effect.request)
        return answer

    async def _streamed(self, stub: Any, effect: RestoreAt, held: frozenset[bytes], parts: tuple[int, ...]) -> Any:
        """An RS1 part: the blocks the node lacks streamed to it (RS2, RS4); all of them after a refusal."""
        request = effect.request
        names = list(request.state_blocks.hashes)
        retry = restorestream.retry_for(effect.retry, request)
        answer = await calls.call(self._stream_rpc(stub, effect.node, names, held), request, retry)
        if held and isinstance(answer, Failed) and answer.code == "FAILED_PRECONDITION" \
                and answer.details.startswith(blocks.MISSING):
            log.info("restore at %s: %s; sending every block", effect.node, answer.details)
            self._by_node.pop(effect.node, None)
            self._note(effect.node, None)
            return await calls.call(self._stream_rpc(stub, effect.node, names, frozenset()), request, retry)
        if not isinstance(answer, Failed) and held and self._by_node.get(effect.node) == (held, parts):
            self._by_node[effect.node] = (held | frozenset(names), parts)  # as `restore`: it keeps them too
            self._note(effect.node, {}, restored=request.snapshot_id)
        return answer

    def _stream_rpc(self, stub: Any, node: str, names: list[bytes], held: frozenset[bytes]) -> Callable[..., Any]:
        """RestoreStateChunks with the blocks of `names` not in `held`, each read as it is sent."""
        sending = restorestream.to_send(names, held)
        log.info("restore at %s: its state as a stream of blocks, %d of %d sent", node, len(sending), len(names))

        async def pieces(request: pb.RestoreStateRequest) -> AsyncIterator[pb.RestoreStateChunk]:
            stream = restorestream.Stream()
            for data in stream.header(request):
                yield pb.RestoreStateChunk(data=data)
            for at in range(0, len(sending), READ_BATCH):  # one thread hop per batch, not per block
                for block in await asyncio.to_thread(self._blocks, sending[at : at + READ_BATCH]):
                    for data in stream.block(block):
                        yield pb.RestoreStateChunk(data=data)
            for data in stream.end():
                yield pb.RestoreStateChunk(data=data)
            self.streamed_blocks += stream.sent_blocks
            self.sent_bytes += stream.sent_bytes

        def call(request: pb.RestoreStateRequest, **kwargs: Any) -> Any:
            return stub.RestoreStateChunks(pieces(request), **kwargs)

        return call

    def _blocks(self, names: list[bytes]) -> list[bytes]:
        return [block for name in names if (block := self._block(name)) is not None]

    def _block(self, name: bytes) -> bytes | None:
        """Block `name` from the store, checked; None: missing or corrupt. RS3 checked every one
        before the restore began; one lost since is not sent (an exception in a request stream
        cancels the call), and the node, which checks the whole against its digest before it
        changes anything, refuses it unless it holds that block (RS5): never a wrong state."""
        try:
            block = self.read(name) if self.read is not None else None
        except OSError as exc:
            log.warning("cannot read block sha256:%s from the block store: %s", name.hex(), exc)
            return None
        if block is None or blocks.block_hash(block) != name:
            log.warning("block sha256:%s is missing or corrupt in the controller's block store: not sent", name.hex())
            return None
        return block

    def _sent(self, answer: Any, request: pb.RestoreStateRequest) -> None:
        if not isinstance(answer, Failed):
            self.sent_bytes += request.ByteSize()


def _rpc(stub: Any, request: pb.RestoreStateRequest) -> Callable[..., Any]:
    """RestoreState, or RestoreStateChunks for a request over a node's receive limit (docs/api.md)."""
    if request.ByteSize() <= chunking.CHUNK_BYTES:
        return stub.RestoreState
    rpc = stub.RestoreStateChunks

    def call(request: pb.RestoreStateRequest, **kwargs: Any) -> Any:
        return rpc(iter(chunking.restore_chunks(request)), **kwargs)

    return call
