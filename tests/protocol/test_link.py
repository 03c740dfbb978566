"""snapmesh/protocol/node/link.py: a Sender and a Receiver over an in-memory wire (h11's ConnectionPair idea)."""

from __future__ import annotations

import pytest

from snapmesh.protocol.node import core, link


class Pair:
    """One channel a->b. The test plays the logs: `durable` is how far each side's log is on disk."""

    def __init__(self, **sender_kw) -> None:
        self.tx = link.Sender(src="a", dst="b", **sender_kw)
        self.rx = link.Receiver(src="a", dst="b")
        self.lsn = 0  # the receiver's log
        self.wire: list[link.Entry] = []
        self.applied: list[int] = []
        self.conn_no = 0

    def connect(self) -> None:
        self.conn_no += 1
        self.wire.clear()
        self.tx.connect(self.conn_no)
        self.rx.open(self.conn_no, self.lsn)

    def send(self, n: int, amount: int = 1) -> None:
        for _ in range(n):
            self.tx.enqueue(lsn=0, payload=b"%d" % amount)

    def pump(self, durable_tx: int = 10**9) -> None:
        self.wire += self.tx.poll(durable_tx)

    def deliver(self, count: int | None = None) -> None:
        todo, self.wire = (self.wire, []) if count is None else (self.wire[:count], self.wire[count:])
        for entry in todo:
            if self.rx.admit(self.conn_no, entry.seq):
                self.lsn += 1
                self.rx.applied(entry.seq, self.lsn)
                self.applied.append(entry.seq)

    def ack(self, durable_rx: int | None = None) -> int | None:
        seq = self.rx.ack_due(self.lsn if durable_rx is None else durable_rx)
        if seq is not None:
            self.tx.on_ack(self.conn_no, seq)
        return seq


def test_in_order_delivery_and_cumulative_acks_only_once_durable() -> None:
    pair = Pair()
    pair.connect()
    pair.send(3)
    pair.pump()
    pair.deliver()
    assert pair.applied == [1, 2, 3]
    assert pair.ack(durable_rx=0) == 0  # the open is owed our position (0): no data acked yet
    assert pair.tx.unacked == 3
    assert pair.ack(durable_rx=2) == 2
    assert pair.tx.unacked == 1 and [e.seq for e in pair.tx.outbox] == [3]
    assert pair.ack() == 3 and pair.tx.unacked == 0


def test_nothing_leaves_before_its_record_is_durable() -> None:
    pair = Pair()
    pair.connect()
    for lsn in (5, 6, 7):
        pair.tx.enqueue(lsn=lsn, payload=b"1")
    assert pair.tx.poll(4) == []
    assert [e.seq for e in pair.tx.poll(6)] == [1, 2]
    assert [e.seq for e in pair.tx.poll(7)] == [3]


def test_a_cut_loses_the_wire_and_the_sender_resends_from_its_last_ack() -> None:
    pair = Pair()
    pair.connect()
    pair.send(5)
    pair.pump()
    pair.deliver(2)
    pair.ack()
    pair.connect()  # the wire (3, 4, 5) is lost
    pair.pump()
    assert [e.seq for e in pair.wire] == [3, 4, 5]
    pair.deliver()
    assert pair.applied == [1, 2, 3, 4, 5]


def test_a_resend_of_what_the_receiver_holds_is_dropped() -> None:
    pair = Pair()
    pair.connect()
    pair.send(3)
    pair.pump()
    pair.deliver()  # applied 1..3, but no ack reached the sender
    pair.connect()
    pair.pump()
    assert [e.seq for e in pair.wire] == [1, 2, 3]
    pair.deliver()
    assert pair.applied == [1, 2, 3] and pair.rx.duplicates == 3
    assert pair.ack() == 3 and pair.tx.unacked == 0


def test_a_gap_is_a_protocol_error() -> None:
    rx = link.Receiver(src="a", dst="b")
    rx.open(1, 0)
    with pytest.raises(core.RemoteProtocolError, match="got seq 2 after 0"):
        rx.admit(1, 2)


def test_frames_acks_and_opens_of_an_older_connection_are_fenced() -> None:
    pair = Pair()
    pair.connect()
    pair.send(1)
    pair.pump()
    old = pair.wire[:]
    pair.connect()
    assert not pair.rx.admit(1, old[0].seq)  # a frame of connection 1 after connection 2 opened
    assert not pair.rx.open(1, 0)  # a late open of connection 1
    assert not pair.tx.on_ack(1, 1)  # an ack of connection 1
    assert pair.tx.unacked == 1


def test_the_receiver_answers_a_new_connection_with_its_position() -> None:
    pair = Pair()
    pair.connect()
    pair.send(2)
    pair.pump()
    pair.deliver()
    pair.connect()
    assert pair.ack() == 2  # owed to the new connection even though nothing new arrived


def test_flow_control_mark_and_hard_bound() -> None:
    tx = link.Sender(src="a", dst="b", mark=2, bound=4)
    for _ in range(3):
        tx.check_room()
        tx.enqueue(lsn=0, payload=b"1")
    assert tx.over_mark
    tx.check_room()
    tx.enqueue(lsn=0, payload=b"1")
    with pytest.raises(link.ChannelFull, match="holds 4 unacknowledged messages"):
        tx.check_room()
    assert tx.unacked == 4 and tx.next_seq == 5  # refusing changed nothing
    tx.connect(1)
    tx.on_ack(1, 2)
    tx.check_room()
    assert not tx.over_mark


def test_acks_that_break_the_protocol() -> None:
    tx = link.Sender(src="a", dst="b")
    tx.enqueue(lsn=0, payload=b"1")
    tx.connect(1)
    with pytest.raises(core.RemoteProtocolError, match="never sent"):
        tx.on_ack(1, 2)
    tx.on_ack(1, 1)
    with pytest.raises(core.RemoteProtocolError, match="data loss"):
        tx.on_ack(1, 0)


def test_a_recovered_outbox_must_be_contiguous_after_the_watermark() -> None:
    outbox = [link.Entry(3, 0, "", 0, b"1"), link.Entry(4, 0, "s1")]
    tx = link.Sender(src="a", dst="b", next_seq=5, acked=2, outbox=outbox)
    assert tx.unacked == 2
    with pytest.raises(core.LocalProtocolError, match="does not hold 2..4"):
        link.Sender(src="a", dst="b", next_seq=5, acked=1, outbox=outbox)
