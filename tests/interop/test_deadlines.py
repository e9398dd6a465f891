"""Handshake deadline and slow-loris, against a real router over raw sockets (issue 13).

A listener's `handshake_timeout` bounds protocol header + SASL + OPEN; a frame that has begun
arriving must be whole within the listener's `idle_timeout` (qrouter/_fast/deadlines.pxi).
Waits are bounded by socket timeouts; the assertions are lower bounds (never closed early)
and outcomes (closed, with which error), not speed."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from proton import Delivery, Message

from tests.clients import pump_until_done
from tests.engine.pump import AMQP_HEADER, SASL_HEADER, begin_frame, open_frame
from tests.interop.raw_amqp import RawSocket


def _still_serves(r: Any, blocking: Any) -> None:
    rcv = blocking(r.url).create_receiver("deadline/q", credit=1)
    sender = blocking(r.url).create_sender("deadline/q")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="alive"), 15)
        assert rcv.receive(timeout=10).body == "alive"
        rcv.accept()
        assert pump_until_done(rcv.connection, future).remote_state == Delivery.ACCEPTED


def test_silent_socket_closed_at_the_handshake_deadline(router: Any, blocking: Any) -> None:
    r = router(listeners=[{"handshake_timeout": 1.0, "idle_timeout": 30.0}])
    s = RawSocket(r.listeners[0].port, timeout=15)
    took = s.wait_closed()
    assert took >= 0.9, f"closed after {took:.2f} s, before the 1 s deadline"
    _still_serves(r, blocking)


def test_amqp_header_only_gets_open_and_close(router: Any) -> None:
    """After the AMQP header the error travels: OPEN then CLOSE (2.4.1) with
    amqp:resource-limit-exceeded, then the socket closes."""
    r = router(listeners=[{"handshake_timeout": 1.0, "idle_timeout": 30.0}])
    s = RawSocket(r.listeners[0].port, timeout=15)
    s.send(AMQP_HEADER)
    assert s.header() == AMQP_HEADER
    frames = s.frames_until_eof()
    assert [f.name for f in frames] == ["open", "close"]
    condition, description = frames[1].error() or ("", "")
    assert condition == "amqp:resource-limit-exceeded"
    assert "OPEN not done within 1 s" in (description or "")


def test_sasl_header_only_is_closed(router: Any) -> None:
    """Stuck inside SASL (5.3): no AMQP frame can carry an error; the socket just closes."""
    r = router(listeners=[{"handshake_timeout": 1.0, "idle_timeout": 30.0}])
    s = RawSocket(r.listeners[0].port, timeout=15)
    s.send(SASL_HEADER)
    assert s.header() == SASL_HEADER
    assert [f.name for f in s.frames_until_eof()] == ["sasl-mechanisms"]


def test_slow_loris_partial_frame_closed_after_the_idle_timeout(router: Any) -> None:
    """An opened connection trickles a BEGIN one byte a second. Every byte resets the idle
    timer (3 s), so only the partial-frame deadline can end it: CLOSE with
    amqp:resource-limit-exceeded before the frame is complete."""
    r = router(listeners=[{"idle_timeout": 3.0}])
    s = RawSocket(r.listeners[0].port, timeout=15)
    s.send(AMQP_HEADER + open_frame("loris"))
    assert s.header() == AMQP_HEADER
    assert s.frame().name == "open"  # type: ignore[union-attr]
    frame = begin_frame()  # a whole BEGIN would take len(frame) seconds to arrive
    s.sock.settimeout(1.0)
    sent = 0
    closed_by: Any = None
    start = time.monotonic()
    while sent < len(frame) and time.monotonic() - start < 30:
        try:
            s.send(frame[sent : sent + 1])
            sent += 1
        except OSError:  # the router closed the socket
            break
        try:
            f = s.frame()
        except TimeoutError:
            continue
        if f is None or f.name == "close":
            closed_by = f
            break
        # (an empty frame: a heartbeat for our idle timeout, none asked; anything else: bug)
        assert f.name == "empty", f.name
    took = time.monotonic() - start
    assert sent < len(frame), "the whole frame went through: nothing closed the connection"
    assert closed_by is not None, "closed without a CLOSE frame"
    condition, description = closed_by.error() or ("", "")
    assert condition == "amqp:resource-limit-exceeded"
    assert "incomplete" in (description or "")
    assert took >= 2.9, f"closed after {took:.1f} s, before the 3 s idle timeout"
    print(f"slow-loris: {sent} of {len(frame)} bytes in {took:.1f} s, then CLOSE")
