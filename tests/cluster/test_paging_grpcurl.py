"""Paging: "past roughly 9,500 snapshots [one ListSnapshots answer]
exceeds grpcurl's 4 MiB limit". Here, 10,000 finished snapshots of about the
size the issue measured (~480 bytes each: 4.8 MB in one answer), and the real
grpcurl binary (pinned 1.8.6, 4 MiB receive limit) against a real controller
process: its answer without page_size fits and says where to go on
(next_page_token); following the tokens lists every snapshot once, in start
order; page_size and the status filter page the same way.

The snapshots come from the controller's own journal (started + FAILED with a
reason, the records a controller writes), written here rather than taken one by
one (10,000 snapshots would take minutes); the controller rebuilds them at
start-up as after a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snapmesh.protocol.controller import journal
from snapmesh.settings import config
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from support.binaries import grpcurl_binary
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

COUNT = 10_000
REASON = "initiator p1 did not answer StartSnapshot in time: UNAVAILABLE: " + "connection refused; " * 20
LIMIT = 4 * 1024 * 1024  # grpcurl's (and gRPC's default) receive limit


def write_journal(data_dir: Path) -> list[str]:
    (data_dir / "controller").mkdir(parents=True, exist_ok=True)
    ids, frames, start = [], [], 1_795_000_000.0
    for i in range(COUNT):
        wall = start + i * 0.01
        sid = time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall)) + f".{round(wall * 1e6) % 1_000_000:06d}Z-{i:08x}"
        ids.append(sid)
        frames.append(journal.encode(journal.Started(snapshot_id=sid, initiator="p1", wall=wall)))
        frames.append(journal.encode(journal.Finished(snapshot_id=sid, status=pb.Snapshot.FAILED, reason=REASON,
                                                      wall=wall + 0.005)))
    (data_dir / "controller" / "journal").write_bytes(b"".join(frames))
    return ids


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    root = tmp_path_factory.mktemp("paging")
    cfg = config.load(write_cluster(root / "cluster.toml", nodes=3))
    ids = write_journal(cfg.data_dir)
    snapmesh = Path(sys.executable).with_name("snapmesh")
    log = (root / "controller.out").open("w")
    proc = subprocess.Popen([str(snapmesh), "controller", "--config", str(root / "cluster.toml")],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SNAPMESH_TLS_DIR": ""})
    address = f"{cfg.controller.host}:{cfg.controller.port}"
    try:

        def serving() -> bool:
            if subprocess.run([str(snapmesh), "health", address], capture_output=True).returncode == 0:
                return True
            assert proc.poll() is None, (root / "controller.out").read_text()
            return False

        wait_for(serving, timeout=60, interval=0.3, what="the controller to serve")
        yield address, ids
    finally:
        # SIGKILL, not SIGTERM: a clean stop first files every one of the 10,000 rebuilt
        # snapshots (minutes); the journal keeps them either way.
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()


def grpcurl(address: str, body: dict) -> tuple[dict, int]:
    result = subprocess.run([str(grpcurl_binary()), "-plaintext", "-d", json.dumps(body), address,
                             "snapmesh.v1.Controller/ListSnapshots"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), len(result.stdout)


def follow(address: str, body: dict) -> tuple[list[str], int]:
    seen, pages, token = [], 0, ""
    while True:
        answer, _ = grpcurl(address, {**body, **({"page_token": token} if token else {})})
        seen += [s["snapshot_id"] for s in answer.get("snapshots", [])]
        pages += 1
        token = answer.get("next_page_token", "")
        if not token:
            return seen, pages
        assert pages < 100


def test_all_in_one_answer_would_not_fit_grpcurls_limit(controller):
    address, ids = controller
    one = pb.Snapshot(snapshot_id=ids[0], initiator="p1", status=pb.Snapshot.FAILED, reason=REASON, epoch=1)
    one.started_at.FromSeconds(1_795_000_000)
    one.finished_at.FromSeconds(1_795_000_000)
    assert COUNT * (one.ByteSize() + 3) > LIMIT  # the situation the issue describes


def test_grpcurl_without_page_size_gets_a_page_that_fits_and_a_token(controller):
    address, ids = controller
    answer, _ = grpcurl(address, {})
    first = [s["snapshot_id"] for s in answer["snapshots"]]
    assert answer.get("next_page_token"), "10,000 snapshots in one answer: past grpcurl's 4 MiB"
    assert 1000 < len(first) < COUNT and first == ids[: len(first)]


def test_following_the_tokens_lists_every_snapshot_once_in_start_order(controller):
    address, ids = controller
    seen, pages = follow(address, {})
    assert seen == ids and pages >= 2


def test_page_size_and_the_status_filter_page_the_same_way(controller):
    address, ids = controller
    seen, pages = follow(address, {"page_size": 2500, "status": "FAILED"})
    assert seen == ids and pages == COUNT // 1000  # a page_size over 1000 is 1000 (the proto says so)
    answer, _ = grpcurl(address, {"page_size": 700})
    assert len(answer["snapshots"]) == 700 and answer["next_page_token"]
    assert grpcurl(address, {"status": "COMPLETE"})[0].get("snapshots", []) == []
