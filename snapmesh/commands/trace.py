"""`snapmesh trace --data-dir DIR --format shiviz|svg|png --out FILE`

shiviz: a log ShiViz loads (https://bestchai.bitbucket.io/shiviz/), vector clocks
from the logs' send/recv matching. svg / png: a space-time diagram; one line per
node, arrows for transfers and markers, every snapshot's cut across the lines,
the chosen snapshot's (`--snapshot ID`, default: the one with the most in-flight
transfers) in-flight transfers highlighted; `--window FROM:TO` picks the stretch
of Lamport time drawn (default: around the chosen snapshot). When the chosen
snapshot is an app's and its file is in DIR/snapshots/, what the app's
`describe` says of it is printed under the picture, as the page does.

A torn last line of a node's active file (a write cut short) is left out, as the
node's recovery does, with one notice per file on stderr naming the file and the
bytes; the summary line counts them.

Exit 0 written, 2 bad input (no logs, an unreadable record, an unknown snapshot,
a bad window) or png without the `png` extra (cairosvg), each named in one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from snapmesh.checking import described, snapshot_file
from snapmesh.settings.argparsing import parse_args
from snapmesh.trace.clocks import Trace, TraceError, build_trace
from snapmesh.trace.layout import LayoutError, busiest_snapshot, layout
from snapmesh.trace.logs import LeftOut, LogError, read_data_dir
from snapmesh.trace.shiviz import render_shiviz
from snapmesh.trace.svg import png_unavailable, render_png, render_svg

FORMATS = ("shiviz", "svg", "png")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh trace: {message}\n")


def _window(text: str) -> tuple[int, int]:
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(start), int(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not FROM:TO (two integers, Lamport time)") from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh trace", description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("--data-dir", required=True, type=Path, metavar="DIR", help="the run's data dir (<node>.log.jsonl)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="shiviz log, SVG or PNG diagram")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE", help="file to write")
    parser.add_argument("--snapshot", metavar="ID", help="svg/png: the snapshot whose in-flight transfers are highlighted "
                        "(default: the one with the most in flight)")
    parser.add_argument("--window", type=_window, metavar="FROM:TO",
                        help="svg/png: Lamport time range drawn (default: around the chosen snapshot)")
    return parser


def write_trace(trace: Trace, fmt: str, out: Path, *, snapshot: str | None = None,
                window: tuple[int, int] | None = None, title: str = "", snapshots_dir: Path | None = None) -> str:
    """Write `trace` to `out` in `fmt`; returns a one-line summary of what was drawn.
    `snapshots_dir`: where the chosen snapshot's file may be, for its describe."""
    if fmt == "shiviz":
        out.write_text(render_shiviz(trace), encoding="utf-8")
        return f"{len(trace.events)} events from {len(trace.nodes)} nodes"
    chosen = snapshot if snapshot is not None else busiest_snapshot(trace)
    geometry = layout(trace, window=window, chosen=chosen)
    svg = render_svg(geometry, title=title, caption=_caption(snapshots_dir, chosen))
    if fmt == "svg":
        out.write_text(svg, encoding="utf-8")
    else:
        out.write_bytes(render_png(svg))
    in_flight = len(trace.in_flight(chosen)) if chosen else 0
    return (f"{len(geometry.dots)} events, {len(geometry.arrows)} arrows, {len(geometry.cuts)} cuts in Lamport time "
            f"{geometry.start}:{geometry.end}; snapshot {chosen or '(none)'} with {in_flight} in flight")


def _caption(snapshots_dir: Path | None, chosen: str | None) -> tuple[str, ...]:
    """The app's describe of the chosen snapshot, from its file; none for the bank's,
    or when the file is not there or does not read (the picture is drawn anyway)."""
    path = snapshots_dir / f"{chosen}.json" if snapshots_dir is not None and chosen else None
    if path is None or not path.is_file():
        return ()
    try:
        snapshot = snapshot_file.read(path)
    except (OSError, ValueError) as exc:
        return (f"snapshot {chosen}: its file does not read: {exc}",)
    return described.caption(described.describe(snapshot))


def write_run_trace(data_dir: Path, snapshot: str | None = None) -> str:
    """For `make demo`: `<data_dir>/trace.svg` (drawing `snapshot`'s cut and its in-flight
    transfers; default the busiest) and `<data_dir>/trace.shiviz`; returns a line naming
    them (or saying why there is no picture: a demo never fails on it)."""
    try:
        trace = build_trace(read_data_dir(data_dir))
        svg, shiviz = data_dir / "trace.svg", data_dir / "trace.shiviz"
        summary = write_trace(trace, "svg", svg, snapshot=snapshot, title=f"snapmesh demo: {data_dir.name}",
                              snapshots_dir=data_dir / "snapshots")
        write_trace(trace, "shiviz", shiviz)
    except (LogError, TraceError, LayoutError, OSError) as exc:
        return f"no message-flow picture: {exc}"
    return f"message flow: {svg} ({summary}); ShiViz log: {shiviz}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.format == "shiviz" and (args.snapshot or args.window):
        print("snapmesh trace: --snapshot and --window are for svg and png", file=sys.stderr)
        return 2
    if args.format == "png" and (problem := png_unavailable()):
        print(f"snapmesh trace: {problem}", file=sys.stderr)
        return 2
    left_out: list[LeftOut] = []
    try:
        trace = build_trace(read_data_dir(args.data_dir, left_out))
        for torn in left_out:  # one notice per file: nothing is left out silently
            print(f"snapmesh trace: notice: {torn.notice}", file=sys.stderr)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        summary = write_trace(trace, args.format, args.out, snapshot=args.snapshot, window=args.window,
                              title=f"snapmesh trace of {args.data_dir}", snapshots_dir=args.data_dir / "snapshots")
    except (LogError, TraceError, LayoutError) as exc:
        print(f"snapmesh trace: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"snapmesh trace: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    if left_out:
        summary += f"; left out {len(left_out)} torn last line(s): " + ", ".join(
            f"{t.file} ({t.size} bytes)" for t in left_out)
    print(f"snapmesh trace: wrote {args.out} ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
