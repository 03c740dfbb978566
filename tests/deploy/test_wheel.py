"""The wheel a user gets: built from a clean checkout, with build isolation, so
the build itself must generate the protobuf code; installed into a fresh virtualenv
with no extras; run from outside the checkout, as a user would.

The wheel is built once per run (tests/wheel_build.py, shared with
tests/deploy/test_wheel_app.py). Needs the package index, or the dependencies' wheels in
a find-links directory."""

from __future__ import annotations

import signal
import subprocess
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from support.cluster_helpers import controller_stub
from support.wheel_build import built_wheel, fresh_venv, user_env
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed; returns its bin/ directory."""
    wheel = built_wheel(tmp_path_factory)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {"snapmesh/v1/snapmesh_pb2.py", "snapmesh/v1/snapmesh_pb2_grpc.py", "snapmesh/configs/local-4.toml"} <= names
        # services/ ships inside snapmesh (issue 36): the wheel installs no other top-level package
        assert {"snapmesh/services/node/process.py", "snapmesh/services/app/bank.py"} <= names
        assert {n.split("/")[0] for n in names if not n.startswith("snapmesh-")} == {"snapmesh"}
        top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert [archive.read(n).decode().split() for n in top_level] in ([], [["snapmesh"]])
        metadata = Parser().parsestr(archive.read(f"snapmesh-{wheel.name.split('-')[1]}.dist-info/METADATA").decode())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("Project-URL") and metadata.get_all("Classifier")
    assert any("extra == \"png\"" in r and r.lower().startswith("cairosvg") for r in metadata.get_all("Requires-Dist"))
    return fresh_venv(wheel, tmp_path_factory.mktemp("wheel-venv") / "venv")


def run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "snapmesh"), *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=user_env())


def test_the_installed_commands_answer(installed, tmp_path):
    assert run(installed, "--version", cwd=tmp_path).stdout.startswith("snapmesh ")
    helped = run(installed, "controller", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "usage: snapmesh controller" in helped.stdout, helped.stderr
    where = subprocess.run([str(installed / "python"), "-c", "import snapmesh.v1, snapmesh.settings.config as c; "
                            "print(snapmesh.v1.__file__); print(c.load().data_dir)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path, env=user_env())
    module, data_dir = where.stdout.splitlines()
    assert Path(module).is_relative_to(installed.parent), "snapmesh.v1 came from the checkout, not the wheel"
    # The shipped cluster file keeps its data under the current directory, not in site-packages.
    assert Path(data_dir) == tmp_path.resolve() / "data"


def test_png_needs_the_png_extra_and_says_so(installed, tmp_path):
    result = run(installed, "trace", "--data-dir", str(tmp_path), "--format", "png", "--out", "t.png", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "pip install 'snapmesh[png]'" in result.stderr, result.stderr


def test_a_cluster_runs_from_the_wheel(installed, tmp_path):
    launcher = subprocess.Popen([str(installed / "snapmesh"), "cluster", "up", "--nodes", "2", "--data-dir", "run"],
                                cwd=tmp_path, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = launcher.stdout.readline()
        assert line.startswith("controller: "), (line, launcher.poll(), launcher.stderr.read() if launcher.poll() else "")
        channel, stub = controller_stub(line.split()[1])
        with channel:
            snapshot = stub.TriggerSnapshot(pb.TriggerSnapshotRequest(initiator="p1", wait=True), timeout=30)
        assert snapshot.status == pb.Snapshot.COMPLETE
        assert sum(n.balance for n in snapshot.nodes) == 2 * 1000
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=30) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()  # its children die with it (PR_SET_PDEATHSIG)
            launcher.wait()
        launcher.stdout.close()
        launcher.stderr.close()
    assert (tmp_path / "run" / "logs" / "p1.log").exists()


def readme_first_block() -> list[str]:
    """The commands of the README's first code block, without their comments."""
    block = (ROOT / "README.md").read_text(encoding="utf-8").split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readmes_first_block_runs_as_written_without_copying_an_address(installed, tmp_path):
    from snapmesh.settings import config
    from snapmesh.settings.ports import port_is_free

    lines = readme_first_block()
    assert lines == ["pip install <wheel>", "snapmesh cluster up", "snapmesh snapshot trigger"]  # `installed` did the first
    shipped = config.load(config.DEFAULT_CONFIG)
    ports = [p for e in (shipped.controller, *shipped.nodes) for p in (e.port, e.metrics_port)]
    assert all(port_is_free("127.0.0.1", p) for p in ports), f"another process holds one of the default ports {ports}"
    launcher = subprocess.Popen([str(installed / "snapmesh"), *lines[1].split()[1:]], cwd=tmp_path, env=user_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = launcher.stdout.readline()
        assert line == f"controller: {shipped.controller.address}\n", (line, launcher.poll())
        second = subprocess.run([str(installed / "snapmesh"), *lines[2].split()[1:]], capture_output=True, text=True,
                                timeout=60, cwd=tmp_path.parent, env=user_env())  # another shell, elsewhere
        assert second.returncode == 0, second.stderr
        assert second.stdout.splitlines()[1].split()[1] in ("IN_PROGRESS", "COMPLETE"), second.stdout
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=30) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stdout.close()
        launcher.stderr.close()
    assert config.load(tmp_path / "data" / "cluster.toml").controller.address == shipped.controller.address


def test_the_examples_ship_in_the_wheel_and_say_where_they_are(installed, tmp_path):
    # Issue 45: `snapmesh examples` names a directory inside the install, holding the token ring and
    # the simulator's scenarios; the token ring runs from there as a module, from any directory.
    where = run(installed, "examples", "--path", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    path = Path(where.stdout.strip())
    assert path.is_relative_to(installed.parent) and (path / "token_ring.py").is_file() and (path / "bank.json").is_file()
    listing = run(installed, "examples", cwd=tmp_path).stdout
    assert str(path) in listing and "token_ring.py" in listing and "--app snapmesh.examples.token_ring:app" in listing
    loaded = subprocess.run([str(installed / "python"), "-c", "from snapmesh.app import load_app; "
                             "print(load_app('snapmesh.examples.token_ring:app').name)"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=user_env())
    assert loaded.stdout == "token_ring\n", loaded.stderr
    sim = run(installed, "sim", "run", str(path / "ring.json"), cwd=tmp_path)
    assert sim.returncode == 0, sim.stderr
