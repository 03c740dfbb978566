"""A user's machine for the wheel's app tests: a venv with the wheel (and Spark linked in),
a directory outside the checkout, and `snapmesh cluster up` started from there.

Shared by tests/deploy/test_wheel_app.py (a one-file app) and
tests/deploy/test_wheel_shop.py (examples/shop from the wheel, both ways).
"""

from __future__ import annotations

import importlib.util
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.wheel_build import user_env


def link_spark_into(bin_dir: Path) -> None:
    """The reconcile extra in the venv: this venv's pyspark and py4j, by a .pth file
    naming a directory that holds links to those two packages only."""
    site = next((bin_dir.parent / "lib").glob("python3*/site-packages"))
    extra = bin_dir.parent / "spark-packages"
    extra.mkdir()
    for package in ("pyspark", "py4j"):
        spec = importlib.util.find_spec(package)
        assert spec and spec.submodule_search_locations, f"{package} is not installed here: make install"
        (extra / package).symlink_to(Path(next(iter(spec.submodule_search_locations))), target_is_directory=True)
    (site / "snapmesh-test-spark.pth").write_text(f"{extra}\n")


@dataclass
class User:
    """A user's machine: the venv's bin/ and the directory their app lives in."""

    bin: Path
    home: Path

    def snapmesh(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "snapmesh"), *args], capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or self.home, env=env or user_env())

    def start(self, *args: str, cwd: Path | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen([str(self.bin / "snapmesh"), *args], cwd=cwd or self.home, env=user_env(), text=True,
                                **kwargs)

    def python(self, *args: str, cwd: Path | None = None, **kwargs) -> subprocess.Popen:
        """The venv's python (`-m snapmesh.examples...`), started."""
        return subprocess.Popen([str(self.bin / "python"), *args], cwd=cwd or self.home, env=user_env(), text=True,
                                **kwargs)


def stop(process: subprocess.Popen, sig: int = 2) -> int:
    """Signal (SIGINT by default) and wait; SIGKILL after 60 s. Its exit status."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()  # its children die with it (PR_SET_PDEATHSIG)
            process.wait(10)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    return process.returncode


def launch(user: User, app: str, data: Path, *, ui: str = "off") -> tuple[subprocess.Popen, dict[str, str]]:
    """`snapmesh cluster up --nodes 3 --app APP` from the user's directory; its printed addresses by name."""
    err = open(data.parent / f"{data.name}-cluster-up.err", "w")  # noqa: SIM115  (the launcher's for its life)
    process = user.start("cluster", "up", "--nodes", "3", "--data-dir", str(data), "--ui", ui, "--app", app,
                         stdout=subprocess.PIPE, stderr=err)
    err.close()
    printed: dict[str, str] = {}
    while "ui" not in printed and not (ui == "off" and "node p3" in printed):
        line = process.stdout.readline()
        if not line:
            stop(process)
            raise AssertionError(f"cluster up stopped: {(data.parent / f'{data.name}-cluster-up.err').read_text()}")
        name, _, rest = line.partition(": ")
        printed[name] = rest.split()[0]
    return process, printed
