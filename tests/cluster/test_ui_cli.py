"""`snapmesh ui`'s bad arguments: exit 2 with one line naming what is wrong, nothing served."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def ui(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snapmesh.cli", "ui", *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--controller", "http://127.0.0.1:1"], "is a URL, not HOST:PORT: give it without the scheme (127.0.0.1:1)"),
        (["--data-dir", "/tmp"], "--data-dir /tmp: no cluster.toml there"),  # it names no controller
        (["--controller", "127.0.0.1:1", "--listen", "nonsense"], "'nonsense' is not HOST:PORT"),
        (["--controller", "127.0.0.1:1", "--listen", "127.0.0.1:99999"], "is not HOST:PORT"),
        (["--controller", "127.0.0.1:1", "--data-dir", "/no/such/dir"], "--data-dir /no/such/dir is not a directory"),
        (["--controller", "127.0.0.1:1", "--tls-dir", "/no/such/tls"], "/no/such/tls"),
    ],
)
def test_bad_arguments_exit_2_naming_them(args, says):
    result = ui(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("snapmesh ui: ") and says in result.stderr, result.stderr
    assert result.stdout == ""


def test_an_address_in_use_exits_2_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = ui("--controller", "127.0.0.1:1", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr
