"""Issue 33: the machines decide, the shells only carry out. Read from the source: no
shell (services/, the simulator, the fuzzer) asks a machine's internals for a decision
the machine now makes in its own events.

  tracker.restarted(   the controller machine's replay gives the snapshots in
                       progress their fresh deadline (rule S1), not a shell after it
  .fence(              the node machine's events that carry an epoch (start_snapshot,
                       opened, restore) refuse a stale one themselves (N8, EpochFenced)
  stale_report(        the controller machine's `reported` refuses a stale report
  machine.report_message  the report message is snapmesh/protocol/reports.py's, not
                       the controller machine's
  .restored_tally    RestoreState's answer is the node machine's RestoreReply, once
                       durable (N8): no shell reads the node for it or waits itself
  = node.restore(      which streams end at a restore is the node machine's EndStreams
  network.cut_all(     (N8); no shell decides it from restore's result or ends them
                       all itself (a crash ends a node's connections: world.py's)
  .restore_incomplete  a node redoing a restore dials like any other (the gRPC node
                       and the simulator alike); its peers' `opened` fences (N8)
  Restore.RESTORING    which restore to resume after a restart is the controller
                       machine's replay's (`to_resume`), not a shell's reading of it
  tracker.restore(     the files read at a restart are the controller machine's `loaded`
                       event, which decides what is filed again (replay.py S2)
  machine.tracker      shells read the controller machine through its read API (get, all,
                       ids, status, in_progress, topology, deadline_s), not its tracker
  epoch or 1           a channel open that names no epoch is epoch 1 to the node
                       machine's `opened` (N8), not a default the shell fills in
  wait_finished(       a TriggerSnapshot that waits is answered by the controller
                       machine's AnswerTrigger (W1), not by a shell's own waiter
  pb.Cluster(          GetCluster's answer is snapmesh/protocol/controller/cluster.py's (C1-C3)
  disagreement(        the start-up check's rounds are settings.agreement.Agreement's
  cannot journal the   what an RPC's error answers is snapmesh/protocol/controller/
                       statuses.py's (S1-S4), not words a servicer writes
  StartClock(          a client's snapshot is named, and its initiator drawn, by the
                       controller machine's `start`
  duration_s(          what a finished snapshot moves in the metrics is
                       snapmesh/protocol/controller/measures.py's
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELLS = sorted([*ROOT.glob("services/**/*.py"), *ROOT.glob("snapmesh/sim/*.py"), *ROOT.glob("snapmesh/fuzzer/*.py")])
FORBIDDEN = {
    "tracker.restarted(": re.compile(r"\btracker\.restarted\("),
    ".fence(": re.compile(r"\.fence(_clients)?\("),
    "stale_report(": re.compile(r"\bstale_report\("),
    "machine.report_message": re.compile(r"\bmachine\.report_message\b"),
    ".restored_tally": re.compile(r"\.restored_tally\b"),
    "= node.restore(": re.compile(r"=\s*(self\.)?node\.restore\("),
    "network.cut_all(": re.compile(r"\bnetwork\.cut_all\("),
    ".restore_incomplete": re.compile(r"\.restore_incomplete\b"),
    "Restore.RESTORING": re.compile(r"\bRestore\.RESTORING\b"),
    "epoch or 1": re.compile(r"\bepoch\)?\s+or\s+1\b"),
    "tracker.restore(": re.compile(r"\btracker\.restore\("),
    "machine.tracker": re.compile(r"\bmachine\.tracker\b"),
    "wait_finished(": re.compile(r"\bwait_finished\("),
    "pb.Cluster(": re.compile(r"\bpb\.Cluster\("),
    "disagreement(": re.compile(r"\bdisagreement\("),
    "cannot journal the": re.compile(r"cannot journal the \{"),
    "StartClock(": re.compile(r"\bStartClock\("),
    "duration_s(": re.compile(r"\bduration_s\("),
}
# Where a forbidden call is no decision: a crash (a fault the world injects) drops every connection.
ALLOWED_IN = {"network.cut_all(": {"snapmesh/sim/world.py"}}


def decisions(source: str, path: str = "") -> list[str]:
    """The forbidden calls in `source` (at `path`, relative to the root), as "line N:
    <what>" (comments are skipped)."""
    rules = {name: pattern for name, pattern in FORBIDDEN.items() if path not in ALLOWED_IN.get(name, ())}
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        found += [f"line {number}: {name}" for name, pattern in rules.items() if pattern.search(code)]
    return found


def test_the_shells_are_found():
    names = {str(p.relative_to(ROOT)) for p in SHELLS}
    assert {"services/controller/process.py", "services/node/servicer.py", "snapmesh/sim/network.py",
            "snapmesh/sim/controller.py"} <= names


@pytest.mark.parametrize("path", SHELLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shell_makes_a_decision_of_a_machine(path: Path) -> None:
    found = decisions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, f"{path.relative_to(ROOT)} decides what a machine decides:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source, name",
    [
        ("        tracker.restarted(now)\n", "tracker.restarted("),
        ("if node.fence(conn.cluster_epoch):\n", ".fence("),
        ("if b.fence_clients():\n", ".fence("),
        ("stale = machine.stale_report(state.epoch, epoch)\n", "stale_report("),
        ("message = machine.report_message(state)\n", "machine.report_message"),
        ("return pb.RestoreStateResponse(epoch=node.epoch, balance=node.restored_tally)\n", ".restored_tally"),
        ("            changed = self.node.restore(\n", "= node.restore("),
        ("        self.world.network.cut_all(node_id)\n", "network.cut_all("),
        ("        if last is not None and last.status == pb.Restore.RESTORING:\n", "Restore.RESTORING"),
        ("        if a.restore_incomplete:  # type: ignore[union-attr]\n", ".restore_incomplete"),
        ("ending = engine.opened(src, first.open.epoch or 1, acks)\n", "epoch or 1"),
        ("        tracker.restore(snapshot)\n", "tracker.restore("),
        ("    channels = engine.machine.tracker.topology.channels\n", "machine.tracker"),
        ("        return await self.engine.wait_finished(snapshot.snapshot_id)\n", "wait_finished("),
        ("        return pb.Cluster(\n", "pb.Cluster("),
        ("                if problem := disagreement(config, node, mode, app):\n", "disagreement("),
        ('    await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot journal the {what}: {exc}")\n',
         "cannot journal the"),
        ("        self._starts = StartClock()  # ids in start order\n", "StartClock("),
        ("        self.duration.labels(status=status).observe(duration_s(snapshot))\n", "duration_s("),
    ],
)
def test_the_rule_catches_what_it_forbids(source: str, name: str) -> None:
    assert decisions(source) == [f"line 1: {name}"]


def test_a_crash_may_drop_every_connection_in_the_world_only():
    source = "        self.network.cut_all(node_id)\n"
    assert decisions(source, "snapmesh/sim/world.py") == []
    assert decisions(source, "snapmesh/sim/controller.py") == ["line 1: network.cut_all("]


def test_the_rule_lets_the_events_through():
    source = "node.opened(src, conn_no, epoch=epoch)  # the node's own fence (N8)\nmachine.replayed(r, now, skip=s)\n"
    assert decisions(source) == []
