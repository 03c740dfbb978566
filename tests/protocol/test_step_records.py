"""A command step's first send carries its command (wal.Send's `command` and `reply`): one
line where a `command` and a `send` were two. Its bytes, and recovery reading either shape."""

from __future__ import annotations

import dataclasses
import random

import pytest

from snapmesh.protocol import fastrecords, wal
from snapmesh.protocol.node import recovery
from support.machines import BANK, Machines, pay


def older_shape(records: list[wal.Record]) -> list[wal.Record]:
    """The same log as nodes wrote it before: a step's first send split into its `command`
    record and a plain `send` after it, the lsns after it one more each."""
    out: list[wal.Record] = []
    shift = 0
    for r in records:
        command = wal.step_command(r)
        if type(r) is wal.Send and command is not None:
            out.append(dataclasses.replace(command, lsn=r.lsn + shift))
            shift += 1
            r = dataclasses.replace(r, request_id="", command=None, reply="")
        out.append(dataclasses.replace(r, lsn=r.lsn + shift))
    return out


@pytest.mark.parametrize(("request_id", "command", "reply"), [
    ("", "", ""), ("r-1", "MSBi", "OTA="), ("", "MSBi", ""), ("é\u2028\"", "", "eA=="),
])
def test_a_step_send_round_trips_and_both_writers_give_its_bytes(request_id: str, command: str, reply: str) -> None:
    made = fastrecords.step_record(7, "a:b:3", "a", "b", 3, request_id, wal.pack(b"1"), command, reply)
    assert made == wal.Send(lsn=7, msg_id="a:b:3", src="a", dst="b", seq=3, request_id=request_id,
                            payload=wal.pack(b"1"), command=command, reply=reply)
    line = wal.Encoder("a").record(made)
    assert line == wal.encode(made, "a")
    assert '"command":' in line  # written even when empty: it says the send carries a command
    assert wal.parse(line, "f:1", node_id="a") == made
    assert wal.step_command(made) == wal.Command(lsn=7, request_id=request_id, command=command, reply=reply)


def test_a_plain_send_carries_no_command_and_an_older_native_sends_id_stays_its_own() -> None:
    plain = fastrecords.send_record(4, "a:b:1", "a", "b", 1, "", wal.pack(b"x"))
    assert plain.command is None and '"command"' not in wal.Encoder("a").record(plain)
    native = wal.parse('{"node":"a","lsn":2,"kind":"send","msg_id":"a:b:1","src":"a","dst":"b","seq":1,'
                       '"request_id":"r","payload":""}', "f:2")
    assert wal.step_command(native) is None and wal.step_command(plain) is None


def _run(seed: int) -> Machines:
    """Bank payments, some with request ids (one retried), a snapshot, messages received."""
    rng = random.Random(seed)
    m = Machines({"a": 500, "b": 500, "c": 500})
    for i in range(40):
        src = rng.choice(m.ids)
        dst = rng.choice(m.others(src))
        pay(m.nodes[src], dst, rng.randrange(1, 9), request_id=f"r{i}" if i % 3 else "")
        if i == 20:
            m.nodes["b"].start_snapshot("s1")
        if i % 5 == 0:
            for n in m.ids:
                m.route(n)
    m.settle()
    return m


@pytest.mark.parametrize("seed", range(6))
def test_recovery_reads_either_shape_to_the_same_state(seed: int) -> None:
    m = _run(seed)
    for n in m.ids:
        new = m.records(n)
        assert any(type(r) is wal.Send and r.command is not None for r in new)
        assert not any(type(r) is wal.Command for r in new)  # every bank command sends one message
        old = older_shape(new)
        states = []
        for records in (new, old):
            lines = [(f"{n}.log.jsonl:{i}", wal.parse(wal.encode(r, n), "x", node_id=n))
                     for i, r in enumerate(records, start=1)]
            states.append(recovery.recover(lines, node_id=n, incoming=m.others(n), outgoing=m.others(n),
                                           app=BANK, app_params={"initial_balance": 500}))
        now, before = states
        assert now.host.snapshot() == before.host.snapshot() == m.nodes[n].app_state()
        assert (now.next_seq, now.acked, now.outbox, now.last_received) == \
            (before.next_seq, before.acked, before.outbox, before.last_received)
        lsn_of = {r.lsn: o.lsn for r, o in zip([r for r in new if wal.step_command(r)],
                                                [o for o in old if type(o) is wal.Command], strict=True)}
        assert {k: p._replace(lsn=lsn_of[p.lsn]) for k, p in now.requests.items()} == dict(before.requests)
        assert now.requests and all(p.first_seq >= 1 for p in now.requests.values())
        assert lsn_of[now.last_command] == before.last_command
        assert (now.last_lsn, before.last_lsn) == (len(new), len(old))


def test_a_retry_after_a_restart_from_a_log_of_step_sends_is_answered_not_run_again() -> None:
    m = Machines({"a": 100, "b": 0})
    first = pay(m.nodes["a"], "b", 10, request_id="r1")
    pay(m.nodes["a"], "b", 5)
    m.route("a")
    m.flush("a")
    m.crash("a")
    m.start("a")
    again = pay(m.nodes["a"], "b", 10, request_id="r1")
    assert (again.reply, again.first_seq, again.repeated) == (first.reply, 1, True)
    steps = [r for r in m.records("a") if type(r) is wal.Send]
    assert [(r.request_id, r.command, r.lsn) for r in steps] == [("r1", wal.pack(b"10 b"), 2), ("", wal.pack(b"5 b"), 3)]


def test_a_log_whose_step_send_the_app_would_not_make_is_refused() -> None:
    m = Machines({"a": 100, "b": 0})
    pay(m.nodes["a"], "b", 10)
    m.route("a")
    log = m.records("a")
    forged = [dataclasses.replace(r, payload=wal.pack(b"11")) if type(r) is wal.Send else r for r in log]
    lines = [(f"a.log.jsonl:{i}", r) for i, r in enumerate(forged, start=1)]
    with pytest.raises(recovery.NonDeterministic, match="a.log.jsonl:2: lsn 2: replaying the command at lsn 2"):
        recovery.recover(lines, node_id="a", incoming=["b"], outgoing=["b"], app=BANK,
                         app_params={"initial_balance": 100})
