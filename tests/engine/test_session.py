"""Sessions: BEGIN (2.7.2), END (2.7.8) and session flow control (2.5.6), socketless."""

from __future__ import annotations

import pytest
from proton import Condition, Message

from qrouter.config import ListenerConfig
from tests.engine.pump import (
    BEGIN,
    END,
    FLOW,
    TRANSFER,
    Peer,
    RawPeer,
    UInt,
    attach_frame,
    begin_frame,
    error,
    flow_frame,
    make_core,
    message_bytes,
    perf,
    pump,
    receive,
    send,
    transfer_frame,
)


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


def test_begin_reply_fields(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.2: the answering BEGIN names the peer's channel in remote-channel and carries
    next-outgoing-id, incoming-window, outgoing-window (mandatory) and handle-max."""
    raw = RawPeer(core, handshake=False)
    raw.feed(b"AMQP\x00\x01\x00\x00")
    from tests.engine.pump import open_frame

    raw.feed(open_frame())
    raw.feed(begin_frame(channel=5, handle_max=UInt(9)))
    b = raw.of(BEGIN)[0]
    assert b.fields["remote_channel"] == 5
    assert b.fields["next_outgoing_id"] == 0
    assert b.fields["incoming_window"] > 0 and b.fields["outgoing_window"] > 0
    assert b.fields["handle_max"] == 9
    assert b.channel == 0  # the engine picks its own channel numbers


def test_several_sessions(core) -> None:  # type: ignore[no-untyped-def]
    """2.5.1: sessions are independent; each gets its own channel in both directions."""
    p = Peer(core)
    sessions = [p.session() for _ in range(4)]
    pump(p)
    assert all(s.state & s.REMOTE_ACTIVE for s in sessions)
    assert p.conn.session_count == 4
    channels = sorted(f.channel for f in p.frames_from_router() if f.code == BEGIN)
    assert channels == [0, 1, 2, 3]
    sessions[1].close()
    pump(p)
    assert p.conn.session_count == 3
    # a new session may reuse the freed channel
    p.session()
    pump(p)
    assert p.conn.session_count == 4


def test_begin_on_a_channel_in_use(core) -> None:  # type: ignore[no-untyped-def]
    """2.5.1: a channel carries one session at a time."""
    raw = RawPeer(core)
    raw.feed(begin_frame(channel=0))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_begin_answering_a_begin_we_never_sent(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.2 remote-channel is set only in answer to a BEGIN; the router begins none."""
    from qrouter._fast.codec import UShort

    raw = RawPeer(core)
    raw.feed(begin_frame(channel=1, remote_channel=UShort(4)))
    assert raw.close_error() is not None


def test_frame_on_a_channel_without_session(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(flow_frame(channel=3))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_end_is_answered_and_detaches_links(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.8 / 2.5.4: the peer's END (with an error) is answered with END; the links of the
    session are gone (their address loses its consumer)."""
    p = Peer(core)
    s = p.session()
    p.receiver("end-q", session=s, credit=5)
    pump(p)
    assert core.engine.address("end-q").consumer_count == 1
    s.condition = Condition("amqp:internal-error", "session broke")
    s.close()
    pump(p)
    assert "PN_SESSION_REMOTE_CLOSE" in p.events()
    assert p.conn.session_count == 0
    assert core.engine.address("end-q") is None
    assert [f.name for f in p.frames_from_router()][-1] == "end"
    assert not p.conn.closed


def test_end_then_begin_again(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(perf(END, error=error("amqp:internal-error", "x")))
    assert raw.of(END)
    raw.feed(begin_frame(channel=0))
    assert len(raw.of(BEGIN)) == 2
    assert raw.close_error() is None


# --- 2.5.6 session flow control -----------------------------------------------------------------


def _consumer(
    raw: RawPeer, address: str, credit: int, handle: int = 0, window: int = 0x7FFFFFFF
) -> None:
    raw.feed(attach_frame("c", handle, sender=False, address=address))
    raw.feed(
        flow_frame(handle=handle, delivery_count=0, link_credit=credit, incoming_window=window)
    )


def test_engine_respects_a_small_remote_incoming_window(core) -> None:  # type: ignore[no-untyped-def]
    """2.5.6: the sender may send only while the receiver's incoming-window is open
    (remote-incoming-window = next-incoming-id + incoming-window - next-outgoing-id)."""
    consumer = RawPeer(core, handshake=False)
    from tests.engine.pump import AMQP_HEADER, open_frame

    consumer.feed(AMQP_HEADER + open_frame("consumer"))
    consumer.feed(begin_frame(incoming_window=2))
    _consumer(consumer, "win", 10, window=2)
    producer = Peer(core)
    snd = producer.sender("win")
    pump(producer)
    for i in range(5):
        send(snd, f"m{i}")
    pump(producer)
    consumer.collect()
    assert len(consumer.of(TRANSFER)) == 2
    # the consumer reports it has taken transfer-ids 0 and 1 and opens 2 more
    consumer.feed(
        flow_frame(
            next_incoming_id=2, incoming_window=2, handle=0, delivery_count=0, link_credit=10
        )
    )
    assert len(consumer.of(TRANSFER)) == 4
    # a FLOW that leaves the window shut lets nothing through
    consumer.feed(flow_frame(next_incoming_id=4, incoming_window=0))
    assert len(consumer.of(TRANSFER)) == 4
    consumer.feed(flow_frame(next_incoming_id=4, incoming_window=100))
    transfers = consumer.of(TRANSFER)
    assert len(transfers) == 5
    assert [t.fields["delivery_id"] for t in transfers] == [0, 1, 2, 3, 4]


def test_multi_frame_delivery_pauses_mid_message_on_window(core) -> None:  # type: ignore[no-untyped-def]
    """2.5.6 / 2.6.14: a window that closes in the middle of a multi-frame delivery stops
    the frames there; they resume when it reopens."""
    consumer = RawPeer(
        core, ListenerConfig(max_frame_size=512), handshake=False, max_frame_size=512
    )
    from tests.engine.pump import AMQP_HEADER, open_frame

    consumer.feed(AMQP_HEADER + open_frame("consumer", max_frame_size=UInt(512)))
    consumer.feed(begin_frame(incoming_window=3))
    _consumer(consumer, "win2", 10, window=3)
    producer = Peer(core)
    snd = producer.sender("win2")
    pump(producer)
    body = b"z" * 3000
    send(snd, body)
    pump(producer)
    consumer.collect()
    first = consumer.of(TRANSFER)
    assert len(first) == 3 and all(t.fields["more"] for t in first)
    consumer.feed(flow_frame(next_incoming_id=3, incoming_window=1000))
    transfers = consumer.of(TRANSFER)
    assert not transfers[-1].fields["more"]
    assert all(t.fields["more"] for t in transfers[:-1])
    payload = b"".join(t.payload for t in transfers)
    assert payload == message_bytes(body)


def test_proton_small_incoming_capacity_receives_everything() -> None:
    """2.5.6: proton with incoming_capacity = 2 frames (512-byte frames) keeps its window
    nearly shut; the engine waits for each FLOW and everything arrives, in order."""
    core = make_core()
    listener = ListenerConfig(max_frame_size=512)
    consumer = Peer(core, listener=listener, max_frame_size=512)
    s = consumer.session(incoming_capacity=1024)
    rcv = consumer.receiver("small-window", session=s, credit=50)
    producer = Peer(core, listener=listener, max_frame_size=512)
    snd = producer.sender("small-window")
    pump(consumer, producer)
    bodies = [bytes([i]) * (300 + 97 * i) for i in range(30)]
    sent = []
    got: list[bytes] = []
    partial: dict[bytes, bytes] = {}
    for _ in range(1000):
        while snd.credit and len(sent) < len(bodies):
            sent.append(send(snd, bodies[len(sent)]))
        pump(consumer, producer)
        # read what has arrived, partial deliveries too: proton counts unread bytes
        # against incoming_capacity, so a reader that waited for whole messages larger
        # than the capacity would shut its own window for good
        while (d := rcv.current) is not None and d.pending:
            partial[d.tag] = partial.get(d.tag, b"") + rcv.recv(d.pending)
            if d.partial:
                break
            m = Message()
            m.decode(partial.pop(d.tag))
            got.append(bytes(m.body))
            rcv.advance()
            d.update(d.ACCEPTED)
            d.settle()
        if len(got) == len(bodies):
            break
    pump(consumer, producer)
    assert got == bodies
    assert all(d.remote_state == d.ACCEPTED for d in sent)
    assert consumer.transport.condition is None
    # proton's window really was small: its FLOWs announced at most 2 frames
    windows = [
        f.fields["incoming_window"] for f in _frames(bytes(consumer.to_router)) if f.code == FLOW
    ]
    assert windows and max(windows) <= 2


def _frames(data: bytes):  # type: ignore[no-untyped-def]
    from tests.engine.pump import parse_output

    return parse_output(data)[1]


def test_next_incoming_id_follows_the_peers_transfer_ids(core) -> None:  # type: ignore[no-untyped-def]
    """2.5.6: next-incoming-id starts at the peer's next-outgoing-id (from BEGIN) and counts
    every TRANSFER frame, wrapping as a 32-bit serial number (RFC 1982)."""
    consumer = Peer(core)
    consumer.receiver("ids", credit=20)
    pump(consumer)
    raw = RawPeer(core, handshake=False, max_frame_size=None)
    from tests.engine.pump import AMQP_HEADER, open_frame

    raw.feed(AMQP_HEADER + open_frame("producer"))
    start = 2**32 - 2
    raw.feed(begin_frame(next_outgoing_id=start))
    raw.feed(attach_frame("p", 0, sender=True, address="ids"))
    assert raw.of(FLOW)[-1].fields["link_credit"] > 0
    for i in range(4):
        raw.feed(transfer_frame(0, i, b"t%d" % i, message_bytes(i), settled=True))
    raw.feed(flow_frame(next_incoming_id=0, next_outgoing_id=(start + 4) % 2**32, echo=True))
    echoed = raw.of(FLOW)[-1]
    assert echoed.fields["next_incoming_id"] == (start + 4) % 2**32 == 2
    pump(consumer)


def test_next_outgoing_id_counts_the_engines_frames(core) -> None:  # type: ignore[no-untyped-def]
    """2.5.6: the engine's next-outgoing-id advances once per TRANSFER frame it sends (a
    multi-frame delivery counts each frame)."""
    consumer = RawPeer(core, ListenerConfig(max_frame_size=512), handshake=False)
    from tests.engine.pump import AMQP_HEADER, open_frame

    consumer.feed(AMQP_HEADER + open_frame("c", max_frame_size=UInt(512)))
    consumer.feed(begin_frame())
    _consumer(consumer, "oid", 10)
    producer = Peer(core)
    snd = producer.sender("oid")
    pump(producer)
    send(snd, b"a" * 1500)
    send(snd, b"b")
    pump(producer)
    consumer.collect()
    n = len(consumer.of(TRANSFER))
    assert n >= 4
    consumer.feed(flow_frame(next_incoming_id=n, echo=True))
    assert consumer.of(FLOW)[-1].fields["next_outgoing_id"] == n


def test_peer_exceeding_our_window_is_tolerated(core) -> None:  # type: ignore[no-untyped-def]
    """2.5.6: the router's window is wide (2^31-1) and re-opened as transfers arrive, so a
    long stream never stalls on the session window."""
    consumer = Peer(core)
    rcv = consumer.receiver("wide", credit=300)
    producer = Peer(core)
    snd = producer.sender("wide")
    pump(consumer, producer)
    for i in range(250):
        send(snd, i, settled=True)
    pump(consumer, producer)
    assert len(receive(rcv)) == 250
