"""A large state off the grid (kvshard's key ranges) is cut as its parts, never joined
(node/apphost.py H8), and its grid digest found by what changed (cutnames.CN5)."""

from __future__ import annotations

import random
import sys
import tracemalloc
from pathlib import Path

import pytest

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node.apphost import Host
from snapmesh.protocol.node.cutnames import CutNames
from snapmesh.services.node.blockshelf import BlockShelf
from snapmesh.services.node.pendingreports import PendingReports
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import kv_app  # noqa: E402

MIB = 1024 * 1024


def _grid_of(offset: int, size: int) -> set[int]:
    return set(range(offset // BLOCK_BYTES, (offset + size - 1) // BLOCK_BYTES + 1))


def test_a_kvshard_cut_joins_nothing_and_hashes_only_the_grid_blocks_of_a_changed_range(tmp_path) -> None:
    host = Host(kv_app.app, node_id="p1", incoming=(), outgoing=(), params={"mib": 4})
    names, sent = CutNames(), SentBlocks(carry_over=64 * 1024)
    pending, shelf = PendingReports(tmp_path / "p1.reports"), BlockShelf(tmp_path / "p1.blocks")
    sent.on_formed = lambda named: shelf.keep("report", named)
    host.cut()  # the keys filled and encoded: the app's own cost, not the cut's
    victim = kv_app.key("p1", 1234)
    peaks, grids = [], []
    for sid in ("s1", "s2"):
        host.command(kv_app.put(victim, sid * (kv_app.VALUE_BYTES // 2)))
        before = names.grid_hashed
        tracemalloc.start()
        state, parts = host.cut()
        digest, named = names.digest(state, parts)
        message = pb.FullState(snapshot_id=sid, node_id="p1", state_parts=[len(p) for p in parts], app_name="kv")
        pending.save_unsynced(message, 1, state, named)
        formed, held = sent.form(message, pending.named.pop(sid), [])
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        sizes = list(map(len, parts))
        assert type(state) is BlockState and any(size % BLOCK_BYTES for size in sizes[:-1]), "off the grid"
        assert all(a is b for a, b in zip(state.blocks, parts, strict=True))
        joined = host.machine.snapshot()
        assert digest == statedigest.blocks_form(joined)
        assert named is not None and named.state is state and named.names == blocks.names(joined, sizes)[0].names
        grids.append((names.grid_hashed - before, parts, sizes))
        sent.accepted(pb.ReportStateResponse(takes_blocks=True), held)
        pending.blocks.collect()  # as the reporter does once the report is sent: its carried blocks durable (RK1)
    size = len(state)
    assert peaks[1] < size // 8, f"the second cut's path allocated {peaks[1]} bytes of a {size}-byte state"
    assert grids[0][0] == -(-size // BLOCK_BYTES)  # the first cut: every grid block
    _, first, _ = grids[0]
    hashed, second, sizes = grids[1]
    # the put's range only: the last part (the last range and the pointers) is kept as it was, not made again
    changed = [i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a is not b]
    assert len(changed) == 1 and changed[0] != len(second) - 1
    dirty = set().union(*(_grid_of(sum(sizes[:i]), sizes[i]) for i in changed))
    assert len(dirty) <= 6 + sum(sizes[i] for i in changed) // BLOCK_BYTES < size // BLOCK_BYTES // 16
    # CN7: of the range's grid blocks, only those over its blocks that differ (one 1 KiB entry: at most
    # two of the range's own blocks, each over at most two grid blocks)
    assert 1 <= hashed <= 4 < len(dirty)
    [(loaded, _)] = [(m, lsn) for m, lsn in pending.load() if m.snapshot_id == "s2"]
    assert loaded.state == host.machine.snapshot()


def _cut(names: CutNames, parts: list[bytes]) -> tuple[str, blocks.Named | None, int]:
    before = names.grid_hashed
    given = tuple(parts)
    digest, named = names.digest(BlockState(given), given)
    return digest, named, names.grid_hashed - before


def test_a_range_that_changes_length_shifts_the_grid_after_it_and_the_digest_stays_right() -> None:
    rng = random.Random(7)
    parts = [rng.randbytes(rng.randint(3000, 20000)) for _ in range(40)]
    names = CutNames()
    _cut(names, parts)
    parts[10] = rng.randbytes(len(parts[10]))  # the same length: its own grid blocks only
    digest, named, hashed = _cut(names, parts)
    offsets = [sum(map(len, parts[:i])) for i in range(len(parts))]
    assert digest == statedigest.blocks_form(b"".join(parts))
    assert hashed == len(_grid_of(offsets[10], len(parts[10])))
    parts[20] = parts[20] + b"longer"  # every part after it moves: the grid from it on is hashed again
    digest, named, hashed = _cut(names, parts)
    joined = b"".join(parts)
    count = -(-len(joined) // BLOCK_BYTES)
    assert digest == statedigest.blocks_form(joined)
    assert hashed == count - offsets[20] // BLOCK_BYTES
    assert named is not None and named.names == blocks.names(joined, list(map(len, parts)))[0].names
    digest, _, hashed = _cut(names, parts)  # nothing changed: nothing hashed
    assert digest == statedigest.blocks_form(joined) and hashed == 0


@pytest.mark.parametrize("seed", range(4))
def test_the_digest_by_what_changed_is_the_digest_of_the_joined_bytes(seed: int) -> None:
    rng = random.Random(seed)
    parts = [rng.randbytes(rng.randint(1, 30000)) for _ in range(50)]
    names = CutNames()
    for _ in range(30):
        digest, named, _ = _cut(names, parts)
        joined = b"".join(parts)
        assert digest == statedigest.blocks_form(joined)
        reference = blocks.names(joined, list(map(len, parts)))[0]
        assert named is not None and (named.names, named.bounds) == (reference.names, reference.bounds)
        i, roll = rng.randrange(len(parts)), rng.random()
        if roll < 0.4:
            parts[i] = rng.randbytes(len(parts[i]))
        elif roll < 0.6:
            parts[i] = rng.randbytes(rng.randint(1, 30000))
        elif roll < 0.75:
            parts.insert(i, rng.randbytes(rng.randint(1, 9000)))
        elif roll < 0.9 and len(parts) > 2:
            del parts[i]
        else:
            parts[i], parts[-1] = parts[-1], parts[i]  # the same objects, at other offsets


def test_a_mutable_part_off_the_grid_is_hashed_again_at_every_cut() -> None:
    parts: list[bytes] = [bytearray(b"a" * 10000), b"b" * 70000, bytearray(b"c" * 5000)]
    names = CutNames()
    names.digest(BlockState(map(bytes, parts)), tuple(parts))
    parts[0][5] = ord("z")  # the same object, changed
    digest, _ = names.digest(BlockState(map(bytes, parts)), tuple(parts))
    assert digest == statedigest.blocks_form(b"".join(parts))


def test_block_state_slices_across_parts_of_any_size() -> None:
    rng = random.Random(1)
    parts = [rng.randbytes(rng.randint(1, 3 * BLOCK_BYTES)) for _ in range(30)]
    state, joined = BlockState(parts), b"".join(parts)
    assert len(state) == len(joined) and bytes(state) == joined
    for _ in range(200):
        start = rng.randrange(len(joined))
        end = rng.randrange(start, len(joined) + 1)
        assert state[start:end] == joined[start:end]
    assert state[len(parts[0]) : len(parts[0]) + len(parts[1])] is parts[1]  # BST2: the block itself


def test_the_undo_base_and_log_record_of_an_off_grid_state_are_its_parts_and_a_take_back_restores_it() -> None:
    import base64

    from snapmesh.protocol import wal
    from snapmesh.protocol.node.core import AppRefusal

    host = Host(kv_app.app, node_id="p1", incoming=(), outgoing=(), params={"mib": 1})
    held = host.snapshot(as_blocks=True)  # a checkpoint's (wal.Packed) and the undo base's form
    assert type(held) is BlockState and host.undo.base is held
    joined = host.machine.snapshot()
    assert "".join(piece.decode() for piece in wal.Packed(held).slices(4000)) == base64.b64encode(joined).decode()
    host.command(kv_app.put(kv_app.key("p1", 3), "x" * kv_app.VALUE_BYTES))
    changed = host.machine.snapshot()
    with pytest.raises(AppRefusal):
        host.command(b'{"op": "put", "key": "p1/k00000003"}')  # no value: refused, the app rebuilt (H4)
    assert host.undone == 1 and host.machine.snapshot() == changed != joined


@pytest.mark.parametrize("seed", range(3))
def test_a_part_changed_in_place_hashes_only_its_blocks_that_differ(seed: int) -> None:
    """CN7: a part as long as the one at its index is compared a block at a time; only its
    blocks that differ, and the grid blocks over them, are hashed, and the names and the
    digest are those of the joined bytes."""
    rng = random.Random(seed)
    parts = [rng.randbytes(rng.randint(3 * BLOCK_BYTES, 9 * BLOCK_BYTES)) for _ in range(30)]
    names = CutNames()
    _cut(names, parts)
    for _ in range(20):
        i = rng.randrange(len(parts))
        part = bytearray(parts[i])
        at = rng.randrange(len(part) - 100)
        part[at : at + 100] = rng.randbytes(100)  # within one or two of its own blocks
        parts[i] = bytes(part)
        hashed_before = names.hashed
        digest, named, grid = _cut(names, parts)
        joined = b"".join(parts)
        reference = blocks.names(joined, list(map(len, parts)))[0]
        assert digest == statedigest.blocks_form(joined)
        assert named is not None and named.names == reference.names
        own = {at // BLOCK_BYTES, (at + 99) // BLOCK_BYTES}  # the part's blocks that differ
        assert names.hashed - hashed_before == len(own) + grid
        offset, end = sum(map(len, parts[:i])), sum(map(len, parts[: i + 1]))
        assert grid == len(set().union(*(_grid_of(offset + j * BLOCK_BYTES, min(BLOCK_BYTES, end - offset - j * BLOCK_BYTES))
                                         for j in own)))
    same = list(parts)
    same[3] = bytes(bytearray(parts[3]))  # another object, the same bytes: nothing hashed
    hashed_before = names.hashed
    digest, _, grid = _cut(names, same)
    assert digest == statedigest.blocks_form(b"".join(same)) and names.hashed == hashed_before and grid == 0
