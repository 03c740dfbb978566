"""The multi-host bench (snapmesh.hosts): the plan as data, then a real cluster
with one network namespace per process (root, `ip`, `tc`, `iptables`: CI has
them; without them these tests fail, they do not skip), and nothing left behind.

One hosts cluster (TLS on) is shared by the module's cluster tests.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from support.cluster_helpers import check_against_logs, controller_stub
from support.polling import wait_for
from snapmesh.hosts import net, plan
from snapmesh.hosts.cluster import HostsCluster
from snapmesh.hosts.plan import Bench, PlanError
from snapmesh.processes.cluster_admin import running_launcher
from snapmesh.load.background import BackgroundLoad
from snapmesh.settings.security import load_tls_dir
from snapmesh.bank.logs import money_check
from snapmesh.checking.node_logs import read_logs
from snapmesh.v1 import snapmesh_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
NAMES = ["controller", "p1", "p2", "p3"]


def _bench() -> Bench:
    return Bench.build("ab12cd", NAMES, "10.231.9.0/24")


# ---------------------------------------------------------------- the plan (pure)


def test_the_plan_names_carry_the_run_id_and_each_host_has_its_address_and_name() -> None:
    bench = _bench()
    assert [h.address for h in bench.hosts] == ["10.231.9.2", "10.231.9.3", "10.231.9.4", "10.231.9.5"]
    assert bench.gateway_address == "10.231.9.1" and bench.gateway == "smh-ab12cd" and len(bench.gateway) <= 15
    assert all("ab12cd" in ns for ns in bench.namespaces)
    assert "10.231.9.3 p1\n" in bench.hosts_file() and "10.231.9.2 controller\n" in bench.hosts_file()
    setup = [" ".join(c) for c in bench.setup()]
    for host in bench.hosts:
        assert f"ip netns add {host.namespace}" in setup
        assert f"ip -n {host.namespace} addr add {host.address}/24 dev eth0" in setup
    teardown = [" ".join(c) for c in bench.teardown()]
    assert set(teardown) == {"ip link delete dev smh-ab12cd", *(f"ip netns delete {ns}" for ns in bench.namespaces)}


@pytest.mark.parametrize("names, subnet, needle", [
    (["p1", "p1"], "10.231.9.0/24", "repeat"),
    (["P1"], "10.231.9.0/24", "'P1'"),
    (["switch"], "10.231.9.0/24", "'switch'"),
    ([f"p{i}" for i in range(10)], "10.231.9.0/29", "room for 5 hosts, 10 asked"),
])
def test_the_plan_refuses_a_bench_it_cannot_build(names, subnet, needle) -> None:
    with pytest.raises(PlanError, match=re.escape(needle)):
        Bench.build("ab12cd", names, subnet)


def _rules(commands) -> set[tuple[str, str]]:
    """(receiver namespace's host, dropped sender address) of each DROP rule."""
    found = set()
    for c in commands:
        assert c[:4] == ("ip", "netns", "exec", c[3]) and "DROP" in c
        found.add((c[3].rsplit("-", 1)[-1], c[c.index("-s") + 1]))
    return found


def test_partitions_drop_at_the_receiver_both_ways_or_one_way_and_undo_what_they_apply() -> None:
    bench = _bench()
    ip = {h.name: h.address for h in bench.hosts}
    both = bench.partition(["p1"], ["p2", "p3"])
    assert _rules(both.apply) == {("p2", ip["p1"]), ("p3", ip["p1"]), ("p1", ip["p2"]), ("p1", ip["p3"])}
    assert [c[c.index("-A") if "-A" in c else 0] for c in both.apply] == ["-A"] * 4
    assert [tuple(x if x != "-A" else "-D" for x in c) for c in both.apply] == list(both.undo)

    one = bench.partition(["p1"], ["p2"], one_way=True)
    assert one.kind == plan.PARTITION_ONE_WAY and _rules(one.apply) == {("p2", ip["p1"])}

    isolate = bench.isolate("p3", ["p1", "p2"])
    assert all(ip["controller"] not in c and "controller" not in c[3] for c in isolate.apply)
    assert _rules(isolate.apply) == {("p1", ip["p3"]), ("p2", ip["p3"]), ("p3", ip["p1"]), ("p3", ip["p2"])}

    split = bench.split(["p3"], ["controller", "p1", "p2"])
    assert ("controller", ip["p3"]) in _rules(split.apply) and split.kind == plan.SPLIT
    with pytest.raises(PlanError, match="minority"):
        bench.split(["p1", "p2"], ["p3", "controller"])
    with pytest.raises(PlanError, match="both sides"):
        bench.partition(["p1"], ["p1", "p2"])
    with pytest.raises(PlanError, match="no host 'p9'"):
        bench.partition(["p9"], ["p1"])


def test_bandwidth_limits_both_ends_of_the_link_and_delay_queues_to_a_delayer_on_the_host() -> None:
    bench = _bench()
    limit = bench.bandwidth("p2", 800)
    assert [c[3] for c in limit.apply] == ["snapmesh-ab12cd-p2", "snapmesh-ab12cd-switch"]
    assert all("tbf" in c and "800kbit" in c for c in limit.apply)
    assert [c[-3:] for c in limit.undo] == [("dev", "eth0", "root"), ("dev", "p2", "root")]

    delay = bench.delay("p1", 5)
    (daemon,) = delay.daemons
    assert daemon.host == "p1" and daemon.argv[-2:] == ("--delay-ms", "5")
    (rule,) = delay.apply
    assert rule[3] == "snapmesh-ab12cd-p1" and "NFQUEUE" in rule and ("OUTPUT", "-o", "eth0") == rule[7:10]
    with pytest.raises(PlanError, match="delay 0 ms"):
        bench.delay("p1", 0)


def test_a_free_subnet_overlaps_nothing_in_use_and_depends_on_the_run_id() -> None:
    used = [ipaddress.IPv4Network("10.0.0.0/9")]
    first = net.free_subnet("ab12cd", used)
    assert first.prefixlen == 24 and first.subnet_of(net.SUBNETS)
    taken = used + [first]
    assert net.free_subnet("ab12cd", taken) != first
    assert not any(net.free_subnet("ab12cd", taken).overlaps(u) for u in taken)


def test_the_delayer_reads_packet_ids_and_acks_from_netlink() -> None:
    from snapmesh.hosts import delayer

    hdr = delayer._attr(delayer.NFQA_PACKET_HDR, bytes.fromhex("0000002a") + b"\x08\x00\x03")
    packets = delayer.message(delayer.NFQNL_MSG_PACKET, 0, hdr) + delayer.message(delayer.NFQNL_MSG_PACKET, 0,
                                                                                   hdr.replace(b"\x2a", b"\x2b", 1))
    ack = delayer._NLMSGHDR.pack(36, delayer.NLMSG_ERROR, 0, 1, 0) + (-1 & 0xFFFFFFFF).to_bytes(4, "little")
    assert delayer.packet_ids(packets + ack + b"\0" * 16) == ([42, 43], [1])


# ---------------------------------------------------------------- rights


def test_without_a_tool_cluster_up_hosts_exits_2_with_one_line_naming_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # everything it needs but `tc`
    bin_dir.mkdir()
    for tool in ("ip", "iptables"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    done = subprocess.run([sys.executable, "-m", "snapmesh.cli", "cluster", "up", "--hosts", "--nodes", "2"],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PATH": str(bin_dir)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["snapmesh cluster: --hosts needs `tc` on PATH (iproute2 and iptables)"]
    assert done.stdout == ""


def test_more_nodes_than_a_runs_subnet_holds_exits_2_before_anything_is_made(tmp_path: Path) -> None:
    from snapmesh.hosts.launch import MAX_NODES

    assert MAX_NODES == 252  # a /24: 254 addresses, the gateway's and the controller's taken
    done = subprocess.run([sys.executable, "-m", "snapmesh.cli", "cluster", "up", "--hosts", "--nodes", "253",
                           "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines() == ["snapmesh cluster: --hosts --nodes 253: a run's /24 has room for 252 nodes "
                                        "and the controller"]
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------- a real hosts cluster


def _require_rights() -> None:
    problem = net.missing_rights()
    assert problem is None, f"the multi-host bench {problem} (CI runs as root with iproute2 and iptables)"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> HostsCluster:
    _require_rights()
    hc = HostsCluster(tmp_path_factory.mktemp("hosts"), nodes=3, tls=True, deadline=5.0)
    hc.start()
    try:
        yield hc
    finally:
        assert hc.stop() == []
        assert net.leftovers(hc.run_id) == []


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_each_process_runs_on_its_own_host_and_peers_dial_each_other_by_name(hosts: HostsCluster) -> None:
    cluster = hosts.cluster
    namespaces = {name: _netns(child.pid) for name, child in [("controller", cluster.controller), *cluster.nodes.items()]}
    assert len(set(namespaces.values()) | {_netns(os.getpid())}) == 4 + 1
    assert [n.host for n in cluster.config.nodes] == ["p1", "p2", "p3"] and cluster.config.controller.host == "controller"
    assert cluster.controller_address.startswith(hosts.plan.host("controller").address + ":")
    for node in cluster.config.nodes:  # a node's view of the world: its hosts file
        done = subprocess.run(cluster.nodes[node.id].host.command(["cat", "/etc/hosts"]), capture_output=True, text=True)
        assert f"{hosts.plan.host('p2').address} p2" in done.stdout
    channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
    with channel, BackgroundLoad.for_cluster(cluster, interval=0.01, batch=5) as load:
        wait_for(lambda: load.stats.accepted, until=lambda n: n >= 20)
        snap = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
    assert snap.status == pb.Snapshot.COMPLETE, snap
    report = check_against_logs(cluster, [snap])
    assert report.transfers >= 20 and report.snapshots == {snap.snapshot_id: True}


# ---------------------------------------------------------------- cleanup


def test_a_failure_inside_the_bench_leaves_nothing_behind(tmp_path: Path) -> None:
    _require_rights()
    network = net.Network(["a", "b"], log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="a test failed here"), network:
        assert len(net.leftovers(network.run_id)) == 3 + 1 + 2 + 1  # namespaces, gateway, hosts files, owner
        raise RuntimeError("a test failed here")
    assert net.leftovers(network.run_id) == []


def test_a_run_whose_owner_was_killed_is_removed_by_the_next_run(tmp_path: Path) -> None:
    _require_rights()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = net.Network(["a"], log_dir=tmp_path).up()  # as if its owner had been SIGKILLed:
    killed.plan = None  # it never runs its `down`
    (net.OWNERS / killed.run_id).write_text(gone.stdout)
    assert net.leftovers(killed.run_id)
    with net.Network(["b"], log_dir=tmp_path) as later:
        assert net.leftovers(killed.run_id) == []
        assert net.leftovers(later.run_id)  # its own run is alive: kept
    assert net.leftovers(later.run_id) == []


def test_ctrl_c_on_cluster_up_hosts_tls_stops_everything_and_removes_the_network(tmp_path: Path) -> None:
    _require_rights()
    argv = [sys.executable, "-m", "snapmesh.cli", "cluster", "up", "--hosts", "--nodes", "2", "--tls",
            "--data-dir", str(tmp_path), "--ui", "127.0.0.1:0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = proc.stdout.readline()
        assert re.fullmatch(r"controller: 10\.231\.\d+\.2:50050\n", line), (line, proc.stderr.read())
        address = line.split()[1]
        grpcurl = proc.stdout.readline()
        assert grpcurl.startswith("grpcurl: ") and address in grpcurl and str(tmp_path / "tls" / "ca.pem") in grpcurl
        run_id = re.search(r"\(run (\w+)\)", proc.stderr.readline()).group(1)
        assert net.leftovers(run_id)
        # as without --hosts: each process's addresses (its host's), then the page
        subnet = address.rsplit(".", 1)[0]
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[:3] == [f"controller metrics: http://{subnet}.2:9100/metrics\n",
                             f"node p1: {subnet}.3:50051 metrics: http://{subnet}.3:9101/metrics\n",
                             f"node p2: {subnet}.4:50051 metrics: http://{subnet}.4:9101/metrics\n"], lines
        with urllib.request.urlopen(f"http://{subnet}.4:9101/metrics", timeout=10) as answer:
            assert b"snapmesh_" in answer.read()
        assert lines[3].startswith("ui: http://127.0.0.1:"), lines
        with urllib.request.urlopen(lines[3].split()[1], timeout=10) as answer:
            assert answer.status == 200
        # a second `cluster up --hosts` on this live data dir: exit 2, nothing changed there, no network made
        tls_before = {f.name: f.read_bytes() for f in (tmp_path / "tls").iterdir()}
        config_before = (tmp_path / "cluster.toml").read_bytes()
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert second.returncode == 2 and "is in use by another process" in second.stderr, second.stderr
        assert second.stdout == "" and "starting" not in second.stderr
        assert {f.name: f.read_bytes() for f in (tmp_path / "tls").iterdir()} == tls_before
        assert (tmp_path / "cluster.toml").read_bytes() == config_before
        channel, stub = controller_stub(address, load_tls_dir(tmp_path / "tls"))
        with channel:
            snap = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=30)
        assert snap.status == pb.Snapshot.COMPLETE, snap
        pids = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]
        # the hosts' three processes and the page, which runs as a child of its own
        pages = [pid for pid in pids if b"\x00ui\x00" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(pids) == 4 and len(pages) == 1, pids
        # it holds D/cluster.pid as `cluster up` does: `cluster status/down --data-dir D` find it
        assert running_launcher(tmp_path) == proc.pid
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert running_launcher(tmp_path) is None
    finally:
        proc.kill()
        proc.wait()
    assert net.leftovers(run_id) == []
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


# ---------------------------------------------------------------- faults at the network layer


def test_partitions_both_ways_one_way_isolation_and_a_split_cut_exactly_what_they_say(hosts: HostsCluster) -> None:
    network, bench = hosts.network, hosts.plan
    assert network.reaches("p1", "p2") and network.reaches("p2", "p1")

    one_way = network.apply(bench.partition(["p1"], ["p2"], one_way=True))
    assert not network.reaches("p1", "p2")
    assert network.reaches("p2", "p1") and network.reaches("p1", "p3")
    network.heal(one_way)
    assert network.reaches("p1", "p2")

    isolated = network.apply(bench.isolate("p3", ["p1", "p2"]))
    assert not network.reaches("p3", "p1") and not network.reaches("p2", "p3")
    assert network.reaches("p3", "controller") and network.reaches("controller", "p3")
    network.heal(isolated)

    split = network.apply(bench.split(["p1"], ["controller", "p2", "p3"]))
    assert not network.reaches("p1", "controller") and not network.reaches("p3", "p1")
    assert network.reaches("p2", "p3")
    network.heal(split)
    assert network.reaches("p1", "controller") and network.reaches("p3", "p1")
    assert network.active == []


def test_a_bandwidth_limit_slows_the_hosts_link_and_lifting_it_restores_it(hosts: HostsCluster) -> None:
    network, size = hosts.network, 150_000  # bytes: 1.5 s at 800 kbit/s
    free = network.send_time("p2", "p3", size)
    limit = network.apply(hosts.plan.bandwidth("p2", 800))
    try:
        limited = network.send_time("p2", "p3", size)
        inbound = network.send_time("p3", "p2", size)
    finally:
        network.heal(limit)
    assert 1.2 < limited < 4.0 and 1.2 < inbound < 4.0, (free, limited, inbound)
    assert network.send_time("p2", "p3", size) < 0.5


def test_under_partitions_one_way_included_the_snapshots_hold_against_the_logs(hosts: HostsCluster) -> None:
    """Load and snapshots while the network is cut: a snapshot may FAIL then, never lie."""
    cluster, network, bench = hosts.cluster, hosts.network, hosts.plan
    faults = [bench.partition(["p1"], ["p2"], one_way=True), bench.partition(["p2"], ["p3"]),
              bench.isolate("p3", ["p1", "p2"]), bench.split(["p2"], ["controller", "p1", "p3"])]
    channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
    snapshots = []
    with channel, BackgroundLoad.for_cluster(cluster, interval=0.01, batch=5, timeout=2.0) as load:
        for fault in faults:
            network.apply(fault)
            snapshots.append(stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1"), timeout=10))
            time.sleep(1.0)
            network.heal(fault)
            done = wait_for(lambda: stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p2", wait=True), timeout=60),
                        until=lambda snap: snap.status == pb.Snapshot.COMPLETE, timeout=60)
            snapshots.append(done)
    assert load.stats.accepted > 0
    final = wait_for(lambda: stub_list(cluster), until=lambda snaps: all(s.status != pb.Snapshot.IN_PROGRESS for s in snaps))
    complete = [s for s in final if s.status == pb.Snapshot.COMPLETE]
    assert len(complete) >= len(faults)
    wait_for(lambda: money_check(read_logs(cluster.data_dir, cluster.node_ids))["unreceived"], until=lambda u: not u)
    report = check_against_logs(cluster, complete)
    assert report.transfers > 0 and sum(report.snapshots.values()) == len(complete)


def stub_list(cluster) -> list[pb.Snapshot]:
    channel, stub = controller_stub(cluster.controller_address, cluster.client_identity)
    with channel:
        return list(stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10).snapshots)


def test_a_link_set_to_n_ms_measures_n_ms_in_a_round_trip_probe(hosts: HostsCluster) -> None:
    """One way: p1's link at 10 ms gives p1 <-> p2 a 10 ms round trip; 5 ms on both links, 10 ms too."""
    network, bench, port = hosts.network, hosts.plan, 50051
    base = network.probe("p1", "p2", port)["median_ms"]
    assert base < 2.0
    slow = network.apply(bench.delay("p1", 10))
    try:
        one_link = network.probe("p1", "p2", port)
        assert 8.0 <= one_link["median_ms"] <= 12.0, one_link
        assert network.probe("p3", "p2", port)["median_ms"] < 2.0  # the other links are not delayed
        other = network.apply(bench.delay("p2", 5))
        network.heal(slow)
        slow = network.apply(bench.delay("p1", 5))
        both = network.probe("p2", "p1", port)
        assert 8.0 <= both["median_ms"] <= 12.0, both
        network.heal(other)
    finally:
        network.heal_all()
    assert network.probe("p1", "p2", port)["median_ms"] < 2.0
    assert "NFQUEUE" not in subprocess.run(hosts.cluster.nodes["p1"].host.command(["iptables", "-S"]),
                                           capture_output=True, text=True).stdout
