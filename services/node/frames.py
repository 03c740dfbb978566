"""An app's messages in a channel frame as packed payload runs (ChannelBatch.payload_runs).

A `PayloadRun` holds consecutive seqs from `first_seq`, one message per entry of `lengths`, the payloads laid end to
end in one `data` buffer. Building one costs a join and a list of lengths per
frame instead of a ChannelMessage (and its TransferMessage) per message; reading
one, a slice per message. The sender (channels.py, `encode_frame`) uses them only
to a receiver that said `accepts_payload_runs`; the receiver (servicer.py,
`_receive`) checks every run of a batch before it applies any, then applies each
message exactly as the same message sent one ChannelMessage each.

Pure: no I/O; the shells call it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from snapmesh.protocol.node import core
from snapmesh.protocol.node.link import Entry
from snapmesh.v1 import snapmesh_pb2 as pb


def add_payload_runs(batch: pb.ChannelBatch, entries: tuple[Entry, ...]) -> bool:
    """Put `entries` (an app's messages and markers, in channel order: early
    markers, then seqs ascending) into `batch`: each stretch of messages with
    consecutive seqs between two markers as one PayloadRun, every marker in
    `messages`. False, with `batch` untouched, when they are not in that order
    or a message has no payload (the caller sends them one message each)."""
    if not entries:
        return False
    seqs, _, snapshot_ids, _, payloads = zip(*entries, strict=True)
    first = seqs[0]
    # The common frame, checked column by column at C speed: messages only, each with a payload,
    # seqs first, first + 1, ... (so _runnable holds): one run.
    if first > 0 and not any(snapshot_ids) and None not in payloads and seqs == tuple(range(first, first + len(seqs))):
        batch.payload_runs.add(first_seq=first, lengths=list(map(len, payloads)), data=b"".join(payloads))
        return True
    if not _runnable(entries):
        return False
    add_run, add_message = batch.payload_runs.add, batch.messages.add
    run_first, lengths, parts, next_seq = 0, [], [], 0
    for entry in entries:
        if entry.snapshot_id:
            if lengths:
                add_run(first_seq=run_first, lengths=lengths, data=b"".join(parts))
                lengths, parts = [], []
            # seq 0: an early marker, the entry's second field its last seq (link L8)
            last = entry[1] if entry.seq == 0 else 0
            add_message(seq=entry.seq, marker=pb.MarkerMessage(snapshot_id=entry.snapshot_id, last_seq=last))
            next_seq = 0
            continue
        if entry.seq != next_seq and lengths:
            add_run(first_seq=run_first, lengths=lengths, data=b"".join(parts))
            lengths, parts = [], []
        if not lengths:
            run_first = entry.seq
        lengths.append(len(entry.payload))  # type: ignore[arg-type]  (_runnable: every message has one)
        parts.append(entry.payload)
        next_seq = entry.seq + 1
    if lengths:
        add_run(first_seq=run_first, lengths=lengths, data=b"".join(parts))
    return True


def _runnable(entries: tuple[Entry, ...]) -> bool:
    """Early markers (seq 0) first, then seqs strictly ascending, every message
    with a payload: what the receiver's merge by seq gives back in the same order."""
    if not entries:
        return False
    previous = 0
    for entry in entries:
        seq = entry.seq
        if entry.snapshot_id:
            if seq == 0 and previous:
                return False
        elif seq == 0 or entry.payload is None:
            return False
        if seq and seq <= previous:
            return False
        previous = seq
    return True


def check_payload_runs(src: str, dst: str, runs: Sequence[Any]) -> None:
    """Raise core.RemoteProtocolError, naming the channel, when a run of the
    batch is malformed: it starts at seq 0 (only an early marker has seq 0), or
    its lengths do not add up to its buffer. Called before any of the batch applies."""
    for run in runs:
        if run.first_seq == 0:
            raise core.RemoteProtocolError(f"channel {src}->{dst}: a run of app messages starts at seq 0")
        total = sum(run.lengths)
        if total != len(run.data):
            raise core.RemoteProtocolError(
                f"channel {src}->{dst}: the run of app messages at seq {run.first_seq} has lengths adding up"
                f" to {total} bytes for a buffer of {len(run.data)}"
            )


def payloads(run: Any) -> Iterator[tuple[int, bytes]]:
    """A checked run's messages, (seq, payload), in seq order."""
    data, at = run.data, 0
    for seq, length in enumerate(run.lengths, run.first_seq):
        yield seq, data[at : at + length]
        at += length


def run_payloads(run: Any) -> list[bytes]:
    """A checked run's payloads, in seq order (its first is `run.first_seq`)."""
    data, at, out = run.data, 0, []
    for length in run.lengths:
        end = at + length
        out.append(data[at:end])
        at = end
    return out
