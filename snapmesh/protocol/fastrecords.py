"""Positional constructors of the log records every message and command makes (the per-message path).

Each makes the very record the dataclass's keyword __init__ makes (equal,
hashable, frozen afterwards: tests/shells/test_perf_paths.py pins them), its
slots filled through the slot descriptors instead of one
`object.__setattr__(self, name, value)` per field, at about half the cost.
The record format itself is snapmesh/protocol/wal.py's. A field a node does not
write (one only an older format's reader reads) gets its dataclass default.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from snapmesh.protocol.wal import Command, Recv, Send

_new = object.__new__


def _setters(cls: type, made: tuple[str, ...]) -> tuple[list, list[tuple]]:
    """The slot setters of `made`, in that order, and (setter, default) for every other field."""
    setters = {f.name: getattr(cls, f.name).__set__ for f in fields(cls)}
    rest = [(setters[f.name], f.default) for f in fields(cls) if f.name not in made]
    if any(default is MISSING for _, default in rest):  # a field the format requires: the maker must take it
        raise TypeError(f"{cls.__name__}: fastrecords makes no {[f.name for f in fields(cls) if f.name not in made]}")
    return [setters[name] for name in made], rest


def _send_makers():
    (lsn_, msg_id_, src_, dst_, seq_, request_id_, payload_, command_, reply_), rest = _setters(
        Send, ("lsn", "msg_id", "src", "dst", "seq", "request_id", "payload", "command", "reply"))

    def send_record(lsn: int, msg_id: str, src: str, dst: str, seq: int, request_id: str = "", payload: str = "") -> Send:
        r = _new(Send)
        lsn_(r, lsn)
        msg_id_(r, msg_id)
        src_(r, src)
        dst_(r, dst)
        seq_(r, seq)
        request_id_(r, request_id)
        payload_(r, payload)
        command_(r, None)
        reply_(r, "")
        for set_, default in rest:
            set_(r, default)
        return r

    def step_record(lsn: int, msg_id: str, src: str, dst: str, seq: int, request_id: str, payload: str,
                    command: str, reply: str = "") -> Send:
        """A command step's first send, carrying its command (wal.Send)."""
        r = _new(Send)
        lsn_(r, lsn)
        msg_id_(r, msg_id)
        src_(r, src)
        dst_(r, dst)
        seq_(r, seq)
        request_id_(r, request_id)
        payload_(r, payload)
        command_(r, command)
        reply_(r, reply)
        for set_, default in rest:
            set_(r, default)
        return r

    return send_record, step_record


def _recv_maker():
    (lsn_, msg_id_, src_, dst_, seq_, payload_), rest = _setters(Recv, ("lsn", "msg_id", "src", "dst", "seq", "payload"))

    def recv_record(lsn: int, msg_id: str, src: str, dst: str, seq: int, payload: str = "") -> Recv:
        r = _new(Recv)
        lsn_(r, lsn)
        msg_id_(r, msg_id)
        src_(r, src)
        dst_(r, dst)
        seq_(r, seq)
        payload_(r, payload)
        for set_, default in rest:
            set_(r, default)
        return r

    return recv_record


def _command_maker():
    lsn_, request_id_, command_, reply_ = (getattr(Command, f.name).__set__ for f in fields(Command))

    def command_record(lsn: int, request_id: str = "", command: str = "", reply: str = "") -> Command:
        r = _new(Command)
        lsn_(r, lsn)
        request_id_(r, request_id)
        command_(r, command)
        reply_(r, reply)
        return r

    return command_record


send_record, step_record = _send_makers()
recv_record = _recv_maker()
command_record = _command_maker()
