"""The path of a snapshot after a node's cut, hop by hop: one definition for the
node's and the controller's `snapmesh_snapshot_hop_seconds` (docs/metrics.md) and
for the bench's breakdown (docs/bench-cluster.md).

    node        cut -> recorded -> persisted -> sent -> (answered)
    controller                                   sent -> received -> journaled -> visible

  recorded   the local cut -> the last marker in: the node's part finished
  persisted  -> the part's pending-report file and every record it rests on durable
  sent       -> the ReportState call leaves the node
  received   -> the controller takes the report (the node's stamp `sent_at_unix_ns`
                against the controller's wall clock: two processes, two clocks)
  journaled  -> the report's journal record durable (with the snapshot's outcome
                when the report completes it)
  visible    -> COMPLETE in the hands of a TriggerSnapshot{wait: true} call waiting
                for it (once per COMPLETE snapshot that a trigger waits for)
  answered   sent -> the controller's answer back at the node: a round trip that
                holds received and journaled, timed on the node's one clock; beside
                the two, it bounds the clocks' disagreement

Every hop but `received` starts and ends in one process and is timed on that
process's monotonic clock (`recorded`: the node machine's two stamps, taken from the
wall clock its shell reads with the monotonic one, in one process). `received` is the
one hop across processes: on one host the clocks are the same clock; across hosts
NTP keeps them within about a millisecond, and a negative reading counts as 0.

Nothing here reads a clock: the shells measure and pass seconds in.
"""

from __future__ import annotations

NODE_HOPS = ("recorded", "persisted", "sent", "answered")
CONTROLLER_HOPS = ("received", "journaled", "visible")
# The path in order, each hop once (answered is a round trip over received and journaled, not a step of it).
PATH = ("recorded", "persisted", "sent", "received", "journaled", "visible")
# Fine at the low end (a log round, a loop turn) and up to a deadline's seconds: the bench reads a p99 as the
# bound of the bucket holding it (bench/utilisation.py), so neighbouring bounds are at most 2.5x apart.
HOP_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
               0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def transit_s(sent_at_unix_ns: int, received_wall: float) -> float | None:
    """The hop `received`: the node's stamp to the controller's wall clock when it took
    the report (seconds, at least 0); None when the node sent no stamp (an old node)."""
    if not sent_at_unix_ns:
        return None
    return max(0.0, received_wall - sent_at_unix_ns / 1e9)
