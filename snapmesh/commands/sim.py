"""`snapmesh sim run FILE [--seed N]`: run a scenario, print the result as JSON.
`snapmesh sim fuzz [--seed N] [--cases N] [--app APP] [--broadcast] [--mode hybrid --align-timeout-ms T]
[--topology NAME] [--steps upgrade|rescale]`: the fault fuzzer (snapmesh/fuzzer/fuzz.py); the nodes host
the bank app (services/app/bank.py, its [app] table drawn by each case), or with --app (a built-in name such as
kvshard, or module:attr) that app; with --topology (mesh, ring, random-regular:K) every
case runs on that topology, drawn from the case's seed (an unknown name or K < 1: one line, exit 2);
with --steps each case runs the app, stops it with a snapshot, and restores that into
a version 2 of the app (upgrade: snapmesh/fuzzer/steps.py) or onto another node set (rescale:
snapmesh/fuzzer/rescale_steps.py), and runs on.

The JSON goes to stdout with indent=2 and keys in topology order (never sorted),
followed by one newline; the same file and seed give byte-identical output.
An invalid scenario, an unreadable file or bad JSON exits 2 with one line on
stderr that names the file and the problem (for a step: its index and the step
as written, e.g. `step 4 ["deliver","A","B"]: channel A->B is empty`).

`fuzz` runs `--cases` cases, seeds N, N+1, and on, and stops at the first broken
invariant: it prints the seed, what broke and the one command that replays
that case, and exits 1. All passed: one summary line, exit 0. An --app that
does not load (snapmesh.app.load_app) or has no workload exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from snapmesh.protocol.hybrid import DEFAULT_ALIGN_TIMEOUT_S, MODES
from snapmesh.settings import topologies
from snapmesh.sim.scenario import ScenarioError, loads
from snapmesh.sim.simulator import simulate

PROG = "snapmesh sim"
EXIT_INVALID = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Run scenarios in the deterministic simulator.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a scenario file and print its snapshots as JSON")
    run.add_argument("file", metavar="FILE", help="scenario file (JSON; format in docs/scenarios.md)")
    run.add_argument("--seed", type=int, default=0, metavar="N", help="scheduler seed for `run` steps (default 0)")
    fuzz = commands.add_parser("fuzz", help="random clusters under random faults, invariants after every step")
    fuzz.add_argument("--seed", type=int, default=0, metavar="N", help="first case's seed (default 0)")
    fuzz.add_argument("--cases", type=_positive, default=1000, metavar="N", help="how many cases (default 1000)")
    fuzz.add_argument(
        "--app", default="", metavar="APP",
        help="the app the nodes host: a built-in (kvshard, bank) or module:attr (default: the bank app, its"
             " initial_balance, total and max_amount drawn by each case)",
    )
    fuzz.add_argument(
        "--app-param", action="append", default=[], metavar="KEY=VALUE", type=_param,
        help="one entry of the app's [app] table (VALUE read as JSON, else as text); repeatable (default: none)",
    )
    fuzz.add_argument(
        "--broadcast", action="store_true",
        help="every snapshot starts at every node at once (TriggerSnapshot broadcast; default: at one initiator)",
    )
    fuzz.add_argument(
        "--mode", choices=MODES, default=None,
        help="every node's snapshot_mode (default: classic on even seeds, overtake on odd ones)",
    )
    fuzz.add_argument(
        "--align-timeout-ms", type=_milliseconds, default=None, metavar="T",
        help=f"hybrid mode: ms a marker keeps its FIFO place before it overtakes "
             f"(default {DEFAULT_ALIGN_TIMEOUT_S * 1e3:g}; only with --mode hybrid)",
    )
    fuzz.add_argument(
        "--topology", metavar="NAME",
        help="every case on this topology: mesh, ring or random-regular:K, drawn from the case's seed, with K + 1 "
             "nodes or more (default: each case draws its own, random-regular:K among them)",
    )
    fuzz.add_argument(
        "--steps", choices=("upgrade", "rescale"), default=None,
        help="upgrade: each case runs the app, stops it with a snapshot, restores that into a version 2 of the app "
             "with another state encoding, and runs on (snapmesh/fuzzer/steps.py; needs an app whose state is JSON); "
             "rescale: the same stop, restored onto another node set with the app's rescale "
             "(snapmesh/fuzzer/rescale_steps.py; needs an app with rescale); default: neither, the plain fault steps",
    )
    return parser


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _param(text: str) -> tuple[str, object]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def run_fuzz(seed: int, cases: int, app_spec: str = "", params: dict | None = None, broadcast: bool = False,
             mode: str | None = None, align_timeout: float = DEFAULT_ALIGN_TIMEOUT_S, topology: str | None = None) -> int:
    from snapmesh.app import AppError, load_app
    from snapmesh.fuzzer import fuzz
    from snapmesh.sim import world

    app = None
    if app_spec:
        try:
            app = load_app(app_spec)
        except AppError as exc:
            return _fail(str(exc))
        if app.workload is None:
            return _fail(f"--app {app_spec}: app {app.name!r} has no workload, so the fuzzer has no commands to send")
    if cases == 1:
        described = world.World(seed, app, params, mode=mode, align_timeout=align_timeout, topology=topology).describe()
        hybrid = f" align timeout {align_timeout * 1e3:g} ms" if mode == "hybrid" else ""
        print(f"seed {seed}: {described}{hybrid}" + (" broadcast" if broadcast else ""))
    started = time.perf_counter()
    options = dict(broadcast=broadcast, mode=mode, align_timeout=align_timeout, topology=topology)
    ran, failure = fuzz.fuzz(seed, cases, app, params, **options)
    elapsed = time.perf_counter() - started
    if failure is not None:
        bad_seed, why = failure
        print(f"FAIL seed {bad_seed} (case {ran} of {cases}): {why}")
        given = "".join(f" --app-param {k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in (params or {}).items())
        print(f"replay: {fuzz.replay_command(bad_seed, app_spec, **options)}{given}")
        return 1
    print(f"ok: {ran} cases, seeds {seed}..{seed + ran - 1}{f', app {app.name}' if app else ''}"
          f"{', broadcast' if broadcast else ''}{f', mode {mode}' if mode else ''}"
          f"{f', topology {topology}' if topology else ''}, {elapsed:.1f}s")
    return 0


def run_steps(seed: int, cases: int, app_spec: str, params: dict, kind: str = "upgrade") -> int:
    """`--steps upgrade|rescale`: the version steps (snapmesh/fuzzer/steps.py, rescale_steps.py),
    each failure with its seed and replay line."""
    from snapmesh.app import AppError, load_app
    from snapmesh.fuzzer import rescale_steps, steps

    try:
        app = load_app(app_spec or "bank")
    except AppError as exc:
        return _fail(str(exc))
    if app.workload is None:
        return _fail(f"--app {app_spec}: app {app.name!r} has no workload, so the fuzzer has no commands to send")
    if kind == "rescale" and app.rescale is None:
        return _fail(f"--steps rescale: app {app.name!r} has no rescale(view, nodes)")
    started = time.perf_counter()
    case_app = app if app_spec else None  # None: the bank, its [app] table drawn by each case
    ran, failure = (rescale_steps if kind == "rescale" else steps).fuzz_steps(seed, cases, case_app, params)
    if failure is not None:
        bad_seed, why = failure
        given = "".join(f" --app-param {k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in params.items())
        print(f"FAIL seed {bad_seed} (case {ran} of {cases}): {why}")
        named = f" --app {app_spec}" if app_spec else ""
        print(f"replay: snapmesh sim fuzz --seed {bad_seed} --cases 1{named} --steps {kind}{given}")
        return 1
    print(f"ok: {ran} cases, seeds {seed}..{seed + ran - 1}, app {app.name}, steps {kind},"
          f" {time.perf_counter() - started:.1f}s")
    return 0


def run_file(path: str, seed: int) -> str:
    """The output text for one scenario file; raises ScenarioError or OSError."""
    text = Path(path).read_text(encoding="utf-8")
    sim = simulate(loads(text), seed)
    return json.dumps(sim.output(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "fuzz":
        if args.align_timeout_ms is not None and args.mode != "hybrid":
            given = args.mode or "the mode by seed"
            return _fail(f"--align-timeout-ms {args.align_timeout_ms:g}: applies to --mode hybrid only, not to {given}")
        align = DEFAULT_ALIGN_TIMEOUT_S if args.align_timeout_ms is None else args.align_timeout_ms / 1e3
        if args.topology is not None:
            try:
                topologies.parse(args.topology)
            except topologies.ShapeError as exc:
                return _fail(f"--topology: {exc}")
        if args.steps is not None:
            if args.broadcast or args.mode or args.topology:
                return _fail(f"--steps {args.steps}: takes none of --broadcast, --mode, --topology")
            return run_steps(args.seed, args.cases, args.app, dict(args.app_param), args.steps)
        return run_fuzz(args.seed, args.cases, args.app, dict(args.app_param), broadcast=args.broadcast,
                        mode=args.mode, align_timeout=align, topology=args.topology)
    try:
        output = run_file(args.file, args.seed)
    except ScenarioError as exc:
        return _fail(f"{args.file}: {exc}")
    except UnicodeDecodeError as exc:
        return _fail(f"{args.file}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    except OSError as exc:
        return _fail(f"{args.file}: cannot read: {exc.strerror or exc}")
    sys.stdout.write(output)
    return 0


def _fail(message: str) -> int:
    # One line, whatever the message holds.
    print(f"{PROG}: {' '.join(message.splitlines())}", file=sys.stderr)
    return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
