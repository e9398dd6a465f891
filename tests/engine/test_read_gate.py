"""The server's read entry point (qrouter/server.py AmqpProtocol, read_path.pxi ReadGate): a
socket read of transfers, flows and dispositions is fed, routed and flushed without one
Python frame; a read with control frames, a connection whose control-frame bucket is in debt,
and a peer's OPEN with an idle-time-out still reach the protocol's `_after_read`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from qrouter.config import ListenerConfig
from qrouter.core import Core
from qrouter.server import AmqpProtocol
from tests.engine.pump import (
    AMQP_HEADER,
    DISPOSITION,
    FLOW,
    TRANSFER,
    UInt,
    attach_frame,
    begin_frame,
    described,
    flow_frame,
    make_core,
    message_bytes,
    open_frame,
    parse_output,
    perf,
    transfer_frame,
)


class Transport:
    """What the protocol and the engine call; `write`, the only call of a message's read, is
    a C builtin (a list's append), so it adds no Python frame of its own."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.write = self.writes.append
        self.paused: list[bool] = []

    def pause_reading(self) -> None:
        self.paused.append(True)

    def resume_reading(self) -> None:
        self.paused.append(False)

    def get_extra_info(self, name: str) -> Any:
        return None

    def close(self) -> None:
        pass

    def frames(self) -> list[int]:
        out = parse_output(b"".join(self.writes))[1]
        self.writes.clear()
        return [f.code for f in out]


def connect(core: Core, handshake: bytes) -> tuple[AmqpProtocol, Transport, list[int]]:
    """A protocol with a fake transport, fed `handshake` in one read; its `_after_read` calls
    counted (the list's length)."""
    proto = AmqpProtocol(core, ListenerConfig())
    transport = Transport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    calls: list[int] = []
    after = proto.gate.after

    def counted() -> None:
        calls.append(1)
        after()

    proto.gate.after = counted
    proto.data_received(handshake)
    return proto, transport, calls


def python_calls(fn: Callable[[bytes], None], data: bytes) -> list[str]:
    """The Python functions that ran while `fn(data)` ran (sys.setprofile 'call' events)."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        fn(data)
    finally:
        sys.setprofile(None)
    return seen


def header(container: str, **open_fields: Any) -> bytes:
    return AMQP_HEADER + open_frame(container, **open_fields) + begin_frame()


async def _wired(
    core: Core,
) -> tuple[AmqpProtocol, Transport, list[int], AmqpProtocol, Transport, list[int]]:
    core.engine.schedule = asyncio.get_running_loop().call_soon
    consumer, ct, c_calls = connect(
        core,
        header("gate-consumer")
        + attach_frame("c", 0, sender=False, address="gate.q")
        + flow_frame(handle=0, delivery_count=0, link_credit=100),
    )
    producer, pt, p_calls = connect(
        core, header("gate-producer") + attach_frame("p", 0, sender=True, address="gate.q")
    )
    await asyncio.sleep(0)  # any scheduled flush
    return consumer, ct, c_calls, producer, pt, p_calls


def test_message_reads_run_no_python_frame() -> None:
    async def scenario() -> None:
        core = make_core()
        consumer, ct, c_calls, producer, pt, p_calls = await _wired(core)
        assert c_calls and p_calls  # the handshakes' control frames reached _after_read
        ct.frames()
        assert FLOW in pt.frames()  # the producer's credit
        c_calls.clear()
        p_calls.clear()
        msgs = b"".join(transfer_frame(0, i, b"t%d" % i, message_bytes(i)) for i in range(2))
        ran = python_calls(producer.data_received, msgs)
        assert ran == []
        assert ct.frames() == [TRANSFER, TRANSFER]  # written within the read
        disp = perf(
            DISPOSITION, role=True, first=UInt(0), last=UInt(1), settled=True, state=described(0x24)
        )
        ran = python_calls(consumer.data_received, disp)
        assert ran == []
        assert pt.frames() == [DISPOSITION]
        assert c_calls == [] and p_calls == []
        consumer.data_received(attach_frame("c2", 1, sender=False, address="gate.q2"))
        assert c_calls == [1]  # a control frame: the control plane's turn
        consumer.connection_lost(None)
        producer.connection_lost(None)

    asyncio.run(scenario())


def test_a_bucket_in_debt_sees_every_read() -> None:
    """limits.max_control_rate: once a peer's control frames put its bucket in debt, every read
    goes through _after_read (which pauses reading until the bucket refilled), not only reads
    with control frames."""

    async def scenario() -> None:
        core = make_core()
        core.config.limits.max_control_rate = 2
        consumer, ct, c_calls, producer, pt, p_calls = await _wired(core)
        assert producer.tokens < 0 and pt.paused[:1] == [True]
        p_calls.clear()
        producer.data_received(transfer_frame(0, 0, b"t", message_bytes(0)))
        assert p_calls == [1]
        consumer.connection_lost(None)
        producer.connection_lost(None)

    asyncio.run(scenario())


def test_the_peers_idle_timeout_rearms_the_timer() -> None:
    """2.4.5: the OPEN's idle-time-out reaches the protocol, whose heartbeat timer is armed
    for it, in the same read."""

    async def scenario() -> None:
        core = make_core()
        core.engine.schedule = asyncio.get_running_loop().call_soon
        proto, _t, calls = connect(core, header("gate-idle", idle_time_out=UInt(4000)))
        assert calls
        assert proto.tick_remote == 4000 and proto.gate.tick_remote == 4000
        assert proto.timer is not None
        proto.connection_lost(None)

    asyncio.run(scenario())
