"""Markers that overtake queued transfers (`snapshot_mode = "overtake"`), pure.

Classic Chandy-Lamport sends a marker after everything already queued on its
channel, so under load a snapshot waits for every queue to drain (up to the
flow-control mark per channel). Flink's unaligned checkpoints let the barrier
overtake buffered data and put the overtaken data into the checkpoint; this is
the same idea on top of snapmesh's reliable links.

Design
------
O1. Two copies of each marker. At its cut a sender logs and queues the marker
    in its FIFO place (seq L+1, L = the last seq it assigned before the cut),
    exactly as in classic mode, and also queues an early copy that leaves
    ahead of every queued message (link L8) and carries L. The FIFO copy keeps
    everything classic guarantees (one logged marker per channel, resend
    after a cut connection, seq without gaps); the early copy is a hint that
    may be lost with its connection. Whichever arrives first closes the
    channel at the receiver; the other is ignored (core R6). The marker
    count per channel per snapshot is still one: the early copy is not
    logged and not counted.
O2. What each side keeps (node N9). At its cut a node keeps, per incoming
    channel, the last seq it applied (`FullState.positions`), and per
    outgoing channel the transfers not yet acknowledged (`FullState.outbox`,
    all with seq <= L). The receiver still records the transfers that arrive
    after its cut until the channel closes (rule R2: `FullState.channels`).
O3. Assembly (`channel_state`). The state of channel src->dst is every
    transfer with seq in (P, L], P = dst's position for src: the union of what
    dst recorded and src's outbox at its cut past P, one per seq, in seq
    order. Why it is complete: a transfer in (P, L] acknowledged before src's
    cut was applied by dst before the early marker (which left after the cut),
    so after dst's cut and before the channel closed: dst recorded it. One not
    acknowledged then is in src's outbox. Why nothing else: dst applies no seq
    past L before the channel closes, because the FIFO copy at L+1 comes
    first; so P <= L. An early marker that arrives after a seq past its L
    (its FIFO copy came first, e.g. resent on a new stream while the early
    copy was still on the old wire) is dropped: the channel is already closed.
O4. Consistency needs nothing else: a transfer applied before dst's cut has
    seq <= P <= L, so it was sent before src's cut.
O5. Restarts and reconnects behave as in classic mode: a node that restarts
    mid-snapshot loses its recording (the snapshot fails at its deadline),
    and a lost early marker only means the FIFO copy closes the channel.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from snapmesh.protocol.node import core

T = TypeVar("T")


def channel_state(reports: Mapping[str, core.FullState], src: str, dst: str) -> tuple[core.Transfer, ...]:
    """The in-flight transfers of src->dst in a snapshot whose FullStates are `reports` (O3).
    In classic mode (no positions) it is what dst recorded."""
    recorded = reports[dst].channels.get(src, ())
    position = reports[dst].positions.get(src)
    if position is None:
        return tuple(recorded)
    outbox = reports[src].outbox.get(dst, ())
    payloads = {e.seq: e.payload for e in outbox}  # an app message's bytes ride with its seq
    return tuple(merge(
        tuple(recorded), [e.seq for e in outbox], position,
        lambda seq: core.Transfer(msg_id=f"{src}:{dst}:{seq}", seq=seq, payload=payloads[seq]),
    ))


def in_flight_towards(reports: Mapping[str, core.FullState], dst: str) -> list[tuple[str, core.Transfer]]:
    """Every transfer the snapshot holds in flight towards `dst`, as (src,
    transfer), channel by channel in seq order: what a restore delivers to it."""
    part = reports[dst]
    sources = dict.fromkeys([*part.channels, *part.positions])
    return [(src, t) for src in sources for t in channel_state(reports, src, dst)]


def merge(
    recorded: Sequence[T], seqs: Sequence[int], position: int, make: Callable[[int], T]
) -> list[T]:
    """O3 for the simulator and the controller alike: what the receiver recorded (in
    seq order; anything with a `seq`), plus the sender's outbox past the receiver's
    position, one per seq, in seq order. The outbox comes as its increasing `seqs`,
    as a report carries it; an item is made (`make(seq)`, which finds the rest of
    it by its seq) only for an outbox seq the receiver did not record, so
    the part it also holds (most of it) costs no object. Where both hold a seq
    they hold the same transfer; the receiver's copy is kept."""
    merged: list[T] = []
    for from_recorded, i, j in runs([t.seq for t in recorded], seqs, position):  # type: ignore[attr-defined]
        if from_recorded:
            merged += recorded[i:j]
        else:
            merged += [make(seq) for seq in seqs[i:j]]
    return merged


def runs(held: Sequence[int], seqs: Sequence[int], position: int) -> list[tuple[bool, int, int]]:
    """`merge` as runs, in order, without touching an item: (True, i, j) is
    recorded[i:j] (`held` = their seqs), (False, i, j) the outbox's seqs[i:j]. The
    controller copies a recorded run as one protobuf block, which a list of
    items would not let it do."""
    in_order = all(map(operator.lt, held, held[1:]))
    start = bisect.bisect_right(seqs, position)
    if in_order and held and held[-1] - held[0] + 1 == len(held):
        # The receiver holds exactly the seqs held[0]..held[-1] (the usual case):
        # the outbox's new part is what lies outside that range, no set needed.
        below = max(start, bisect.bisect_left(seqs, held[0]))
        above = max(start, bisect.bisect_right(seqs, held[-1]))
        return [r for r in ((False, start, below), (True, 0, len(held)), (False, above, len(seqs))) if r[1] < r[2]]
    have = set(held)
    extra = [i for i, seq in enumerate(seqs[start:], start) if seq not in have]
    if in_order and (not extra or not held or seqs[extra[0]] > held[-1]):
        # The usual case with a gap: the outbox's part comes after the receiver's.
        return ([(True, 0, len(held))] if held else []) + _coalesce([(False, i) for i in extra])
    by_seq: dict[int, tuple[bool, int]] = {}
    for i, seq in enumerate(held):
        by_seq.setdefault(seq, (True, i))
    for i in extra:
        by_seq.setdefault(seqs[i], (False, i))
    return _coalesce([by_seq[seq] for seq in sorted(by_seq)])


def _coalesce(picks: list[tuple[bool, int]]) -> list[tuple[bool, int, int]]:
    """Single picks (source, index) as runs of consecutive indexes from one source."""
    out: list[tuple[bool, int, int]] = []
    for source, i in picks:
        if out and out[-1][0] == source and out[-1][2] == i:
            out[-1] = (source, out[-1][1], i + 1)
        else:
            out.append((source, i, i + 1))
    return out
