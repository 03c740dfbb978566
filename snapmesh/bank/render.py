"""Text for the bank workload: progress lines and snapshot tables."""

from __future__ import annotations

from snapmesh.checking.snapshots import duration_s
from snapmesh.v1 import snapmesh_pb2 as pb

_MAX_LISTED = 20  # in-flight amounts shown per channel before "... and N more"


def progress_line(
    elapsed: float,
    delta: tuple[int, int, int],
    totals: tuple[int, int, int],
    moved: int,
    balances: dict[str, int | None],
) -> str:
    made, refused, failed = delta
    shown = "  ".join(f"{n} {'?' if b is None else b}" for n, b in balances.items())
    failed_text = f" {failed:+d} failed" if failed else ""
    return (
        f"{elapsed:6.1f}s  transfers {made:+4d} made {refused:+3d} refused{failed_text}"
        f"  (total {totals[0]}, moved {moved})  balances: {shown}"
    )


def snapshot_table(snapshot: pb.Snapshot) -> list[str]:
    status = pb.Snapshot.Status.Name(snapshot.status)
    took = f" in {duration_s(snapshot) * 1000:.0f} ms" if snapshot.HasField("finished_at") else ""
    lines = [f"  +-- snapshot {snapshot.snapshot_id}  initiator {snapshot.initiator}  {status}{took}"]
    if snapshot.status != pb.Snapshot.COMPLETE:
        lines.append(f"  |   reason: {snapshot.reason or '-'}")
        lines.append("  +--")
        return lines
    width = max([4, *(len(n.node_id) for n in snapshot.nodes)])
    stats = {n.node_id: n for n in snapshot.stats.nodes}  # Flink's per-subtask figures
    lines.append(
        f"  |   {'node':<{width}}  recorded balance  start delay ms  recording ms  report ms  in-flight msgs  bytes"
    )
    for node in snapshot.nodes:
        n = stats.get(node.node_id, pb.NodeSnapshotStats())
        lines.append(
            f"  |   {node.node_id:<{width}}  {node.balance:>16}  {n.start_delay_ms:>14.1f}  {n.recording_duration_ms:>12.1f}"
            f"  {n.report_time_ms:>9.1f}  {n.in_flight_messages:>14}  {n.in_flight_bytes:>5}"
        )
    busy = [c for c in snapshot.channels if c.in_flight]
    in_flight_sum = sum(t.amount for c in snapshot.channels for t in c.in_flight)
    if busy:
        lines.append("  |   in flight:")
        for channel in busy:  # from->to (how many, their seqs): each amount, in channel order = their sum
            moving = channel.in_flight
            shown = ", ".join(str(t.amount) for t in moving[:_MAX_LISTED])
            if len(moving) > _MAX_LISTED:
                shown += f", ... and {len(moving) - _MAX_LISTED} more"
            seqs = f"seq {moving[0].seq}" if len(moving) == 1 else f"seq {moving[0].seq}..{moving[-1].seq}"
            amount = sum(t.amount for t in moving)
            lines.append(f"  |     {channel.src}->{channel.dst} ({len(moving)}, {seqs}): {shown}  = {amount}")
    else:
        lines.append("  |   in flight: none")
    idle = len(snapshot.channels) - len(busy)
    if busy and idle:
        lines.append(f"  |     ({idle} other channel(s) empty)")
    # Added up here from what the nodes and channels recorded, not taken from the controller's total.
    balances = sum(n.balance for n in snapshot.nodes)
    total = balances + in_flight_sum
    verdict = "CONSERVED" if total == snapshot.expected_total else "VIOLATED"
    if snapshot.conserved != (verdict == "CONSERVED") or snapshot.total != total:
        verdict += f" (the controller says total {snapshot.total}, {'conserved' if snapshot.conserved else 'violated'})"
    lines.append(
        f"  |   total {total} = balances {balances} + in flight {in_flight_sum}; "
        f"expected {snapshot.expected_total}: {verdict}"
    )
    lines.append(
        f"  |   end to end {snapshot.stats.end_to_end_duration_ms:.1f} ms, state size {snapshot.stats.state_size_bytes} bytes"
    )
    lines.append("  +--")
    return lines
