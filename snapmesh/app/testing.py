"""Test an app without a cluster: its machines over in-memory FIFO channels.

    cluster = Cluster(app, channels=[("a", "b"), ("b", "a")])
    reply = cluster.command("a", b"...")    # the reply, or Refused
    answer = cluster.query("a", b"...")     # on_query's reply; AppError if it changed the machine or sent
    cluster.deliver("a", "b")               # the next message on the channel a -> b
    check_invariants(app, cluster.view())   # the states plus every queued message
    view_row_problems(app, [cluster.view()])  # [] when the rows keep the rules Spark needs
    run(cluster, seed=7, steps=500)         # the app's workload, a seeded schedule, a check per step

Between two steps, the machines' states plus the queued messages form a
consistent cut (the global state at an instant), the state a Chandy-Lamport
snapshot records without stopping anything. `Cluster.restore(view)` does what a
restore does to the app (rule A6 of snapmesh.app), and `Cluster.replay(node)`
what recovery does (A2): a fresh machine, the checkpoint, the logged inputs, and
the sends compared with the log. `Cluster.shadow(node)` checks the round trip
of `snapshot()`/`restore()`: a machine restored from the node's snapshot() takes
the node's next inputs beside it and must reply and send exactly as it does
(`run` shadows a random node now and then). `Cluster.query` holds on_query to
rule A7: a query that sends, or leaves snapshot() other than it was, is an
AppError (the node sees only the send) and the machine is put back.
`Cluster.command` keeps rule A4 as the node does: a refused command leaves the
state as it was, whatever the app changed before it refused or raised. The framework holds a running app to the same
rules; this module finds a broken one in a unit test. One seeded
`random.Random` is the only randomness, and every failure names its seed.
"""

from __future__ import annotations

import random
import types
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from snapmesh.app import App, AppError, Context, NodeInfo, Refused, View, check_invariants, new_machine


class RoundTripBroken(AppError):
    """A machine restored from `snapshot()` replied or sent otherwise than the original: the state does not round-trip."""


class InvariantBroken(AssertionError):
    """An invariant failed during `run`: the message names the seed, the step and the problems."""


@dataclass(frozen=True)
class Logged:
    """One input a node took since its checkpoint, with the sends it made: what a node's log holds."""

    kind: str  # "command" or "message"
    src: str  # the sender of a message; "" for a command
    data: bytes
    sends: tuple[tuple[str, bytes], ...]


@dataclass
class RunStats:
    seed: int
    commands: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # status code -> count
    delivered: int = 0
    replays: int = 0
    restores: int = 0
    shadows: int = 0


class Cluster:
    """An app's machines, one per node, over FIFO lossless channels; one step at a time."""

    def __init__(self, app: App, channels: Iterable[tuple[str, str]], params: Mapping[str, Any] | None = None):
        self.app = app
        self.channels = sorted(set(channels))
        if any(src == dst for src, dst in self.channels):
            raise AppError("a channel needs two different nodes")
        self.params = types.MappingProxyType(dict(params or {}))
        nodes = sorted({node for channel in self.channels for node in channel})
        self.infos = {
            n: NodeInfo(node_id=n, peers_out=tuple(d for s, d in self.channels if s == n),
                        peers_in=tuple(s for s, d in self.channels if d == n), params=self.params)
            for n in nodes
        }
        self.machines = {n: new_machine(app, info) for n, info in self.infos.items()}
        self.queues: dict[tuple[str, str], deque[tuple[int, bytes]]] = {}
        self._seqs: dict[tuple[str, str], int] = {}
        self._clear_channels()
        self.checkpoints = {n: self.snapshot(n) for n in nodes}
        self.logs: dict[str, list[Logged]] = {n: [] for n in nodes}
        self.shadows: dict[str, list[Any]] = {}  # node -> [machine restored from its snapshot(), inputs it took]

    # ---- steps
    def command(self, node: str, command: bytes) -> bytes:
        """`on_command` at `node`: its reply; Refused (or the app's exception) passes through, state unchanged."""
        ctx = Context(node, self.infos[node].peers_out)
        before = self.snapshot(node)  # the node rebuilds from its last base instead (apphost.H4); a test may copy
        try:
            reply = self.machines[node].on_command(command, ctx)
            if not isinstance(reply, bytes):
                raise AppError(f"node {node}: on_command returned {type(reply).__name__}, not bytes")
        except Exception as exc:
            self.machines[node] = new_machine(self.app, self.infos[node])
            self.machines[node].restore(before)
            self._shadow_step(node, "", command, _outcome(exc), ())
            raise
        finally:
            ctx.close()
        self._shadow_step(node, "", command, reply, tuple(ctx.sends))
        self._took(node, Logged("command", "", command, tuple(ctx.sends)))
        return reply

    def query(self, node: str, query: bytes) -> bytes:
        """`on_query` at `node` (rule A7): its reply; Refused (or the app's exception) passes
        through. AppError, with the machine put back, when the query sent (StepEnded) or
        changed snapshot(), or the machine has no on_query."""
        machine = self.machines[node]
        if not callable(getattr(machine, "on_query", None)):
            raise AppError(f"node {node}: the machine ({type(machine).__name__}) has no on_query()")
        before = self.snapshot(node)
        try:
            reply = machine.on_query(query)
            if not isinstance(reply, bytes):
                raise AppError(f"node {node}: on_query returned {type(reply).__name__}, not bytes")
            if self.snapshot(node) != before:
                raise AppError(f"node {node}: on_query({query[:40]!r}) changed the machine: a query must not")
        except Exception:
            self.machines[node] = new_machine(self.app, self.infos[node])
            self.machines[node].restore(before)
            raise
        return reply

    def deliver(self, src: str, dst: str) -> None:
        """The next message on the channel src -> dst, through `on_message` at dst."""
        _, payload = self.queues[(src, dst)].popleft()
        ctx = Context(dst, self.infos[dst].peers_out)
        try:
            self.machines[dst].on_message(src, payload, ctx)
        finally:
            ctx.close()
        self._shadow_step(dst, src, payload, b"", tuple(ctx.sends))
        self._took(dst, Logged("message", src, payload, tuple(ctx.sends)))

    def shadow(self, node: str) -> None:
        """From now on, a machine restored from `node`'s snapshot() takes `node`'s inputs beside it
        and must reply and send exactly as the node does: RoundTripBroken names the first input where not."""
        copy = new_machine(self.app, self.infos[node])
        copy.restore(self.snapshot(node))
        self.shadows[node] = [copy, 0]

    def _shadow_step(self, node: str, src: str, data: bytes, reply: Any, sends: tuple) -> None:
        if node not in self.shadows:
            return
        copy, taken = self.shadows[node]
        self.shadows[node][1] = taken + 1
        ctx = Context(node, self.infos[node].peers_out)
        before = copy.snapshot() if not src else b""
        try:
            if src:
                copy.on_message(src, data, ctx)
                got: Any = b""
            else:
                got = copy.on_command(data, ctx)
        except Exception as exc:
            got = _outcome(exc)
            if not src:
                self.shadows[node][0] = copy = new_machine(self.app, self.infos[node])
                copy.restore(before)
        got_sends = () if isinstance(got, str) else tuple(ctx.sends)
        if (got, got_sends) != (reply, sends):
            what = f"the message from {src} {data[:40]!r}" if src else f"the command {data[:40]!r}"
            del self.shadows[node]
            raise RoundTripBroken(
                f"node {node}: input {taken + 1} after snapshot() ({what}): the machine restored from snapshot()"
                f" replied {_shown(got)} and sent {list(got_sends)}; the original replied {_shown(reply)} and sent"
                f" {list(sends)}: snapshot()/restore() do not round-trip the state the machine depends on"
            )

    def pending(self) -> list[tuple[str, str]]:
        """The channels with a message queued, in order."""
        return [channel for channel in self.channels if self.queues[channel]]

    def drain(self, rng: random.Random | None = None, max_steps: int = 100_000) -> int:
        """Deliver until every channel is empty (in a random channel order if `rng`); the number delivered."""
        for count in range(max_steps + 1):
            pending = self.pending()
            if not pending:
                return count
            self.deliver(*(rng.choice(pending) if rng else pending[0]))
        raise AppError(f"the channels are not empty after {max_steps} deliveries: the app keeps sending")

    # ---- a cut, a restore, a recovery
    def snapshot(self, node: str) -> bytes:
        state = self.machines[node].snapshot()
        if not isinstance(state, bytes):
            raise AppError(f"node {node}: snapshot() returned {type(state).__name__}, not bytes")
        return state

    def view(self, snapshot_id: str = "now") -> View:
        """The states and the queued messages: a consistent cut, as a snapshot's View."""
        in_flight = [(src, dst, seq, payload) for (src, dst) in self.channels for seq, payload in self.queues[(src, dst)]]
        return View(snapshot_id=snapshot_id, states={n: self.snapshot(n) for n in self.machines},
                    in_flight=in_flight, params=self.params)

    def restore(self, view: View) -> None:
        """Rule A6: fresh machines, `restore(state)`, then each node's in-flight messages through on_message."""
        if set(view.states) != set(self.machines):
            raise AppError(f"the view's nodes {sorted(view.states)} are not the cluster's {sorted(self.machines)}")
        self._clear_channels()
        self.shadows.clear()
        for node, state in view.states.items():
            self.machines[node] = new_machine(self.app, self.infos[node])
            self.machines[node].restore(state)
            self.checkpoints[node], self.logs[node] = state, []
        for src, dst, _, payload in view.in_flight:  # per channel in seq order, as recorded
            ctx = Context(dst, self.infos[dst].peers_out)
            self.machines[dst].on_message(src, payload, ctx)
            self._took(dst, Logged("message", src, payload, tuple(ctx.sends)))

    def checkpoint(self, node: str) -> None:
        """Keep `node`'s state as its checkpoint and forget its log, as a node's log rotation does."""
        self.checkpoints[node], self.logs[node] = self.snapshot(node), []

    def replay(self, node: str) -> None:
        """Rule A2, as recovery does it: a fresh machine, the checkpoint, the logged inputs, the sends compared."""
        machine = new_machine(self.app, self.infos[node])
        machine.restore(self.checkpoints[node])
        for position, entry in enumerate(self.logs[node]):
            ctx = Context(node, self.infos[node].peers_out)
            where = f"node {node}: replay of log position {position} ({entry.kind}"
            try:
                if entry.kind == "command":
                    machine.on_command(entry.data, ctx)
                else:
                    machine.on_message(entry.src, entry.data, ctx)
            except Exception as exc:
                raise AppError(f"{where}) raised {type(exc).__name__}: {exc}; the first run did not") from exc
            if tuple(ctx.sends) != entry.sends:
                raise AppError(f"{where}) sent {list(ctx.sends)}, the log holds {list(entry.sends)}: not deterministic")
        if machine.snapshot() != self.snapshot(node):
            raise AppError(f"node {node}: the replay of {len(self.logs[node])} inputs ends in another state")
        self.machines[node] = machine
        self.shadows.pop(node, None)

    # ---- inside
    def _clear_channels(self) -> None:
        self.queues = {channel: deque() for channel in self.channels}
        self._seqs = {channel: 0 for channel in self.channels}

    def _took(self, node: str, entry: Logged) -> None:
        self.logs[node].append(entry)
        for dst, payload in entry.sends:
            self._seqs[(node, dst)] += 1
            self.queues[(node, dst)].append((self._seqs[(node, dst)], payload))


def run(cluster: Cluster, *, seed: int, steps: int, commands: Iterator[tuple[str, bytes]] | None = None,
        command_share: float = 0.3, replay_share: float = 0.0, restore_share: float = 0.0,
        shadow_share: float = 0.02) -> RunStats:
    """A seeded random schedule of commands (the app's workload unless given) and deliveries.

    After every step the app's invariants are checked on the cut the cluster is
    in. With `replay_share`, a random node is recovered by replay (its sends
    checked); with `restore_share`, the cluster is restored to a cut taken
    earlier in the run. With `shadow_share`, a random node is shadowed
    (`Cluster.shadow`: its snapshot() must round-trip). A failure raises,
    naming the seed and the step.
    """
    rng = random.Random(seed)
    # The shadows draw from their own generator (still the seed's alone), so the schedule a seed
    # gives stays the one it gave before shadows existed.
    shadows = random.Random(seed + 0x5AD0)
    stats = RunStats(seed=seed)
    if commands is None:
        if cluster.app.workload is None:
            raise AppError(f"app {cluster.app.name!r} has no workload; pass commands=")
        commands = iter(cluster.app.workload(list(cluster.infos.values()), rng))
    cuts: list[View] = []
    for step in range(steps):
        try:
            pending = cluster.pending()
            roll = rng.random()
            if roll < replay_share:
                cluster.replay(rng.choice(sorted(cluster.machines)))
                stats.replays += 1
            elif roll < replay_share + restore_share and cuts:
                cluster.restore(rng.choice(cuts))
                stats.restores += 1
            elif not pending or rng.random() < command_share:
                node, command = next(commands)
                stats.commands += 1
                try:
                    cluster.command(node, command)
                except Refused as refused:
                    stats.refused[refused.code] = stats.refused.get(refused.code, 0) + 1
            else:
                cluster.deliver(*rng.choice(pending))
                stats.delivered += 1
            if shadow_share and shadows.random() < shadow_share:
                cluster.shadow(shadows.choice(sorted(cluster.machines)))
                stats.shadows += 1
            view = cluster.view(f"step-{step}")
        except AppError as exc:
            kind = RoundTripBroken if isinstance(exc, RoundTripBroken) else AppError
            raise kind(f"seed {seed}, step {step}: {exc}") from exc
        broken = {name: problems for name, problems in check_invariants(cluster.app, view).items() if problems}
        if broken:
            raise InvariantBroken(f"seed {seed}, step {step}: {broken}")
        if restore_share and rng.random() < 0.05:
            cuts.append(view)
    return stats


def _outcome(exc: Exception) -> str:
    """A step that did not reply, as compared between a machine and its shadow."""
    return f"refused {exc.code}" if isinstance(exc, Refused) else f"raised {type(exc).__name__}"


def _shown(reply: Any) -> str:
    return reply if isinstance(reply, str) else repr(reply[:40])


_SQL_TYPES = {bool: "BOOLEAN", int: "BIGINT", float: "DOUBLE", str: "VARCHAR", bytes: "BLOB"}


def sql_violations(app: App, views: Iterable[View]) -> dict[str, list[tuple]]:
    """The app's `sql_invariants` over the tables its `views` decode, in DuckDB: each query's rows.

    A quick check of a query's logic in a unit test (needs the `duckdb` package);
    `snapmesh reconcile` runs the same queries in Spark SQL. A column's type is
    taken from its first row; a table with no row at all cannot be typed here.
    """
    try:
        import duckdb
    except ImportError as exc:
        raise AppError("sql_violations needs the duckdb package (pip install duckdb)") from exc
    tables: dict[str, list[Mapping[str, Any]]] = {name: [] for name in app.views}
    for view in views:
        for name, decode in app.views.items():
            tables[name] += decode(view)
    con = duckdb.connect()
    for name, rows in tables.items():
        if not rows:
            raise AppError(f"view table {name} has no rows: its columns cannot be typed")
        columns = list(rows[0])
        con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {_SQL_TYPES[type(rows[0][c])]}' for c in columns)})")
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' for _ in columns)})",
                        [[row[c] for c in columns] for row in rows])
    return {name: con.execute(query).fetchall() for name, query in app.sql_invariants.items()}


def view_row_problems(app: App, views: Iterable[View]) -> list[str]:
    """What breaks the rules for view rows (docs/apps.md, "View rows") in the rows the app's
    `views` make of `views`, all snapshots together as Spark sees them; [] when none.

    A row is a mapping of column names (str) to values of one of _SQL_TYPES or None; every
    row of a table has the same columns, each column one type in every row of every
    snapshot (None allowed) and a value in at least one; every row has `snapshot_id`,
    the View's. A view that raises, or returns no list of mappings, is named too.
    """
    problems: list[str] = []
    for name, decode in app.views.items():
        columns: list[str] | None = None
        types_: dict[str, type] = {}
        for view in views:
            try:
                rows = decode(view)
            except Exception as exc:  # the app's code: named, not raised through
                problems.append(f"{name}: raised {type(exc).__name__}: {exc} on snapshot {view.snapshot_id}")
                continue
            if not isinstance(rows, list) or not all(isinstance(row, Mapping) for row in rows):
                problems.append(f"{name}: returned {type(rows).__name__}, not a list of mappings")
                continue
            for row in rows:
                if columns is None:
                    columns = list(row)
                if set(row) != set(columns):
                    problems.append(f"{name}: a row has columns {sorted(row)}, another {sorted(columns)}")
                if row.get("snapshot_id") != view.snapshot_id:
                    problems.append(f"{name}: a row's snapshot_id is {row.get('snapshot_id')!r}, not {view.snapshot_id!r}")
                for column, value in row.items():
                    if not isinstance(column, str):
                        problems.append(f"{name}: a column named {column!r}, not a str")
                    elif value is not None and type(value) not in _SQL_TYPES:
                        problems.append(f"{name}.{column}: a {type(value).__name__}, not one of bool, int, float, str, bytes")
                    elif value is not None and types_.setdefault(column, type(value)) is not type(value):
                        problems.append(f"{name}.{column}: a {type(value).__name__} where another row has a "
                                        f"{types_[column].__name__}")
                    elif type(value) is int and not -2**63 <= value < 2**63:
                        problems.append(f"{name}.{column}: {value} does not fit 64 bits")
        problems += [f"{name}.{column}: None in every row: its type cannot be inferred"
                     for column in columns or () if column not in types_]
    return list(dict.fromkeys(problems))  # each problem once, in the order found
