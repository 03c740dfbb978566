"""Whether a node runs the cluster the controller's file describes: a mixed cluster
is refused, not run. The controller asks each node (GetState) and exits 2 with
the first disagreement, naming the file and the field to fix."""

from __future__ import annotations

from collections.abc import Iterable

from snapmesh.protocol.retry import Failed
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


class Agreement:
    """The start-up check's rounds, decided: the controller asks every node in
    `to_ask` (in name order) once a round, a node that did not answer (a
    retry.Failed) again in the next round, until each answered; the first
    disagreement ends the check. No I/O: the shell asks and waits between rounds."""

    def __init__(self, cfg: ClusterConfig, nodes: Iterable[str]) -> None:
        self.cfg = cfg
        self.waiting = set(nodes)

    @property
    def done(self) -> bool:
        """Every node answered."""
        return not self.waiting

    def to_ask(self) -> list[str]:
        return sorted(self.waiting)

    def answered(self, node: str, state: object) -> str:
        """`node`'s GetState answer (or the Failed its call gave up on): its
        disagreement, in words ("" when it agrees or did not answer)."""
        if isinstance(state, Failed):
            return ""
        self.waiting.discard(node)
        return disagreement(self.cfg, node, state.snapshot_mode, state.app)  # type: ignore[attr-defined]
