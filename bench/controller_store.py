"""What the controller pays per in-flight entry to keep a finished snapshot, two ways,
side by side in one run (`python -m bench store`):

- printer:   protobuf's own JSON printer (`json_format`), written atomically (fsync,
             rename): what the export cost before `services/controller/export.py`;
- protojson: the JSON export as it is now, the same bytes, written the same way;
- compact:   the store of record, the Snapshot's protobuf bytes written the same way;
- journal:   what now stands between the last report and the COMPLETE answer: the
             reports' journal frames (encode only; their fsync is shared by a group commit).

Snapshots of an 8-node mesh (56 channels) with ENTRIES in-flight transfers, so a
file's fixed cost (fsync, rename) is spread thin. Rounds alternate the methods and
the median round counts. Keys merged into bench/results.json:
`store_us_per_entry_printer`, `store_us_per_entry_protojson`, `store_export_speedup`,
`store_us_per_entry_compact`, `store_compact_speedup`, `journal_us_per_entry`.

`python -m bench store --no-write` renders only (no file, no fsync: the CPU the
writer thread holds the GIL for, steadier on a shared machine) and merges nothing
into bench/results.json. It adds the common case at low load: small snapshots
(8 nodes, 0-50 entries, per-node stats as the tracker fills them), in µs per snapshot.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import results, smoke
from snapmesh.services.controller import export
from snapmesh.protocol.controller import journal
from snapmesh.services.controller.store import SnapshotStore
from snapmesh.checking import snapshot_file
from snapmesh.serving.durable import write_atomically
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

NODES = 8
ENTRIES = 20_000
ROUNDS = 7


def _snapshot(entries: int) -> tuple[pb.Snapshot, list[pb.FullState]]:
    topology = Topology.build([f"p{i}" for i in range(1, NODES + 1)], None)
    channels = list(topology.channels)
    per_channel = entries // len(channels)
    snapshot = pb.Snapshot(snapshot_id="bench", initiator="p1", status=pb.Snapshot.COMPLETE, total=8000)
    reports = {n: pb.FullState(snapshot_id="bench", node_id=n, balance=1000) for n in topology.nodes}
    for src, dst in channels:
        items = [
            pb.InFlightTransfer(msg_id=f"{src}:{dst}:{seq}", amount=1 + seq % 97, seq=seq)
            for seq in range(1, per_channel + 1)
        ]
        snapshot.channels.add(src=src, dst=dst, in_flight=items)
        reports[dst].channels.add(src=src, dst=dst, in_flight=items)
    for node in topology.nodes:
        snapshot.nodes.add(node_id=node, balance=1000)
    snapshot.started_at.FromNanoseconds(time.time_ns())
    snapshot.finished_at.FromNanoseconds(time.time_ns())
    return snapshot, list(reports.values())


def _small(entries: int, rng: random.Random) -> pb.Snapshot:
    """A snapshot as the tracker finishes it at low load: `entries` transfers on random channels."""
    snapshot, _ = _snapshot(0)
    snapshot.snapshot_id = f"20261126T010203.{entries:06d}Z-p1"
    for seq in range(1, entries + 1):
        channel = rng.choice(snapshot.channels)
        channel.in_flight.add(msg_id=f"{channel.src}:{channel.dst}:{seq}", amount=rng.randint(1, 97), seq=seq)
    start = snapshot.started_at.ToNanoseconds()
    for node in snapshot.nodes:
        stats = snapshot.stats.nodes.add(node_id=node.node_id, start_delay_ms=rng.random() * 5,
                                         recording_duration_ms=rng.random() * 20, report_time_ms=rng.random() * 3)
        stats.ack_timestamp.FromNanoseconds(start + rng.randint(0, 10**8))
    snapshot.stats.end_to_end_duration_ms = rng.random() * 100
    snapshot.stats.in_flight_messages = entries
    return snapshot


def render_only(entries: int = ENTRIES, rounds: int = ROUNDS) -> dict[str, float]:
    """µs per entry (large) and per snapshot (small) to render, printer vs export.py, no files."""
    large, _ = _snapshot(entries)
    n = sum(len(c.in_flight) for c in large.channels)
    small = [_small(k, random.Random(k)) for k in range(51)]
    for s in (large, *small):
        assert export.snapshot_json(s) == export.printed(s)
    times: dict[str, list[float]] = {k: [] for k in ("printer", "protojson", "compact", "small_printer", "small_protojson")}
    for _ in range(rounds):
        for name, work in (
            ("printer", lambda: export.printed(large)),
            ("protojson", lambda: export.snapshot_json(large)),
            ("compact", lambda: large.SerializeToString(deterministic=True)),
            ("small_printer", lambda: [export.printed(s) for s in small]),
            ("small_protojson", lambda: [export.snapshot_json(s) for s in small]),
        ):
            start = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "us_per_entry_printer": med["printer"] / n * 1e6, "us_per_entry_protojson": med["protojson"] / n * 1e6,
        "us_per_entry_compact": med["compact"] / n * 1e6, "entries": n,
        "us_per_small_printer": med["small_printer"] / len(small) * 1e6,
        "us_per_small_protojson": med["small_protojson"] / len(small) * 1e6,
    }


def main_render_only() -> int:
    rounds = smoke.size(ROUNDS, 1)
    f = render_only(smoke.size(ENTRIES, 560), rounds)
    print(f"render only (no files, nothing merged into bench/results.json), median of {rounds} rounds, one run")
    print(f"{'large snapshot, ' + format(f['entries'], ',') + ' entries':<44} {'us/entry':>9}")
    print(f"{'proto JSON, protobuf printer':<44} {f['us_per_entry_printer']:>9.3f}")
    print(f"{'proto JSON, export.py (same bytes)':<44} {f['us_per_entry_protojson']:>9.3f}")
    print(f"{'protobuf bytes (the compact file)':<44} {f['us_per_entry_compact']:>9.3f}")
    print(f"{'small snapshots, 8 nodes, 0-50 entries':<44} {'us/snap':>9}")
    print(f"{'proto JSON, protobuf printer':<44} {f['us_per_small_printer']:>9.1f}")
    print(f"{'proto JSON, export.py (same bytes)':<44} {f['us_per_small_protojson']:>9.1f}")
    return 0


def measure(entries: int = ENTRIES, rounds: int = ROUNDS) -> dict[str, float]:
    snapshot, reports = _snapshot(entries)
    n = sum(len(c.in_flight) for c in snapshot.channels)
    times: dict[str, list[float]] = {"printer": [], "protojson": [], "compact": [], "journal": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(Path(tmp) / "json", Path(tmp) / "compact")
        for r in range(rounds):
            snapshot.snapshot_id = f"bench-{r}"
            for name, write in (
                ("printer", lambda: write_atomically(Path(tmp) / "printed.json", export.printed(snapshot).encode())),
                ("protojson", lambda: store.export_json(snapshot)),
                ("compact", lambda: store.save_compact(snapshot)),
                ("journal", lambda: [journal.encode(journal.Reported(state=s, wall=0.0)) for s in reports]),
            ):
                start = time.perf_counter()
                write()
                times[name].append(time.perf_counter() - start)
        # the export is the printer's text with its checksum; the compact file reads back to the same snapshot
        sealed = snapshot_file.sealed_json(export.printed(snapshot), snapshot_file.checksum(snapshot))
        assert store.path(snapshot.snapshot_id).read_text() == sealed + "\n"
        stored = snapshot_file.read(store.compact_path(snapshot.snapshot_id))
        assert stored.checksum == snapshot_file.checksum(snapshot)
        stored.ClearField("checksum")
        assert stored == snapshot
    per_entry = {k: statistics.median(v) / n * 1e6 for k, v in times.items()}
    return {
        "store_us_per_entry_printer": round(per_entry["printer"], 4),
        "store_us_per_entry_protojson": round(per_entry["protojson"], 4),
        "store_export_speedup": round(per_entry["printer"] / per_entry["protojson"], 1),
        "store_us_per_entry_compact": round(per_entry["compact"], 4),
        "store_compact_speedup": round(per_entry["protojson"] / per_entry["compact"], 1),
        "journal_us_per_entry": round(per_entry["journal"], 4),
        "store_entries": n,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[2:] if argv is None and sys.argv[1:2] == ["store"] else (argv or [])
    if argv == ["--no-write"]:
        return main_render_only()
    if argv:
        print("usage: python -m bench store [--no-write]", file=sys.stderr)
        return 2
    if smoke.on():  # the render-only variant too, so neither rots
        main_render_only()
    rounds = smoke.size(ROUNDS, 1)
    figures = measure(smoke.size(ENTRIES, 560), rounds)
    print(f"{figures['store_entries']:,} in-flight entries per snapshot, median of {rounds} rounds, one run")
    print(f"{'write a finished snapshot':<44} {'us/entry':>9}")
    print(f"{'proto JSON, protobuf printer (before)':<44} {figures['store_us_per_entry_printer']:>9.3f}")
    print(f"{'proto JSON, export.py (now, same bytes)':<44} {figures['store_us_per_entry_protojson']:>9.3f}")
    print(f"{'compact protobuf file (now, in background)':<44} {figures['store_us_per_entry_compact']:>9.3f}")
    print(f"{'journal frames of the reports (reply path)':<44} {figures['journal_us_per_entry']:>9.3f}")
    print(f"export.py / printer: {figures['store_export_speedup']}x cheaper per entry; "
          f"compact / export.py: {figures['store_compact_speedup']}x cheaper")
    results.merge({k: v for k, v in figures.items() if k != "store_entries"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
