"""Reports as content-addressed blocks in the simulator: the real forms, under the simulator's faults.

A real node sends its state as blocks once its controller has taken a report of
its (services/node/sentblocks.py): the manifest, and only the blocks it does not
take the controller to hold (snapmesh/protocol/blocks.py B4). The controller
refuses a report naming a block it neither holds nor is sent (MISSING), rebuilds
the others (`blocks.whole_state`, with its last states in memory, knownblocks.py),
journals them as they came (journalblocks.py JB1), pins what they name until
their snapshot is filed or retired (blockpins.py), files each COMPLETE snapshot
as manifests and blocks (`blocks.stored_form`) held by reference counts
(blockrefs.py), and deletes a block once nothing holds it. This class carries
out the same pure parts on a simulated controller disk (the blocks a taken
report carries written and pinned at once, JB1); the faults are the
simulator's: reports lost, repeated and late (sim/controller.py), a controller
crash losing its memory and what its journal had not made durable, retention
retiring snapshots whose blocks the nodes still take it to hold.

The rules the fuzzer judges (SB for simulated blocks):
SB1. For every COMPLETE snapshot, each node's state rebuilt from its filed block
     references (`blocks.whole_form` over this disk) is the state the node
     recorded at its cut, byte for byte (`filed`); the checker then compares it
     to the cut record's digest (sim/apps.py A2).
SB2. A report the controller cannot make whole is refused, never taken short
     (B4); the node then sends it whole, at once (`refused`).
SB3. A filed snapshot's blocks stay on disk while it is kept: it reads back whole
     from them after every retirement and at the end (`check_kept`); a retired
     one's go once no kept snapshot references them and no journaled report pins
     them (G2, JB2).
SB4. The pins, the references and the disk are exactly what the live reports and
     the kept snapshots need, judged after every change by an audit that counts
     nothing (sim/blockaudit.py).
SB5. The blocks a report as blocks carries are written unsynced, its record making
     them durable (blockdir.py D8); a filing or a failure settles them. A crash
     loses those that durable records carry (an OS crash may), and the replay
     writes them back from those records before it rebuilds any (JB3). Those no
     durable record carries are kept: the simulated node takes blocks as held
     before it is answered, more than a real node is told, so losing them would
     drop snapshots a real controller never has to.

States here are small (the bank's a few bytes), so a state without parts of its
own (the app's snapshot_blocks(), B6) is cut into parts of `grain` bytes, drawn
per case, 8 KiB (the real grid) among them: a report then names several blocks,
and a change between two snapshots changes some of them only.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping

from snapmesh.protocol import blocks
from snapmesh.protocol.controller import journal as records
from snapmesh.protocol.controller import journalblocks
from snapmesh.protocol.controller.blockpins import BlockPins
from snapmesh.protocol.controller.blockrefs import BlockRefs
from snapmesh.protocol.controller.knownblocks import KnownBlocks
from snapmesh.sim.blockaudit import BlockAudit
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb

GRAINS = (1, 4, 16, 64, blocks.BLOCK_BYTES)  # the bank's state is a few bytes: 1 makes it several blocks


class SimBlocks:
    def __init__(self, rng: random.Random, faults: Counter[str]) -> None:
        self.grain = rng.choice(GRAINS)
        self.disk: dict[bytes, bytes] = {}  # controller/blocks: durable, survives a controller crash
        self.stored: dict[str, pb.Snapshot] = {}  # filed and kept snapshot -> its stored form (its file, durable)
        self.refs = BlockRefs()
        self.pins = BlockPins()
        self.audit = BlockAudit()  # SB4: what the pins should be, kept apart from their counts
        self.known = KnownBlocks()  # the controller's memory: lost in a crash
        self.beliefs: dict[str, set[bytes]] = {}  # node -> the blocks of its last report taken (sentblocks.py)
        self._parts: dict[tuple[str, str], tuple[int, ...]] = {}  # (snapshot, node) -> its report's cut (B6)
        self.gone: set[str] = set()  # retired
        # Filed (COMPLETE or FAILED) or retired: its journal records are not made whole at a restart,
        # as the real replay skips the snapshots it loads from their files.
        self.ended: set[str] = set()
        self.unsynced: set[bytes] = set()  # SB5: carried by reports' records, not settled yet
        self.calls = 0
        self.faults = faults  # what happened, counted with the world's faults

    # -- the node's side

    def form(self, node_id: str, message: pb.FullState) -> pb.FullState:
        """What the node sends for `message`: it whole, or its state as blocks (B4)."""
        state = message.state if message.HasField("state") else b""
        if state and not message.state_parts and self.grain < blocks.BLOCK_BYTES:
            size = len(state)
            message.state_parts.extend([self.grain] * (size // self.grain) + ([size % self.grain] if size % self.grain else []))
        sent, _ = blocks.referenced_report(message, self.beliefs.get(node_id, set()))
        return message if sent is None else sent

    def accepted(self, node_id: str, message: pb.FullState) -> None:
        """The controller took the node's report: it takes the controller to hold its blocks.
        At once, not at the answer: a node that believes more than it was told (an answer
        lost in a crash, a snapshot that fails before it is filed) costs a refusal (B4)."""
        state = message.state if message.HasField("state") else b""
        self.beliefs[node_id] = set(blocks.names(state, message.state_parts)[0].names) if state else set()

    def refused(self, node_id: str) -> None:
        """SB2: a MISSING refusal; the node holds nothing taken and sends the state whole."""
        self.beliefs.pop(node_id, None)
        self._count("report refused: missing blocks, sent whole")

    # -- the controller's side

    def take(self, sent: pb.FullState) -> tuple[pb.FullState | None, int]:
        """The report `sent` stood for (None: MISSING, SB2), and the call its pins are under."""
        self.calls += 1
        call = self.calls
        if sent.state_parts:
            self._parts[(sent.snapshot_id, sent.node_id)] = tuple(sent.state_parts)
        if not sent.HasField("state_blocks"):
            if sent.HasField("state") and sent.state:
                named = blocks.names(sent.state, sent.state_parts)[0]
                self.known.keep(sent.node_id, named)
                cut = zip(named.names, named.bounds, strict=True)
                self._keep(sent.snapshot_id, call, {name: named.state[a:b] for name, (a, b) in cut})
            return sent, call
        held = journalblocks.held(sent)
        if any(not self.refs.referenced(name) and not self.pins.pinned(name) for name in held):
            return None, call
        self._pin(sent.snapshot_id, held, call)
        known = self.known.reader(sent.node_id)
        # A block kept in memory only while its name is on disk, as the real controller's `_on_disk`.
        whole, missing, named = blocks.whole_state(sent, self.disk.get, lambda name: known(name) if name in self.disk else None)
        if whole is None:  # pinned, so on disk: a block lost from it is a broken store
            raise Violation(f"blocks: {sent.node_id}'s report of {sent.snapshot_id} names {len(missing)} "
                            "pinned block(s) not on the controller's disk")
        self.known.keep(sent.node_id, named)  # type: ignore[arg-type]
        listed = set(sent.state_blocks.hashes)
        carried = {name: block for block in sent.blocks if (name := blocks.block_hash(block)) in listed}
        self.unsynced |= carried.keys() - self.disk.keys()  # SB5: its record makes them durable
        self._keep(sent.snapshot_id, call, carried, listed)
        self._count("report taken as blocks")
        return whole, call

    def _keep(self, snapshot_id: str, call: int, carried: dict[bytes, bytes], names: set[bytes] | None = None) -> None:
        """As the real store's `keep` (journalblocks.py JB1): a taken report's call pins every
        block it names, and those it carried are on disk at once (durable, or unsynced and
        carried by its record: SB5), for the node's next report, before its snapshot is filed."""
        self._pin(snapshot_id, set(carried) if names is None else names, call)
        for name, block in carried.items():
            self.disk.setdefault(name, block)
        self.check_held()

    def unpin(self, snapshot_id: str, call: int | None = None) -> None:
        """A report refused after its pins (never journaled), or a snapshot that failed: its pins go."""
        self.audit.unpinned(snapshot_id, call)
        self._delete(name for name in self.pins.unpin(snapshot_id, call) if not self.refs.referenced(name))
        self.check_held()

    def filed(self, snapshot: pb.Snapshot, recorded: Mapping[str, bytes | None]) -> dict[str, bytes | None]:
        """File the COMPLETE `snapshot` as manifests and blocks, and each node's state rebuilt
        from them (SB1: checked against `recorded`, node -> the state it recorded at its cut)."""
        sid = snapshot.snapshot_id
        parts = {node: self._parts.pop((sid, node), ()) for node in recorded}
        stored, named = blocks.stored_form(snapshot, parts)
        self.unsynced.clear()  # SB5: settled before a manifest names them
        for name, block in named.items():
            self.disk.setdefault(name, block)
        self.stored[sid] = stored
        self.ended.add(sid)
        self._delete(name for name in self.refs.hold(sid, blocks.hashes(stored)) if not self.pins.pinned(name))
        self.unpin(sid)  # it references its blocks itself now (JB2)
        whole, problems = blocks.whole_form(stored, self.disk.get)
        if whole is None:
            raise Violation(f"SB1: snapshot {sid} cannot be rebuilt from its blocks: {problems[0]}")
        rebuilt = {node.node_id: (node.state if node.HasField("state") else None) for node in whole.nodes}
        for node_id, state in recorded.items():
            got = rebuilt.get(node_id)
            if state is not None and bytes(state) != (got or b""):
                count = len(next((n.state_blocks.hashes for n in stored.nodes if n.node_id == node_id), ()))
                raise Violation(f"SB1: snapshot {sid}: {node_id}'s state rebuilt from its {count} block reference(s) "
                                f"({len(got or b'')} bytes) is not the state it recorded at its cut ({len(state)} bytes)")
        self._count("snapshot filed as blocks")
        if sid in self.gone:  # retired before its outcome was durable (a later snapshot's Retire)
            self.retired(sid)
        return rebuilt

    def failed(self, snapshot_id: str) -> None:
        self.unsynced.clear()  # SB5: its filing settles them, and its held reports' answers
        self.ended.add(snapshot_id)
        self.unpin(snapshot_id)
        self._parts = {key: parts for key, parts in self._parts.items() if key[0] != snapshot_id}

    def retired(self, snapshot_id: str) -> None:
        """SB3: a retired snapshot's blocks go once nothing holds them."""
        self.stored.pop(snapshot_id, None)
        self.gone.add(snapshot_id)
        self.ended.add(snapshot_id)
        self._delete(name for name in self.refs.drop(snapshot_id) if not self.pins.pinned(name))
        self.check_kept()
        self.check_held()

    def check_kept(self) -> None:
        """SB3: every snapshot kept can be read back whole from its file and the blocks on disk."""
        for stored in self.stored.values():
            _, problems = blocks.whole_form(stored, self.disk.get)
            if problems:
                raise Violation(f"SB3: a kept snapshot lost a block to retention: {problems[0]}")

    def crashed(self, durable: Iterable[records.Record] = ()) -> None:
        """The controller's memory goes, and the unsynced blocks its durable records carry (SB5)."""
        self.known = KnownBlocks()
        for name in self.unsynced & journalblocks.carried(durable, skip=self.ended).keys():
            self.disk.pop(name, None)
            self._count("unsynced block lost in a crash")
        self.unsynced.clear()

    def replayed(self, durable: Iterable[records.Record]) -> list[records.Record]:
        """A restart: the counts from the filed manifests (G3), the journal's reports made whole
        from this disk and their blocks pinned again (JB3), and what nothing holds swept."""
        self.refs, self.pins = BlockRefs(), BlockPins()
        self.audit.restarted()
        for sid, stored in self.stored.items():
            self.refs.hold(sid, blocks.hashes(stored))
        durable = list(durable)
        for name, block in journalblocks.carried(durable, skip=self.ended).items():  # SB5, JB3: written back
            if name not in self.disk:
                self.disk[name] = block
                self._count("block written back from the journal at a restart")
        out, pins, warnings = journalblocks.rebuilt(durable, self.disk.get, skip=self.ended)
        for sid, names in pins.items():
            self._pin(sid, names)
            self._count("report journaled as blocks made whole at a restart")
        if warnings:
            self._count("journaled report dropped: its blocks are gone")
        self._delete([name for name in self.disk if not self.refs.referenced(name) and not self.pins.pinned(name)])
        self.check_held()
        return out

    def check_held(self) -> None:
        """SB4: the pins, references and disk are what the live reports and kept snapshots need."""
        self.audit.check(self.pins, self.refs, self.stored, self.disk)

    def _pin(self, snapshot_id: str, names: Iterable[bytes], call: int = 0) -> None:
        names = frozenset(names)
        self.audit.pinned(snapshot_id, names, call)
        self.pins.pin(snapshot_id, names, call)

    def _delete(self, names: Iterable[bytes]) -> None:
        """Delete what the counts freed: each caller asks the other count, as the real store does,
        so a count that frees a block still held loses it here, where the fuzzer sees it."""
        for name in list(names):
            self.disk.pop(name, None)

    def _count(self, kind: str) -> None:
        self.faults[kind] += 1

