"""filingsum.py FS6 / gridmemo.py: a listed state off the grid (an app's parts, kvshard's
key ranges) has its blocks-form digest checked at filing by reading only the blocks whose
grid blocks changed since the node's last state filed; a wrong digest, a corrupt block and
a shifted layout are still found, and an empty memo (a restart) reads every block."""

from __future__ import annotations

import logging
import random
import threading

import pytest

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.controller.blockforms import BlockMissing
from snapmesh.services.controller.filingsum import filing_checksum
from snapmesh.services.controller.gridmemo import GridMemo
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES
PART = 60_000  # off the grid: parts of 7 blocks and a short one, as kvshard's ranges
COUNT = 160  # parts: about 9 MiB


class Disk:
    """Blocks by name; every read counted. `checked` refuses a block not as named (BF3)."""

    def __init__(self) -> None:
        self.files: dict[bytes, bytes] = {}
        self.reads: list[bytes] = []

    def put(self, state: bytes, parts: list[int]) -> list[bytes]:
        cut = blocks.split(state, parts)
        names = [blocks.block_hash(block) for block in cut]
        self.files.update(zip(names, cut, strict=True))
        return names

    def raw(self, name: bytes) -> bytes | None:
        self.reads.append(name)
        return self.files.get(name)

    def checked(self, name: bytes) -> bytes | None:
        self.reads.append(name)
        block = self.files.get(name)
        return block if block is not None and blocks.block_hash(block) == name else None


def snapshot_of(names: list[bytes], state: bytes, said: str, sid: str = "s") -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id=sid, status=pb.Snapshot.COMPLETE)
    entry = snapshot.nodes.add(node_id="p1", app_name="kv", app_version=1, state_digest=said, state_bytes=len(state))
    entry.state_blocks.hashes.extend(names)
    return snapshot


def file(disk: Disk, memo: GridMemo, state: bytes, parts: list[int], said: str | None = None, sid: str = "s",
         spoil=lambda names: None):
    names = disk.put(state, parts)
    spoil(names)
    snapshot = snapshot_of(names, state, said or statedigest.blocks_form(state), sid)
    stored = pb.Snapshot()
    stored.CopyFrom(snapshot)
    disk.reads.clear()
    filing_checksum(snapshot, stored, disk.checked, of_stored=True, raw=disk.raw, memo=memo)
    return stored.nodes[0].state_digest, names


def first_state() -> tuple[bytearray, list[int]]:
    rng = random.Random(7)
    return bytearray(rng.randbytes(PART * COUNT)), [PART] * COUNT


def test_a_changed_off_grid_state_reads_only_its_changed_blocks():
    disk, memo = Disk(), GridMemo()
    state, parts = first_state()
    digest, names = file(disk, memo, bytes(state), parts)
    assert digest == statedigest.blocks_form(bytes(state)) and len(disk.reads) == len(names)  # empty: all
    for offset in (5 * PART + 100, 90 * PART + 9 * B + 3):  # two parts changed, in place
        state[offset] ^= 1
    digest, second = file(disk, memo, bytes(state), parts, sid="s2")
    assert digest == statedigest.blocks_form(bytes(state))
    changed = set(second) - set(names)
    assert len(changed) == 2 and set(disk.reads) <= set(second)
    # each changed block, and the blocks sharing its (at most 2) grid blocks, read once
    assert changed <= set(disk.reads) and len(disk.reads) == len(set(disk.reads)) <= 2 * 4, len(disk.reads)
    digest, _ = file(disk, memo, bytes(state), parts, sid="s3")  # unchanged: nothing read
    assert digest == statedigest.blocks_form(bytes(state)) and disk.reads == []


def test_a_wrong_digest_of_a_changed_state_is_still_found(caplog):
    disk, memo = Disk(), GridMemo()
    state, parts = first_state()
    file(disk, memo, bytes(state), parts)
    state[7 * PART] ^= 1
    wrong = statedigest.blocks_form(b"other")
    with caplog.at_level(logging.ERROR):
        digest, _ = file(disk, memo, bytes(state), parts, said=wrong, sid="s2")
    right = statedigest.blocks_form(bytes(state))
    assert digest == right and f"hashes to {right}, not to the {wrong}" in caplog.text
    assert len(disk.reads) <= 4


def test_a_changed_block_corrupt_on_disk_is_named_and_the_memo_kept():
    disk, memo = Disk(), GridMemo()
    state, parts = first_state()
    file(disk, memo, bytes(state), parts)
    state[11 * PART + 5] ^= 1
    known, bad = {name for name in disk.files}, []

    def spoil(names):
        bad.extend(name for name in names if name not in known)
        disk.files[bad[0]] = b"z" * len(disk.files[bad[0]])

    with pytest.raises(BlockMissing, match="sha256:") as missing:
        file(disk, memo, bytes(state), parts, sid="s2", spoil=spoil)
    assert len(bad) == 1 and bad[0].hex() in str(missing.value)
    state[11 * PART + 5] ^= 1  # back to the first state: the memo still holds it
    digest, _ = file(disk, memo, bytes(state), parts, sid="s3")
    assert digest == statedigest.blocks_form(bytes(state)) and disk.reads == []


def test_a_size_change_that_shifts_offsets_gives_the_right_digest():
    disk, memo = Disk(), GridMemo()
    state, parts = first_state()
    file(disk, memo, bytes(state), parts)
    grown = bytes(state[: 40 * PART]) + b"+" * 1000 + bytes(state[40 * PART :])  # part 40 grows by 1000 bytes
    sizes = parts[:40] + [PART + 1000] + parts[41:]
    digest, names = file(disk, memo, grown, sizes, sid="s2")
    assert digest == statedigest.blocks_form(grown)
    assert 0 < len(disk.reads) < len(names)  # the parts before it are not read
    shrunk = grown[: -PART - 5]  # the last part gone, the one before it cut short
    digest, _ = file(disk, memo, shrunk, sizes[:-2] + [PART - 5], sid="s3")
    assert digest == statedigest.blocks_form(shrunk) and len(disk.reads) <= 2
    dropped = shrunk[: -(PART - 5)]  # the last part gone, the one before it as it was: its grid block is cut
    assert len(dropped) % B
    digest, _ = file(disk, memo, dropped, sizes[:-2], sid="s4")
    assert digest == statedigest.blocks_form(dropped) and 0 < len(disk.reads) <= 2


def test_a_restart_reads_every_block_once_unchecked_as_before():
    disk, memo = Disk(), GridMemo()
    state, parts = first_state()
    file(disk, memo, bytes(state), parts)
    state[3] ^= 1
    digest, names = file(disk, GridMemo(), bytes(state), parts, sid="s2")  # an empty memo: a restart
    assert digest == statedigest.blocks_form(bytes(state)) and len(disk.reads) == len(names)


def test_the_store_files_a_changed_off_grid_state_reading_only_its_changed_blocks(tmp_path, monkeypatch):
    """Through the controller (servicer, tracker's forms, StoreWriter): the second snapshot of a
    state cut by parts, one part changed, reads a few blocks at filing, not the state's every one
    (the states not kept in memory: over the kept blocks' bound, lowered, as at 64 MiB a node)."""
    from types import SimpleNamespace

    from snapmesh.protocol.controller.blockforms import BlockForms
    from snapmesh.services.controller import servicer
    from snapmesh.services.controller.servicer import ControllerService
    from snapmesh.services.controller.store import SnapshotStore, StoreWriter
    from snapmesh.services.node.sentblocks import SentBlocks

    monkeypatch.setattr(servicer, "JOINED_MAX_BYTES", 1024 * 1024)
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    filed = {"s1": threading.Event(), "s2": threading.Event()}
    writer = StoreWriter(store, on_filed=lambda sid: filed[sid].set())
    forms = BlockForms()
    service = ControllerService(SimpleNamespace(writer=writer, machine=SimpleNamespace(  # type: ignore[arg-type]
        forms=forms)))
    service._known.max_bytes = 1024 * 1024
    node = SentBlocks()
    state, parts = first_state()
    read = []
    real = store.blocks.read
    monkeypatch.setattr(store.blocks, "read", lambda name: read.append(name) or real(name))

    def report(sid: str, call: int) -> int:
        said = statedigest.blocks_form(bytes(state))
        sent, names = node.form(pb.FullState(snapshot_id=sid, node_id="p1", state=bytes(state), app_name="kv",
                                             app_version=1, state_digest=said, state_parts=parts))
        got = service._whole_report(sent, call)
        node.accepted(pb.ReportStateResponse(takes_blocks=True), names)
        snapshot = pb.Snapshot(snapshot_id=sid, status=pb.Snapshot.COMPLETE, initiator="p1")
        forms.fill(snapshot.nodes.add(node_id="p1", app_name="kv", app_version=1), forms.of(got))
        assert blocks_of(snapshot) > 1000 and snapshot.nodes[0].state_digest == said
        read.clear()
        writer.submit(snapshot)
        assert filed[sid].wait(60)
        return len(read)

    def blocks_of(snapshot: pb.Snapshot) -> int:
        return len(snapshot.nodes[0].state_blocks.hashes)

    first, names = node.form(pb.FullState(snapshot_id="s0", node_id="p1", state=bytes(state), app_name="kv",
                                          app_version=1, state_parts=parts))
    service._know(first, 0)  # the node's first report: its blocks known to the controller
    node.accepted(pb.ReportStateResponse(takes_blocks=True), names)
    state[3] ^= 1
    assert report("s1", 1) > 1000  # the node's first state filed: every block read
    state[50 * PART + 3] ^= 1
    count = report("s2", 2)
    writer.close()
    assert store.load("s2").nodes[0].state_digest == statedigest.blocks_form(bytes(state))
    assert count <= 4, count  # the changed block and those sharing its grid blocks
