"""An app's messages in payload runs (ChannelBatch.payload_runs), from one node's engine to real processes.

- The same app entries sent as payload runs and as one message each, applied
  through the servicer's decoding to a real Engine hosting an app (it records
  every payload and answers some), give the same log records, the same app
  state, the same sends and the same errors (generated frames with empty and
  zero-byte payloads, markers, early markers, resends and gaps; both modes; the
  seed is printed).
- Negotiation over real gRPC between two in-process nodes running the minimal
  app: payload runs only to a receiver whose acks say `accepts_payload_runs`
  (every message then arrives in a run), one message each to an older
  receiver, which applies them all alike. A payload run at seq 0, or whose
  lengths do not add up to its buffer, ends the stream FAILED_PRECONDITION
  naming the channel, before anything of its batch applies.
- A real-process cluster (three `snapmesh node` processes and a controller)
  running the minimal app under SubmitBatch load: the messages cross in runs
  (the receivers' snapmesh_channel_payload_run_messages_total), and every
  snapshot taken meanwhile is COMPLETE with the app's invariant ("every message
  once") checked and holding.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from snapmesh.app import App, load_app
from snapmesh.processes.supervisor import Cluster
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
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(240)

SEED = int(os.environ.get("SNAPMESH_RUNS_SEED", random.randrange(2**32)))
MINIMAL = "bench.minimal_app:app"


# ------------------------------------------ a real Engine hosting an app, no I/O around it


class Recorder:
    """Keeps every payload it gets, in order; one starting with b"r" is answered to its sender."""

    def __init__(self, info) -> None:
        self.got: list[bytes] = []

    def on_command(self, command: bytes, ctx) -> bytes:  # pragma: no cover  (no commands here)
        return b""

    def on_message(self, src: str, payload: bytes, ctx) -> None:
        self.got.append(payload)
        if payload[:1] == b"r":
            ctx.send(src, payload[::-1])

    def snapshot(self) -> bytes:
        return repr(self.got).encode()

    def restore(self, state: bytes) -> None:  # pragma: no cover
        raise AssertionError("no restore here")


RECORDER = App(name="recorder", new=Recorder)


class _Log:
    def __init__(self) -> None:
        self.records: list = []
        self.durable_lsn = self.last_lsn = 0
        self.active_bytes = self.appended_bytes = 0

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
        self.room, self.pushed = _Room(), []

    def push(self, conn_no: int, entries) -> None:
        self.pushed.append((conn_no, entries))


class _Reporter:
    def __init__(self) -> None:
        self.kept: list = []

    def keep(self, message, lsn: int, state: bytes | None = None, named=None, *, in_log: bool = False) -> None:  # noqa: ANN001
        message = type(message).FromString(message.SerializeToString())
        if state is not None and not message.HasField("state"):  # kept aside by the engine: the report's all the same
            message.state = state
        message.cut_at_unix_ns = message.done_at_unix_ns = 0  # wall-clock times, not content
        self.kept.append((message.SerializeToString(deterministic=True), lsn))

    def send(self, snapshot_id: str) -> None:
        self.kept.append(("send", snapshot_id))

    def logged(self, record):  # noqa: ANN001, ANN201  (a report record: its part is in `kept`)
        return record

    def carried(self, checkpoint):  # noqa: ANN001, ANN201
        return checkpoint

    def cancel(self, snapshot_id: str) -> None:
        self.kept.append(("cancel", snapshot_id))


def _engine(mode: str) -> Engine:
    node = Node(
        node_id="b", incoming=("a",), outgoing=("a",), snapshot_mode=mode, segment_records=50, app=RECORDER,
        recovered=fresh(incoming=("a",), outgoing=("a",)),
    )
    engine = Engine(
        node=node, log_=_Log(), outgoing={"a": _Outgoing()}, incoming={"a": IncomingChannel(src="a", dst="b")},
        metrics=NodeMetrics("b"), reporter=_Reporter(), app_spec="recorder",
    )
    engine.opened("a", 1)
    return engine


def _apply(engine: Engine, batch: pb.ChannelBatch) -> tuple[str, str] | None:
    try:
        _receive(engine, "a", "b", 1, pb.ChannelBatch.FromString(batch.SerializeToString()))
    except core.RemoteProtocolError as exc:  # link.GapError too
        return type(exc).__name__, str(exc)
    return None


def _outcome(engine: Engine) -> tuple:
    node = engine.node
    return (
        engine.log.records, node.app_state(), node.receivers["a"].last_seq, node.receivers["a"].duplicates,
        node.messages_received, node.markers_received, engine.reporter.kept, engine.outgoing["a"].pushed,
    )


def _entries(rng: random.Random, count: int) -> list[Entry]:
    """A channel's messages 1..count as an app's outbox holds them: payloads and markers."""
    out = []
    for seq in range(1, count + 1):
        if rng.random() < 0.04:
            out.append(Entry(seq, 0, f"s{seq}"))
        else:
            size = rng.choice([0, 0, 1, 3, 17])
            payload = rng.choice([b"", b"\x00" * size, bytes(rng.randrange(256) for _ in range(size)), b"r" + b"\x00" * size])
            out.append(Entry(seq, 0, "", payload=payload))
    return out


def _frames(rng: random.Random, entries: list[Entry]) -> list[tuple[Entry, ...]]:
    """Frames as the sender cuts them, with early markers ahead, resends and now and then a lost stretch."""
    frames, at = [], 0
    while at < len(entries):
        size = rng.choice([1, 2, 5, 67, 200])
        if rng.random() < 0.1:
            at = max(0, at - rng.randint(1, 30))  # a resend after a reconnect: duplicates
        elif rng.random() < 0.03:
            at += rng.randint(1, 3)  # a gap (until a resend fills it)
        early = tuple(Entry(0, rng.randint(0, at + 5), f"e{at}-{i}") for i in range(rng.choice([0] * 8 + [1, 2])))
        frames.append(early + tuple(entries[at : at + size]))
        at += size
    return frames


@pytest.mark.parametrize("mode", ["classic", "overtake"])
def test_payload_runs_apply_exactly_as_one_message_each(mode: str) -> None:
    print(f"seed {SEED} (SNAPMESH_RUNS_SEED to repeat)")
    rng = random.Random(f"{SEED}-payloads-{mode}")

    async def go() -> tuple[int, int]:
        in_runs = applied = 0
        for _ in range(8):
            frames = _frames(rng, _entries(rng, rng.randint(1, 600)))
            new = [encode_frame(entries, payload_runs=True).batch for entries in frames]
            old = [encode_frame(entries, payload_runs=False).batch for entries in frames]
            assert all(not batch.payload_runs for batch in old)
            in_runs += sum(len(run.lengths) for batch in new for run in batch.payload_runs)
            outcomes = []
            for batches in (new, old):
                engine = _engine(mode)
                errors = [_apply(engine, batch) for batch in batches]
                outcomes.append((errors, _outcome(engine)))
            assert outcomes[0] == outcomes[1]
            applied += outcomes[1][1][2]
        return in_runs, applied

    in_runs, applied = asyncio.run(go())
    assert in_runs > 1000 and applied > 500  # the new form was in use, not the per-message fallback
    print(f"{in_runs} messages sent in runs, {applied} applied")


# ------------------------------------------ real gRPC, two in-process nodes, the minimal app


async def _nodes(cfg: cluster_config.ClusterConfig, monkeypatch, ids: tuple[str, ...], old_receivers=()):
    engines: dict[str, Engine] = {}
    real_servicer = node_embedded.NodeServicer
    app = load_app(MINIMAL)

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
    servers = [asyncio.create_task(node_main.serve(cfg, n, app=app)) for n in ids]
    for _ in range(600):
        if len(engines) == len(ids):
            break
        assert not any(s.done() for s in servers), [s.result() for s in servers if s.done()]
        await asyncio.sleep(0.05)

    async def stopping() -> None:
        stop.set_result(signal.SIGTERM)
        assert await asyncio.gather(*servers) == [0] * len(ids)

    return engines, stopping


@pytest.mark.parametrize("old_receiver", [False, True])
def test_payload_runs_only_to_a_receiver_that_accepts_them(tmp_path, monkeypatch, old_receiver: bool) -> None:
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path / "data")
    path.write_text(path.read_text() + f'\n[app]\nmodule = "{MINIMAL}"\n')  # the node's edge takes commands
    cfg = cluster_config.load(path, env={})

    async def go() -> None:
        engines, stopping = await _nodes(cfg, monkeypatch, ("p1", "p2"), ("p2",) if old_receiver else ())
        p2 = engines["p2"]
        try:
            async with grpc.aio.insecure_channel(cfg.node("p1").address, options=CLIENT_OPTIONS) as channel:
                stub = pb_grpc.NodeStub(channel)
                request = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=bytes([i % 3]) * (i % 4)) for i in range(300)])
                response = await stub.SubmitBatch(request, timeout=30, wait_for_ready=True)
                assert [r.code for r in response.results] == [0] * 300
            for _ in range(400):
                if p2.node.messages_received == 300:
                    break
                await asyncio.sleep(0.05)
            assert p2.node.messages_received == 300 and p2.node.app_state() == b"0 300"
            in_runs = p2.metrics.payload_run_messages("p1")._value.get()
            assert in_runs == (0 if old_receiver else 300)
        finally:
            await stopping()

    asyncio.run(go())


async def _raw(address: str, frames: list[pb.ChannelFrame], until: int | None = None):
    """A raw Channel stream: write `frames`, read acks until the stream ends
    (its status) or one acknowledges `until` (status None: the stream was fine)."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.NodeStub(channel).Channel(timeout=20)
        acks = []
        try:
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


def test_a_malformed_payload_run_closes_the_stream_as_a_protocol_violation(tmp_path, monkeypatch) -> None:
    """Only p2 runs: this test impersonates p1 on its channel into p2."""
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path / "data")
    path.write_text(path.read_text() + f'\n[app]\nmodule = "{MINIMAL}"\n')
    cfg = cluster_config.load(path, env={})

    def frame(*runs: pb.PayloadRun) -> pb.ChannelFrame:
        return pb.ChannelFrame(batch=pb.ChannelBatch(payload_runs=list(runs)))

    async def go() -> None:
        engines, stopping = await _nodes(cfg, monkeypatch, ("p2",))
        address, node = cfg.node("p2").address, engines["p2"].node
        opening = pb.ChannelFrame(open=pb.ChannelOpen(src="p1", dst="p2"))
        try:
            good = pb.PayloadRun(first_seq=1, lengths=[2, 0], data=b"ab")
            short = pb.PayloadRun(first_seq=3, lengths=[4], data=b"abc")
            acks, code, details = await _raw(address, [opening, frame(good, short)])
            assert acks[0].acked_seq == 0 and acks[0].accepts_payload_runs  # the resume point says it reads them
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert details == ("protocol violation: channel p1->p2: the run of app messages at seq 3 has lengths"
                               " adding up to 4 bytes for a buffer of 3")
            assert node.receivers["p1"].last_seq == 0  # the good run before it did not apply
            acks, code, details = await _raw(address, [opening, frame(pb.PayloadRun(first_seq=0, lengths=[1], data=b"a"))])
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "protocol violation: channel p1->p2: a run of app messages starts at seq 0" in details
            acks, code, _ = await _raw(address, [opening, frame(good, pb.PayloadRun(first_seq=3))], until=2)
            assert code is None and node.receivers["p1"].last_seq == 2 and node.app_state() == b"0 2"
        finally:
            await stopping()

    asyncio.run(go())


# ------------------------------------------ real processes: snapshots while messages cross in runs


def _in_runs(address: str) -> float:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "snapmesh_channel_payload_run_messages_total")


def test_a_real_cluster_snapshots_consistently_while_messages_cross_in_runs(tmp_path) -> None:
    cluster = Cluster(write_cluster(tmp_path / "cluster.toml", nodes=3, data_dir=tmp_path / "data"), app=MINIMAL)
    stop = threading.Event()
    errors: list[BaseException] = []

    def load(node_id: str) -> None:
        request = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=b"x" * (i % 5)) for i in range(200)])
        try:
            with grpc.insecure_channel(cluster.node_address(node_id)) as channel:
                stub = pb_grpc.NodeStub(channel)
                while not stop.is_set():
                    assert all(r.code == 0 for r in stub.SubmitBatch(request, timeout=60, wait_for_ready=True).results)
        except BaseException as exc:  # noqa: BLE001  (reported by the test's thread)
            errors.append(exc)

    try:
        cluster.start()
        threads = [threading.Thread(target=load, args=(n,)) for n in cluster.node_ids]
        for thread in threads:
            thread.start()
        snapshots = []
        with grpc.insecure_channel(cluster.controller_address) as channel:
            controller = pb_grpc.ControllerStub(channel)
            for _ in range(8):
                snapshots.append(controller.TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60))
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        in_runs = sum(_in_runs(node.metrics_address) for node in cluster.config.nodes)
    finally:
        stop.set()
        cluster.stop()
    for snapshot in snapshots:
        assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
        assert snapshot.app.status == pb.AppCheck.CHECKED, snapshot.app
        assert [(i.name, i.ok) for i in snapshot.app.invariants] == [("every message once", True)], snapshot.app
    in_flight = sum(len(c.in_flight) for s in snapshots for c in s.channels)
    print(f"{in_runs:.0f} messages received in runs; {in_flight} in flight over {len(snapshots)} snapshots")
    assert in_runs > 1000
