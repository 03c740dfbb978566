"""The bank natively (commit 2b5e557's node) and as an app (today's), in one run:
`python -m bench bank_pair`.

Two 4-node meshes, up side by side for the whole run:
  - native: the baseline, commit 2b5e557's node with its own int64 bank (the path since
    deleted), checked out in a temporary detached worktree (removed at the end, even on
    failure), its generated code made by its own protogen, its nodes started by its own
    supervisor with PYTHONPATH at that tree (bench/base_tree.py); driven by `TransferBatch`
    calls of `--batch` transfers (amount 1, round-robin to the peers);
  - generic: today's code, a cluster file with `[app] module = "snapmesh.services.app.bank:app"`,
    driven by `SubmitBatch` calls of as many of the bank app's compact commands
    (b"1 p2": pay 1 to p2, what the v1 edge plug-in snapmesh/bank/edge.py sends for a
    transfer; bench/submit_batch.py measures its JSON form).
A clone without that commit (a shallow one) says so and falls back to today's v1 edge on
the native side (TransferBatch into the bank app): the ratios then compare the edge with
SubmitBatch, not with the native bank, and are printed under that name, never written.
The same closed-loop callers (`bench.submit_batch.drive`) load one mesh at a time, the
two taking turns for `--rounds` windows each (native, generic, native, ...), so a
neighbour's burst on this shared machine lands on both sides of a pair. Per round,
the generic window's rate and whole-machine CPU per command over the native
window's just before it; the figures are the medians over the rounds:
  - bank_generic_over_native_rate_4n: the generic bank's rate over the native bank's;
  - bank_generic_over_native_cpu_4n: its CPU per command over the native's (lower is better).
Also printed: each side's median rate and CPU per command, and the nodes' own CPU per
command (no client), whose ratio is what the server code changed.
`--smoke` runs one short round at small batches: it checks the bench works.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench import base_tree, smoke
from bench import results as bench_results
from bench import submit_batch
from bench.phases import own_argv
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb

INITIAL_BALANCE = 10**15  # no transfer is refused for want of money over a run
BASE = "2b5e557"  # the last node with its own int64 bank: the native side


@contextlib.contextmanager
def _mesh(generic: bool) -> Iterator[Cluster]:
    """A fresh 4-node mesh of today's code: the bank as an app, `[app]` named (generic) or by
    default behind the v1 edge (the fallback native side)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-bank-pair-{'generic' if generic else 'native'}-") as tmp:
        root = Path(tmp)
        path = write_cluster(root / "cluster.toml", nodes=submit_batch.NODES, topology="mesh",
                             data_dir=root / "data", initial_balance=INITIAL_BALANCE)
        spec = submit_batch.APPS["bank"][0]
        if generic:
            path.write_text(path.read_text() + f'\n[app]\nmodule = "{spec}"\ninitial_balance = {INITIAL_BALANCE}\n')
        cluster = Cluster(path, app=spec if generic else None).start()
        try:
            yield cluster
        finally:
            cluster.stop()


def _peers(cluster) -> dict[str, list[str]]:
    """Each node's outgoing peers: the base tree's cluster names them (base_tree.cluster)."""
    if hasattr(cluster, "peers"):
        return cluster.peers
    return {n.id: sorted(cluster.config.topology.outgoing(n.id)) for n in cluster.config.nodes}


def _native(cluster, *, callers: int, batch: int, warmup_s: float, seconds: float) -> dict[str, float]:
    outgoing = _peers(cluster)
    requests = {}
    for node in cluster.config.nodes:
        peers = outgoing[node.id]
        requests[node.id] = pb.TransferBatchRequest(
            transfers=[pb.TransferRequest(to=peers[i % len(peers)], amount=1) for i in range(batch)])

    async def send(stub, node: str) -> tuple[int, int]:
        response = await stub.TransferBatch(requests[node], timeout=60)
        return len(response.results), sum(1 for r in response.results if r.code)

    return asyncio.run(submit_batch.drive(cluster, callers, send, warmup_s, seconds))


def _generic(cluster: Cluster, *, callers: int, batch: int, warmup_s: float, seconds: float) -> dict[str, float]:
    topology = cluster.config.topology
    requests = {}
    for node in cluster.config.nodes:
        peers = sorted(topology.outgoing(node.id))
        requests[node.id] = pb.SubmitBatchRequest(
            items=[pb.SubmitRequest(command=b"1 " + peers[i % len(peers)].encode()) for i in range(batch)])

    async def send(stub, node: str) -> tuple[int, int]:
        response = await stub.SubmitBatch(requests[node], timeout=60)
        return len(response.results), sum(1 for r in response.results if r.code)

    return asyncio.run(submit_batch.drive(cluster, callers, send, warmup_s, seconds))


@contextlib.contextmanager
def _native_mesh(base: str | None) -> Iterator:
    """`base`'s nodes (module doc), or today's v1 edge when None."""
    if base is None:
        with _mesh(generic=False) as cluster:
            yield cluster
        return
    with base_tree.checkout(base) as tree, base_tree.cluster(tree, nodes=submit_batch.NODES,
                                                             initial_balance=INITIAL_BALANCE) as cluster:
        yield cluster


def pair(*, rounds: int, callers: int, batch: int, warmup_s: float, seconds: float,
         base: str | None = BASE) -> dict[str, float]:
    """The figures of `rounds` alternating native/generic windows (module doc); `base`: the
    commit whose node is the native side (None: today's v1 edge)."""
    sides: dict[str, list[dict[str, float]]] = {"native": [], "generic": []}
    with _native_mesh(base) as native, _mesh(generic=True) as generic:
        for _ in range(rounds):
            sides["native"].append(_native(native, callers=callers, batch=batch, warmup_s=warmup_s, seconds=seconds))
            sides["generic"].append(_generic(generic, callers=callers, batch=batch, warmup_s=warmup_s,
                                             seconds=seconds))

    def ratio(key: str) -> float:
        return statistics.median(g[key] / max(n[key], 1e-9) for n, g in zip(sides["native"], sides["generic"], strict=True))

    out = {
        "bank_generic_over_native_rate_4n": ratio("rate"),
        "bank_generic_over_native_cpu_4n": ratio("cpu_us_per_command"),
        "bank_generic_over_native_nodes_cpu_4n": ratio("nodes_cpu_us_per_command"),
    }
    for side, windows in sides.items():
        for key in ("rate", "cpu_us_per_command", "nodes_cpu_us_per_command", "refused"):
            out[f"bank_pair_{side}_{key}"] = statistics.median(w[key] for w in windows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench bank_pair", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="native/generic window pairs (default: 3)")
    parser.add_argument("--callers", type=int, default=8, help="concurrent closed-loop callers (default: 8)")
    parser.add_argument("--batch", type=int, default=1000, help="transfers or commands per call (default: 1000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each measured window (default: 10)")
    parser.add_argument("--base", default=BASE, help=f"the commit whose node is native (default: {BASE})")
    parser.add_argument("--smoke", action="store_true", help="one short round, small batches: does it run")
    parser.add_argument("--no-write", action="store_true", help="print, do not merge into bench/results.json")
    args = parser.parse_args(own_argv("bank_pair", argv))
    args.smoke = args.smoke or smoke.on()
    if args.smoke:
        args.rounds, args.callers, args.batch, args.seconds = 1, 4, 100, 1.0
    base: str | None = args.base
    if not base_tree.has_commit(base):
        print(f"!! commit {base} is not in this clone (a shallow clone?): the native side is today's v1 edge "
              "(TransferBatch into the bank app), not the native bank; nothing is written")
        base, args.no_write = None, True
    figures = pair(rounds=args.rounds, callers=args.callers, batch=args.batch,
                   warmup_s=0.5 if args.smoke else 3.0, seconds=args.seconds, base=base)
    native = f"commit {base}'s native bank" if base else "today's v1 edge, NOT the native bank"
    print(f"-- the bank, native ({native}, TransferBatch) and generic (SubmitBatch): {args.rounds} alternating "
          f"rounds, {args.callers} callers, {args.batch} a call")
    for name, value in figures.items():
        print(f"{name:<44} {value:>14,.3f}")
    keys = ("bank_generic_over_native_rate_4n", "bank_generic_over_native_cpu_4n")
    if not args.no_write and not args.smoke:
        bench_results.merge({k: figures[k] for k in keys})
    print("caveat: a shared, noisy machine; the ratios pair windows of one run, compare those.")
    refused = figures["bank_pair_native_refused"] + figures["bank_pair_generic_refused"]
    return 0 if refused == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
