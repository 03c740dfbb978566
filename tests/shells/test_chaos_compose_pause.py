"""The compose campaign's pause (snapmesh/chaos/compose.py): a pause the cgroup freezer refuses
is tried again, and one that never takes is a fault not applied (FaultNotApplied, the campaign
records it as skipped with that reason), not a failed campaign. `docker` is replaced by a
script of answers: the real engine's refusal ("unable to freeze") cannot be made on demand."""

from __future__ import annotations

import subprocess

import pytest

from snapmesh.chaos import compose
from snapmesh.chaos.campaign import FaultNotApplied

REFUSED = "Error response from daemon: Cannot pause container c1: OCI runtime pause failed: unable to freeze: unknown"


class Docker:
    """Answers `docker pause` from `pauses` (True: it took) and `docker inspect` from whether one took."""

    def __init__(self, pauses: list[bool]) -> None:
        self.pauses = pauses
        self.paused = False
        self.calls: list[str] = []

    def __call__(self, *args: str, check: bool = True, **_) -> subprocess.CompletedProcess:
        self.calls.append(args[1])
        if args[1] == "pause":
            self.paused = self.pauses.pop(0)
            return subprocess.CompletedProcess(args, 0 if self.paused else 1, "", "" if self.paused else REFUSED)
        assert args[1] == "inspect", args
        return subprocess.CompletedProcess(args, 0, f"{str(self.paused).lower()}\n", "")


def backend() -> compose.ComposeBackend:
    stack = object.__new__(compose.ComposeBackend)  # no stack: only the pause runs
    stack.cids = {"p4": "c1"}
    return stack


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose.time, "sleep", lambda s: None)


def test_a_refused_pause_is_tried_again_and_one_that_takes_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    docker = Docker([False, True])
    monkeypatch.setattr(compose, "docker", docker)
    backend().pause_node("p4")
    assert docker.calls == ["pause", "inspect", "pause"]


def test_a_pause_refused_every_time_is_a_fault_not_applied_naming_why(monkeypatch: pytest.MonkeyPatch) -> None:
    docker = Docker([False] * compose.PAUSE_TRIES)
    monkeypatch.setattr(compose, "docker", docker)
    with pytest.raises(FaultNotApplied, match=f"docker pause failed {compose.PAUSE_TRIES} times: .*unable to freeze"):
        backend().pause_node("p4")
    assert docker.calls == ["pause", "inspect"] * compose.PAUSE_TRIES
