"""SNAPMESH_EVENT_LOOP=uvloop|asyncio: the loop every server runs on (snapmesh/serving/runtime.py).

Real processes: a node and the controller started by the supervisor with each value
log the loop class they run on, and the uvloop extension is mapped into the process
(/proc/<pid>/maps) exactly when uvloop was asked for. A value outside the two stops a
server at start-up with exit 2 and an error naming the variable and the allowed values.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.serving.runtime import CLIENT_OPTIONS, EnvironmentSettingError, event_loop_from_env
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

LOOP_LINES = {
    "uvloop": "event loop: uvloop (uvloop.Loop)",
    "asyncio": "event loop: asyncio (asyncio.unix_events._UnixSelectorEventLoop)",
}


def _uvloop_mapped(pid: int) -> bool:
    return "/uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_server_runs_on_the_loop_the_variable_names(tmp_path: Path, loop: str) -> None:
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    cluster = Cluster(path, env={**os.environ, "SNAPMESH_EVENT_LOOP": loop}).start()
    try:
        with grpc.insecure_channel(cluster.node_address("p1"), options=CLIENT_OPTIONS) as channel:
            pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=10)  # it serves on that loop
        for name, pid in (("p1", cluster.node_pid("p1")), ("controller", cluster.controller_pid)):
            log = (cluster.log_dir / f"{name}.log").read_text()
            assert LOOP_LINES[loop] in log, (name, log[-2000:])
            other = next(v for k, v in LOOP_LINES.items() if k != loop)
            assert other not in log
            assert _uvloop_mapped(pid) == (loop == "uvloop"), name
    finally:
        cluster.stop()


@pytest.mark.parametrize("value", ["trio", "UVLOOP", "uv loop"])
def test_a_bad_value_stops_the_server_with_exit_2_naming_the_variable_and_the_choices(
        tmp_path: Path, value: str) -> None:
    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    done = subprocess.run([sys.executable, "-m", "snapmesh.cli", "node", "--id", "p1", "--config", str(path)],
                          env={**os.environ, "SNAPMESH_EVENT_LOOP": value}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"SNAPMESH_EVENT_LOOP={value!r}: must be one of uvloop, asyncio" in done.stderr


def test_unset_or_empty_means_uvloop_when_installed_and_values_are_taken_as_given() -> None:
    assert event_loop_from_env({}) == "uvloop"  # a dependency: installed by make install
    assert event_loop_from_env({"SNAPMESH_EVENT_LOOP": " "}) == "uvloop"
    assert event_loop_from_env({"SNAPMESH_EVENT_LOOP": "asyncio"}) == "asyncio"
    assert event_loop_from_env({"SNAPMESH_EVENT_LOOP": "uvloop"}) == "uvloop"
    with pytest.raises(EnvironmentSettingError, match="SNAPMESH_EVENT_LOOP='tokio'"):
        event_loop_from_env({"SNAPMESH_EVENT_LOOP": "tokio"})


def test_without_uvloop_the_default_is_asyncio_and_asking_for_uvloop_says_it_is_missing(monkeypatch) -> None:
    from snapmesh.serving import runtime

    monkeypatch.setattr(runtime, "_uvloop_installed", lambda: False)
    assert event_loop_from_env({}) == "asyncio"
    with pytest.raises(EnvironmentSettingError, match="SNAPMESH_EVENT_LOOP=uvloop: the uvloop package is not installed"):
        event_loop_from_env({"SNAPMESH_EVENT_LOOP": "uvloop"})
