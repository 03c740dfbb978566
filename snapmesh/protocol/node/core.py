"""The Chandy-Lamport snapshot algorithm as a pure state machine (sans-I/O).

One `Process` object per process. It holds the recording state of every
snapshot the process takes part in; what a process holds is its app's
(snapmesh.app: bytes the node takes at the cut, node rule N10), never the core's. Callers feed it
inputs and get back a list of effects; it never touches a socket, a thread, a
clock or a random number, so the gRPC node, the deterministic simulator and the
tests all drive this same code.

Model
-----
Processes are joined by directed channels that are FIFO and lossless (the
transport below guarantees this, repairing dropped connections before the
algorithm sees anything). The topology must be strongly connected. Two kinds of
message travel on a channel: transfers (an app's bytes) and markers (snapshot id).

Rules
-----
R1. Recording. When a process initiates snapshot S, or receives its first marker
    for S, it records its local state (LocalStateRecorded: the caller takes its
    app's state in the same step) *before* handling anything
    else, and then sends one marker for S on every outgoing channel before
    sending any further message on it.
R2. Channel state. For each incoming channel c, the state of c in S is the
    sequence of transfers that arrive on c after the process recorded S and
    before S's marker arrives on c, in arrival order. The channel on which the
    first marker arrived is recorded empty.
R3. Completion. A process is done with S once a marker for S has arrived on
    every incoming channel. It then emits its FullState (the state of every
    incoming channel; the caller adds its app's state at the cut) and forgets everything it held for S.
R4. Concurrency. Several snapshots may be in progress at once; each has its own
    recording state and a transfer is recorded in every snapshot whose channel
    is still open. Starting S at a process that already recorded S is a no-op,
    so one id started by several initiators is one snapshot.
R6. Overtake mode (`mode="overtake"`, snapmesh/protocol/overtake.py has the whole
    design). A marker may reach a channel twice: once early, ahead of queued
    transfers, and once in its FIFO place. Either closes the channel; the
    other is then ignored rather than a protocol violation. Channel state is
    recorded as in R2; the controller completes it from the sender's outbox.
R5. Abort. A snapshot may be abandoned (it failed elsewhere, or this process
    lost its recording in a restart). Markers that later arrive for it are
    dropped and reported, never mistaken for a new snapshot.
    The process remembers the FINISHED_WINDOW newest finished (completed or
    abandoned) snapshots, no more: memory stays bounded. A marker
    for a snapshot older than that window (FINISHED_WINDOW snapshots finished
    here since) is taken as a new snapshot: its recording is dropped after the
    node's recording ttl (node rule N6) and the controller refuses its report
    (the snapshot finished there long ago), so nothing wrong is ever reported.

Invariants this keeps (the checks in snapmesh/checking/ test them against real logs)
-----------------------------------------------------------------------------------
- Consistent cut: a transfer received before the receiver's cut was sent before
  the sender's cut; a transfer sent after the sender's cut appears nowhere in
  the snapshot.
- Conservation is the app's (its snapmesh.app invariants over the states and
  the recorded messages).
- One marker per channel per snapshot: a second marker for S on a channel is a
  protocol violation.

Errors
------
Every check happens before any state changes, so a refused input leaves the
process exactly as it was. `LocalProtocolError` means the caller misused the
process (an empty snapshot id, an unknown mode); the caller
should report it to its own client. Its `kind` (a `Refusal`) says why, so a
shell maps refusals to its own error codes with a table, never by reading
the message. `RemoteProtocolError` means a peer broke
the protocol (a message on a channel that does not exist, a duplicate marker);
the caller should treat that channel as faulty.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from snapmesh.protocol.blockstate import BlockState


# ------------------------------------------------------------------ errors


class ProtocolError(Exception):
    """Base of every error the state machine raises."""


# How many finished snapshot ids a process remembers (R5); the node keeps as
# many abandoned ids across restarts (recovery.ABANDONED_WINDOW).
FINISHED_WINDOW = 1_000


class Refusal(enum.Enum):
    """Why the caller was refused (`LocalProtocolError.kind`)."""

    INVALID_INPUT = "invalid input"  # a malformed argument: an empty snapshot id, a request id reused
    CHANNEL_FULL = "channel full"  # the link below holds its bound of unacknowledged messages (link.ChannelFull)
    REQUESTS_FULL = "request-id window full"  # snapmesh/protocol/node/requests.py W2
    REQUEST_UNKNOWN = "request outcome unknown"  # a retry past the window or in doubt after a restore (W4)
    APP_REFUSED = "refused by the app"  # ctx.refuse(code, text): `code` is the gRPC status name
    APP_FAILED = "the app raised"  # on_command raised: the step is refused, nothing logged
    REPLY_TOO_LARGE = "reply too large"  # an app's reply over the node's max_reply_bytes (node rule N12)
    RESTORING = "finishing a restore"  # a restore cut short by a crash is redone first: ask again later


class LocalProtocolError(ProtocolError):
    """The caller asked for something the protocol forbids; `kind` says why."""

    def __init__(self, message: str, kind: Refusal = Refusal.INVALID_INPUT) -> None:
        super().__init__(message)
        self.kind = kind


class AppRefusal(LocalProtocolError):
    """The hosted app refused a client's command (`ctx.refuse`) or raised in
    `on_command`; `code` is the gRPC status name to answer with."""

    def __init__(self, message: str, kind: Refusal, code: str) -> None:
        super().__init__(message, kind)
        self.code = code


class RemoteProtocolError(ProtocolError):
    """A peer sent something the protocol forbids."""


class AppFailed(ProtocolError):
    """The hosted app raised while handling a peer's message: the node cannot
    skip the message (the channel is FIFO and lossless) and must stop."""


# ---------------------------------------------------------------- messages


@dataclass(frozen=True, kw_only=True, slots=True)
class Transfer:
    """A message on a channel: an app's opaque `payload` (snapmesh.app). `msg_id`
    and `seq` are the caller's labels, carried through untouched into recorded
    channel state."""

    msg_id: str
    seq: int = 0
    payload: bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Marker:
    snapshot_id: str
    last_seq: int = 0  # an early marker's (overtake mode, link L8); the core does not read it


Message = Transfer | Marker


# ----------------------------------------------------------------- effects


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageSent:
    """Put `message` on the channel to `dst`, after everything already on it."""

    dst: str
    message: Message


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalStateRecorded:
    """The cut (R1): the caller takes its app's state now, before anything else."""

    snapshot_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelRecorded:
    """The state of incoming channel `src` in the snapshot is now final."""

    snapshot_id: str
    src: str
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class FullState:
    node_id: str
    snapshot_id: str
    channels: Mapping[str, tuple[Transfer, ...]]  # incoming src -> in-flight transfers
    # Overtake mode only (filled by the node at the cut; empty in classic mode):
    positions: Mapping[str, int] = field(default_factory=dict)  # incoming src -> last seq applied at the cut
    # outgoing dst -> unacked transfers at the cut, as the link holds them (link.Entry)
    outbox: Mapping[str, tuple] = field(default_factory=dict)
    # the app's snapshot() at this node's cut (filled by the node; None: not yet); a BlockState when
    # its cut kept the app's parts as they are (node/apphost.py H8): bytes(state) joins it
    state: bytes | BlockState | None = None
    parts: tuple[int, ...] = ()  # the sizes of the parts snapshot_blocks() gave for it (blocks.py B6)
    named: Any = field(default=None, compare=False, repr=False)  # its blocks.Named from the cut (cutnames.py), or None
    app: str = ""  # the app's name and version that made `state`
    version: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class SnapshotCompleted:
    state: FullState


@dataclass(frozen=True, kw_only=True, slots=True)
class StaleMarkerDropped:
    """A marker arrived for a snapshot this process abandoned (rule R5)."""

    snapshot_id: str
    src: str


Effect = MessageSent | LocalStateRecorded | ChannelRecorded | SnapshotCompleted | StaleMarkerDropped


# ------------------------------------------------------------ transitions


class Phase(enum.Enum):
    """Where one process stands in one snapshot."""

    IDLE = "idle"  # not recorded yet
    RECORDING = "recording"  # recorded; some incoming channels still open
    COMPLETED = "completed"  # FullState emitted
    ABANDONED = "abandoned"  # aborted, or lost in a restart


class Input(enum.Enum):
    START = "start"
    MARKER = "marker"
    ABORT = "abort"


# The whole table: every (phase, input) pair names its handler. A transfer is
# not here because it never changes a snapshot's phase (see Process.receive).
_TRANSITIONS: dict[tuple[Phase, Input], str] = {
    (Phase.IDLE, Input.START): "_record",
    (Phase.IDLE, Input.MARKER): "_record_then_close",
    (Phase.IDLE, Input.ABORT): "_abandon",
    (Phase.RECORDING, Input.START): "_ignore",
    (Phase.RECORDING, Input.MARKER): "_close_channel",
    (Phase.RECORDING, Input.ABORT): "_abandon",
    (Phase.COMPLETED, Input.START): "_ignore",
    (Phase.COMPLETED, Input.MARKER): "_duplicate_marker",
    (Phase.COMPLETED, Input.ABORT): "_ignore",
    (Phase.ABANDONED, Input.START): "_ignore",
    (Phase.ABANDONED, Input.MARKER): "_drop_stale_marker",
    (Phase.ABANDONED, Input.ABORT): "_ignore",
}


@dataclass(slots=True)
class _Recording:
    """What a process holds for one snapshot between R1 and R3."""

    open_channels: dict[str, list[Transfer]]  # src -> transfers recorded so far
    closed_channels: dict[str, tuple[Transfer, ...]] = field(default_factory=dict)


# ----------------------------------------------------------------- process


class Process:
    """One process's side of the algorithm. Not thread-safe: drive it from one task."""

    def __init__(
        self,
        *,
        node_id: str,
        incoming: Iterable[str],
        outgoing: Iterable[str],
        abandoned: Iterable[str] = (),
        mode: str = "classic",
    ) -> None:
        if mode not in ("classic", "overtake"):
            raise LocalProtocolError(f"unknown snapshot mode {mode!r}")
        self.node_id = node_id
        self.mode = mode
        self._incoming = tuple(incoming)
        self._outgoing = tuple(outgoing)
        self._recordings: dict[str, _Recording] = {}
        self._finished: dict[str, Phase] = {}  # oldest first, at most FINISHED_WINDOW (R5)
        for sid in abandoned:
            self._finish(sid, Phase.ABANDONED)

    # -- queries

    @property
    def incoming(self) -> tuple[str, ...]:
        return self._incoming

    @property
    def outgoing(self) -> tuple[str, ...]:
        return self._outgoing

    def phase(self, snapshot_id: str) -> Phase:
        if snapshot_id in self._recordings:
            return Phase.RECORDING
        return self._finished.get(snapshot_id, Phase.IDLE)

    def in_progress(self) -> tuple[str, ...]:
        return tuple(self._recordings)

    # -- inputs

    def receive(self, *, src: str, message: Message) -> list[Effect]:
        """`message` arrived on the channel from `src` (the next one in FIFO order)."""
        if src not in self._incoming:
            raise RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        if isinstance(message, Transfer):
            return self._receive_transfer(src, message)
        if isinstance(message, Marker):
            if not isinstance(message.snapshot_id, str) or not message.snapshot_id:
                raise RemoteProtocolError(f"marker from {src!r} has snapshot id {message.snapshot_id!r}")
            return self._step(message.snapshot_id, Input.MARKER, src)
        raise RemoteProtocolError(f"unknown message type {type(message).__name__} from {src!r}")

    def passed(self, *, src: str, payload: bytes) -> bool:
        """An app message arrived from `src`: the fast path of `receive`, for
        when no snapshot is recording here (nothing to record, no effect). Returns
        False, changing nothing, while one is: the caller then uses `receive`."""
        if self._recordings:
            return False
        if src not in self._incoming:
            raise RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        if not isinstance(payload, bytes):
            raise RemoteProtocolError(f"app message from {src!r}: a non-bytes payload")
        return True

    def quiet(self, src: str) -> bool:
        """`passed`'s checks of a whole run of app messages from `src`, made once: True while
        no snapshot records here (each bytes payload then passes, changing nothing)."""
        if self._recordings:
            return False
        if src not in self._incoming:
            raise RemoteProtocolError(f"{self.node_id} has no channel from {src!r}")
        return True

    def start_snapshot(self, snapshot_id: str) -> list[Effect]:
        """Initiate `snapshot_id` here; a no-op if this process already recorded it."""
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise LocalProtocolError(f"snapshot id must be a non-empty string, got {snapshot_id!r}")
        return self._step(snapshot_id, Input.START, None)

    def abort_snapshot(self, snapshot_id: str) -> list[Effect]:
        """Drop whatever is held for `snapshot_id`; later markers for it are dropped."""
        return self._step(snapshot_id, Input.ABORT, None)

    # -- transitions

    def _step(self, snapshot_id: str, event: Input, src: str | None) -> list[Effect]:
        handler = _TRANSITIONS[(self.phase(snapshot_id), event)]
        return getattr(self, handler)(snapshot_id, src)

    def _receive_transfer(self, src: str, transfer: Transfer) -> list[Effect]:
        if not isinstance(transfer.payload, bytes):
            raise RemoteProtocolError(f"app message {transfer.msg_id!r} from {src!r}: a non-bytes payload")
        for recording in self._recordings.values():
            recorded = recording.open_channels.get(src)
            if recorded is not None:
                recorded.append(transfer)
        return []

    def _record(self, snapshot_id: str, src: str | None) -> list[Effect]:
        self._recordings[snapshot_id] = _Recording(open_channels={c: [] for c in self._incoming})
        effects: list[Effect] = [LocalStateRecorded(snapshot_id=snapshot_id)]
        marker = Marker(snapshot_id=snapshot_id)
        effects += [MessageSent(dst=dst, message=marker) for dst in self._outgoing]
        # A process with no incoming channel (a one-node topology) is done at once.
        return effects + self._complete_if_done(snapshot_id)

    def _record_then_close(self, snapshot_id: str, src: str | None) -> list[Effect]:
        effects = self._record(snapshot_id, src)
        return effects + self._close_channel(snapshot_id, src)

    def _close_channel(self, snapshot_id: str, src: str | None) -> list[Effect]:
        assert src is not None
        recording = self._recordings[snapshot_id]
        if src in recording.closed_channels and self.mode == "overtake":
            return []  # R6: the other of the channel's two markers
        if src in recording.closed_channels:
            raise RemoteProtocolError(
                f"second marker for snapshot {snapshot_id!r} on channel {src}->{self.node_id}"
            )
        transfers = tuple(recording.open_channels.pop(src))
        recording.closed_channels[src] = transfers
        effects: list[Effect] = [ChannelRecorded(snapshot_id=snapshot_id, src=src, transfers=transfers)]
        return effects + self._complete_if_done(snapshot_id)

    def _complete_if_done(self, snapshot_id: str) -> list[Effect]:
        recording = self._recordings[snapshot_id]
        if recording.open_channels:
            return []
        del self._recordings[snapshot_id]
        self._finish(snapshot_id, Phase.COMPLETED)
        channels = {c: recording.closed_channels[c] for c in self._incoming}
        state = FullState(
            node_id=self.node_id,
            snapshot_id=snapshot_id,
            channels=MappingProxyType(channels),
        )
        return [SnapshotCompleted(state=state)]

    def _abandon(self, snapshot_id: str, src: str | None) -> list[Effect]:
        self._recordings.pop(snapshot_id, None)
        self._finish(snapshot_id, Phase.ABANDONED)
        return []

    def _finish(self, snapshot_id: str, phase: Phase) -> None:
        finished = self._finished
        finished.pop(snapshot_id, None)
        finished[snapshot_id] = phase
        if len(finished) > FINISHED_WINDOW:
            del finished[next(iter(finished))]

    def _ignore(self, snapshot_id: str, src: str | None) -> list[Effect]:
        return []

    def _duplicate_marker(self, snapshot_id: str, src: str | None) -> list[Effect]:
        if self.mode == "overtake":
            return []  # R6: the in-band marker after the early one finished the snapshot
        raise RemoteProtocolError(
            f"second marker for snapshot {snapshot_id!r} on channel {src}->{self.node_id}"
        )

    def _drop_stale_marker(self, snapshot_id: str, src: str | None) -> list[Effect]:
        assert src is not None
        return [StaleMarkerDropped(snapshot_id=snapshot_id, src=src)]

