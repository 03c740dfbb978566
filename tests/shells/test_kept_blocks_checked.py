"""A block is used only as its name says (services/controller/blockdir.py D5). A block the
controller keeps in memory (knownblocks.py) was checked against its name when kept and is
immutable bytes, so it is used unhashed and its file is not looked at (the directory is
listed once a snapshot, then the controller's own writes and deletions noted); a kept block
whose file was deleted is not used (the report is refused naming it), a file of a block's
name and size that does not hash to its name is written again, not taken, and a kept block
in a buffer that may be written to is hashed on use. The listing and a write's new blocks
cost no look at a file per block (D6), and are still right."""

from __future__ import annotations

import os
import random

from snapmesh.protocol import blocks
from snapmesh.protocol.controller.knownblocks import KnownBlocks
from snapmesh.services.controller import blockdir
from snapmesh.services.controller.blockdir import BlockDir, kept_reader
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


def kept(state: bytes) -> tuple[KnownBlocks, blocks.Named]:
    named = blocks.names(state)[0]
    known = KnownBlocks()
    known.keep("p1", named)
    return known, named


def stored(tmp_path, state: bytes, named: blocks.Named) -> BlockDir:
    files = BlockDir(tmp_path / "blocks")
    files.write({name: state[a:b] for name, (a, b) in zip(named.names, named.bounds, strict=True)})
    return files


def as_blocks(named: blocks.Named) -> pb.FullState:
    sent = pb.FullState(snapshot_id="s2", node_id="p1", epoch=1)
    sent.state_blocks.hashes.extend(named.names)
    return sent


def poked(state: bytes) -> tuple[KnownBlocks, blocks.Named]:
    """KnownBlocks holding `state`'s names over a buffer whose second block is flipped after it was kept."""
    named = blocks.names(state)[0]
    buffer = bytearray(state)
    known = KnownBlocks()
    known.keep("p1", blocks.Named(buffer, named.bounds, named.names, {}))  # type: ignore[arg-type]
    start, end = named.bounds[1]
    buffer[start:end] = bytes(b ^ 0xFF for b in state[start:end])
    return known, named


def test_a_kept_block_is_used_unhashed_and_its_file_not_looked_at(tmp_path, monkeypatch):
    state = random.Random(4).randbytes(4 * B)
    known, named = kept(state)
    files = stored(tmp_path, state, named)
    assert named.names[0] in files.names()  # the store's sweep lists them at start: no listing after
    calls = []

    def counted(block):
        calls.append(len(block))
        return hashed(block)

    def looked(*args, **kwargs):
        raise AssertionError("the disk looked at for a kept block")

    hashed = blocks.block_hash
    with monkeypatch.context() as patched:
        patched.setattr(blocks, "block_hash", counted)
        patched.setattr(blockdir, "block_hash", counted)
        for call in ("stat", "lstat", "scandir", "listdir", "open"):
            patched.setattr(os, call, looked)
        whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files))
    assert missing == [] and whole.state == state
    assert calls == []  # checked once, when kept (KB1), not on every use


def test_a_kept_block_whose_file_was_deleted_is_named_missing(tmp_path):
    state = random.Random(5).randbytes(4 * B)
    known, named = kept(state)
    files = stored(tmp_path, state, named)
    assert files.holds(named.names[2])
    files.delete([named.names[2]])  # a retention took it: the report must not rest on it
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files))
    assert whole is None and missing == [named.names[2]]
    files.write({named.names[2]: state[2 * B : 3 * B]})  # the state sent whole writes it again
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files))
    assert missing == [] and whole.state == state


def test_a_file_lost_behind_the_controllers_back_is_not_taken_from_the_next_snapshot_on(tmp_path):
    state = random.Random(6).randbytes(4 * B)
    known, named = kept(state)
    files = stored(tmp_path, state, named)
    files.names()  # the sweep's listing at start
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files, "s1"))
    assert missing == []
    files.path(named.names[1]).unlink()  # not by the controller: a hand, a disk
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files, "s2"))
    assert whole is None and missing == [named.names[1]]  # refused: the node sends it whole (B4)


def test_a_kept_buffer_written_to_is_hashed_and_read_from_its_file_instead(tmp_path):
    state = random.Random(1).randbytes(4 * B)
    known, named = poked(state)
    files = stored(tmp_path, state, named)
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files))
    assert missing == [] and whole.state == state  # the buffer's flipped block is not in it


def test_a_kept_buffer_written_to_whose_file_is_corrupt_too_is_named_missing(tmp_path):
    state = random.Random(2).randbytes(4 * B)
    known, named = poked(state)
    files = stored(tmp_path, state, named)
    files.path(named.names[1]).write_bytes(bytes(B))  # the same size: only its hash tells
    whole, missing, _ = blocks.whole_state(as_blocks(named), files.read, kept_reader(known.reader("p1"), files))
    assert whole is None and missing == [named.names[1]]


def test_a_file_of_the_right_size_that_does_not_hash_to_its_name_is_written_again(tmp_path):
    block = random.Random(3).randbytes(B)
    name = blocks.block_hash(block)
    files = BlockDir(tmp_path / "blocks")
    files.directory.mkdir()
    files.path(name).write_bytes(bytes(B))
    assert files.write({name: block}) == (1, B)
    assert files.read(name) == block
    assert files.write({name: block}) == (0, 0)  # a sound one is taken as it is


def test_the_listing_skips_temporary_and_stray_files_and_knows_the_blocks_d6(tmp_path):
    state = random.Random(3).randbytes(3 * B)
    _, named = kept(state)
    files = stored(tmp_path, state, named)
    (files.directory / f".{named.names[0].hex()}.tmp").write_bytes(b"half")  # D1's, left by a crash
    (files.directory / "notes.txt").write_bytes(b"not a block")
    assert files.names() == set(named.names)
    os.unlink(files.path(named.names[1]))  # behind the controller's back
    assert files.lacking(named.names) == set()  # as far as it knows, until it lists again
    assert files.names() == {named.names[0], named.names[2]}
    assert files.lacking(named.names) == {named.names[1]}


def test_a_block_written_with_no_look_at_its_file_replaces_a_corrupt_one_whole_d6(tmp_path):
    state = random.Random(4).randbytes(2 * B)
    _, named = kept(state)
    files = BlockDir(tmp_path / "blocks")
    files.write({named.names[0]: state[:B]})
    assert files.names() == {named.names[0]}
    # a file of the second block's name and size appears behind the controller's back, not as named
    files.path(named.names[1]).write_bytes(bytes(B))
    assert files.write({named.names[1]: state[B:]}) == (1, B)
    assert files.read(named.names[1]) == state[B:]
    # and the directory itself removed behind its back: made again by the next write
    for path in files.directory.iterdir():
        path.unlink()
    files.directory.rmdir()
    files.names()
    assert files.write({named.names[0]: state[:B]}) == (1, B)
    assert files.read(named.names[0]) == state[:B]


def test_a_listing_holds_no_lock_while_it_reads_and_keeps_what_changed_meanwhile_d7(tmp_path, monkeypatch):
    """D7: while the directory is read (tens of ms at 32,768 files) a report's look-up goes on,
    and a write and a delete made meanwhile count over what the listing found."""
    import threading

    files = BlockDir(tmp_path / "blocks")
    old, new = b"o" * blocks.BLOCK_BYTES, b"n" * blocks.BLOCK_BYTES
    files.write({blocks.block_hash(old): old})
    files.names()  # listed once (at start: the store's sweep); each snapshot lists it again
    real = os.listdir
    looked: list[set[bytes]] = []

    def slow_listdir(path):
        found = real(path)  # read before the changes below: it names the old block, not the new
        asker = threading.Thread(target=lambda: looked.append(files.lacking([blocks.block_hash(new)])))
        asker.start()
        asker.join(5)
        assert not asker.is_alive(), "a look-up waited for the listing"
        files.write({blocks.block_hash(new): new})
        files.delete([blocks.block_hash(old)])
        return found

    monkeypatch.setattr(blockdir.os, "listdir", slow_listdir)
    files.names()
    assert looked == [{blocks.block_hash(new)}]
    assert files.holds(blocks.block_hash(new)) and not files.holds(blocks.block_hash(old))
