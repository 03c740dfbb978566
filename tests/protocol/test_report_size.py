"""A report's encoded size measured without encoding its state (reportsize.py) is protobuf's own."""

from __future__ import annotations

import random

import pytest

from snapmesh.protocol.controller import reportsize
from snapmesh.v1 import snapmesh_pb2 as pb


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 3 * 1024 * 1024])
def test_the_size_is_the_encoded_size_and_the_state_is_the_reports(size):
    report = pb.FullState(snapshot_id="s1", node_id="p1", state=random.Random(size).randbytes(size),
                          state_parts=[size], app_name="blob", app_version=2, cut_at_unix_ns=7)
    report.channels.add(src="p2", dst="p1").in_flight.add(msg_id="p2:p1:1", seq=1, payload=b"x" * 200)
    state, encoded = reportsize.state_and_size(report)
    assert state == report.state and encoded == report.ByteSize() == len(report.SerializeToString())


def test_varints_take_a_byte_per_seven_bits():
    assert [reportsize.varint_size(v) for v in (0, 127, 128, 2**14 - 1, 2**14, 2**63)] == [1, 1, 2, 2, 3, 10]
