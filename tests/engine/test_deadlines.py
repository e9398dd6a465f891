"""Handshake and partial-frame deadlines, and a SASL outcome given later
(qrouter/_fast/deadlines.pxi), socketless: the clock is passed to `tick(now)`.

The same behaviour against real router processes and sockets: tests/interop/test_deadlines.py
and tests/interop/test_login_throttle.py."""

from __future__ import annotations

from typing import Any

from qrouter._fast.codec import Symbol

from qrouter.config import ListenerConfig
from tests.engine.pump import (
    AMQP_HEADER,
    BEGIN,
    OPEN,
    SASL_HEADER,
    SASL_INIT,
    SASL_OUTCOME,
    RawPeer,
    begin_frame,
    make_core,
    open_frame,
    perf,
)

LISTENER = ListenerConfig(idle_timeout=4.0, handshake_timeout=10.0)
PATIENT = ListenerConfig(idle_timeout=30.0, handshake_timeout=10.0)  # idle never fires first


def _raw(listener: ListenerConfig = LISTENER) -> RawPeer:
    return RawPeer(make_core(), listener, handshake=False)


def test_silent_connection_closed_at_the_handshake_deadline() -> None:
    """Nothing sent at all: no frame can carry an error before the header (2.2), so the
    connection just closes, and only once the deadline passed."""
    raw = _raw(PATIENT)
    t0 = raw.conn.created
    raw.conn.tick(t0 + 3.9)  # (below the idle timeout too)
    assert not raw.conn.closed
    raw.conn.feed(b"AMQP")  # half a header keeps the idle timer quiet, not the deadline
    raw.conn.tick(t0 + 9.9)
    assert not raw.conn.closed
    raw.conn.tick(t0 + 10.1)
    assert raw.conn.closed
    assert raw.conn.error[0] == "amqp:resource-limit-exceeded"
    assert raw.collect() == []


def test_header_without_open_gets_open_and_close() -> None:
    """The AMQP header came but no OPEN: 2.4.1, OPEN then CLOSE with the error."""
    raw = _raw(PATIENT)
    raw.feed(AMQP_HEADER)
    raw.conn.feed(b"\x00\x00")  # the peer stays busy, a byte at a time, never an OPEN
    raw.conn.tick(raw.conn.created + 10.5)
    assert [f.code for f in raw.collect()] == [OPEN, 0x18]
    assert raw.close_error()[0] == "amqp:resource-limit-exceeded"
    assert "10 s" in (raw.close_error()[1] or "")


def test_opened_connection_has_no_handshake_deadline() -> None:
    raw = _raw(PATIENT)
    raw.feed(AMQP_HEADER + open_frame() + begin_frame())
    raw.conn.tick(raw.conn.created + 10.5)
    assert not raw.conn.closed


def test_partial_frame_past_the_idle_timeout_is_closed() -> None:
    """Slow-loris: each byte refreshes the idle timer (2.4.5), so the frame being built is
    timed on its own, from its first byte."""
    raw = _raw()
    raw.feed(AMQP_HEADER + open_frame())
    frame = begin_frame(channel=1)
    started = raw.conn.last_read
    for i, byte in enumerate(frame[:-1]):
        raw.conn.feed(bytes([byte]))
        now = started + i * 0.5
        raw.conn.tick(min(now, started + 3.9))
        assert not raw.conn.closed
    # (real time does not pass here, so the idle timer would fire too: the description tells
    # which check closed it; tests/interop/test_deadlines.py trickles over a real socket)
    raw.conn.tick(raw.conn.partial_since + 4.1)
    assert raw.conn.closed
    raw.collect()
    assert raw.close_error()[0] == "amqp:resource-limit-exceeded"
    assert "incomplete" in (raw.close_error()[1] or "")


def test_whole_frames_reset_the_partial_frame_clock() -> None:
    raw = _raw()
    raw.feed(AMQP_HEADER + open_frame())
    one = begin_frame(channel=1)
    raw.conn.feed(one[:5])
    first = raw.conn.partial_since
    assert first > 0
    raw.feed(one[5:] + begin_frame(channel=2)[:3])  # one done, the next begun
    assert raw.conn.partial_since >= first
    raw.feed(begin_frame(channel=2)[3:])
    assert raw.conn.partial_since == 0
    assert [f.code for f in raw.frames].count(BEGIN) == 2


class _Deferring:
    """Wraps a connection's handler: on_sasl defers, the test answers later."""

    def __init__(self, conn: Any) -> None:
        self.inner = conn.handler
        self.calls = 0
        conn.handler = self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def on_sasl(self, conn: Any, *args: Any) -> Any:
        self.calls += 1
        conn.defer_sasl()
        return None


def _sasl_init() -> bytes:
    return perf(SASL_INIT, mechanism=Symbol("ANONYMOUS"))


def test_deferred_sasl_holds_pipelined_bytes_until_the_outcome() -> None:
    """5.3.2: what follows the sasl-init (here the AMQP header and OPEN, pipelined) is not
    read until the outcome is sent; then it is, in order."""
    raw = _raw()
    h = _Deferring(raw.conn)
    raw.feed(SASL_HEADER)
    assert raw.feed(_sasl_init() + AMQP_HEADER + open_frame()) == []
    assert h.calls == 1 and raw.conn.sasl_pending
    raw.conn.complete_sasl(True)
    frames = raw.collect()
    assert [f.code for f in frames] == [SASL_OUTCOME, OPEN]
    assert frames[0].fields["code"] == 0
    assert raw.headers == [SASL_HEADER, AMQP_HEADER]


def test_deferred_sasl_temporary_failure() -> None:
    """Outcome code 4 (sys-temp, 5.3.3.6) from the control plane: sent, then closed."""
    raw = _raw()
    _Deferring(raw.conn)
    raw.feed(SASL_HEADER + _sasl_init())
    raw.conn.complete_sasl(4)
    (outcome,) = raw.collect()
    assert outcome.code == SASL_OUTCOME and outcome.fields["code"] == 4
    assert raw.conn.closed


def test_deferred_sasl_bytes_are_bounded() -> None:
    """A peer that keeps sending before its outcome is closed once it holds more than
    max-frame-size bytes."""
    raw = _raw()
    _Deferring(raw.conn)
    raw.feed(SASL_HEADER + _sasl_init())
    raw.conn.feed(b"\x00" * (raw.conn.max_frame_size + 1))
    assert raw.conn.closed
    assert raw.conn.error[0] == "amqp:connection:framing-error"
    raw.conn.complete_sasl(True)  # too late: nothing happens
    assert raw.collect() == []


def test_deferred_sasl_answer_after_close_is_ignored() -> None:
    raw = _raw()
    _Deferring(raw.conn)
    raw.feed(SASL_HEADER + _sasl_init())
    raw.conn.tick(raw.conn.created + 11)  # the handshake deadline passes while it waits
    assert raw.conn.closed
    raw.conn.complete_sasl("alice")
    assert raw.collect() == []
