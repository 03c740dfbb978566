"""`python -m snapmesh.services.node.process`: the node's module runs as a program, every
name it needs defined before `main()` runs (a helper defined below the
`__main__` guard raised NameError at start-up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from support.node_harness import REPO, cluster_file

from snapmesh.processes.child import wait_serving


def _node_module(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "snapmesh.services.node.process", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_help_prints_the_usage_and_exits_0() -> None:
    proc = _node_module("--help")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.startswith("usage: snapmesh node") and "--config" in out and "--id" in out


def test_a_bad_flow_mark_is_refused_with_exit_2_not_a_name_error(tmp_path: Path) -> None:
    config, _ = cluster_file(tmp_path, ["n0", "n1"])
    proc = _node_module("--config", str(config), "--id", "n0", env={"SNAPMESH_FLOW_MARK": "lots"})
    out, err = proc.communicate(timeout=60)
    assert "NameError" not in err
    assert proc.returncode == 2, err
    assert "SNAPMESH_FLOW_MARK: must be a positive integer, got 'lots'" in err


def test_the_module_serves_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    config, ports = cluster_file(tmp_path, ["n0", "n1"])
    proc = _node_module("--config", str(config), "--id", "n0")
    lines: list[str] = []
    serving = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "node n0 serving on" in line:
                serving.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert serving.wait(60), "".join(lines)
        wait_serving(f"127.0.0.1:{ports['n0']['port']}", 60)  # its stop signals are handled from here on
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
    assert not any("Traceback" in line for line in lines), "".join(lines)
