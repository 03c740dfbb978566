"""Tracker rule T8: a COMPLETE snapshot is kept compact (only the channels that hold
messages) and every channel is listed only in what the tracker hands out.

Equality: on random topologies (mesh, ring, random-regular:K, channels declared in
a shuffled order), classic and overtake mode, reports that list only their recorded
channels or every one (empty ones now and then with a field from a newer node), the
answer of the report that completes the snapshot and `get` are the message, byte
for byte, that the tracker built before T8 (the reference below: every channel of
the topology assembled at completion, T7's way). A failure prints the seed.

Cost: completing a snapshot assembles the channels that hold messages and no other;
the compact snapshot holds N nodes and those channels; the answer's expansion
encodes those channels alone (the empty ones come from the topology's block,
encoded when the tracker was built), and nothing walks the topology's channels.
"""

from __future__ import annotations

import random

import pytest

from snapmesh.protocol.controller import assembly, channel_list
from snapmesh.protocol.controller import tracker as tr
from snapmesh.protocol.topology import Topology
from snapmesh.settings import topologies
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

UNKNOWN = b"\xf8\x01\x05"  # field 31, varint 5: a field from a newer node
NOTHING = ()


class _BeforeT8(tr.Tracker):
    """The tracker's completion as it was before T8: every channel of the topology assembled."""

    def _complete(self, pending, now):
        snapshot, side = pending.snapshot, self.side
        del snapshot.nodes[:]
        for node in self.topology.nodes:
            self._fill(snapshot.nodes.add(), pending.reports[node])
        by_channel = {(c.src, c.dst): c for r in pending.reports.values() for c in r.channels}
        for src, dst in self.topology.channels:
            by_channel.setdefault((src, dst), pb.ChannelState(src=src, dst=dst))
        if self.snapshot_mode == "overtake":
            outbox, positions = assembly.overtake_parts(list(pending.reports.values()), side)
            for src, dst in self.topology.channels:
                seqs, *columns = outbox.get((src, dst), ((),))
                assembly.assemble(snapshot.channels, by_channel[(src, dst)],
                                  pending.recorded.get((src, dst), NOTHING), side,
                                  seqs, tuple(columns), positions.get((src, dst), 0))
        else:
            for src, dst in self.topology.channels:
                assembly.assemble(snapshot.channels, by_channel[(src, dst)],
                                  pending.recorded.get((src, dst), NOTHING), side)
        side.judge(snapshot)
        return self._finish(pending, tr.COMPLETE, snapshot.reason, now)


def _topology(rng: random.Random) -> Topology:
    nodes = [f"p{i}" for i in range(rng.randint(2, 12))]
    shape = rng.choice(["mesh", "ring", "random-regular"])
    if shape == "mesh":
        channels = [(a, b) for a in nodes for b in nodes if a != b]
    elif shape == "ring":
        channels = topologies.channels("ring", nodes)
    else:
        channels = topologies.random_regular(nodes, rng.randint(1, len(nodes) - 1), rng.randrange(1000))
    if rng.random() < 0.5:
        rng.shuffle(channels)  # topology order is the declared order, not a sorted one
    return Topology.build(nodes, channels)


def _reports(rng: random.Random, topology: Topology, mode: str) -> list[pb.FullState]:
    reports = {n: bank.report("s", n, rng.randint(0, 500), snapshot_mode=mode) for n in topology.nodes}
    busy = rng.choice([0.0, 0.1, 0.5, 1.0])  # the share of channels that recorded something
    for src, dst in topology.channels:
        position = rng.randint(0, 20)
        count = rng.choice([1, 2, 7]) if rng.random() < busy else 0
        amount = {q: rng.randint(1, 1000) for q in range(1, position + 60)}
        held = list(range(position + 1, position + 1 + count))
        channel = pb.ChannelState(src=src, dst=dst, in_flight=[bank.item(f"{src}:{dst}:{q}", amount[q], q) for q in held])
        if count or rng.random() < 0.5:  # an empty one is listed or left out (then the report says so)
            if rng.random() < 0.1:
                channel = pb.ChannelState.FromString(channel.SerializeToString() + UNKNOWN)
            reports[dst].channels.append(channel)
        if mode != "overtake":
            continue
        reports[dst].positions.add(src=src, dst=dst, seq=position)
        if rng.random() < 0.4:
            low = max(1, position + rng.randint(-15, 5))  # now and then all of it at or below the position
            outbox = sorted(rng.sample(range(low, low + 20), rng.choice([0, 1, 3, 10])))
            reports[src].outbox_runs.append(bank.outbox_run(src, dst, outbox, [amount[q] for q in outbox]))
    for node, report in reports.items():
        listed = {c.src for c in report.channels}
        report.only_recorded_channels = len(listed) < len(topology.incoming(node)) or rng.random() < 0.3
    order = list(reports.values())
    rng.shuffle(order)
    return order


def _run(kind, topology: Topology, mode: str, reports: list[pb.FullState], seed: int):
    expected_total = sum(int(r.state) for r in reports)
    t = kind(topology=topology, deadline_s=5, snapshot_mode=mode,
             checker=bank.checker(expected_total))
    t.start("s", topology.nodes[0], tr.Now(mono=1.0, wall=1_700_000_000.0))
    for i, report in enumerate(reports):
        answer = t.report(pb.FullState.FromString(report.SerializeToString()), tr.Now(2.0 + i, 1_700_000_001.0 + i))
    assert answer.snapshot.status == tr.COMPLETE, f"seed {seed}: {answer.snapshot.reason}"
    return t, answer.snapshot


@pytest.mark.parametrize("seed", range(300))
def test_the_answers_are_the_ones_the_tracker_built_before_it_kept_them_compact(seed: int) -> None:
    rng = random.Random(seed)
    topology = _topology(rng)
    mode = rng.choice(["classic", "overtake"])
    reports = _reports(rng, topology, mode)
    new, new_answer = _run(tr.Tracker, topology, mode, reports, seed)
    old, old_answer = _run(_BeforeT8, topology, mode, reports, seed)
    wire = old_answer.SerializeToString(deterministic=True)
    assert new_answer.SerializeToString(deterministic=True) == wire, f"seed {seed}"
    assert new.get("s").SerializeToString(deterministic=True) == wire, f"seed {seed}"
    assert [(c.src, c.dst) for c in new_answer.channels] == list(topology.channels), f"seed {seed}"
    kept = new.finished()[0]  # T8: compact, the same as the answer once expanded
    assert all(len(c.in_flight) for c in kept.channels), f"seed {seed}"
    assert channel_list.ChannelList(topology).expand(kept).SerializeToString(deterministic=True) == wire, f"seed {seed}"
    repeat = reports[rng.randrange(len(reports))].SerializeToString()  # T2 judged against the compact one
    assert _repeat(new, repeat) == _repeat(old, repeat), f"seed {seed}"


def _repeat(t: tr.Tracker, report: bytes) -> str:
    """What the tracker says of a report sent again once its snapshot is COMPLETE."""
    try:
        return f"duplicate {t.report(pb.FullState.FromString(report), tr.Now(99.0, 1_700_000_099.0)).duplicate}"
    except tr.TrackerError as exc:
        return f"{type(exc).__name__}: {exc}"


class _Walks(tuple):
    """A topology's channels that count the walks over them."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


@pytest.mark.parametrize("mode", ["classic", "overtake"])
def test_completing_assembles_only_the_channels_that_hold_messages(mode: str, monkeypatch) -> None:
    nodes = [f"p{i}" for i in range(60)]
    topology = Topology.build(nodes)  # a mesh: 3,540 channels
    busy = {(f"p{i}", f"p{(i * 7 + 3) % 60}") for i in range(0, 60, 3)} - {(n, n) for n in nodes}
    reports = {n: bank.report("s", n, 10, snapshot_mode=mode, only_recorded_channels=True) for n in nodes}
    for src, dst in sorted(busy):
        reports[dst].channels.add(src=src, dst=dst, in_flight=bank.items(src, dst, [1, 2]))
    if mode == "overtake":
        for src, dst in topology.channels:
            reports[dst].positions.add(src=src, dst=dst, seq=0)
    assembled = []
    real = assembly.assemble
    monkeypatch.setattr(assembly, "assemble", lambda channels, recorded, *a, **k: (
        assembled.append((recorded.src, recorded.dst)), real(channels, recorded, *a, **k))[1])
    spliced = []  # the channels an expansion encodes one by one
    entry = channel_list._entry
    monkeypatch.setattr(channel_list, "_entry", lambda channel: (spliced.append((channel.src, channel.dst)), entry(channel))[1])
    t = bank.tracker(topology, expected_total=600 + 3 * len(busy), deadline_s=5, snapshot_mode=mode)
    object.__setattr__(t.topology, "channels", _Walks(t.topology.channels))
    t.start("s", "p0", tr.Now(1.0, 1_700_000_000.0))
    _Walks.walks = 0
    del spliced[:]  # the topology's block, encoded once when the tracker was built
    for i, node in enumerate(nodes):
        answer = t.report(reports[node], tr.Now(2.0 + i, 1_700_000_001.0 + i)).snapshot
    assert answer.status == tr.COMPLETE and answer.conserved, answer.reason
    assert sorted(assembled) == sorted(busy)  # not one per channel of the mesh
    kept = t.finished()[0]
    assert len(kept.nodes) + len(kept.channels) == len(nodes) + len(busy)
    assert len(answer.channels) == len(topology.channels)  # the v1 answer still lists every channel
    assert sorted(spliced) == sorted(busy)  # the answer lists the others from the topology's encoded block
    assert _Walks.walks == 0  # nor is the topology's channel list walked, once the tracker is built


@pytest.mark.parametrize("width", [1, 60, 130, 20_000])
def test_the_expansion_splices_any_channel_names(width: int) -> None:
    # The encoded block's offsets count each entry's length prefix: names long enough
    # for two- and three-byte lengths, and names that are not ASCII.
    nodes = [f"{i}{'é' * width}" for i in range(3)] + ["x"]
    topology = Topology.build(nodes, [(nodes[i], nodes[(i + 1) % 4]) for i in range(4)] + [(nodes[2], nodes[0])])
    compact = pb.Snapshot(snapshot_id="s", status=tr.COMPLETE)
    busy = [topology.channels[1], topology.channels[4]]
    for src, dst in busy:
        compact.channels.add(src=src, dst=dst, in_flight=bank.items(src, dst, [5]))
    by_hand = pb.Snapshot(snapshot_id="s", status=tr.COMPLETE)
    for src, dst in topology.channels:
        by_hand.channels.add(src=src, dst=dst, in_flight=bank.items(src, dst, [5]) if (src, dst) in busy else [])
    expanded = channel_list.ChannelList(topology).expand(compact)
    assert expanded.SerializeToString(deterministic=True) == by_hand.SerializeToString(deterministic=True)
