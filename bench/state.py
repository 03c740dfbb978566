"""A snapshot's cost against the size of the state and what changed: `python -m bench state`.

Two apps (`--apps`), each on a fresh 4-node mesh per size, N MiB of state per node:
  - blob (bench/blob_app.py): a blob of N MiB, changed as runs of 1 KiB at random
    offsets, 0.1% of the state (66 runs at 64 MiB, 1049 at 1 GiB; at least one);
  - kvshard (bench/kv_app.py: services/app/kvshard holding about N MiB of keys of
    1 KiB values, about 1000 keys a MiB): 0.1% of its keys (at least one), drawn at
    random, given new values of the same length.
Per app and size, in one run:
  1. a first snapshot (every block new to the controller);
  2. `--rounds` rounds (default 5) of: the change, by SubmitBatch to each node (in
     batches within the node's bounds), then a snapshot, an incremental one;
  3. a restore of the last.
A round's time is one sample on a shared machine (it swings by 1.3x from run to run):
the figures of time and CPU are the median round's, the bytes the largest round's.
Figures, `<n>` the size (`1mib`, `64mib`, `1024mib`), `<p>` the app's prefix
(`state_` for blob, `state_kv_` for kvshard):
  - <p>sent_fraction_<n>: the bytes the nodes' reports of an incremental snapshot sent
    (`snapmesh_report_sent_bytes_total`, as sent: the manifest and the new blocks)
    over the states' bytes (4 x N MiB);
  - <p>stored_fraction_<n>: what an incremental snapshot added to the controller's
    store (controller/blocks and controller/snapshots) over the states' bytes;
  - <p>export_fraction_<n>: what it added to the JSON exports (snapshots/);
  - <p>first_snapshot_s_<n>, <p>snapshot_s_<n>: trigger to COMPLETE, as the
    client sees it (TriggerSnapshot with `wait`), the first and the incremental
    one (the median round), and <p>snapshot_max_s_<n> the slowest round;
  - <p>hop_mean_ms_<hop>_<n>: where the incremental snapshots' time went, each hop
    of the path after a node's cut (snapmesh/protocol/hops.py) as its mean over
    the rounds' observations (bench/hop_split.py `hop_means`);
  - <p>restore_s_<n>: RestoreSnapshot of the last, called to RESTORED;
  - <p>restore_received_bytes_<n>: what the nodes received for that restore
    (`snapmesh_restore_received_bytes_total`: a state as blocks, its manifest and
    the blocks the node lacked);
  - <p>controller_peak_rss_mib_<n>: the controller's peak resident set over the
    whole run (VmHWM of its process, read after the restore), and
    <p>controller_rss_bound_mib_<n>, the goal's bound for it: 512 MiB plus one
    node's state (N);
  - <p>nodes_peak_rss_mib_<n>: the largest of the nodes' peak resident sets over
    the whole run (VmHWM, read after the restore): what a node needs beside its state;
  - <p>snapshot_controller_cpu_s_<n>, <p>snapshot_nodes_cpu_s_<n>: the CPU seconds
    the controller and the nodes (together) spent on an incremental snapshot, from the
    trigger to its files written and the nodes' report counters read (one /metrics scrape
    a node), the mean of the rounds: work, steadier than time on a shared machine; and
    <p>snapshot_controller_sys_cpu_s_<n>, <p>snapshot_nodes_sys_cpu_s_<n>, the part of
    each spent in the kernel (files, syncs, sockets);
  - <p>snapshot_s_64mib_over_1mib: the incremental snapshot's time at 64 MiB over 1 MiB.
Also printed: the bytes themselves, and the controller's own started_at..finished_at.
`--sizes 1,64,1024` picks the sizes (MiB); `--no-write` prints without writing
bench/results.json. A size whose snapshot or restore fails (or hangs: 10 minutes
and a second per MiB, per call) is named, the others still run and are written,
and the exit status is 1. `--smoke` (or `python -m bench --smoke state`): one mesh of
256 KiB states per app, to check the bench works, not to measure; it writes nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from bench import blob_app, hop_split, kv_app, smoke
from bench import results as bench_results
from bench import state_mesh as m
from bench.observe import cpu_parts_s
from bench.phases import own_argv
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RUN_BYTES = 1024  # one changed run of the blob
CHANGED = 0.001  # the share of each state (the blob's bytes, kvshard's keys) changed between the two snapshots
MAX_CHANGED = 0.5  # beyond half, "incremental" means little and kvshard's sample of keys nears all of them
RSS_ALLOWANCE_MIB = 512  # the controller's peak may be this plus one node's state (the goal)
# Incremental rounds per size: one snapshot's time on a shared 2-core machine swings by 1.3x or more,
# and the first round may still share the machine with the first snapshot's background work.
ROUNDS = 5


def blob_changes(node_id: str, mib: float, rng: random.Random, changed: float = CHANGED) -> list[bytes]:
    size = blob_app.size_of({"mib": mib})
    runs = max(1, round(size * changed / RUN_BYTES))
    return [blob_app.write(rng.randrange(size - RUN_BYTES), rng.randbytes(RUN_BYTES)) for _ in range(runs)]


def kv_changes(node_id: str, mib: float, rng: random.Random, changed: float = CHANGED) -> list[bytes]:
    count = kv_app.key_count(node_id, {"mib": mib})
    chosen = rng.sample(range(count), max(1, round(count * changed)))
    return [kv_app.put(kv_app.key(node_id, i), rng.randbytes(kv_app.VALUE_BYTES // 2).hex()) for i in chosen]


@dataclass(frozen=True)
class Subject:
    """An app the bench measures: what runs, how its figures are named, and its change."""

    app: str  # "module:attr"
    prefix: str  # of its figures
    changes: Callable[[str, float, random.Random, float], list[bytes]]  # (node id, MiB, rng, share) -> the commands


SUBJECTS = {
    "blob": Subject("bench.blob_app:app", "state_", blob_changes),
    "kvshard": Subject("bench.kv_app:app", "state_kv_", kv_changes),
}


def cpu(cluster) -> tuple[float, float, float, float]:
    """CPU seconds so far, user + system and system alone, of the controller and of the nodes together:
    work, which holds on a noisy machine."""
    controller = cpu_parts_s(cluster.controller_pid)
    nodes = [cpu_parts_s(cluster.node_pid(n)) for n in cluster.node_ids]
    return sum(controller), controller[1], sum(map(sum, nodes)), sum(system for _, system in nodes)


def rate_label(changed: float) -> str:
    """The suffix of a share's figures: none for the goal's 0.1%, else `_1pct`, `_0p5pct`."""
    if changed == CHANGED:
        return ""
    return "_" + f"{changed * 100:g}".replace(".", "p") + "pct"


def measure(subject: Subject, mib: float, seed: int = 0, rounds: int = ROUNDS,
            changed: float = CHANGED) -> dict[str, float]:
    total = m.NODES * blob_app.size_of({"mib": mib})  # kvshard's states are as large, to within a key
    label, p, timeout = m.label(mib) + rate_label(changed), subject.prefix, m.timeout_s(mib)
    rng = random.Random(f"bench-state-{seed}-{mib}" + rate_label(changed))
    taken: list[Round] = []
    with m.mesh(subject.app, mib) as (cluster, data):
        channel = grpc.insecure_channel(cluster.controller_address, options=CLIENT_OPTIONS)
        stub = pb_grpc.ControllerStub(channel)
        try:
            first, first_s, first_sent = m.snapshot(cluster, stub, data, {}, timeout)
            hops_before = hop_split.read_hops(hop_split.addresses(cluster))
            for _ in range(rounds):
                taken.append(incremental(subject, cluster, stub, data, mib, rng, timeout, changed))
            hops = hop_split.hop_means(hops_before, hop_split.read_hops(hop_split.addresses(cluster)))
            last = taken[-1].snapshot
            restore_s, restore_received = m.restore(cluster, stub, last.snapshot_id, timeout)
            peak_rss = m.peak_rss_mib(cluster.controller_pid)
            nodes_peak = max(m.peak_rss_mib(cluster.node_pid(n)) for n in cluster.node_ids)
        finally:
            channel.close()
    bound = RSS_ALLOWANCE_MIB + mib
    times = [r.seconds for r in taken]
    typical = taken[times.index(statistics.median_low(times))]  # a round's own figures, the median one's
    sent, stored, exported = (max(getattr(r, f) for r in taken) for f in ("sent", "stored", "exported"))
    print(f"{p}{label}: first snapshot {first_s:.2f}s sent {first_sent:,.0f} B; then {rounds} rounds of "
          f"{typical.changed} changes and a snapshot: "
          + ", ".join(f"{r.seconds:.3f}s" for r in taken)
          + f" (median {typical.seconds:.3f}s: controller {typical.controller_s:.3f}s; CPU a round, mean: controller "
          f"{statistics.fmean(r.controller_cpu for r in taken):.3f}s, nodes "
          f"{statistics.fmean(r.nodes_cpu for r in taken):.3f}s); at most sent {sent:,.0f} B, stored "
          f"+{stored:,} B, exports +{exported:,} B a round; hops (mean ms) "
          + ", ".join(f"{hop} {ms:.1f}" for hop, ms in hops.items())
          + f"; restore {restore_s:.2f}s received {restore_received:,.0f} B; controller peak RSS {peak_rss:,.0f} MiB "
          f"(goal: under {bound:,.0f}); largest node peak RSS {nodes_peak:,.0f} MiB; states {total:,} B", flush=True)
    return {
        f"{p}sent_fraction_{label}": sent / total,
        f"{p}stored_fraction_{label}": stored / total,
        f"{p}export_fraction_{label}": exported / total,
        f"{p}first_snapshot_s_{label}": first_s,
        f"{p}snapshot_s_{label}": typical.seconds,
        f"{p}snapshot_max_s_{label}": max(times),
        # CPU: the mean of every round, as one round is a few of /proc's 10 ms ticks
        **{f"{p}snapshot_{figure}_s_{label}": statistics.fmean(getattr(r, figure) for r in taken)
           for figure in ("controller_cpu", "nodes_cpu", "controller_sys_cpu", "nodes_sys_cpu")},
        f"{p}restore_s_{label}": restore_s,
        f"{p}sent_bytes_{label}": float(sent),
        f"{p}stored_bytes_{label}": float(stored),
        f"{p}restore_received_bytes_{label}": float(restore_received),
        f"{p}controller_peak_rss_mib_{label}": peak_rss,
        f"{p}controller_rss_bound_mib_{label}": float(bound),
        f"{p}nodes_peak_rss_mib_{label}": nodes_peak,
        **{f"{p}hop_mean_ms_{hop}_{label}": ms for hop, ms in hops.items()},
    }


@dataclass(frozen=True)
class Round:
    """One incremental round: the change made, then the snapshot taken, and what each cost."""

    snapshot: pb.Snapshot
    changed: int  # commands
    seconds: float  # trigger to COMPLETE, as the client sees it
    controller_s: float  # the controller's own started_at..finished_at
    controller_cpu: float
    nodes_cpu: float
    controller_sys_cpu: float  # of controller_cpu, in the kernel: files, syncs, sockets
    nodes_sys_cpu: float
    sent: float  # bytes the nodes' reports sent
    stored: int  # bytes added to the controller's store
    exported: int  # bytes added to the JSON exports


def incremental(subject: Subject, cluster, stub, data, mib: float, rng: random.Random, timeout: float,
                changed_share: float = CHANGED) -> Round:
    """A change of `changed_share` of every node's state, then a snapshot (after the first one: incremental)."""
    store = (data / "controller" / "blocks", data / "controller" / "snapshots")
    stored, exported = m.bytes_under(*store), m.bytes_under(data / "snapshots")
    sent_before = m.counter(cluster, m.SENT)
    changed = 0
    for node in cluster.config.nodes:
        commands = subject.changes(node.id, mib, rng, changed_share)
        changed += len(commands)
        m.submit(cluster, node.id, commands, timeout)
    cpu_before = cpu(cluster)
    snapshot, seconds, sent = m.snapshot(cluster, stub, data, sent_before, timeout)
    controller_cpu, controller_sys, nodes_cpu, nodes_sys = (
        after - before for after, before in zip(cpu(cluster), cpu_before, strict=True))
    controller_s = snapshot.finished_at.ToNanoseconds() / 1e9 - snapshot.started_at.ToNanoseconds() / 1e9
    return Round(snapshot, changed, seconds, controller_s, controller_cpu, nodes_cpu, controller_sys, nodes_sys, sent,
                 m.bytes_under(*store) - stored, m.bytes_under(data / "snapshots") - exported)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench state", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,64", help="MiB per node, comma-separated (default: 1,64)")
    parser.add_argument("--apps", default="blob,kvshard",
                        help=f"the apps, comma-separated, of {', '.join(SUBJECTS)} (default: blob,kvshard)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"incremental rounds (change, snapshot) per size (default: {ROUNDS}; the median is the figure)")
    parser.add_argument("--changed", default=str(CHANGED),
                        help=f"the shares of each state changed between snapshots, comma-separated (default: {CHANGED}; "
                             f"others add _<pct>pct to the figures' names)")
    parser.add_argument("--no-write", action="store_true", help="print the figures, leave bench/results.json")
    parser.add_argument("--smoke", action="store_true",
                        help="256 KiB per node, nothing written: does it run (as `python -m bench --smoke state`)")
    args = parser.parse_args(own_argv("state", argv))
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds}: at least one incremental round is needed")
    if args.smoke:
        os.environ[smoke.ENV] = "1"  # results.merge then writes nothing
    apps = [a for a in args.apps.split(",") if a]
    unknown = [a for a in apps if a not in SUBJECTS]
    if unknown:
        parser.error(f"--apps: no app {unknown[0]!r}; the apps are {', '.join(SUBJECTS)}")
    sizes = [0.25] if smoke.on() else [float(s) for s in args.sizes.split(",") if s]
    try:
        shares = [float(c) for c in args.changed.split(",") if c]
    except ValueError:
        parser.error(f"--changed: {args.changed!r}: not comma-separated numbers")
    bad = [c for c in shares if not 0 < c <= MAX_CHANGED]
    if bad or not shares:
        parser.error(f"--changed: {bad[0] if bad else args.changed!r}: a share must be over 0 and at most {MAX_CHANGED}")
    out: dict[str, float] = {}
    failed = []
    for name in apps:
        for mib in sizes:
            for share in shares:
                try:
                    out.update(measure(SUBJECTS[name], mib, rounds=args.rounds, changed=share))
                except (RuntimeError, OSError, grpc.RpcError) as exc:  # a node that died, a hang: the others still run
                    failed.append(f"{name} at {mib:g} MiB, {share:g} changed: {exc}")
                    print(f"FAILED {failed[-1]}", flush=True)
        p = SUBJECTS[name].prefix
        if f"{p}snapshot_s_64mib" in out and f"{p}snapshot_s_1mib" in out:
            out[f"{p}snapshot_s_64mib_over_1mib"] = out[f"{p}snapshot_s_64mib"] / out[f"{p}snapshot_s_1mib"]
    for name, value in out.items():
        print(f"{name:<44} {value:>14,.4f}")
    if out and not args.no_write:
        bench_results.merge(out)
    print("caveat: one run on a shared machine; compare figures within one run, not across runs.")
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
