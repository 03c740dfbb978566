"""bench/results.json: a flat object of figure name -> number, plus `date` and `machine`.

Every benchmark merges its own figures in and keeps the other benchmarks' keys,
so the file always holds the latest run of each; `date` is the last write. A smoke
run (bench/smoke.py) writes nothing: its figures come from tiny sizes.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from bench import smoke

RESULTS = Path(__file__).resolve().parent / "results.json"


def merge(figures: dict[str, float], path: Path = RESULTS) -> None:
    if smoke.on():
        print(f"smoke run: {len(figures)} figures not written to {path.name}", flush=True)
        return
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        results = {}
    results.update({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()})
    results["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
