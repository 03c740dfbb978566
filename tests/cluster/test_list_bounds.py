"""A filtered ListSnapshots over 100,000 filed snapshots: answered from the
store's index of id -> status, reading only the page's files and those off the
event loop (issue 34, "The store and ids").

The store is made on disk as the controller files it (one sealed `.pb` per
snapshot, 1 in 100 FAILED) and loaded with `load_all`, as at start; the
store lies in a tmpfs (/dev/shm) where there is one, since making and removing
100,000 files on this machine's ext4 cost about 55 s of the test's 115 and prove
nothing it checks (every file read while paging is in the page cache either way;
the code this replaced, reading every filed file for a page, still takes about a
second a page there: `load_all`'s one pass over them takes about 9 s); the
controller service runs in this process behind a real gRPC server on loopback,
and the client is another process (so its work is not counted as the loop's).
While it pages, a probe on the event loop measures how late each of its 1 ms
sleeps wakes. On this shared machine a process that does nothing wakes up to
20 ms late now and then (the scheduler ran others), so a stall is counted as
the delay this process caused: the lateness, but no more than the CPU time this
process spent meanwhile (a callback holding the loop, or a thread holding the
GIL, spends it; waiting for a core does not). Both figures are printed.

The same noise can make a few of a hundred answers late, so the client pages
through up to three rounds, and the bounds must hold in one of them (each round
is printed). The code this replaced read every filed file of the directory for a
filtered page: about a second a page here, in every round.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.cluster_helpers import served_in_process
from prometheus_client import CollectorRegistry

from snapmesh.services.controller.metrics import ControllerMetrics
from snapmesh.services.controller.engine import ControllerEngine
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore, StoreWriter
from snapmesh.checking import snapshot_file
from snapmesh.protocol.controller.snapshot_ids import new_snapshot_id
from snapmesh.protocol.controller.machine import Controller
from snapmesh.settings import config
from snapmesh.v1 import snapmesh_pb2 as pb
from support import bank_reports as bank

pytestmark = [pytest.mark.timeout(240)]

FILED = 100_000
P99_MS = 50.0  # the bound for one filtered page
STALL_MS = 20.0  # the longest the event loop may be held meanwhile

CLIENT = r"""
import json, sys, time
import grpc
from snapmesh.v1 import snapmesh_pb2 as pb, snapmesh_pb2_grpc as pb_grpc

stub = pb_grpc.ControllerStub(grpc.insecure_channel(sys.argv[1]))
took, seen = [], {}
for status in [pb.Snapshot.FAILED] * 8 + [pb.Snapshot.COMPLETE] * 2:
    token, ids = "", []
    for _ in range(12 if status == pb.Snapshot.COMPLETE else 1000):
        start = time.perf_counter()
        page = stub.ListSnapshots(pb.ListSnapshotsRequest(status=status, page_size=100, page_token=token), timeout=30)
        took.append(time.perf_counter() - start)
        assert all(s.status == status for s in page.snapshots), "a snapshot of another status"
        ids += [s.snapshot_id for s in page.snapshots]
        token = page.next_page_token
        if not token:
            break
    seen.setdefault(pb.Snapshot.Status.Name(status), ids)
print(json.dumps({"took": took, "seen": seen}))
"""


def file_snapshots(store: SnapshotStore, count: int) -> list[str]:
    """`count` sealed compact files, as the writer leaves them (without the fsyncs),
    every 100th FAILED; their ids, in order."""
    store.compact_directory.mkdir(parents=True)
    template = pb.Snapshot(initiator="p1", total=20, expected_total=20, conserved=True)
    template.nodes.add(node_id="p1", balance=10)
    template.nodes.add(node_id="p2", balance=10)
    ids = []
    for i in range(count):
        template.snapshot_id = new_snapshot_id(1_767_225_600 + i, b"\0\0\0\0")
        template.status = pb.Snapshot.FAILED if i % 100 == 7 else pb.Snapshot.COMPLETE
        store.compact_path(template.snapshot_id).write_bytes(snapshot_file.sealed_bytes(template)[0])
        ids.append(template.snapshot_id)
    return ids


SHM = Path("/dev/shm")
SHM_NEEDED = FILED * 4096 * 2  # a page a file in tmpfs, twice over for headroom


@pytest.fixture
def store_root(tmp_path):
    """A fresh directory in the tmpfs when it is there with room, else pytest's tmp_path."""
    try:
        room = os.statvfs(SHM)
        roomy = os.access(SHM, os.W_OK) and room.f_bavail * room.f_frsize >= SHM_NEEDED and room.f_favail >= 2 * FILED
    except OSError:
        roomy = False
    if not roomy:
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="snapmesh-list-bounds-", dir=SHM))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_filtered_list_of_100k_filed_snapshots_is_fast_and_never_stalls_the_loop(store_root):
    store = SnapshotStore(store_root / "snapshots", store_root / "controller" / "snapshots")
    try:
        ids = file_snapshots(store, FILED)
        loaded, warnings = store.load_all()  # as at start: this builds the index
        assert len(loaded) == FILED and warnings == []
        newest = loaded[-20:]  # the working set holds the newest; the rest are only in the store
        del loaded
        rounds = asyncio.run(_paged(store, newest))
    finally:
        shutil.rmtree(store.compact_directory, ignore_errors=True)  # 100,000 files: not kept for pytest's tmp history

    failed = [sid for i, sid in enumerate(ids) if i % 100 == 7]
    figures = []
    for stats in rounds:
        assert stats["seen"]["FAILED"] == failed  # every FAILED one, in order, none twice
        assert stats["seen"]["COMPLETE"] == [sid for sid in ids if sid not in set(failed)][:1200]
        took = sorted(stats["took"])
        p99 = took[int(len(took) * 0.99)] * 1000
        late = max(lag for lag, _ in stats["lags"]) * 1000
        stall = max(ours for _, ours in stats["lags"]) * 1000
        print(f"\n{len(took)} filtered pages of 100 over {FILED} filed snapshots: p50 {took[len(took) // 2] * 1000:.1f} "
              f"ms, p99 {p99:.1f} ms, max {took[-1] * 1000:.1f} ms; event loop over {len(stats['lags'])} probes: "
              f"longest stall {stall:.1f} ms (woken at most {late:.1f} ms late, the scheduler's share included)")
        figures.append((p99, stall))
    assert any(p99 <= P99_MS and stall <= STALL_MS for p99, stall in figures), (
        f"no round within p99 {P99_MS} ms and a stall of {STALL_MS} ms: {figures}")


async def _paged(store: SnapshotStore, newest: list[pb.Snapshot]) -> dict:
    cfg = config.load(config.DEFAULT_CONFIG)
    tracker = bank.tracker(cfg.topology, expected_total=20, deadline_s=5)
    for snapshot in newest:
        tracker.restore(snapshot)
    writer = StoreWriter(store, on_filed=lambda sid: None)
    service = ControllerService(ControllerEngine(config=cfg, machine=Controller(tracker), journal=None, writer=writer,  # type: ignore[arg-type]
                                metrics=ControllerMetrics(CollectorRegistry())))
    async def probe(lags: list[tuple[float, float]], done: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            due, cpu = loop.time() + 0.001, time.process_time()
            await asyncio.sleep(0.001)
            late = max(0.0, loop.time() - due)
            lags.append((late, min(late, time.process_time() - cpu)))

    try:
        async with served_in_process(service) as stub:
            await stub.ListSnapshots(pb.ListSnapshotsRequest(page_size=1), timeout=10)  # the server is up
            rounds = []
            for _ in range(3):
                lags: list[tuple[float, float]] = []
                done = asyncio.Event()
                probing = asyncio.create_task(probe(lags, done))
                client = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, stub.address,
                                                              stdout=asyncio.subprocess.PIPE)
                out, _ = await client.communicate()
                done.set()
                await probing
                assert client.returncode == 0
                rounds.append({**json.loads(out), "lags": lags})
                took = sorted(rounds[-1]["took"])
                if took[int(len(took) * 0.99)] * 1000 <= P99_MS and max(ours for _, ours in lags) * 1000 <= STALL_MS:
                    break
    finally:
        await asyncio.to_thread(writer.close)
    return rounds
