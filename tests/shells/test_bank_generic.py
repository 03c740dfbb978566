"""The bank as an app: its compact commands (what the node's v1 adapter sends), and a log a
native bank node wrote recovering as the bank app's (snapmesh/bank/oldlogs.py).

The native log is written by the pure node machine with no app (the code that wrote
every bank log before nodes always hosted an app), one JSON line per record, as the
node's log holds them; it is then recovered by the node's shell with the bank app."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc

import pytest
from support.engine_harness import Aborted, ServicerContext, held_node, outcome

from snapmesh.app import Context, NodeInfo, Refused
from snapmesh.bank import v1records
from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery as pure_recovery
from snapmesh.protocol.node.machine import Append, Node, Seal
from snapmesh.services.app import bank, kvshard
from snapmesh.bank.edge import command
from snapmesh.services.node.recovery import recover
from snapmesh.v1 import snapmesh_pb2 as pb


def machine(balance: int = 100) -> bank.Bank:
    return bank.Bank(NodeInfo(node_id="p1", peers_out=("p2", "p3"), peers_in=("p2",),
                              params={"initial_balance": balance}))


def run(m: bank.Bank, data: bytes) -> tuple[bytes, list[tuple[str, bytes]]]:
    ctx = Context("p1", ("p2", "p3"))
    reply = m.on_command(data, ctx)
    return reply, ctx.sends


def test_a_compact_transfer_pays_and_answers_the_balance_after_it() -> None:
    m = machine()
    assert command("p2", 30) == b"30 p2"
    assert run(m, command("p2", 30)) == (b"70", [("p2", b"30")])
    assert run(m, b'{"to": "p3", "amount": 5}') == (b'{"balance": 65}', [("p3", b"5")])  # the JSON form too
    assert m.on_query(b"") == b"65" and m.snapshot() == b"65"


def _answer(m: bank.Bank, data: bytes) -> object:
    try:
        return run(m, data), m.snapshot()
    except Refused as refused:
        return refused.code, refused.text, m.snapshot()


@pytest.mark.parametrize("data", [
    b'{"to": "p2", "amount": 7}', b'{"to": "p3", "amount": 100}', b'{"to": "p2", "amount": 101}',
    b'{"to": "p1", "amount": 1}', b'{"to": "nobody", "amount": 1}', b'{"to": "p2", "amount": 0}',
    b'{"to": "p2", "amount": 007}', b'{"to": "p2", "amount": 1.0}', b'{"to": "p2", "amount": true}',
    b'{"amount": 7, "to": "p2"}', b'{"to":"p2","amount":7}', b'{"to": "p\\u0032", "amount": 7}',
    b'{"to": "p2", "amount": 7, "to": "p3"}', b'{"op": "balance"}', b'{"to": "p2", "amount": 99999999999999999999}',
])
def test_a_json_transfer_read_without_json_loads_answers_as_json_loads_does(data: bytes, monkeypatch) -> None:
    """The plain-JSON shortcut (bank._PLAIN_TRANSFER) answers, refuses and pays exactly as the json.loads path."""
    fast = _answer(machine(), data)
    monkeypatch.setattr(bank, "_PLAIN_TRANSFER", re.compile(rb"(?!)"))  # matches nothing: json.loads reads all
    assert fast == _answer(machine(), data)


@pytest.mark.parametrize("data, code, text", [
    (b"0 p2", "INVALID_ARGUMENT", "amount must be a positive integer, got 0"),
    (b"-5 p2", "INVALID_ARGUMENT", "amount must be a positive integer, got -5"),
    (b"101 p2", "FAILED_PRECONDITION", "p1 cannot send 101: balance is 100"),
    (b"5 p1", "INVALID_ARGUMENT", "p1 cannot transfer to itself"),
    (b"5 nobody", "INVALID_ARGUMENT", "p1 has no channel to 'nobody'"),
    (b"5 ", "INVALID_ARGUMENT", "`to` is required: the node to pay (p2, p3)"),
    (b"five p2", "INVALID_ARGUMENT", 'or b"N NODE" (pay N to NODE)'),
])
def test_a_compact_transfer_is_refused_as_v1_transfer_was(data: bytes, code: str, text: str) -> None:
    m = machine()
    with pytest.raises(Refused) as refused:
        run(m, data)
    assert refused.value.code == code and text in refused.value.text
    assert m.snapshot() == b"100"


@pytest.mark.parametrize("data", [
    b"5 p2", b"100 p3", b"101 p2", b"1 p2", b"007 p2", b"0 p2", b"+5 p2", b" 5 p2", b"5  p2", b"1_0 p2",
    b"5 p1", b"5 nobody", b"5 ", b"5", b"5 p\xff", b"99999999999999999999 p2", b"\xd9\xa3 p2", b"-5 p2",
])
def test_a_compact_transfer_on_the_short_path_answers_as_the_checked_path_does(data: bytes) -> None:
    """bank.Bank._pay's common path (a known peer, a canonical amount within the balance) pays, answers
    and sends the very bytes the checked path does: it fails with a shortcut that sends b"007" as it came."""
    fast = _answer(machine(), data)
    checked = machine()
    checked._peer_of = {}  # no peer is known: every command takes the checked path
    assert fast == _answer(checked, data)


def test_a_message_the_bank_cannot_read_is_refused_naming_its_sender() -> None:
    m = machine()
    m.on_message("p2", b"12", Context("p1", ("p2", "p3")))
    assert m.snapshot() == b"112"
    with pytest.raises(ValueError, match="the amount from p2 is not decimal ASCII"):
        m.on_message("p2", b"-1", Context("p1", ("p2", "p3")))


def native_log(path: Path) -> int:
    """The log a native bank node p1 (no app) wrote: two paid transfers (one with a request id), one
    received, one unacknowledged. Returns the tally it held at the end."""
    records = [
        v1records.Init(lsn=1, tally=100),
        v1records.Send(lsn=2, msg_id="p1:p2:1", src="p1", dst="p2", seq=1, tally=30, request_id="rid-1"),
        v1records.Send(lsn=3, msg_id="p1:p2:2", src="p1", dst="p2", seq=2, tally=5),
        v1records.Recv(lsn=4, msg_id="p2:p1:1", src="p2", dst="p1", seq=1, tally=7),
    ]
    lines = [wal.encode(record, "p1") for record in records]
    path.write_text("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    return 100 - 30 - 5 + 7


def test_a_native_bank_log_recovers_as_the_bank_app_mapped_once(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"
    assert native_log(path) == 72
    got = recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=bank.app,
                  app_params={"initial_balance": 100})
    assert got.reshaped and got.host.snapshot() == b"72"
    assert [(e.seq, e.last_seq, e.payload) for e in got.outbox["p2"]] == [(1, 0, b"30"), (2, 0, b"5")]
    paid = got.requests["rid-1"]
    assert (wal.unpack(paid.msg_id, "test"), paid.first_seq, paid.digest) == (b"70", 1, "")  # the reply, the seq

    # The node seals the mapped segment at start: its next segment opens with the app's checkpoint.
    node = Node(node_id="p1", incoming=("p2",), outgoing=("p2",), recovered=got, now=0.0, wall=0.0, app=bank.app,
                app_params={"initial_balance": 100})
    seals = [e for e in node.drain() if type(e) is Seal]
    assert len(seals) == 1 and wal.unpack(seals[0].checkpoint.state, "test") == b"72"
    assert seals[0].checkpoint.app == "bank" and type(seals[0].checkpoint) is wal.Checkpoint
    answer = node.submit(command("p2", 30), "rid-1", wall=1.0)  # a retry: the first answer, its message's seq
    assert (answer.reply, answer.repeated, answer.first_seq) == (b"70", True, 1)
    fresh = node.submit(command("p2", 2))
    assert (fresh.reply, fresh.first_seq) == (b"70", 3)


def test_a_native_segment_opening_with_a_checkpoint_maps_its_outbox_and_ids(tmp_path: Path) -> None:
    # A later segment: the checkpoint's outbox items hold amounts ([seq, amount, ""]; a marker's
    # [seq, 0, id]) and its ids their balance after; the bank's reader maps both, and its fold
    # starts from the checkpoint's balance.
    path = tmp_path / "p1.log.jsonl"
    records = [
        v1records.Checkpoint(lsn=10, tally=95, next_seq={"p2": 3}, acked={"p2": 0}, received={"p2": 0},
                       outbox={"p2": [[1, 5, ""], [2, 0, "s1"]]}, abandoned=["s1"],
                       requests={"rid-0": ["p1:p2:1", 95, 0.0, 9, "", 1]}),
        v1records.Send(lsn=11, msg_id="p1:p2:3", src="p1", dst="p2", seq=3, tally=5, request_id="rid-1"),
        v1records.Recv(lsn=12, msg_id="p2:p1:1", src="p2", dst="p1", seq=1, tally=7),
    ]
    path.write_text("".join(wal.encode(record, "p1") for record in records))
    got = recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=bank.app, app_params={"initial_balance": 100})
    assert got.reshaped and got.host.snapshot() == b"97"
    assert [(e.seq, e.snapshot_id, e.payload) for e in got.outbox["p2"]] == [(1, "", b"5"), (2, "s1", None), (3, "", b"5")]
    assert {rid: (wal.unpack(p.msg_id, "test"), p.first_seq, p.digest) for rid, p in got.requests.items()} == {
        "rid-0": (b"95", 1, ""), "rid-1": (b"90", 3, "")}


def test_a_native_log_whose_balance_would_go_below_zero_is_refused_naming_its_line(tmp_path: Path) -> None:
    # The native fold is the bank's reader's now (snapmesh/bank/oldlogs.py), and so is its refusal.
    from snapmesh.services.node.recovery import CorruptLogError

    path = tmp_path / "p1.log.jsonl"
    records = [v1records.Init(lsn=1, tally=3), v1records.Send(lsn=2, msg_id="p1:p2:1", src="p1", dst="p2", seq=1, tally=4)]
    path.write_text("".join(wal.encode(record, "p1") for record in records))
    with pytest.raises(CorruptLogError, match=r"p1.log.jsonl:2: the balance would be -1"):
        recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=bank.app, app_params={"initial_balance": 100})


def test_an_app_log_is_not_mapped(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"
    fresh = pure_recovery.fresh(incoming=("p2",), outgoing=("p2",))
    node = Node(node_id="p1", incoming=("p2",), outgoing=("p2",), recovered=fresh, now=0.0, wall=0.0, app=bank.app,
                app_params={"initial_balance": 100})
    node.submit(command("p2", 10), "rid-2", wall=0.0)
    path.write_text("".join(wal.encode(e.record, "p1").rstrip("\n") + "\n" for e in node.drain() if type(e) is Append))
    got = recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=bank.app,
                  app_params={"initial_balance": 100})
    assert not got.reshaped and got.host.snapshot() == b"90"
    assert got.requests["rid-2"].first_seq == 1  # the command's first message's seq, read from its send record


def test_the_v1_calls_to_a_node_of_another_app_are_refused_as_before(tmp_path: Path) -> None:
    async def run() -> tuple[object, object]:
        engine, log, servicer = await held_node(tmp_path, kvshard.app)
        one = await outcome(servicer.Transfer(pb.TransferRequest(to="p2", amount=5), ServicerContext()))
        batch = await outcome(servicer.TransferBatch(pb.TransferBatchRequest(
            transfers=[pb.TransferRequest(to="p2", amount=5)] * 2), ServicerContext()))
        await log.close()
        return one, batch

    one, batch = asyncio.run(run())
    assert isinstance(one, Aborted) and one.code is grpc.StatusCode.INVALID_ARGUMENT and "use Submit" in one.details
    assert [(r.code, r.balance) for r in batch.results] == [(grpc.StatusCode.INVALID_ARGUMENT.value[0], 0)] * 2
    assert all("runs app 'kvshard', whose edge answers no transfers: use Submit" in r.message for r in batch.results)


def test_a_transfer_a_restore_took_back_is_aborted_not_paid_on_the_bank_app(tmp_path: Path) -> None:
    # As the native bank's (tests/shells/test_restore_taken_back.py): the v1 text, "not paid".
    async def run() -> object:
        engine, log, servicer = await held_node(tmp_path, bank.app, {"initial_balance": 100})
        engine.start_snapshot("s1")
        log.flush_sync()
        call = asyncio.ensure_future(servicer.Transfer(pb.TransferRequest(to="p2", amount=7, request_id="r1"),
                                                       ServicerContext()))
        await asyncio.sleep(0.05)
        assert not call.done()  # applied and logged, waiting for its fsync
        engine.restore("s1", 2, [], b"100")  # s1's cut is before the transfer
        log.flush_sync()
        try:
            return await outcome(call)
        finally:
            assert engine.node.app_state() == b"100"
            await log.close()

    answer = asyncio.run(run())
    assert isinstance(answer, Aborted) and answer.code is grpc.StatusCode.ABORTED, answer
    assert "restore of snapshot s1" in answer.details and "not paid; retrying (same request_id) pays it anew" in answer.details


def _b64(data: bytes) -> str:
    return wal.pack(data)


def test_the_bank_apps_log_reads_with_the_banks_figures_and_a_native_one_as_it_is() -> None:
    from snapmesh.bank.logs import figures, money_check

    app_logs = {
        "p1": [{"kind": "init", "balance": 0, "state": _b64(b"100"), "lsn": 1},
               {"kind": "command", "lsn": 2, "command": _b64(b"30 p2")},
               {"kind": "send", "lsn": 3, "msg_id": "p1:p2:1", "amount": 0, "payload": _b64(b"30")},
               {"kind": "cut", "lsn": 4, "snapshot_id": "s", "balance": 0, "digest": "ab"}],
        "p2": [{"kind": "init", "balance": 0, "state": _b64(b"100"), "lsn": 1},
               {"kind": "recv", "lsn": 2, "msg_id": "p1:p2:1", "amount": 0, "payload": _b64(b"30")},
               {"kind": "restore", "lsn": 3, "snapshot_id": "s", "balance": 0, "state": _b64(b"7"), "deliveries": 1},
               {"kind": "replay", "lsn": 4, "msg_id": "p1:p2:1", "amount": 0, "payload": _b64(b"30")}]}
    read = figures(app_logs)
    assert [r.get("balance", r.get("amount")) for r in read["p1"]] == [100, None, 30, 70]
    assert [r.get("balance", r.get("amount")) for r in read["p2"]] == [100, 30, 7, 30]
    assert money_check(read)["balances"] == {"p1": 70, "p2": 130}
    assert money_check(app_logs)["balances"] == {"p1": 70, "p2": 130}  # it reads them through figures
    native = {"p1": [{"kind": "init", "balance": 100, "lsn": 1}, {"kind": "send", "lsn": 2, "amount": 5}]}
    assert figures(native) == native
    other = {"p1": [{"kind": "init", "balance": 0, "state": _b64(b"{}"), "lsn": 1}]}  # another app's bytes
    assert figures(other) == other


def test_the_old_log_reader_is_the_apps_and_named_by_it(tmp_path: Path) -> None:
    # The shell knows no bank: it maps an old log only through the reader the app names.
    import dataclasses

    from snapmesh.app import AppError
    from snapmesh.services.node.recovery import CorruptLogError

    path = tmp_path / "p1.log.jsonl"
    native_log(path)
    unnamed = dataclasses.replace(bank.app, old_logs=None)
    with pytest.raises(CorruptLogError, match="a record of an older log format"):  # no reader: read as an app's, refused
        recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=unnamed,
                app_params={"initial_balance": 100})
    broken = dataclasses.replace(bank.app, old_logs="snapmesh.bank.oldlogs:Missing")
    with pytest.raises(CorruptLogError, match="its old_logs 'snapmesh.bank.oldlogs:Missing' does not load"):
        recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=broken,
                app_params={"initial_balance": 100})
    with pytest.raises(AppError, match="old_logs must be"):
        dataclasses.replace(bank.app, old_logs="no-colon")
