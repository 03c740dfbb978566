"""The app contract: what snapmesh asks of a service it snapshots.

snapmesh owns the channels, the markers, the sequence numbers, the log and the
epochs; the app owns its state and its messages, both as bytes (etcd raft's
`Propose([]byte)` is the model). The framework never imports the app's types, and
the app never sees a marker, a seq or an epoch, so it cannot get them wrong.

An app is an `App`: a name, `new(info) -> machine`, and checks over snapshots. A
machine is one node's state, with four methods (see `Machine`), and optional ones:

    on_command(command: bytes, ctx) -> bytes       a client's request -> its reply
    on_message(src: str, payload: bytes, ctx)      the next message on channel src -> me
    snapshot() -> bytes                            the state, as a copy, at the cut
    restore(state: bytes)                          on a fresh instance, from snapshot() bytes
    on_query(query: bytes) -> bytes                optional: a client's read (A7)
    snapshot_blocks() -> Iterable[bytes]           optional: the state in parts (A8)
    restore_blocks(blocks: Iterable[bytes])        optional: restore from the state's blocks (A9)

Rules the app must keep
-----------------------
A1. One task drives a machine, never concurrently: no locks are needed.
A2. Determinism is the app's duty. `on_command` and `on_message` depend only on
    the machine's state and their arguments: no clock, no random numbers, no I/O,
    no iteration over an unordered set whose order can change between runs.
    Recovery restores the last checkpoint and replays the logged inputs through a
    fresh machine; if the replayed sends differ from the logged ones, the node
    refuses to start and names the log position.
A3. Messages leave only through `ctx.send(dst, payload)`, to a node of
    `info.peers_out`, each at most MAX_MESSAGE_BYTES (1 MiB and 64 KiB: a
    command's bytes with room to wrap them; a larger one raises AppError,
    failing the step: a node takes no larger message, docs/api.md). Each channel is FIFO and lossless: `on_message` sees the
    payloads of one channel in the order they were sent, each once.
A4. `ctx.refuse(code, text)` (or any exception) in `on_command` refuses that step:
    the client gets the named gRPC status, nothing is logged, no send leaves, and
    snapmesh leaves the machine as it was before the step, whatever the app
    changed first: it rebuilds it from its last state and the inputs since
    (snapmesh/protocol/node/apphost.py H4), so the app need not validate before
    mutating. An exception in `on_message` stops the node with the exception's text.
A5. `snapshot()` returns bytes that do not change afterwards (a copy).
A6. A restore makes a fresh machine with `new(info)`, calls `restore(state)`
    with the recorded bytes, then hands it the messages recorded in flight
    towards it, per channel in order, through `on_message`. Then new work starts.
A7. `on_query(query)`, if the machine has it, answers a read (the Query RPC,
    `node.query`): it is not logged, and it is answered only once the log holds
    every step the state it read rests on. It must not change the machine nor
    send. A Context is closed once its step returns, so a query that sends
    through one kept from a step raises StepEnded: the node refuses it
    (FAILED_PRECONDITION) and puts the machine back as it was (apphost.H4), as
    it does when on_query raises. A change without a send is not seen by the
    node (it would cost a snapshot() per query): snapmesh.app.testing's
    `Cluster.query` compares snapshot() before and after, so a unit test finds it.
A8. `snapshot_blocks()`, if the machine has it, is used in place of `snapshot()`
    to take the state: its parts, joined, are the bytes `snapshot()` would
    return (and what `restore` gets back). snapmesh stores and sends a state as
    blocks of 8 KiB and only the blocks that changed since the node's last
    report; with parts, each part is cut into its own blocks, so a change
    within a part changes that part's blocks only, whatever its size became
    (with `snapshot()` alone, a change in size moves every block after it).
    Cut where changes stay local, e.g. keys in ranges whose boundaries depend
    on the keys, not on a count (kvshard); parts of a few KiB or more, since
    each block is a file on the controller. Each part is bytes (a copy, A5).
    A subclass that overrides `snapshot()` below the class defining
    `snapshot_blocks()` is snapshotted by its `snapshot()` (another encoding
    must not be stored in its base's parts).
    A part that is a whole number of BLOCK_BYTES (each but the last) and is the
    same `bytes` object as at the node's last cut is not hashed again there
    (snapmesh/protocol/node/cutnames.py): an app that keeps its state as
    immutable blocks of BLOCK_BYTES, replacing only those a step writes, and
    hands them over as they are (bench/blob_app.py) pays at a cut for what changed.
    A part that is a new object as long as the one at its index at the last cut
    is compared with it a block at a time and only its blocks that differ are
    hashed (cutnames.py CN7): a range re-encoded for one changed key (kvshard)
    pays for that key's blocks, not the range's.
A9. `restore_blocks(blocks)`, if the machine has it, is used in place of
    `restore(state)` when the node rebuilt the state from blocks (a restore as
    blocks): `blocks` joined are the bytes `restore` would get, each a non-empty
    `bytes` that never changes, cut as the node stores the state (blocks of
    BLOCK_BYTES within each part snapshot_blocks() gave, so usually the parts'
    own blocks back). The app may keep them as they are: the node holds the same
    objects (the undo base, the restore's log record), so the state is held once,
    never joined. It must not rely on the cut (check it, and join when it is not
    the one it keeps). A state sent whole still goes to `restore`. Like A8, a
    subclass that overrides `restore()` below the class defining
    `restore_blocks()` is restored by its `restore()`.

Versions. `version` (an int, default 1) names the encoding of the app's state and
messages. The log's init and checkpoint records and every snapshot carry the
app's name and version; a node whose log holds another version refuses to start
(replay through other code is never silent). `upgrade(state, from_version)`
turns a state an older version's `snapshot()` made into this version's bytes,
and `upgrade_message(payload, from_version)` does the same for a message in
flight; a restore of an older snapshot runs them on the controller, before any
node changes, and checks the invariants on what they made.

Rescale. `rescale(view, nodes) -> {node_id: state bytes}` restores a COMPLETE
snapshot onto another node set: it gets the snapshot's `View` (the states and the
messages in flight) and the new set's `NodeInfo`s, and returns each new node's
state with every in-flight message absorbed into the states (the old channels may
not exist any more: the new nodes start with empty channels). The controller runs
it before any node changes and checks the app's invariants on what it made, with
nothing in flight (snapmesh/protocol/rescale.py RS1-RS7). An app without it cannot
be restored onto another node set. Like `upgrade` it is a pure function: a
resumed restore runs it again and gets the same states.

Checks over a snapshot take a `View` (the states and the in-flight payloads of
one consistent cut): `invariants` return a list of problems ([] means it holds),
`describe` a JSON-able summary, `views` rows for Spark, whose `sql_invariants`
return one row per violation. docs/apps.md is the tutorial.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

__all__ = [
    "App", "AppError", "BLOCK_BYTES", "Context", "Machine", "NodeInfo", "Refused", "Reply", "StepEnded", "View",
    "BUILT_IN", "MAX_MESSAGE_BYTES", "STATUS_CODES", "check_invariants", "load_app", "new_machine", "preflight",
    "resolve_spec", "validate_machine",
]

# The largest payload `ctx.send` takes (A3): a channel frame must fit the peer's
# receive limit, which is sized for what its clients send (a command: at most 1 MiB,
# which a message may carry on with room for the app's own wrapping).
MAX_MESSAGE_BYTES = 1024 * 1024 + 64 * 1024
# The size of the blocks snapmesh stores and sends a state as (A8; snapmesh/protocol/blocks.py).
BLOCK_BYTES = 8 * 1024
# The gRPC status names a refusal may carry (grpc.StatusCode without OK).
STATUS_CODES = frozenset({
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
})
# Bare names `load_app` resolves to the apps shipped with snapmesh.
BUILT_IN = {"bank": "snapmesh.services.app.bank:app", "kvshard": "snapmesh.services.app.kvshard:app"}
_OLD_APPS = "services.app."
MACHINE_METHODS = ("on_command", "on_message", "snapshot", "restore")


class AppError(Exception):
    """Misuse of the contract by an app, or a bad `--app`: the message says what and where."""


class StepEnded(AppError):
    """`ctx.send` on a Context whose step returned: from `on_query`, or a Context an app kept (A7)."""


class Refused(Exception):
    """A command refused by the app (`ctx.refuse`): `code` is a gRPC status name, `text` the reason."""

    def __init__(self, code: str, text: str):
        if code not in STATUS_CODES:
            raise ValueError(f"unknown status code {code!r}; valid: {', '.join(sorted(STATUS_CODES))}")
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = str(text)


@dataclass(frozen=True, slots=True)
class Reply:
    """A command's answer from a node's edge (`submit`, `submit_many`), once durable:
    what `on_command` returned, whether it is a retry's first reply (its
    request_id was answered before, and the app did not run it again), and the
    node's epoch when the command ran."""

    reply: bytes
    replayed: bool
    epoch: int
    # The seq of the first message the command sent, on its channel (0: it sent none):
    # the message's id is "node:dst:seq". Not compared: an answer is its reply.
    first_seq: int = field(default=0, compare=False)


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(value))


@dataclass(frozen=True, kw_only=True)
class NodeInfo:
    """What a machine knows of its place: its id, its channels, and the cluster file's [app] table."""

    node_id: str
    peers_out: tuple[str, ...]  # nodes this node may ctx.send to
    peers_in: tuple[str, ...]  # nodes that send to this node
    params: Mapping[str, Any] = field(default_factory=dict)  # the [app] table minus "module", read-only

    def __post_init__(self) -> None:
        object.__setattr__(self, "peers_out", tuple(self.peers_out))
        object.__setattr__(self, "peers_in", tuple(self.peers_in))
        object.__setattr__(self, "params", _frozen_mapping(self.params))


class Context:
    """One step's handle for a machine: `send` collects messages, `refuse` refuses the command.

    The framework makes one per step and reads `sends` after the step returns;
    nothing leaves if the step raises.
    """

    def __init__(self, node_id: str, peers_out: Iterable[str]):
        self.node_id = node_id
        self.peers_out = frozenset(peers_out)
        self.sends: list[tuple[str, bytes]] = []
        self.open = True  # False once the step returned (`close`): a send then raises StepEnded (A7)

    def close(self) -> None:
        """The step returned: its sends are read, and no more may be queued (A7)."""
        self.open = False

    def send(self, dst: str, payload: bytes) -> None:
        """Queue `payload` for the channel to `dst`; it leaves once this step is durable."""
        if not self.open:
            raise StepEnded(f"node {self.node_id}: ctx.send({dst!r}, ...) after its step returned: "
                            "a query (on_query) must not send, and a Context is for its own step only")
        if not isinstance(payload, bytes):
            raise AppError(f"node {self.node_id}: ctx.send({dst!r}, ...) needs bytes, got {type(payload).__name__}")
        if len(payload) > MAX_MESSAGE_BYTES:
            raise AppError(f"node {self.node_id}: ctx.send({dst!r}, ...) of {len(payload)} bytes; "
                           f"a message holds at most {MAX_MESSAGE_BYTES}")
        if dst == self.node_id:
            raise AppError(f"node {self.node_id}: ctx.send to itself; there is no channel {dst} -> {dst}")
        if dst not in self.peers_out:
            known = ", ".join(sorted(self.peers_out)) or "none"
            raise AppError(f"node {self.node_id}: ctx.send to {dst!r}, not a peer it sends to (peers_out: {known})")
        self.sends.append((dst, payload))

    def refuse(self, code: str, text: str) -> NoReturn:
        """Refuse this command with a gRPC status name (e.g. "FAILED_PRECONDITION") and a reason."""
        raise Refused(code, text)


class Machine(Protocol):
    """One node's state (rules A1-A8 above). `App.new(info)` makes one. It may also have
    `on_query(query: bytes) -> bytes`, a read (A7), `snapshot_blocks() ->
    Iterable[bytes]`, its state in parts (A8), and `restore_blocks(blocks)`, a restore
    from them (A9): optional, so not part of the Protocol."""

    def on_command(self, command: bytes, ctx: Context) -> bytes: ...

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None: ...

    def snapshot(self) -> bytes: ...

    def restore(self, state: bytes) -> None: ...


@dataclass(frozen=True, kw_only=True)
class View:
    """One snapshot as the app's checks see it.

    `params` is the [app] table the nodes were given (empty where the checker
    does not know it), for checks that need a configured constant.
    """

    snapshot_id: str
    states: Mapping[str, bytes]  # node -> its snapshot() bytes at the cut
    in_flight: Sequence[tuple[str, str, int, bytes]]  # (src, dst, seq, payload), per channel in seq order
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sizes(self) -> Mapping[str, int]:
        """Node -> the length of its state. The controller's view knows it without reading
        the state (a large one is held as blocks: lazystates.py L4); any other mapping's
        states are measured."""
        known = getattr(self.states, "sizes", None)
        return known() if callable(known) else {node: len(state) for node, state in self.states.items()}

    def fold(self, node: str, key: str, fn: Callable[[bytes], Any]) -> list[Any]:
        """`fn(piece)` for each piece of `node`'s state, in order: a piece is one or more
        whole parts of `snapshot_blocks()`, consecutive (A8), or the whole state, so `fn`
        must take any such run. The controller keeps each piece's result by `key` and the
        piece's content (its blocks' names: lazystates.py L5, foldmemo.py), across
        snapshots, and reads only the pieces it has no result for: an invariant whose
        result adds up over pieces then costs what changed. `key` names `fn` (another
        function, another key); `fn` depends on the piece's bytes alone, and its results
        are kept, so keep them small. An `fn` that also has `step` and `join` is handed
        a changed piece block by block, each block's part kept (foldmemo.py FM6), so a
        change costs its blocks, not its piece. Elsewhere the state is one piece."""
        known = getattr(self.states, "fold", None)
        return known(node, key, fn) if callable(known) else [fn(self.states[node])]

    def fold_joined(self, node: str, key: str, fn: Any) -> Any:
        """`fn.join(self.fold(node, key, fn))`, `join` associative (jointree.py JT1): the
        controller re-joins only a state's changed pieces (foldmemo.py FM9)."""
        known = getattr(self.states, "fold_joined", None)
        return known(node, key, fn) if callable(known) else fn.join(self.fold(node, key, fn))


def _check_app(app: App, where: str) -> None:
    """Raise AppError naming the first field of `app` that breaks the contract."""
    if not isinstance(app.name, str) or not app.name:
        raise AppError(f"{where}: name must be a non-empty str, got {app.name!r}")
    if not callable(app.new):
        raise AppError(f"{where}: new must be callable (NodeInfo -> machine), got {type(app.new).__name__}")
    for kind in ("invariants", "views", "sql_invariants"):
        table = getattr(app, kind)
        if not isinstance(table, Mapping):
            raise AppError(f"{where}: {kind} must be a mapping of name -> ..., got {type(table).__name__}")
        for name, value in table.items():
            wanted = str if kind == "sql_invariants" else Callable
            if not isinstance(name, str) or (not isinstance(value, str) if wanted is str else not callable(value)):
                what = "a SQL string" if wanted is str else "callable"
                raise AppError(f"{where}: {kind}[{name!r}] must be {what}, got {type(value).__name__}")
    if not isinstance(app.version, int) or isinstance(app.version, bool) or app.version < 1:
        raise AppError(f"{where}: version must be a positive int (1, 2, ...), got {app.version!r}")
    if app.v1_fields is not None and (not isinstance(app.v1_fields, str) or ":" not in app.v1_fields):
        raise AppError(f"{where}: v1_fields must be a \"module:attr\" str or None, got {app.v1_fields!r}")
    if app.old_logs is not None and (not isinstance(app.old_logs, str) or ":" not in app.old_logs):
        raise AppError(f"{where}: old_logs must be a \"module:attr\" str or None, got {app.old_logs!r}")
    if app.edge is not None and (not isinstance(app.edge, str) or ":" not in app.edge):
        raise AppError(f"{where}: edge must be a \"module:attr\" str (a factory of the node's extra edge) or None, "
                       f"got {app.edge!r}")
    for kind in ("describe", "workload", "upgrade", "upgrade_message", "rescale"):
        if getattr(app, kind) is not None and not callable(getattr(app, kind)):
            raise AppError(f"{where}: {kind} must be callable or None, got {type(getattr(app, kind)).__name__}")


@dataclass(frozen=True, kw_only=True)
class App:
    """An app snapmesh can host: how to make a node's machine, and the checks over a snapshot."""

    name: str
    new: Callable[[NodeInfo], Any]  # NodeInfo -> a Machine
    invariants: Mapping[str, Callable[[View], list[str]]] = field(default_factory=dict)  # [] means it holds
    describe: Callable[[View], Mapping[str, Any]] | None = None  # a JSON-able summary for the page and CLI
    sql_invariants: Mapping[str, str] = field(default_factory=dict)  # Spark SQL over `views`; each row a violation
    views: Mapping[str, Callable[[View], list[Mapping[str, Any]]]] = field(default_factory=dict)  # table -> rows
    # workload(nodes: Sequence[NodeInfo], rng: random.Random) -> Iterator[(node_id, command bytes)]: endless
    # commands for `snapmesh app --app X`, rng the only randomness; a refusal is an answer, counted, not a failure.
    workload: Callable[..., Any] | None = None
    version: int = 1  # the encoding of the state and messages; bump it when either changes
    upgrade: Callable[[bytes, int], bytes] | None = None  # (state, from_version) -> this version's state
    upgrade_message: Callable[[bytes, int], bytes] | None = None  # (payload, from_version) -> this version's payload
    # rescale(view, nodes) -> {node_id: state bytes}: a COMPLETE snapshot's View onto the new node set's NodeInfos,
    # the in-flight messages absorbed into the states (see Rescale above); None: no restore onto another node set
    rescale: Callable[[View, Sequence[NodeInfo]], Mapping[str, bytes]] | None = None
    # "module:attr" of the class that fills the v1 API's figures from the states and payloads on the
    # controller's side (snapmesh/app/v1fields.py), imported there by name; None: they stay absent
    v1_fields: str | None = None
    # "module:attr" of a factory (engine, edge) -> an object answering more of the node's RPCs, imported by
    # name on the node's side (services/node/extra_edge.py): the bank's v1 Transfer is one; None: none
    edge: str | None = None
    # "module:attr" of a reader of logs an older shape of its nodes wrote (written_by(records), recover(records,
    # node_id=, incoming=, outgoing=, host=) -> Recovered), imported by name in services/node/recovery.py
    old_logs: str | None = None

    def __post_init__(self) -> None:
        _check_app(self, f"App {self.name!r}")
        for kind in ("invariants", "views", "sql_invariants"):
            object.__setattr__(self, kind, _frozen_mapping(getattr(self, kind)))


def validate_machine(machine: Any, info: NodeInfo) -> None:
    """Raise AppError if `machine` (made for `info`) lacks one of the four methods."""
    for method in MACHINE_METHODS:
        if not callable(getattr(machine, method, None)):
            raise AppError(f"node {info.node_id}: the machine ({type(machine).__name__}) has no method {method}()")


def new_machine(app: App, info: NodeInfo) -> Any:
    """`app.new(info)`, checked: an exception or a machine without the four methods is one AppError line."""
    try:
        machine = app.new(info)
    except Exception as exc:  # the app's own code: any failure is reported, not raised through
        raise AppError(f"app {app.name!r}: new() for node {info.node_id} raised {_one_line(exc)}") from exc
    validate_machine(machine, info)
    return machine


def preflight(spec: str, infos: Iterable[NodeInfo]) -> App:
    """The app `spec`, loaded and tried on every node of `infos` before any process starts.

    Every command that runs an app (`snapmesh node`, `cluster up`, `demo`, `chaos`,
    `app`) asks this one function, so an app that would stop a node is refused in the
    same words everywhere, before anything is started or written: one AppError line
    naming the app and its first fault (no import, no attribute, not an App, a `new`
    that raises, a missing method, a `snapshot()` that raises or is not bytes).
    """
    app = load_app(spec)
    for info in infos:
        try:
            machine = new_machine(app, info)
        except AppError as exc:
            text = str(exc)
            raise AppError(text if text.startswith("app ") else f"app {app.name!r}: {text}") from None
        try:
            state = machine.snapshot()
        except Exception as exc:  # the app's own code
            raise AppError(f"app {app.name!r}: snapshot() of a new machine for node {info.node_id} raised "
                           f"{_one_line(exc)}") from None
        if not isinstance(state, bytes):
            raise AppError(f"app {app.name!r}: snapshot() returned {type(state).__name__}, not bytes")
    return app


def check_invariants(app: App, view: View) -> dict[str, list[str]]:
    """Every invariant of `app` over `view`: name -> problems ([] holds). A check that raises is a problem."""
    results: dict[str, list[str]] = {}
    for name, check in app.invariants.items():
        try:
            problems = check(view)
        except Exception as exc:  # the app's code: a crash is a verdict, not a crash of the checker
            results[name] = [f"the check raised {_one_line(exc)}"]
            continue
        if not isinstance(problems, list):
            results[name] = [f"the check returned {type(problems).__name__}, not a list of problems"]
        else:
            results[name] = [p if isinstance(p, str) else repr(p) for p in problems]
    return results


def load_app(spec: str) -> App:
    """The App named by `spec`: "module:attr" (module from the working directory or PYTHONPATH), or a built-in name.

    Every failure is one AppError line saying what is wrong with which spec.
    """
    spec = spec.strip()
    target = resolve_spec(spec)
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        if spec.endswith(".py") or "/" in spec:
            stem = os.path.basename(spec).removesuffix(".py") or "module"
            folder = os.path.dirname(spec)
            if folder:  # the same words as docs/apps.md, section 3
                raise AppError(f"--app {spec}: a path is not a module; give --app {stem}:app with PYTHONPATH={folder} "
                               f"(or run from {folder} with --app {stem}:app)")
            raise AppError(f"--app {spec}: a path is not a module; run from its directory with --app {stem}:app")
        raise AppError(f"--app {spec}: expected module:attr or a built-in ({', '.join(sorted(BUILT_IN))})")
    _search_working_directory()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AppError(f"--app {spec}: no module named {module_name!r} in the working directory "
                           f"({os.getcwd()}) or on PYTHONPATH") from None
        raise AppError(f"--app {spec}: module {module_name!r} does not import: {_one_line(exc)}") from exc
    except Exception as exc:  # a module's top level can raise anything; say which and why
        raise AppError(f"--app {spec}: module {module_name!r} does not import: {_one_line(exc)}") from exc
    app: Any = module
    for part in attr.split("."):
        if not hasattr(app, part):
            raise AppError(f"--app {spec}: module {module_name!r} has no attribute {attr!r}")
        app = getattr(app, part)
    if not isinstance(app, App):
        raise AppError(f"--app {spec}: {attr} is a {type(app).__name__}, not a snapmesh.app.App")
    _check_app(app, f"--app {spec}")
    return app


def named_object(spec: str) -> Any:
    """The object a plug-in spec "module:attr" names (an app's `edge`, `old_logs`, `v1_fields`),
    imported by name so that the framework imports no app; raises what the import or lookup raises
    (each caller says, in its own words, which of the app's plug-ins did not load)."""
    module_name, _, attr = spec.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        found = getattr(found, part)
    return found


def resolve_spec(spec: str) -> str:
    """The module:attr `spec` names (a built-in name resolved), without importing it:
    two specs run the same app exactly when they resolve alike."""
    spec = spec.strip()
    target = BUILT_IN.get(spec, spec)
    if target.startswith(_OLD_APPS):  # cluster files written before 0.3 name the apps by their old package
        target = "snapmesh." + target
    return target


def _search_working_directory() -> None:
    # `python -m` puts the working directory on the path; the `snapmesh` script does not.
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def _one_line(exc: BaseException) -> str:
    """`Type: message (file:line)` of an exception, on one line, at the deepest frame of its traceback."""
    text = " ".join(str(exc).split())
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({os.path.basename(exc.filename)}:{exc.lineno})"
        text = " ".join(str(exc.msg).split())
    else:
        tb = exc.__traceback__
        while tb is not None:  # the deepest frame that is not the import machinery's
            filename = tb.tb_frame.f_code.co_filename
            if not filename.startswith("<frozen"):
                where = f" ({os.path.basename(filename)}:{tb.tb_lineno})"
            tb = tb.tb_next
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"

