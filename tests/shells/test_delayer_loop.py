"""The hosts testbed's delayer loop (snapmesh/hosts/delayer.py) on a socket pair in place of
its NFQUEUE: packet notices in at one end, batch verdicts out at the other, real system calls.

- Every packet is let out no sooner than the delay after its notice came, in order (a
  verdict names every id up to it, and the ids it names only grow).
- One receive per notice: the loop does not read on to the empty socket to learn it is
  empty (that read was a third of the delayer's receives, one per wake-up).
"""

from __future__ import annotations

import sched
import socket
import struct
import threading
import time

import pytest

from snapmesh.hosts import delayer

pytestmark = pytest.mark.timeout(60)
DELAY_S = 0.005


class _Counting:
    """The delayer's socket, its receives counted."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.receives = 0

    def recv(self, *args: object) -> bytes:
        self.receives += 1
        return self._sock.recv(*args)  # type: ignore[arg-type]

    def recv_into(self, *args: object) -> int:
        self.receives += 1
        return self._sock.recv_into(*args)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def _notice(packet_id: int) -> bytes:
    hdr = delayer._attr(delayer.NFQA_PACKET_HDR, struct.pack(">I", packet_id) + b"\x08\x00\x03")
    return delayer.message(delayer.NFQNL_MSG_PACKET, 0, hdr)


def _send(kernel: socket.socket, packet_id: int, sent: dict[int, float]) -> None:
    sent[packet_id] = time.monotonic()
    kernel.send(_notice(packet_id))


def _verdict_id(data: bytes) -> int:
    # nlmsghdr, nfgenmsg, then the verdict header attribute: its length, kind, verdict, id
    return struct.unpack_from(">I", data, delayer._NLMSGHDR.size + delayer._NFGENMSG.size + 8)[0]


def test_each_packet_waits_the_delay_in_order_with_one_receive_per_notice() -> None:
    kernel, ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    d = delayer.Delayer(0, DELAY_S)
    d.sock.close()
    ours.setblocking(False)
    counting = _Counting(ours)
    d.sock = counting  # type: ignore[assignment]
    stop: list[bool] = []
    loop = threading.Thread(target=d.run, args=(stop,))
    loop.start()
    sent: dict[int, float] = {}
    released: list[tuple[int, float]] = []
    try:
        kernel.settimeout(2)
        plan = sched.scheduler(time.monotonic)
        for packet_id in range(1, 41):  # spread out, and some back to back
            plan.enter(0.0013 * (packet_id - packet_id // 4), 0, _send, (kernel, packet_id, sent))
        plan.run()
        while not released or released[-1][0] < 40:
            released.append((_verdict_id(kernel.recv(256)), time.monotonic()))
    finally:
        stop.append(True)
        loop.join(5)
        kernel.close()
        ours.close()
    ids = [packet_id for packet_id, _ in released]
    assert ids == sorted(set(ids)) and ids[-1] == 40, ids
    freed_at = {}
    last = 0
    for up_to, at in released:
        for packet_id in range(last + 1, up_to + 1):
            freed_at[packet_id] = at
        last = up_to
    early = {p: round((freed_at[p] - sent[p]) * 1e3, 2) for p in sent if freed_at[p] - sent[p] < DELAY_S}
    assert not early, f"let out before {DELAY_S * 1e3:g} ms (ms after the notice): {early}"
    assert counting.receives == 40, f"{counting.receives} receives for 40 notices"
