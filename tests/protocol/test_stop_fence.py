"""A node's side of a stop with a snapshot: the fence (snapmesh/protocol/node/fence.py F1-F5) and a
log that ends in a stop snapshot, which starts under any version of the app, fenced, until a restore.

One node, no peers, a list app; its log is made by the production node machine and
read back by the production recovery."""

from __future__ import annotations

import dataclasses
import json

import pytest

from snapmesh.app import App
from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.effects import Append, Seal
from snapmesh.protocol.node.fence import FENCED, OPEN, STOPPED, Fence, FenceRefused
from snapmesh.protocol.node.machine import Node

SID = "20261129T100000.000000Z-00000001"


# ------------------------------------------------------------------ the fence


def fence_in(state: str) -> Fence:
    fence = Fence("p1", stopped=SID if state == STOPPED else "")
    if state == FENCED:
        fence.close(SID)
    return fence


@pytest.mark.parametrize("state", [OPEN, FENCED, STOPPED])
@pytest.mark.parametrize("step", ["close", "lift", "stop", "restored"])
def test_every_state_and_step_is_a_transition_or_a_refusal_that_changes_nothing(state: str, step: str) -> None:
    expected = {
        (OPEN, "close"): FENCED, (FENCED, "close"): FENCED, (STOPPED, "close"): FenceRefused,  # F1, F4
        (OPEN, "lift"): OPEN, (FENCED, "lift"): OPEN, (STOPPED, "lift"): STOPPED,  # F2
        (OPEN, "stop"): FenceRefused, (FENCED, "stop"): STOPPED, (STOPPED, "stop"): STOPPED,  # F3
        (OPEN, "restored"): OPEN, (FENCED, "restored"): OPEN, (STOPPED, "restored"): OPEN,  # F5
    }[state, step]
    fence = fence_in(state)
    if expected is FenceRefused:
        with pytest.raises(FenceRefused, match="node p1"):
            getattr(fence, step)(SID)
        assert fence.state == state
        return
    getattr(fence, step)(*(() if step == "restored" else (SID,)))
    assert fence.state == expected


def test_a_lift_or_stop_of_another_snapshot_changes_nothing_or_is_refused() -> None:
    fence = fence_in(FENCED)
    assert not fence.lift("another") and fence.state == FENCED
    with pytest.raises(FenceRefused, match="fenced for " + SID):
        fence.stop("another")
    assert fence.stop(SID) and not fence.stop(SID), "the stop record is logged once"


def test_fenced_refuses_commands_only_and_stopped_everything_but_fence_and_restore() -> None:
    fenced, stopped = fence_in(FENCED), fence_in(STOPPED)
    for rpc in ("Transfer", "TransferBatch", "Submit", "SubmitBatch"):
        assert fenced.refusal(rpc) == (f"node p1 is stopping for a snapshot ({SID}): no new commands; retry once the "
                                       "cluster is restored, or once the stop fails and the node accepts them again")
    for rpc in ("Channel", "StartSnapshot", "GetState", "Query"):
        assert fenced.refusal(rpc) == ""
        assert f"node p1 is stopped for snapshot {SID}: it answers only health and RestoreState" in stopped.refusal(rpc)
    for rpc in ("Fence", "RestoreState", "RestoreStateChunks"):
        assert stopped.refusal(rpc) == ""
    assert fence_in(OPEN).refusal("Submit") == ""


# ------------------------------------------------------------------ a log that ends in a stop


class Items:
    prefix = b""  # another version's encoding: its restore refuses a state without it

    def __init__(self, info) -> None:
        self.items: list[int] = []

    def on_command(self, command, ctx):
        self.items.append(int(command))
        return b"ok"

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return self.prefix + json.dumps(self.items).encode()

    def restore(self, state):
        if not state.startswith(self.prefix):
            raise ValueError(f"not a version with prefix {self.prefix!r}")
        self.items = json.loads(state[len(self.prefix):])


def items(version: int) -> App:
    return App(name="items", new=type("I", (Items,), {"prefix": b"v%d:" % version if version > 1 else b""}),
               version=version, upgrade=(lambda s, v: b"v%d:" % version + s) if version > 1 else None)


def run(node: Node, log: list[wal.Record], *steps) -> list[wal.Record]:
    """Carry out each step on `node` (none: just its start), appending to `log`; seals fail the test."""
    for step in [None, *steps]:
        if step is not None:
            step(node)
        for effect in node.drain():
            assert not isinstance(effect, Seal), "a stopped node keeps its segment open"
            if isinstance(effect, Append):
                log.append(effect.record)
        node.durable(node.last_lsn)
        node.drain()
    return log


def recover(app: App, log: list[wal.Record]) -> recovery.Recovered:
    return recovery.recover([(f"p1.log:{n}", r) for n, r in enumerate(log, 1)], node_id="p1",
                            incoming=(), outgoing=(), app=app)


def start(app: App, log: list[wal.Record], segment_records: int = 10**6) -> Node:
    return Node(node_id="p1", incoming=(), outgoing=(), app=app, recovered=recover(app, log),
                segment_records=segment_records)


def test_a_log_ending_in_a_stop_starts_under_another_version_fenced_and_a_restore_carries_it_on() -> None:
    v1 = items(1)
    log = run(Node(node_id="p1", incoming=(), outgoing=(), app=v1, recovered=recover(v1, [])), [],
              *(lambda n, i=i: n.submit(b"%d" % i) for i in range(5)), lambda n: n.stop(SID))
    assert type(log[-1]) is wal.Stop and log[-1].snapshot_id == SID
    with pytest.raises(recovery.OtherVersion):  # without the stop, version 2 never replays version 1's records
        recover(items(2), log[:-1])

    v2 = start(items(2), log, segment_records=1)  # a segment past its size: still no seal while stopped
    run(v2, log)
    assert v2.stopped == SID
    assert [type(r) for r in log[-2:]] == [wal.AppVersion, wal.Restart] and log[-2].version == 2
    run(start(items(3), log), log)  # restarted again, by yet another version: still fenced, nothing replayed
    assert recover(items(3), log).stopped == SID

    v2 = start(items(2), log)
    run(v2, log, lambda n: n.restore(snapshot_id=SID, epoch=2, in_flight=[], state=b"v2:[0, 1, 2, 3, 4]"),
        lambda n: n.submit(b"5"))
    assert v2.stopped == "" and v2.app_state() == b"v2:[0, 1, 2, 3, 4, 5]"
    again = recover(items(2), log)  # the restart replays from the restore on, through version 2
    assert again.stopped == "" and again.host.snapshot() == b"v2:[0, 1, 2, 3, 4, 5]"


def test_a_fence_with_no_stop_lifts_itself_at_its_time_and_a_late_stop_is_refused() -> None:
    fence = Fence("p1")
    fence.close(SID, now=100.0, lift_after=30.0)  # F6
    assert fence.refusal("Submit", 129.9) and fence.state == FENCED
    assert fence.refusal("Submit", 130.0) == "" and fence.state == OPEN
    fence.close(SID, now=200.0, lift_after=30.0)
    with pytest.raises(FenceRefused, match="it is open"):
        fence.stop(SID, now=231.0)
    fence.close(SID, now=300.0)  # no time given: until lifted
    assert fence.refusal("Submit", 10**9) and fence.stop(SID, now=10**9)


# ------------------------------------------------------------------ restarted between FENCE and STOP (F7)


def test_an_open_fence_stops_only_when_the_node_says_no_command_came_after_its_cut() -> None:
    fence = Fence("p1")  # a node restarted after its FENCE: the fence is not logged, so it is open
    with pytest.raises(FenceRefused, match=r"it is open \(restarted since its fence\?\) and its log does not show"):
        fence.stop(SID, quiet=False)
    assert fence.state == OPEN
    assert fence.stop(SID, quiet=True) and fence.state == STOPPED and fence.snapshot_id == SID
    assert not fence.stop(SID, quiet=True), "the stop record is logged once"
    other = fence_in(FENCED)
    with pytest.raises(FenceRefused, match="fenced for " + SID):
        other.stop("another", quiet=True)  # F3 as before: fenced for another snapshot, quiet or not


def logged(node: Node, log: list[wal.Record], *steps) -> list[wal.Record]:
    """As `run`, but a seal starts the log again at its checkpoint (what a restart reads)."""
    for step in [None, *steps]:
        if step is not None:
            step(node)
        for effect in node.drain():
            if isinstance(effect, Seal):
                log[:] = [effect.checkpoint]
            elif isinstance(effect, Append):
                log.append(effect.record)
        node.durable(node.last_lsn)
        node.drain()
    return log


@pytest.mark.parametrize("segment_records", [10**6, 3])  # 3: checkpoints after the cut carry the last command
def test_a_node_is_quiet_after_its_cut_until_a_command_and_a_restart_reads_it_back(segment_records: int) -> None:
    v1 = items(1)
    node = Node(node_id="p1", incoming=(), outgoing=(), app=v1, recovered=recover(v1, []),
                segment_records=segment_records)
    log = logged(node, [], *(lambda n, i=i: n.submit(b"%d" % i) for i in range(4)), lambda n: n.start_snapshot(SID))
    assert node.quiet_since_cut(SID), "commands before the cut are in the snapshot"
    assert not node.quiet_since_cut("another"), "no cut of it here"

    restarted = start(v1, list(log), segment_records)  # restarted after its FENCE: open (F7)
    logged(restarted, log)
    assert restarted.quiet_since_cut(SID), "the restart read the cut back, and no command after it"
    logged(restarted, log, *(lambda n, i=i: n.submit(b"%d" % i) for i in range(9, 12)))  # a client reached it
    assert not restarted.quiet_since_cut(SID)
    again = start(v1, list(log), segment_records)  # and restarted again: the log (or its checkpoint) says so
    assert not again.quiet_since_cut(SID)
    with pytest.raises(FenceRefused, match="it is open"):
        Fence("p1").stop(SID, quiet=again.quiet_since_cut(SID))


def test_a_checkpoint_from_before_the_last_command_field_is_not_quiet() -> None:
    v1 = items(1)
    node = Node(node_id="p1", incoming=(), outgoing=(), app=v1, recovered=recover(v1, []), segment_records=4)
    log = logged(node, [], lambda n: n.submit(b"1"), lambda n: n.start_snapshot(SID), lambda n: n.submit(b"2"))
    assert [type(r) for r in log] == [wal.Checkpoint] and log[0].last_command > node._cuts[SID]
    assert not start(v1, log).quiet_since_cut(SID), "the checkpoint says a command came after the cut"
    older = [dataclasses.replace(log[0], last_command=0)]  # as a node before the field wrote it: not known
    assert recover(v1, older).last_command == -1 and not start(v1, older).quiet_since_cut(SID)
