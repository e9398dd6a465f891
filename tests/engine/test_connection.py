"""Connection level, socketless against proton: protocol headers (2.2), SASL (5.3), OPEN
negotiation (2.7.1), heartbeats and idle timeout (2.4.5), CLOSE (2.7.9, 2.4.3)."""

from __future__ import annotations

import pytest

from qrouter.config import ListenerConfig
from tests.engine.pump import (
    AMQP_HEADER,
    BEGIN,
    CLOSE,
    OPEN,
    SASL_FRAME,
    SASL_HEADER,
    SASL_INIT,
    SASL_MECHANISMS,
    SASL_OUTCOME,
    SASL_RESPONSE,
    Peer,
    RawPeer,
    UInt,
    begin_frame,
    make_core,
    message_bytes,
    open_frame,
    parse_output,
    perf,
    pump,
    receive,
    send,
    users_file,
)

HEARTBEAT = b"\x00\x00\x00\x08\x02\x00\x00\x00"


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


@pytest.fixture
def auth_core(tmp_path):  # type: ignore[no-untyped-def]
    return make_core(users_file=users_file({"alice": "secret"}, str(tmp_path)))


# --- 2.2 protocol header ---------------------------------------------------------------------


def test_amqp_header_is_answered_with_amqp_header(core) -> None:  # type: ignore[no-untyped-def]
    """2.2: a peer that starts with the AMQP header (no SASL) gets the AMQP header back."""
    raw = RawPeer(core, handshake=False)
    assert raw.feed(AMQP_HEADER) == []
    assert raw.headers == [AMQP_HEADER]
    assert not raw.conn.closed


def test_proton_without_sasl_opens(core) -> None:  # type: ignore[no-untyped-def]
    """2.2 / 2.4.1: proton (no SASL layer) and the engine exchange headers and OPEN."""
    p = Peer(core)
    pump(p)
    assert bytes(p.from_router[:8]) == AMQP_HEADER
    assert p.connection.remote_container == "r1"
    assert "PN_CONNECTION_REMOTE_OPEN" in p.events()


def test_header_split_across_reads(core) -> None:  # type: ignore[no-untyped-def]
    """2.2: the header may arrive one byte at a time (TCP has no message boundaries)."""
    raw = RawPeer(core, handshake=False)
    for b in AMQP_HEADER + open_frame():
        raw.feed(bytes([b]))
    assert raw.headers == [AMQP_HEADER]
    assert [f.name for f in raw.frames] == ["open"]


def test_sasl_header_gets_sasl_header_and_mechanisms(core) -> None:  # type: ignore[no-untyped-def]
    """5.3.2: the SASL header is answered with the SASL header, then sasl-mechanisms."""
    raw = RawPeer(core, handshake=False)
    frames = raw.feed(SASL_HEADER)
    assert raw.headers == [SASL_HEADER]
    assert [(f.ftype, f.code) for f in frames] == [(SASL_FRAME, SASL_MECHANISMS)]
    assert list(frames[0].fields["sasl_server_mechanisms"]) == ["ANONYMOUS"]


def test_plain_is_offered_with_a_users_file(auth_core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(auth_core, handshake=False)
    frames = raw.feed(SASL_HEADER)
    assert sorted(frames[0].fields["sasl_server_mechanisms"]) == ["ANONYMOUS", "PLAIN"]


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x02\x01\x00\x00",  # TLS header where TLS is not configured
        b"AMQP\x00\x02\x00\x00",  # a major version we do not speak
        b"AMQP\x00\x01\x00\x01",  # revision 1
        b"AMQP\x01\x01\x00\x00",  # protocol id 1 (unassigned)
        b"HTTP/1.1",  # not AMQP at all
        b"GET / HT",
        b"\x16\x03\x01\x02\x00\x01\x00\x01",  # a TLS ClientHello
    ],
)
def test_unsupported_header_is_answered_with_ours_then_closed(  # type: ignore[no-untyped-def]
    core, header: bytes
) -> None:
    """2.2: "if the requested protocol version is not supported, the server sends a protocol
    header with a supported protocol version and then closes the socket"."""
    raw = RawPeer(core, handshake=False)
    assert raw.feed(header) == []
    assert raw.headers in ([SASL_HEADER], [AMQP_HEADER])
    assert raw.conn.closed
    # nothing more is read or written
    assert raw.feed(AMQP_HEADER + open_frame()) == []


def test_garbage_is_refused_before_eight_bytes(core) -> None:  # type: ignore[no-untyped-def]
    """2.2: bytes that cannot start a header fail at once (no waiting for 8 bytes)."""
    raw = RawPeer(core, handshake=False)
    raw.feed(b"GET")
    assert raw.conn.closed
    assert raw.headers == [SASL_HEADER]


def test_proton_sees_our_header_for_a_bad_version(core) -> None:  # type: ignore[no-untyped-def]
    """2.2 with proton on the other end: our header comes back, the socket closes."""
    p = Peer(core, open=False)
    p.conn.feed(b"AMQP\x00\x02\x00\x00")
    assert p.conn.take_output() == SASL_HEADER
    assert p.conn.closed


def test_amqp_header_when_auth_is_required(auth_core) -> None:  # type: ignore[no-untyped-def]
    """5.3 / 2.2: a listener that requires authentication answers a plain AMQP header with
    the SASL header (the protocol it does support), then closes."""
    raw = RawPeer(auth_core, ListenerConfig(require_auth=True), handshake=False)
    raw.feed(AMQP_HEADER)
    assert raw.headers == [SASL_HEADER]
    assert raw.conn.closed


def test_amqp_header_twice_is_refused(core) -> None:  # type: ignore[no-untyped-def]
    """2.2: after the header exchange the next bytes are frames; a second header is a frame
    whose size field is "AMQP" (0x414d5150), far above max-frame-size."""
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + AMQP_HEADER)
    assert raw.conn.closed
    assert raw.close_error()[0] == "amqp:connection:framing-error"


# --- 5.3 SASL ------------------------------------------------------------------------------


def test_sasl_anonymous(core) -> None:  # type: ignore[no-untyped-def]
    """5.3.3.2 sasl-init ANONYMOUS -> 5.3.3.6 outcome ok; then the AMQP header and OPEN."""
    p = Peer(core, sasl="ANONYMOUS")
    pump(p)
    assert p.transport.sasl().outcome == 0
    assert p.connection.remote_container == "r1"
    assert p.conn.sasl_done and p.conn.user is None
    headers, frames = parse_output(bytes(p.from_router))
    assert headers == [SASL_HEADER, AMQP_HEADER]
    assert [f.name for f in frames] == ["sasl-mechanisms", "sasl-outcome", "open"]
    assert frames[1].fields["code"] == 0


def test_sasl_plain_accepted(auth_core) -> None:  # type: ignore[no-untyped-def]
    """5.3 PLAIN (RFC 4616) against the users file: the connection carries the user."""
    p = Peer(auth_core, sasl=("alice", "secret"))
    pump(p)
    assert p.transport.sasl().outcome == 0
    assert p.conn.user == "alice"
    assert p.connection.remote_container == "r1"


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "secret")])
def test_sasl_plain_refused(auth_core, user: str, password: str) -> None:  # type: ignore[no-untyped-def]
    """5.3.3.6: a wrong password or unknown user gets outcome code 1 (auth); proton reports
    the failure and the connection never opens."""
    p = Peer(auth_core, sasl=(user, password))
    pump(p)
    sasl = p.transport.sasl()
    assert sasl.outcome == sasl.AUTH
    assert p.transport.condition is not None
    assert p.transport.condition.name == "amqp:unauthorized-access"
    assert p.connection.remote_container is None
    assert p.conn.closed
    assert "PN_TRANSPORT_ERROR" in p.events()


def test_require_auth_refuses_anonymous(auth_core) -> None:  # type: ignore[no-untyped-def]
    """5.3: require_auth takes ANONYMOUS off the list; a peer that asks for it anyway gets
    outcome auth."""
    listener = ListenerConfig(require_auth=True)
    raw = RawPeer(auth_core, listener, handshake=False)
    frames = raw.feed(SASL_HEADER)
    assert list(frames[0].fields["sasl_server_mechanisms"]) == ["PLAIN"]
    frames = raw.feed(perf(SASL_INIT, mechanism=_sym("ANONYMOUS"), initial_response=b""))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 1)]
    assert raw.conn.closed
    # and proton, allowed only ANONYMOUS, finds no common mechanism
    p = Peer(auth_core, listener=listener, sasl="ANONYMOUS")
    pump(p)
    assert p.connection.remote_container is None
    assert p.transport.condition is not None


def test_require_auth_accepts_plain(auth_core) -> None:  # type: ignore[no-untyped-def]
    p = Peer(auth_core, listener=ListenerConfig(require_auth=True), sasl=("alice", "secret"))
    pump(p)
    assert p.conn.user == "alice"
    assert p.connection.remote_container == "r1"


def _sym(s: str):  # type: ignore[no-untyped-def]
    from qrouter._fast.codec import Symbol

    return Symbol(s)


def test_sasl_init_with_unoffered_mechanism(core) -> None:  # type: ignore[no-untyped-def]
    """5.3.3.2: a mechanism the server did not offer fails with outcome auth."""
    raw = RawPeer(core, handshake=False)
    raw.feed(SASL_HEADER)
    frames = raw.feed(perf(SASL_INIT, mechanism=_sym("GSSAPI")))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 1)]


def test_sasl_response_out_of_sequence(core) -> None:  # type: ignore[no-untyped-def]
    """5.3.3.4: a sasl-response when no challenge was sent: outcome sys (2), then close."""
    raw = RawPeer(core, handshake=False)
    raw.feed(SASL_HEADER)
    frames = raw.feed(perf(SASL_RESPONSE, response=b"x"))
    assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 2)]


def test_amqp_frame_during_sasl_is_a_framing_error(core) -> None:  # type: ignore[no-untyped-def]
    """5.3.1: during the SASL exchange only SASL frames (type 1) are allowed."""
    raw = RawPeer(core, handshake=False)
    raw.feed(SASL_HEADER)
    raw.feed(open_frame())
    assert raw.conn.closed
    assert raw.conn.error[0] == "amqp:connection:framing-error"


def test_sasl_frame_after_sasl_is_a_framing_error(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(perf(SASL_INIT, mechanism=_sym("ANONYMOUS")))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_malformed_plain_response_is_refused(auth_core) -> None:  # type: ignore[no-untyped-def]
    """RFC 4616: the PLAIN response is authzid NUL authcid NUL passwd; anything else fails."""
    for response in (b"", b"alice", b"\x00alice", b"\x00alice\x00secret\x00x", b"\xff\x00\xfe"):
        raw = RawPeer(auth_core, handshake=False)
        raw.feed(SASL_HEADER)
        frames = raw.feed(perf(SASL_INIT, mechanism=_sym("PLAIN"), initial_response=response))
        assert [(f.code, f.fields["code"]) for f in frames] == [(SASL_OUTCOME, 1)], response


def test_after_sasl_only_the_amqp_header_is_accepted(core) -> None:  # type: ignore[no-untyped-def]
    """5.3.2: after a successful outcome the next layer starts with the AMQP header; any
    other header is answered with that one (2.2), then the connection closes."""
    raw = RawPeer(core, handshake=False)
    raw.feed(SASL_HEADER)
    raw.feed(perf(SASL_INIT, mechanism=_sym("ANONYMOUS")))
    raw.feed(SASL_HEADER)
    assert raw.conn.closed
    assert raw.headers == [SASL_HEADER, AMQP_HEADER]


# --- 2.7.1 OPEN ----------------------------------------------------------------------------


def test_open_properties_and_capabilities(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.1 properties: product and version; offered-capabilities ANONYMOUS-RELAY."""
    p = Peer(core)
    pump(p)
    props = p.connection.remote_properties
    assert props["product"] == "qrouter"
    assert props["version"]
    assert "ANONYMOUS-RELAY" in [str(c) for c in p.connection.remote_offered_capabilities]
    assert p.conn.remote_container_id == "client"
    assert p.conn.remote_open["container_id"] == "client"


def test_max_frame_size_negotiation() -> None:
    """2.7.1 max-frame-size: each side announces the largest frame it accepts; the engine
    never sends a frame larger than the peer's (nor than its own)."""
    core = make_core()
    p = Peer(core, listener=ListenerConfig(max_frame_size=4096), max_frame_size=1024)
    rcv = p.receiver("mfs", credit=5)
    snd = p.sender("mfs")
    pump(p)
    assert p.transport.remote_max_frame_size == 4096
    assert p.conn.remote_max_frame_size == 1024
    body = "x" * 20000
    send(snd, body)
    pump(p)
    got = receive(rcv)
    assert [m.body for _, m in got] == [body]
    sizes = [f for f in _frame_sizes(bytes(p.from_router))]
    assert max(sizes) <= 1024
    # proton respected ours too
    assert max(_frame_sizes(bytes(p.to_router))) <= 4096


def _frame_sizes(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(size)
        pos += size
    return out


def test_peer_max_frame_above_ours_is_capped() -> None:
    """2.7.1: a peer may accept huge frames; the engine still sends at most its own size."""
    core = make_core()
    p = Peer(core, listener=ListenerConfig(max_frame_size=2048), max_frame_size=1 << 20)
    pump(p)
    assert p.conn.remote_max_frame_size == 2048


def test_unset_max_frame_size_means_unlimited_but_capped(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.1: an absent max-frame-size is 4294967295."""
    raw = RawPeer(core)
    assert raw.conn.remote_max_frame_size == raw.conn.max_frame_size


def test_max_frame_size_below_512_is_refused(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.1: "the minimum max-frame-size is 512" (MIN-MAX-FRAME-SIZE)."""
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + open_frame(max_frame_size=UInt(100)))
    assert raw.close_error()[0] == "amqp:invalid-field"
    assert [f.name for f in raw.frames] == ["open", "close"]  # 2.4.1 OPEN before CLOSE


def test_channel_max_negotiation() -> None:
    """2.7.1 channel-max: the engine announces at most its own, and refuses a BEGIN on a
    channel above it."""
    core = make_core()
    p = Peer(core, listener=ListenerConfig(channel_max=7), channel_max=3)
    pump(p)
    assert p.conn.remote_channel_max == 3
    assert p.transport.remote_channel_max <= 7
    raw = RawPeer(core, ListenerConfig(channel_max=7), handshake=False)
    raw.feed(AMQP_HEADER + open_frame())
    assert raw.frames[0].fields["channel_max"] == 7
    raw.feed(begin_frame(channel=7))
    assert [f.name for f in raw.frames] == ["open", "begin"]
    raw.feed(begin_frame(channel=8))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_idle_timeout_negotiation(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.1 idle-time-out, in milliseconds, each side its own. Proton announces half the
    timeout it is configured with, and so does the engine (2.4.5 leaves the margin to the
    implementation: a peer that heartbeats at half the announced value is then well inside
    the real limit)."""
    p = Peer(core, listener=ListenerConfig(idle_timeout=16.0), idle_timeout=4.0)
    pump(p)
    assert p.conn.remote_idle_timeout_ms == 2000
    assert 0 < p.transport.remote_idle_timeout <= 16.0
    assert p.conn.idle_timeout_ms == 16000


def test_no_idle_timeout_is_announced_when_disabled(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core, ListenerConfig(idle_timeout=0), handshake=False)
    raw.feed(AMQP_HEADER + open_frame())
    assert raw.frames[0].fields["idle_time_out"] is None


def test_heartbeat_after_half_the_peers_idle_timeout(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.5: "to avoid spurious timeouts ... a peer SHOULD send frames at half the
    remote idle-timeout"; an empty frame serves."""
    p = Peer(core, idle_timeout=4.0)  # the peer announces 2000 ms
    pump(p)
    conn = p.conn
    conn.tick(conn.last_write + 0.5)
    assert conn.take_output() == b""
    conn.tick(conn.last_write + 1.01)
    out = conn.take_output()
    assert out == HEARTBEAT
    before = p.transport.frames_input
    p.transport.push(out)
    assert p.transport.frames_input == before + 1
    assert not conn.closed


def test_no_heartbeat_without_peer_idle_timeout(core) -> None:  # type: ignore[no-untyped-def]
    p = Peer(core)
    pump(p)
    p.conn.tick(p.conn.last_write + 3600)
    assert p.conn.take_output() in (b"",) or p.conn.closed  # idle detection may close it


def test_idle_peer_is_closed_with_resource_limit_exceeded() -> None:
    """2.4.5: a peer silent for longer than our idle-time-out is closed with
    amqp:resource-limit-exceeded."""
    core = make_core()
    p = Peer(core, listener=ListenerConfig(idle_timeout=1.0))
    pump(p)
    p.conn.tick(p.conn.last_read + 0.9)
    assert p.conn.take_output() == b"" and not p.conn.closed
    p.conn.tick(p.conn.last_read + 1.5)
    assert p.conn.closed
    pump(p)
    cond = p.connection.remote_condition
    assert cond is not None and cond.name == "amqp:resource-limit-exceeded"


def test_peer_heartbeats_keep_the_connection_alive() -> None:
    """2.4.5: an empty frame is a valid frame; it resets the idle timer and is not answered."""
    core = make_core()
    p = Peer(core, listener=ListenerConfig(idle_timeout=1.0))
    pump(p)
    first = p.conn.last_read
    p.conn.feed(HEARTBEAT)
    assert p.conn.take_output() == b""
    assert p.conn.last_read >= first
    assert not p.conn.closed


def test_second_open_is_a_framing_error(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.1: OPEN is sent once."""
    raw = RawPeer(core)
    raw.feed(open_frame())
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_first_frame_must_be_open(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.1: after the header the first frame is OPEN; the engine still sends its OPEN
    before the CLOSE that carries the error."""
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + begin_frame())
    assert [f.name for f in raw.frames] == ["open", "close"]
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_open_without_container_id_is_a_decode_error(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.1: container-id is mandatory."""
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + perf(OPEN, hostname="x"))
    assert raw.close_error()[0] == "amqp:decode-error"


def test_empty_container_id_is_refused(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + open_frame(""))
    assert raw.close_error()[0] == "amqp:invalid-field"


def test_open_with_every_field(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.1: all ten fields, locales and capabilities as arrays, are accepted."""
    from qrouter._fast.codec import Symbol, UShort, symbol_array

    raw = RawPeer(core, handshake=False)
    raw.feed(
        AMQP_HEADER
        + perf(
            OPEN,
            container_id="every-field",
            hostname="example.com",
            max_frame_size=UInt(8192),
            channel_max=UShort(10),
            idle_time_out=UInt(30000),
            outgoing_locales=symbol_array(["en-US"]),
            incoming_locales=symbol_array(["en-US", "fr"]),
            offered_capabilities=symbol_array(["X"]),
            desired_capabilities=symbol_array(["ANONYMOUS-RELAY"]),
            properties={Symbol("k"): "v"},
        )
    )
    assert [f.name for f in raw.frames] == ["open"]
    assert raw.conn.remote_max_frame_size == 8192
    assert raw.conn.remote_channel_max == 10
    assert raw.conn.remote_idle_timeout_ms == 30000
    assert raw.conn.remote_open["hostname"] == "example.com"


# --- 2.7.9 CLOSE, 2.4.3 closing a connection ---------------------------------------------------


def test_peer_close_with_error_is_answered(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.3 / 2.7.9: the peer's CLOSE (with an error) is answered with CLOSE; the engine
    records the peer's error and the connection ends."""
    from proton import Condition

    p = Peer(core)
    pump(p)
    p.connection.condition = Condition("amqp:internal-error", "client broke", {"k": 1})
    p.connection.close()
    pump(p)
    assert p.conn.closed
    err = p.conn.remote_error
    assert err["condition"] == "amqp:internal-error"
    assert err["description"] == "client broke"
    assert "PN_CONNECTION_REMOTE_CLOSE" in p.events()
    assert p.connection.remote_condition is None
    assert p.frames_from_router()[-1].code == CLOSE


def test_router_close_with_error_reaches_proton(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.9 / 2.8.16: the router closes with amqp:connection:forced; proton sees it."""
    p = Peer(core)
    pump(p)
    p.conn.close("amqp:connection:forced", "shutting down")
    pump(p)
    cond = p.connection.remote_condition
    assert cond.name == "amqp:connection:forced"
    assert cond.description == "shutting down"
    assert p.conn.closed


def test_router_close_without_error(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.3: a clean close: CLOSE without an error; proton answers; then the socket ends."""
    p = Peer(core)
    pump(p)
    p.conn.close()
    pump(p)
    assert p.frames_from_router()[-1].code == CLOSE
    assert p.frames_from_router()[-1].fields["error"] is None
    assert "PN_CONNECTION_REMOTE_CLOSE" in p.events()
    p.connection.close()
    pump(p)
    assert p.conn.closed


def test_frames_after_our_close_are_ignored(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.3: after sending CLOSE a peer reads (and ignores) frames until the peer's CLOSE."""
    raw = RawPeer(core)
    raw.conn.close()
    assert [f.name for f in raw.collect()] == ["close"]
    assert raw.feed(begin_frame(channel=1)) == []
    assert not raw.conn.closed
    raw.feed(perf(CLOSE))
    assert raw.conn.closed


def test_close_ends_sessions_and_links(core) -> None:  # type: ignore[no-untyped-def]
    """2.4.3: closing the connection ends its sessions and links; a queued message for a
    consumer on the closed connection goes back to its producer (released)."""
    a = Peer(core, container="a")
    b = Peer(core, container="b")
    rcv = b.receiver("closing", credit=1)
    snd = a.sender("closing")
    pump(a, b)
    d = send(snd, "m")
    pump(a, b)
    assert rcv.current is not None
    b.connection.close()
    pump(a, b)
    assert b.conn.closed and b.conn.session_count == 0
    # the consumer had the message (sent, unsettled): 2.6.12 -> modified delivery-failed
    from proton import Delivery

    assert d.remote_state == Delivery.MODIFIED
    assert d.settled
    address = core.engine.address("closing")
    assert address is None or address.consumer_count == 0


def test_begin_after_open_works(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    assert raw.of(BEGIN)[0].fields["remote_channel"] == 0


def test_message_through_sasl_and_small_frames(auth_core) -> None:  # type: ignore[no-untyped-def]
    """The whole stack: SASL PLAIN, 512-byte frames both ways, a multi-frame message."""
    listener = ListenerConfig(max_frame_size=512)
    p = Peer(auth_core, listener=listener, sasl=("alice", "secret"), max_frame_size=512)
    rcv = p.receiver("stack", credit=1)
    snd = p.sender("stack")
    pump(p)
    body = bytes(range(256)) * 20
    send(snd, body)
    pump(p)
    assert [m.body for _, m in receive(rcv)] == [body]
    assert len(message_bytes(body)) > 512
