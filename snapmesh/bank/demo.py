"""`snapmesh demo` (`make demo`): the whole story on one machine.

1. start a 4-node full-mesh cluster on loopback (free ports, a fresh data dir);
2. run the bank workload: transfers between nodes, a snapshot from a random
   initiator every 2 s, each printed as a table. As each snapshot is triggered
   every node sends a burst of `--burst` transfers, so the markers cross busy
   channels and the cut records money in flight (from, to, amount in the table;
   balances + in flight = total); the demo names the snapshot with the most,
   and the picture draws that snapshot's cut;
3. restore the snapshot with money in flight (else the last COMPLETE one): the
   balances before, the snapshot
   (recorded balance and in-flight transfers towards each node), the balances
   after (they equal the snapshot's: recorded + in flight);
   all along, the snapshot page (`snapmesh ui`) is served on a free loopback
   port (its URL printed); at the end headless Chromium saves `ui.png` and
   `ui-snapshot.png` (the snapshot with money in flight) into the data dir;
4. stop the cluster cleanly;
5. reconcile every exported snapshot against the nodes' transfer logs with the
   Spark job (local mode) and print the verdicts.

Exit 0 when every snapshot completed, was conserved and reconciled as consistent,
and the restore was RESTORED.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from snapmesh.bank.workload import ControllerUnreachable, WorkloadParams, money_in_flight, run_workload
from snapmesh.settings.config import write_cluster
from snapmesh.processes.supervisor import Cluster, SupervisorError

DEFAULT_DATA_ROOT = Path("data")
DEFAULT_BURST = 40
IN_FLIGHT_TRIES = 20  # extra snapshots at the end when none found money in flight (the demo is there to show one)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snapmesh demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, metavar="N", help="cluster size (default 4)")
    parser.add_argument("--duration", type=float, default=10.0, metavar="S", help="seconds of workload (default 10)")
    parser.add_argument("--snapshot-every", type=float, default=2.0, metavar="S", help="seconds between snapshots (default 2)")
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="workload seed (default: random, printed)")
    parser.add_argument(
        "--burst",
        type=int,
        default=DEFAULT_BURST,
        metavar="N",
        help=f"transfers each node sends at once as each snapshot starts, so that the cut finds money "
        f"in flight (default {DEFAULT_BURST}; 0: none)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where logs and snapshots go (default: a new data/demo-<time> directory)",
    )
    parser.add_argument("--skip-reconcile", action="store_true", help="do not run the Spark job at the end")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 2:
        print("snapmesh demo: --nodes must be at least 2", file=sys.stderr)
        return 2
    if args.burst < 0:
        print("snapmesh demo: --burst must be >= 0", file=sys.stderr)
        return 2

    if problem := app_problem(args.nodes):
        print(f"snapmesh demo: {problem}", file=sys.stderr)
        return 2

    data_dir = args.data_dir or DEFAULT_DATA_ROOT / time.strftime("demo-%Y%m%d-%H%M%S")
    if data_dir.exists() and any(data_dir.iterdir()):
        print(f"snapmesh demo: {data_dir} is not empty; give a new --data-dir", file=sys.stderr)
        return 2
    data_dir = data_dir.resolve()
    config_path = write_cluster(data_dir / "cluster.toml", nodes=args.nodes, topology="mesh", data_dir=data_dir)
    print(f"== snapmesh demo: {args.nodes} nodes, data in {data_dir}")

    params = WorkloadParams(duration=args.duration, snapshot_every=args.snapshot_every, seed=args.seed,
                            burst=args.burst, in_flight_tries=IN_FLIGHT_TRIES if args.burst else 0)
    try:
        with Cluster(config_path) as cluster:
            print(f"controller: {cluster.controller_address}  (process logs in {cluster.log_dir})", flush=True)
            from snapmesh.processes.page import PageProcess

            page = PageProcess(cluster)  # its own process, as under `cluster up`
            page.start("127.0.0.1", 0)
            print(f"ui: {page.url}  (the snapshot page, read-only, while the demo runs; "
                  f"`snapmesh ui --controller HOST:PORT` on any cluster)", flush=True)
            try:
                summary = run_workload(cluster.controller_address, params, out=sys.stdout)
                busiest = point_at_in_flight(summary, out=sys.stdout)
                restored = restore_finale(cluster, out=sys.stdout, snapshot_id=busiest)
                print(f"== {page_screenshots(page.url, data_dir, busiest)}", flush=True)
            finally:
                page.close()
    except (SupervisorError, ControllerUnreachable) as exc:
        print(f"snapmesh demo: {exc}", file=sys.stderr)
        return 1
    print("== cluster stopped")
    from snapmesh.commands.trace import write_run_trace

    print(f"== {write_run_trace(data_dir, snapshot=busiest)}", flush=True)
    status = summary.exit_code or restored
    if args.skip_reconcile:
        return status

    print("== reconciling every snapshot against the transfer logs (Spark, local mode)", flush=True)
    from snapmesh.reconcile.job import main as reconcile_main

    verdict = reconcile_main(["--data-dir", str(data_dir), "--out", str(data_dir / "reconcile")])
    print(f"== demo {'passed' if status == 0 and verdict == 0 else 'FAILED'}: data in {data_dir}")
    return status or verdict


def app_problem(nodes: int) -> str:
    """Why the demo cannot run with the app its nodes would inherit ("" when it can):
    its cluster file names none, so $SNAPMESH_APP would be every node's app (as for
    `cluster up`), and the demo's workload is the bank's. Said in one line before
    anything starts, through the pre-flight every command shares."""
    import os

    spec = os.environ.get("SNAPMESH_APP", "").strip()
    if spec in ("", "bank"):
        return ""
    from snapmesh.app import AppError, preflight
    from snapmesh.services.app.drive import mesh_infos

    try:
        app = preflight(spec, mesh_infos(nodes))
    except AppError as exc:
        return f"$SNAPMESH_APP: {exc}"
    return (f"$SNAPMESH_APP={spec}: the demo runs the bank, not the app {app.name!r}: unset it "
            f"(`snapmesh cluster up --app {spec}` and `snapmesh app --app {spec}` run an app)")


def page_screenshots(url: str, data_dir: Path, snapshot_id: str | None) -> str:
    """`ui.png` (the overview) and `ui-snapshot.png` (the snapshot with money in flight)
    in the data dir, by headless Chromium; a line naming them, or why there are none
    (the demo never fails on it)."""
    from urllib.parse import quote

    from snapmesh.ui.browser import NoBrowser, screenshot

    try:
        shots = [str(screenshot(url, data_dir / "ui.png")[0])]
        if snapshot_id is not None:
            # Counted in the page the picture was taken of: its in-flight table's rows.
            path, shown = screenshot(f"{url}snapshot/{quote(snapshot_id, safe='')}", data_dir / "ui-snapshot.png",
                                     count="#in-flight tr.transfer")
            shots.append(f"{path} (snapshot {snapshot_id}: {shown} transfer(s) in flight on the page)")
    except (NoBrowser, ImportError, OSError) as exc:
        return f"no screenshot of the page: {exc}"
    except Exception as exc:  # selenium's WebDriverException and friends: a picture is not worth failing for
        return f"no screenshot of the page: {type(exc).__name__}: {exc}"
    return "page screenshots: " + ", ".join(shots)


def point_at_in_flight(summary, out) -> str | None:
    """Name the COMPLETE snapshot that recorded the most money in flight (the one the
    picture draws); None (and say so) when none did."""
    recorded = [s for s in summary.complete if money_in_flight(s)[0]]
    if not recorded:
        print("== no snapshot recorded money in flight this time (try a larger --burst)", file=out, flush=True)
        return None
    best = max(recorded, key=money_in_flight)
    count, amount = money_in_flight(best)
    balances = sum(n.balance for n in best.nodes)
    print(
        f"== money in flight: snapshot {best.snapshot_id} recorded {count} transfer(s) worth {amount} still on the "
        f"channels (balances {balances} + in flight {amount} = {best.total}); its table is above, the picture and "
        f"the page show its cut",
        file=out,
        flush=True,
    )
    return best.snapshot_id


def restore_finale(cluster: Cluster, out, snapshot_id: str | None = None) -> int:
    """Roll the idle cluster back to COMPLETE snapshot `snapshot_id` (default: the last
    one) and show it; 0 when RESTORED. Its in-flight transfers are delivered again."""
    from snapmesh.serving import credentials
    from snapmesh.commands.restore import render
    from snapmesh.v1 import snapmesh_pb2 as pb
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    identity = cluster.client_identity

    def balances() -> dict[str, int]:
        found = {}
        for node in cluster.node_ids:
            with credentials.open_channel(cluster.node_address(node), identity) as channel:
                found[node] = pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=10).balance
        return found

    def table(title: str, rows: dict[str, int]) -> None:
        print(f"{title}:", file=out)
        for node, balance in rows.items():
            print(f"  {node:<6} {balance:>10}", file=out)
        print(f"  {'total':<6} {sum(rows.values()):>10}", file=out, flush=True)

    with credentials.open_channel(cluster.controller_address, identity) as channel:
        stub = pb_grpc.ControllerStub(channel)
        complete = [s for s in stub.ListSnapshots(pb.ListSnapshotsRequest(), timeout=10).snapshots
                    if s.status == pb.Snapshot.COMPLETE]
        if not complete:
            print("== no COMPLETE snapshot to restore", file=out)
            return 1
        target = next((s for s in complete if s.snapshot_id == snapshot_id), complete[-1])
        print(f"== restoring snapshot {target.snapshot_id} (epoch {target.epoch})", file=out)
        table("balances before", balances())
        in_flight = {n.node_id: 0 for n in target.nodes}
        for c in target.channels:
            in_flight[c.dst] += sum(t.amount for t in c.in_flight)
        print("the snapshot (recorded balance + in flight towards the node):", file=out)
        for n in target.nodes:
            print(f"  {n.node_id:<6} {n.balance:>10} + {in_flight[n.node_id]:>6}", file=out)
        answer = stub.RestoreSnapshot(pb.RestoreSnapshotRequest(snapshot_id=target.snapshot_id), timeout=120)
    print(render(answer), file=out)
    table("balances after", balances())
    return 0 if answer.status == pb.Restore.RESTORED else 1


if __name__ == "__main__":
    sys.exit(main())
