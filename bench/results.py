"""bench/results.json: a flat object of figure name -> number, plus `date` and `machine`.

Every benchmark merges its own figures in and keeps the other benchmarks' keys,
so the file always holds the latest run of each; `date` is the last write. A smoke
run (bench/smoke.py) writes nothing: its figures come from tiny sizes.

A figure that is not a finite number (a rate over no time, a share of no
transfers: NaN or infinity) is not written: JSON has no such value, and a reader
would fail on the file. Its key is dropped, an older run's value with it (the
latest run did not measure it), and named on stderr.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

from bench import smoke

RESULTS = Path(__file__).resolve().parent / "results.json"


def _finite(value: object) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def merge(figures: dict[str, float], path: Path = RESULTS) -> None:
    if smoke.on():
        print(f"smoke run: {len(figures)} figures not written to {path.name}", flush=True)
        return
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        results = {}
    for key, value in {**results, **figures}.items():
        if not _finite(value):
            print(f"bench: {key} is {value}, not a finite number: left out of {path.name}", file=sys.stderr, flush=True)
            results.pop(key, None)
    results.update({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items() if _finite(v)})
    results["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    path.write_text(json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n")
