"""The multi-host bench as data: which hosts, which addresses, and the exact
`ip`/`tc`/`iptables` command lines that build it, fault it and take it down.

Pure: nothing here runs a command, reads the clock or touches a file. The
executor (snapmesh.hosts.net) runs what this module describes; the tests read
the descriptions directly.

The topology, for a run id R (the names carry it, so two runs on one machine
never collide):

    root namespace            snapmesh-R-switch                 snapmesh-R-<host>
    smh-R  10.231.X.1 <--veth--> gw ---- br0 ---- <host> <--veth--> eth0  10.231.X.n

- every host (the controller, p1, p2, ...) is a network namespace
  `snapmesh-R-<host>` with one link, `eth0`, its own address, and its own
  hosts file (`/etc/netns/snapmesh-R-<host>/hosts`, which `ip netns exec`
  mounts on /etc/hosts): peers dial each other by name;
- the hosts' links meet on a bridge in a namespace of its own (the switch),
  so no firewall rule of the machine (Docker's FORWARD policy) sees them;
- the machine itself reaches the hosts through the gateway link `smh-R`
  (the supervisor's health checks, the tests, the CLI's clients); it is no
  host, so faults between hosts never touch it.

Faults are rules inside the hosts' own namespaces, so deleting the namespaces
removes them with everything else:

- a partition drops, at the receiver (`iptables -A INPUT -s SENDER -j DROP`),
  what one side sends the other: silent loss, as a cut cable, not an error at
  the sender; both ways or one way only;
- a bandwidth limit is a `tbf` qdisc on both ends of the host's link;
- a one-way delay queues every packet the host sends on its link to NFQUEUE,
  where a userspace delayer in the host's namespace (snapmesh.hosts.delayer)
  holds it for N ms before letting it go. This kernel has no `netem` and no
  `fq` (which would honour an eBPF-set departure time); NFQUEUE is built in.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Command = tuple[str, ...]

PREFIX = "snapmesh"
GATEWAY_PREFIX = "smh-"  # + run id: the one interface in the machine's own namespace (15 characters at most)
RUN_ID = re.compile(r"^[0-9a-z]{1,10}$")
HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,14}$")
LINK = "eth0"  # every host's one link
BRIDGE = "br0"
DELAY_QUEUE = 0  # the NFQUEUE number of the delayer (queues are per namespace)


class PlanError(ValueError):
    """A bench that cannot be built as asked (the message says which part)."""


@dataclass(frozen=True, slots=True)
class HostPlan:
    name: str  # "controller", "p1", ...: what the hosts file and the cluster file call it
    namespace: str
    address: str
    port: str  # its link's end on the switch


@dataclass(frozen=True, slots=True)
class Daemon:
    """A long-running process a fault needs on a host (the delayer)."""

    host: str
    argv: tuple[str, ...]
    ready: str  # the line it prints once it works


@dataclass(frozen=True, slots=True)
class Fault:
    """One network fault: the commands that apply it, and those that undo it,
    in order; `daemons` start before `apply` and stop after `undo`."""

    kind: str
    describe: str
    apply: tuple[Command, ...]
    undo: tuple[Command, ...]
    daemons: tuple[Daemon, ...] = ()


# The network fault kinds, as the chaos table names them.
PARTITION = "net_partition"  # both ways between two groups
PARTITION_ONE_WAY = "net_partition_one_way"  # one group's packets to the other dropped; the reverse flows
ISOLATE = "net_isolate"  # a host cut off from some peers, not from the controller
SPLIT = "net_split"  # a minority and a majority (the controller with the majority)
BANDWIDTH = "net_bandwidth"  # a rate limit on a host's link
DELAY = "net_delay"  # a one-way delay on a host's link
KINDS = (PARTITION, PARTITION_ONE_WAY, ISOLATE, SPLIT, BANDWIDTH, DELAY)


@dataclass(frozen=True, slots=True)
class Bench:
    run_id: str
    subnet: ipaddress.IPv4Network
    hosts: tuple[HostPlan, ...]
    gateway_address: str
    switch: str = field(default="")
    gateway: str = field(default="")

    # ------------------------------------------------------------- building

    @classmethod
    def build(cls, run_id: str, names: Sequence[str], subnet: str | ipaddress.IPv4Network) -> Bench:
        """Hosts `names` on `subnet` (a /24 or larger): the gateway takes the first
        address, the hosts the next ones in order."""
        if not RUN_ID.match(run_id):
            raise PlanError(f"run id {run_id!r}: 1-10 lowercase letters or digits")
        net = ipaddress.IPv4Network(subnet)
        if not names:
            raise PlanError("a bench needs at least one host")
        if len(set(names)) != len(names):
            raise PlanError(f"host names repeat: {list(names)}")
        for name in names:
            if not HOST_NAME.match(name) or name in ("switch", "gw"):
                raise PlanError(f"host name {name!r}: a lowercase letter, then up to 14 letters or digits "
                                "(not 'switch' or 'gw')")
        addresses = list(net.hosts())
        if len(addresses) < len(names) + 1:
            raise PlanError(f"subnet {net} has room for {len(addresses) - 1} hosts, {len(names)} asked")
        hosts = tuple(
            HostPlan(name, f"{PREFIX}-{run_id}-{name}", str(addresses[i + 1]), name) for i, name in enumerate(names)
        )
        return cls(run_id, net, hosts, str(addresses[0]), f"{PREFIX}-{run_id}-switch", f"{GATEWAY_PREFIX}{run_id}")

    def host(self, name: str) -> HostPlan:
        for host in self.hosts:
            if host.name == name:
                return host
        raise PlanError(f"no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.switch, *(h.namespace for h in self.hosts))

    def hosts_file(self) -> str:
        """The /etc/hosts every host reads: the names of all of them."""
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{h.address} {h.name}" for h in self.hosts]
        return "\n".join(lines) + "\n"

    def hosts_file_paths(self) -> tuple[str, ...]:
        return tuple(f"/etc/netns/{h.namespace}/hosts" for h in self.hosts)

    def setup(self) -> tuple[Command, ...]:
        prefix = self.subnet.prefixlen
        sw = ("ip", "-n", self.switch)
        commands: list[Command] = [
            ("ip", "netns", "add", self.switch),
            (*sw, "link", "add", BRIDGE, "type", "bridge"),
            (*sw, "link", "set", "dev", BRIDGE, "up"),
            (*sw, "link", "set", "dev", "lo", "up"),
        ]
        for host in self.hosts:
            on = ("ip", "-n", host.namespace)
            commands += [
                ("ip", "netns", "add", host.namespace),
                ("ip", "link", "add", LINK, "netns", host.namespace, "type", "veth",
                 "peer", "name", host.port, "netns", self.switch),
                (*sw, "link", "set", "dev", host.port, "master", BRIDGE, "up"),
                (*on, "addr", "add", f"{host.address}/{prefix}", "dev", LINK),
                (*on, "link", "set", "dev", LINK, "up"),
                (*on, "link", "set", "dev", "lo", "up"),
            ]
        commands += [
            ("ip", "link", "add", self.gateway, "type", "veth", "peer", "name", "gw", "netns", self.switch),
            (*sw, "link", "set", "dev", "gw", "master", BRIDGE, "up"),
            ("ip", "addr", "add", f"{self.gateway_address}/{prefix}", "dev", self.gateway),
            ("ip", "link", "set", "dev", self.gateway, "up"),
        ]
        return tuple(commands)

    def teardown(self) -> tuple[Command, ...]:
        """Each may fail (already gone); the executor runs them all regardless.
        Deleting a namespace deletes its links (and their peers) and its rules."""
        return (("ip", "link", "delete", "dev", self.gateway), *(("ip", "netns", "delete", ns) for ns in self.namespaces))

    # ------------------------------------------------------------- faults

    def _names(self, group: Iterable[str]) -> list[HostPlan]:
        hosts = [self.host(name) for name in group]
        if not hosts:
            raise PlanError("a fault needs at least one host on each side")
        return hosts

    def _drop(self, senders: list[HostPlan], receivers: list[HostPlan], action: str) -> list[Command]:
        return [
            ("ip", "netns", "exec", r.namespace, "iptables", "-w", action, "INPUT", "-s", s.address,
             "-m", "comment", "--comment", f"{PREFIX}-{self.run_id}", "-j", "DROP")
            for s in senders for r in receivers if s.name != r.name
        ]

    def partition(self, side_a: Iterable[str], side_b: Iterable[str], *, one_way: bool = False,
                  kind: str | None = None) -> Fault:
        """Drop what `side_a` sends `side_b`; unless `one_way`, the reverse too."""
        a, b = self._names(side_a), self._names(side_b)
        if {h.name for h in a} & {h.name for h in b}:
            raise PlanError(f"a host on both sides of a partition: {sorted({h.name for h in a} & {h.name for h in b})}")
        names_a, names_b = " ".join(h.name for h in a), " ".join(h.name for h in b)
        describe = f"{names_a} -/-> {names_b}" if one_way else f"{names_a} <-/-> {names_b}"
        pairs = [(a, b)] if one_way else [(a, b), (b, a)]
        apply = [c for s, r in pairs for c in self._drop(s, r, "-A")]
        undo = [c for s, r in pairs for c in self._drop(s, r, "-D")]
        return Fault(kind or (PARTITION_ONE_WAY if one_way else PARTITION), describe, tuple(apply), tuple(undo))

    def isolate(self, host: str, peers: Iterable[str]) -> Fault:
        """`host` cut off (both ways) from `peers`; everything else (the controller) still reaches it."""
        fault = self.partition([host], peers, kind=ISOLATE)
        return Fault(ISOLATE, f"{host} cut off from {' '.join(peers)}", fault.apply, fault.undo)

    def split(self, minority: Iterable[str], majority: Iterable[str]) -> Fault:
        """Two sides that cannot reach each other, the smaller one first."""
        minority, majority = list(minority), list(majority)
        if len(minority) >= len(majority):
            raise PlanError(f"the minority ({len(minority)} hosts) must be smaller than the majority "
                            f"({len(majority)})")
        fault = self.partition(minority, majority, kind=SPLIT)
        return Fault(SPLIT, f"minority {' '.join(minority)} | majority {' '.join(majority)}", fault.apply, fault.undo)

    def bandwidth(self, host: str, kbit: int) -> Fault:
        """`kbit` kilobits a second on the host's link, each way (tbf on both ends)."""
        if kbit < 8:
            raise PlanError(f"bandwidth {kbit} kbit/s: at least 8")
        h = self.host(host)
        burst = max(1600, kbit * 1000 // 8 // 100)  # bytes: 10 ms at the rate, at least one packet
        tbf = ("tbf", "rate", f"{kbit}kbit", "burst", str(burst), "latency", "200ms")
        ends = [("ip", "netns", "exec", h.namespace, "tc"), ("ip", "netns", "exec", self.switch, "tc")]
        devs = [LINK, h.port]
        apply = tuple((*tc, "qdisc", "replace", "dev", dev, "root", *tbf) for tc, dev in zip(ends, devs, strict=True))
        undo = tuple((*tc, "qdisc", "del", "dev", dev, "root") for tc, dev in zip(ends, devs, strict=True))
        return Fault(BANDWIDTH, f"{host} limited to {kbit} kbit/s", apply, undo)

    def cut_streams(self, host: str, port: int, peers: Iterable[str]) -> Command:
        """Reset every TCP connection `peers` have open to `host`'s `port` (`ss -K`): the
        streams die, the network stays up, and the peers must reconnect."""
        h = self.host(host)
        peer_filter = " or ".join(f"dst {self.host(p).address}" for p in peers)
        return ("ip", "netns", "exec", h.namespace, "ss", "-K", "-t", "state", "established",
                f"( sport = :{port} ) and ( {peer_filter} )")

    def delay(self, host: str, ms: float, *, python: str = sys.executable) -> Fault:
        """Every packet `host` sends on its link held `ms` milliseconds (one way)."""
        if not 0 < ms <= 10_000:
            raise PlanError(f"delay {ms} ms: more than 0, at most 10000")
        h = self.host(host)
        rule = ("OUTPUT", "-o", LINK, "-m", "comment", "--comment", f"{PREFIX}-{self.run_id}",
                "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass")
        ipt = ("ip", "netns", "exec", h.namespace, "iptables", "-w")
        daemon = Daemon(host, (python, "-m", "snapmesh.hosts.delayer", "--queue", str(DELAY_QUEUE),
                               "--delay-ms", f"{ms:g}"), "delayer: ready")
        return Fault(DELAY, f"{host} sends {ms:g} ms late", ((*ipt, "-A", *rule),), ((*ipt, "-D", *rule),),
                     (daemon,))
