"""Channel frames with packed runs of transfers (ChannelBatch.runs).

- The same entries sent as runs and as one message each, applied through the
  servicer's decoding to a real Engine and Node, give the same log records, the
  same balance, the same position and the same errors (generated frames with
  markers, early markers, resends, gaps and bad amounts; the seed is printed).
- Any batch of messages and runs (overlaps, gaps, empty runs, out of order)
  applies exactly as its per-message form: the two lists merged by seq.
- Real nodes run the bank app (a cluster file without [app]): its transfers cross
  as payload runs (ChannelBatch.payload_runs) only to a receiver whose acks say
  `accepts_payload_runs`, one message each otherwise, and a native run of
  transfers (what the bank's former native nodes sent) ends the stream
  FAILED_PRECONDITION, a protocol violation, before anything of it applies.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

import grpc
import pytest

from snapmesh.services.node import embedded as node_embedded
from snapmesh.services.node import process as node_main
from snapmesh.services.node.channels import IncomingChannel, encode_frame
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.servicer import _receive
from snapmesh.protocol.node import core
from snapmesh.protocol.node.link import Entry
from snapmesh.protocol.node.machine import Node
from snapmesh.protocol.node.recovery import fresh
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.settings import config as cluster_config
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.node_harness import cluster_file

pytestmark = pytest.mark.timeout(120)

SEED = int(os.environ.get("SNAPMESH_RUNS_SEED", random.randrange(2**32)))


# ------------------------------------------------ a real Engine, no I/O around it


class _Log:
    def __init__(self) -> None:
        self.records: list = []
        self.durable_lsn = 0
        self.last_lsn = 0
        self.active_bytes = self.appended_bytes = 0  # what the engine tells the node after each step (segment_bytes)

    def append_record(self, record) -> int:
        self.records.append(record)
        self.last_lsn = record.lsn
        return record.lsn

    def seal(self, first_lsn: int, record) -> None:
        self.records.append(("seal", first_lsn))
        self.append_record(record)


class _Room:
    def set(self) -> None:
        pass


class _Outgoing:
    def __init__(self) -> None:
        self.room = _Room()
        self.pushed: list = []

    def push(self, conn_no: int, entries) -> None:
        self.pushed.append((conn_no, entries))


class _Reporter:
    def __init__(self) -> None:
        self.kept: list = []

    def keep(self, message, lsn: int) -> None:
        message = type(message).FromString(message.SerializeToString())
        message.cut_at_unix_ns = message.done_at_unix_ns = 0  # wall-clock times, not content
        self.kept.append((message.SerializeToString(deterministic=True), lsn))

    def send(self, snapshot_id: str) -> None:
        self.kept.append(("send", snapshot_id))

    def cancel(self, snapshot_id: str) -> None:
        self.kept.append(("cancel", snapshot_id))


def _engine(mode: str) -> Engine:
    node = Node(
        node_id="b", incoming=("a",), outgoing=("a",), snapshot_mode=mode, segment_records=50,
        recovered=fresh(initial_tally=1000, incoming=("a",), outgoing=("a",)),
    )
    engine = Engine(
        node=node, log_=_Log(), outgoing={"a": _Outgoing()}, incoming={"a": IncomingChannel(src="a", dst="b")},
        metrics=NodeMetrics("b"), reporter=_Reporter(),
    )
    engine.opened("a", 1)
    return engine


def _apply(engine: Engine, batch: pb.ChannelBatch) -> tuple[str, str] | None:
    """One frame through the servicer's decoding; the error it raised, if any."""
    try:
        _receive(engine, "a", "b", 1, pb.ChannelBatch.FromString(batch.SerializeToString()))
    except core.RemoteProtocolError as exc:  # link.GapError too
        return type(exc).__name__, str(exc)
    return None


def _outcome(engine: Engine) -> tuple:
    node = engine.node
    return (
        engine.log.records, node.tally, node.receivers["a"].last_seq, node.receivers["a"].duplicates,
        node.transfers_received, node.markers_received, engine.reporter.kept, engine.outgoing["a"].pushed,
    )


def _both(mode: str, frames: list[pb.ChannelBatch], reference: list[pb.ChannelBatch]) -> tuple[list, list]:
    """Apply `frames` to one engine and `reference` to another; (errors, outcome) of each."""

    async def go() -> tuple[list, list]:
        result = []
        for batches in (frames, reference):
            engine = _engine(mode)
            errors = [_apply(engine, batch) for batch in batches]
            result.append((errors, _outcome(engine)))
        return result

    return asyncio.run(go())


# ---------------------------------------------------- encoder + decoder round trip


def _entries(rng: random.Random, count: int) -> list[Entry]:
    """A channel's messages 1..count as its outbox holds them: transfers and markers."""
    out = []
    for seq in range(1, count + 1):
        if rng.random() < 0.04:
            out.append(Entry(seq, 0, f"s{seq}"))
        else:
            amount = -3 if rng.random() < 0.0005 else rng.randint(1, 50)  # a bad amount, rarely: it stops the channel
            out.append(Entry(seq, amount, ""))
    return out


def _frames(rng: random.Random, entries: list[Entry]) -> list[tuple[Entry, ...]]:
    """Frames as the sender cuts them, with early markers ahead, resends and now and then a lost stretch."""
    frames, at = [], 0
    while at < len(entries):
        size = rng.choice([1, 2, 5, 67, 200, 500])
        if rng.random() < 0.1:
            at = max(0, at - rng.randint(1, 30))  # a resend after a reconnect: duplicates
        elif rng.random() < 0.03:
            at += rng.randint(1, 3)  # a gap (until a resend fills it)
        early = tuple(Entry(0, rng.randint(0, at + 5), f"e{at}-{i}") for i in range(rng.choice([0] * 8 + [1, 2])))
        frames.append(early + tuple(entries[at : at + size]))
        at += size
    return frames


@pytest.mark.parametrize("mode", ["classic", "overtake"])
def test_runs_apply_exactly_as_one_message_each(mode: str) -> None:
    print(f"seed {SEED} (SNAPMESH_RUNS_SEED to repeat)")
    rng = random.Random(f"{SEED}-{mode}")
    with_runs = applied = errors = 0
    for _ in range(12):
        frames = _frames(rng, _entries(rng, rng.randint(1, 1500)))
        new = [encode_frame(entries, runs=True).batch for entries in frames]
        old = [encode_frame(entries, runs=False).batch for entries in frames]
        assert all(not batch.runs for batch in old)
        with_runs += sum(1 for batch in new if batch.runs)
        (new_errors, new_outcome), (old_errors, old_outcome) = _both(mode, new, old)
        assert new_errors == old_errors
        assert new_outcome == old_outcome
        applied += old_outcome[2]
        errors += sum(1 for error in old_errors if error)
    assert with_runs > 20 and applied > 1000  # the new form was in use, not the per-message fallback
    print(f"{with_runs} frames with runs, {applied} messages applied, {errors} frames refused")


def test_a_frame_with_markers_splits_its_runs() -> None:
    entries = (Entry(0, 3, "e"), Entry(4, 7, ""), Entry(5, 8, ""), Entry(6, 0, "s"), Entry(7, 9, ""))
    batch = encode_frame(entries, runs=True).batch
    assert [(m.seq, m.marker.snapshot_id, m.marker.last_seq) for m in batch.messages] == [(0, "e", 3), (6, "s", 0)]
    assert [(r.first_seq, list(r.amounts)) for r in batch.runs] == [(4, [7, 8]), (7, [9])]
    plain = encode_frame(entries[1:3], runs=True).batch
    assert not plain.messages and [(r.first_seq, list(r.amounts)) for r in plain.runs] == [(4, [7, 8])]
    # Not in channel order (never from an outbox): sent as is, one message each.
    odd = encode_frame((Entry(5, 1, ""), Entry(4, 2, "")), runs=True).batch
    assert not odd.runs and [m.seq for m in odd.messages] == [5, 4]


# ------------------------------------------- any batch: its per-message form, merged


def _per_message(batch: pb.ChannelBatch) -> pb.ChannelBatch:
    """The reference: messages and run transfers merged by seq, a message first on a tie."""
    messages = list(batch.messages)
    transfers = [
        pb.ChannelMessage(seq=run.first_seq + i, transfer=pb.TransferMessage(amount=amount))
        for run in batch.runs for i, amount in enumerate(run.amounts)
    ]
    out, m, t = pb.ChannelBatch(), 0, 0
    while m < len(messages) or t < len(transfers):
        if t == len(transfers) or (m < len(messages) and messages[m].seq <= transfers[t].seq):
            out.messages.append(messages[m])
            m += 1
        else:
            out.messages.append(transfers[t])
            t += 1
    return out


def _random_batch(rng: random.Random, at: int) -> pb.ChannelBatch:
    batch = pb.ChannelBatch()
    for _ in range(rng.randint(1, 4)):
        first = max(1, at + rng.randint(-4, 3))
        count = rng.choice([0, 1, 3, 10])
        batch.runs.add(first_seq=first, amounts=[rng.choice([1, 2, 5, 0]) for _ in range(count)])
        at = first + count
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        kind = rng.random()
        seq = rng.randint(0, at + 2) if kind < 0.9 else 0
        message = pb.ChannelMessage(seq=seq)
        if kind < 0.45:
            message.marker.snapshot_id = f"m{seq}"
        elif kind < 0.6:
            message.marker.last_seq = seq  # an empty snapshot id: a protocol violation
        elif kind < 0.9:
            message.transfer.amount = rng.randint(1, 4)
        # else: no body, a protocol violation
        batch.messages.append(message)
    batch.messages.sort(key=lambda message: message.seq)  # usually in order; sometimes not
    if rng.random() < 0.1:
        batch.messages.reverse()
    return batch


@pytest.mark.parametrize("mode", ["classic", "overtake"])
def test_any_batch_applies_as_its_per_message_form(mode: str) -> None:
    print(f"seed {SEED} (SNAPMESH_RUNS_SEED to repeat)")
    rng = random.Random(f"{SEED}-any-{mode}")
    for _ in range(200):
        batches, at = [], 1
        for _ in range(rng.randint(1, 6)):
            batch = _random_batch(rng, at)
            batches.append(batch)
            at = max([at] + [r.first_seq + len(r.amounts) for r in batch.runs])
        (new_errors, new_outcome), (old_errors, old_outcome) = _both(mode, batches, [_per_message(b) for b in batches])
        assert new_errors == old_errors, batches
        assert new_outcome == old_outcome, batches


def test_a_run_at_seq_0_is_refused_before_anything_applies() -> None:
    async def go() -> None:
        engine = _engine("classic")
        before = list(engine.log.records)
        batch = pb.ChannelBatch(runs=[pb.TransferRun(first_seq=1, amounts=[5]), pb.TransferRun(first_seq=0, amounts=[])])
        assert _apply(engine, batch) == ("RemoteProtocolError", "channel a->b: a run of transfers starts at seq 0")
        assert engine.log.records == before and engine.node.tally == 1000

    asyncio.run(go())


# ------------------------------------------------------ real gRPC, two real nodes


async def _nodes(cfg: cluster_config.ClusterConfig, monkeypatch, ids: tuple[str, ...], old_receivers=()):
    """Start nodes `ids` in this loop; returns (engines, stop)."""
    engines: dict[str, Engine] = {}
    real_servicer = node_embedded.NodeServicer

    def capturing(engine, *rest):
        engines[engine.node_id] = engine
        servicer = real_servicer(engine, *rest)
        servicer.accepts_payload_runs = engine.node_id not in old_receivers
        return servicer

    stop = asyncio.get_running_loop().create_future()

    async def until_stopped():
        return await stop

    monkeypatch.setattr(node_embedded, "NodeServicer", capturing)
    monkeypatch.setattr(node_main, "wait_for_stop_signal", until_stopped)
    servers = [asyncio.create_task(node_main.serve(cfg, n)) for n in ids]
    for _ in range(600):
        if len(engines) == len(ids):
            break
        assert not any(s.done() for s in servers), [s.result() for s in servers if s.done()]
        await asyncio.sleep(0.05)

    async def stopping() -> None:
        stop.set_result(signal.SIGTERM)
        assert await asyncio.gather(*servers) == [0] * len(ids)

    return engines, stopping


def _config(tmp_path) -> cluster_config.ClusterConfig:
    path, _ = cluster_file(tmp_path, ["p1", "p2"], balance=10_000)
    return cluster_config.load(path)


@pytest.mark.parametrize("old_receiver", [False, True])
def test_the_banks_transfers_cross_in_payload_runs_only_to_a_receiver_that_accepts_them(
    tmp_path, monkeypatch, old_receiver: bool
) -> None:
    async def go() -> None:
        engines, stopping = await _nodes(_config(tmp_path), monkeypatch, ("p1", "p2"), ("p2",) if old_receiver else ())
        p2 = engines["p2"]
        try:
            async with grpc.aio.insecure_channel(_address(tmp_path, "p1"), options=CLIENT_OPTIONS) as channel:
                stub = pb_grpc.NodeStub(channel)
                request = pb.TransferBatchRequest(transfers=[pb.TransferRequest(to="p2", amount=2)] * 300)
                response = await stub.TransferBatch(request, timeout=30, wait_for_ready=True)
                assert [r.code for r in response.results] == [0] * 300
            for _ in range(400):
                if p2.node.transfers_received == 300:
                    break
                await asyncio.sleep(0.05)
            assert p2.node.transfers_received == 300 and p2.node.app_state() == b"10600"
            in_runs = p2.metrics.payload_run_messages("p1")._value.get()
            assert in_runs == (0 if old_receiver else 300)
        finally:
            await stopping()

    asyncio.run(go())


def _address(tmp_path, node_id: str) -> str:
    return cluster_config.load(tmp_path / "cluster.toml").node(node_id).address


async def _raw(
    address: str, frames: list[pb.ChannelFrame], until: int | None = None
) -> tuple[list[pb.ChannelAck], grpc.StatusCode | None, str]:
    """A raw Channel stream: write `frames`, read acks until the stream ends
    (its status) or one acknowledges `until` (status None: the stream was fine)."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.NodeStub(channel).Channel(timeout=20)
        acks = []
        try:
            # As a real sender: the batches after the resume point (an abort while the
            # node still writes that ack fails in gRPC itself, TOO_MANY_OPERATIONS).
            await call.write(frames[0])
            acks.append(await call.read())
            for frame in frames[1:]:
                await call.write(frame)
            while (ack := await call.read()) is not grpc.aio.EOF:
                acks.append(ack)
                if until is not None and ack.acked_seq >= until:
                    call.cancel()
                    return acks, None, ""
        except grpc.aio.AioRpcError as error:
            return acks, error.code(), error.details()
        return acks, grpc.StatusCode.OK, ""


def test_a_native_run_of_transfers_into_a_bank_app_node_is_a_protocol_violation(tmp_path, monkeypatch) -> None:
    """Only p2 runs: p1's channel into it stays quiet while this test impersonates p1."""

    async def go() -> None:
        engines, stopping = await _nodes(_config(tmp_path), monkeypatch, ("p2",))
        address = _address(tmp_path, "p2")
        opening = pb.ChannelFrame(open=pb.ChannelOpen(src="p1", dst="p2"))
        try:
            node = engines["p2"].node
            frame = pb.ChannelFrame(batch=pb.ChannelBatch(runs=[pb.TransferRun(first_seq=1, amounts=[5, 6])]))
            acks, code, details = await _raw(address, [opening, frame])
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "has no meaning here" in details, details
            assert node.receivers["p1"].last_seq == 0 and node.app_state() == b"10000"
        finally:
            await stopping()

    asyncio.run(go())


def test_the_microdriver_logs_the_same_bytes_whatever_the_frame_form() -> None:
    from bench import microdriver

    assert microdriver.run(700, "runs") == microdriver.run(700, "messages") == microdriver.run(700)
