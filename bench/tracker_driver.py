"""A driver of the controller's per-report path, for instruction counts per snapshot.

The pure controller machine (`snapmesh.protocol.controller.machine.Controller` over a
`Tracker`) fed as the gRPC shell feeds it, with no I/O: `trigger`, every node's
FullState decoded from its wire bytes and `reported`, the effects drained, the
snapshot `filed` once COMPLETE (as the store's writer does), and `--keep`
retention checked on every COMPLETE (as the engine does). Deterministic (seeded
reports, fixed clock), so under `valgrind --tool=callgrind` its instruction
count is free of machine noise:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p .venv/bin/python -m bench.tracker_driver peak 10
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p .venv/bin/python -m bench.tracker_driver peak 60

(instructions per snapshot = the difference of the two totals / 50; start-up
and report generation cancel out). Scenarios: `peak` is a 4-node overtake mesh
at a cut under load (12 channels; per snapshot 1.9-3.5k transfers recorded and
2.8-4.1k in the senders' outboxes, about 800 of those not recorded): receivers
record runs past their positions, senders' outboxes overlap them and reach past
them, a marker's seq now and then leaves a gap. `low` is an 8-node overtake mesh
(56 channels) with a few transfers per channel (70-80 recorded per snapshot). A
third argument: `parse` only decodes the reports (the servicer's share, to
subtract); `full` starts with the tracker's working set full (1,000 finished
snapshots, as in a long run), where `--keep` retention's cost shows. Without
valgrind it prints µs per snapshot.
"""

from __future__ import annotations

import random
import sys
import time

from snapmesh.bank.wire import as_app_report
from snapmesh.sim.retention import due as past_retention  # the fuzzer's own statement of the rule (K1)
from snapmesh.sim.scale import bank_checker
from snapmesh.protocol.controller.machine import Controller
from snapmesh.protocol.topology import Topology
from snapmesh.protocol.controller.tracker import COMPLETE, Now, Tracker
from snapmesh.v1 import snapmesh_pb2 as pb

BALANCE = 10_000_000
SETS = 8  # distinct report sets, reused round-robin under fresh snapshot ids
KEEP = 100  # `--keep`: retention runs on every COMPLETE


def _channel(rng: random.Random, src: str, dst: str, base: int, busy: bool):
    """(recorded transfers, position, outbox seqs, outbox amounts) of one channel at one cut."""
    position = base + rng.randint(0, 50)
    if busy:
        recorded_n, below_n, past_n = rng.randint(40, 400), rng.randint(0, 120), rng.randint(0, 150)
    else:
        recorded_n, below_n, past_n = rng.randint(0, 3), rng.randint(0, 2), rng.randint(0, 2)
    recorded_seqs = list(range(position + 1, position + 1 + recorded_n))
    gap = None
    if recorded_seqs and rng.random() < 0.15:  # another snapshot's marker took a seq
        gap = recorded_seqs.pop(rng.randrange(len(recorded_seqs)))
    # The sender's unacknowledged transfers at its cut: from below the position (applied,
    # ack not back yet) or from within what the receiver records, to past it.
    first = max(1, position + 1 + rng.randint(-below_n, recorded_n // 2))
    outbox = [q for q in range(first, position + recorded_n + past_n + 1) if q != gap]
    amounts = {q: rng.randint(1, 500) for q in {*outbox, *recorded_seqs}}
    recorded = [pb.InFlightTransfer(msg_id=f"{src}:{dst}:{q}", amount=amounts[q], seq=q) for q in recorded_seqs]
    return recorded, position, outbox, [amounts[q] for q in outbox]


def report_sets(nodes: int, busy: bool, seed: int = 1) -> list[list[bytes]]:
    """SETS snapshots' worth of reports, each node's FullState as wire bytes."""
    rng = random.Random(seed)
    names = [f"p{i}" for i in range(1, nodes + 1)]
    sets = []
    for k in range(SETS):
        reports = {n: pb.FullState(snapshot_id=f"s{k}", node_id=n, snapshot_mode="overtake",
                                   cut_at_unix_ns=1_700_000_000_000_000_000 + k, done_at_unix_ns=1_700_000_000_010_000_000 + k)
                   for n in names}
        for dst in names:
            for src in names:
                if src == dst:
                    continue
                recorded, position, seqs, amounts = _channel(rng, src, dst, 1000 * k, busy)
                reports[dst].channels.add(src=src, dst=dst, in_flight=recorded)
                reports[dst].positions.add(src=src, dst=dst, seq=position)
                reports[src].outbox_runs.add(src=src, dst=dst, seqs=seqs, amounts=amounts)
        for n in names:
            reports[n].balance = BALANCE + rng.randint(-1000, 1000)
        # As the bank app's nodes send them: the balance as the state, each amount as its payload.
        sets.append([as_app_report(reports[n]).SerializeToString() for n in names])
    return sets


def _retire(tracker: Tracker, discarded: set[str]) -> list[str]:
    """What the engine's `--keep` retention does on a COMPLETE (before `Tracker.retired`:
    the rule over the whole working set, each id once)."""
    retired = getattr(tracker, "retired", None)
    if retired is not None:
        return retired(KEEP, "")
    fresh = [sid for sid in past_retention(tracker.finished(), KEEP) if sid not in discarded]
    discarded.update(fresh)
    return fresh


def run(scenario: str, snapshots: int, parse_only: bool = False, full: bool = False) -> int:
    nodes, busy = {"peak": (4, True), "low": (8, False)}[scenario]
    sets = report_sets(nodes, busy)
    tracker = Tracker(topology=Topology.build([f"p{i}" for i in range(1, nodes + 1)], None),
                      deadline_s=60, snapshot_mode="overtake", checker=bank_checker(BALANCE * nodes))
    if full:  # the working set as in a long run: FINISHED_KEPT finished snapshots in memory
        for i in range(tracker.kept):
            tracker.restore(pb.Snapshot(snapshot_id=f"2025{i:012d}", status=COMPLETE if i % 10 else pb.Snapshot.FAILED))
    machine = Controller(tracker)
    discarded: set[str] = set()
    complete = 0
    for i in range(snapshots):
        sid = f"2026{i:012d}"
        now = Now(mono=float(i), wall=1_700_000_000.0 + i * 0.1)
        wire = sets[i % SETS]
        if parse_only:
            for data in wire:
                pb.FullState.FromString(data).snapshot_id = sid
            continue
        machine.trigger(sid, "p1", now)
        machine.drain()
        for data in wire:
            state = pb.FullState.FromString(data)
            state.snapshot_id = sid
            snapshot = machine.reported(state, Now(mono=now.mono + 0.01, wall=now.wall + 0.01)).snapshot
            machine.drain()
        if snapshot.status == COMPLETE:
            complete += 1
            _retire(tracker, discarded)
            tracker.filed(sid)
    return complete


def main(argv: list[str]) -> int:
    scenario = argv[0] if argv else "peak"
    snapshots = int(argv[1]) if len(argv) > 1 else 200
    parse_only, full = argv[2:3] == ["parse"], argv[2:3] == ["full"]
    started = time.perf_counter()
    complete = run(scenario, snapshots, parse_only, full)
    elapsed = time.perf_counter() - started
    print(f"{scenario}: {snapshots} snapshots ({complete} complete), {elapsed / snapshots * 1e6:.1f} µs per snapshot "
          "(report generation included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
