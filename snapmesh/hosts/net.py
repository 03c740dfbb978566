"""The executor of snapmesh.hosts.plan: runs its `ip`/`tc`/`iptables` commands,
starts the daemons a fault needs (through the supervisor, on their host), and
takes everything down again.

    with Network(["controller", "p1", "p2"], log_dir=work / "logs") as net:
        net.hosts["p1"]                      # child.Host: where to start p1
        cut = net.apply(net.plan.partition(["p1"], ["p2"], one_way=True))
        net.heal(cut)
    # gone: namespaces, links, the bridge, firewall rules, hosts files

`down` (also on exit, on an exception, and from the launcher on Ctrl-C)
deletes the run's namespaces, which takes their links, the bridge and every
rule with them, then the gateway link and the hosts files; `leftovers(run_id)`
lists what of a run is still on the machine (the tests check it is nothing).
A supervisor killed with SIGKILL takes its processes with it (PR_SET_PDEATHSIG)
but cannot remove its network: each run notes its owner's pid in
/run/snapmesh-hosts/<run id>, and the next run's `up` removes every run whose
owner is gone (`sweep`).

Without the rights (root, `ip`, `tc`, `iptables`, a namespace we can make)
`MissingRights` says, in one line, what is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import secrets
import select
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from snapmesh.hosts import plan
from snapmesh.hosts.plan import Bench, Command, Fault
from snapmesh.processes.child import Child, Host, SupervisorError, run_on_host

SUBNETS = ipaddress.IPv4Network("10.231.0.0/16")  # each run takes a free /24 of it
SUBNET_PREFIX = 24
LOCK_FILE = Path("/run/lock/snapmesh-hosts.lock")
OWNERS = Path("/run/snapmesh-hosts")  # <run id> -> the pid of the process that owns the run
DAEMON_READY_TIMEOUT_S = 10.0
_ROOT = Path(__file__).resolve().parent.parent.parent


class MissingRights(RuntimeError):
    """The machine lacks something the bench needs; the message, one line, says what."""


class NetworkError(RuntimeError):
    """A command of the bench failed; the message names it and what it printed."""


def missing_rights() -> str | None:
    """What the bench lacks here, in one line (None: nothing)."""
    if os.geteuid() != 0:
        return f"needs root for network namespaces and firewall rules (running as uid {os.geteuid()})"
    for tool in ("ip", "tc", "iptables"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` on PATH (iproute2 and iptables)"
    name = f"{plan.PREFIX}-check-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip() or 'ip netns add failed'}"
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    return None


def leftovers(run_id: str) -> list[str]:
    """What of run `run_id` is still on this machine: namespaces, the gateway link, hosts files."""
    prefix = f"{plan.PREFIX}-{run_id}-"
    found = []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"namespace {line.split()[0]}" for line in listed.splitlines() if line.startswith(prefix)]
    link = subprocess.run(["ip", "link", "show", "dev", f"{plan.GATEWAY_PREFIX}{run_id}"], capture_output=True)
    if link.returncode == 0:
        found.append(f"link {plan.GATEWAY_PREFIX}{run_id}")
    etc = Path("/etc/netns")
    if etc.is_dir():
        found += [f"hosts file dir {p}" for p in etc.iterdir() if p.name.startswith(prefix)]
    if (OWNERS / run_id).exists():
        found.append(f"owner file {OWNERS / run_id}")
    return found


def remove_run(run_id: str) -> None:
    """Delete whatever of run `run_id` is left, by its names alone."""
    prefix = f"{plan.PREFIX}-{run_id}-"
    subprocess.run(["ip", "link", "delete", "dev", f"{plan.GATEWAY_PREFIX}{run_id}"], capture_output=True)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        if line.startswith(prefix):
            subprocess.run(["ip", "netns", "delete", line.split()[0]], capture_output=True)
    etc = Path("/etc/netns")
    if etc.is_dir():
        for path in etc.glob(f"{prefix}*"):
            shutil.rmtree(path, ignore_errors=True)
    (OWNERS / run_id).unlink(missing_ok=True)


def sweep() -> list[str]:
    """Remove every run whose owner process is gone (killed before it could clean up); their ids."""
    swept = []
    if OWNERS.is_dir():
        for owner in OWNERS.iterdir():
            try:
                pid = int(owner.read_text().strip())
                os.kill(pid, 0)
                continue  # alive: its run is its own business
            except ProcessLookupError:
                pass
            except (ValueError, OSError):
                continue
            remove_run(owner.name)
            swept.append(owner.name)
    return swept


def _used_subnets() -> set[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    out += subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    used = set()
    for word in out.split():
        with contextlib.suppress(ValueError):
            if "/" in word:
                used.add(ipaddress.IPv4Network(word, strict=False))
    return used


def free_subnet(run_id: str, used: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 of SUBNETS that overlaps nothing in `used`, starting where the run id points."""
    candidates = list(SUBNETS.subnets(new_prefix=SUBNET_PREFIX))
    start = zlib.crc32(run_id.encode()) % len(candidates)
    used = list(used)
    for i in range(len(candidates)):
        net = candidates[(start + i) % len(candidates)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetworkError(f"no free /24 left in {SUBNETS}")


class Network:
    """One run's hosts: `names` ("controller", "p1", ...)."""

    def __init__(self, names: Sequence[str], *, run_id: str | None = None, log_dir: str | os.PathLike[str] = ".",
                 env: dict[str, str] | None = None) -> None:
        self.names = list(names)
        self.run_id = run_id or secrets.token_hex(3)
        self.log_dir = Path(log_dir)
        self._env = dict(os.environ if env is None else env)
        self._env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), self._env.get("PYTHONPATH")) if p)
        self.plan: Bench | None = None
        self.active: list[Fault] = []
        self._daemons: dict[int, list[Child]] = {}

    # ------------------------------------------------------------- up, down

    @property
    def hosts(self) -> dict[str, Host]:
        bench = self._bench()
        return {h.name: Host(h.name, h.namespace, h.address) for h in bench.hosts}

    def up(self) -> Network:
        """Build the bench; MissingRights without the rights, NetworkError (and nothing left) on a failure."""
        if problem := missing_rights():
            raise MissingRights(problem)
        try:
            LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
            with open(LOCK_FILE, "a") as lock:  # two runs must not pick the same subnet
                fcntl.flock(lock, fcntl.LOCK_EX)
                sweep()
                OWNERS.mkdir(parents=True, exist_ok=True)
                (OWNERS / self.run_id).write_text(f"{os.getpid()}\n")
                self.plan = Bench.build(self.run_id, self.names, free_subnet(self.run_id, _used_subnets()))
                for command in self.plan.setup():
                    self._run(command)
            for path in self.plan.hosts_file_paths():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(self.plan.hosts_file(), encoding="utf-8")
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> list[str]:
        """Stop the daemons, delete everything of this run; what could not be removed (normally nothing)."""
        for children in self._daemons.values():
            for child in children:
                child.stop(2.0)
        self._daemons.clear()
        self.active.clear()
        if self.plan is not None:
            for command in self.plan.teardown():
                subprocess.run(command, capture_output=True)
        remove_run(self.run_id)  # and whatever a failed `up` made before it had a plan
        return leftovers(self.run_id)

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc_info) -> None:
        self.down()

    # ------------------------------------------------------------- faults

    def apply(self, fault: Fault) -> Fault:
        """Start its daemons (each ready), then run its commands; NetworkError (and it undone) on a failure."""
        children = []
        try:
            for daemon in fault.daemons:
                children.append(self._start_daemon(daemon))
            self._daemons[id(fault)] = children
            self.active.append(fault)
            for command in fault.apply:
                self._run(command)
        except BaseException:
            self.heal(fault)
            raise
        return fault

    def heal(self, fault: Fault) -> None:
        """Undo one fault (its rules, then its daemons); a rule already gone is no error."""
        if fault in self.active:
            self.active.remove(fault)
        for command in fault.undo:
            subprocess.run(command, capture_output=True)
        for child in self._daemons.pop(id(fault), []):
            child.stop(2.0)

    def heal_all(self) -> None:
        for fault in list(reversed(self.active)):
            self.heal(fault)

    def probe(self, src: str, dst: str, port: int, count: int = 20) -> dict[str, float]:
        """The round trip from host `src` to `dst`'s `port` (snapmesh.hosts.probe), in ms."""
        import json

        done = run_on_host(self.hosts[src], [sys.executable, "-m", "snapmesh.hosts.probe", "rtt", dst, str(port),
                                             "--count", str(count)], env=self._env)
        if done.returncode != 0:
            raise NetworkError(f"probe {src} -> {dst}:{port} failed: {done.stderr.strip()[-300:]}")
        return json.loads(done.stdout)

    def reaches(self, src: str, dst: str, port: int = 9999) -> bool:
        """Do datagrams `src` sends reach `dst`? (One way: what a TCP connect cannot tell.)
        The listener answers at the first datagram; after the sender is done it has `grace` s more."""
        grace = 0.5
        argv = [sys.executable, "-m", "snapmesh.hosts.probe"]
        listener = subprocess.Popen(self.hosts[dst].command([*argv, "listen", dst, str(port), "--seconds", "60"]),
                                    stdout=subprocess.PIPE, text=True, env=self._env)
        try:
            if listener.stdout.readline().strip() != "listening":
                raise NetworkError(f"the listener on {dst} did not start")
            sent = run_on_host(self.hosts[src], [*argv, "send", dst, str(port), "--count", "10"], env=self._env)
            if sent.returncode != 0:
                raise NetworkError(f"sending from {src} to {dst} failed: {sent.stderr.strip()[-300:]}")
            ready, _, _ = select.select([listener.stdout], [], [], grace)
            return bool(ready) and listener.stdout.readline().strip() == "got"
        finally:
            listener.kill()
            listener.wait()

    def send_time(self, src: str, dst: str, size: int, port: int = 9998) -> float:
        """Seconds for `src` to send `size` bytes over TCP to `dst` (a bandwidth limit shows here)."""
        import json

        argv = [sys.executable, "-m", "snapmesh.hosts.probe"]
        receiver = subprocess.Popen(self.hosts[dst].command([*argv, "sink", dst, str(port)]),
                                    stdout=subprocess.PIPE, text=True, env=self._env)
        try:
            if receiver.stdout.readline().strip() != "listening":
                raise NetworkError(f"the sink on {dst} did not start")
            done = run_on_host(self.hosts[src], [*argv, "blast", dst, str(port), "--count", str(size)], env=self._env)
            if done.returncode != 0:
                raise NetworkError(f"sending {size} bytes {src} -> {dst} failed: {done.stderr.strip()[-300:]}")
            return json.loads(done.stdout)["seconds"]
        finally:
            receiver.kill()
            receiver.wait()

    # ------------------------------------------------------------- helpers

    def _bench(self) -> Bench:
        if self.plan is None:
            raise NetworkError("the bench is not up")
        return self.plan

    def _run(self, command: Command) -> None:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise NetworkError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()}")

    def _start_daemon(self, daemon: plan.Daemon) -> Child:
        host = self.hosts[daemon.host]
        log = self.log_dir / f"{daemon.argv[2].rsplit('.', 1)[-1]}-{daemon.host}.log"
        child = Child(f"{daemon.argv[2]} on {daemon.host}", daemon.argv, log_path=log, env=self._env, host=host)
        child.start(wait=False)
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        while daemon.ready not in child.output().split("---- start")[-1]:
            if not child.alive or time.monotonic() > deadline:
                child.kill()
                raise SupervisorError(f"{child.name} did not print {daemon.ready!r}: {child.log_tail(5)}")
            time.sleep(0.02)
        return child
