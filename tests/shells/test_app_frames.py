"""An app's messages on the wire: payload runs (lengths plus one buffer), or one ChannelMessage each.

To a receiver that said `accepts_payload_runs`, `encode_frame` packs an app's
messages in PayloadRuns (markers in `messages`, a run per stretch between two
of them); the servicer's decoding of that frame gives exactly the per-message
form's seqs, payloads and markers, in the same order: empty payloads, payloads
of zero bytes, early markers and markers among the runs included. To any
other receiver the frame is one message each, as before. A run at seq 0, or
whose lengths do not add up to its buffer, is refused as a protocol violation
naming the channel, before anything of the batch applies, and so is a frame of
native numbers (runs of them, or a message with no payload).
"""

from __future__ import annotations

import pytest

from snapmesh.services.node.channels import encode_frame
from snapmesh.services.node.engine import AppMessage
from snapmesh.services.node.servicer import _decode, _decode_merged, _receive
from snapmesh.protocol.node import core
from snapmesh.protocol.node.link import Entry
from snapmesh.v1 import snapmesh_pb2 as pb

APP_ENTRIES = (
    Entry(seq=0, last_seq=3, snapshot_id="s0"),  # an early marker (overtake)
    Entry(seq=4, last_seq=0, snapshot_id="", payload=b"token"),
    Entry(seq=5, last_seq=0, snapshot_id="s1"),
    Entry(seq=6, last_seq=0, snapshot_id="", payload=b""),  # an empty payload is still a payload
    Entry(seq=7, last_seq=0, snapshot_id="", payload=b"\x00\xff"),
    Entry(seq=8, last_seq=0, snapshot_id="", payload=b"\x00\x00\x00"),  # zero bytes are bytes like any other
    Entry(seq=9, last_seq=0, snapshot_id="", payload=b""),
)


def _comparable(decoded) -> list[tuple]:
    """(seq, what) of each decoded message: a marker as itself, an app message as its payload and msg_id."""
    return [(seq, (m.payload, m.msg_id) if type(m) is AppMessage else m) for seq, m in decoded]


def _per_message(entries: tuple[Entry, ...]) -> list[tuple]:
    return _comparable(_decode("a", "b", encode_frame(entries).batch.messages))


def test_to_a_receiver_without_payload_runs_an_apps_frame_is_one_message_each() -> None:
    batch = encode_frame(APP_ENTRIES, payload_runs=False).batch
    assert not batch.runs and not batch.payload_runs
    decoded = list(_decode("a", "b", batch.messages))
    assert [seq for seq, _ in decoded] == [0, 4, 5, 6, 7, 8, 9]
    assert decoded[0][1] == core.Marker(snapshot_id="s0", last_seq=3)
    assert decoded[2][1] == core.Marker(snapshot_id="s1", last_seq=0)
    assert [m.payload for _, m in decoded if type(m) is AppMessage] == [b"token", b"", b"\x00\xff", b"\x00\x00\x00", b""]


def test_payload_runs_split_at_markers_and_decode_to_the_per_message_form() -> None:
    batch = encode_frame(APP_ENTRIES, payload_runs=True).batch
    assert not batch.runs
    assert [(m.seq, m.marker.snapshot_id, m.marker.last_seq) for m in batch.messages] == [(0, "s0", 3), (5, "s1", 0)]
    assert [(r.first_seq, list(r.lengths), r.data) for r in batch.payload_runs] == [
        (4, [5], b"token"), (6, [0, 2, 3, 0], b"\x00\xff\x00\x00\x00")]
    wire = pb.ChannelBatch.FromString(batch.SerializeToString())
    assert _comparable(_decode_merged("a", "b", wire)) == _per_message(APP_ENTRIES)
    assert all(what[1] == "" for _, what in _per_message(APP_ENTRIES) if type(what) is tuple)  # derived: src:dst:seq


@pytest.mark.parametrize("entries", [
    tuple(Entry(seq, 0, "", payload=bytes([seq % 3]) * (seq % 4)) for seq in range(1, 40)),  # one run
    (Entry(3, 0, "", payload=b""),),  # one empty payload
    (Entry(0, 9, "e1"), Entry(0, 9, "e2"), Entry(10, 0, "", payload=b"a"), Entry(11, 0, "", payload=b"")),
    (Entry(5, 0, "", payload=b"x"), Entry(7, 0, "", payload=b"y")),  # a hole: two runs (the receiver sees the gap)
    (Entry(5, 0, "s"),),  # a marker alone
], ids=["one-run", "one-empty", "early-markers", "two-runs", "marker-alone"])
def test_every_frame_form_decodes_to_its_per_message_form(entries: tuple[Entry, ...]) -> None:
    batch = pb.ChannelBatch.FromString(encode_frame(entries, payload_runs=True).batch.SerializeToString())
    assert all(not m.HasField("transfer") for m in batch.messages)  # every app message went in a run
    assert _comparable(_decode_merged("a", "b", batch)) == _per_message(entries)


def test_entries_out_of_channel_order_go_one_message_each() -> None:
    odd = (Entry(5, 0, "", payload=b"a"), Entry(4, 0, "", payload=b"b"))
    batch = encode_frame(odd, payload_runs=True).batch
    assert not batch.payload_runs and [m.seq for m in batch.messages] == [5, 4]


class _Noting:
    """An engine that notes what `_receive` hands it."""

    def __init__(self) -> None:
        self.got: list = []

    def receive_batch(self, src, conn_no, messages) -> None:
        self.got += _comparable(messages)

    def receive_payload_runs(self, src, conn_no, runs) -> None:  # a frame of runs alone: each payload, seqs from the run's first
        self.got += [(seq, (payload, "")) for first, payloads in runs for seq, payload in enumerate(payloads, first)]


def test_receive_hands_the_engine_the_per_message_form() -> None:
    for entries in (APP_ENTRIES, APP_ENTRIES[1:2], APP_ENTRIES[3:]):
        engine = _Noting()
        _receive(engine, "a", "b", 1, encode_frame(entries, payload_runs=True).batch)  # type: ignore[arg-type]
        assert engine.got == _per_message(entries)


@pytest.mark.parametrize("bad, text", [
    (pb.PayloadRun(first_seq=0, lengths=[1], data=b"x"), "channel a->b: a run of app messages starts at seq 0"),
    (pb.PayloadRun(first_seq=3, lengths=[1, 2], data=b"xy"),
     "channel a->b: the run of app messages at seq 3 has lengths adding up to 3 bytes for a buffer of 2"),
    (pb.PayloadRun(first_seq=3, lengths=[], data=b"\x00"),
     "channel a->b: the run of app messages at seq 3 has lengths adding up to 0 bytes for a buffer of 1"),
])
def test_a_malformed_run_is_refused_naming_the_channel_before_anything_applies(bad, text) -> None:
    good = pb.PayloadRun(first_seq=1, lengths=[1, 0], data=b"z")
    for batch in (pb.ChannelBatch(payload_runs=[good, bad]),
                  pb.ChannelBatch(payload_runs=[good, bad], messages=[pb.ChannelMessage(seq=2, marker=pb.MarkerMessage(
                      snapshot_id="s"))])):
        engine = _Noting()
        with pytest.raises(core.RemoteProtocolError) as refused:
            _receive(engine, "a", "b", 1, batch)  # type: ignore[arg-type]
        assert str(refused.value) == text and engine.got == []  # the good run before it did not apply either


class _OneByOne(_Noting):
    """As the engine applies a frame: each message as it is decoded."""

    def receive_batch(self, src, conn_no, messages) -> None:
        for item in messages:
            self.got += _comparable([item])


def test_a_frame_of_native_numbers_is_refused() -> None:
    # What the bank's former native nodes sent: runs of numbers, or a message with no payload.
    engine = _Noting()
    runs = pb.ChannelBatch(runs=[pb.TransferRun(first_seq=1, amounts=[5])], payload_runs=[
        pb.PayloadRun(first_seq=2, lengths=[1], data=b"x")])
    with pytest.raises(core.RemoteProtocolError, match="channel a->b: runs of numbers, not an app's messages"):
        _receive(engine, "a", "b", 1, runs)  # type: ignore[arg-type]
    assert engine.got == []  # before anything of the frame applied
    engine = _OneByOne()
    one = pb.ChannelBatch(messages=[pb.ChannelMessage(seq=1, transfer=pb.TransferMessage(payload=b"ok")),
                                    pb.ChannelMessage(seq=2, transfer=pb.TransferMessage(amount=5))])
    with pytest.raises(core.RemoteProtocolError, match="channel a->b: message 2 carries no payload"):
        _receive(engine, "a", "b", 1, one)  # type: ignore[arg-type]
    assert engine.got == [(1, (b"ok", ""))]  # the one before it applied, as any bad message leaves them
