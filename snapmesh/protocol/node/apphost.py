"""The hosted app seen from the node machine: one `snapmesh.app` Machine, one step at a time.

The node machine owns sequence numbers, markers, the log and epochs; the app
owns its state and the meaning of its bytes. `Host` is the one place that
calls into app code, so the node machine sees only three outcomes of a step:
a reply with the sends it made, an `AppRefusal` (the client is refused and
nothing is logged), or `AppFailed` (a peer's message the app cannot take: the
node must stop, since a FIFO lossless channel cannot skip it).

Rules
-----
H1. A step runs the app on one fresh `Context`; the sends it collected leave
    only if the step returns normally. A refusal or an exception drops them.
H2. `snapshot()` must return bytes; anything else is the app's bug, reported
    as `AppFailed` with the type it returned.
H3. `restore(state)` runs on a fresh instance; the old one is kept until the
    new one restored without raising, so a failed restore changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from snapmesh.app import App, Context, NodeInfo, Refused, validate_machine
from snapmesh.protocol.node.core import AppFailed, AppRefusal, Refusal

Sends = list[tuple[str, bytes]]


class Host:
    """Drives one app Machine for node `node_id` (rules H1-H3)."""

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
        self.machine = self._new()

    def fresh(self) -> None:
        """A new instance, as at the node's first start."""
        self.machine = self._new()

    def restore(self, state: bytes) -> None:
        """A fresh instance holding `state` (H3)."""
        machine = self._new()
        try:
            machine.restore(state)
        except Exception as exc:  # noqa: BLE001  (app code: any exception is the app's failure)
            raise AppFailed(f"app {self.app.name!r} raised in restore(): {_text(exc)}") from exc
        self.machine = machine

    def command(self, command: bytes) -> tuple[bytes, Sends]:
        """A client's command -> (reply, sends). Raises AppRefusal (H1)."""
        ctx = self._context()
        try:
            reply = self.machine.on_command(command, ctx)
        except Refused as refused:
            raise AppRefusal(refused.text, Refusal.APP_REFUSED, refused.code) from None
        except Exception as exc:  # noqa: BLE001
            raise AppRefusal(f"app {self.app.name!r} raised in on_command: {_text(exc)}", Refusal.APP_FAILED, "UNKNOWN") from exc
        if reply is None:
            reply = b""
        if not isinstance(reply, bytes | bytearray):
            raise AppRefusal(
                f"app {self.app.name!r}: on_command returned {type(reply).__name__}, not bytes", Refusal.APP_FAILED, "UNKNOWN"
            )
        return bytes(reply), list(ctx.sends)

    def message(self, src: str, payload: bytes) -> Sends:
        """The next message on channel `src` -> this node: the sends it made. Raises AppFailed."""
        ctx = self._context()
        try:
            self.machine.on_message(src, payload, ctx)
        except Exception as exc:  # noqa: BLE001  (Refused included: a peer's message cannot be refused)
            raise AppFailed(f"app {self.app.name!r} raised in on_message from {src!r}: {_text(exc)}") from exc
        return list(ctx.sends)

    def snapshot(self) -> bytes:
        """The app's state as bytes (H2)."""
        try:
            state = self.machine.snapshot()
        except Exception as exc:  # noqa: BLE001
            raise AppFailed(f"app {self.app.name!r} raised in snapshot(): {_text(exc)}") from exc
        if not isinstance(state, bytes | bytearray):
            raise AppFailed(f"app {self.app.name!r}: snapshot() returned {type(state).__name__}, not bytes")
        return bytes(state)

    def _new(self) -> Any:
        try:
            machine = self.app.new(self.info)
        except Exception as exc:  # noqa: BLE001
            raise AppFailed(f"app {self.app.name!r}: new() raised for {self.info.node_id}: {_text(exc)}") from exc
        validate_machine(machine, self.info)
        return machine

    def _context(self) -> Context:
        return Context(self.info.node_id, self.info.peers_out)


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
