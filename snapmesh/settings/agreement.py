"""Whether a node runs the cluster the controller's file describes: a mixed cluster
is refused, not run. The controller asks each node (GetState) and exits 2 with
the first disagreement, naming the file and the field to fix."""

from __future__ import annotations

from snapmesh.settings.appsettings import app_named, runs_bank
from snapmesh.settings.config import ClusterConfig


def disagreement(cfg: ClusterConfig, node: str, snapshot_mode: str, app: str) -> str:
    """Why a node that runs `snapshot_mode` ("": classic) and `app` (GetState's: "" for
    the bank) cannot be in the cluster `cfg` describes, in words ("" when it agrees)."""
    theirs, mine = snapshot_mode or "classic", cfg.snapshot_mode
    if theirs != mine:
        return (
            f"{cfg.path}: snapshot_mode: the controller runs {mine!r} but node {node!r} runs "
            f"{theirs!r}; every process must read the same snapshot_mode"
        )
    my_app = "" if runs_bank(cfg.app) else cfg.app.module
    if app != my_app:
        return (
            f"{cfg.path}: [app]: the controller runs {app_named(my_app)} but node "
            f"{node!r} runs {app_named(app)}; every process must run the same app"
        )
    return ""
