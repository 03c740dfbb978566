"""A TCP proxy for fault injection: real sockets, its own asyncio loop in a thread.

    proxy = ChaosProxy(listen_port, target_port)   # 127.0.0.1 both sides
    proxy.kill_connections()                        # RST every open connection
    proxy.block(); proxy.unblock()                  # a partition: every connection refused, then healed
    proxy.close()

Used in front of a node (the node listens on `listen_port` in the cluster file,
peers dial the proxy on `port`) to cut channel streams without touching either
process. The fault campaign (`snapmesh chaos`) and the node fault tests use it.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading


class ChaosProxy:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1") -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.host = host
        self.blocked = False  # a partition: new connections are reset at once
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"chaos-proxy-{listen_port}", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, self.host, self.listen_port, reuse_address=True)
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            _reset(writer)
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                _reset(w)

    def kill_connections(self) -> int:
        """Reset every open connection (both sides); returns how many pairs."""

        def kill() -> int:
            writers = list(self._writers)
            for w in writers:
                _reset(w)
            self._writers.clear()
            return len(writers) // 2

        count = asyncio.run_coroutine_threadsafe(_call(kill), self._loop).result(5)
        return count

    def block(self) -> int:
        """Partition the target from everything dialling it through here: reset
        every open connection and every new one until `unblock`."""
        self.blocked = True
        return self.kill_connections()

    def unblock(self) -> None:
        self.blocked = False

    def close(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            for w in list(self._writers):
                _reset(w)
            await self._server.wait_closed()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


async def _call(fn):
    return fn()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a network fault would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
