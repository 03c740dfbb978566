"""The package as a user gets it: its version, metadata and (test_wheel.py) a wheel."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_snapmesh_version_is_the_projects():
    result = subprocess.run([sys.executable, "-m", "snapmesh.cli", "--version"], capture_output=True, text=True,
                            timeout=30, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.stdout == f"snapmesh {version}\n"


def test_the_changelog_has_an_unreleased_section_first():
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == "## [Unreleased]"
