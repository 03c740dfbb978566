"""An app's messages on the wire: one ChannelMessage each with its payload, never a packed run.

The frame `encode_frame` builds for an app's channel (markers and payloads) decodes
back, message by message, to the same seqs, payloads and markers, whether or not
the receiver said it reads runs; a bank frame still goes as one run.
"""

from __future__ import annotations

import pytest

from snapmesh.services.node.channels import encode_frame
from snapmesh.services.node.engine import AppMessage
from snapmesh.services.node.servicer import _decode
from snapmesh.protocol.node import core
from snapmesh.protocol.node.link import Entry

APP_ENTRIES = (
    Entry(seq=0, tally=3, snapshot_id="s0"),  # an early marker (overtake)
    Entry(seq=4, tally=0, snapshot_id="", payload=b"token"),
    Entry(seq=5, tally=0, snapshot_id="s1"),
    Entry(seq=6, tally=0, snapshot_id="", payload=b""),  # an empty payload is still a payload
    Entry(seq=7, tally=0, snapshot_id="", payload=b"\x00\xff"),
)


@pytest.mark.parametrize("runs", [True, False])
def test_an_apps_frame_is_one_message_each_and_decodes_to_the_same_payloads(runs: bool) -> None:
    batch = encode_frame(APP_ENTRIES, runs=runs).batch
    assert not batch.runs
    decoded = list(_decode("a", "b", batch.messages))
    assert [seq for seq, _ in decoded] == [0, 4, 5, 6, 7]
    assert decoded[0][1] == core.Marker(snapshot_id="s0", last_seq=3)
    assert decoded[2][1] == core.Marker(snapshot_id="s1", last_seq=0)
    assert [m.payload for _, m in decoded if type(m) is AppMessage] == [b"token", b"", b"\x00\xff"]


def test_a_bank_frame_still_goes_as_one_run() -> None:
    entries = tuple(Entry(seq=seq, tally=seq * 10, snapshot_id="") for seq in range(1, 6))
    batch = encode_frame(entries, runs=True).batch
    assert not batch.messages and [(r.first_seq, list(r.amounts)) for r in batch.runs] == [(1, [10, 20, 30, 40, 50])]
    decoded = list(_decode("a", "b", encode_frame(entries, runs=False).batch.messages))
    assert [(seq, m.tally, type(m) is AppMessage) for seq, m in decoded] == [(s, s * 10, False) for s in range(1, 6)]
