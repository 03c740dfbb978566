"""What a hosted app's step is taken back from: a base state and the inputs since (apphost.H4).

The app's instance is the app's: snapmesh cannot see what a step changed, and
copying the state before every step would cost O(state) per command. So the
`Host` keeps, instead, the last state it knows as bytes (the base; None: a
fresh instance) and every input the app took since, in order. A fresh instance
restored from the base and handed those inputs again is, by determinism (rule
A2 of snapmesh.app), the app as it was before the step that failed: the same
argument recovery rests on, without reading the log.

The success path pays one list append per step, and a snapshot() now and
then: the base moves up to the live state whenever the node takes
`snapshot()` anyway (a cut, a checkpoint, a GetState), and when the inputs
since hold as many bytes as the base, or REBASE_STEPS of them (apphost.H5).
"""

from __future__ import annotations

from collections.abc import Iterator

# When the base moves up (apphost.H5): once the inputs since hold as many bytes as
# the base (within these bounds), replaying them would cost more than restoring a
# newer base, and one snapshot() per that many input bytes is O(1) per byte on the
# success path, where a copy before each step is O(state) per step. The step bound
# caps the replay of many small inputs; bench/undo.py has the figures (docs/apps.md).
REBASE_STEPS = 10_000
REBASE_MIN_BYTES = 64 * 1024
REBASE_MAX_BYTES = 64 * 1024 * 1024  # a base of GiBs still keeps at most this much input


# One step the app took: (src, data), a client's command (`src` "") or a message from `src`. A plain
# tuple: the Host appends one per step, inline (apphost.py), and a NamedTuple's would cost a second object.
Input = tuple[str, bytes]


class UndoLog:
    """The base and the inputs since (apphost.H4); the Host owns one."""

    def __init__(self) -> None:
        self.steps_limit = REBASE_STEPS
        self.base: bytes | None = None  # None: a fresh instance, as `new(info)` makes it
        self.inputs: list[Input] = []
        self.size = 0  # bytes of the inputs kept
        self.size_limit = REBASE_MIN_BYTES

    def rebase(self, state: bytes | None) -> None:
        """The live app now holds `state` (None: it is fresh): nothing before it is needed."""
        self.base, self.inputs, self.size = state, [], 0
        self.size_limit = min(max(len(state or b""), REBASE_MIN_BYTES), REBASE_MAX_BYTES)

    def took(self, src: str, data: bytes) -> None:
        """The app took `data` (from `src`; "": a command). Host.command and Host.message do this inline."""
        self.inputs.append((src, data))
        self.size += len(data)

    @property
    def full(self) -> bool:
        """Time to move the base up: so many inputs that an undo would replay too many.
        Host.command and Host.message test this inline."""
        return len(self.inputs) >= self.steps_limit or self.size >= self.size_limit

    def __iter__(self) -> Iterator[Input]:
        return iter(self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)
