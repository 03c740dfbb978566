"""The path after the cut (snapmesh/protocol/hops.py): one list of hops for the node,
the controller and the bench, and the one hop across processes."""

from __future__ import annotations

import itertools

import pytest

from snapmesh.protocol import hops


def test_the_path_is_the_nodes_hops_then_the_controllers_and_answered_spans_the_way_there_and_back() -> None:
    assert hops.PATH == ("recorded", "persisted", "sent", "received", "journaled", "visible")
    assert set(hops.NODE_HOPS) | set(hops.CONTROLLER_HOPS) == {*hops.PATH, "answered"}
    assert not set(hops.NODE_HOPS) & set(hops.CONTROLLER_HOPS)
    assert list(hops.HOP_SECONDS) == sorted(hops.HOP_SECONDS)
    assert all(b / a <= 2.5 for a, b in itertools.pairwise(hops.HOP_SECONDS))  # a bucket bound is a p99's bound


def test_received_is_the_nodes_stamp_against_the_controllers_wall_clock() -> None:
    sent = 1_700_000_000_000_000_000
    assert hops.transit_s(sent, sent / 1e9 + 0.003) == pytest.approx(0.003, abs=1e-6)
    assert hops.transit_s(sent, sent / 1e9 - 0.001) == 0.0  # the controller's clock behind the node's: 0, not < 0
    assert hops.transit_s(0, 1_700_000_000.0) is None  # an old node stamps nothing
