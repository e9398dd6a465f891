"""Bad input (issue 2, item 7): malformed, truncated, oversized and unknown frames close the
offending connection with the spec's condition (2.8.15 amqp:decode-error, 2.8.16
amqp:connection:framing-error, ...); feed() never raises; the rest of the router goes on."""

from __future__ import annotations

import pytest
from qrouter._fast.codec import Described, Symbol, UInt, ULong, encode

from tests.engine.pump import (
    AMQP_HEADER,
    CLOSE,
    RawPeer,
    assert_engine_usable,
    begin_frame,
    described,
    frame,
    make_core,
    message_bytes,
    open_frame,
    transfer_frame,
)


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


def _bad(core, data: bytes) -> RawPeer:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(data)  # must not raise
    assert raw.conn.closed
    assert_engine_usable(core)
    return raw


@pytest.mark.parametrize("code", [0x19, 0x1F, 0x20, 0x30, 0x0F, 0xFFFF])
def test_unknown_performative_is_a_framing_error(core, code: int) -> None:  # type: ignore[no-untyped-def]
    """2.7: an AMQP frame's body is one of the nine performatives; anything else is a
    framing error."""
    raw = _bad(core, frame(Described(ULong(code), [])))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_unknown_symbolic_descriptor(core) -> None:  # type: ignore[no-untyped-def]
    raw = _bad(core, frame(Described(Symbol("amqp:nonsense:list"), [])))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_symbolic_descriptor_is_understood(core) -> None:  # type: ignore[no-untyped-def]
    """1.5: a descriptor may be the symbolic name instead of the code."""
    raw = RawPeer(core)
    raw.feed(
        frame(
            Described(Symbol("amqp:begin:list"), [None, UInt(0), UInt(100), UInt(100)]), channel=1
        )
    )
    assert len([f for f in raw.frames if f.name == "begin"]) == 2
    assert raw.close_error() is None


@pytest.mark.parametrize(
    "body,condition",
    [
        (b"\x40", "amqp:decode-error"),  # not a described type
        (b"\x00\x53\x11", "amqp:decode-error"),  # descriptor without a value
        (b"\x00\x53\x11\xc0\x05\x03", "amqp:decode-error"),  # list shorter than its size
        (b"\x00\x53\x11\xc0\x01\x03", "amqp:decode-error"),  # count beyond the size
        (b"\x00\x53\x11\xa1\x01x", "amqp:decode-error"),  # performative body not a list
        (b"\x00\x53\x11\xc0\x02\x01\xff", "amqp:decode-error"),  # invalid format code
        (b"\x00\x53\x11\x45", "amqp:decode-error"),  # BEGIN without mandatory fields
        (b"\x00\xa3\x03abc\x45", "amqp:connection:framing-error"),  # unknown symbol
        (b"\x00\x53\x14\xc0\x03\x01\xa1\x00", "amqp:decode-error"),  # TRANSFER handle a string
        (b"\x00\x53\x13\xc0\x02\x01\x43", "amqp:decode-error"),  # FLOW too short
        (b"\x00\x53\x15\xc0\x03\x02\x41\x40", "amqp:decode-error"),  # DISPOSITION first null
    ],
)
def test_malformed_body(core, body: bytes, condition: str) -> None:  # type: ignore[no-untyped-def]
    """2.8.15 decode-error: a body that does not decode as its performative."""
    raw = _bad(core, frame(body, channel=1 if body[2:3] == b"\x11" else 0))
    assert raw.close_error()[0] == condition


@pytest.mark.parametrize(
    "header",
    [
        b"\x00\x00\x00\x04\x02\x00\x00\x00",  # size below 8
        b"\x00\x00\x00\x10\x01\x00\x00\x00",  # doff 1
        b"\x00\x00\x00\x10\x05\x00\x00\x00",  # doff beyond the frame
        b"\x00\x00\x00\x10\x02\x07\x00\x00",  # frame type 7
        b"\xff\xff\xff\xff\x02\x00\x00\x00",  # size far above max-frame-size
    ],
)
def test_bad_frame_header(core, header: bytes) -> None:  # type: ignore[no-untyped-def]
    """2.3.1: size >= 8, doff >= 2 and within the frame, type 0 or 1, size <= max."""
    end = b"\x00\x53\x17\xc0\x03\x02\x40\x40"  # a valid 8-byte END body
    raw = _bad(core, header + end)
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_truncated_frame_waits_for_the_rest(core) -> None:  # type: ignore[no-untyped-def]
    """2.3.1: a frame split across reads is reassembled, not refused."""
    raw = RawPeer(core)
    data = begin_frame(channel=1)
    for i in range(len(data)):
        raw.feed(data[i : i + 1])
    assert len([f for f in raw.frames if f.name == "begin"]) == 2
    assert raw.close_error() is None


def test_connection_lost_mid_frame(core) -> None:  # type: ignore[no-untyped-def]
    """A peer that disappears mid-frame: connection_lost tears down cleanly."""
    raw = RawPeer(core)
    raw.feed(begin_frame(channel=1)[:5])
    raw.conn.connection_lost()
    assert raw.conn.closed
    raw.feed(b"more")  # ignored
    assert_engine_usable(core)


def test_transfer_whose_list_lies_about_its_size(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.5 on the C fast path: a list size that runs into the payload is a decode error."""
    good = transfer_frame(0, 0, b"t", message_bytes("x"))
    body = bytearray(good[8:])
    body[4] = 0x80  # list8 size byte of the TRANSFER
    raw = _bad(core, frame(bytes(body)))
    assert raw.close_error()[0] in ("amqp:decode-error", "amqp:connection:framing-error")


def test_performative_before_open(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + transfer_frame(0, 0, b"t", b""))
    assert raw.conn.closed
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_bad_input_after_close_sent_is_ignored(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.3: once the router has sent CLOSE it only waits for the peer's CLOSE."""
    raw = RawPeer(core)
    raw.conn.close()
    raw.collect()
    raw.feed(frame(Described(ULong(0x99), [])))
    assert not raw.conn.closed
    raw.feed(frame(described(CLOSE)))
    assert raw.conn.closed


def test_error_in_one_connection_leaves_others(core) -> None:  # type: ignore[no-untyped-def]
    good = RawPeer(core)
    _bad(core, frame(b"\x40"))
    good.feed(begin_frame(channel=3))
    assert good.close_error() is None


WRONG_TYPES = {
    # 2.7.1 max-frame-size is a uint
    "open-max-frame-size-string": (False, Described(ULong(0x10), ["c", None, "big"])),
    # 2.7.1 channel-max is a ushort
    "open-channel-max-too-wide": (
        False,
        Described(ULong(0x10), ["c", None, UInt(1000), UInt(70000)]),
    ),
    # 2.7.2 next-outgoing-id is a transfer-number (uint)
    "begin-next-outgoing-id-string": (True, Described(ULong(0x11), [None, "x", UInt(1), UInt(1)])),
    # 2.7.3 handle is a uint
    "attach-handle-string": (True, Described(ULong(0x12), ["n", "h", True])),
}


@pytest.mark.parametrize("opened,body", list(WRONG_TYPES.values()), ids=list(WRONG_TYPES))
def test_wrong_field_types_are_decode_errors(core, opened: bool, body: Described) -> None:  # type: ignore[no-untyped-def]
    """2.8.15 decode-error: a field whose value has the wrong type cannot be decoded as the
    performative; the peer sent bad data, the router did not fail internally."""
    raw = RawPeer(core, handshake=opened)
    if not opened:
        raw.feed(AMQP_HEADER)
    raw.feed(frame(body, channel=2 if body.descriptor == 0x11 else 0))
    assert raw.conn.closed
    assert raw.close_error()[0] in ("amqp:decode-error", "amqp:invalid-field")


def test_wrong_field_types_never_escape_feed(core) -> None:  # type: ignore[no-untyped-def]
    """Whatever the condition, bad types never raise out of feed() nor hurt the router."""
    for opened, body in WRONG_TYPES.values():
        raw = RawPeer(core, handshake=opened)
        if not opened:
            raw.feed(AMQP_HEADER)
        raw.feed(frame(body, channel=2 if body.descriptor == 0x11 else 0))
        assert raw.conn.closed and raw.close_error() is not None
    raw = RawPeer(core)
    raw.feed(frame(Described(ULong(0x12), [b"n", UInt(0), True])))  # name as binary
    assert raw.close_error()[0] == "amqp:invalid-field"
    assert_engine_usable(core)


def test_open_frame_helper_is_valid() -> None:
    assert encode(None) == b"\x40"
    assert open_frame()[8:10] == b"\x00\x53"
