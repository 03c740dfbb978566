"""The Controller gRPC service: RPCs in, the engine's calls out (services/controller/engine.py).

Requests are checked and turned into the engine's events; each refusal the pure
layer raises names its status code (`code`: NOT_FOUND, INVALID_ARGUMENT,
ALREADY_EXISTS, FAILED_PRECONDITION...) and becomes it here (`_answers`); what a
read answers (pages, tokens, sizes) is snapmesh/protocol/controller/listing.py's,
what a snapshot answer carries of the app's states answers.py's (bounded
answers: past `[controller] answer_state_bytes` they are left out, and
GetSnapshotChunks serves them), and this module fetches it.

Who may call what is snapmesh.settings.access, checked before a handler runs:
TriggerSnapshot and RestoreSnapshot answer a client's certificate only (AUTH1: a
node's never, with or without the token); ReportState a node's, and here only
the one the request names (AUTH3).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.blockdir import kept_reader
from snapmesh.services.controller.listedload import load_listed
from snapmesh.protocol import blocks, carriedblocks, chunking
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.controller import answers, blockforms, cluster, journalblocks, listing, statuses
from snapmesh.protocol.controller.knownblocks import DEFAULT_MAX_BYTES as KNOWN_MAX_BYTES
from snapmesh.protocol.controller.knownblocks import KnownBlocks
from snapmesh.protocol.controller.manifestbases import ManifestBases
from snapmesh.protocol.controller.refusals import MissingBlocks
from snapmesh.protocol.controller.tracker import UnknownSnapshot
from snapmesh.settings.agreement import Agreement
from snapmesh.protocol.retry import Retry
from snapmesh.serving import calls, credentials
from snapmesh.serving.fanout import FellBehind
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

# A report as blocks of a larger state is listed without being joined (blockforms.py BF6): the
# kept blocks (knownblocks.py) hold no state over this bound, so joining one buys nothing.
JOINED_MAX_BYTES = KNOWN_MAX_BYTES
# A state sent whole and of at most one block is neither cut, kept nor written before its record (its
# filing writes its block later, off the path): keeping it cost a thread hand-off and two syncs on every
# report, to save the node at most one block's bytes on its next. It is answered takes_blocks=False,
# so the node's next report comes whole as well (sentblocks.py).
KEPT_MIN_BYTES = blocks.BLOCK_BYTES
# A node's GetState (mode_mismatch asks again in its next round). It copies and hashes the node's
# app state: seconds at 1 GiB on a busy machine. Past a 2 s timeout each node was asked again and
# again, copying and hashing its state without end while it took snapshots.
ASK_ONCE = Retry(60.0, tries=1)


def _answers(journaled: str = "") -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """A unary handler whose errors are answered as statuses.status says (naming
    what it `journaled`); one that is no answer is raised."""

    def wrap(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(handler)
        async def answer(self, request, context):
            try:
                return await handler(self, request, context)
            except Exception as exc:
                if (answered := statuses.status(exc, journaled)) is None:
                    raise
                await context.abort(grpc.StatusCode[answered[0]], answered[1])

        return answer

    return wrap


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, engine: ControllerEngine) -> None:
        self.engine = engine
        self._chunk_budget = chunking.ChunkBudget()  # ReportStateChunks' bytes in flight, per peer and in all
        self.interval_s = 0.0  # periodic snapshots (main sets it): GetCluster tells clients
        self._calls = itertools.count(1)  # names each report's pins (journalblocks.py JB1)
        self._known = KnownBlocks()  # each node's last state's blocks (knownblocks.py)
        self._bases = ManifestBases()  # each node's last manifests, the bases of its changes (manifestdelta.py)
        # Listed states (blockforms.py) are read by block: those kept here first, then the store's
        engine.machine.forms.reader = self._block_reader
        if engine.writer is not None:  # an engine that only publishes (a watchers' test) files nothing
            engine.writer.store.reader = self._block_reader
            engine.writer.store.sized = self._block_size
        engine.machine.forms.states = self._joined
        # each node's last listed state, joined (the bytes the kept blocks are cut from: no copy)
        self._states: dict[str, tuple[tuple[bytes, ...], bytes]] = {}
        # each node's last state listed unjoined: its blocks' sizes, each checked against its name (BF6)
        self._sizes: dict[str, dict[bytes, int]] = {}
        # node id -> its sizes (the very dict) found all on disk, and BlockDir.removals then (D10)
        self._sizes_checked: dict[str, tuple[dict[bytes, int], int]] = {}

    async def mode_mismatch(self, retry_s: float = 0.5) -> str:
        """Ask every node its snapshot_mode and its app (GetState, retried until it
        answers); return the first disagreement with the controller's, in words.
        Never returns while every node agrees (a mixed cluster is refused, not run)."""
        agreement = Agreement(self.engine.config, self.engine.stubs)
        while not agreement.done:
            for node in agreement.to_ask():
                state = await calls.call(self.engine.stubs[node].GetState, pb.GetStateRequest(), ASK_ONCE)
                if problem := agreement.answered(node, state):
                    return problem
            if not agreement.done:
                await asyncio.sleep(retry_s)
        await asyncio.Event().wait()  # all agree: nothing to report, ever
        return ""

    @_answers("restore")
    async def RestoreSnapshot(self, request: pb.RestoreSnapshotRequest, context) -> pb.Restore:
        listing.check_id(request.snapshot_id)
        # A restore by block lists reads no file but its blocks, each checked (restorestream.py RS3):
        # reading the files whole here would join every state (a checksum is of the whole form).
        listed = None if request.nodes else await self.engine.listed_for_restore(request.snapshot_id)
        if damaged := (self.engine.writer.store.damaged.get(request.snapshot_id) if listed is not None
                       else await self._damage(request.snapshot_id)):
            raise listing.Damaged(request.snapshot_id, damaged, restoring=True)
        return await self.engine.restore(request.snapshot_id, request.request_id, list(request.nodes), listed)

    async def _damage(self, snapshot_id: str) -> str:
        """Why the stored files of `snapshot_id` are damaged ("" when intact or
        not written yet): found so at start-up, or checked now (off the loop)."""
        store = self.engine.writer.store
        if snapshot_id in store.damaged:
            return store.damaged[snapshot_id]
        return await asyncio.to_thread(store.damage, snapshot_id)

    @property
    def _state_bytes(self) -> int:
        """Past this many bytes of states in all, an answer leaves them out (answers.py BA2)."""
        return self.engine.config.controller.answer_state_bytes

    # -- RPCs

    @_answers("snapshot")
    async def TriggerSnapshot(self, request: pb.TriggerSnapshotRequest, context) -> pb.Snapshot:
        if request.stop:  # stop with a snapshot: waits for its end
            snapshot = await self.engine.stop(request.initiator)
        else:
            snapshot = await self.engine.trigger(request.initiator, broadcast=request.broadcast, wait=request.wait)
        return answers.bounded(snapshot, state_bytes=self._state_bytes, whole=self._whole)

    def _whole(self, snapshot: pb.Snapshot) -> pb.Snapshot:
        """The whole form of a snapshot with listed states (answers.py BA5), read by block."""
        return self.engine.machine.forms.whole(snapshot)

    def _joined(self, names: tuple[bytes, ...]) -> bytes | None:
        """The state `names` make, when it is a node's last listed one (blockforms.py `states`)."""
        for held, state in list(self._states.values()):
            if held == names:
                return state
        return None

    def _hold(self, node_id: str, names: tuple[bytes, ...], state: bytes) -> None:
        """Keep the node's last listed state joined, within KnownBlocks' bound (older ones leave first)."""
        states = dict(self._states)  # swapped in with one assignment: a reader in another thread sees one
        states.pop(node_id, None)
        states[node_id] = (names, state)
        while states and sum(len(s) for _, s in states.values()) > KNOWN_MAX_BYTES:
            del states[next(iter(states))]
        self._states = states

    def _block_reader(self) -> Callable[[bytes], bytes | None]:
        """A reader of blocks by name: the kept ones (each while its file is there, checked
        when kept: blockdir.py D5), else the store's file, checked against its name (blocks.py B3)."""
        files = self.engine.writer.store.blocks
        known = kept_reader(self._known.reader(""), files)  # checked against its name when kept (D5)

        def read(name: bytes) -> bytes | None:
            if (block := known(name)) is not None:
                return block
            block = files.read(name)
            return block if block is not None and blocks.block_hash(block) == name else None

        return read

    async def _snapshot(self, request: pb.GetSnapshotRequest, context, *, listed: bool = False) -> pb.Snapshot:
        """The snapshot asked for (`listed`: its large states as block lists, blockforms.py)."""
        try:
            listing.check_get(request)
            snapshot = self.engine.lookup(request.snapshot_id, listed=listed)
        except (listing.BadRequest, UnknownSnapshot) as exc:  # Damaged too (L5)
            code, details = statuses.status(exc)  # type: ignore[misc]
            await context.abort(grpc.StatusCode[code], details)
        await self.engine.durable()  # what was read is what the journal holds
        return snapshot

    @_answers()
    async def GetSnapshot(self, request: pb.GetSnapshotRequest, context) -> pb.Snapshot:
        # Listed, its states joined only when the answer carries them (answers.py BA5): an answer
        # that leaves them out never holds them (the controller's peak, docs/bench-cluster.md)
        snapshot = await self._snapshot(request, context, listed=True)
        limit = request.max_bytes or listing.CLIENT_DEFAULT_BYTES
        snapshot = answers.bounded(snapshot, state_bytes=self._state_bytes, max_bytes=limit, must_fit=False,
                                   whole=self._whole)
        listing.check_size(request.snapshot_id, snapshot.ByteSize(), request.max_bytes)
        return snapshot

    async def GetSnapshotChunks(self, request: pb.GetSnapshotRequest, context) -> AsyncIterator[pb.SnapshotChunk]:
        for chunk in listing.chunks(await self._snapshot(request, context)):
            yield chunk

    @_answers()
    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context) -> pb.ListSnapshotsResponse:
        start = listing.list_start(request)
        page = listing.Page(start, request.status, state_bytes=self._state_bytes)
        async for snapshot in self._listed(start, request.status):
            if not page.offer(snapshot):
                break
        await self.engine.durable()  # what was read is what the journal holds
        return page.response

    async def _listed(self, start: listing.Start, status: int) -> AsyncIterator[pb.Snapshot | None]:
        """The snapshots `listing.Merge` names (None: gone meanwhile), in id order:
        the working set's from memory, the others read a batch at a time, off the
        event loop (no file is read but the ones listed)."""
        store, machine = self.engine.writer.store, self.engine.machine
        merge = listing.Merge(listing.held(machine.ids(), machine.status, start, status), start.after, start.batch)
        while not merge.done:
            ids = merge.take(store.index.after(merge.cursor, status, start.batch))
            found = {sid: self._held(sid) for sid in ids}  # None: filed, or filed meanwhile
            found |= await asyncio.to_thread(self._load_each, store, [sid for sid in ids if found[sid] is None])
            for sid in ids:
                yield found[sid]

    def _load_each(self, store, snapshot_ids: list[str]) -> dict[str, pb.Snapshot | None]:
        """The filed snapshots, listed (listedload.py), each whole only when the page would show its states."""
        return {sid: self._shown(load_listed(store, sid)) for sid in snapshot_ids}

    def _shown(self, snapshot: pb.Snapshot | None) -> pb.Snapshot | None:
        """`snapshot` as a page shows it: its listed states read whole only when they are shown (BA1)."""
        if snapshot is not None and blockforms.listed(snapshot) and blockforms.state_bytes(snapshot) <= self._state_bytes:
            snapshot = self.engine.machine.forms.whole(snapshot)
        return snapshot

    def _held(self, snapshot_id: str) -> pb.Snapshot | None:
        """A snapshot the machine holds, as a page shows it (None: it holds none): its
        listed states (blockforms.py) read whole only when the page would show them."""
        machine = self.engine.machine
        try:
            snapshot = machine.listed(snapshot_id)
        except UnknownSnapshot:
            return None
        return self._shown(snapshot)

    async def WatchSnapshots(self, request: pb.WatchSnapshotsRequest, context) -> AsyncIterator[pb.Snapshot]:
        try:
            with self.engine.watchers.subscribe() as updates:
                async for snapshot in updates:
                    yield answers.bounded(snapshot, state_bytes=self._state_bytes, whole=self._whole)
        except FellBehind as behind:
            code, details = statuses.dropped(behind)
            await context.abort(grpc.StatusCode[code], details)

    async def GetCluster(self, request: pb.GetClusterRequest, context) -> pb.Cluster:
        config = self.engine.config
        return cluster.answer(config.nodes, self.engine.machine, snapshot_mode=config.snapshot_mode, interval_s=self.interval_s,
                              answer_state_bytes=self._state_bytes, app=config.app.module)

    @_answers("report")
    async def ReportState(self, request: pb.FullState, context) -> pb.ReportStateResponse:
        return await self._report([request], context)

    async def _report(self, taken: list[pb.FullState], context, call: int = 0) -> pb.ReportStateResponse:
        """ReportState's work on the report in `taken`, taken out of it: a held call (held.py H1) waits here
        until its snapshot ends, and a large state that came whole must not live that long in a caller's
        frame (blockforms.py BF5). `call`: what pins its blocks (0: a new one)."""
        request = taken.pop()
        await credentials.require_peer(context, request.node_id)  # with TLS: a node reports only its own state
        listing.check_id(request.snapshot_id)
        sent, call, names, manifest = None, call or next(self._calls), [], None
        if request.HasField("state_blocks") or request.HasField("state_change"):  # rebuilt first (B4, MB2), its
            # names made a set in the thread too: the loop goes on with the other reports; a change journaled as it came (JC1)
            came, (request, names, manifest, sent) = request, await asyncio.to_thread(self._named_report, request, call)
            sent = came if came.HasField("state_change") else sent
        elif request.HasField("state") and len(request.state) > KEPT_MIN_BYTES:  # kept for its next report (knownblocks.py)
            names, listed = await asyncio.to_thread(self._know, request, call)  # written: a thread (store.py `keep`)
            if listed is not None:  # BF5: its manifest from here on, journaled so (journalblocks.py JB4)
                request = sent = listed
        if request.state_parts:  # the store cuts the state as the node did (blocks.py B6)
            self.engine.writer.store.note_parts(request.snapshot_id, request.node_id, tuple(request.state_parts))
        try:
            journaled = await self.engine.report(request, sent=sent)  # journaled as it came (journalblocks.py JB1)
            if not journaled and names and self.engine.writer.store.blocks.unsynced:
                # blockdir.py D8: no record of its own carries the blocks it wrote unsynced (a repeat,
                # or held and dropped at FAILED), and the node takes them as held once answered
                await asyncio.to_thread(self.engine.writer.store.blocks.settle)
        except Exception as exc:  # refused: never journaled, so nothing needs its blocks kept (an OSError: the
            if names and not isinstance(exc, OSError):  # journal failed; its record may be on disk: the pins stay)
                self.engine.writer.unpin(request.snapshot_id, call)
            raise
        self.engine.node_blocks.reported(request, names)  # a restore may send it only what it lacks
        if based := bool(names and journaled):  # its record durable: the base of the node's next change (MB1, JC1)
            self._bases.kept(request.node_id, request.snapshot_id, manifest or names)  # type: ignore[arg-type]
        return pb.ReportStateResponse(takes_blocks=bool(names), takes_changes=based)  # none kept: whole next

    def _named_report(self, sent: pb.FullState, call: int) -> tuple[pb.FullState, frozenset[bytes], list[bytes], pb.FullState]:
        """`_whole_report` of `sent` with its full manifest (a change rebuilt from its base, manifestbases.py
        MB2), its names as one set (the pins, NodeBlocks) and in order, and `sent` so rebuilt (a thread)."""
        sent, manifest = self._bases.whole(sent)
        if manifest is None:
            manifest = list(sent.state_blocks.hashes)
        names = frozenset(manifest)
        return self._whole_report(sent, call, names, manifest), names, manifest, sent

    def _whole_report(self, sent: pb.FullState, call: int, listed: frozenset[bytes] | None = None,
                      manifest: list[bytes] | None = None) -> pb.FullState:
        """The report `sent` as blocks stood for, its references read from the store's blocks, which are
        pinned first (journalblocks.py JB1; a thread). A large state stays its block list (blockforms.py):
        the report in listed form, its state's size and digest noted for the tracker (the node's digest,
        when it sent one: checked against the bytes when filed, store.py; else hashed here), and one too
        large to join is never joined (BF6); a small one is rebuilt whole. `listed`, `manifest`: its names, as a set
        and in order (the objects a base's names are: each hashed as a key once, MB1)."""
        store = self.engine.writer.store
        carried = {blocks.block_hash(block): block for block in sent.blocks}  # hashed once for the report
        if listed is None:  # its names made a set once: pinned as they are
            listed = frozenset(sent.state_blocks.hashes)
        carried = {name: block for name, block in carried.items() if name in listed}
        missing = store.pin(sent.snapshot_id, journalblocks.held(sent, carried, listed), call)
        if not missing:
            taken = None
            if len(sent.state_blocks.hashes) * blocks.BLOCK_BYTES > JOINED_MAX_BYTES:
                taken, missing = self._streamed_report(sent, call, carried, listed, manifest)
            if taken is None and not missing:  # small enough to join, or small after all
                taken, missing = self._joined_report(sent, call, carried, listed)
            if taken is not None:
                return taken
            store.lacks(missing)  # the state sent whole next writes them again
            self.engine.writer.unpin(sent.snapshot_id, call)
        shown = ", ".join(f"sha256:{name.hex()}" for name in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise MissingBlocks(f"{blocks.MISSING}: {len(missing)} of the state of {sent.node_id} in snapshot "
                            f"{sent.snapshot_id} are neither sent nor held here ({shown}); send the state whole")

    def _joined_report(self, sent: pb.FullState, call: int, carried: dict[bytes, bytes],
                       listed: frozenset[bytes]) -> tuple[pb.FullState | None, list[bytes]]:
        """`_whole_report`'s work on a state joined: whole when small, else listed; or None and
        the blocks found nowhere. Its blocks are kept for the node's next report (B7)."""
        store = self.engine.writer.store
        named, missing = blocks.joined(sent, store.blocks.read, self._on_disk(sent.node_id, sent.snapshot_id))
        if named is None:
            return None, missing
        self._known.keep(sent.node_id, named)
        store.keep(sent.snapshot_id, listed, carried, call, in_record=True)  # held for the next report at once
        if len(named.state) > blockforms.LISTED_BYTES:  # BF2
            return self._listed_report(sent, named), []
        whole = pb.FullState()
        whole.CopyFrom(sent)
        whole.ClearField("state_blocks")
        whole.ClearField("blocks")
        whole.state = named.state
        return whole, []

    def _streamed_report(self, sent: pb.FullState, call: int, carried: dict[bytes, bytes], listed_names: frozenset[bytes],
                         manifest: list[bytes] | None = None) -> tuple[pb.FullState | None, list[bytes]]:
        """`sent` (its held blocks pinned) in listed form, its state never joined (blockforms.py BF6): each
        block from those it carries, the kept ones or the store's file, checked against its name, read for
        the size and digest (the node's, when it sent one) and let go; or None and the blocks found nowhere
        (None and none: a small state, joined instead). The carried ones are written and pinned as
        `_joined_report`'s are."""
        known, files = self._on_disk(sent.node_id, sent.snapshot_id), self.engine.writer.store.blocks
        from_files = []  # the blocks read from their files: held, maybe, with no note of it (D10)

        def read(name: bytes) -> bytes | None:
            if (block := carried.get(name)) is not None or (block := known(name)) is not None:
                return block
            from_files.append(name)
            block = files.read(name)
            return block if block is not None and blocks.block_hash(block) == name else None

        files.listed_for(sent.snapshot_id)
        removals = files.removals  # D10: before any of its names is looked up
        block_list, missing = blockforms.streamed(sent.state_blocks.hashes if manifest is None else manifest, read,
                                                  sent.state_digest, self._sized(sent.node_id, sent.snapshot_id))
        if block_list is None or block_list.size <= blockforms.LISTED_BYTES:  # BF2: joined, it is small
            return None, missing
        sizes = dict(zip(block_list.hashes, block_list.sizes, strict=True))
        self.engine.writer.store.keep(sent.snapshot_id, listed_names, carried, call, in_record=True)  # as `_joined_report`
        self._sizes[sent.node_id] = sizes  # one assignment
        if not from_files:  # D10: each name found held (sized, kept) or written now: so while no removal since
            self._sizes_checked[sent.node_id] = (sizes, removals)
        listed = blockforms.listed_report(sent, block_list.hashes)
        self.engine.machine.forms.note(listed, block_list)
        return listed, []

    def _block_size(self) -> Callable[[bytes], int | None]:
        """A block's size, if it is one of a node's last state listed unjoined (each read checked, BF6):
        one dict's `get` for a filing's every block (a name's size is its content's: any node's will do)."""
        known: dict[bytes, int] = {}
        for sizes in list(self._sizes.values()):
            known.update(sizes)
        return known.get

    def _sized(self, node_id: str, snapshot_id: str) -> Callable[[bytes], int | None]:
        """The size of a block of the node's last state listed unjoined, only while controller/blocks
        holds a file of its name (as kept blocks are used: blockdir.py D5); None: not known so. One
        dict's `get` (blockforms.py BF7): the names without a file are left out first, in one set difference."""
        known, files = self._sizes.get(node_id, {}), self.engine.writer.store.blocks
        if not known:
            return known.get
        files.listed_for(snapshot_id)
        removals = files.removals  # read before the check: a removal during it is seen by it or by the next
        checked, at = self._sizes_checked.get(node_id, (None, -1))
        if checked is known and at == removals:  # blockdir.py D10: none has left since (the very dict: no compare)
            return known.get
        if gone := files.lacking(known):
            known = dict(known)
            for name in gone:
                del known[name]
        else:
            self._sizes_checked[node_id] = (known, removals)
        return known.get

    def _on_disk(self, node_id: str, snapshot_id: str) -> Callable[[bytes], bytes | None]:
        """The kept blocks (knownblocks.py), each only while controller/blocks holds a file of
        its name; each was checked against its name when kept (blockdir.py D5)."""
        return kept_reader(self._known.reader(node_id), self.engine.writer.store.blocks, snapshot_id)

    def _listed_report(self, report: pb.FullState, named: blocks.Named) -> pb.FullState:
        """`report` in listed form for the state `named` (its blocks durable and pinned), its size and digest
        noted for the tracker (blockforms.py): the digest the node's report says (hashed at its cut; checked
        against the bytes when filed, store.py), else, from an old node, hashed here."""
        listed = blockforms.listed_report(report, named.names)
        self._hold(report.node_id, tuple(named.names), named.state)
        sizes = tuple(end - start for start, end in named.bounds)
        said = report.state_digest or digest(named.state)
        self.engine.machine.forms.note(listed, blockforms.BlockList(tuple(named.names), sizes, said))
        return listed

    def _know(self, report: pb.FullState, call: int) -> tuple[list[bytes], pb.FullState | None]:
        """Keep the blocks of a report that came whole (its state cut and hashed, K1), in memory and on disk,
        pinned by `call` (store.py `keep`: the node's next report names them all as held, maybe before this
        snapshot is filed); their names, and the report in listed form when its state is large (blockforms.py
        BF5; None: it stays whole). A thread."""
        named = blocks.names(report.state, report.state_parts)[0]
        self._known.keep(report.node_id, named)
        view = memoryview(named.state)  # the blocks as views of the state: no second copy of it
        carried = {name: view[start:end] for name, (start, end) in zip(named.names, named.bounds, strict=True)}
        self.engine.writer.store.keep(report.snapshot_id, set(named.names), carried, call)  # type: ignore[arg-type]
        if len(named.state) <= blockforms.LISTED_BYTES:  # BF2
            return named.names, None
        return named.names, self._listed_report(report, named)

    @_answers("report")
    async def ReportStateChunks(self, request_iterator, context) -> pb.ReportStateResponse:
        """A FullState too large for one message, in pieces (snapmesh.protocol.chunking):
        the blocks it carries are written as they come (`_received`), the rest takes
        the ReportState path. With TLS only a node's certificate may send one
        (checked before any chunk is read); the bytes held are bounded per peer and
        in all, and a chunk past a bound ends the stream at once (RESOURCE_EXHAUSTED)."""
        peer = chunking.charged_peer(credentials.peer_names(context), self.engine.nodes, context.peer())
        call = next(self._calls)
        taken = [await self._received(request_iterator, context, peer, call)]  # this frame keeps no reference
        return await self._report(taken, context, call)

    async def _received(self, request_iterator, context, peer: str, call: int) -> pb.FullState:
        """The report a stream carries, without its blocks: each is written to the block
        store as it comes, durably and pinned by `call` (store.py `keep_carried`, JB1), a
        window of WRITE_WINDOW_BYTES at a time, so the stream holds that window and the
        rest of its report (carriedblocks.py CB1), never the whole. A stream that ends any
        other way lets what it pinned go."""
        stream, budget = carriedblocks.CarriedBlocks(chunking.MAX_STATE_BYTES), self._chunk_budget
        held, window, window_bytes = 0, [], 0  # `held`: taken from the budget
        try:
            async for chunk in request_iterator:
                budget.take(peer, len(chunk.data))
                held += len(chunk.data)
                came = stream.feed(chunk.data)
                if came and stream.carried == len(came):  # the first blocks: whose are they (CB3)
                    await credentials.require_peer(context, stream.header.node_id)
                    listing.check_id(stream.header.snapshot_id)
                window += came
                window_bytes += sum(len(block) for block in came)
                if window_bytes >= chunking.WRITE_WINDOW_BYTES:
                    await self._write_carried(stream, window, call)
                    window, window_bytes = [], 0
                budget.give_back(peer, held - stream.held)  # what was read and let go
                held = stream.held
            if window:
                await self._write_carried(stream, window, call)
            return stream.finish()
        except BaseException:
            if stream.carried:
                self.engine.writer.unpin(stream.header.snapshot_id, call)
            raise
        finally:
            budget.give_back(peer, held)

    async def _write_carried(self, stream: carriedblocks.CarriedBlocks, window: list[bytes], call: int) -> None:
        """Write the blocks of `window`, pinned by `call`, and let them go from `stream` (a thread)."""
        size = sum(len(block) for block in window)
        store, sid = self.engine.writer.store, stream.header.snapshot_id
        await asyncio.to_thread(lambda: store.keep_carried(sid, {blocks.block_hash(b): b for b in window}, call))
        stream.released(size)

