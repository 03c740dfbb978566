"""How the tracker builds a snapshot from the reports it took, pure: the per-node
statistics of one report, and the channels of a COMPLETE snapshot that hold messages
(O3 in overtake mode, snapmesh/protocol/overtake.py; tracker rule T8).

Both run once per report or per channel of every snapshot, on reports of up to
thousands of transfers, so they work on whole protobuf blocks and columns and
touch an item from Python only where they must: `merge`'s runs copy what the
receiver recorded in one C-level copy, and a message is made only for an outbox
entry the receiver did not record (by the app's side, which knows its fields).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from google.protobuf.timestamp_pb2 import Timestamp
from google.protobuf.unknown_fields import UnknownFieldSet

from snapmesh.protocol import overtake
from snapmesh.protocol.controller import channel_list
from snapmesh.protocol.controller.appside import AppSide
from snapmesh.protocol.topology import Topology
from snapmesh.v1 import snapmesh_pb2 as pb

_BYTE_SIZE = pb.InFlightTransfer.ByteSize
_NOTHING: tuple[int, ...] = ()  # what an empty channel recorded: no seqs


def add_node_stats(snapshot: pb.Snapshot, state: pb.FullState, received_wall: float,
                   items: Iterable[list[pb.InFlightTransfer]]) -> None:
    """Flink's per-subtask figures for one accepted report (0 for a time the node left
    out); `items`: the items of each of its channels."""
    trigger_ns = snapshot.started_at.ToNanoseconds()
    received_ns = int(round(received_wall * 1e9))
    cut, done = state.cut_at_unix_ns, state.done_at_unix_ns
    stats = snapshot.stats.nodes.add(
        node_id=state.node_id,
        start_delay_ms=(cut - trigger_ns) / 1e6 if cut else 0.0,
        recording_duration_ms=(done - cut) / 1e6 if cut and done else 0.0,
        report_time_ms=(received_ns - done) / 1e6 if done else 0.0,
        in_flight_messages=sum(map(len, items)),
        in_flight_bytes=sum(sum(map(_BYTE_SIZE, channel)) for channel in items),
    )
    stats.ack_timestamp.FromNanoseconds(received_ns)


def assemble(channels, recorded: pb.ChannelState, held: list[int], side: AppSide,
             seqs: Sequence[int] | None = None, columns: tuple[Sequence, ...] = (), position: int = 0) -> None:
    """Add channel src->dst to `channels` as O3 assembles it from what dst recorded
    (`recorded`; `held` its seqs) and the outbox of src past dst's `position`
    (`seqs` and the app's `columns`; `seqs` None, classic mode: what dst recorded,
    as it is); `side` the app's (appside.py) makes the outbox's items. What the
    receiver recorded is copied as one block where it can be (a protobuf copy in
    C, not one per item), and an item is made only for an outbox entry it did not
    record."""
    src, dst, items = recorded.src, recorded.dst, recorded.in_flight
    runs = [(True, 0, len(held))] if seqs is None else overtake.runs(held, seqs, position)
    channel = channels.add()
    if runs and runs[0] == (True, 0, len(held)) and not len(UnknownFieldSet(recorded)):
        channel.MergeFrom(recorded)  # src, dst and every item (unknown fields in items kept, as a copy keeps them)
        runs = runs[1:]
    else:
        channel.src, channel.dst = src, dst
    for from_recorded, i, j in runs:  # a few runs a channel: one call to the side each
        if from_recorded:
            channel.in_flight.extend(items[i:j])
        else:
            side.add(channel.in_flight, src, dst, seqs, columns, i, j)


def recorded_channels(channels, reports: Sequence[pb.FullState], recorded: dict, side: AppSide,
                      order: channel_list.ChannelList, *, overtake: bool) -> None:
    """A COMPLETE snapshot's channels that hold messages, in topology order (`order`,
    channel_list.py; tracker rule T8), added to `channels`. `recorded`: per channel,
    the seqs dst recorded. Its cost is the reports' listed channels and outboxes,
    not the topology's channels."""
    by_channel = {(c.src, c.dst): c for r in reports for c in r.channels if len(c.in_flight)}
    if not overtake:
        for channel in order.in_order(by_channel):
            assemble(channels, by_channel[channel], recorded[channel], side)
        return
    outbox, positions = overtake_parts(reports, side)
    sent = (channel for channel, (seqs, *_) in outbox.items() if len(seqs))
    for src, dst in order.in_order([*by_channel, *sent]):
        seqs, *columns = outbox.get((src, dst), ((),))
        received = by_channel.get((src, dst)) or pb.ChannelState(src=src, dst=dst)
        assemble(channels, received, recorded.get((src, dst), _NOTHING), side,
                 seqs, tuple(columns), positions.get((src, dst), 0))
        if not len(channels[-1].in_flight):  # the outbox held nothing past dst's cut: an empty channel
            del channels[-1]


def overtake_parts(reports: Sequence[pb.FullState], side: AppSide) -> tuple[dict, dict]:
    """Overtake mode (snapmesh/protocol/overtake.py O3): each sender's outbox at its cut
    (its seqs, then the app's columns) and each receiver's position at its cut, by channel."""
    outbox: dict[tuple[str, str], tuple] = {
        (c.src, c.dst): ([t.seq for t in items], *side.item_columns(items))  # a node before outbox_runs
        for r in reports
        for c in r.outbox
        for items in [list(c.in_flight)]
    }
    outbox.update({(run.src, run.dst): (run.seqs, *side.run_columns(run)) for r in reports for run in r.outbox_runs})
    positions = {(p.src, p.dst): p.seq for r in reports for p in r.positions}
    return outbox, positions


def incoming(topology: Topology) -> dict[str, set[str]]:
    """Each node's incoming channels' sources, in one pass over the channels (a node at a
    time would be O(nodes x channels): a billion steps for a 1,000-node mesh)."""
    incoming: dict[str, set[str]] = {n: set() for n in topology.nodes}
    for src, dst in topology.channels:
        incoming[dst].add(src)
    return incoming


def duration_s(snapshot: pb.Snapshot) -> float:
    """Seconds from start to finish (0 while in progress)."""
    if not snapshot.HasField("finished_at"):
        return 0.0
    # In whole nanoseconds first, as stats.end_to_end_duration_ms is: seconds since the
    # epoch as a float keep only about 0.2 us, off by more than a short snapshot's rounding.
    return max(0, snapshot.finished_at.ToNanoseconds() - snapshot.started_at.ToNanoseconds()) / 1e9


def timestamp(now: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(round(now * 1e9)))
    return ts
