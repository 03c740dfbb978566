"""`snapmesh query --node ID TEXT`: a read of a node's app (Query: on_query, not logged).

The arguments, the node and the output are `snapmesh submit`'s (submit.py),
without --request-id and --batch: a read needs neither.
"""

from __future__ import annotations

import argparse
import sys


from snapmesh.commands.submit import parser, run


def _parser() -> argparse.ArgumentParser:
    return parser("snapmesh query", query=True)


def main(argv: list[str] | None = None) -> int:
    return run(argv, query=True)


if __name__ == "__main__":
    sys.exit(main())
