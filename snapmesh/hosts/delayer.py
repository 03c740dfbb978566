"""A one-way delay without `netem`: hold every packet queued to NFQUEUE for N ms.

    python -m snapmesh.hosts.delayer --queue 0 --delay-ms 5

Run in a host's network namespace, where an iptables rule sends the packets the
host puts on its link to the queue (snapmesh.hosts.plan.Bench.delay). The
kernel keeps each packet; we are told only its id (copy mode META: no payload
crosses), and give the verdict ACCEPT once the packet is `delay` old. With one
delay for all, packets are due in the order they came, so one batch verdict
("every id up to this one") lets out all that are due: one system call per
wake-up, and a notice lost to a full socket buffer is let out by the next.

Netlink speaks for itself here (a few struct layouts from
linux/netfilter/nfnetlink_queue.h), so nothing needs installing. Prints
`delayer: ready` once bound; SIGTERM/SIGINT release what it holds and exit 0.
Exit 2 when the queue cannot be bound (no rights, or taken).
"""

from __future__ import annotations

import argparse
import collections
import errno
import os
import select
import signal
import socket
import struct
import sys
import time

from snapmesh.processes.orphans import die_with_parent_if_asked

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_ACCEPT = 1
QUEUE_MAXLEN = 65536
_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big-endian queue number, packed by hand)


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def message(kind: int, queue: int, attrs: bytes, *, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    """One nfnetlink message to the queue subsystem."""
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack(">H", queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def packet_ids(data: bytes | memoryview) -> tuple[list[int], list[int]]:
    """The packet ids in a datagram of netlink messages, and the error codes of acks (0: ok)."""
    ids: list[int] = []
    errors: list[int] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        if kind == NLMSG_ERROR:
            errors.append(-struct.unpack_from("=i", data, offset + _NLMSGHDR.size)[0])
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            pos = offset + _NLMSGHDR.size + _NFGENMSG.size
            end = offset + length
            while pos + 4 <= end:
                alen, akind = struct.unpack_from("=HH", data, pos)
                if alen < 4:
                    break
                if akind & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from(">I", data, pos + 4)[0])
                pos += (alen + 3) & ~3
        offset += (length + 3) & ~3
    return ids, errors


class Delayer:
    def __init__(self, queue: int, delay_s: float) -> None:
        self.queue = queue
        self.delay_s = delay_s
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        for option in (33, socket.SO_RCVBUF):  # SO_RCVBUFFORCE (root) past rmem_max, else what we may
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, option, 8 << 20)
                break
            except OSError:
                continue
        self.sock.bind((0, 0))
        self.held: collections.deque[tuple[float, int]] = collections.deque()
        # One buffer for every datagram: a recv(64 KiB) allocated and shrank a bytes per packet.
        self._buffer = bytearray(1 << 16)
        self._view = memoryview(self._buffer)

    def bind(self) -> None:
        """Bind the queue, copy metadata only, a long queue; OSError naming the errno on refusal."""
        cmd = _attr(NFQA_CFG_CMD, struct.pack(">BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET))
        params = _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
        maxlen = _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_MAXLEN))
        for seq, attrs in enumerate((cmd, params + maxlen), start=1):
            self.sock.send(message(NFQNL_MSG_CONFIG, self.queue, attrs, flags=NLM_F_REQUEST | NLM_F_ACK, seq=seq))
            _ids, errors = packet_ids(self.sock.recv(65536))
            if errors and errors[0]:
                raise OSError(errors[0], f"binding NFQUEUE {self.queue}: {os.strerror(errors[0])}")
        self.sock.setblocking(False)

    def release_due(self, now: float) -> None:
        last = None
        while self.held and self.held[0][0] <= now:
            last = self.held.popleft()[1]
        if last is not None:
            self.verdict(last)

    def verdict(self, up_to: int) -> None:
        attrs = _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, up_to))
        self.sock.send(message(NFQNL_MSG_VERDICT_BATCH, self.queue, attrs))

    def receive(self) -> None:
        """One datagram, the socket being readable. Not a loop to the empty socket: most
        wake-ups bring one packet, and the recv that found none was a third of the recvs;
        a second datagram waiting makes the next select return at once."""
        try:
            size = self.sock.recv_into(self._buffer)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # notices lost; their packets go with the next batch verdict
                return
            raise
        due = time.monotonic() + self.delay_s
        for packet_id in packet_ids(self._view[:size])[0]:
            self.held.append((due, packet_id))

    def run(self, stop: list[bool]) -> None:
        while not stop:
            timeout = max(0.0, self.held[0][0] - time.monotonic()) if self.held else 0.5
            try:
                readable, _, _ = select.select([self.sock], [], [], timeout)
            except InterruptedError:
                continue
            if readable:
                self.receive()
            self.release_due(time.monotonic())
        if self.held:
            self.verdict(self.held[-1][1])


def _realtime() -> str:
    """SCHED_FIFO when we may: on a busy machine an ordinary process wakes up late,
    and each late wake-up adds to the delay (the 5 ms probe measured 6.8 without it)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO"
    except (OSError, AttributeError) as exc:
        return f"ordinary scheduling ({exc})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapmesh.hosts.delayer", description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=0, help="the NFQUEUE number (default 0)")
    parser.add_argument("--delay-ms", type=float, required=True, help="how long each packet is held")
    die_with_parent_if_asked()  # started by the supervisor: go when it goes
    args = parser.parse_args(argv)
    if not 0 < args.delay_ms <= 10_000:
        parser.exit(2, f"delayer: --delay-ms must be in (0, 10000], got {args.delay_ms:g}\n")
    try:
        delayer = Delayer(args.queue, args.delay_ms / 1000)
        delayer.bind()
    except OSError as exc:
        print(f"delayer: cannot bind NFQUEUE {args.queue}: {exc}", file=sys.stderr)
        return 2
    realtime = _realtime()
    stop: list[bool] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    print(f"delayer: ready (queue {args.queue}, {args.delay_ms:g} ms, {realtime})", flush=True)
    delayer.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
