"""docs/metrics.md's table of every metric, and a scrape's families, in one form to compare."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
PROCESSES = ("controller", "node", "bank node")  # the table's "process" column; "both": controller and node


def scrape(address: str) -> str:
    """A process's /metrics at its metrics address."""
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()


def value(text: str, name: str, **labels: str) -> float:
    """The value of the one sample `name` with exactly these labels."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no sample {name}{labels}")


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """{name as one queries it: (type, label names)}; counters by their `_total` name."""
    out = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = frozenset(k for s in family.samples for k in s.labels) - {"le"}
        out[name] = (family.type, labels)
    return out


def documented() -> dict[str, dict[str, tuple[str, frozenset[str]]]]:
    """docs/metrics.md's table, as {process: {name: (type, labels)}}: "controller",
    "node" (every node) and "bank node" (a node that runs the bank, besides)."""
    section = DOC.read_text().split("## Every metric", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    out: dict[str, dict[str, tuple[str, frozenset[str]]]] = {who: {} for who in PROCESSES}
    for row in rows:
        name, kind, labels, process, _meaning = (cell.strip() for cell in row.strip("|").split("|", 4))
        entry = (kind, frozenset(re.findall(r"`([^`]+)`", labels)))
        for who in ("controller", "node") if process == "both" else (process,):
            assert name.strip("`") not in out[who], f"{name} twice in the table"
            out[who][name.strip("`")] = entry
    return out


def differences(table: dict[str, tuple[str, frozenset[str]]], exported: dict[str, tuple[str, frozenset[str]]]) -> str:
    """What a table and a scrape disagree on, in words ("" when they agree exactly)."""
    missing = {n: table[n] for n in table.keys() - exported.keys()}
    undocumented = {n: exported[n] for n in exported.keys() - table.keys()}
    different = {n: (table[n], exported[n]) for n in table.keys() & exported.keys() if table[n] != exported[n]}
    if not (missing or undocumented or different):
        return ""
    return (f"documented but not exported {missing}; exported but not documented {undocumented}; "
            f"documented vs exported {different}")
