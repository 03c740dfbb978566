"""What any visitor of `snapmesh ui` can make it spend is bounded (issue 34, "The page").

A real 3-node cluster (the supervisor's processes) with a few tens of thousands of
transfers in its logs, and `snapmesh ui --data-dir` as its own process against it;
the visitors are real HTTP clients (urllib), 60 at once:

- 50 ask for pictures of snapshots that do not exist, 10 for the picture of a real
  COMPLETE one: the page's RSS stays under +100 MB (its peak, VmHWM) and every
  answer comes within 5 s: 404 for the unknown ids, the picture or 503 (one is
  drawn at a time) for the real one. The code this replaced read every node log
  for each of them.
- An unknown id the controller was asked about once is not asked about again
  (negative answers are kept): counted on the controller's gRPC metrics.
- A Host header that is not the page's address is refused (DNS rebinding).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.cluster_helpers import controller_stub, node_stub
from support.polling import wait_for
from snapmesh.checking.scrape import samples
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.trace.svg import CHOSEN_CUT_COLOUR
from snapmesh.ui.source import Busy, Source
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

RSS_GROWTH_MB = 100
ANSWER_S = 5.0
UNKNOWN = [f"20260101T00000{i}.000000Z-0000000{i}" for i in range(5)]  # well-formed, never made


def rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def get(url: str, host: str | None = None) -> tuple[int, bytes, float]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), time.monotonic() - start
    except urllib.error.HTTPError as error:
        return error.code, error.read(), time.monotonic() - start


def get_snapshot_calls(cluster: Cluster) -> float:
    return sum(s.value for s in samples(cluster.config.controller.metrics_address, "grpc_server_handled_total")
               if s.labels.get("grpc_method") == "GetSnapshot")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("ui-bounds")
    config = write_cluster(data_dir / "cluster.toml", nodes=3, data_dir=data_dir, initial_balance=100_000)
    with Cluster(config) as cluster:
        for src, dst in (("p1", "p2"), ("p2", "p3"), ("p3", "p1")):  # the logs the old page read in full
            channel, node = node_stub(cluster.node_address(src))
            with channel:
                for batch in range(2):
                    transfers = [pb.TransferRequest(to=dst, amount=1, request_id=f"{src}-{batch}-{i}") for i in range(5000)]
                    results = node.TransferBatch(pb.TransferBatchRequest(transfers=transfers), timeout=60).results
                    assert [r.message for r in results if r.code] == []
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
        assert snapshot.status == pb.Snapshot.COMPLETE, snapshot.reason
        proc = subprocess.Popen([sys.executable, "-m", "snapmesh.cli", "ui", "--controller", cluster.controller_address,
                                 "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert line.startswith("ui: http://127.0.0.1:"), line + proc.stderr.read()
            yield dict(cluster=cluster, url=line.split()[1], ui=proc, snapshot=snapshot)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_sixty_visitors_at_once_stay_within_100_mb_and_5_s(env):
    url, pid, sid = env["url"], env["ui"].pid, env["snapshot"].snapshot_id
    assert get(url)[0] == 200  # warmed up: what every page needs is loaded
    before = rss_kb(pid, "VmRSS")
    targets = [f"{url}snapshot/{UNKNOWN[i % 5]}/trace.svg" for i in range(40)]
    targets += [f"{url}snapshot/{bad}/trace.svg" for bad in ("..%2F..%2Fetc%2Fpasswd", "nope", "x" * 300)] * 3
    targets += [f"{url}snapshot/{UNKNOWN[0]}"]  # the snapshot's page too
    targets += [f"{url}snapshot/{sid}/trace.svg"] * 10
    assert len(targets) == 60
    with ThreadPoolExecutor(len(targets)) as pool:
        answers = list(pool.map(get, targets))
    peak = rss_kb(pid, "VmHWM")
    codes = [code for code, _, _ in answers]
    slowest = max(took for _, _, took in answers)
    print(f"\n60 visitors at once: RSS {before / 1024:.0f} MB before, peak {peak / 1024:.0f} MB "
          f"(+{(peak - before) / 1024:.1f} MB); slowest answer {slowest:.2f} s; codes {sorted(set(codes))}")
    assert codes[:50] == [404] * 50, codes[:50]
    assert set(codes[50:]) <= {200, 503} and 200 in codes[50:], codes[50:]
    assert slowest <= ANSWER_S
    assert peak - before <= RSS_GROWTH_MB * 1024, f"+{(peak - before) / 1024:.0f} MB"
    code, svg, _ = get(f"{url}snapshot/{sid}/trace.svg")  # drawn: kept
    assert code == 200 and CHOSEN_CUT_COLOUR.encode() in svg and sid.encode() in svg


def test_an_unknown_id_is_asked_about_once_and_a_non_id_never(env):
    url, cluster = env["url"], env["cluster"]
    unknown = "20260101T000000.000000Z-feedf00d"
    calls = get_snapshot_calls(cluster)
    assert get(f"{url}snapshot/{unknown}/trace.svg")[0] == 404
    wait_for(lambda: get_snapshot_calls(cluster), until=lambda n: n == calls + 1, timeout=10)  # counted once answered
    for path in (f"snapshot/{unknown}/trace.svg", f"snapshot/{unknown}", "snapshot/..%2Fx/trace.svg", "snapshot/x"):
        assert get(url + path)[0] == 404
    time.sleep(1)  # as long as the first one took to be counted, at least
    assert get_snapshot_calls(cluster) == calls + 1


def test_no_picture_of_a_snapshot_in_progress_and_its_page_reads_only_its_lines(env):
    """p3 paused: the snapshot stays IN_PROGRESS. Its picture is refused (the old page
    drew the cuts it found), and its page says from the logs where it is stuck."""
    url, cluster = env["url"], env["cluster"]
    cluster.pause_node("p3")
    try:
        channel, stub = controller_stub(cluster.controller_address)
        with channel:
            started = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=10)
        assert started.status == pb.Snapshot.IN_PROGRESS
        sid = started.snapshot_id
        wait_for(lambda: get(f"{url}snapshot/{sid}")[1].decode(),
             until=lambda page: "data-channel='p2-&gt;p3'" in page or "data-channel='p2->p3'" in page, timeout=30)
        code, body, _ = get(f"{url}snapshot/{sid}/trace.svg")
        assert code == 404 and f"snapshot {sid} is IN_PROGRESS".encode() in body, (code, body[:200])
        page = get(f"{url}snapshot/{sid}")[1].decode()
        assert "from the nodes&#x27; transfer logs" in page or "from the nodes' transfer logs" in page, page[-2000:]
        stuck_nodes = page.split("<ul id='stuck-nodes'>", 1)[1].split("</ul>", 1)[0]
        assert "data-node='p3'" in stuck_nodes and "p1" not in stuck_nodes and "p2" not in stuck_nodes, stuck_nodes
    finally:
        cluster.resume_node("p3")


def test_a_host_that_is_not_the_page_is_refused(env):
    url = env["url"]
    port = url.rstrip("/").rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "attacker.test", f"localhost.evil.example:{port}"):
        code, body, _ = get(f"{url}healthz", host=host)
        assert code == 421 and b"DNS rebinding" in body and host.encode() in body, (host, code, body)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1", f"[::1]:{port}"):
        assert get(f"{url}healthz", host=host)[0] == 200, host
    connection = http.client.HTTPConnection(url.split("//")[1].rstrip("/"), timeout=10)
    connection.putrequest("GET", "/healthz", skip_host=True)  # no Host header at all
    connection.endheaders()
    assert connection.getresponse().status == 421
    connection.close()


def test_one_picture_at_a_time_the_others_are_told_busy(tmp_path):
    source = Source("127.0.0.1:1", None, tmp_path)
    try:
        with source._drawing:  # a picture being drawn
            with pytest.raises(Busy):
                source.trace_svg("20260101T000000.000000Z-00000000")
        svg, note = source.trace_svg("20260101T000000.000000Z-00000000")  # free again: drawn (no logs: why not)
        assert svg is None and "no picture" in note and "no log names snapshot" in note
    finally:
        source.close()


def test_the_picture_reads_only_the_lines_around_the_cut(tmp_path):
    """`read_around`: per node, `margin` lines either side of its lines naming the
    snapshot, across segment files, a torn last line left out; files farther
    away are not read at all (here the oldest is a directory: reading it would fail)."""
    from snapmesh.trace.logs import LogError, read_around, read_data_dir

    def record(lsn: int, **fields) -> str:
        return json.dumps({"node": "a", "lsn": lsn, "kind": "send", **fields}, separators=(",", ":"))

    sid = "20260101T000000.000000Z-00000001"
    lines = [record(lsn) for lsn in range(1, 41)]
    lines[24] = record(25, kind="cut", snapshot_id=sid)
    lines[31] = record(32, kind="marker_recv", snapshot_id=sid)
    for first, last in ((1, 10), (11, 20), (21, 30), (31, 35)):
        (tmp_path / f"a.log.{first:012d}.jsonl").write_text("\n".join(lines[first - 1 : last]) + "\n")
    (tmp_path / "a.log.jsonl").write_text("\n".join(lines[35:]) + '\n{"node":"a","lsn":41,"ki')
    with pytest.raises(LogError, match="no log names snapshot"):  # every file read, to no avail
        read_around(tmp_path, "20260101T000000.000000Z-00000002")
    (tmp_path / "a.log.000000000001.jsonl").unlink()
    (tmp_path / "a.log.000000000001.jsonl").mkdir()  # too far back to be needed
    assert [r["lsn"] for r in read_around(tmp_path, sid, margin=3)["a"]] == list(range(22, 36))
    assert [r["lsn"] for r in read_around(tmp_path, sid, margin=8)["a"]] == list(range(17, 41))
    assert [r["lsn"] for r in read_around(tmp_path, sid, margin=50)["a"]] == list(range(11, 41))  # one file each side
    with pytest.raises(IsADirectoryError):  # proof the directory stands where a log file is read
        read_data_dir(tmp_path)


def test_the_logs_of_a_stuck_snapshot_are_read_by_one_visitor_at_a_time(tmp_path):
    sid, other = "20260101T000000.000000Z-00000001", "20260101T000000.000000Z-00000002"
    records = [{"node": "a", "lsn": 1, "kind": "send", "dst": "b", "msg_id": "a:b:1", "amount": 1, "seq": 1},
               {"node": "a", "lsn": 2, "kind": "cut", "snapshot_id": sid, "balance": 9},
               {"node": "a", "lsn": 3, "kind": "cut", "snapshot_id": other, "balance": 9}]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"node": "a", "lsn": 4, "kind": "marker_recv", "snap'
    (tmp_path / "a.log.jsonl").write_text(text)
    source = Source("127.0.0.1:1", None, tmp_path)
    try:
        assert source.log_records(["a"], sid) == ({"a": [records[1]]}, "")  # only that snapshot's lines
        with source._reading:  # another visitor reads them
            assert source.log_records(["a"], sid) == (
                None, "the logs are being read for another visitor: the controller's view for now")
    finally:
        source.close()
