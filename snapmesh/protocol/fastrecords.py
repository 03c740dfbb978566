"""Positional constructors of the log records every message and command makes (the per-message path).

Each makes the very record the dataclass's keyword __init__ makes (equal,
hashable, frozen afterwards: tests/shells/test_perf_paths.py pins them), its
slots filled through the slot descriptors instead of one
`object.__setattr__(self, name, value)` per field, at about half the cost.
The record format itself is snapmesh/protocol/wal.py's.
"""

from __future__ import annotations

from dataclasses import fields

from snapmesh.protocol.wal import Command, Recv, Send

_new = object.__new__


def _send_maker():
    lsn_, msg_id_, src_, dst_, seq_, tally_, request_id_, payload_ = (getattr(Send, f.name).__set__ for f in fields(Send))

    def send_record(
        lsn: int, msg_id: str, src: str, dst: str, seq: int, tally: int, request_id: str = "", payload: str = ""
    ) -> Send:
        r = _new(Send)
        lsn_(r, lsn)
        msg_id_(r, msg_id)
        src_(r, src)
        dst_(r, dst)
        seq_(r, seq)
        tally_(r, tally)
        request_id_(r, request_id)
        payload_(r, payload)
        return r

    return send_record


def _recv_maker():
    lsn_, msg_id_, src_, dst_, seq_, tally_, payload_ = (getattr(Recv, f.name).__set__ for f in fields(Recv))

    def recv_record(lsn: int, msg_id: str, src: str, dst: str, seq: int, tally: int, payload: str = "") -> Recv:
        r = _new(Recv)
        lsn_(r, lsn)
        msg_id_(r, msg_id)
        src_(r, src)
        dst_(r, dst)
        seq_(r, seq)
        tally_(r, tally)
        payload_(r, payload)
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


send_record = _send_maker()
recv_record = _recv_maker()
command_record = _command_maker()
