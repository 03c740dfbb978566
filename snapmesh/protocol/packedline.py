"""A log line with `Packed` parts: written part by part, the state's base64 a slice at a time."""

from __future__ import annotations

from snapmesh.protocol.packed import Packed


class Line:
    """A line with `Packed` parts: `text()` joins it; a log writes its parts as they are."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: tuple[str | Packed, ...]) -> None:
        self.parts = parts
        self.size = sum(map(len, parts))

    def __len__(self) -> int:
        return self.size

    def text(self) -> str:
        return "".join(part if type(part) is str else part.text() for part in self.parts)  # type: ignore[union-attr]

    @staticmethod
    def of(parts: list[str | Packed], lazy: bool) -> str | Line:
        """`parts` joined into a str; or, `lazy` and one of them `Packed`, a `Line` of them."""
        if any(type(part) is Packed for part in parts):
            line = Line(tuple(parts))
            return line if lazy else line.text()
        return "".join(parts)  # type: ignore[arg-type]
