"""Argument parsing that in-process callers can use: every subcommand's
`main(argv)` returns an exit code instead of raising SystemExit."""

from __future__ import annotations

import argparse
import sys


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or argparse's exit code after --help or a usage error
    (argparse has already printed the message)."""
    try:
        return parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (seconds, mostly)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0 (a count)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)
