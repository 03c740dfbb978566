"""The transfer-log record: its kinds, fields, types, encoding and parsing (the only definition).

A node's log is JSON lines, one record per line, every record
`{"node": N, "lsn": L, "kind": K, <the kind's fields in SPEC order>}`. lsn is
1, 2, 3, ... per node in the order things happened there. `SPEC` below is the
record format as data (kind -> ordered fields with their types), so the node,
recovery, the simulator, the Spark schema, the baseline and the tests derive
what they need from one place.

Segments. The node writes `<node>.log.jsonl` (the active segment). When it
seals it, the file becomes `<node>.log.<first lsn, 12 digits>.jsonl` and the
new active segment opens with a `checkpoint` record that holds everything a
restart needs, so recovery reads the active segment only. Sealed segments are
kept for reconciliation.

Parsing is strict: a record that is not what SPEC says raises `CorruptRecord`
naming `file:line`. A kind this version does not know parses as `Unknown` and
readers skip it (old readers do the same with new kinds). A line of a known kind
without its kind's mark (APP_MARKS) is of an older format than nodes write: it
parses as `Older`, its fields kept as they are, for its app's reader of old logs
(App.old_logs) to decode; the framework reads none of them.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from json.encoder import encode_basestring
from typing import Any, ClassVar

from snapmesh.protocol.packed import Packed
from snapmesh.protocol.packedline import Line
from snapmesh.protocol.walnames import (  # noqa: F401  (the names are the format's too)
    ACTIVE_SUFFIX, active_name, log_file_node, sealed_first_lsn, sealed_name, segment_order,
)


class CorruptRecord(ValueError):
    """A record is not what SPEC says; the message starts with `file:line:`."""


# One frozen dataclass per kind. Field order is the encoding order.


@dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    KIND: ClassVar[str] = ""
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    lsn: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Init(Record):
    KIND: ClassVar[str] = "init"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"app", "version", "state"})
    app: str = ""  # the hosted app's name ("": the default one, or a log from before versions)
    version: int = 0  # its version (0, omitted: 1, as every app was before versions)
    # The hosted app's opening state (pack(snapshot()) of its new machine; "": none, or a log
    # from before it): the log replays from it, not from the params that made it.
    state: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class AppVersion(Record):
    """From here on the log holds the records of `app` at `version`: written
    when a node starts with another version than its log's last one."""

    KIND: ClassVar[str] = "version"
    app: str
    version: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Restart(Record):
    KIND: ClassVar[str] = "restart"


@dataclass(frozen=True, kw_only=True, slots=True)
class Send(Record):
    """A message sent. The first send of a command's step carries the command (`command`
    not None, written even when empty: `Command`'s fields, the step's one line where a
    `command` line and its first `send` were two): its lsn is the command's, and
    `request_id` is the command's (`step_command`). Otherwise a request_id is an older
    native log's: its client's retry key."""

    KIND: ClassVar[str] = "send"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"request_id", "payload", "command", "reply"})
    msg_id: str
    src: str
    dst: str
    seq: int
    request_id: str = ""  # the client's retry key; omitted when empty
    payload: str = ""  # an app message's bytes, base64; written even when empty (the kind's mark)
    command: str | None = None  # the step's command, base64 (None, omitted: a send of no command)
    reply: str = ""  # with a command: its reply, base64; omitted when empty


@dataclass(frozen=True, kw_only=True, slots=True)
class Recv(Record):
    KIND: ClassVar[str] = "recv"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"payload"})
    msg_id: str
    src: str
    dst: str
    seq: int
    payload: str = ""  # base64; an app's input, replayed through it by recovery


@dataclass(frozen=True, kw_only=True, slots=True)
class Cut(Record):
    KIND: ClassVar[str] = "cut"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"digest"})
    snapshot_id: str
    digest: str = ""  # an app's state at the cut: sha256 of its snapshot() bytes, hex (the report carries the bytes)


@dataclass(frozen=True, kw_only=True, slots=True)
class Command(Record):
    """A client's command to the hosted app (snapmesh.app), an input recovery
    replays: the sends it made follow as `send` records in the same step. A step
    with sends writes its command on its first `send` instead (`step_command`).
    `reply` is the answer given, so a retry of `request_id` gets it again."""

    KIND: ClassVar[str] = "command"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"request_id", "command", "reply"})
    request_id: str = ""
    command: str = ""  # base64
    reply: str = ""  # base64


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkerSent(Record):
    KIND: ClassVar[str] = "marker_sent"
    snapshot_id: str
    src: str
    dst: str
    seq: int


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkerRecv(Record):
    KIND: ClassVar[str] = "marker_recv"
    snapshot_id: str
    src: str
    dst: str
    seq: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Abort(Record):
    KIND: ClassVar[str] = "abort"
    snapshot_id: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Report(Record):
    """Its part of `snapshot_id` finished here, resting on the records up to `upto` (the
    marker_recv after it): `fullstate` the FullState's encoding, base64 ("": a large state's,
    in its pending-report file). services/node/loggedreports.py reads it."""

    KIND: ClassVar[str] = "report"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"fullstate"})
    snapshot_id: str
    upto: int
    fullstate: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Stop(Record):
    """The node stopped for the COMPLETE stop snapshot `snapshot_id` (TriggerSnapshot stop):
    what comes before is that snapshot's to carry on, so a restart under any version of
    the app starts fenced and replays nothing before it through the app, until a restore."""

    KIND: ClassVar[str] = "stop"
    snapshot_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint(Record):
    """The first record of every segment after the first: the node's state as
    of this lsn, as a restart would rebuild it from everything before.

    next_seq, acked: per outgoing channel, the next seq to use and the highest
      seq the receiver acknowledged (the ack watermark);
    received: per incoming channel, the last seq received;
    outbox: per outgoing channel, the unacknowledged messages in seq order,
      each [seq, 0, snapshot_id, payload] (a marker: its snapshot id; a message: "", its payload);
    abandoned: snapshot ids a restart must treat as abandoned (recent ones);
    requests: client request_id -> its answer, as snapmesh/protocol/node/requests.py
      keeps it (the window);
    cuts: snapshot id -> the lsn of its cut here (recent ones);
    restored: the last restore's snapshot id (its answer to a repeated RestoreState);
    last_command: the lsn of the last client command before it (1: none;
      absent, a log from before it: not known), for a stop (fence.py F7);
    reports: snapshot id -> fullstate, the `report` records not yet acknowledged.
    """

    KIND: ClassVar[str] = "checkpoint"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"epoch", "cuts", "restored", "state", "app", "version",
                                                     "last_command", "reports"})
    next_seq: dict
    acked: dict
    received: dict
    outbox: dict
    abandoned: list
    requests: dict
    epoch: int = 0  # the node's epoch (0, omitted: epoch 1, a log from before restores)
    cuts: dict = field(default_factory=dict)
    restored: str = ""
    state: str = ""  # the hosted app's snapshot() bytes, base64 (an app node's)
    app: str = ""  # as Init's: the app whose state this is, and its version (0: 1)
    version: int = 0
    last_command: int = 0  # the lsn of the last client command before it (1, the init's: none; 0: not known)
    reports: dict = field(default_factory=dict)  # snapshot id -> a `report` record's fullstate, unacknowledged


@dataclass(frozen=True, kw_only=True, slots=True)
class Restore(Record):
    """The node entered `epoch` by restoring snapshot `snapshot_id`: its app's
    state is now `state` (the recorded one), every channel starts again at seq 1,
    and the `deliveries` replay records that follow deliver the messages recorded
    in flight towards it. A restore whose replays are not all in the log is
    done again from the start (the state is set, not added to)."""

    KIND: ClassVar[str] = "restore"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"state"})
    snapshot_id: str
    epoch: int
    deliveries: int
    state: str = ""  # an app node: the restored snapshot() bytes, base64


@dataclass(frozen=True, kw_only=True, slots=True)
class Replay(Record):
    """One recorded in-flight transfer of the restored snapshot, delivered here.
    `seq` is its position on the channel in the snapshot's (older) epoch."""

    KIND: ClassVar[str] = "replay"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"payload"})
    snapshot_id: str
    msg_id: str
    src: str
    dst: str
    seq: int
    payload: str = ""  # base64


@dataclass(frozen=True, kw_only=True, slots=True)
class Older(Record):
    """A record of a known kind in an older format than nodes write (no mark, APP_MARKS):
    its fields as the line holds them (after node, lsn and kind), in their order. Its
    app's reader of old logs decodes it; the framework reads none of its fields."""

    KIND: ClassVar[str] = ""
    kind: str
    fields: dict


@dataclass(frozen=True, kw_only=True, slots=True)
class Unknown(Record):
    """A kind this version does not know: kept so lsns stay contiguous, skipped."""

    KIND: ClassVar[str] = ""
    kind: str


# The per-message path's positional constructors of these records: snapmesh/protocol/fastrecords.py.

KNOWN: tuple[type[Record], ...] = (
    Init, Restart, Send, Recv, Cut, MarkerSent, MarkerRecv, Abort, Checkpoint, Restore, Replay, Command, AppVersion,
    Stop, Report,
)
BY_KIND: dict[str, type[Record]] = {cls.KIND: cls for cls in KNOWN}
KINDS = frozenset(BY_KIND)
_OWN = frozenset((*KNOWN, Older, Unknown))  # what `encode` writes itself

# The format as data: kind -> ((key, type, required), ...) after node, lsn, kind;
# ATTRS: kind -> the record's field for each key, in the same order.
COMMON: tuple[tuple[str, type, bool], ...] = (("node", str, True), ("lsn", int, True), ("kind", str, True))
SPEC: Mapping[str, tuple[tuple[str, type, bool], ...]] = {
    cls.KIND: tuple((f.name, {"int": int, "str": str, "str | None": str, "dict": dict, "list": list}[f.type],
                     f.name not in cls.OPTIONAL) for f in fields(cls) if f.name != "lsn")
    for cls in KNOWN
}
_NAMES: Mapping[str, frozenset[str]] = {kind: frozenset(("node", "lsn", "kind", *(n for n, _, _ in spec)))
                                         for kind, spec in SPEC.items()}
ATTRS: Mapping[str, tuple[str, ...]] = {cls.KIND: tuple(f.name for f in fields(cls) if f.name != "lsn") for cls in KNOWN}

# kind -> its mark: the key every record of the kind a node writes has, even empty. A line of
# the kind without it is of an older format (`Older`), its app's to read (App.old_logs).
APP_MARKS: Mapping[str, str] = {"init": "app", "checkpoint": "app", "cut": "digest", "restore": "state",
                                "send": "payload", "recv": "payload", "replay": "payload"}


def step_command(record: Record) -> Command | None:
    """The command `record` holds: itself (a `command`), a step's first `send`'s (same
    lsn), else None: what a reader of commands reads from either shape of the log."""
    cls = type(record)
    if cls is Command:
        return record  # type: ignore[return-value]
    if cls is Send and record.command is not None:  # type: ignore[attr-defined]
        return Command(lsn=record.lsn, request_id=record.request_id, command=record.command,  # type: ignore[attr-defined]
                       reply=record.reply)  # type: ignore[attr-defined]
    return None


def older_format(record: Record) -> bool:
    """Whether `record` is of an older format than nodes write: its app's old logs reader's (App.old_logs)."""
    return type(record) is Older


# A str as JSON writes it (json.dumps(text, ensure_ascii=False) is this very function on a
# str, without the encoder object around it): one C call, the cost of a cache lookup.
_js = encode_basestring
def _plain(text: str) -> bool:  # a large str JSON writes as it is (a state's base64): scans, never a copy
    return len(text) > 65536 and text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def encode(record: Record, node_id: str, *, lazy: bool = False) -> Any:
    """One line (with its newline). Field order: node, lsn, kind, then SPEC order. `lazy`:
    a line with a `Packed` field is a `Line`, its base64 made as it is written (packed.py)."""
    cls = type(record)
    if cls not in _OWN:  # an app's record of an older format (a kind's subclass): as it says
        record, cls = record.as_older(), Older  # type: ignore[attr-defined]
    if cls is Older:  # as it was read: its fields in their order
        old: Any = record
        head = {"node": node_id, "lsn": record.lsn, "kind": old.kind}
        return json.dumps({**head, **old.fields}, separators=(",", ":"), ensure_ascii=False) + "\n"
    parts = [f'{{"node":{_js(node_id)},"lsn":{record.lsn},"kind":"{cls.KIND}"']
    mark = APP_MARKS.get(cls.KIND)
    for (name, kind, required), attr in zip(SPEC[cls.KIND], ATTRS[cls.KIND], strict=True):
        value = getattr(record, attr)
        if value is None or (not required and not value and name != mark and not (cls is Send and name == "command")):
            continue  # the kind's mark (and a step's command) is written even when empty: it says the format
        if kind is str:  # a large state as it is (base64 needs no escape): no copy of it but the line's
            plain = type(value) is Packed or _plain(value)
            parts += (f',"{name}":"', value, '"') if plain else (f',"{name}":{_js(value)}',)
        elif kind is int:
            parts.append(f',"{name}":{int(value)}')
        else:
            parts.append(f',"{name}":{json.dumps(value, separators=(",", ":"), sort_keys=True)}')
    parts.append("}\n")
    return Line.of(parts, lazy)


class Encoder:
    """`encode` for one node on the hot path: `record` writes the per-message and per-command
    kinds from their fields at once (a channel's src and dst fragment built once), any other
    through `encode`. Produces exactly the bytes `encode` does (tests/protocol/test_wal_lines.py).
    `lines` maps those kinds to their writer, for a caller that dispatches itself (the node's log)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._prefix = '{"node":' + _js(node_id) + ',"lsn":'
        self._ends: dict[tuple[str, str], str] = {}  # (src, dst) -> ',"src":..,"dst":..'
        self.lines: dict[type[Record], Any] = {Send: self._send, Recv: self._recv, Command: self._command}

    def _channel(self, src: str, dst: str) -> str:
        ends = self._ends[(src, dst)] = f',"src":{_js(src)},"dst":{_js(dst)}'
        return ends

    def _send(self, r: Any) -> str:
        """A `send` line; its payload is written even when empty (the kind's mark)."""
        src, dst, rid = r.src, r.dst, r.request_id
        ends = self._ends.get((src, dst)) or self._channel(src, dst)
        line = (f'{self._prefix}{r.lsn},"kind":"send","msg_id":{_js(r.msg_id)}{ends},"seq":{r.seq}'
                f'{_RID + _js(rid) if rid else ""},"payload":{_js(r.payload)}')
        cmd = r.command
        if cmd is None:
            return line + "}\n"
        out = r.reply
        return f'{line}{_CMD}{_js(cmd)}{_REPLY + _js(out) if out else ""}}}\n'  # a step's first send

    def _recv(self, r: Any) -> str:
        """A `recv` line; its payload as `send`'s."""
        src, dst = r.src, r.dst
        ends = self._ends.get((src, dst)) or self._channel(src, dst)
        return f'{self._prefix}{r.lsn},"kind":"recv","msg_id":{_js(r.msg_id)}{ends},"seq":{r.seq},"payload":{_js(r.payload)}}}\n'

    def _command(self, r: Any) -> str:
        """A `command` line: each field written only when not empty, as `encode` does."""
        rid, cmd, out = r.request_id, r.command, r.reply
        return (f'{self._prefix}{r.lsn},"kind":"command"{_RID + _js(rid) if rid else ""}'
                f'{_CMD + _js(cmd) if cmd else ""}{_REPLY + _js(out) if out else ""}}}\n')

    def record(self, record: Record) -> str:
        line_of = self.lines.get(type(record))
        return encode(record, self.node_id) if line_of is None else line_of(record)


_RID, _CMD, _REPLY = ',"request_id":', ',"command":', ',"reply":'
_b2a = binascii.b2a_base64


def pack(data: bytes) -> str:
    """An app's bytes (payload, command, reply, state) as a log field: base64."""
    return _b2a(data, newline=False).decode()  # base64.b64encode's (ASCII) bytes, without its wrapper; utf-8's fast path


def unpack(text: str | Packed, where: str) -> bytes:
    """The inverse of `pack`; CorruptRecord naming `where` for text that is not base64."""
    if type(text) is Packed:  # a record not yet written: its bytes (a BlockState's joined: in-memory readers only)
        return text.data if type(text.data) is bytes else bytes(text.data)
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error is one
        raise CorruptRecord(f"{where}: not base64: {text[:40]!r}") from None


def parse(line: str | bytes, where: str, *, node_id: str | None = None) -> Record:
    """One line -> its record. `where` is `file:line` for errors; with `node_id`
    the record must belong to that node."""
    try:
        raw = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptRecord(f"{where}: not a JSON record ({exc})") from None
    return from_dict(raw, where, node_id=node_id)


def from_dict(raw: Any, where: str, *, node_id: str | None = None) -> Record:
    if not isinstance(raw, dict):
        raise CorruptRecord(f"{where}: not a JSON object")
    node = raw.get("node")
    if not isinstance(node, str) or (node_id is not None and node != node_id):
        raise CorruptRecord(f"{where}: record of node {node!r}, this log belongs to {node_id!r}")
    lsn = raw.get("lsn")
    if not _is_int(lsn) or lsn < 1:
        raise CorruptRecord(f"{where}: lsn must be a positive integer, got {lsn!r}")
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        raise CorruptRecord(f"{where}: record without a kind")
    cls = BY_KIND.get(kind)
    if cls is None:
        return Unknown(lsn=lsn, kind=kind)
    mark = APP_MARKS.get(kind)
    if mark is not None and mark not in raw and (mark == "payload" or not _zero_extras(raw, kind)):
        return Older(lsn=lsn, kind=kind, fields={k: v for k, v in raw.items() if k not in ("node", "lsn", "kind")})
    values: dict[str, Any] = {}
    for (name, typ, required), attr in zip(SPEC[kind], ATTRS[kind], strict=True):
        if name not in raw:
            if required:
                raise CorruptRecord(f"{where}: {kind} record needs {_article(typ)} {name!r}")
            continue
        value = raw[name]
        ok = _is_int(value) if typ is int else isinstance(value, typ)
        if not ok:
            raise CorruptRecord(f"{where}: {kind} record needs {_article(typ)} {name!r}, got {value!r}")
        values[attr] = value
    if kind in ("send", "recv", "marker_sent", "marker_recv") and values["seq"] < 1:
        raise CorruptRecord(f"{where}: {kind} seq must be >= 1, got {values['seq']}")
    return cls(lsn=lsn, **values)


def _zero_extras(raw: dict, kind: str) -> bool:
    """Whether a line without its kind's mark has keys this format does not, each 0: an app's
    node of an older version wrote a 0 there and no mark (an init before versions); it reads
    as this format's record. Any other line without its mark is `Older`, its app's to decode
    (an app's message always had its payload)."""
    extras = [raw[key] for key in raw.keys() - _NAMES[kind]]
    return bool(extras) and all(_is_int(value) and value == 0 for value in extras)


def split_lines(data: bytes, path: str) -> tuple[list[tuple[str, bytes]], int | None]:
    """The complete lines of a segment as (`file:line`, bytes), and the byte offset
    where a torn last line starts (a crash mid-write), or None."""
    complete_end = data.rfind(b"\n") + 1
    torn = complete_end if complete_end < len(data) else None
    lines = data[:complete_end].split(b"\n")[:-1]
    return [(f"{path}:{number}", raw) for number, raw in enumerate(lines, start=1)], torn


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is no integer


def _article(typ: type) -> str:
    return {int: "an integer", str: "a string", dict: "an object", list: "a list"}[typ]
