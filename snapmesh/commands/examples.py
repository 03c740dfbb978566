"""`snapmesh examples [--path]`: where the examples shipped in the wheel are (snapmesh.examples)."""

from __future__ import annotations

import argparse
import sys

from snapmesh.examples import WHERE, listing
from snapmesh.settings.argparsing import parse_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snapmesh examples", description="Print where snapmesh's examples are.")
    parser.add_argument("--path", action="store_true", help="print the directory alone (for scripts: cp \"$(...)/x\" .)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    print(WHERE if args.path else listing())
    return 0


if __name__ == "__main__":
    sys.exit(main())
