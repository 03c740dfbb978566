"""The snapshot JSON export is byte for byte protobuf's own printer, only cheaper."""

from __future__ import annotations

import json
import random

import pytest
from google.protobuf import json_format

from snapmesh.services.controller import export
from snapmesh.services.controller.store import SnapshotStore
from snapmesh.checking import snapshot_file
from snapmesh.v1 import snapmesh_pb2 as pb

SEEDS = range(150)
ODD_TEXT = ["", "p1", 'a "quoted" id', "back\\slash", "é ü 中", "tab\tnew\nline", "\x00\x1f", "🙂", "del\x7f",
            "%s%d%%", "{}"]
ODD_DOUBLES = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e300, 5e-324, 1.0, 0.1 + 0.2]


def random_snapshot(rng: random.Random) -> pb.Snapshot:
    nodes = [f"p{i}" for i in range(1, rng.randint(1, 5) + 1)]
    s = pb.Snapshot(
        snapshot_id=rng.choice(["s-1", "20261124T040000.000001Z-p1", rng.choice(ODD_TEXT) or "x"]),
        initiator=rng.choice(nodes + [""]),
        status=rng.choice([pb.Snapshot.COMPLETE, pb.Snapshot.FAILED, pb.Snapshot.IN_PROGRESS, 0, 7]),  # 7: unknown
        reason=rng.choice(ODD_TEXT + ['"in_flight": []', '\n  "checksum": ""']),  # the old split token, the seal's
        total=rng.randint(-(2**63), 2**63 - 1),
        conserved=rng.random() < 0.5,
        expected_total=rng.choice([0, rng.randint(0, 10**12)]),
        epoch=rng.choice([0, rng.randint(0, 2**64 - 1)]),
        in_flight_omitted=rng.random() < 0.2,
    )
    if rng.random() < 0.7:
        s.started_at.FromNanoseconds(rng.choice([0, rng.randint(0, 2 * 10**18)]))
        s.finished_at.FromNanoseconds(rng.randint(0, 2 * 10**18) // rng.choice([1, 10**3, 10**6, 10**9]))
    for n in nodes:
        s.nodes.add(node_id=rng.choice([n, n, ""]), balance=rng.choice([0, rng.randint(-10**9, 10**9)]))
    for src in nodes:
        for dst in nodes:
            if src == dst and rng.random() < 0.9:
                continue
            channel = s.channels.add(src=src, dst=dst)
            _fill(channel, rng)
    if rng.random() < 0.3:  # no real channel lacks one, but the printer puts it last
        _fill(s.channels.add(**rng.choice([{"src": nodes[0]}, {"dst": nodes[0]}, {}])), rng)
    if rng.random() < 0.6:
        s.stats.end_to_end_duration_ms = rng.choice([rng.random() * 1e4, *ODD_DOUBLES])
        s.stats.in_flight_messages = sum(len(c.in_flight) for c in s.channels)
        for n in nodes:
            node = s.stats.nodes.add(node_id=n, start_delay_ms=rng.choice([rng.random() * 100, *ODD_DOUBLES]),
                                     in_flight_bytes=rng.randint(0, 10**6))
            if rng.random() < 0.5:
                node.ack_timestamp.FromNanoseconds(rng.randint(0, 2 * 10**18))
    elif rng.random() < 0.5:
        s.stats.SetInParent()  # present, every field at its default
    return s


def _fill(channel: pb.ChannelState, rng: random.Random) -> None:
    """In-flight entries of three kinds of channel: real ones (every field set, plain
    "src:dst:seq" ids: the bulk shortcut), real but for one odd msg_id (every field
    set, so only the id check keeps it off the shortcut), and anything."""
    kind = rng.choice(["real", "one odd id", "any"])
    for _ in range(rng.choice([0, 0, 1, 3, 4, 5, 50])):  # below, at and above export._BULK
        seq = rng.randint(1, 2**64 - 1)
        if kind == "any":
            channel.in_flight.add(
                msg_id=rng.choice([f"{channel.src}:{channel.dst}:{seq}", rng.choice(ODD_TEXT)]),
                amount=rng.choice([0, rng.randint(-(2**63), 2**63 - 1), rng.randint(1, 100)]),
                seq=rng.choice([0, seq]),
            )
        else:
            channel.in_flight.add(msg_id=f"{channel.src}:{channel.dst}:{seq}", amount=rng.randint(1, 100), seq=seq)
    if kind == "one odd id" and channel.in_flight:
        rng.choice(channel.in_flight).msg_id = rng.choice([t for t in ODD_TEXT if t])


@pytest.mark.parametrize("seed", SEEDS)
def test_export_is_byte_for_byte_the_protobuf_printer(seed: int, monkeypatch) -> None:
    snapshot = random_snapshot(random.Random(seed))
    reference = export.printed(snapshot)
    # and not because it handed the snapshot to the printer: the renderer covers every field here
    monkeypatch.setattr(export, "printed", lambda message: pytest.fail("fell back to the printer"))
    fast = export.snapshot_json(snapshot)
    assert fast == reference, f"seed {seed}: the export differs from json_format.MessageToJson (rerun with this seed)"


@pytest.mark.parametrize("seed", range(40))
def test_the_sealed_export_is_the_printer_text_sealed(seed: int, tmp_path) -> None:
    """The store writes the export with its checksum rendered in place: the bytes
    are what sealing the printer's text gives."""
    snapshot = random_snapshot(random.Random(seed))
    snapshot.snapshot_id = f"s-{seed}"
    digest = snapshot_file.checksum(snapshot)
    reference = snapshot_file.sealed_json(export.printed(snapshot), digest)
    assert export.snapshot_json(snapshot, digest) == reference
    store = SnapshotStore(tmp_path / "json", tmp_path / "compact")
    assert store.export_json(snapshot).read_bytes() == (reference + "\n").encode("utf-8")
    assert store.export_json(snapshot, store.save_compact(snapshot)).read_bytes() == (reference + "\n").encode("utf-8")


def test_a_sealed_snapshot_is_sealed_again_as_sealed_json_does() -> None:
    snapshot = random_snapshot(random.Random(3))
    snapshot.checksum = "sha256:old"
    assert export.snapshot_json(snapshot, "sha256:new") == snapshot_file.sealed_json(export.printed(snapshot), "sha256:new")


def test_real_channels_take_the_bulk_shortcut(monkeypatch) -> None:
    """The comparisons above must not pass just because every channel went entry by entry."""
    rng = random.Random(1)
    snapshot = pb.Snapshot(snapshot_id="s", status=pb.Snapshot.COMPLETE)
    for src, dst in (("p1", "p2"), ("p2", "p1"), ("p1", "p3")):
        channel = snapshot.channels.add(src=src, dst=dst)
        for seq in range(1, export._BULK + rng.randint(0, 50)):
            channel.in_flight.add(msg_id=f"{src}:{dst}:{seq}", amount=rng.randint(1, 9), seq=seq)
    reference = export.printed(snapshot)
    monkeypatch.setattr(export, "_entry", lambda *args: pytest.fail("went entry by entry"))
    assert export.snapshot_json(snapshot) == reference


@pytest.mark.parametrize("odd", [t for t in ODD_TEXT if t])
def test_an_odd_msg_id_keeps_its_channel_off_the_bulk_shortcut(odd: str) -> None:
    snapshot = pb.Snapshot(snapshot_id="s")
    channel = snapshot.channels.add(src="p1", dst="p2")
    for seq in range(1, export._BULK + 3):
        channel.in_flight.add(msg_id=f"p1:p2:{seq}", amount=5, seq=seq)
    channel.in_flight[1].msg_id = odd
    assert export.snapshot_json(snapshot) == export.printed(snapshot)


def test_a_field_it_does_not_cover_goes_to_the_printer(monkeypatch) -> None:
    """Whatever raises `_Unsure` (here: as if the enum were closed) is the printer's."""
    snapshot = random_snapshot(random.Random(5))
    snapshot.status = pb.Snapshot.COMPLETE
    calls: list[object] = []
    real = export.printed
    monkeypatch.setattr(export, "printed", lambda message: calls.append(message) or real(message))
    monkeypatch.setattr(export, "_text", lambda *args: (_ for _ in ()).throw(export._Unsure("test")))
    assert export.snapshot_json(snapshot) == real(snapshot) and calls == [snapshot]


def test_a_channel_without_src_falls_back_to_the_printer() -> None:
    snapshot = pb.Snapshot(snapshot_id="s")
    snapshot.channels.add(dst="p2").in_flight.add(msg_id="m", amount=1, seq=1)  # prints dst, in_flight, then src
    assert export.snapshot_json(snapshot) == export.printed(snapshot)


def test_an_app_nodes_state_is_exported_with_nothing_in_flight() -> None:
    snapshot = pb.Snapshot(snapshot_id="s")
    snapshot.app.spec = "token_ring:app"
    snapshot.nodes.add(node_id="p1", state=b"0", state_digest="sha256:5fec")  # the fast path printed neither
    snapshot.channels.add(src="p1", dst="p2")
    text = export.snapshot_json(snapshot)
    assert text == export.printed(snapshot) and '"state": "MA=="' in text and '"state_digest"' in text


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


def test_plain_ids_are_exactly_the_ones_the_encoder_leaves_alone() -> None:
    for code in range(0x800):  # every ASCII character, and some beyond
        text = f"p1:p2:{chr(code)}"
        assert export._plain(text) == (json.dumps(text) == f'"{text}"'), hex(code)


def test_a_timestamp_the_printer_refuses_is_refused_the_same_way() -> None:
    snapshot = pb.Snapshot(snapshot_id="s")
    snapshot.started_at.seconds = 2**40  # past year 9999
    with pytest.raises(json_format.SerializeToJsonError):
        export.printed(snapshot)
    with pytest.raises(json_format.SerializeToJsonError):
        export.snapshot_json(snapshot)


def test_states_and_manifests_are_printed_here_not_by_the_printer(monkeypatch) -> None:
    """Bytes (an app's state, a manifest's hashes) take the fast path, base64 as the
    printer has it: the printer builds a dict of the whole state and runs the
    pure-Python encoder over it, seconds at 256 MiB."""
    snapshot = pb.Snapshot(snapshot_id="s")
    snapshot.nodes.add(node_id="p1", state=bytes(range(256)) * 40, state_digest="sha256:00")
    snapshot.nodes.add(node_id="p2", state_digest="sha256:01").state_blocks.hashes.extend([b"\xfb" * 32, b"\x00" * 32])
    snapshot.channels.add(src="p1", dst="p2").in_flight.add(msg_id="m", seq=1, payload=b"\xff\xfe")
    expected = export.printed(snapshot)
    monkeypatch.setattr(export, "printed", lambda message: pytest.fail("the printer was called"))
    assert export.snapshot_json(snapshot) == expected
