"""A node's report carries its state's digest as its cut record holds it (reports.py), so
the controller need not hash a state it holds as blocks; a report without one (an old
node's, or no digest handed over) says none."""

from __future__ import annotations

import hashlib

from snapmesh.protocol.node.core import FullState
from snapmesh.protocol.reports import report_message


def test_a_report_carries_the_digest_of_its_state_as_the_cut_said():
    state = b"abc" * 1000
    hexdigest = hashlib.sha256(state).hexdigest()
    message = report_message(FullState(node_id="p1", snapshot_id="s", channels={}, state=state, app="a"),
                             digest=hexdigest)
    assert message.state_digest == f"sha256:{hexdigest}"


def test_a_report_with_no_digest_handed_over_or_no_state_says_none():
    plain = report_message(FullState(node_id="p1", snapshot_id="s", channels={}, state=b"x", app="a"))
    empty = report_message(FullState(node_id="p1", snapshot_id="s", channels={}, state=b"", app="a"), digest="00")
    assert plain.state_digest == "" and empty.state_digest == ""
