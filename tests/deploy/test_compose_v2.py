"""Compose v2 (`docker compose`) first, v1 (`docker-compose`) where only that exists.

The Makefile, snapmesh.processes.compose_cli (the chaos campaign, the tests) and the EC2
user data each choose, the same way. This machine has only v1, so v2 is played by
a stand-in `docker` script on PATH that answers `docker compose ...` (and v1-only
by a `docker` that refuses it): the choice is what is tested here; the real
Compose runs in tests/deploy/test_compose.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from snapmesh.processes import compose_cli

REPO = Path(__file__).resolve().parents[2]
USER_DATA = REPO / "deploy" / "terraform-ec2" / "user_data.sh.tftpl"


def fake_bin(tmp_path: Path, *, v2: bool, v1: bool) -> str:
    """A PATH whose `docker` answers `compose` (v2) or not, with or without `docker-compose`."""
    bin_dir = tmp_path / ("v2" if v2 else "v1" if v1 else "none")
    bin_dir.mkdir()
    compose_exit = 0 if v2 else 1
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = compose ]; then [ {compose_exit} = 0 ] && echo "v2 $*"; exit {compose_exit}; fi\n'
        'echo "docker $*"\n'
    )
    if v1:
        (bin_dir / "docker-compose").write_text('#!/bin/sh\necho "v1 $*"\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin" if v1 or v2 else str(bin_dir)


@pytest.mark.parametrize(("v2", "v1", "expected"), [
    (True, True, ["docker", "compose"]),
    (True, False, ["docker", "compose"]),
    (False, True, ["docker-compose"]),
    (False, False, None),
])
def test_compose_cli_prefers_v2_and_falls_back_to_v1(tmp_path, v2, v1, expected):
    path = fake_bin(tmp_path, v2=v2, v1=v1)
    if not v1 and not v2:
        assert compose_cli.compose_command({"PATH": path}) is None
        assert "neither `docker compose`" in compose_cli.problem({"PATH": path})
        return
    assert compose_cli.compose_command({"PATH": path}) == expected
    assert compose_cli.problem({"PATH": path}) == ""


def test_snapmesh_compose_overrides_the_choice(tmp_path):
    path = fake_bin(tmp_path, v2=True, v1=True)
    assert compose_cli.compose_command({"PATH": path, "SNAPMESH_COMPOSE": "docker-compose"}) == ["docker-compose"]


def test_this_machines_compose_answers():
    """Whatever is chosen here (v1 on the project's machines, v2 on GitHub's runners) runs."""
    command = compose_cli.compose_command()
    if command is None:
        pytest.skip("no Compose installed here")
    done = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def make_dry_run(path: str, target: str = "compose-down") -> str:
    env = {k: v for k, v in os.environ.items() if k != "SNAPMESH_COMPOSE"}
    done = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**env, "PATH": path})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("v2", "expected"), [(True, "docker compose -f"), (False, "docker-compose -f")])
def test_the_makefile_runs_v2_where_it_answers_else_v1(tmp_path, v2, expected):
    out = make_dry_run(fake_bin(tmp_path, v2=v2, v1=True))
    assert f"{expected} deploy/compose/docker-compose.yml down" in out, out


def user_data_compose_function() -> str:
    text = USER_DATA.read_text(encoding="utf-8")
    match = re.search(r"^compose\(\) \{\n.*?^\}\n", text, re.M | re.S)
    assert match, "user_data defines no compose() function"
    assert "$${" not in match.group(0) and "${" not in match.group(0), "the function must need no template escapes"
    return match.group(0)


@pytest.mark.parametrize(("v2", "expected"), [(True, "v2 compose up -d"), (False, "v1 up -d")])
def test_the_ec2_user_data_runs_v2_where_it_answers_else_v1(tmp_path, v2, expected):
    function = user_data_compose_function()
    done = subprocess.run(["bash", "-c", function + "compose up -d"], capture_output=True, text=True, timeout=30,
                          env={"PATH": fake_bin(tmp_path, v2=v2, v1=True)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    text = USER_DATA.read_text(encoding="utf-8")
    assert re.search(r"^compose up -d$", text, re.M) and not re.search(r"^docker-compose ", text, re.M)
