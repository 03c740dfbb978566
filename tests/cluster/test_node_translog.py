"""The transfer log and recovery from it: unit tests, plus the node's start-up
refusals (corrupt log, bad config) as real processes."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

import grpc

from support.node_harness import append, append_send, cluster_file, run_node_once
from snapmesh.services.node.recovery import CorruptLogError, recover
from snapmesh.services.node import translog
from snapmesh.services.node.commitgather import CommitGather
from snapmesh.services.node.translog import TransferLog
from snapmesh.protocol import wal
from snapmesh.protocol.node.link import Entry
from snapmesh.processes.supervisor import Cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


def write_records(path: Path, node: str, records: list[dict]) -> None:
    lines = [json.dumps({"node": node, "lsn": i, **r}) for i, r in enumerate(records, start=1)]
    path.write_text("\n".join(lines) + "\n")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------ writing


def test_every_record_kind_is_one_json_line_with_node_and_lsn(tmp_path: Path) -> None:
    async def go() -> None:
        log = TransferLog(tmp_path / "p1.log.jsonl", 'p"1', last_lsn=0)
        log.start()
        append(log, wal.Init)
        append_send(log, 'p"1', "p2", 1, 7)
        append(log, wal.Recv, src="p2", dst='p"1', seq=1, msg_id="p2:p\"1:1", payload=wal.pack(str(3).encode()))
        append(log, wal.Recv, src="p2", dst='p"1', seq=2, msg_id="custom id", payload=wal.pack(str(4).encode()))
        append(log, wal.Cut, snapshot_id='s"1')
        append(log, wal.MarkerSent, snapshot_id='s"1', src='p"1', dst="p2", seq=2)
        append(log, wal.MarkerRecv, snapshot_id='s"1', src="p2", dst='p"1', seq=3)
        append(log, wal.Abort, snapshot_id='s"1', reason="deadline: p3 did not report")
        append(log, wal.Restart)
        await log.wait_durable(log.last_lsn)
        assert log.durable_lsn == 9
        await log.close()

    asyncio.run(go())
    records = lines(tmp_path / "p1.log.jsonl")
    assert [r["lsn"] for r in records] == list(range(1, 10))
    assert all(r["node"] == 'p"1' for r in records)
    assert records[0] == {"node": 'p"1', "lsn": 1, "kind": "init", "app": ""}
    assert records[1] == {"node": 'p"1', "lsn": 2, "kind": "send", "src": 'p"1', "dst": "p2",
                          "msg_id": 'p"1:p2:1', "seq": 1, "payload": wal.pack(b"7")}
    assert records[2]["msg_id"] == 'p2:p"1:1' and records[2]["kind"] == "recv"
    assert records[3]["msg_id"] == "custom id"
    assert records[4] == {"node": 'p"1', "lsn": 5, "kind": "cut", "snapshot_id": 's"1', "digest": ""}
    assert records[5] == {"node": 'p"1', "lsn": 6, "kind": "marker_sent", "snapshot_id": 's"1',
                          "src": 'p"1', "dst": "p2", "seq": 2}
    assert records[6]["kind"] == "marker_recv" and records[6]["src"] == "p2"
    assert records[7] == {"node": 'p"1', "lsn": 8, "kind": "abort", "snapshot_id": 's"1',
                          "reason": "deadline: p3 did not report"}
    assert records[8] == {"node": 'p"1', "lsn": 9, "kind": "restart"}


def test_group_commit_durable_lsn_never_runs_ahead_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"
    seen: list[tuple[int, int]] = []

    def on_durable(lsn: int) -> None:
        seen.append((lsn, len(path.read_text().splitlines())))

    async def go() -> None:
        log = TransferLog(path, "p1", last_lsn=0, on_durable=on_durable)
        log.start()
        append(log, wal.Init)
        waiters = []
        for i in range(1, 2001):
            if i <= 10:
                append_send(log, "p1", "p2", i, 1)
            else:
                append(log, wal.Recv, src="p2", dst="p1", seq=i, msg_id=f"p2:p1:{i}", payload=wal.pack(str(1).encode()))
            if i % 100 == 0:
                waiters.append(asyncio.ensure_future(log.wait_durable(log.last_lsn)))
                await asyncio.sleep(0)
        await asyncio.gather(*waiters)
        assert log.durable_lsn == 2001
        await log.close()

    asyncio.run(go())
    assert seen, "no flush round happened"
    assert len(seen) < 2001 / 10, f"{len(seen)} fsyncs for 2001 records: not group-committed"
    for lsn, on_disk in seen:
        assert on_disk >= lsn


def test_small_rounds_sync_on_the_loop_large_ones_and_a_slow_disk_on_a_thread(tmp_path: Path, monkeypatch) -> None:
    """Where each round's write + fdatasync runs (translog.sync_inline): a
    small round on the event loop's thread, a large one on a worker, and after
    a slow sync every round on a worker until a sync is fast again."""
    path = tmp_path / "p1.log.jsonl"
    rounds: list[tuple[int, bool]] = []  # (bytes, on the loop's thread)
    slow = {"next": False}
    real = translog._write_all_and_sync

    def spy(fd: int, data: tuple[str, ...]) -> float:
        rounds.append((translog._size(data), threading.current_thread() is threading.main_thread()))
        real(fd, data)
        if slow["next"]:
            slow["next"] = False
            return translog.INLINE_SYNC_MAX_S * 10  # as if the disk had stalled
        return 0.0  # as if fast: the rule is under test, not this machine's disk (a loaded one is slow)

    monkeypatch.setattr(translog, "_write_all_and_sync", spy)

    async def go() -> None:
        log = TransferLog(path, "p1", last_lsn=0)
        log.start()
        append(log, wal.Init)
        await log.wait_durable(log.last_lsn)  # small
        for seq in range(1, 201):
            append_send(log, "p1", "p2", seq, 1)
        await log.wait_durable(log.last_lsn)  # 200 records: large
        slow["next"] = True
        append_send(log, "p1", "p2", 201, 1)
        await log.wait_durable(log.last_lsn)  # small, on the loop, but slow
        append_send(log, "p1", "p2", 202, 1)
        await log.wait_durable(log.last_lsn)  # small after a slow one: a thread (it is fast again)
        append_send(log, "p1", "p2", 203, 1)
        await log.wait_durable(log.last_lsn)  # small: back on the loop
        await log.close()

    asyncio.run(go())
    sizes = [n for n, _ in rounds]
    assert sizes[1] > translog.INLINE_SYNC_MAX_BYTES >= max(sizes[:1] + sizes[2:]), sizes
    assert [on_loop for _, on_loop in rounds] == [True, False, True, False, True], rounds
    assert [json.loads(line)["lsn"] for line in path.read_text().splitlines()] == list(range(1, 205))


def test_a_round_waits_one_turn_only_for_a_pending_writer_and_nothing_is_durable_before_its_sync(
    tmp_path: Path, monkeypatch
) -> None:
    """Group commit's commit_siblings rule: with no writer known to be pending a
    round flushes at once (a lone record waits for nobody); with one pending
    (`writer_pending`) the round yields the loop once and that writer's records
    join it. Either way no waiter, `on_durable` or durable_lsn sees a record
    before the fdatasync that holds it returned."""
    path = tmp_path / "p1.log.jsonl"
    rounds: list[int] = []  # records per write + fdatasync
    committed: list[int] = []  # observe_round
    seen: list[tuple[int, int]] = []  # (on_durable lsn, records on disk then)
    early: list[str] = []
    waiters: list[tuple[int, asyncio.Future]] = []
    held: list[TransferLog] = []
    real = translog._write_all_and_sync

    def spy(fd: int, data: tuple[str, ...]) -> float:
        rounds.append(sum(piece.count("\n") for piece in data))
        for lsn, waiter in waiters:  # nothing of this round is out yet
            if lsn > held[0].durable_lsn and waiter.done():
                early.append(f"lsn {lsn} answered before its round's sync")
        return real(fd, data)

    def on_durable(lsn: int) -> None:
        seen.append((lsn, len(path.read_text().splitlines())))

    monkeypatch.setattr(translog, "_write_all_and_sync", spy)

    async def go() -> None:
        log = TransferLog(path, "p1", last_lsn=0, on_durable=on_durable, observe_round=committed.append)
        held.append(log)
        log.start()

        def wait(lsn: int) -> None:
            waiters.append((lsn, asyncio.ensure_future(log.wait_durable(lsn))))

        # No writer pending: the first record's round does not wait for the second.
        wait(append(log, wal.Init))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        wait(append_send(log, "p1", "p2", 1, 1))
        await log.wait_durable(log.last_lsn)
        assert rounds == [1, 1]
        # A writer pending across its turn: its record joins the round already due.
        wait(append_send(log, "p1", "p2", 2, 1))
        with log.writer_pending():
            await asyncio.sleep(0)
        assert log.durable_lsn == 2, "the round flushed without waiting for the pending writer"
        wait(append_send(log, "p1", "p2", 3, 1))
        await log.wait_durable(log.last_lsn)
        assert rounds == [1, 1, 2]
        await asyncio.gather(*(w for _, w in waiters))
        await log.close()

    asyncio.run(go())
    assert early == []
    assert committed == [1, 1, 2]
    assert [lsn for lsn, _ in seen] == [1, 2, 4]
    assert all(on_disk >= lsn for lsn, on_disk in seen)


def test_concurrent_callers_share_a_round_synced_on_a_thread_and_a_lone_one_waits_for_nobody(
    tmp_path: Path, monkeypatch
) -> None:
    """The group commit of concurrent calls: a round two callers wait for makes
    the log concurrent; the next round then waits until as many callers wait
    (here a second one, however late: the gather's timers are set out of
    reach) and both concurrent rounds sync on a worker thread, leaving the
    loop free to take the calls. Once the log is no longer concurrent (after
    one round here) a lone caller's round waits for nobody and syncs on the loop."""
    path = tmp_path / "p1.log.jsonl"
    rounds: list[tuple[int, bool]] = []  # (records, on the loop's thread)
    real = translog._write_all_and_sync

    def spy(fd: int, data: tuple[str, ...]) -> float:
        rounds.append((sum(piece.count("\n") for piece in data), threading.current_thread() is threading.main_thread()))
        real(fd, data)
        return 0.0  # as if fast: the rule is under test, not this machine's disk

    monkeypatch.setattr(translog, "_write_all_and_sync", spy)

    async def go() -> None:
        log = TransferLog(path, "p1", last_lsn=0)
        log._callers = gather = CommitGather(rounds=1, gap_s=3600.0, max_s=3600.0)
        log.start()
        first = [asyncio.ensure_future(log.wait_durable(lsn)) for lsn in (1, 2)]
        await asyncio.sleep(0)  # both wait before the records come
        append(log, wal.Init)
        append_send(log, "p1", "p2", 1, 1)
        await asyncio.gather(*first)  # one round, two callers: the log is concurrent
        late = asyncio.ensure_future(log.wait_durable(append_send(log, "p1", "p2", 2, 1)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert log.durable_lsn == 2, "a concurrent round flushed before the callers it waits for came"
        await log.wait_durable(append_send(log, "p1", "p2", 3, 1))  # the second caller: the round goes
        assert late.done()
        gather.gap_s = 0.001  # no third caller comes: the wait ends by itself
        await log.wait_durable(append_send(log, "p1", "p2", 4, 1))
        await log.wait_durable(append_send(log, "p1", "p2", 5, 1))  # a lone caller
        await log.close()

    asyncio.run(go())
    assert rounds == [(2, False), (2, False), (1, True), (1, True)], rounds


async def _concurrent_log(log: TransferLog) -> TransferLog:
    """`log` started with two callers' records durable: concurrent, so its rounds wait for
    callers, on timers (CommitGather's) that are out of a test's reach."""
    log._callers = CommitGather(gap_s=3600.0, max_s=3600.0)
    log.start()
    first = [asyncio.ensure_future(log.wait_durable(lsn)) for lsn in (1, 2)]
    await asyncio.sleep(0)
    append(log, wal.Init)
    append_send(log, "p1", "p2", 1, 1)
    await asyncio.gather(*first)  # two callers: the log is concurrent and expects two
    return log


@pytest.mark.parametrize("hop", ["marker", "report"])
def test_a_snapshot_hop_never_waits_for_callers_on_a_concurrent_log(tmp_path: Path, hop: str) -> None:
    """A concurrent round waits for its callers (commitgather.py), but one that
    holds a snapshot's record or a report's save goes at once: the gather's
    timers are out of reach here, so a round that waited would hang the test."""
    path = tmp_path / "p1.log.jsonl"

    async def go() -> None:
        log = await _concurrent_log(TransferLog(path, "p1", last_lsn=0))
        if hop == "marker":
            lsn = append(log, wal.MarkerSent, snapshot_id="s1", src="p1", dst="p2", seq=2)
        else:
            log.before_records(lambda: None)
            lsn = append_send(log, "p1", "p2", 2, 1)
        await asyncio.wait_for(log.wait_durable(lsn), 10.0)
        late = asyncio.ensure_future(log.wait_durable(append_send(log, "p1", "p2", 3, 1)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not late.done(), "a round of a client's record alone did not wait for its callers"
        late.cancel()
        await log.close()

    asyncio.run(go())


@pytest.mark.parametrize("hop", ["marker", "report"])
def test_a_snapshot_hop_ends_a_round_already_waiting_for_callers(tmp_path: Path, hop: str) -> None:
    """A round that began waiting for its callers on a client's record (the log concurrent)
    goes once a snapshot's record or a report's save joins it: one round holds both, and
    none of the gather's timers (out of reach here) has to run out, so a round that went
    on waiting would hang the test. (It waited for them: up to 20 ms a hop, a cut's
    markers held back on the hosts bench.)"""
    path = tmp_path / "p1.log.jsonl"
    rounds: list[int] = []  # records per round
    saved: list[str] = []

    async def go() -> None:
        log = await _concurrent_log(TransferLog(path, "p1", last_lsn=0, observe_round=rounds.append))
        client = append_send(log, "p1", "p2", 2, 1)
        for _ in range(5):
            await asyncio.sleep(0)
        assert log._gathered is not None and log.durable_lsn < client, "the round is not waiting for callers"
        if hop == "marker":
            lsn = append(log, wal.MarkerSent, snapshot_id="s1", src="p1", dst="p2", seq=3)
        else:
            log.before_records(lambda: saved.append("report"))
            lsn = client
        await asyncio.wait_for(log.wait_durable(lsn), 10.0)
        await log.close()

    asyncio.run(go())
    assert rounds == ([2, 2] if hop == "marker" else [2, 1]), rounds
    assert saved == ([] if hop == "marker" else ["report"])


# ----------------------------------------------------------------- recovery


def recover_p1(path: Path, **kw):
    return recover(path, "p1", incoming=("p2", "p3"), outgoing=("p2", "p3"), **kw)


def test_recovery_rebuilds_positions_outbox_and_abandoned(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"
    write_records(path, "p1", [
        {"kind": "init", "app": ""},
        {"kind": "send", "msg_id": "p1:p2:1", "src": "p1", "dst": "p2", "seq": 1, "payload": ""},
        {"kind": "recv", "msg_id": "p2:p1:1", "src": "p2", "dst": "p1", "seq": 1, "payload": ""},
        {"kind": "cut", "snapshot_id": "s1", "digest": ""},
        {"kind": "marker_sent", "snapshot_id": "s1", "src": "p1", "dst": "p2", "seq": 2},
        {"kind": "marker_sent", "snapshot_id": "s1", "src": "p1", "dst": "p3", "seq": 1},
        {"kind": "future_kind", "whatever": True},
        {"kind": "send", "msg_id": "p1:p2:3", "src": "p1", "dst": "p2", "seq": 3, "payload": ""},
        {"kind": "marker_recv", "snapshot_id": "s1", "src": "p3", "dst": "p1", "seq": 1},
        {"kind": "recv", "msg_id": "p3:p1:2", "src": "p3", "dst": "p1", "seq": 2, "payload": ""},
        {"kind": "abort", "snapshot_id": "s2", "reason": "x"},
        {"kind": "restart"},
    ])
    state = recover_p1(path)
    assert not state.fresh
    # the balance is the bank's reader's to fold (snapmesh/bank/oldlogs.py, tests/shells/test_bank_generic.py)
    assert state.last_lsn == 12
    assert state.next_seq == {"p2": 4, "p3": 2}
    assert state.last_received == {"p2": 1, "p3": 2}
    assert set(state.abandoned) == {"s1", "s2"}  # s2 was aborted here without a recording
    assert state.outbox["p2"] == [
        # a native transfer: no bytes here; its amount is the bank reader's to map (snapmesh/bank/oldlogs.py)
        Entry(seq=1, last_seq=0, snapshot_id="", payload=b""),
        Entry(seq=2, last_seq=0, snapshot_id="s1"),
        Entry(seq=3, last_seq=0, snapshot_id="", payload=b""),
    ]
    assert state.outbox["p3"] == [Entry(seq=1, last_seq=0, snapshot_id="s1")]


def test_missing_or_empty_log_is_a_fresh_node(tmp_path: Path) -> None:
    assert recover_p1(tmp_path / "none.jsonl").fresh
    (tmp_path / "empty.jsonl").write_text("")
    state = recover_p1(tmp_path / "empty.jsonl")
    assert state.fresh and state.next_seq == {"p2": 1, "p3": 1}


def test_torn_last_line_is_truncated_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "p1.log.jsonl"
    write_records(path, "p1", [
        {"kind": "init", "app": ""},
        {"kind": "send", "msg_id": "p1:p2:1", "src": "p1", "dst": "p2", "seq": 1, "payload": ""},
    ])
    good = path.read_bytes()
    path.write_bytes(good + b'{"node":"p1","lsn":3,"kind":"send","src":"p1","dst":"p2","msg_id":"p1:p2:2","se')
    state = recover_p1(path)
    assert state.last_lsn == 2 and state.next_seq["p2"] == 2
    assert path.read_bytes() == good
    assert "torn last line" in caplog.text and f"{path}:3" in caplog.text


@pytest.mark.parametrize(
    ("records", "raw_tail", "line", "problem"),
    [
        ([{"kind": "init", "app": ""}], b"this is not json\n" + b'{"node":"p1","lsn":3,"kind":"restart"}\n',
         2, "not a JSON record"),
        ([{"kind": "init", "app": ""}], b'{"node":"p1","lsn":3,"kind":"restart"}\n', 2, "lsn 3 where 2"),
        ([{"kind": "init", "app": ""}], b'{"node":"p9","lsn":2,"kind":"restart"}\n', 2, "node 'p9'"),
        ([], b'{"node":"p1","lsn":1,"kind":"restart"}\n', 1, "first record must be init"),
        ([{"kind": "init", "app": ""}],
         b'{"node":"p1","lsn":2,"kind":"send","msg_id":"p1:p2:2","src":"p1","dst":"p2","seq":2,"payload":""}\n',
         2, "seq 2 on p1->p2, expected 1"),
        ([{"kind": "init", "app": ""}],
         b'{"node":"p1","lsn":2,"kind":"recv","msg_id":"p9:p1:1","src":"p9","dst":"p1","seq":1,"payload":""}\n',
         2, "not a channel into p1"),
        ([{"kind": "init", "app": ""}],
         b'{"node":"p1","lsn":2,"kind":"send","msg_id":"p1:p2:1","src":"p1","dst":"p2","seq":1,"payload":7}\n',
         2, "string 'payload'"),
    ],
    ids=["not-json", "lsn-gap", "foreign-node", "no-init", "seq-gap", "unknown-channel", "bad-field"],
)
def test_corrupt_log_names_file_and_line(tmp_path: Path, records, raw_tail: bytes, line: int, problem: str) -> None:
    path = tmp_path / "p1.log.jsonl"
    write_records(path, "p1", records) if records else path.write_text("")
    path.write_bytes(path.read_bytes() + raw_tail)
    before = path.read_bytes()
    with pytest.raises(CorruptLogError) as info:
        recover_p1(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert problem in str(info.value)
    assert path.read_bytes() == before  # a corrupt log is left alone for a human


# ------------------------------------------------- the node refuses to start


def test_node_with_corrupt_log_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    config, _ = cluster_file(tmp_path, ["p1", "p2"])
    data = tmp_path / "data"
    data.mkdir()
    path = data / "p1.log.jsonl"
    write_records(path, "p1", [{"kind": "init", "app": ""}, {"kind": "restart"}])
    path.write_text(path.read_text().replace('"lsn": 2', '"lsn": 5'))
    result = run_node_once(config, "p1")
    assert result.returncode == 2, result.stderr
    assert f"{path}:2: lsn 5 where 2 was expected" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_node_truncates_torn_line_and_starts(tmp_path: Path) -> None:
    config, _ = cluster_file(tmp_path, ["p1", "p2"])
    data = tmp_path / "data"
    data.mkdir()
    path = data / "p1.log.jsonl"
    write_records(path, "p1", [  # a native bank node's log: the bank's old logs reader maps it
        {"kind": "init", "balance": 1000},
        {"kind": "send", "msg_id": "p1:p2:1", "src": "p1", "dst": "p2", "seq": 1, "amount": 10},
    ])
    path.write_bytes(path.read_bytes() + b'{"node":"p1","ls')
    cluster = Cluster(config, controller=False)
    try:
        cluster.start("p1")
        with grpc.insecure_channel(cluster.node_address("p1")) as channel:
            state = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=5)
        assert state.balance == 990
        assert cluster.stop_node("p1") == 0
    finally:
        cluster.stop()
    assert f"{path}:3: torn last line" in cluster.node("p1").output()
    # The native log, its torn line cut off, recovered as the bank app's and sealed (mapped once,
    # snapmesh/bank/edge.py B5): the active segment opens with the bank app's checkpoint.
    assert [r["kind"] for r in lines(data / wal.sealed_name("p1", 1))] == ["init", "send", "restart"]
    assert [r["kind"] for r in lines(path)][:1] == ["checkpoint"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "p9"], "no node 'p9'"),
        (["--config", "/nonexistent/cluster.toml", "--id", "p1"], "no such file"),
        ([], "--id"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    import subprocess
    import sys

    from support.node_harness import REPO

    config, _ = cluster_file(tmp_path, ["p1", "p2"])
    if "--config" not in args:
        args = ["--config", str(config), *args]
    result = subprocess.run([sys.executable, "-m", "snapmesh.cli", "node", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# ------------------------------------------------------------------ segments


def test_seal_renames_the_active_segment_and_opens_the_next_with_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"

    async def go() -> None:
        log = TransferLog(path, "p1", last_lsn=0)
        log.start()
        append(log, wal.Init)
        append_send(log, "p1", "p2", 1, 7)
        log.seal(1, wal.Checkpoint(lsn=3, next_seq={"p2": 2, "p3": 1}, acked={"p2": 0, "p3": 0},
                                   received={"p2": 0, "p3": 0}, outbox={"p2": [[1, 7, ""]], "p3": []},
                                   abandoned=[], requests={}))
        append_send(log, "p1", "p2", 2, 3)
        await log.wait_durable(log.last_lsn)
        await log.close()

    asyncio.run(go())
    assert [r["kind"] for r in lines(tmp_path / "p1.log.000000000001.jsonl")] == ["init", "send"]
    assert [r["lsn"] for r in lines(path)] == [3, 4]
    state = recover_p1(path)
    assert state.next_seq == {"p2": 3, "p3": 1} and state.records == 2
    assert [e.seq for e in state.outbox["p2"]] == [1, 2]


def test_an_interrupted_seal_is_undone_or_finished(tmp_path: Path) -> None:
    path = tmp_path / "p1.log.jsonl"
    pending = tmp_path / "p1.log.jsonl.next"
    write_records(path, "p1", [{"kind": "init", "app": ""}])
    pending.write_text("half a checkpoint")
    assert recover_p1(path).last_lsn == 1 and not pending.exists()  # crashed before the rename: undone
    path.rename(tmp_path / "p1.log.000000000001.jsonl")
    write_records(pending, "p1", [{"kind": "init", "app": ""}, {"kind": "restart"}])
    assert recover_p1(path).last_lsn == 2 and path.exists() and not pending.exists()  # after it: finished
