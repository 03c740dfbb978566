"""Smoke mode: every bench at tiny sizes, to prove it still runs; it measures nothing.

`python -m bench --smoke [NAME ...]` sets BENCH_SMOKE=1 for the run (its children
inherit it); each bench then takes its sizes through `size(full, tiny)`, and
`bench.results.merge` writes nothing, so a smoke run never puts a tiny run's
figures in bench/results.json. tests/cluster/test_bench_smoke.py runs every bench
this way in `make test`, so a bench that rots (an import left behind by a move, a
renamed field) fails CI instead of the next person who measures.
"""

from __future__ import annotations

import os

ENV = "BENCH_SMOKE"


def on() -> bool:
    """Is this a smoke run?"""
    return os.environ.get(ENV) == "1"


def size(full: int, tiny: int) -> int:
    """A bench's size: `tiny` in a smoke run, else `full`."""
    return tiny if on() else full
