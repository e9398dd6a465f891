"""The read path (qrouter/_fast/read_path.pxi): `Connection.received`, what the server calls
per socket read. A small read is flushed within the call and schedules no end-of-iteration
flush; a larger one leaves its output to the scheduled flush; the result tells the server
whether the control plane has work (control frames read)."""

from __future__ import annotations

from typing import Any

import proton

from qrouter.core import Core
from tests.engine.pump import TRANSFER, Peer, make_core, parse_output, pump, receive, send


class Transport:
    """What the engine needs of an asyncio transport: `write`, recorded."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        pass


def wired(core: Core) -> tuple[Peer, Peer, proton.Sender, proton.Receiver, list[Any]]:
    """A consumer and a producer of `rp.q`, attached through `core` with pump; then both
    engine connections write to recording transports and flushes are scheduled into a list."""
    consumer, producer = Peer(core), Peer(core)
    rcv = consumer.receiver("rp.q", credit=10)
    snd = producer.sender("rp.q")
    pump(consumer, producer)
    assert snd.credit > 0
    consumer.conn.transport, producer.conn.transport = Transport(), Transport()
    scheduled: list[Any] = []
    core.engine.schedule = scheduled.append
    return consumer, producer, snd, rcv, scheduled


def pending(peer: Peer) -> bytes:
    n = peer.transport.pending()
    data = peer.transport.peek(n)
    assert data is not None
    peer.transport.pop(n)
    return bytes(data)


def transfers(data: bytes) -> int:
    return sum(1 for f in parse_output(data)[1] if f.code == TRANSFER)


def test_small_read_is_written_within_the_call_and_schedules_no_flush() -> None:
    core = make_core()
    consumer, producer, snd, rcv, scheduled = wired(core)
    send(snd, "a")
    send(snd, "b")
    data = pending(producer)
    assert 0 < len(data) <= 2048
    assert producer.conn.received(data, 2048) is False  # transfers only
    assert scheduled == []
    written = b"".join(consumer.conn.transport.writes)
    assert transfers(written) == 2
    consumer.transport.push(written)
    assert [m.body for _d, m in receive(rcv)] == ["a", "b"]
    # a later change outside a read is scheduled as before
    consumer.conn.close()
    assert scheduled == [core.engine.flush]


def test_larger_read_leaves_its_output_to_the_scheduled_flush() -> None:
    core = make_core()
    consumer, producer, snd, rcv, scheduled = wired(core)
    send(snd, "a")
    data = pending(producer)
    assert producer.conn.received(data, len(data) - 1) is False
    assert consumer.conn.transport.writes == []
    assert scheduled == [core.engine.flush]
    scheduled.pop()()
    consumer.transport.push(b"".join(consumer.conn.transport.writes))
    assert [m.body for _d, m in receive(rcv)] == ["a"]


def test_control_frames_tell_the_server() -> None:
    core = make_core()
    _consumer, producer, _snd, _rcv, scheduled = wired(core)
    producer.conn.control_budget = 32  # as the server sets it (qrouter/server.py)
    producer.sender("rp.q", name="second")
    data = pending(producer)  # a BEGIN and an ATTACH
    assert producer.conn.received(data, 2048) is True
    assert producer.conn.control_used == 2
    assert scheduled == []
    assert any(
        f.name == "attach" for f in parse_output(b"".join(producer.conn.transport.writes))[1]
    )
