"""snapmesh/protocol/controller/blockwrites.py BW1-BW5: which pending block write each reader waits for."""

import pytest

from snapmesh.protocol.controller.blockwrites import PendingWrites

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def test_blocks_within_the_bound_are_deferred_and_read_from_memory_until_written():
    pending = PendingWrites(max_bytes=10)
    assert pending.defer({A: b"1234", B: b"5678"}) == {}  # BW1
    assert pending.get(A) == b"1234" and A in pending and pending.pending_bytes == 8
    assert pending.defer({C: b"xyz"}) == {C: b"xyz"}  # past the bound: written on the report's path
    assert pending.defer({A: b"1234"}) == {}  # already pending: not twice
    assert pending.take(limit=1) == {A: b"1234"}  # BW3: the first deferred first
    assert pending.get(A) == b"1234"  # BW2: in the batch, still read from here
    pending.written()
    assert pending.get(A) is None and A not in pending and pending.pending_bytes == 4


def test_a_batch_is_reported_written_before_the_next_is_taken():
    pending = PendingWrites()
    pending.defer({A: b"1", B: b"2"})
    pending.take(limit=1)
    with pytest.raises(RuntimeError, match="being written"):
        pending.take()


def test_a_deletion_drops_queued_blocks_and_waits_for_those_being_written():
    pending = PendingWrites()
    pending.defer({A: b"1", B: b"2", C: b"3"})
    pending.take(limit=1)  # A is being written
    assert pending.claim([A, B]) == {A}  # BW4: A waited for, B never written
    assert B not in pending and pending.in_batch({A})
    pending.written()
    assert not pending.in_batch({A})
    assert pending.take() == {C: b"3"}


def test_settle_waits_for_every_block_deferred_before_it_and_none_after():
    pending = PendingWrites()
    pending.defer({A: b"1"})
    mark = pending.mark()
    pending.defer({B: b"2"})
    assert not pending.flushed(mark)  # BW5
    pending.take(limit=1)
    assert not pending.flushed(mark)  # being written is not written
    pending.written()
    assert pending.flushed(mark) and not pending.flushed(pending.mark())


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        PendingWrites(max_bytes=-1)
