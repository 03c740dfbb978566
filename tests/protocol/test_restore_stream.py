"""A restore of listed states, pure (snapmesh/protocol/restorestream.py RS0-RS5)."""

from __future__ import annotations

import io
import random

import pytest

from snapmesh.protocol import blocks, carriedblocks, restorestream
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.controller import restoreplan
from snapmesh.v1 import snapmesh_pb2 as pb

STATE = random.Random(7).randbytes(5 * blocks.BLOCK_BYTES + 33)
NAMED = blocks.names(STATE)[0]


def _listed_snapshot() -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE)
    entry = snapshot.nodes.add(node_id="a", state_digest=digest(STATE), state_bytes=len(STATE))
    entry.state_blocks.hashes.extend(NAMED.names)
    snapshot.nodes.add(node_id="b", state=b"small")
    return snapshot


def _part() -> pb.RestoreStateRequest:
    return restoreplan.plan(_listed_snapshot(), 3)["a"]


def _store(changed: dict[bytes, bytes | None] | None = None):
    """A reader of STATE's blocks, with `changed` in place of those it names."""
    kept = {name: STATE[start:end] for name, (start, end) in zip(NAMED.names, NAMED.bounds, strict=True)}
    return {**kept, **(changed or {})}.get


def test_a_listed_entry_is_planned_as_its_manifest_and_a_whole_one_as_its_bytes():
    parts = restoreplan.plan(_listed_snapshot(), 3)
    assert restorestream.is_listed(parts["a"]) and not parts["a"].HasField("state")
    assert list(parts["a"].state_blocks.hashes) == NAMED.names and parts["a"].state_digest == digest(STATE)
    assert parts["b"].state == b"small" and not restorestream.is_listed(parts["b"])


def test_only_the_blocks_not_held_are_sent_each_once_in_order():
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    assert restorestream.to_send([a, b, a, c, b], {b}) == [a, c]
    assert restorestream.to_send([a, b], {a, b}) == []


def test_a_rescale_or_an_unlisted_snapshot_goes_whole():
    side = None  # no app loaded: nothing to upgrade (R6)
    assert restorestream.keeps_listed(_listed_snapshot(), side, ())
    assert not restorestream.keeps_listed(_listed_snapshot(), side, ("a", "b"))
    whole = pb.Snapshot(snapshot_id="s1", nodes=[pb.NodeBalance(node_id="a", state=STATE)])
    assert not restorestream.keeps_listed(whole, side, ())


def test_every_block_is_checked_and_the_first_missing_or_corrupt_one_is_named():
    parts = restoreplan.plan(_listed_snapshot(), 3)
    restorestream.check("s1", parts, _store())
    bad = NAMED.names[2]
    for read, word in ((_store({bad: None}), "missing"), (_store({bad: b"x"}), "corrupt")):
        with pytest.raises(restorestream.BlocksRefused) as refused:
            restorestream.check("s1", parts, read)
        assert all(said in str(refused.value) for said in ("snapshot s1", "node a", f"sha256:{bad.hex()}", word))
        assert refused.value.code == "DATA_LOSS"


@pytest.mark.parametrize("chunk", [1000, 64 * 1024, 1 << 20])
def test_the_pieces_are_the_request_with_its_blocks_and_are_read_block_by_block(chunk):
    request = _part()
    stream = restorestream.Stream(chunk)
    sending = restorestream.to_send(NAMED.names, set(NAMED.names[:2]))
    pieces = [*stream.header(request)]
    for name in sending:
        pieces += stream.block(_store()(name))
    pieces += stream.end()
    assert all(len(piece) <= chunk for piece in pieces) and stream.sent_blocks == len(sending)
    assert stream.sent_bytes == sum(map(len, pieces))
    joined = pb.RestoreStateRequest.FromString(b"".join(pieces))  # a node from before joins them
    assert list(joined.blocks) == [_store()(name) for name in sending] and joined.snapshot_id == "s1"
    reading = carriedblocks.CarriedBlocks(2 * blocks.BLOCK_BYTES, message=pb.RestoreStateRequest)  # CB4
    out = []
    for piece in pieces:
        for block in reading.feed(piece):
            out.append(block)
            reading.released(len(block))
    rest = reading.finish()
    assert out == list(joined.blocks) and not rest.blocks
    assert list(rest.state_blocks.hashes) == NAMED.names and rest.state_digest == digest(STATE)


def test_a_block_before_the_snapshot_is_refused_by_the_reader():
    reading = carriedblocks.CarriedBlocks(message=pb.RestoreStateRequest)
    with pytest.raises(carriedblocks.BadChunks):
        reading.feed(pb.RestoreStateRequest(blocks=[b"x"]).SerializeToString())


def test_a_state_is_rebuilt_block_by_block_from_carried_and_held_blocks():
    request = _part()
    request.blocks.append(_store()(NAMED.names[0]))
    out = io.BytesIO()
    held = _store({NAMED.names[0]: None})
    bounds, why = restorestream.rebuild(request, held, out.write)
    assert why == "" and out.getvalue() == STATE and bounds == NAMED.bounds


def test_a_block_found_nowhere_or_a_wrong_digest_is_refused_and_names_it():
    request = _part()
    lost = NAMED.names[3]
    out = io.BytesIO()
    bounds, why = restorestream.rebuild(request, _store({lost: None}), out.write)
    assert bounds is None and why.startswith(blocks.MISSING) and lost.hex() in why
    assert len(out.getvalue()) == 3 * blocks.BLOCK_BYTES  # nothing past the missing block
    request.state_digest = digest(b"another state")
    bounds, why = restorestream.rebuild(request, _store(), io.BytesIO().write)
    assert bounds is None and "rebuilt from them is" in why


def test_a_streamed_part_may_take_as_long_as_its_state_takes_at_the_floor_rate():
    from snapmesh.protocol.controller.effects import RESTORE

    retry = restorestream.retry_for(RESTORE, _part())
    extra = len(NAMED.names) * blocks.BLOCK_BYTES / restorestream.STREAM_FLOOR_BYTES_PER_S
    assert retry.timeout_s == pytest.approx(RESTORE.timeout_s + extra)
    assert retry.for_s == pytest.approx(RESTORE.for_s + extra)
    gib = pb.RestoreStateRequest(state_blocks=pb.StateBlocks(hashes=[b"x" * 32] * ((1 << 30) // blocks.BLOCK_BYTES)))
    assert restorestream.retry_for(RESTORE, gib).timeout_s >= 60  # a GiB: not the 5 s of one message
