"""Where the hosts cluster's CPU goes while snapshots run: `python -m bench.hosts_cpu`.

The phase on hosts (bench.hosts: 8 nodes, one host each, 5 ms one way on every
link) is paced to a measured busy fraction of the whole machine. Which process
that busy time belongs to is what this prints: per window (an offered transfer
rate, snapshots on or off), each process group's CPU (user + system, from
/proc/<pid>/stat, so it holds on a machine other work shares: wall-clock latency
would not) as a share of one core, its system part, and its CPU per snapshot;
and the packets the delayers held per snapshot (their NFQUEUE rule's counter), and
the kernel's threads' CPU over the window (machine-wide: ksoftirqd, kworker, jbd2); and
per snapshot and node, the nodes' log rounds and records, frames sent and markers
received (their metrics).
The groups: the controller, the nodes (each), the delayers (one per host: the
testbed's links, a cost real hosts do not pay), the load generator, this process.

    python -m bench.hosts_cpu [--mode classic] [--rates 0 200 2000] [--every 0.25] [--window 8]

`--every` starts a snapshot every this many seconds (default: the hosts_util
phase's, bench.hosts.UTIL_SNAPSHOT_EVERY_S; 0: back to back); each rate is
measured with snapshots, then rate 0 without. Root (network namespaces), as the
phase on hosts; everything it starts is removed at the end, on a failure too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Proc:
    group: str  # controller, node, delayer, loadgen, bench
    name: str  # the group, or "node p3"
    user_s: float
    system_s: float


def role(argv: list[str]) -> tuple[str, str]:
    """(group, name) of a process of the run, from its command line."""
    text = " ".join(argv)
    if "snapmesh.hosts.delayer" in text:
        return "delayer", "delayer"
    if "bench.loadgen" in text:
        return "loadgen", "loadgen"
    if "snapmesh.cli" in argv:
        if "node" in argv and "--id" in argv[:-1]:
            return "node", f"node {argv[argv.index('--id') + 1]}"
        if "controller" in argv:
            return "controller", "controller"
    return "bench", "bench"


def _stat_fields(pid: int) -> list[str]:
    # after the command name, which may hold spaces and parentheses
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(root: int) -> list[int]:
    """`root` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat_fields(int(entry))[1]), []).append(int(entry))
            except (OSError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def read(pids: Iterable[int]) -> dict[int, Proc]:
    """Each live process's group and CPU so far (utime, stime: fields 14 and 15 of stat)."""
    out = {}
    for pid in pids:
        try:
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
            fields = _stat_fields(pid)
        except OSError:
            continue  # gone meanwhile
        group, name = role(argv)
        out[pid] = Proc(group, name, int(fields[11]) / TICKS, int(fields[12]) / TICKS)
    return out


def split(before: dict[int, Proc], after: dict[int, Proc], seconds: float,
          snapshots: int) -> dict[str, dict[str, float]]:
    """Per group between two reads: `core` (CPU over the window, 1.0 = one core), `system`
    (its kernel part), `ms_per_snapshot` (nan without snapshots), `processes`."""
    groups: dict[str, dict[str, float]] = {}
    for pid, proc in after.items():
        start = before.get(pid, Proc(proc.group, proc.name, 0.0, 0.0))
        user, system = proc.user_s - start.user_s, proc.system_s - start.system_s
        g = groups.setdefault(proc.group, {"cpu_s": 0.0, "system_s": 0.0, "processes": 0})
        g["cpu_s"] += user + system
        g["system_s"] += system
        g["processes"] += 1
    return {name: {"core": g["cpu_s"] / seconds, "system": g["system_s"] / seconds,
                   "ms_per_snapshot": g["cpu_s"] * 1e3 / snapshots if snapshots else float("nan"),
                   "processes": g["processes"]} for name, g in groups.items()}


def lines(label: str, groups: dict[str, dict[str, float]], cores: int) -> list[str]:
    ours = sum(g["core"] for g in groups.values())
    out = [f"{label}: ours {ours / cores:.2f} of the machine ({ours:.2f} cores)"]
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["core"]):
        per = f", {g['ms_per_snapshot']:.1f} ms per snapshot" if g["ms_per_snapshot"] == g["ms_per_snapshot"] else ""
        out.append(f"  {name:<10} x{g['processes']:<2.0f} {g['core']:6.1%} of a core (system {g['system']:5.1%}){per}")
    return out


def kernel_threads() -> dict[str, float]:
    """CPU seconds so far of the kernel's threads (kthreadd's children), by name up to its
    first "/" or digit run (ksoftirqd, kworker, jbd2, ...): the whole machine's, other work's too."""
    out: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if fields[1] != "2":
            continue
        name = text[text.index("(") + 1:text.rindex(")")].split("/")[0].rstrip("0123456789:-.")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


def kernel_line(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    top = sorted((kv for kv in spent.items() if kv[1] > 0), key=lambda kv: -kv[1])[:4]
    return (f"  kernel threads, machine-wide (other work's too): {sum(spent.values()) / seconds:.1%} of a core"
            + (f" ({', '.join(f'{k} {v / seconds:.1%}' for k, v in top)})" if top else ""))


def delayed_packets(namespaces: Iterable[str]) -> int:
    """Packets the delayers' NFQUEUE rules sent to them so far, over every host."""
    total = 0
    for ns in namespaces:
        text = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-w", "-L", "OUTPUT", "-v", "-n", "-x"],
                              capture_output=True, text=True, check=False).stdout
        total += sum(int(line.split()[0]) for line in text.splitlines() if "NFQUEUE" in line)
    return total


# What a node does per snapshot, from its own metrics (docs/metrics.md), summed over the nodes.
COUNTED = (("snapmesh_log_fsync_seconds_count", "log rounds"), ("snapmesh_log_committed_records_total", "log records"),
           ("snapmesh_channel_frames_sent_total", "frames sent"), ("snapmesh_markers_received_total", "markers in"))


def node_counts(addresses: Iterable[str]) -> dict[str, float]:
    """The counters of COUNTED so far, summed over the metrics endpoints of the nodes."""
    from snapmesh.checking.scrape import sums

    out = dict.fromkeys((name for name, _ in COUNTED), 0.0)
    for address in addresses:
        for name, value in sums(address).items():
            if name in out:
                out[name] += value
    return out


def counts_line(before: dict[str, float], after: dict[str, float], snapshots: int, nodes: int) -> str:
    """Per snapshot and node, what each counter of COUNTED gained between two reads."""
    return "  per snapshot and node: " + ", ".join(
        f"{label} {(after[name] - before[name]) / snapshots / nodes:.1f}" for name, label in COUNTED)


def main(argv: list[str] | None = None) -> int:
    from bench import hop_split, hosts
    from bench.calls import INITIAL_BALANCE, latency_run, paced_callers
    from bench.loadgen import LoadGen
    from snapmesh.hosts.cluster import HostsCluster
    from snapmesh.hosts.net import missing_rights

    parser = argparse.ArgumentParser(prog="python -m bench.hosts_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=hosts.MODES, default="classic", help="snapshot mode (default classic)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 200.0, 2000.0],
                        help="offered transfers/s, one window each with snapshots (default 0 200 2000)")
    parser.add_argument("--every", type=float, default=hosts.UTIL_SNAPSHOT_EVERY_S,
                        help=f"seconds between snapshot starts, 0: back to back (default {hosts.UTIL_SNAPSHOT_EVERY_S})")
    parser.add_argument("--window", type=float, default=8.0, help="seconds per window (default 8)")
    args = parser.parse_args(argv)
    if problem := missing_rights():
        print(f"bench hosts_cpu: {problem}", file=sys.stderr)
        return 2
    import grpc

    from snapmesh.serving.runtime import CLIENT_OPTIONS
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="snapmesh-bench-hosts-cpu-") as tmp:
        cluster = HostsCluster(Path(tmp), nodes=hosts.NODES, deadline=hosts.DEADLINE_S,
                               initial_balance=INITIAL_BALANCE, snapshot_mode=args.mode, startup_timeout=120)
        loadgen = channel = None
        try:
            cluster.start()
            for host in cluster.plan.hosts:
                cluster.network.apply(cluster.plan.delay(host.name, hosts.DELAY_MS))
            namespaces = [h.namespace for h in cluster.plan.hosts]
            node_metrics = hop_split.addresses(cluster.cluster)[:-1]  # the controller's is the last
            loadgen = LoadGen(cluster.cluster, batch=hosts.BATCH, seed=hosts.NODES)
            channel = grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS)
            stub = pb_grpc.ControllerStub(channel)
            latency_run(stub, 3, 10.0, {})  # every channel and stream up before the first window
            for rate, snapshots in [*((r, True) for r in args.rates), (0.0, False)]:
                loadgen.set(paced_callers(hosts.NODES) if rate else 0, rate=rate)
                time.sleep(hosts.SETTLE_S)
                packets, kernel, counted = delayed_packets(namespaces), kernel_threads(), node_counts(node_metrics)
                before, at = read(descendants(os.getpid())), time.perf_counter()
                taken = 0
                if snapshots:
                    client, _, failed, _ = latency_run(stub, 10**6, args.window, {}, every_s=args.every)
                    taken = len(client) + failed
                else:
                    time.sleep(args.window)
                seconds = time.perf_counter() - at
                groups = split(before, read(descendants(os.getpid())), seconds, taken)
                label = (f"{args.mode}, {rate:,.0f} transfers/s, "
                         + (f"{taken / seconds:.1f} snapshots/s" if snapshots else "no snapshots"))
                print("\n".join([*lines(label, groups, cores), kernel_line(kernel, kernel_threads(), seconds)]))
                if taken:
                    print(f"  packets through the delayers: {(delayed_packets(namespaces) - packets) / taken:.0f} "
                          "per snapshot", flush=True)
                    print(counts_line(counted, node_counts(node_metrics), taken, len(node_metrics)), flush=True)
            loadgen.set(0)
        finally:
            if channel is not None:
                channel.close()
            if loadgen is not None:
                loadgen.close()
            if left := cluster.stop():
                print(f"left behind: {', '.join(left)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
