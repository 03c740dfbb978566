"""The bank's native records: the log format its nodes wrote before every node hosted an app.

A native bank node logged its tally (the balance, and each message's amount) in the
records of the kinds with a mark (wal.APP_MARKS), under the v1 keys of
snapmesh/bank/formats.py, and no mark. The framework's `wal` reads such a line as a
generic `wal.Older`; this module decodes it, strictly, into the record of its kind
with the tally kept (`decode`), and writes one (`encode`: the synthetic logs, the
tests). Each record here is its `wal` kind's with `tally` added (a checkpoint's also
`restored_tally`), so a reader that asks a record its fields reads either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from snapmesh.bank.formats import MESSAGE_TALLY_KEY, NODE_TALLY_KEY, RESTORED_TALLY_KEY
from snapmesh.protocol import wal


@dataclass(frozen=True, kw_only=True, slots=True)
class Init(wal.Init):
    tally: int = 0

    def as_older(self) -> wal.Older:
        return older(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Send(wal.Send):
    tally: int

    def as_older(self) -> wal.Older:
        return older(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Recv(wal.Recv):
    tally: int

    def as_older(self) -> wal.Older:
        return older(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Cut(wal.Cut):
    tally: int = 0

    def as_older(self) -> wal.Older:
        return older(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint(wal.Checkpoint):
    tally: int = 0
    restored_tally: int = 0

    def as_older(self) -> wal.Older:
        return older(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Restore(wal.Restore):
    tally: int = 0

    def as_older(self) -> wal.Older:
        return older(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Replay(wal.Replay):
    tally: int

    def as_older(self) -> wal.Older:
        return older(self)


BY_KIND: dict[str, type[wal.Record]] = {cls.KIND: cls for cls in (Init, Send, Recv, Cut, Checkpoint, Restore, Replay)}
_MESSAGES = ("send", "recv", "replay")
# Where each kind's tally went in a v1 line: after this field (None: first).
_AFTER = {"init": None, "checkpoint": None, "send": "seq", "recv": "seq", "replay": "seq", "cut": "snapshot_id",
          "restore": "epoch"}


def _spec(kind: str) -> tuple[tuple[str, str, type, bool], ...]:
    """A v1 line's fields in order: (key, the record's attribute, type, required); no mark."""
    tally = (MESSAGE_TALLY_KEY if kind in _MESSAGES else NODE_TALLY_KEY, "tally", int, True)
    out = [tally] if _AFTER[kind] is None else []
    for (name, typ, required), attr in zip(wal.SPEC[kind], wal.ATTRS[kind], strict=True):
        if name == wal.APP_MARKS[kind]:
            continue
        out.append((name, attr, typ, required))
        if name == _AFTER[kind]:
            out.append(tally)
        if kind == "checkpoint" and name == "restored":
            out.append((RESTORED_TALLY_KEY, "restored_tally", int, False))
    return tuple(out)


# kind -> ((key, attribute, type, required), ...), after node, lsn and kind.
SPEC: dict[str, tuple[tuple[str, str, type, bool], ...]] = {kind: _spec(kind) for kind in BY_KIND}
# kind -> the key of its tally in a v1 line (the readers of log lines as dicts).
TALLY_KEYS: dict[str, str] = {kind: next(key for key, attr, _, _ in spec if attr == "tally") for kind, spec in SPEC.items()}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode(record: wal.Record, where: str, *, values_checked: bool = True) -> wal.Record:
    """A `wal.Older` as the native record of its kind (the others as they are);
    `wal.CorruptRecord` naming `where` for a line that is not a v1 record. Without
    `values_checked`, a seq or an amount out of range is kept: the log checkers report
    those by their own rules."""
    if type(record) is wal.BY_KIND.get(record.KIND) and record.KIND in BY_KIND and record.KIND not in _MESSAGES:
        # A 0 figure and no mark reads as the current record (wal: an app's before versions); in a
        # native log it is the native node's, its tally 0.
        return BY_KIND[record.KIND](lsn=record.lsn, **{a: getattr(record, a) for a in wal.ATTRS[record.KIND]})
    if type(record) is not wal.Older:
        return record
    old: Any = record
    kind, raw = old.kind, old.fields
    spec = SPEC.get(kind)
    if spec is None:
        raise wal.CorruptRecord(f"{where}: a {kind} record of an older format, not one the bank's nodes wrote")
    extra = sorted(set(raw) - {key for key, _, _, _ in spec})
    if extra:
        raise wal.CorruptRecord(f"{where}: {kind} record of the bank's v1 format with unknown fields {extra}")
    values: dict[str, Any] = {}
    for key, attr, typ, required in spec:
        if key not in raw:
            if required:
                raise wal.CorruptRecord(f"{where}: {kind} record needs {key!r} (the bank's v1 format)")
            continue
        value = raw[key]
        if not (_is_int(value) if typ is int else isinstance(value, typ)):
            raise wal.CorruptRecord(f"{where}: {kind} record needs {key!r} of type {typ.__name__}, got {value!r}")
        values[attr] = value
    if values_checked and kind in ("send", "recv") and values["seq"] < 1:
        raise wal.CorruptRecord(f"{where}: {kind} seq must be >= 1, got {values['seq']}")
    if values_checked and kind in _MESSAGES and values["tally"] < 1:
        raise wal.CorruptRecord(f"{where}: {kind} {MESSAGE_TALLY_KEY} must be >= 1, got {values['tally']}")
    return BY_KIND[kind](lsn=record.lsn, **values)


def parse(line: str | bytes, where: str, *, node_id: str | None = None) -> wal.Record:
    """`wal.parse`, a native record decoded."""
    return decode(wal.parse(line, where, node_id=node_id), where)


def fields(record: wal.Record) -> dict[str, Any]:
    """A native record's v1 line after node, lsn and kind: the required fields, the others when set."""
    return {key: getattr(record, attr) for key, attr, _, required in SPEC[record.KIND]
            if required or getattr(record, attr)}


def older(record: wal.Record) -> wal.Older:
    """A native record as `wal` writes it (`as_older`: the encoders ask): its v1 fields."""
    return wal.Older(lsn=record.lsn, kind=record.KIND, fields=fields(record))


def encode(record: wal.Record, node_id: str) -> str:
    """A record's line (with its newline): a native one's in the v1 format (`as_older`)."""
    return wal.encode(record, node_id)


def current(record: wal.Record, **changes: Any) -> wal.Record:
    """A native record as its `wal` kind's (the tally left out), with `changes`."""
    base = wal.BY_KIND[record.KIND]
    if type(record) is base:
        return record
    values = {attr: getattr(record, attr) for attr in wal.ATTRS[record.KIND]}
    return base(lsn=record.lsn, **{**values, **changes})


class Encoder:
    """One native node's v1 lines on a hot path (the synthetic logs): a message's line
    formatted directly, any other record's as `encode` writes it (the same bytes)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._prefix = '{"node":' + json.dumps(node_id) + ',"lsn":'

    def send(self, lsn: int, src: str, dst: str, seq: int, tally: int, msg_id: str, request_id: str = "") -> str:
        rid = f',"request_id":{json.dumps(request_id)}' if request_id else ""
        return (f'{self._prefix}{lsn},"kind":"send","msg_id":{json.dumps(msg_id)},"src":{json.dumps(src)},'
                f'"dst":{json.dumps(dst)},"seq":{seq},"{MESSAGE_TALLY_KEY}":{tally}{rid}}}\n')

    def recv(self, lsn: int, src: str, dst: str, seq: int, tally: int, msg_id: str) -> str:
        return (f'{self._prefix}{lsn},"kind":"recv","msg_id":{json.dumps(msg_id)},"src":{json.dumps(src)},'
                f'"dst":{json.dumps(dst)},"seq":{seq},"{MESSAGE_TALLY_KEY}":{tally}}}\n')

    def record(self, record: wal.Record) -> str:
        return encode(record, self.node_id)
