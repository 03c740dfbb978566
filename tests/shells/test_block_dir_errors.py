"""A block file that is there but cannot be read, written over or removed (services/controller/blockdir.py
D11): a directory at a block's name stands in for EIO or EACCES (which root cannot be refused). It is
taken as missing, named in a warning, never an exception on a report's path or at the sweep at start,
and a failed rename leaves no temporary file behind."""

from __future__ import annotations

import logging
import random

import pytest

from snapmesh.protocol import blocks
from snapmesh.services.controller.blockdir import BlockDir


def named_blocks(count: int, seed: int = 0) -> dict[bytes, bytes]:
    contents = [random.Random(seed * 1000 + i).randbytes(blocks.BLOCK_BYTES) for i in range(count)]
    return {blocks.block_hash(block): block for block in contents}


def test_an_unreadable_block_reads_as_missing_named_and_held_no_more(tmp_path, caplog):
    files = BlockDir(tmp_path / "blocks")
    (good, content), (bad, _) = named_blocks(2).items()
    files.write({good: content})
    files.path(bad).mkdir()  # there, but no read of it can succeed
    files.names()
    assert files.holds(bad)
    with caplog.at_level(logging.WARNING):
        assert files.read(bad) is None
    assert str(files.path(bad)) in caplog.text and "cannot be read" in caplog.text
    assert not files.holds(bad)  # the next report naming it sends it whole
    assert files.read(good) == content


def test_a_block_that_cannot_be_renamed_into_place_leaves_no_temporary_file(tmp_path):
    files = BlockDir(tmp_path / "blocks")
    named = named_blocks(4, seed=1)
    first, *_ = sorted(named)
    files.directory.mkdir(parents=True)
    files.path(first).mkdir()
    files.names()
    with pytest.raises(OSError, match=first.hex()):
        files.write(named)
    assert not [entry for entry in files.directory.iterdir() if entry.name.endswith(".tmp")]


def test_a_block_that_cannot_be_removed_is_left_named_and_the_others_go(tmp_path, caplog):
    files = BlockDir(tmp_path / "blocks")
    named = named_blocks(3, seed=2)
    files.write(named)
    stuck = next(iter(named))
    files.path(stuck).unlink()
    files.path(stuck).mkdir()
    with caplog.at_level(logging.WARNING):
        assert files.delete(named) == 2
    assert str(files.path(stuck)) in caplog.text and "cannot be removed" in caplog.text
    assert [entry.name for entry in files.directory.iterdir()] == [stuck.hex()]


def test_the_sweep_at_start_goes_past_a_block_it_cannot_remove(tmp_path):
    files = BlockDir(tmp_path / "blocks")
    named = named_blocks(3, seed=3)
    files.write(named)
    keep, stuck, garbage = named
    files.path(stuck).unlink()
    files.path(stuck).mkdir()
    swept = BlockDir(tmp_path / "blocks")  # a new controller's, as at start
    assert swept.sweep({keep}) == 1
    assert not swept.path(garbage).exists() and swept.path(keep).exists()
