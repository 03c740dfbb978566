"""A Spark standalone cluster from the pip ``pyspark``: a master and workers as processes.

The pip package has ``bin/spark-class`` and the Master/Worker classes but no
``sbin/start-*.sh``, so they are started directly:

    spark-class org.apache.spark.deploy.master.Master --host H --port P --webui-port W
    spark-class org.apache.spark.deploy.worker.Worker spark://H:P -c 1 -m 1g

``StandaloneCluster`` (a context manager) does that on loopback, waits until every
worker is registered (the master's ``/json`` page), and on exit stops each process
(SIGTERM, then SIGKILL after a grace period) and removes its scratch directory.
Used by the tests and the benchmark; ``snapmesh reconcile --master spark://...`` is
the client side (see ``main.wait_for_master``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

import pyspark

from snapmesh.settings.ports import free_ports

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
HOST = "127.0.0.1"


class StandaloneError(Exception):
    """The cluster did not come up in time (the message says which process and its log)."""


class StandaloneCluster:
    def __init__(self, *, workers: int = 2, cores: int = 1, memory: str = "1g", timeout_s: float = 90) -> None:
        self.workers, self.cores, self.memory, self.timeout_s = workers, cores, memory, timeout_s
        self.port, self.webui_port = free_ports(2)
        self.url = f"spark://{HOST}:{self.port}"
        self.scratch = Path(tempfile.mkdtemp(prefix="snapmesh-spark-standalone-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP=HOST, SPARK_NO_DAEMONIZE="1")
        log = open(self.scratch / f"{name}.log", "wb")  # noqa: SIM115 (the process holds it)
        self.procs.append(
            subprocess.Popen(
                [str(SPARK_CLASS), *args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )
        log.close()

    def _alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.webui_port}/json/", timeout=2) as reply:
                state = json.load(reply)
        except (OSError, ValueError):
            return -1
        return sum(w.get("state") == "ALIVE" for w in state.get("workers", []))

    def __enter__(self) -> StandaloneCluster:
        try:
            self._start(
                "master", "org.apache.spark.deploy.master.Master",
                "--host", HOST, "--port", str(self.port), "--webui-port", str(self.webui_port),
            )
            for i in range(self.workers):
                work = self.scratch / f"worker-{i}"
                work.mkdir()
                (worker_ui,) = free_ports(1)
                self._start(
                    f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                    "--host", HOST, "-c", str(self.cores), "-m", self.memory,
                    "--webui-port", str(worker_ui), "-d", str(work),
                )
            deadline = time.monotonic() + self.timeout_s
            while self._alive_workers() < self.workers:
                dead = [p for p in self.procs if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    raise StandaloneError(
                        f"standalone cluster not up after {self.timeout_s:.0f}s "
                        f"({len(dead)} process(es) exited); logs in {self.scratch}"
                    )
                time.sleep(0.5)
        except BaseException:
            self.stop(keep_logs=True)
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def stop(self, *, keep_logs: bool = False, grace_s: float = 15) -> None:
        """Workers first, then the master: SIGTERM to each process group, SIGKILL after ``grace_s``."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = [p for p in self.procs if p.returncode is None]
        if not keep_logs:
            shutil.rmtree(self.scratch, ignore_errors=True)
