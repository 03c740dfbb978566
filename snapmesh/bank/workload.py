"""The bank workload: money moves between nodes while snapshots are taken.

Every `transfer_interval` each node pays a random 1..`max_amount` to a random
node it has a channel to: the bank app's workload, sent through `SubmitBatch`
by the project's one load generator (`snapmesh.load.generator`);
every `snapshot_every` seconds a random node starts a snapshot; after
`duration` seconds it waits for the snapshots still running and prints a
summary. The seed draws every choice, so a seed replays the same requests
(the cluster's timing still varies).

Use it in-process: `run_workload("127.0.0.1:50050", WorkloadParams(seed=1))`
returns a `Summary`; `summary.exit_code` is 0 when every snapshot finished and
was conserved, 1 otherwise. `ControllerUnreachable` when the controller does
not answer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import grpc

from snapmesh.settings import security
from snapmesh.serving import credentials
from snapmesh.bank.render import progress_line, snapshot_table
from snapmesh.load.generator import LoadGenerator
from snapmesh.services.app import bank
from snapmesh.services.app.drive import node_infos
from snapmesh.serving.runtime import CLIENT_OPTIONS
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 5.0
BURST_WAVES, BURST_SPREAD_S = 5, 0.05  # a burst: 5 SubmitBatch calls per node over 50 ms


class ControllerUnreachable(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadParams:
    duration: float = 10.0
    transfer_interval: float = 0.1
    snapshot_every: float = 2.0  # 0: no snapshots
    seed: int | None = None  # None: a random seed, printed
    max_amount: int = 100
    report_every: float = 1.0  # one progress line per this many seconds
    snapshot_timeout: float = 60.0  # how long to wait for one snapshot to finish
    # Transfers each node sends (SubmitBatch calls, in waves) as each snapshot is triggered (0: none):
    # the channels are busy while the markers cross them, so the cut records money in flight.
    burst: int = 0
    # After `duration`, if no COMPLETE snapshot recorded money in flight, up to this many more
    # snapshots (each with its burst), one after another, until one does (0: none). Whether a
    # cut finds money on a channel is a race with the network; the demo wants to show one.
    in_flight_tries: int = 0

    def check(self) -> None:
        if self.burst < 0:
            raise ValueError(f"burst must be >= 0, got {self.burst}")
        if self.in_flight_tries < 0:
            raise ValueError(f"in_flight_tries must be >= 0, got {self.in_flight_tries}")
        for name in ("duration", "transfer_interval", "report_every", "snapshot_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, got {self.snapshot_every}")
        if self.max_amount < 1:
            raise ValueError(f"max_amount must be >= 1, got {self.max_amount}")


@dataclass(slots=True)
class Summary:
    seed: int
    elapsed_s: float = 0.0
    transfers_made: int = 0
    transfers_refused: int = 0  # insufficient funds (FAILED_PRECONDITION): expected now and then
    transfers_failed: int = 0  # any other error (a node down, a timeout)
    moved: int = 0
    burst_made: int = 0  # of which sent in the bursts at each trigger (WorkloadParams.burst)
    snapshots: list[pb.Snapshot] = field(default_factory=list)  # finished, in finishing order
    snapshot_errors: list[str] = field(default_factory=list)  # triggers that got no finished snapshot

    @property
    def complete(self) -> list[pb.Snapshot]:
        return [s for s in self.snapshots if s.status == pb.Snapshot.COMPLETE]

    @property
    def failed(self) -> list[pb.Snapshot]:
        return [s for s in self.snapshots if s.status != pb.Snapshot.COMPLETE]

    @property
    def all_conserved(self) -> bool:
        return not self.failed and not self.snapshot_errors and all(s.conserved for s in self.snapshots)

    @property
    def exit_code(self) -> int:
        return 0 if self.all_conserved else 1


def money_in_flight(snapshot: pb.Snapshot) -> tuple[int, int]:
    """(transfers, amount) a snapshot recorded on its channels."""
    transfers = [t for c in snapshot.channels for t in c.in_flight]
    return len(transfers), sum(t.amount for t in transfers)


def summary_lines(summary: Summary) -> list[str]:
    complete, failed = summary.complete, summary.failed
    violated = [s for s in complete if not s.conserved]
    lines = [
        "",
        f"summary (seed {summary.seed}, {summary.elapsed_s:.1f}s):",
        f"  transfers: {summary.transfers_made} made, {summary.transfers_refused} refused (insufficient funds), "
        f"{summary.transfers_failed} failed; {summary.moved} moved"
        + (f" ({summary.burst_made} made in the bursts as snapshots started)" if summary.burst_made else ""),
        f"  snapshots: {len(complete)} complete ({len(complete) - len(violated)} conserved, "
        f"{len(violated)} violated), {len(failed)} failed, {len(summary.snapshot_errors)} not finished",
    ]
    for snapshot in failed:
        lines.append(f"    FAILED {snapshot.snapshot_id}: {snapshot.reason}")
    for snapshot in violated:
        lines.append(f"    VIOLATED {snapshot.snapshot_id}: {snapshot.reason}")
    for error in summary.snapshot_errors:
        lines.append(f"    NOT FINISHED {error}")
    lines.append(f"  all snapshots conserved: {'yes' if summary.all_conserved else 'NO'}")
    return lines


def run_workload(
    controller_address: str,
    params: WorkloadParams,
    out: TextIO | None = None,
    identity: security.Identity | None = None,  # a TLS cluster's client identity; None: plaintext
) -> Summary:
    return asyncio.run(workload(controller_address, params, out=out or sys.stdout, identity=identity))


async def workload(
    controller_address: str, params: WorkloadParams, out: TextIO, identity: security.Identity | None = None
) -> Summary:
    params.check()
    seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    summary = Summary(seed=seed)

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    async with credentials.open_channel(controller_address, identity, options=CLIENT_OPTIONS, aio=True) as controller_channel:
        controller = pb_grpc.ControllerStub(controller_channel)
        try:
            cluster = await controller.GetCluster(pb.GetClusterRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            from snapmesh.commands.client_errors import explain

            raise ControllerUnreachable(
                f"cannot reach the controller at {controller_address}: {explain(error, controller_address, identity)}"
            ) from None
        node_ids = [n.node_id for n in cluster.nodes]
        neighbours = {n: [c.dst for c in cluster.channels if c.src == n] for n in node_ids}
        say(
            f"bank workload: seed {seed} (rerun with --seed {seed}); {len(node_ids)} nodes, "
            f"{len(cluster.channels)} channels; every {params.transfer_interval:g}s each node pays "
            f"1..{params.max_amount}; a snapshot every {params.snapshot_every:g}s; {params.duration:g}s in all"
        )
        targets = {n.node_id: n.address for n in cluster.nodes}
        channels = {
            node: credentials.open_channel(address, identity, options=CLIENT_OPTIONS, aio=True)
            for node, address in targets.items()
        }
        stubs = {node: pb_grpc.NodeStub(ch) for node, ch in channels.items()}
        infos = node_infos(node_ids, [(c.src, c.dst) for c in cluster.channels], {"max_amount": params.max_amount})
        moved = [0]  # the money in the transfers answered: the load counts commands, not money

        def paid(node: str, command: bytes, reply: bytes | None, status: str) -> None:
            if reply is not None:
                moved[0] += json.loads(command)["amount"]

        load = LoadGenerator(bank.app, targets, infos, batch=1, seed=seed, timeout=RPC_TIMEOUT_S, identity=identity,
                             on_error=lambda message: say(f"  ! {message}"), on_answer=paid)
        stop = asyncio.Event()
        handled = _stop_on_signals(stop)
        try:
            async with load:
                await load.set(callers=1, interval=params.transfer_interval)
                await _run(params, rng, summary, controller, stubs, neighbours, load, moved, say, stop)
        finally:
            for sig in handled:
                asyncio.get_running_loop().remove_signal_handler(sig)
            for ch in channels.values():
                await ch.close()
    for line in summary_lines(summary):
        say(line)
    return summary


def _stop_on_signals(stop: asyncio.Event) -> list[signal.Signals]:
    """SIGINT/SIGTERM end the workload early, still with its summary. Only the main
    thread can handle signals; run elsewhere (in tests), the caller stops it."""
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (ValueError, RuntimeError):
            break
        handled.append(sig)
    return handled


async def _run(params, rng, summary, controller, stubs, neighbours, load: LoadGenerator, moved: list[int], say,
               stop: asyncio.Event) -> None:
    node_ids = list(stubs)
    snapshot_tasks: list[asyncio.Task[None]] = []

    burst_made = [0]  # transfers made in the bursts: the load counts them with its own, shown apart too
    drawn = itertools.count()  # the bursts' request ids

    def count() -> tuple[int, int, int]:
        stats = load.stats
        # Refused: insufficient funds, the bank's expected refusal; any other refusal, and a
        # transfer given up on, failed.
        funds = stats.refusals("FAILED_PRECONDITION")
        summary.transfers_made, summary.transfers_refused = stats.accepted, funds
        summary.transfers_failed = stats.refused - funds + stats.failed
        summary.moved, summary.burst_made = moved[0], burst_made[0]
        return summary.transfers_made, summary.transfers_refused, summary.transfers_failed

    async def burst(node: str, transfers: list[tuple[str, bytes]]) -> None:
        # In waves over BURST_SPREAD_S: the trigger takes a few ms to reach the initiator and
        # its markers a few more to reach the others; transfers sent all along that window
        # are the ones a cut finds in flight.
        size = max(1, -(-len(transfers) // BURST_WAVES))
        for start in range(0, len(transfers), size):
            if start:
                await asyncio.sleep(BURST_SPREAD_S / BURST_WAVES)
            results = await load.submit_batch(node, transfers[start : start + size])
            burst_made[0] += sum(result is not None for result in results)

    async def snapshot(initiator: str) -> None:
        # The burst's transfers are drawn before anything is sent: the seed replays them.
        bursts = {
            node: [(f"{load.prefix}-burst-{next(drawn)}",
                    json.dumps({"to": rng.choice(neighbours[node]), "amount": rng.randint(1, params.max_amount)}).encode())
                   for _ in range(params.burst)]
            for node in node_ids if params.burst and neighbours[node]
        }
        sent = [asyncio.create_task(burst(node, requests)) for node, requests in bursts.items()]
        try:
            result = await controller.TriggerSnapshot(
                pb.TriggerSnapshotRequest(initiator=initiator, wait=True), timeout=params.snapshot_timeout
            )
        except grpc.aio.AioRpcError as error:
            await asyncio.gather(*sent)
            message = f"snapshot at {initiator}: {error.code().name}: {error.details()}"
            summary.snapshot_errors.append(message)
            say(f"  ! {message}")
            return
        await asyncio.gather(*sent)
        summary.snapshots.append(result)
        for line in snapshot_table(result):
            say(line)

    async def balances() -> dict[str, int | None]:
        async def one(node: str) -> int | None:
            try:
                # A short timeout: a slow node must not stall the report.
                timeout = min(1.0, params.report_every)
                return (await stubs[node].GetState(pb.GetStateRequest(), timeout=timeout)).balance
            except grpc.aio.AioRpcError:
                return None

        values = await asyncio.gather(*(one(n) for n in node_ids))
        return dict(zip(node_ids, values, strict=True))

    loop = asyncio.get_running_loop()
    start = loop.time()
    wall_start = time.monotonic()
    next_snapshot = start + params.snapshot_every if params.snapshot_every else float("inf")
    next_report = start + params.report_every
    end = start + params.duration
    last = (0, 0, 0)
    while True:
        now = loop.time()
        if now >= end:
            break
        if stop.is_set():
            say(f"  stopped by a signal after {now - start:.1f}s")
            break
        if now >= next_snapshot:
            snapshot_tasks.append(asyncio.create_task(snapshot(rng.choice(node_ids))))
            next_snapshot += params.snapshot_every
        if loop.time() >= next_report:
            counts = count()
            delta = tuple(c - p for c, p in zip(counts, last, strict=True))
            last = counts
            say(progress_line(loop.time() - start, delta, counts, summary.moved, await balances()))
            next_report += params.report_every
        wake = min(next_snapshot, next_report, end)
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, wake - loop.time()))
        except TimeoutError:
            pass
    tries = 0
    while tries < params.in_flight_tries and not stop.is_set():
        await asyncio.gather(*snapshot_tasks)  # those already started may have found some
        if any(money_in_flight(s)[0] for s in summary.complete):
            break
        if not tries:
            say(f"  no snapshot found money in flight yet: up to {params.in_flight_tries} more, each with a burst")
        tries += 1
        snapshot_tasks.append(asyncio.create_task(snapshot(rng.choice(node_ids))))
    await load.set(callers=0)
    count()
    if snapshot_tasks:
        pending = sum(not t.done() for t in snapshot_tasks)
        if pending:
            say(f"  waiting for {pending} snapshot(s) still in progress ...")
        await asyncio.gather(*snapshot_tasks)
    summary.elapsed_s = time.monotonic() - wall_start
