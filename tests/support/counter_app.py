"""A counting app for the Submit and SubmitBatch servicer tests: "inc" counts and
sends to p2, "refuse" refuses (NOT_FOUND), "boom" raises; Forgetful is not deterministic."""

from __future__ import annotations

from snapmesh.app import Context, NodeInfo


class Counter:
    def __init__(self, info: NodeInfo) -> None:
        self.count = 0

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        if command == b"refuse":
            ctx.refuse("NOT_FOUND", "nothing here")
        if command == b"boom":
            raise RuntimeError("kaboom")
        self.count += 1
        ctx.send("p2", str(self.count).encode())
        return str(self.count).encode()

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        pass

    def snapshot(self) -> bytes:
        return str(self.count).encode()

    def restore(self, state: bytes) -> None:
        self.count = int(state)


class Forgetful(Counter):
    """Not deterministic: "inc" raises when run a second time, as a replay runs it."""

    runs = 0

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        if command == b"inc":
            Forgetful.runs += 1
            if Forgetful.runs > 1:
                raise RuntimeError("not twice")
        return super().on_command(command, ctx)
