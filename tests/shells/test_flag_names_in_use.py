"""The files users copy from (README, docs, the compose and Swarm files, the Helm
chart, the EC2 user data, the Makefile) call snapmesh with the flag names of issue
25 (`certs --tls-dir`, `reconcile --verdicts-dir`, `synth --data-dir`, `chaos
--data-dir`), not the old names the commands keep only as aliases."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# command -> its old flag name, kept as an alias (tests/shells/test_cli_flags.py)
OLD = {"certs": "--out", "reconcile": "--out", "synth": "--out", "chaos": "--dir"}
# Lines about other programs with flags of the same name.
OTHER = ("reconcile_job.py", "generate.py", "snapmesh trace", "spark-submit")


def files() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]
    for pattern in ("*.yml", "*.yaml", "*.sh", "*.py", "*.tftpl", "*.tpl", "*.txt"):
        found += sorted(p for p in (ROOT / "deploy").rglob(pattern) if "wheels" not in p.parts)
    return found


def old_names(text: str) -> list[tuple[int, str]]:
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        if any(other in line for other in OTHER):
            continue
        tokens = re.findall(r"[A-Za-z0-9_./-]+", line)
        for i, token in enumerate(tokens):
            if token in OLD and (i == 0 or tokens[i - 1] in ("snapmesh", "args", "command", "IMAGE")) \
                    and OLD[token] in tokens[i + 1:]:
                hits.append((number, line.strip()))
                break
    return hits


def test_the_scan_finds_an_old_name():
    assert old_names('command: ["reconcile", "--data-dir", "/data", "--out", "/data/reconcile"]')
    assert old_names("args: [certs, --config, /etc/snapmesh/cluster.toml, --out, /tls]")
    assert old_names("snapmesh chaos --dir run --seed 3")
    assert not old_names("snapmesh trace --data-dir d --format svg --out run.svg")
    assert not old_names("snapmesh reconcile --data-dir d --verdicts-dir v")


def test_shipped_files_and_docs_use_todays_flag_names():
    found = [f"{path.relative_to(ROOT)}:{n}: {line}" for path in files()
             for n, line in old_names(path.read_text(encoding="utf-8", errors="replace"))]
    assert found == []
