"""The hosted app seen from the node machine: one `snapmesh.app` Machine, one step at a time.

The node machine owns sequence numbers, markers, the log and epochs; the app
owns its state and the meaning of its bytes. `Host` is the one place that
calls into app code, so the node machine sees only three outcomes of a step:
a reply with the sends it made, an `AppRefusal` (the client is refused,
nothing is logged and the app is as it was), or `AppFailed` (a peer's message
the app cannot take, or an app that cannot be put back: the node must stop,
since a FIFO lossless channel cannot skip a message and its log is right
where its memory is not).

Rules (cited as apphost.H1 ...; hybrid.py's H-rules are another set)
--------------------------------------------------------------------
H1. A step runs the app on one fresh `Context`; the sends it collected leave
    only if the step returns normally. A refusal or an exception drops them.
H2. `snapshot()` must return bytes; anything else is the app's bug, reported
    as `AppFailed` with the type it returned.
H3. `restore(state)` runs on a fresh instance; the old one is kept until the
    new one restored without raising, so a failed restore changes nothing.
    A state held as its blocks (blockstate.BlockState, a restore rebuilt from
    blocks) goes to the app's `restore_blocks` (snapmesh.app A9) as those very
    blocks, and stays the undo base as it is: nothing joins it. An app without
    `restore_blocks` gets it joined, once, as `restore` bytes.
H4. A command that does not go through leaves the app exactly as it was,
    whatever the app did before it stopped: one the app refuses
    (`ctx.refuse`), raises in, or answers with something not bytes, and one
    the node's `admit` refuses once it has run (the channels it sent on are
    full, its reply is too long: node rule N12). The instance it ran on is
    dropped and the app is rebuilt: a fresh instance, restored from the undo
    log's base, handed again every input taken since (undo.py), with the
    sends of those replays dropped. Why a rebuild and not a copy: a copy
    before each step costs O(state) on every command, the rebuild costs on a
    refusal only, and determinism (snapmesh.app A2), which recovery already
    stands on, makes it exact. A rebuild that fails (restore or a replayed
    input raises) is `AppFailed`: the app is not deterministic, so the node
    stops, and recovery from the log, which never held the step, starts it
    right. The rebuilt instance is the new base (one snapshot()), so a run of
    refusals costs one restore each, not a replay each.
H5. The undo log stays bounded. Its base moves up to the live state at every
    `snapshot()` the node takes anyway (a cut, a checkpoint, a query of the
    state), and before a step once the inputs since hold as many bytes as the
    base (64 KiB to 64 MiB) or undo.REBASE_STEPS of them: an undo then replays
    no more than a restore reads, and the success path pays one snapshot()
    per state-size of input, O(1) per input byte.
H6. `fresh()` and `restore(state)` are new bases: the inputs before them are
    forgotten. A peer's message that raises is not taken back: it is
    `AppFailed`, and stops the node.
H7. A query (`on_query`, snapmesh.app A7) is no input: the undo log does not
    keep it. One the machine has no `on_query` for is refused UNIMPLEMENTED;
    one that sends (StepEnded: every step's Context is closed once the step
    returns) is refused FAILED_PRECONDITION, and one that raises or answers
    with something not bytes as a command is (the code it names, or UNKNOWN);
    each leaves the app as H4 does, rebuilt, since it may have changed it first.
H8. A cut (`cut`) of an app with snapshot_blocks() whose state is larger than
    statedigest.BLOCKS_FORM_BYTES keeps the parts as a BlockState, whatever their
    sizes (on the grid, cutnames.CN3, or off it: kvshard's key ranges, CN5):
    nothing joins or copies the state (a bytearray part is copied, as it may
    change); the undo base, the cut's names (by identity, cutnames.CN1), its grid
    digest (by what changed, CN5), the report's blocks, its save and the block
    shelf all hold those very parts. Whoever needs bytes (a report sent whole, a
    state set in a protobuf, an app's restore() without restore_blocks, H3) joins
    it there (blockstate.BST3). Any other state (at most BLOCKS_FORM_BYTES, an app
    without snapshot_blocks) is joined once, here, as before. The node's own
    records of the state (its opening state, a checkpoint: wal.Packed, written a
    run at a time) and the undo base (H5) take it the same way
    (`snapshot(as_blocks=True)`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from snapmesh.app import App, Context, NodeInfo, Refused, StepEnded, validate_machine
from snapmesh.protocol.blocks import PartedState
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node.core import AppFailed, AppRefusal, LocalProtocolError, Refusal
from snapmesh.protocol.node.undo import UndoLog
from snapmesh.protocol.statedigest import BLOCKS_FORM_BYTES

Sends = list[tuple[str, bytes]]
# The node's checks of a command that ran (H4): raise LocalProtocolError to refuse it.
Admit = Callable[[bytes, Sends], None]


class Host:
    """Drives one app Machine for node `node_id` (rules H1-H6)."""

    def __init__(
        self, app: App, *, node_id: str, incoming: Iterable[str], outgoing: Iterable[str], params: Mapping[str, Any] | None = None
    ) -> None:
        self.app = app
        self.info = NodeInfo(
            node_id=node_id,
            peers_out=tuple(outgoing),
            peers_in=tuple(incoming),
            params=MappingProxyType(dict(params or {})),
        )
        self._node_id, self._peers_out = node_id, frozenset(self.info.peers_out)  # each step's Context: no copy
        self.undo = UndoLog()
        self.undone = 0  # commands taken back (H4), for tests and metrics
        self.machine = self._new()

    def fresh(self) -> None:
        """A new instance, as at the node's first start (H6)."""
        self.machine = self._new()
        self.undo.rebase(None)

    def restore(self, state: bytes | BlockState) -> None:
        """A fresh instance holding `state` (H3, H6); a BlockState is not joined for an app with restore_blocks."""
        self.machine = self._restored(state)
        self.undo.rebase(state)

    def command(self, command: bytes, admit: Admit | None = None) -> tuple[bytes, Sends]:
        """A client's command -> (reply, sends). Raises AppRefusal, or what
        `admit(reply, sends)` raised, with the app as it was (H4); AppFailed
        when it cannot be put back."""
        undo = self.undo
        if len(undo.inputs) >= undo.steps_limit or undo.size >= undo.size_limit:  # undo.full, inline (H5)
            self.snapshot(as_blocks=True)  # the base need not be bytes (H8)
        # A fresh Context (H1), as Context(node_id, peers_out) makes it, without the __init__ call: two steps
        # a command, its calls were a quarter of the host's own cost. tests/protocol/test_apphost_steps.py
        # holds the two equal (a reuse, checked for an app that kept it, cost more than this).
        ctx = _blank(Context)
        ctx.node_id = self._node_id
        ctx.peers_out = self._peers_out
        ctx.sends = []
        ctx.open = True
        try:
            try:
                reply = self.machine.on_command(command, ctx)
            except Refused as refused:
                raise AppRefusal(refused.text, Refusal.APP_REFUSED, refused.code) from None
            except Exception as exc:  # noqa: BLE001
                raise AppRefusal(
                    f"app {self.app.name!r} raised in on_command: {_text(exc)}", Refusal.APP_FAILED, "UNKNOWN"
                ) from exc
            if type(reply) is not bytes:
                if reply is None:
                    reply = b""
                elif not isinstance(reply, bytes | bytearray):
                    raise AppRefusal(
                        f"app {self.app.name!r}: on_command returned {type(reply).__name__}, not bytes",
                        Refusal.APP_FAILED, "UNKNOWN",
                    )
                reply = bytes(reply)
            sends = ctx.sends  # the step's own list: a closed Context adds nothing to it (StepEnded)
            if admit is not None:
                admit(reply, sends)
        except LocalProtocolError:
            self._take_back()
            raise
        finally:
            ctx.open = False  # ctx.close()
        undo.inputs.append(("", command))  # undo.took, inline
        undo.size += len(command)
        return reply, sends

    def message(self, src: str, payload: bytes) -> Sends:
        """The next message on channel `src` -> this node: the sends it made. Raises AppFailed."""
        undo = self.undo
        if len(undo.inputs) >= undo.steps_limit or undo.size >= undo.size_limit:  # undo.full, inline (H5)
            self.snapshot(as_blocks=True)  # the base need not be bytes (H8)
        ctx = _blank(Context)  # Context(node_id, peers_out), as in `command`
        ctx.node_id = self._node_id
        ctx.peers_out = self._peers_out
        ctx.sends = []
        ctx.open = True
        try:
            self.machine.on_message(src, payload, ctx)
        except Exception as exc:  # noqa: BLE001  (Refused included: a peer's message cannot be refused)
            raise AppFailed(f"app {self.app.name!r} raised in on_message from {src!r}: {_text(exc)}") from exc
        finally:
            ctx.open = False  # ctx.close()
        undo.inputs.append((src, payload))  # undo.took, inline
        undo.size += len(payload)
        return ctx.sends

    def query(self, query: bytes) -> bytes:
        """A client's read (`on_query`) -> its reply. Raises AppRefusal with the app as it was (H7);
        AppFailed when it cannot be put back."""
        on_query = getattr(self.machine, "on_query", None)
        if not callable(on_query):
            raise AppRefusal(f"app {self.app.name!r} has no on_query: a read goes through Submit",
                             Refusal.APP_REFUSED, "UNIMPLEMENTED")
        try:
            try:
                reply = on_query(query)
            except StepEnded as exc:
                raise AppRefusal(f"app {self.app.name!r}: a query must not send ({exc}); the app is put back",
                                 Refusal.APP_REFUSED, "FAILED_PRECONDITION") from None
            except Refused as refused:
                raise AppRefusal(refused.text, Refusal.APP_REFUSED, refused.code) from None
            except Exception as exc:  # noqa: BLE001
                raise AppRefusal(
                    f"app {self.app.name!r} raised in on_query: {_text(exc)}", Refusal.APP_FAILED, "UNKNOWN"
                ) from exc
            if not isinstance(reply, bytes | bytearray):
                raise AppRefusal(f"app {self.app.name!r}: on_query returned {type(reply).__name__}, not bytes",
                                 Refusal.APP_FAILED, "UNKNOWN")
        except LocalProtocolError:
            self._take_back()
            raise
        return bytes(reply)

    def snapshot(self, *, as_blocks: bool = False) -> bytes | BlockState:
        """The app's state as bytes (H2); the undo log's new base (H5). `as_blocks`: for a
        reader that takes a BlockState (a log record's wal.Packed), held as the cut holds it (H8)."""
        state = self._held(self.machine) if as_blocks else self._snapshot(self.machine)
        self.undo.rebase(state)
        return state

    def _held(self, machine: Any) -> bytes | BlockState:
        """snapshot() as the cut holds it (H8): a BlockState of a large blocks app's parts, else bytes."""
        state, parts, plain = self._taken(machine)
        return _kept(parts, plain)[0] if state is None else state

    def cut(self) -> tuple[bytes | BlockState, tuple[bytes, ...]]:
        """`snapshot()` at a snapshot's cut: the state, and the non-empty parts
        snapshot_blocks() gave, as it gave them (() for an app without it): the cut names
        them (cutnames.py). The state is those parts as a BlockState, never joined, when
        large (H8); else plain bytes, joined once (a PartedState is a second copy)."""
        state, parts, plain = self._taken(self.machine)
        if state is None:
            state, parts = _kept(parts, plain)
        self.undo.rebase(state)
        return state, parts

    def _take_back(self) -> None:
        """Put the app back as it was before the step that failed (H4)."""
        self.undone += 1
        base, inputs = self.undo.base, list(self.undo)
        machine = self._new() if base is None else self._restored(base)
        for src, data in inputs:
            ctx = self._context()
            try:
                if src:
                    machine.on_message(src, data, ctx)
                else:
                    machine.on_command(data, ctx)
                ctx.close()
            except Exception as exc:  # noqa: BLE001  (Refused included: the first run took this input)
                kind = f"the message from {src!r}" if src else "the command"
                raise AppFailed(
                    f"app {self.app.name!r}: taking back a refused command, {kind} replayed from the undo log"
                    f" raised {_text(exc)}; the first run did not (is the app deterministic?)"
                ) from exc
        self.machine = machine
        if inputs:  # the next refusal restores this, replaying nothing
            self.undo.rebase(self._held(machine))

    def takes_blocks(self) -> bool:
        """Whether the app restores from blocks (A9): a restore as blocks is then rebuilt as a BlockState."""
        return _own(type(self.machine), "restore_blocks", "restore")

    def _restored(self, state: bytes | BlockState) -> Any:
        machine = self._new()
        try:
            if type(state) is not BlockState:
                machine.restore(state)
            elif _own(type(machine), "restore_blocks", "restore"):
                machine.restore_blocks(iter(state.blocks))  # H3: the blocks themselves, no join
            else:
                machine.restore(bytes(state))  # BST3: the one join
        except Exception as exc:  # noqa: BLE001  (app code: any exception is the app's failure)
            raise AppFailed(f"app {self.app.name!r} raised in restore(): {_text(exc)}") from exc
        return machine

    def _snapshot(self, machine: Any) -> bytes:
        """snapshot(), or the parts of snapshot_blocks() joined when the app has it
        (their sizes ride along for the report, snapmesh/protocol/blocks.py B6)."""
        state, parts, _ = self._taken(machine)
        if state is not None:
            return state
        parted = PartedState(b"".join(parts))
        parted.parts = tuple(len(part) for part in parts)
        return parted

    def _taken(self, machine: Any) -> tuple[bytes | None, tuple[bytes, ...], bool]:
        """snapshot() as bytes and (); or None and the non-empty parts of snapshot_blocks()
        (not joined: `cut` may keep them as they are, H8); and whether every part is `bytes`
        itself (not a bytearray, not a subclass)."""
        cut = _parts_of(machine)
        name = "snapshot()" if cut is None else "snapshot_blocks()"
        try:
            state = machine.snapshot() if cut is None else cut()
            if cut is not None and type(state) is not list and type(state) is not tuple:
                state = [*state]  # an iterator, a generator: read once (a list the app gave is read as it is)
        except Exception as exc:  # noqa: BLE001
            raise AppFailed(f"app {self.app.name!r} raised in {name}: {_text(exc)}") from exc
        if cut is not None:
            # the empty parts dropped, then the types checked as a set (a step per part costs milliseconds
            # at thousands of parts; each pass over them touches every part: no more passes than these)
            parts = tuple(filter(None, state))
            kinds = set(map(type, parts))
            if (len(parts) != len(state) or not kinds <= _PLAIN) and \
                    (wrong := [type(part).__name__ for part in state if not isinstance(part, bytes | bytearray)]):
                raise AppFailed(f"app {self.app.name!r}: snapshot_blocks() gave a {wrong[0]}, not bytes")
            return None, parts, kinds <= _BYTES
        if not isinstance(state, bytes | bytearray):
            raise AppFailed(f"app {self.app.name!r}: snapshot() returned {type(state).__name__}, not bytes")
        return bytes(state), (), True

    def _new(self) -> Any:
        try:
            machine = self.app.new(self.info)
        except Exception as exc:  # noqa: BLE001
            raise AppFailed(f"app {self.app.name!r}: new() raised for {self.info.node_id}: {_text(exc)}") from exc
        validate_machine(machine, self.info)
        return machine

    def _context(self) -> Context:
        return Context(self._node_id, self._peers_out)


_PLAIN = frozenset((bytes, bytearray))
_BYTES = frozenset((bytes,))
_blank = object.__new__  # an instance without its __init__: `command` sets what Context.__init__ would


def _kept(parts: tuple[bytes, ...], plain: bool) -> tuple[bytes | BlockState, tuple[bytes, ...]]:
    """The state a cut keeps of `parts` (H8): a BlockState of them when large, on the grid
    or off it (a part not `bytes` itself copied: a bytearray may change under the cut), else
    their join. `plain`: every part is `bytes` itself (`_taken` read their types)."""
    state = BlockState.of_parts(parts)  # its size read with its offsets: one pass (blockstate.BST4)
    if len(state) <= BLOCKS_FORM_BYTES:
        return b"".join(parts), parts
    if not plain:
        parts = tuple(part if type(part) is bytes else bytes(part) for part in parts)
        return BlockState.of_parts(parts), parts
    return state, parts


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _parts_of(machine: Any) -> Any:
    """The machine's snapshot_blocks, when its class defines one no higher up than
    its snapshot() (A8): a subclass that changes snapshot() (another encoding, a new
    version) and keeps its base's snapshot_blocks would otherwise store the base's
    bytes; one reached through __getattr__ (a wrapper's inner machine) is not used."""
    return machine.snapshot_blocks if _own(type(machine), "snapshot_blocks", "snapshot") else None


def _own(cls: type, name: str, plain: str) -> bool:
    """Whether `cls` defines `name` no higher up than its `plain` (snapshot_blocks and
    snapshot, A8; restore_blocks and restore, A9): a subclass that changes the plain
    method keeps its base's block method for the base's encoding only."""
    mro = cls.__mro__
    owner = next((c for c in mro if name in vars(c)), None)
    if owner is None or not callable(getattr(cls, name)):
        return False
    plain_owner = next((c for c in mro if plain in vars(c)), None)
    return plain_owner is None or plain_owner is owner or not issubclass(plain_owner, owner)
