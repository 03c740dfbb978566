"""Which Docker Compose to run: v2 (`docker compose`) where it exists, else v1.

Compose v1 (the `docker-compose` command) is end-of-life, but it is still what
some machines have (Debian bookworm's `docker-compose` package, this project's
test machines). Every caller (the chaos campaign, the tests) asks here, as the
Makefile's `COMPOSE` and the EC2 user data do in shell:

* ``SNAPMESH_COMPOSE`` set (e.g. ``"docker-compose"``): that command, split on spaces;
* else ``docker compose version`` exits 0: ``["docker", "compose"]``;
* else ``docker-compose`` is on PATH: ``["docker-compose"]``;
* else ``None`` (:func:`problem` says why).
"""

from __future__ import annotations

import os
import shutil
import subprocess

ENV = "SNAPMESH_COMPOSE"


def _v2_answers(path: str | None) -> bool:
    docker = shutil.which("docker", path=path)
    if docker is None:
        return False
    try:
        done = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30,
                              env={**os.environ, "PATH": path} if path is not None else None)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


_cache: dict[tuple[str | None, str | None], list[str] | None] = {}


def compose_command(env: dict[str, str] | None = None) -> list[str] | None:
    """The Compose command (a list to prefix arguments with), or None if there is none."""
    env = os.environ if env is None else env
    key = (env.get(ENV), env.get("PATH"))
    if key not in _cache:
        chosen: list[str] | None
        if env.get(ENV, "").strip():
            chosen = env[ENV].split()
        elif _v2_answers(env.get("PATH")):
            chosen = ["docker", "compose"]
        elif shutil.which("docker-compose", path=env.get("PATH")) is not None:
            chosen = ["docker-compose"]
        else:
            chosen = None
        _cache[key] = chosen
    found = _cache[key]
    return None if found is None else list(found)


def problem(env: dict[str, str] | None = None) -> str:
    """Why no Compose can run here ("" when one can)."""
    if compose_command(env) is not None:
        return ""
    return "neither `docker compose` (Compose v2) nor `docker-compose` (v1) is installed"
