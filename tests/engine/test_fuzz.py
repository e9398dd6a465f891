"""Hypothesis throws random and mutated frames at the engine (issue 2, item 7).

Invariants, for every input: ``feed()`` never raises and returns promptly, the output is
bytes, tearing the connection down never raises, it leaves no address behind, and a fresh
proton connection on the same Core still opens, attaches and moves a message.

The mutated inputs start from a real proton session (captured once, in memory): header,
OPEN, BEGIN, a producer and a consumer link, FLOW, TRANSFERs, DISPOSITIONs, DETACH, END,
CLOSE; then bits flip, frames are cut short, size fields lie, frames are dropped, repeated
or swapped (2.3.1 framing, 2.7 performatives, 2.8.15 / 2.8.16 error conditions).
"""

from __future__ import annotations

import functools
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Delivery, Link

from qrouter.config import ListenerConfig
from qrouter.core import Core
from tests.engine.pump import (
    AMQP_HEADER,
    SASL_HEADER,
    Peer,
    assert_engine_usable,
    make_core,
    pump,
    receive,
    send,
)

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LISTENER = ListenerConfig(max_frame_size=4096, idle_timeout=0)


@functools.cache
def _core() -> Core:
    return make_core(id="fuzz")


@functools.cache
def captured_session() -> tuple[bytes, ...]:
    """What a proton client wrote during a busy session: [header, frame, frame, ...]."""
    core = make_core(id="capture")
    p = Peer(core, container="fuzz-client", max_frame_size=1024, listener=LISTENER)
    s = p.session()
    rcv = p.receiver("fuzz-q", "fuzz-rcv", credit=10, session=s, rcv_settle_mode=Link.RCV_FIRST)
    snd = p.sender("fuzz-q", "fuzz-snd", session=s)
    pump(p)
    send(snd, "small")
    send(snd, "x" * 3000)  # multi-frame at 1024
    send(snd, "presettled", settled=True)
    pump(p)
    for i, (d, _) in enumerate(receive(rcv)):
        d.update([Delivery.ACCEPTED, Delivery.REJECTED, Delivery.MODIFIED][i % 3])
        d.settle()
    rcv.drain(3)
    pump(p)
    snd.close()
    rcv.detach()
    s.close()
    p.connection.close()
    pump(p)
    data = bytes(p.to_router)
    assert data.startswith(AMQP_HEADER)
    frames = [data[:8]]
    pos = 8
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        frames.append(data[pos : pos + size])
        pos += size
    assert len(frames) > 15
    return tuple(frames)


def attack(chunks: list[bytes]) -> None:
    """Feed the chunks to a fresh connection and check the invariants."""
    core = _core()
    conn = core.new_connection(LISTENER)
    for chunk in chunks:
        started = time.monotonic()
        conn.feed(chunk)  # must not raise
        assert time.monotonic() - started < 5, "feed() took too long"
        out = conn.take_output()
        assert isinstance(out, bytes)
    # bad input is the peer's fault: a spec condition (decode-error, framing-error ...),
    # never amqp:internal-error, which would mean the engine itself tripped
    assert conn.error is None or conn.error[0] != "amqp:internal-error", conn.error
    conn.tick(time.monotonic() + 1)
    assert isinstance(conn.take_output(), bytes)
    conn.connection_lost()
    assert conn.closed
    assert core.engine.address_names() == [], core.engine.address_names()
    assert_engine_usable(core)
    assert core.engine.address_names() == []


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """Split data at the given offsets (TCP delivers bytes in arbitrary pieces)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


def test_captured_session_is_valid() -> None:
    """The unmutated capture runs clean (so mutations are what the fuzzer tests)."""
    frames = captured_session()
    core = _core()
    conn = core.new_connection(LISTENER)
    conn.feed(b"".join(frames))
    assert conn.error is None
    assert conn.closed  # the capture ends with CLOSE
    assert_engine_usable(core)


@FUZZ
@given(
    st.sampled_from([AMQP_HEADER, SASL_HEADER]),
    st.binary(max_size=512),
    st.lists(st.integers(0, 600), max_size=4),
)
def test_random_bytes_after_a_valid_header(header: bytes, junk: bytes, cuts: list[int]) -> None:
    attack(_chunked(header + junk, cuts))


@FUZZ
@given(st.binary(min_size=1, max_size=256))
def test_random_bytes_from_the_start(junk: bytes) -> None:
    attack([junk])


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 0xFF), st.integers(0, 0xFFFF))
def test_random_frames_after_open(body: bytes, ftype: int, channel: int) -> None:
    """Well-framed (size, doff 2) frames with random type, channel and body, after a valid
    header, OPEN and BEGIN."""
    frames = captured_session()
    prefix = b"".join(frames[:3])  # header, OPEN, BEGIN
    size = 8 + len(body)
    f = size.to_bytes(4, "big") + bytes([2, ftype]) + channel.to_bytes(2, "big") + body
    attack([prefix, f, f])


def _mutate(data: st.DataObject) -> list[bytes]:
    frames = list(captured_session())
    n = len(frames)
    kind = data.draw(
        st.sampled_from(
            ["flip", "truncate", "size", "drop", "repeat", "swap", "splice", "doff", "byte"]
        )
    )
    i = data.draw(st.integers(1, n - 1), label="frame")
    f = bytearray(frames[i])
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            bit = data.draw(st.integers(0, len(f) * 8 - 1))
            f[bit // 8] ^= 1 << (bit % 8)
        frames[i] = bytes(f)
    elif kind == "truncate":
        frames[i] = bytes(f[: data.draw(st.integers(0, len(f) - 1))])
    elif kind == "size":
        size = data.draw(
            st.one_of(
                st.integers(0, 64),
                st.integers(0, 0xFFFFFFFF),
                st.integers(len(f) - 4, len(f) + 4).filter(lambda x: x >= 0),
            )
        )
        f[0:4] = size.to_bytes(4, "big")
        frames[i] = bytes(f)
    elif kind == "drop":
        del frames[i]
    elif kind == "repeat":
        frames.insert(i, frames[i])
    elif kind == "swap":
        j = data.draw(st.integers(1, n - 1))
        frames[i], frames[j] = frames[j], frames[i]
    elif kind == "splice":
        at = data.draw(st.integers(8, max(8, len(f))))
        frames[i] = bytes(f[:at]) + data.draw(st.binary(max_size=32)) + bytes(f[at:])
    elif kind == "doff":
        f[4] = data.draw(st.integers(0, 255))
        frames[i] = bytes(f)
    else:  # overwrite one byte of the performative or payload
        if len(f) > 8:
            at = data.draw(st.integers(8, len(f) - 1))
            f[at] = data.draw(st.integers(0, 255))
        frames[i] = bytes(f)
    stream = b"".join(frames)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    return _chunked(stream, cuts)


@FUZZ
@given(st.data())
def test_mutated_proton_session(data: st.DataObject) -> None:
    attack(_mutate(data))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_two_mutations(data: st.DataObject) -> None:
    """Mutations compound (a flipped bit inside a frame whose size also lies)."""
    first = b"".join(_mutate(data))
    frames = list(captured_session())
    second = b"".join(_mutate(data))
    cut = data.draw(st.integers(0, len(first)))
    attack([first[:cut], second[len(frames[0]) :]])
