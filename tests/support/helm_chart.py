"""The Helm chart's rendering, for tests/deploy/test_helm_chart.py and tests/deploy/test_helm_pods.py.

`render(values)` runs the real helm (`.venv/bin/helm`, put there by `make install`
from a pinned PyPI package: deploy/helm/fetch_helm.py) and returns the objects.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "snapmesh"
HELM = Path(sys.executable).parent / "helm"
RELEASE = "snapmesh"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
    return result


def set_args(values: dict[str, Any] | None) -> list[str]:
    args: list[str] = []
    for key, value in (values or {}).items():
        if isinstance(value, str):
            args += ["--set-string", f"{key}={value}"]
        else:
            args += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return args


def render(values: dict[str, Any] | None = None, *, release: str = RELEASE, namespace: str = "default") -> list[dict]:
    """Every object `helm template` renders (hooks and the test hook included)."""
    out = helm("template", release, str(CHART), "--namespace", namespace, *set_args(values)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)} among {names}"
    return found[0]
