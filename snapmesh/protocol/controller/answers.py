"""What a Snapshot answer carries of the app's states, decided: bounded answers.

An app's node records its state bytes at the cut (NodeBalance.state), and the
states of a snapshot can add up to far more than a gRPC client takes in one
message (4 MiB by default; grpcurl's too). The snapshot itself completed; only
its answer would not arrive. So:

BA1. An answer (TriggerSnapshot, GetSnapshot, WatchSnapshots, a ListSnapshots
    page entry) whose states add up to at most `state_bytes` (the cluster file's
    `[controller] answer_state_bytes`, DEFAULT_STATE_BYTES), and which fits
    `max_bytes`, is the snapshot as the controller holds it: the same message,
    byte for byte, as before states were ever left out.
BA2. Otherwise every node's state is left out of it: each NodeBalance keeps its
    state_digest (either form, statedigest.py), says state_bytes (their size)
    and state_omitted; the Snapshot says states_omitted. A bank snapshot has no
    states, so BA2 never changes one.
BA3. What is left out is read with GetSnapshotChunks: the pieces of the stored
    snapshot's encoding, every state in it, each piece at most CHUNK_BYTES.
BA4. An answer that must fit (TriggerSnapshot, WatchSnapshots) and is still
    larger than `max_bytes` after BA2 (its in-flight messages) is sent without its
    in-flight lists (in_flight_omitted), as a page entry already is (listing L3);
    GetSnapshot instead refuses it, as it did (listing L4).

BA5. A snapshot whose large states the controller holds as block lists (the
    tracker's listed form, blockforms.py BF1) is answered as its whole form is:
    BA2 by the lists' sizes and digests, without reading a block; else the whole
    form (`whole`, which reads them).

The held snapshot is never changed: what is left out is left out of a copy.
Pure: no I/O; the servicer hands in the snapshot and the bounds.
"""

from __future__ import annotations

from collections.abc import Callable

from snapmesh.protocol.controller import blockforms
from snapmesh.v1 import snapmesh_pb2 as pb

DEFAULT_STATE_BYTES = 4 * 1024 * 1024  # BA1: in all, the nodes' states together
# What any gRPC client takes in one message by default, less a margin for the framing.
DEFAULT_MAX_BYTES = 4 * 1024 * 1024 - 64 * 1024


def state_total(snapshot: pb.Snapshot) -> int:
    """The bytes of every node's state in `snapshot` (0 for the bank's)."""
    return blockforms.state_bytes(snapshot)


def leave_out_states(snapshot: pb.Snapshot) -> pb.Snapshot:
    """A copy of `snapshot` with every state left out, its size and digest kept (BA2)."""
    return _without_states(snapshot)[0]


def _without_states(snapshot: pb.Snapshot) -> tuple[pb.Snapshot, int]:
    """`leave_out_states`, and the states' bytes in all. Built field by field rather
    than copied and then cleared: a copy of the snapshot copies every state (64 MiB
    a node), and so does each read of one; here each state is read once, for its size."""
    answer = pb.Snapshot()
    for field, value in snapshot.ListFields():
        if field.name != "nodes":
            answer.MergeFrom(pb.Snapshot(**{field.name: value}))
    total = 0
    for node in snapshot.nodes:
        fields = {field.name: value for field, value in node.ListFields()}
        state = fields.pop("state", None)
        if "state_blocks" in fields and state is None:  # listed (BA5): its size is noted
            del fields["state_blocks"]
            entry = answer.nodes.add(**fields)
            entry.state_omitted = True
            total += entry.state_bytes
            continue
        entry = answer.nodes.add(**fields)
        if state is not None:
            entry.state_bytes = len(state)
            entry.state_omitted = True
            total += len(state)
    answer.states_omitted = True
    return answer, total


def leave_out_in_flight(snapshot: pb.Snapshot) -> None:
    """`snapshot`'s channels without their in-flight lists, in place (BA4)."""
    for channel in snapshot.channels:
        del channel.in_flight[:]
    snapshot.in_flight_omitted = True


def bounded(snapshot: pb.Snapshot, *, state_bytes: int = DEFAULT_STATE_BYTES, max_bytes: int = DEFAULT_MAX_BYTES,
            must_fit: bool = True, whole: Callable[[pb.Snapshot], pb.Snapshot] | None = None) -> pb.Snapshot:
    """What an answer of `snapshot` carries: itself (BA1), or a copy with its
    states left out (BA2) and, when it `must_fit` and still does not, its in-flight
    lists too (BA4). `whole`: the whole form of a snapshot with listed states (BA5)."""
    if blockforms.listed(snapshot):
        without, total = _without_states(snapshot)
        if total > state_bytes or whole is None:
            snapshot = without  # BA2 (and never a listed form to a client)
        else:
            snapshot = whole(snapshot)
    answer = snapshot  # BA1
    if any(node.HasField("state") for node in snapshot.nodes):  # a bank snapshot is never copied here
        without, total = _without_states(snapshot)
        if total and (total > state_bytes or snapshot.ByteSize() > max_bytes):
            answer = without  # BA2
    if must_fit and answer.ByteSize() > max_bytes:
        if answer is snapshot:
            answer = pb.Snapshot()
            answer.CopyFrom(snapshot)
        leave_out_in_flight(answer)  # BA4
    return answer
