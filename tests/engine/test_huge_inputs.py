"""Huge inputs (issue 13, point 7): declared sizes of 4 GiB, arrays with huge counts, handles
at the top of their range, a conversation split at every byte. The engine answers each with
a precise error (or, for the splits, exactly what it answers to the whole), allocates in
proportion to the bytes it was given, and the router goes on."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qrouter._fast.codec import DecodeError, decode

from qrouter.config import ListenerConfig
from qrouter.limits import LimitsConfig
from tests.engine.pump import (
    ATTACH,
    BEGIN,
    DETACH,
    FLOW,
    TRANSFER,
    Peer,
    RawPeer,
    UInt,
    assert_engine_usable,
    attach_frame,
    flow_frame,
    frame,
    make_core,
    message_bytes,
    perf,
    pump,
    receive,
    transfer_frame,
)
from tests.engine.test_fuzz import LISTENER, captured_session

FOUR_GIB = b"\xff\xff\xff\xff"

# every variable-width 32-bit encoding (1.6.19-1.6.24) claiming 2^32 - 1 bytes (and, where
# there is one, 2^32 - 1 items), followed by a few real bytes
HUGE_HEADERS = {
    "vbin32": b"\xb0" + FOUR_GIB,
    "str32": b"\xb1" + FOUR_GIB,
    "sym32": b"\xb3" + FOUR_GIB,
    "list32": b"\xd0" + FOUR_GIB + FOUR_GIB,
    "map32": b"\xd1" + FOUR_GIB + FOUR_GIB,
    "array32": b"\xf0" + FOUR_GIB + FOUR_GIB + b"\x40",
}
TAIL = b"\x40" * 64


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


@pytest.mark.parametrize("name", sorted(HUGE_HEADERS))
def test_four_gib_declared_size_is_a_decode_error(name: str) -> None:
    """A size beyond the bytes present is refused before anything is allocated for it."""
    with pytest.raises(DecodeError, match="truncated"):
        decode(HUGE_HEADERS[name] + TAIL)


@pytest.mark.parametrize(
    "data,reason",
    [
        # list32/map32 whose size fits but whose count claims 2^32 - 1 items
        (b"\xd0\x00\x00\x00\x05" + FOUR_GIB + b"\x40", "exceeds its size"),
        (b"\xd1\x00\x00\x00\x06" + FOUR_GIB + b"\x40\x40", "exceeds its size"),
        # array32 of uint (4 bytes each) claiming 2^32 - 1 items in 9 bytes
        (b"\xf0\x00\x00\x00\x09" + FOUR_GIB + b"\x70\x00\x00\x00\x01", "exceeds its size"),
        # array32 of a zero-width type: null, true, uint0, list0
        (b"\xf0\x00\x00\x00\x05" + FOUR_GIB + b"\x40", "zero-width"),
        (b"\xf0\x00\x00\x00\x05" + FOUR_GIB + b"\x41", "zero-width"),
        (b"\xf0\x00\x00\x00\x05" + FOUR_GIB + b"\x43", "zero-width"),
        (b"\xf0\x00\x00\x00\x05" + FOUR_GIB + b"\x45", "zero-width"),
        # described zero-width items
        (b"\xf0\x00\x00\x00\x08" + FOUR_GIB + b"\x00\x53\x01\x40", "zero-width"),
    ],
)
def test_huge_counts_are_decode_errors(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode(data)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([0x40, 0x41, 0x42, 0x43, 0x44, 0x45]),
    st.integers(0, 2**32 - 1),
    st.integers(0, 64),
)
def test_zero_width_arrays_cost_at_most_one_item_per_byte(code: int, count: int, pad: int) -> None:
    """An array of a zero-width type decodes only when its count is within its size; then it
    holds exactly that many items (so allocation is bounded by the input)."""
    size = 5 + pad
    data = b"\xf0" + size.to_bytes(4, "big") + count.to_bytes(4, "big") + bytes([code])
    data += b"\x40" * pad  # bytes the items do not use: a size mismatch unless pad == 0
    try:
        arr = decode(data)[0]
    except DecodeError:
        assert count > size or pad > 0
        return
    assert count <= size and len(arr.items) == count


@pytest.mark.parametrize("name", sorted(HUGE_HEADERS))
def test_four_gib_in_a_performative_closes_with_decode_error(core, name: str) -> None:  # type: ignore[no-untyped-def]
    """2.8.15: a BEGIN whose properties claim 4 GiB is a decode error; feed() returns at
    once and the router goes on."""
    raw = RawPeer(core, handshake=False)
    raw.feed(b"AMQP\x00\x01\x00\x00")
    raw.feed(perf(0x10, container_id="huge"))
    # BEGIN [remote-channel null, next-outgoing-id 0, windows, handle-max null, 2 nulls, props]
    fields = b"\x40\x43\x70\x00\x00\x10\x00\x70\x00\x00\x10\x00\x40\x40\x40"
    fields += HUGE_HEADERS[name] + TAIL
    raw.feed(
        frame(
            b"\x00\x53\x11\xd0"
            + (len(fields) + 4).to_bytes(4, "big")
            + b"\x00\x00\x00\x08"
            + fields
        )
    )
    assert raw.close_error()[0] == "amqp:decode-error", raw.frames
    assert not raw.of(BEGIN)
    assert_engine_usable(core)


@pytest.mark.parametrize("name", sorted(HUGE_HEADERS))
def test_four_gib_section_on_the_anonymous_relay_is_rejected(core, name: str) -> None:  # type: ignore[no-untyped-def]
    """A message whose first section claims 4 GiB: the relay cannot find its `to`, so that
    delivery is REJECTED with amqp:decode-error and the link goes on."""
    raw = RawPeer(core)
    raw.feed(attach_frame("anon", 0, sender=True, address=None))
    body = b"\x00\x53\x70" + HUGE_HEADERS[name] + TAIL
    raw.feed(transfer_frame(0, 0, b"t0", body))
    raw.feed(transfer_frame(0, 1, b"t1", message_bytes("x", address="nowhere")))
    states = [f.fields["state"] for f in raw.frames if f.code == 0x15]
    assert len(states) == 2, raw.frames
    first = states[0]["error"] if isinstance(states[0], dict) else None
    assert first is not None or states[0] is not None
    assert raw.close_error() is None
    assert "decode-error" in repr(states[0])
    assert "not-found" in repr(states[1])


# --- handles at the top of their range (2.6.2: a handle is a uint) ------------------------------


def test_attach_with_the_largest_handle(core) -> None:  # type: ignore[no-untyped-def]
    """A link whose handle is 2^32 - 1 is attached (or refused with an amqp: condition, if a
    handle-max below it is enforced); either way messages and the router go on, and nothing
    is sized by the handle's value."""
    consumer = Peer(core)
    rcv = consumer.receiver("top-handle", credit=5)
    pump(consumer)
    raw = RawPeer(core)
    top = 2**32 - 1
    raw.feed(attach_frame("top", top, sender=True, address="top-handle"))
    attached = [f for f in raw.frames if f.code == ATTACH]
    if raw.close_error() is not None:
        assert raw.close_error()[0].startswith("amqp:") and "internal" not in raw.close_error()[0]
    elif attached and attached[0].fields.get("target") is not None:
        assert attached[0].fields["name"] == "top"  # (its handle is the router's own: 2.6.2)
        raw.feed(transfer_frame(top, 0, b"t", message_bytes("top"), settled=True))
        pump(consumer)
        assert [m.body for _, m in receive(rcv)] == ["top"]
        raw.feed(perf(DETACH, handle=UInt(top), closed=True))
        assert any(f.code == DETACH for f in raw.frames)
    assert_engine_usable(core)


@pytest.mark.parametrize("code", [FLOW, TRANSFER, DETACH])
@pytest.mark.parametrize("handle", [1, 2**31, 2**32 - 2, 2**32 - 1])
def test_unknown_huge_handles(core, code: int, handle: int) -> None:  # type: ignore[no-untyped-def]
    """FLOW / TRANSFER / DETACH naming a handle nobody attached: a precise session error
    (2.8.x amqp:session:unattached-handle) or, for DETACH, nothing worse; never internal."""
    raw = RawPeer(core)
    if code == FLOW:
        raw.feed(flow_frame(handle=handle, delivery_count=0, link_credit=10))
    elif code == TRANSFER:
        raw.feed(transfer_frame(handle, 0, b"t", message_bytes("x")))
    else:
        raw.feed(perf(DETACH, handle=UInt(handle), closed=True))
    err = raw.close_error()
    if code != DETACH:
        assert err is not None and err[0] == "amqp:session:unattached-handle", raw.frames
    assert raw.conn.error is None or "internal" not in raw.conn.error[0]
    assert_engine_usable(core)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sets(st.integers(0, 2**32 - 1), min_size=1, max_size=50))
def test_links_on_handles_anywhere_in_the_range(handles: set[int]) -> None:
    """Links on handles spread over the whole 32-bit range attach, carry a message, detach:
    the handle tables are keyed, not indexed (a million-wide handle costs nothing). The
    links-per-connection limit is off here: with it, handle-max is 999 (test_limits.py)."""
    core = make_core(id="handles", limits=LimitsConfig(max_links_per_connection=0))
    consumer = Peer(core)
    rcv = consumer.receiver("spread", credit=len(handles) + 1)
    pump(consumer)
    raw = RawPeer(core)
    refused = False
    for i, h in enumerate(sorted(handles)):
        raw.feed(attach_frame(f"l{h}", h, sender=True, address="spread"))
        if raw.close_error() is not None:  # a handle-max below h, enforced
            assert raw.close_error()[0].startswith("amqp:"), raw.close_error()
            refused = True
            break
        raw.feed(transfer_frame(h, i, b"t", message_bytes(h), settled=True))
    pump(consumer)
    got = [m.body for _, m in receive(rcv)]
    if not refused:
        assert sorted(got) == sorted(handles)
    assert_engine_usable(core)


# --- a conversation split at every byte (2.3.1: TCP delivers bytes in any pieces) --------------


def _replay(core: Any, chunks: list[bytes]) -> tuple[bytes, Any]:
    conn = core.new_connection(LISTENER)
    out = bytearray()
    for chunk in chunks:
        conn.feed(chunk)
        out += conn.take_output()
    return bytes(out), conn.error


def test_every_split_point_gives_the_same_answer() -> None:
    """A captured proton session (header, OPEN ... CLOSE; a 3,000-byte message in 1,024-byte
    frames) fed in two pieces, cut at every byte: the router writes exactly what it writes
    for the whole, and one byte at a time likewise."""
    core = make_core(id="split")
    data = b"".join(captured_session())
    whole, error = _replay(core, [data])
    assert error is None and whole
    for k in range(len(data) + 1):
        assert _replay(core, [data[:k], data[k:]]) == (whole, None), f"split at {k}"
    assert _replay(core, [data[i : i + 1] for i in range(len(data))]) == (whole, None)
    assert core.engine.address_names() == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4000), max_size=40))
def test_any_chunking_gives_the_same_answer(cuts: list[int]) -> None:
    core = make_core(id="chunks")
    data = b"".join(captured_session())
    whole, _ = _replay(core, [data])
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(points, points[1:], strict=False)]
    assert _replay(core, chunks) == (whole, None)


def _replay_yielding(core: Any, chunks: list[bytes], budget: int) -> tuple[bytes, Any]:
    """As _replay, with the server's control-frame budget (qrouter/server.py): after a feed
    that yielded, more bytes may arrive before the empty feed that goes on."""
    conn = core.new_connection(LISTENER)
    conn.control_budget = budget
    out = bytearray()
    for chunk in chunks:
        conn.feed(chunk)
        out += conn.take_output()
    for _ in range(10_000):
        if not conn.yielded:
            break
        conn.feed(b"")
        out += conn.take_output()
    return bytes(out), conn.error


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4000), max_size=40), st.integers(1, 3))
def test_any_chunking_with_a_control_budget_gives_the_same_answer(
    cuts: list[int], budget: int
) -> None:
    """A connection that yielded holds whole frames and more beyond the first frame's size;
    the next bytes, of any size, join them in order."""
    core = make_core(id="budget")
    data = b"".join(captured_session())
    whole, _ = _replay(core, [data])
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(points, points[1:], strict=False)]
    assert _replay_yielding(core, chunks, budget) == (whole, None)


def test_a_large_frame_a_byte_at_a_time() -> None:
    """A 1 MiB frame (max-frame-size 1 MiB) fed one byte per feed(): it arrives whole, once
    (the partial frame is appended to, not copied at every byte)."""
    core = make_core(id="bytewise")
    big = ListenerConfig(max_frame_size=1 << 20, idle_timeout=0)
    consumer = Peer(core, listener=big, max_frame_size=1 << 20)
    rcv = consumer.receiver("bytewise", credit=1, max_message_size=1 << 21)
    pump(consumer)
    raw = RawPeer(core, big, max_frame_size=1 << 20)
    raw.feed(attach_frame("big", 0, sender=True, address="bytewise"))
    body = bytes(i % 251 for i in range(1 << 20) if True)[: (1 << 20) - 200]
    data = transfer_frame(0, 0, b"t", message_bytes(body), settled=True)
    assert len(data) <= 1 << 20
    for i in range(len(data)):
        raw.conn.feed(data[i : i + 1])
    assert raw.conn.error is None
    pump(consumer)
    ((_, m),) = receive(rcv)
    assert m.body == body
