"""The wheel a user gets, built once per test run, and fresh virtualenvs with it installed.

Shared by tests/deploy/test_wheel.py (the wheel's contents and commands) and
tests/deploy/test_wheel_app.py (a one-file app on a cluster run from the wheel): building
it with isolation generates the protobuf code and costs a minute on a loaded
machine, so it is built once per pytest process (`built_wheel`), and each module
installs it into a virtualenv of its own, with only the extras it needs.

The wheel comes from a clean checkout (the files git would have: no generated
snapmesh/v1, no .venv), so the build itself must generate the protobuf code. The
fresh venv gets no pip of its own (this venv's pip installs into it); both use
pip's cache (and PIP_FIND_LINKS when set).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]

_built: dict[str, Path] = {}  # "wheel" -> the wheel built in this pytest process


def clean_checkout(into: Path) -> Path:
    """The working tree's files git tracks or would track (not what .gitignore excludes)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, target = ROOT / name, into / name
        if source.is_symlink():  # snapmesh/services -> ../services: git keeps the link, so does a checkout
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    assert not (into / "snapmesh" / "v1").exists()
    return into


def user_env() -> dict[str, str]:
    """This environment without anything that points into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT)))
    return env


def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The snapmesh wheel, built with --no-deps from a clean checkout the first time it is asked for."""
    if "wheel" not in _built:
        root = tmp_path_factory.mktemp("wheel")
        source = clean_checkout(root / "src")
        built = subprocess.run([*PIP, "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)],
                               capture_output=True, text=True, timeout=240)
        assert built.returncode == 0, built.stderr
        (_built["wheel"],) = (root / "dist").glob("snapmesh-*.whl")
    return _built["wheel"]


def fresh_venv(wheel: Path, venv: Path) -> Path:
    """A new virtualenv with `wheel` (no extras) installed; returns its bin/ directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    install = subprocess.run([*PIP, "--python", str(venv / "bin" / "python"), "install", "-q",
                              "-c", str(ROOT / "constraints.txt"), str(wheel)], capture_output=True, text=True,
                             timeout=240)
    assert install.returncode == 0, install.stderr
    return venv / "bin"
