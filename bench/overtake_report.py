"""What an overtake-mode snapshot costs to report and assemble, two ways, side by side
in one run (`python -m bench report`):

- per-entry (before): each sender's outbox at its cut as one `InFlightTransfer`
  message per transfer (`FullState.outbox`);
- packed (now): the same outbox as two packed columns, seqs and payloads
  (`FullState.outbox_runs`); the controller makes a message only for what the
  receiver did not record.

A 4-node mesh (12 channels) at a cut taken under load: each outbox holds OUTBOX
unacknowledged transfers and each receiver recorded RECORDED_SHARE of them (the
part acknowledged before the sender's cut arrives anyway). Timed, per snapshot:
the nodes building and encoding their reports (`reporter.full_state_message`),
the controller decoding them and assembling the COMPLETE snapshot
(`tracker.Tracker.report`). Rounds alternate the two ways; the median counts.
Keys merged into bench/results.json: `overtake_report_ms_per_entry`,
`overtake_report_ms_packed`, `overtake_report_packed_speedup`,
`overtake_report_bytes_ratio`.
"""

from __future__ import annotations

import statistics
import time

from bench import results as bench_results
from bench import smoke
from snapmesh.protocol.controller.tracker import Now, Tracker
from snapmesh.services.node.reporter import full_state_message
from snapmesh.protocol.node import core
from snapmesh.protocol.node.link import Entry
from snapmesh.protocol.topology import Topology
from snapmesh.sim.scale import bank_checker
from snapmesh.v1 import snapmesh_pb2 as pb

NODES = ("p1", "p2", "p3", "p4")
OUTBOX = 1_000
RECORDED_SHARE = 0.8
ROUNDS = 15
BALANCE = 10_000_000


def _money(q: int) -> bytes:
    """A balance or an amount as the bank app writes it (decimal ASCII)."""
    return str(q).encode()


def _states() -> list[core.FullState]:
    """Every node's part at one cut, as the bank app's nodes hold it (the balance as
    the state, each amount q as its payload): positions 0, outboxes of seqs 1..OUTBOX."""
    recorded = int(OUTBOX * RECORDED_SHARE)
    states = []
    for node in NODES:
        others = [n for n in NODES if n != node]
        states.append(core.FullState(
            node_id=node, snapshot_id="s", app="bank", version=1,
            state=_money(BALANCE - sum(range(1, OUTBOX + 1)) * len(others)),
            channels={src: tuple(core.Transfer(msg_id=f"{src}:{node}:{q}", seq=q, payload=_money(q))
                                 for q in range(1, recorded + 1))
                      for src in others},
            positions={src: 0 for src in others},
            outbox={dst: tuple(Entry(q, 0, "", payload=_money(q)) for q in range(1, OUTBOX + 1)) for dst in others},
        ))
    return states


def _per_entry(state: core.FullState) -> pb.FullState:
    """The report as nodes built it before outbox_runs."""
    report = full_state_message(state, state.node_id)
    del report.outbox_runs[:]
    for dst, entries in state.outbox.items():
        report.outbox.add(src=state.node_id, dst=dst, in_flight=[
            pb.InFlightTransfer(msg_id=f"{state.node_id}:{dst}:{e.seq}", payload=e.payload, seq=e.seq) for e in entries])
    return report


def _round(states: list[core.FullState], build) -> tuple[float, int, pb.Snapshot]:  # noqa: ANN001
    tracker = Tracker(topology=Topology.build(NODES, None), deadline_s=60, snapshot_mode="overtake",
                      checker=bank_checker(BALANCE * len(NODES)))
    now = Now(mono=1.0, wall=time.time())
    tracker.start("s", "p1", now)
    started = time.perf_counter()
    wire = [build(s).SerializeToString() for s in states]
    done = None
    for data in wire:
        done = tracker.report(pb.FullState.FromString(data), now).snapshot
    return time.perf_counter() - started, sum(map(len, wire)), done


def measure(rounds: int = ROUNDS) -> dict[str, float]:
    states = _states()
    times: dict[str, list[float]] = {"per_entry": [], "packed": []}
    sizes: dict[str, int] = {}
    results: dict[str, pb.Snapshot] = {}
    for _ in range(rounds):
        for name, build in (("per_entry", _per_entry), ("packed", lambda s: full_state_message(s, s.node_id))):
            seconds, sizes[name], results[name] = _round(states, build)
            times[name].append(seconds)
    for snapshot in results.values():  # both ways give the same COMPLETE, conserved snapshot
        assert snapshot.status == pb.Snapshot.COMPLETE and snapshot.conserved, snapshot.reason
    assert list(results["packed"].channels) == list(results["per_entry"].channels)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {
        "overtake_report_ms_per_entry": round(ms["per_entry"], 3),
        "overtake_report_ms_packed": round(ms["packed"], 3),
        "overtake_report_packed_speedup": round(ms["per_entry"] / ms["packed"], 2),
        "overtake_report_bytes_ratio": round(sizes["per_entry"] / sizes["packed"], 2),
    }


def main() -> int:
    rounds = smoke.size(ROUNDS, 1)  # a round is a few tens of ms: a smoke run keeps the outbox's size
    figures = measure(rounds)
    print(f"4 nodes, outboxes of {OUTBOX:,} per channel ({RECORDED_SHARE:.0%} also recorded by the receiver), "
          f"median of {rounds} alternating rounds, one run")
    print(f"{'reports built, encoded, decoded, assembled':<46} {'ms/snapshot':>12}")
    print(f"{'per-entry outbox messages (before)':<46} {figures['overtake_report_ms_per_entry']:>12.2f}")
    print(f"{'packed outbox columns (now)':<46} {figures['overtake_report_ms_packed']:>12.2f}")
    print(f"packed: {figures['overtake_report_packed_speedup']}x less time, "
          f"{figures['overtake_report_bytes_ratio']}x fewer bytes on the wire")
    bench_results.merge(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
