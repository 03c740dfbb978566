"""One stream of updates to many readers, each with a bounded queue (a server-streaming RPC's fan-out).

A reader that falls `limit` updates behind is dropped, not queued for forever:
what it had not read is replaced by FellBehind, raised where it reads next (it
reads what it missed some other way, and subscribes again). `end()` ends every
stream, for a server about to drain.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
_END, _BEHIND = object(), object()


class FellBehind(Exception):
    """The reader was dropped: `limit` updates waited for it."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"fell {limit} updates behind")
        self.limit = limit


class FanOut(Generic[T]):
    def __init__(self, limit: int, reader: str) -> None:
        self.limit = limit
        self.reader = reader  # what a reader is called in the log line that drops one
        self._readers: set[Reader[T]] = set()

    def __len__(self) -> int:
        return len(self._readers)

    def subscribe(self) -> Reader[T]:
        """A reader of every update from now on (a context manager: leaving it unsubscribes)."""
        reader = Reader(self)
        self._readers.add(reader)
        return reader

    def publish(self, update: T) -> None:
        self._put(update)

    def end(self) -> None:
        self._put(_END)

    def _put(self, item: object) -> None:
        for reader in list(self._readers):
            try:
                reader.queue.put_nowait(item)
            except asyncio.QueueFull:
                reader.close()
                while not reader.queue.empty():
                    reader.queue.get_nowait()
                reader.queue.put_nowait(_BEHIND if item is not _END else _END)
                if item is not _END:
                    log.warning("a %s fell %d updates behind: dropped", self.reader, self.limit)


class Reader(Generic[T]):
    def __init__(self, fanout: FanOut[T]) -> None:
        self._fanout = fanout
        self.queue: asyncio.Queue[object] = asyncio.Queue(maxsize=fanout.limit)  # what it has not read

    def close(self) -> None:
        self._fanout._readers.discard(self)

    def __enter__(self) -> Reader[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> Reader[T]:
        return self

    async def __anext__(self) -> T:
        item = await self.queue.get()
        if item is _END:
            raise StopAsyncIteration
        if item is _BEHIND:
            raise FellBehind(self._fanout.limit)
        return item  # type: ignore[return-value]
