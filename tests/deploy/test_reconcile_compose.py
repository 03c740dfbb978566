"""Compose profile `spark` on the real Docker engine: a standalone master, two workers,
and the job submitted with `spark-submit --master spark://spark-master:7077`.

Synthetic data (with one corruption, so the checksums and the exact joins both run)
is written to the data volume; the one-shot `reconcile` service (local mode) and
`reconcile-spark` (the cluster) must exit alike with the same verdicts. Images are
built from this tree under their own tag, and everything runs under the shared
Docker lock; the project is removed with its volume at the end.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid

import pytest

from support.helpers_deploy import build_images, compose_bin, compose_cmd, docker_engine_answers, log, project_leftovers, run

pytestmark = [pytest.mark.docker, pytest.mark.spark, pytest.mark.timeout(1800)]

TAG = "reconcile-spark-test"
DOCKER_LOCK = "/tmp/snapmesh-docker.lock"


def test_spark_profile_gives_the_verdicts_of_local_mode():
    if not docker_engine_answers() or compose_bin() is None:
        pytest.skip("no Docker engine or Compose: the compose spark profile was NOT tested")
    with open(DOCKER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        images = build_images(TAG)
        project = f"snapmeshspark-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "SNAPMESH_"))},
            "SNAPMESH_IMAGE": images["service"],
            "SNAPMESH_RECONCILE_IMAGE": images["reconcile"],
            "SNAPMESH_RESTART": "no",
        }

        def compose(*args: str, check: bool = True, timeout: float = 600):
            return run(compose_cmd(project, "--profile", "reconcile", "--profile", "spark", *args),
                       env=env, timeout=timeout, check=check)

        def summary(path: str) -> dict:
            out = compose("run", "--rm", "-T", "--no-deps", "--entrypoint", "cat", "reconcile", path).stdout
            return json.loads(out)

        try:
            compose("run", "--rm", "-T", "--no-deps", "reconcile", "synth", "--out", "/data", "--nodes", "3",
                    "--transfers", "300", "--snapshots", "3", "--seed", "5", "--corrupt", "missing-inflight")
            local = compose("run", "--rm", "-T", "--no-deps", "reconcile", check=False)
            assert local.returncode == 1, local.stdout[-2000:] + local.stderr[-2000:]
            cluster = compose("run", "--rm", "-T", "reconcile-spark", check=False)
            log("reconcile-spark: " + " | ".join(cluster.stdout.strip().splitlines()[-3:]))
            assert cluster.returncode == 1, cluster.stdout[-2000:] + cluster.stderr[-4000:]
            workers = compose("ps", "--services", "--filter", "status=running").stdout.split()
            assert {"spark-master", "spark-worker-1", "spark-worker-2"} <= set(workers), workers
            expected = summary("/data/reconcile/summary.json")["verdicts"]
            assert summary("/data/reconcile-spark/summary.json")["verdicts"] == expected
            assert any(v["consistent"] is False for v in expected)
        finally:
            compose("down", "-v", "--remove-orphans", "-t", "5", check=False, timeout=180)
            left = project_leftovers(project)
            assert not any(left.values()), f"compose project {project} left behind {left}"
