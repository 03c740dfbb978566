"""A report's state kept aside (reporter.StateReporter.keep, reports.py `with_state`):
the node's engine makes its report without the app's state, whose every set and
read is a copy of it whole; the state goes into the message only if the report may
go whole, and a large one sent as blocks never does, while its pending file and a
report sent again after a refusal hold it all the same."""

from __future__ import annotations

import asyncio
import random

from prometheus_client import CollectorRegistry

from snapmesh.protocol import blocks
from snapmesh.services.node import reporter as R
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


class _Log:
    """The transfer log's part the reporter uses: a save runs at once (as its round would)."""

    failure = None

    def before_records(self, work, size: int = 0) -> None:
        work()


def reporter(tmp_path) -> tuple[R.StateReporter, R.PendingReports]:
    pending = R.PendingReports(tmp_path / "p1.reports")
    pending.directory.mkdir()
    node = R.StateReporter(address="127.0.0.1:1", log_=_Log(), metrics=NodeMetrics("p1", CollectorRegistry()),  # type: ignore[arg-type]
                           options=[], pending=pending)
    node.blocks.carry_over = 4 * B  # a "large" state in a few blocks: as blocks, each carried
    return node, pending


def made_without_state(sid: str) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id="p1", app_name="blob", app_version=1, state_digest="sha256:x")


def test_a_large_state_goes_as_blocks_without_ever_being_set_in_the_message_and_its_file_holds_it(tmp_path):
    node, pending = reporter(tmp_path)
    state = random.Random(1).randbytes(12 * B)
    message = made_without_state("s1")
    node.keep(message, 5, state)
    [(saved, lsn)] = R.PendingReports(pending.directory).load()
    assert (saved.state, lsn) == (state, 5), "the pending file holds the state"
    sent, names = asyncio.run(node.form(message))
    assert not message.HasField("state"), "never copied into the message"
    assert sent.HasField("state_blocks") and len(sent.blocks) == 12 and len(names) == 12
    whole, missing = blocks.whole_report(sent, {}.get)
    assert missing == [] and whole.state == state
    # Refused (a block the controller lacks): formed again from the state kept aside.
    assert node.blocks.refused(blocks.MISSING + ": ...")
    again, _ = asyncio.run(node.form(message))
    assert blocks.whole_report(again, {}.get)[0].state == state


def test_a_state_that_may_go_whole_is_set_in_the_message_and_a_small_ones_file_holds_it(tmp_path):
    node, pending = reporter(tmp_path)
    small = b"kv" * 100
    message = made_without_state("s1")
    node.keep(message, 3, small)
    [(saved, _)] = R.PendingReports(pending.directory).load()
    assert saved.state == small
    sent, _ = asyncio.run(node.form(message))
    assert sent is message and message.state == small, "a first small report goes whole, its state in it"


def test_a_report_made_with_its_state_or_with_none_is_kept_as_it_is(tmp_path):
    node, pending = reporter(tmp_path)
    bank = pb.FullState(snapshot_id="s1", node_id="p1", balance=7)  # no app: no state, none added
    node.keep(bank, 1)
    with_state = pb.FullState(snapshot_id="s2", node_id="p1", state=b"abc")
    node.keep(with_state, 2)
    found = {m.snapshot_id: m for m, _ in R.PendingReports(pending.directory).load()}
    assert not found["s1"].HasField("state") and found["s2"].state == b"abc"
    sent, _ = asyncio.run(node.form(bank))
    assert sent is bank and not bank.HasField("state")
