"""Log records -> the state a node restarts with (pure: the node and the simulator share it).

The input is the active segment's records in lsn order, each with where it was
read (`file:line`). The segment starts with `init` (the first segment) or with
a `checkpoint` (every later one), so recovery never reads a sealed segment:
its cost is bounded by the active segment and what is unacknowledged.

What is rebuilt:
- per outgoing channel: the next seq, the ack watermark and the outbox (every
  message after the watermark, in seq order; the receiver's answer on
  reconnect says which of them it already holds);
- per incoming channel: the last seq received;
- the snapshots to treat as abandoned: every id with a `cut`, a `marker_recv`,
  a `marker_sent` or an `abort` record. Its recording (if any) was in memory and
  is gone, and a late marker for it must not start a zombie recording. A
  `marker_recv` counts even without its `cut` (a log cut short between them), an
  `abort` even without a recording here (an abort is remembered across a restart);
- the client request ids of the commands made (request_id -> reply, the seq of
  its first message, when, its lsn, the request's digest and the epoch it was
  paid in: snapmesh/protocol/node/requests.py), so a retry is answered, not paid
  again, and another request under the same id is refused (W5); and the lsn
  of each recent cut, so a restore forgets the ids paid after the restored
  snapshot's cut (requests.py W4);
- the epoch (1, or the last `restore` record's) and the restore itself: a
  `restore` record starts every channel over (seq 1, empty outbox); each
  `replay` after it delivers one recorded in-flight message. A restore
  with fewer replays in the log than it announced (a crash in the middle) is
  `restore_incomplete`: the node must do it again before taking any traffic;
- an app node (node rule N10): the app, from the checkpoint's `state` (or the
  opening state `init` holds; new at an `init` from before it), then every `command` (or a
  step's `send` carrying one, wal.step_command), `recv` and `replay` replayed through it;
  each replay's sends must be the `send` records that follow it
  (`NonDeterministic` names the lsn otherwise). Sends a crash cut off the end
  of the log are `pending_sends`: the node logs them before anything else;
- the app's name and version the log's records were written by (`init`,
  `checkpoint` and `version` records; none: version 1). Replay through other
  code is never silent: an app node whose log names another version (or app)
  than its code's refuses to start (`OtherVersion`), naming both and the ways
  on. `replay_inputs` replays a whole log from its start, skipping the later
  checkpoints, to tell a `snapshot()` that does not round-trip from code that
  changed or is not deterministic (`cause`).

Up to a log's last `stop` record, the channels are the ones the log names (a
rescale restarts a stopped node on another node set: stoplog.py).

Without an app, only the channels and ids are rebuilt: an app's reader of its own
older logs (App.old_logs, services/node/recovery.py) folds what those records held
itself, and a record of an older format in an app node's log is refused here.

Anything that cannot be trusted raises `CorruptLog` naming `file:line`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from snapmesh.protocol.node import core, requests, stoplog
from snapmesh.protocol import wal
from snapmesh.protocol.node.link import Entry

# How many recent abandoned snapshot ids (and cut lsns) a checkpoint carries;
# the request-id window is by age (snapmesh/protocol/node/requests.py).
ABANDONED_WINDOW = 1_000


class CorruptLog(ValueError):
    """The log is damaged; the message starts with `file:line:`."""


class NonDeterministic(CorruptLog):
    """Replaying the log through the hosted app did not make the sends (or the
    reply) the log holds: the app is not deterministic, or not the app that
    wrote the log. The node refuses to start; the message names the position."""


class OtherVersion(CorruptLog):
    """The log holds records of another version (or app) than the code that
    would replay them: the node refuses to start; the message names both."""


def ways_on(version: int) -> str:
    """The two ways on from a log the code cannot replay (docs/apps.md, "Versions and upgrades")."""
    return (f"either start the code of version {version} again, or restore a stop snapshot into the new code,"
            " whose upgrade() carries the state over (docs/apps.md, Versions and upgrades)")


def cause(diverged: NonDeterministic | str, *, from_checkpoint: bool, from_start: NonDeterministic | None | bool,
          version: int) -> str:
    """The one line a node refusing to start says: where replay diverged and why it may have.

    `from_start`: the replay of the whole log from its init (`replay_inputs`):
    None when it agrees, the divergence when not, False when the log no longer
    holds its start. Only a replay from a checkpoint that diverges while the
    replay from the start agrees proves `snapshot()`/`restore()` wrong."""
    diverged = str(diverged).replace(" (is the app deterministic?)", "")  # the cause is named below
    if from_checkpoint and from_start is None:
        return (f"{diverged}; replayed from the log's start instead, the app makes every logged send:"
                " its snapshot()/restore() do not round-trip the state the machine depends on"
                " (snapmesh.app.testing's Cluster.shadow finds the first input that shows it)")
    both = "; replayed from the log's start it diverges too" if from_checkpoint and from_start else ""
    return (f"{diverged}{both}: the app's code changed (then bump its version) or it is not deterministic"
            f" (snapmesh.app rule A2); {ways_on(version)}")


@dataclass(slots=True)
class Recovered:
    last_lsn: int = 0
    next_seq: dict[str, int] = field(default_factory=dict)  # dst -> next seq to use
    acked: dict[str, int] = field(default_factory=dict)  # dst -> ack watermark
    outbox: dict[str, list[Entry]] = field(default_factory=dict)  # dst -> unacknowledged, seq order
    last_received: dict[str, int] = field(default_factory=dict)  # src -> last seq
    abandoned: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # request_id -> Paid; `at` is 0.0 for an id read from a send record (the node
    # makes it the restart's time, requests.py W3)
    requests: OrderedDict[str, requests.Paid] = field(default_factory=OrderedDict)
    cuts: OrderedDict[str, int] = field(default_factory=OrderedDict)  # snapshot id -> lsn of its cut here
    records: int = 0  # records read
    fresh: bool = True  # no record at all: a new node
    epoch: int = 1  # the cluster epoch this node is in (one more per restore)
    restored: str = ""  # the snapshot id of the last restore, if any
    replays_missing: int = 0  # replays the last restore announced and the log does not hold
    host: Any = None  # an app node: its apphost.Host, replayed up to the log's end
    pending_sends: list[tuple[str, bytes]] = field(default_factory=list)  # the app's sends a crash left out of the log
    app_name: str = ""  # the app the last init, checkpoint or version record names ("": none named)
    app_version: int = 1  # ... and its version (a record from before versions: 1)
    stopped: str = ""  # the stop snapshot the log's last `stop` record names, with no restore after it: start fenced
    command_id: str = ""  # the request id of the command record just read (its first send gives its Paid the seq)
    # Read from a log of an older shape, mapped once when read (services/node/recovery.py): the node
    # seals its segment at start, so the active segment holds only records of the current shape.
    reshaped: bool = False
    # the lsn of the last client command (a `command` or a send carrying one; the native bank's: a `send`; -1: not known), F7
    last_command: int = 0

    @property
    def restore_incomplete(self) -> bool:
        return self.replays_missing > 0


def fresh(*, incoming: Iterable[str], outgoing: Iterable[str]) -> Recovered:
    outgoing = tuple(outgoing)
    return Recovered(
        next_seq=dict.fromkeys(outgoing, 1),
        acked=dict.fromkeys(outgoing, 0),
        outbox={dst: [] for dst in outgoing},
        last_received=dict.fromkeys(incoming, 0),
    )


def recover(
    records: Iterable[tuple[str, wal.Record]],
    *,
    node_id: str,
    incoming: Iterable[str],
    outgoing: Iterable[str],
    app: Any = None,
    app_params: Mapping[str, Any] | None = None,
) -> Recovered:
    """The node's state at the log's end. With `app` (a snapmesh.app.App) the
    app is rebuilt too: the checkpoint's state, then every logged input
    replayed through it, its sends compared with the log's (NonDeterministic)."""
    incoming, outgoing = tuple(incoming), tuple(outgoing)
    state = fresh(incoming=incoming, outgoing=outgoing)
    replayer = None
    if app is not None:
        from snapmesh.protocol.node.apphost import Host  # the app layer, for app nodes only

        replayer = _Replayer(Host(app, node_id=node_id, incoming=incoming, outgoing=outgoing, params=app_params))
        state.host = replayer.host
    records = list(records)
    # The app replays nothing before the last stop: the restore that must follow replaces it (any version's).
    after_stop = max((i for i, (_, r) in enumerate(records) if type(r) is wal.Stop), default=-1)
    if replayer is not None and after_stop >= 0:
        replayer.host.fresh()  # a machine until the restore: a fenced node shows it to nobody
        replayer.stopped = True
    for at, (where, record) in enumerate(records):
        if at <= after_stop:  # a log that ends in a stop may name another node set's channels (a rescale)
            _apply(state, record, where, node_id, *stoplog.known(state, incoming, outgoing, record), lenient=True)
            if at == after_stop:
                stoplog.reshape(state, incoming, outgoing)
        else:
            _apply(state, record, where, node_id, incoming, outgoing)
        if wal.step_command(record) is not None or (type(record) is wal.Send and replayer is None):  # a client's (F7)
            state.last_command = record.lsn
        if replayer is not None and at > after_stop:
            replayer.step(record, where)
    if replayer is not None:
        state.pending_sends = list(replayer.expected)
    return state


_STAMPS = (wal.Init, wal.Checkpoint, wal.AppVersion)


def replay_inputs(
    records: Iterable[tuple[str, wal.Record]], *, node_id: str, incoming: Iterable[str], outgoing: Iterable[str],
    app: Any, app_params: Mapping[str, Any] | None = None, on_cut: Callable[[wal.Cut, str, bytes], None] | None = None,
) -> NonDeterministic | None:
    """The inputs of `records` (segments in order, from an init or a checkpoint)
    through `app`, their sends and replies compared as recovery does, but only
    the first record's checkpoint is restored: the later ones are skipped, so
    the machine never goes through snapshot()/restore(). The first divergence,
    or None when the app makes the log's every send and reply. `on_cut(record,
    where, state)` is handed the replayed state at every `cut` record."""
    from snapmesh.protocol.node.apphost import Host

    replayer = _Replayer(Host(app, node_id=node_id, incoming=tuple(incoming), outgoing=tuple(outgoing), params=app_params))
    first = True
    try:
        for where, record in records:
            if type(record) is wal.Checkpoint and not first:
                replayer.check_stamp(record, where)
                continue
            first = False
            replayer.step(record, where)
            if on_cut is not None and type(record) is wal.Cut:
                on_cut(record, where, replayer.host.snapshot())  # type: ignore[arg-type]
    except NonDeterministic as exc:
        return exc
    return None


class _Replayer:
    """Recovery's half of node rule N10: the logged inputs through the app, in log order."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.expected: deque[tuple[str, bytes]] = deque()  # the sends the last input made, not yet matched
        self.cause = ""
        self.stopped = False  # after a stop, until a restore: nothing replays (any version's records)

    def step(self, record: wal.Record, where: str) -> None:
        kind = type(record)
        if kind is wal.Stop or (self.stopped and kind is not wal.Restore):  # nothing replays until a restore
            self.stopped = True
            return
        self.stopped = False
        if wal.older_format(record):
            raise CorruptLog(f"{where}: a record of an older log format in the log of a node that runs app"
                             f" {self.host.app.name!r}, and its app reads no such log (App.old_logs)")
        if kind is wal.Send and record.command is None:  # type: ignore[attr-defined]
            self._match(record, where)  # type: ignore[arg-type]
            return
        if self.expected:
            raise NonDeterministic(
                f"{where}: lsn {record.lsn}: replaying {self.cause}, app {self.host.app.name!r} sent"
                f" {len(self.expected)} more message(s) than the log holds (is the app deterministic?)"
            )
        if kind in _STAMPS:
            self.check_stamp(record, where)
        try:
            if kind is wal.Init and record.state and (record.version or 1) == self.host.app.version:  # type: ignore[attr-defined]
                self.host.restore(wal.unpack(record.state, where))  # type: ignore[attr-defined]
            elif kind is wal.Init:  # no opening state (a log from before it), or another version's: a new machine
                self.host.fresh()
            elif kind is wal.Checkpoint or kind is wal.Restore:
                self.host.restore(wal.unpack(record.state, where))  # type: ignore[attr-defined]
            elif kind is wal.Command or kind is wal.Send:  # a send here carries its step's command
                self._command(record, where)  # type: ignore[arg-type]
            elif kind is wal.Recv or kind is wal.Replay:
                self.cause = f"the message at lsn {record.lsn}"
                payload = wal.unpack(record.payload, where)  # type: ignore[attr-defined]
                self.expected.extend(self.host.message(record.src, payload))  # type: ignore[attr-defined]
        except (core.AppFailed, core.AppRefusal) as exc:
            raise NonDeterministic(f"{where}: lsn {record.lsn}: replaying it, {exc}") from None
        if kind is wal.Send:  # then the send it carries, the first its command made
            self._match(record, where)  # type: ignore[arg-type]

    def check_stamp(self, record: Any, where: str) -> None:
        """Raise OtherVersion if `record` names another app or version than the host's."""
        app = self.host.app
        version = record.version or 1
        if (record.app and record.app != app.name) or version != app.version:
            named = f"app {record.app!r} version {version}" if record.app else f"version {version}"
            raise OtherVersion(
                f"{where}: lsn {record.lsn}: the log holds records of {named}; this code is app {app.name!r}"
                f" version {app.version}, and replaying another version's records is never silent: {ways_on(version)}"
            )

    def _command(self, record: wal.Command | wal.Send, where: str) -> None:
        self.cause = f"the command at lsn {record.lsn}"
        reply, sends = self.host.command(wal.unpack(record.command, where))
        if wal.pack(reply) != record.reply:
            raise NonDeterministic(
                f"{where}: lsn {record.lsn}: replaying the command, app {self.host.app.name!r} replied"
                f" {reply[:40]!r}; the log holds {wal.unpack(record.reply, where)[:40]!r} (is the app deterministic?)"
            )
        self.expected.extend(sends)

    def _match(self, record: wal.Send, where: str) -> None:
        payload = wal.unpack(record.payload, where)
        if not self.expected:
            raise NonDeterministic(
                f"{where}: lsn {record.lsn}: the log holds a message to {record.dst} that replaying"
                f" {self.cause or 'the log'} did not make (is the app deterministic?)"
            )
        dst, made = self.expected.popleft()
        if (dst, made) != (record.dst, payload):
            raise NonDeterministic(
                f"{where}: lsn {record.lsn}: replaying {self.cause}, app {self.host.app.name!r} sent"
                f" {made[:40]!r} to {dst}; the log holds {payload[:40]!r} to {record.dst} (is the app deterministic?)"
            )


def _apply(
    state: Recovered, record: wal.Record, where: str, node_id: str, incoming: tuple[str, ...], outgoing: tuple[str, ...],
    *, lenient: bool = False,
) -> None:
    """One record onto `state`. `lenient` (up to a log's last stop): a checkpoint's channels are its own."""
    first = state.records == 0
    if wal.older_format(record):  # its fields are its app's to read, through its old logs reader
        raise CorruptLog(f"{where}: a record of an older log format ({record.kind}), and no reader of its app's"  # type: ignore[attr-defined]
                         " old logs (App.old_logs) took the log")
    if not first and record.lsn != state.last_lsn + 1:
        raise CorruptLog(f"{where}: lsn {record.lsn} where {state.last_lsn + 1} was expected (gap or reorder)")
    state.records += 1
    state.last_lsn = record.lsn
    state.fresh = False
    kind = type(record)
    if state.command_id and (kind is not wal.Send or record.command is not None):  # type: ignore[attr-defined]
        state.command_id = ""  # only the first send of the step after the command
    if first and kind not in (wal.Init, wal.Checkpoint):
        raise CorruptLog(f"{where}: the first record must be init (or a checkpoint in a later segment), not {_kind(record)}")
    if first and kind is wal.Init and record.lsn != 1:
        raise CorruptLog(f"{where}: init at lsn {record.lsn}, not 1")
    if kind is wal.Send or kind is wal.MarkerSent:
        dst = record.dst  # type: ignore[attr-defined]
        if record.src != node_id or dst not in outgoing:  # type: ignore[attr-defined]
            raise CorruptLog(f"{where}: {_kind(record)} on {record.src}->{dst}, not a channel out of {node_id}")  # type: ignore[attr-defined]
        seq = record.seq  # type: ignore[attr-defined]
        if seq != state.next_seq[dst]:
            raise CorruptLog(f"{where}: {_kind(record)} seq {seq} on {node_id}->{dst}, expected {state.next_seq[dst]}")
        state.next_seq[dst] = seq + 1
        if kind is wal.Send:
            payload = wal.unpack(record.payload, where)  # type: ignore[attr-defined]
            state.outbox[dst].append(Entry(seq, 0, "", 0, payload))
            if record.command is not None:  # type: ignore[attr-defined]  (a step's first send: its command's)
                _command_paid(state, record, where, seq)  # type: ignore[arg-type]
            elif state.command_id:  # the first message of a command with a request id: its Paid's seq
                state.requests[state.command_id] = state.requests[state.command_id]._replace(first_seq=seq)
                state.command_id = ""
            elif record.request_id:  # an older log's: the id is on its send; that log's reader fills its reply
                state.requests[record.request_id] = requests.Paid(  # type: ignore[attr-defined]
                    record.msg_id, seq, 0.0, record.lsn, "", state.epoch,  # type: ignore[attr-defined]
                )
                state.requests.move_to_end(record.request_id)  # type: ignore[attr-defined]
        else:
            state.outbox[dst].append(Entry(seq, 0, record.snapshot_id))  # type: ignore[attr-defined]
            _remember(state.abandoned, record.snapshot_id, None, ABANDONED_WINDOW)  # type: ignore[attr-defined]
    elif kind is wal.Recv or kind is wal.MarkerRecv:
        src = record.src  # type: ignore[attr-defined]
        if record.dst != node_id or src not in incoming:  # type: ignore[attr-defined]
            raise CorruptLog(f"{where}: {_kind(record)} on {src}->{record.dst}, not a channel into {node_id}")  # type: ignore[attr-defined]
        if record.seq != state.last_received[src] + 1:  # type: ignore[attr-defined]
            raise CorruptLog(
                f"{where}: {_kind(record)} seq {record.seq} on {src}->{node_id}, expected {state.last_received[src] + 1}"  # type: ignore[attr-defined]
            )
        state.last_received[src] += 1
        if kind is wal.MarkerRecv:
            _remember(state.abandoned, record.snapshot_id, None, ABANDONED_WINDOW)  # type: ignore[attr-defined]
    elif kind is wal.Cut or kind is wal.Abort:
        _remember(state.abandoned, record.snapshot_id, None, ABANDONED_WINDOW)  # type: ignore[attr-defined]
        if kind is wal.Cut:
            _remember(state.cuts, record.snapshot_id, record.lsn, ABANDONED_WINDOW)  # type: ignore[attr-defined]
    elif kind is wal.Restore:
        _apply_restore(state, record, outgoing, incoming)  # type: ignore[arg-type]
        state.stopped = ""
    elif kind is wal.Stop:
        state.stopped = record.snapshot_id  # type: ignore[attr-defined]
    elif kind is wal.Replay:
        if record.dst != node_id or record.snapshot_id != state.restored or state.replays_missing < 1:  # type: ignore[attr-defined]
            raise CorruptLog(f"{where}: replay of {record.msg_id} that no restore announced")  # type: ignore[attr-defined]
        state.replays_missing -= 1
    elif kind is wal.Command:
        if record.request_id:  # type: ignore[attr-defined]
            _command_paid(state, record, where, 0)  # type: ignore[arg-type]
            state.command_id = record.request_id  # type: ignore[attr-defined]
    elif kind is wal.Init:
        if not first:
            raise CorruptLog(f"{where}: a second init record")
        state.app_name, state.app_version = record.app, record.version or 1  # type: ignore[attr-defined]
    elif kind is wal.AppVersion:
        state.app_name, state.app_version = record.app, record.version or 1  # type: ignore[attr-defined]
    elif kind is wal.Checkpoint:
        if not first:
            raise CorruptLog(f"{where}: a checkpoint must be the first record of its segment")
        if lenient:  # the channels of the node set that wrote it
            incoming, outgoing = tuple(record.received), tuple(record.next_seq)  # type: ignore[attr-defined]
            for table in (state.next_seq, state.acked, state.outbox, state.last_received):
                table.clear()
        _load_checkpoint(state, record, where, incoming, outgoing)  # type: ignore[arg-type]


def _command_paid(state: Recovered, record: wal.Command | wal.Send, where: str, first_seq: int) -> None:
    """A command's request id paid (an app's Paid holds its reply, base64, where the bank's held the msg id)."""
    if record.request_id:
        digest = requests.command_digest(wal.unpack(record.command or "", where))  # W5
        state.requests[record.request_id] = requests.Paid(record.reply, first_seq, 0.0, record.lsn, digest, state.epoch)
        state.requests.move_to_end(record.request_id)


def _apply_restore(state: Recovered, record: wal.Restore, outgoing: tuple[str, ...], incoming: tuple[str, ...]) -> None:
    """A restore: the epoch-E channels are gone (the app's state is the restored one, the replayer's)."""
    requests.forget_restored(state.requests, state.cuts, record.snapshot_id)
    state.epoch = record.epoch
    state.restored = record.snapshot_id
    state.replays_missing = record.deliveries
    for dst in outgoing:
        state.next_seq[dst], state.acked[dst], state.outbox[dst] = 1, 0, []
    for src in incoming:
        state.last_received[src] = 0


def _load_checkpoint(
    state: Recovered, cp: wal.Checkpoint, where: str, incoming: tuple[str, ...], outgoing: tuple[str, ...]
) -> None:
    def channels(value: dict, names: tuple[str, ...], what: str) -> None:
        if set(value) != set(names):
            raise CorruptLog(f"{where}: checkpoint {what} names channels {sorted(value)}, expected {sorted(names)}")

    try:
        channels(cp.next_seq, outgoing, "next_seq")
        channels(cp.acked, outgoing, "acked")
        channels(cp.outbox, outgoing, "outbox")
        channels(cp.received, incoming, "received")
        state.epoch = int(cp.epoch) or 1
        for dst in outgoing:
            state.next_seq[dst] = int(cp.next_seq[dst])
            state.acked[dst] = int(cp.acked[dst])
            state.outbox[dst] = [_outbox_entry(entry, where) for entry in cp.outbox[dst]]
            expected = list(range(state.acked[dst] + 1, state.next_seq[dst]))
            if [e.seq for e in state.outbox[dst]] != expected:
                raise CorruptLog(f"{where}: checkpoint outbox to {dst} does not hold seqs {state.acked[dst] + 1}..")
        for src in incoming:
            state.last_received[src] = int(cp.received[src])
        for sid in cp.abandoned:
            _remember(state.abandoned, str(sid), None, ABANDONED_WINDOW)
        state.requests = OrderedDict(requests.from_checkpoint(cp.requests))
        for sid, lsn in cp.cuts.items():
            _remember(state.cuts, str(sid), int(lsn), ABANDONED_WINDOW)
        state.restored = str(cp.restored)
        state.last_command = int(cp.last_command) or -1  # a checkpoint from before it: not known (F7)
        state.app_name, state.app_version = str(cp.app), int(cp.version) or 1
    except (TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, CorruptLog):
            raise
        raise CorruptLog(f"{where}: malformed checkpoint ({exc})") from None


def checkpoint_fields(state: Recovered) -> dict:
    """The fields of a checkpoint record holding `state` (the inverse of loading one)."""
    return {
        "next_seq": dict(state.next_seq),
        "acked": dict(state.acked),
        "received": dict(state.last_received),
        "outbox": {dst: [_outbox_item(e) for e in entries] for dst, entries in state.outbox.items()},
        "abandoned": list(state.abandoned),
        "requests": requests.to_checkpoint(state.requests),
        "epoch": state.epoch,
        "cuts": dict(state.cuts),
        "restored": state.restored,
        "last_command": max(state.last_command, 1) if state.last_command >= 0 else 0,  # 1: none (the init's lsn)
    }


def _outbox_item(e: Entry) -> list:
    """A checkpoint's outbox entry: [seq, 0, snapshot_id], and an app message's payload (base64).
    (The 0's place held a figure in older logs: they are their app's to read.)"""
    if e.payload is None:
        return [e.seq, 0, e.snapshot_id]
    return [e.seq, 0, e.snapshot_id, wal.pack(e.payload)]


def _outbox_entry(item: list, where: str) -> Entry:
    seq, _, sid, *app = item  # the second place: 0, or an older log's figure (its app's to read)
    return Entry(int(seq), 0, str(sid), 0, wal.unpack(app[0], where) if app else None)


def _remember(window: OrderedDict, key: str, value: object, limit: int) -> None:
    window[key] = value
    window.move_to_end(key)
    if len(window) > limit:
        window.popitem(last=False)


def _kind(record: wal.Record) -> str:
    return record.kind if isinstance(record, wal.Unknown) else type(record).KIND
