"""The tracker's snapshot assembly against the way it was first written: on generated
reports (classic and overtake mode; recorded runs that start past the position, with
gaps, out of order, repeated, below the position; outboxes that overlap them on
either side; packed and older per-entry outboxes; unknown fields; any report order)
the COMPLETE snapshot is the same message, byte for byte, as the one the reference
below builds. The reference is the earlier code, kept here as it was: one
`InFlightTransfer` per item, merged with `merge` as a list and copied in one by one.
The reports are the bank app's (tests/support/bank_reports.py: balances as state
bytes, amounts as payloads), and both trackers hand the whole snapshot to its checker.
A failure prints the seed that reproduces it."""

from __future__ import annotations

import bisect
import operator
import random

import pytest

from snapmesh.protocol.appstate import digest
from snapmesh.protocol.controller import assembly, tracker as tr
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

UNKNOWN = b"\xf8\x01\x05"  # field 31, varint 5: a field from a newer node


def _reference_merge(recorded, seqs, amounts, position, make):
    held = [t.seq for t in recorded]
    in_order = all(map(operator.lt, held, held[1:]))
    start = bisect.bisect_right(seqs, position)
    if in_order and held and held[-1] - held[0] + 1 == len(held):
        below = max(start, bisect.bisect_left(seqs, held[0]))
        above = max(start, bisect.bisect_right(seqs, held[-1]))
        extra = [make(seq, amount) for seq, amount in zip(seqs[start:below], amounts[start:below], strict=True)]
        extra += [make(seq, amount) for seq, amount in zip(seqs[above:], amounts[above:], strict=True)]
    else:
        have = set(held)
        extra = [make(seq, amount) for seq, amount in zip(seqs[start:], amounts[start:], strict=True) if seq not in have]
    if in_order and (not extra or not held or extra[0].seq > held[-1]):
        return [*recorded, *extra]
    by_seq = {}
    for item in [*recorded, *extra]:
        by_seq.setdefault(item.seq, item)
    return [by_seq[seq] for seq in sorted(by_seq)]


class _Reference(tr.Tracker):
    """The tracker with its earlier assembly and per-node statistics."""

    def report(self, state, now):
        pending, _ = self._check_report(state)
        if pending is None:
            return tr.Reported(self.get(state.snapshot_id), duplicate=True)
        pending.reports[state.node_id] = tr._copy(state)
        pending.snapshot.nodes.add(node_id=state.node_id, app_name=state.app_name, app_version=state.app_version)
        snapshot = pending.snapshot
        received_ns = int(round(now.wall * 1e9))
        cut, done = state.cut_at_unix_ns, state.done_at_unix_ns
        stats = snapshot.stats.nodes.add(
            node_id=state.node_id,
            start_delay_ms=(cut - snapshot.started_at.ToNanoseconds()) / 1e6 if cut else 0.0,
            recording_duration_ms=(done - cut) / 1e6 if cut and done else 0.0,
            report_time_ms=(received_ns - done) / 1e6 if done else 0.0,
            in_flight_messages=sum(len(c.in_flight) for c in state.channels),
            in_flight_bytes=sum(t.ByteSize() for c in state.channels for t in c.in_flight),
        )
        stats.ack_timestamp.FromNanoseconds(received_ns)
        if len(pending.reports) < len(self.topology.nodes):
            return tr.Reported(tr._copy(pending.snapshot), duplicate=False)
        return tr.Reported(self._complete(pending, now), duplicate=False)

    def _complete(self, pending, now):
        snapshot = pending.snapshot
        del snapshot.nodes[:]
        for node in self.topology.nodes:
            report = pending.reports[node]
            snapshot.nodes.add(node_id=node, state=report.state, state_digest=digest(report.state),
                               app_name=report.app_name, app_version=report.app_version)
        by_channel = {(c.src, c.dst): c for r in pending.reports.values() for c in r.channels}
        overtake_parts = (assembly.overtake_parts(list(pending.reports.values()), self.side)
                          if self.snapshot_mode == "overtake" else None)
        for src, dst in self.topology.channels:
            in_flight = by_channel[(src, dst)].in_flight
            if overtake_parts is not None:
                outbox, positions = overtake_parts
                seqs, payloads = outbox.get((src, dst), ((), ()))
                in_flight = _reference_merge(
                    in_flight, seqs, payloads, positions.get((src, dst), 0),
                    lambda seq, payload, s=src, d=dst: pb.InFlightTransfer(msg_id=f"{s}:{d}:{seq}", seq=seq,
                                                                           payload=payload),
                )
            snapshot.channels.add(src=src, dst=dst, in_flight=in_flight)
        self.side.judge(snapshot)
        return self._finish(pending, tr.COMPLETE, snapshot.reason, now)


def _with_unknown(message, rng: random.Random):
    """`message`, now and then with a field this version does not know."""
    if rng.random() < 0.1:
        return type(message).FromString(message.SerializeToString() + UNKNOWN)
    return message


def _recorded(rng: random.Random, src: str, dst: str, position: int) -> list[int]:
    shape = rng.random()
    count = rng.choice([0, 1, 2, 5, 30])
    first = position + 1 if rng.random() < 0.7 else max(1, position + rng.randint(-5, 8))
    seqs = list(range(first, first + count))
    if shape < 0.2 and seqs:
        seqs = sorted(rng.sample(seqs, max(1, len(seqs) - rng.randint(1, 3))))  # gaps (other markers)
    elif shape < 0.3:
        rng.shuffle(seqs)  # out of order
    elif shape < 0.35 and seqs:
        seqs.insert(rng.randrange(len(seqs) + 1), rng.choice(seqs))  # a seq twice
    return seqs


def _reports(rng: random.Random, nodes: list[str], channels, mode: str) -> list[pb.FullState]:
    reports = {n: bank.report("s", n, rng.randint(0, 500), snapshot_mode=mode,
                              cut_at_unix_ns=rng.choice([0, 1_700_000_000_100_000_000]),
                              done_at_unix_ns=rng.choice([0, 1_700_000_000_200_000_000]))
               for n in nodes}
    for src, dst in channels:
        position = rng.randint(0, 40)
        held = _recorded(rng, src, dst, position)
        amount = {q: rng.randint(1, 1000) for q in range(1, position + 80)}
        items = [_with_unknown(bank.item(f"{src}:{dst}:{q}", amount[q], q), rng) for q in held]
        reports[dst].channels.add().CopyFrom(_with_unknown(pb.ChannelState(src=src, dst=dst, in_flight=items), rng))
        if mode != "overtake":
            continue
        reports[dst].positions.add(src=src, dst=dst, seq=position)
        low = max(1, position + rng.randint(-10, 10))
        outbox = sorted(rng.sample(range(low, low + 60), rng.choice([0, 1, 3, 20, 50])))
        if rng.random() < 0.8:
            reports[src].outbox_runs.append(bank.outbox_run(src, dst, outbox, [amount[q] for q in outbox]))
        else:
            reports[src].outbox.add(src=src, dst=dst, in_flight=[bank.item(f"{src}:{dst}:{q}", amount[q], q)
                                                                 for q in outbox])
    order = list(reports.values())
    rng.shuffle(order)
    return order


@pytest.mark.parametrize("seed", range(400))
def test_the_complete_snapshot_is_the_one_the_earlier_assembly_built(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [f"p{i}" for i in range(1, rng.randint(2, 5) + 1)]
    ring = rng.random() < 0.3
    topology = Topology.build(nodes, [(a, b) for a, b in zip(nodes, nodes[1:] + nodes[:1], strict=True)] if ring else None)
    mode = "overtake" if rng.random() < 0.8 else "classic"
    reports = _reports(rng, nodes, topology.channels, mode)
    expected_total = rng.choice([0, sum(int(r.state) for r in reports)])
    built = []
    for kind in (tr.Tracker, _Reference):
        t = kind(topology=topology, deadline_s=5, snapshot_mode=mode,
                 checker=bank.checker(expected_total))
        now = tr.Now(mono=1.0, wall=1_700_000_000.0)
        t.start("s", nodes[0], now)
        for i, report in enumerate(reports):
            answer = t.report(pb.FullState.FromString(report.SerializeToString()), tr.Now(1.0 + i, now.wall + i)).snapshot
        assert answer.status == tr.COMPLETE, f"seed {seed}"
        built.append(answer)
    new, old = built
    assert new.SerializeToString(deterministic=True) == old.SerializeToString(deterministic=True), f"seed {seed}"
    assert new == old, f"seed {seed}"
    assert new.app.status == pb.AppCheck.CHECKED and new.HasField("total"), f"seed {seed}"  # the bank's figures, read
