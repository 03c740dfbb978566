"""A node's finished part of a snapshot as the ReportState message.

Shared by the node's shell (which sends it) and the controller machine and the
simulator (which take it): it lives here, not in the controller machine, so
the node's shell needs nothing of the controller to report.
"""

from __future__ import annotations

from snapmesh.protocol import appstate, statedigest
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node import core
from snapmesh.v1 import snapmesh_pb2 as pb


def report_message(
    state: core.FullState, *, epoch: int = 0, cut_at_ns: int = 0, done_at_ns: int = 0, digest: str = "",
    with_state: bool = True,
) -> pb.FullState:
    """A node machine's finished part as the ReportState message the controller takes
    (overtake mode: with its positions and outbox runs). It lists only the incoming
    channels that recorded messages (`only_recorded_channels`): the controller knows
    the empty ones from the topology, so a report grows with what was in flight, not
    with the node's channels. `cut_at_ns` and `done_at_ns` are wall-clock times for
    the statistics only (0: unknown). `digest`: the digest of an app's state
    as its cut record holds it (snapmesh/protocol/statedigest.py SD4) (the report carries it: the controller need not hash it).
    `with_state=False`: an app's state is not set in the message (the rest of what it
    says of the state is): setting it copies it, and a node's shell that sends a large
    state as blocks never reads it back (services/node/reporter.py keeps it aside)."""
    node_id = state.node_id
    message = pb.FullState(
        snapshot_id=state.snapshot_id,
        node_id=node_id,
        epoch=epoch,
        cut_at_unix_ns=cut_at_ns,
        done_at_unix_ns=done_at_ns,
        channels=[
            pb.ChannelState(
                src=src,
                dst=node_id,
                in_flight=[appstate.in_flight_item(t) for t in transfers],
            )
            for src, transfers in state.channels.items()
            if transfers
        ],
    )
    message.only_recorded_channels = True
    if state.state is not None:  # an app's node
        if with_state:  # a state held as its blocks (apphost.H8) is joined here, where bytes are needed
            message.state = bytes(state.state) if type(state.state) is BlockState else state.state
        message.state_parts.extend(state.parts or getattr(state.state, "parts", ()))  # snapshot_blocks()'s (blocks.py B6)
        message.app_name, message.app_version = state.app, state.version
        if digest and state.state:
            message.state_digest = statedigest.from_record(digest)
    if state.positions:
        message.snapshot_mode = "overtake"
        message.positions.extend(pb.ChannelPosition(src=src, dst=node_id, seq=seq) for src, seq in state.positions.items())
        message.outbox_runs.extend(
            pb.OutboxRun(src=node_id, dst=dst, seqs=[e.seq for e in entries],
                         payloads=[e.payload for e in entries] if state.state is not None else ())
            for dst, entries in state.outbox.items()
        )
    return message
