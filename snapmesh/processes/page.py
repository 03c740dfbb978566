"""The snapshot page of a supervised cluster, as a child process of its own: `PageProcess`.

`snapmesh cluster up` and `snapmesh demo` serve the page (`snapmesh ui`). It
reads node logs to draw its pictures, so its memory follows what a visitor
asks for; inside the supervisor, an out-of-memory kill of the page would take
the cluster's supervisor, and with it every node, down too. As its own child
it is one more `Child` (`snapmesh.processes.child`): its own session, killed
with the supervisor (PR_SET_PDEATHSIG), its output in `<data_dir>/logs/ui.log`.

`start` runs `snapmesh ui --listen HOST:PORT` (port 0, a free one, when the one
asked for is taken) and returns once the page prints its `ui:` line, its URL;
`restart_if_exited` starts it again on the port it had, so the URL printed
stays right; `close` stops it (SIGTERM, SIGKILL after a grace).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from snapmesh.processes.child import STOP_TIMEOUT_S, Child, SupervisorError
from snapmesh.settings.ports import port_is_free

PAGE_START_S = 15.0  # longest wait for the page's `ui:` line


class PageProcess:
    """`snapmesh ui` for one supervised cluster (`snapmesh.processes.supervisor.Cluster`)."""

    def __init__(self, cluster, *, python: str = sys.executable) -> None:
        self._cluster = cluster
        self._python = python
        self._listen: tuple[str, int] | None = None
        self.url: str | None = None
        self.child: Child | None = None

    def start(self, host: str, port: int) -> str:
        """Serve the page on `host:port`, or on a free port of `host` when that one
        is taken; its URL. OSError when it does not come up (its log's tail said)."""
        if port and not port_is_free(host, port):
            port = 0
        self.child = self._child(host, port)
        self.url = self._run(self.child)
        self._listen = (host, int(self.url.rstrip("/").rsplit(":", 1)[1]))
        return self.url

    def restart_if_exited(self) -> str | None:
        """Start the page again, on the port it had, if it exited; what to say then (None: it runs)."""
        if self.child is None or self.child.alive or self._listen is None:
            return None
        status = self.child.returncode
        self.child = self._child(*self._listen)
        try:
            self._run(self.child)
        except OSError as exc:
            return f"the snapshot page exited (status {status}) and did not come back: {exc}"
        return f"the snapshot page exited (status {status}); started again at {self.url}"

    @property
    def pid(self) -> int:
        if self.child is None:
            raise SupervisorError("the page was never started")
        return self.child.pid

    def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        if self.child is not None:
            self.child.stop(timeout)

    # -- internals

    def _child(self, host: str, port: int) -> Child:
        cluster = self._cluster
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        argv = [self._python, "-m", "snapmesh.cli", "ui", "--controller", cluster.controller_address,
                "--data-dir", str(cluster.data_dir), "--listen", listen]
        env, identity = cluster.child_env, cluster.client_identity
        if "SNAPMESH_TLS_DIR" not in env and identity is not None and identity.files is not None:
            argv += ["--tls-dir", str(Path(identity.files[0]).parent)]  # the cluster file's [tls]: the client's files
        return Child("ui", argv, log_path=cluster.log_dir / "ui.log", env=env)

    def _run(self, child: Child) -> str:
        """Start `child` and return the URL of its `ui:` line; OSError, the child stopped, if none comes."""
        child.start(wait=False)
        deadline = time.monotonic() + PAGE_START_S
        while time.monotonic() < deadline:
            url = _url_line(child.output(), child.starts)
            if url is not None:
                return url
            if not child.alive:
                break
            time.sleep(0.05)
        child.kill()
        raise OSError(f"the page did not start (see {child.log_path}): {child.log_tail(5)}")


def _url_line(output: str, start: int) -> str | None:
    """The URL of the `ui:` line the child printed after its start number `start`'s header."""
    text = output.rsplit(f"---- start #{start}:", 1)
    if len(text) < 2:
        return None
    for line in text[1].splitlines():
        if line.startswith("ui: http"):
            return line.split(" ", 1)[1].strip()
    return None
