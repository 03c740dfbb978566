"""A transfer-log segment seals by bytes as well as by records (`segment_bytes`, machine.py N7).

A real Engine, Node and TransferLog, no network: with `segment_records` out of
reach, the active segment is sealed once it holds `segment_bytes` bytes after
its checkpoint, each sealed segment ends within two steps of the budget, the metrics say so, and a
restart on the log goes on from the active file's size (the log counts it
from the file, not from zero).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from snapmesh.services.node.channels import IncomingChannel, OutgoingChannel
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.metrics import NodeMetrics
from snapmesh.services.node.recovery import recover
from snapmesh.services.node.pendingreports import PendingReports
from snapmesh.services.node.reporter import StateReporter
from snapmesh.services.node.translog import TransferLog
from snapmesh.app import load_app
from snapmesh.protocol import wal
from snapmesh.protocol.node.machine import Node
from snapmesh.settings import config as cluster_config

pytestmark = pytest.mark.timeout(60)

BUDGET = 4096
BANK, PARAMS = load_app("bank"), {"initial_balance": 10_000}  # every node hosts an app (node rule N10)


async def _node(tmp_path: Path) -> tuple[Engine, TransferLog, NodeMetrics]:
    path = tmp_path / "p1.log.jsonl"
    recovered = recover(path, "p1", incoming=("p2",), outgoing=("p2",), app=BANK, app_params=PARAMS)
    engine: Engine | None = None
    log = TransferLog(path, "p1", last_lsn=recovered.last_lsn,
                      on_durable=lambda lsn: engine.durable(lsn) if engine is not None else None)
    metrics = NodeMetrics("p1")
    reporter = StateReporter(address="127.0.0.1:1", log_=log, metrics=metrics, options=[],
                             pending=PendingReports(tmp_path / "p1.reports"))
    node = Node(node_id="p1", incoming=("p2",), outgoing=("p2",), recovered=recovered, now=0.0, wall=0.0,
                segment_records=10**6, segment_bytes=BUDGET, app=BANK, app_params=PARAMS)
    never_started = OutgoingChannel(src="p1", dst="p2", address="127.0.0.1:1", metrics=metrics,
                                    on_open=lambda *_: None, on_ack=lambda *_: None, on_lost=lambda *_: None)
    engine = Engine(node=node, log_=log, outgoing={"p2": never_started},
                    incoming={"p2": IncomingChannel(src="p2", dst="p1")}, metrics=metrics, reporter=reporter,
                    app_spec="bank")
    log.flush_sync()
    return engine, log, metrics


def _sealed(tmp_path: Path) -> list[Path]:
    return sorted(p for p in tmp_path.iterdir() if wal.sealed_first_lsn(p.name, "p1") is not None)


def test_a_segment_seals_at_segment_bytes_when_its_records_are_far_from_segment_records(tmp_path: Path) -> None:
    async def go() -> tuple[int, float, float]:
        engine, log, metrics = await _node(tmp_path)
        for i in range(300):  # ~140 bytes a send record, ~110 its command: ~75 KiB in all
            engine.submit(b"1 p2", request_id=f"request-{i:04d}")  # the bank app's compact command
        engine.durable(log.durable_lsn)  # a step with the metrics, once per call (as a command's step is)
        log.flush_sync()
        sealed = _sealed(tmp_path)
        for segment in [*sealed[1:], tmp_path / "p1.log.jsonl"]:  # each opens with a checkpoint
            assert segment.read_text().splitlines()[0].startswith('{"node":"p1","lsn"') and "checkpoint" in (
                segment.read_text().splitlines()[0])
        # Past the budget within two steps (two records each here: a command and its send): the log's count reaches the node
        # after the step that crossed it, and the next step's end seals. Its checkpoint left out.
        for segment in sealed:
            lines = segment.read_bytes().splitlines(keepends=True)
            head = len(lines[0]) if b'"checkpoint"' in lines[0] else 0
            assert BUDGET <= segment.stat().st_size - head < BUDGET + 4 * max(map(len, lines)), segment
        active = tmp_path / "p1.log.jsonl"
        assert log.active_bytes == active.stat().st_size
        assert log.appended_bytes == active.stat().st_size - len(active.read_bytes().splitlines(keepends=True)[0])
        await log.close()
        active_metric = metrics.registry.get_sample_value("snapmesh_log_active_segment_bytes", {"node": "p1"})
        return len(sealed), metrics.segments_sealed._value.get(), active_metric  # the gauge as a scrape reads it

    count, sealed_metric, active_metric = asyncio.run(go())
    assert count >= 5  # by records (10**6) it would have sealed none
    assert sealed_metric == count
    assert active_metric == (tmp_path / "p1.log.jsonl").stat().st_size
    # The checkpoints grew past the budget (300 request ids): still one seal per budget, not one per step.
    assert len((tmp_path / "p1.log.jsonl").read_bytes().splitlines()[0]) > BUDGET or count < 20

    async def restart() -> tuple[int, int]:  # the restarted log counts from the active file, its checkpoint left out
        engine, log, _ = await _node(tmp_path)
        size = log.appended_bytes
        await log.close()
        return size, engine.node._segment_size

    size, told = asyncio.run(restart())
    active = tmp_path / "p1.log.jsonl"
    assert size == told == active.stat().st_size - len(active.read_bytes().splitlines(keepends=True)[0]) > 0


def test_segment_bytes_is_a_cluster_file_setting(tmp_path: Path) -> None:
    path = cluster_config.write_cluster(tmp_path / "cluster.toml", nodes=2, settings={"segment_bytes": 8192})
    assert cluster_config.load(path, env={}).segment_bytes == 8192
    default = cluster_config.write_cluster(tmp_path / "default.toml", nodes=2)
    assert cluster_config.load(default, env={}).segment_bytes == 64 * 1024 * 1024
    with pytest.raises(cluster_config.ConfigError, match="segment_bytes: must be an integer >= 4096"):
        cluster_config.write_cluster(tmp_path / "small.toml", nodes=2, settings={"segment_bytes": 100})
