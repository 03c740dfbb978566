"""The snapshot JSON export is byte for byte protobuf's own printer, only cheaper."""

from __future__ import annotations

import json
import random

import pytest

from services.controller import export
from services.controller.store import SnapshotStore
from snapmesh.v1 import snapmesh_pb2 as pb

SEEDS = range(60)
ODD_TEXT = ["", "p1", 'a "quoted" id', "back\\slash", "é ü 中", "tab\tnew\nline", "\x00\x1f", "🙂"]


def random_snapshot(rng: random.Random) -> pb.Snapshot:
    nodes = [f"p{i}" for i in range(1, rng.randint(1, 5) + 1)]
    s = pb.Snapshot(
        snapshot_id=rng.choice(["s-1", "20261124T040000.000001Z-p1", rng.choice(ODD_TEXT) or "x"]),
        initiator=rng.choice(nodes + [""]),
        status=rng.choice([pb.Snapshot.COMPLETE, pb.Snapshot.FAILED, pb.Snapshot.IN_PROGRESS]),
        reason=rng.choice(ODD_TEXT + ['"in_flight": []']),  # even the split token, inside a string
        total=rng.randint(-(2**63), 2**63 - 1),
        conserved=rng.random() < 0.5,
        expected_total=rng.randint(0, 10**12),
        epoch=rng.randint(0, 2**64 - 1),
    )
    if rng.random() < 0.7:
        s.started_at.FromNanoseconds(rng.randint(0, 2 * 10**18))
        s.finished_at.FromNanoseconds(rng.randint(0, 2 * 10**18))
    for n in nodes:
        s.nodes.add(node_id=n, balance=rng.randint(-10**9, 10**9))
    for src in nodes:
        for dst in nodes:
            if src == dst and rng.random() < 0.9:
                continue
            channel = s.channels.add(src=src, dst=dst)
            for _ in range(rng.choice([0, 0, 1, 3, 50])):
                channel.in_flight.add(
                    msg_id=rng.choice([f"{src}:{dst}:{rng.randint(0, 10**6)}", rng.choice(ODD_TEXT)]),
                    amount=rng.choice([0, rng.randint(-(2**63), 2**63 - 1), rng.randint(1, 100)]),
                    seq=rng.choice([0, rng.randint(1, 2**64 - 1)]),
                )
    if rng.random() < 0.6:
        s.stats.end_to_end_duration_ms = rng.random() * 1e4
        s.stats.in_flight_messages = sum(len(c.in_flight) for c in s.channels)
        for n in nodes:
            s.stats.nodes.add(node_id=n, start_delay_ms=rng.random() * 100, in_flight_bytes=rng.randint(0, 10**6))
    return s


@pytest.mark.parametrize("seed", SEEDS)
def test_export_is_byte_for_byte_the_protobuf_printer(seed: int) -> None:
    snapshot = random_snapshot(random.Random(seed))
    fast, reference = export.snapshot_json(snapshot), export.printed(snapshot)
    assert fast == reference, f"seed {seed}: the export differs from json_format.MessageToJson (rerun with this seed)"


def test_the_shortcut_is_taken_and_checked_on_a_snapshot_with_in_flight_entries(monkeypatch) -> None:
    """The comparison above must not pass just because every case fell back to the printer."""
    rng = random.Random(1)
    snapshot = random_snapshot(rng)
    while not any(c.in_flight for c in snapshot.channels) or not all(c.src and c.dst for c in snapshot.channels):
        snapshot = random_snapshot(rng)
    rendered: list[int] = []
    real = export._in_flight

    def spy(entries) -> str:
        rendered.append(len(entries))
        return real(entries)

    monkeypatch.setattr(export, "_in_flight", spy)
    assert export.snapshot_json(snapshot) == export.printed(snapshot)
    assert sum(rendered) == sum(len(c.in_flight) for c in snapshot.channels) > 0


def test_a_channel_without_src_falls_back_to_the_printer() -> None:
    snapshot = pb.Snapshot(snapshot_id="s")
    snapshot.channels.add(dst="p2").in_flight.add(msg_id="m", amount=1, seq=1)  # prints dst, in_flight, then src
    assert export.snapshot_json(snapshot) == export.printed(snapshot)


def test_the_exported_file_loads_back_equal(tmp_path) -> None:
    snapshot = random_snapshot(random.Random(7))
    snapshot.status = pb.Snapshot.COMPLETE
    snapshot.snapshot_id = "s-7"
    store = SnapshotStore(tmp_path / "json", tmp_path / "compact")
    (tmp_path / "json").mkdir()
    path = store.export_json(snapshot)
    assert json.loads(path.read_text())["snapshot_id"] == "s-7"
    loaded, warnings = store.load_all()  # no compact file: read from the JSON export
    assert warnings == [] and loaded == [snapshot]
