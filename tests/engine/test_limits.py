"""The engine's limits (qrouter/_fast/limits.pxi) without sockets: what a peer that ignores the
refusals can make the router keep is bounded."""

from __future__ import annotations

from qrouter._fast.codec import UInt

from qrouter.limits import LimitsConfig
from tests.engine.pump import (
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    DETACH,
    END,
    RawPeer,
    attach_frame,
    begin_frame,
    make_core,
    open_frame,
    perf,
)

LIMIT = "amqp:resource-limit-exceeded"


def test_refused_links_not_detached_by_the_peer_close_the_connection() -> None:
    """2.6.4: a refused link keeps its handle until the peer's DETACH. A peer that never
    answers reaches twice the limit and is closed; one that answers can go on for ever."""
    core = make_core(limits=LimitsConfig(max_links_per_connection=3))
    polite = RawPeer(core)
    for i in range(3):
        polite.feed(attach_frame(f"ok{i}", i, sender=False))
    for i in range(50):
        polite.feed(attach_frame(f"more{i}", 3, sender=False))
        assert polite.frames[-1].code == DETACH
        assert polite.frames[-1].error() == (
            LIMIT,
            "links per connection limit 3 reached (handle-max 2)",
        )
        polite.feed(perf(DETACH, handle=UInt(3), closed=True))
    assert polite.close_error() is None

    rude = RawPeer(core)
    for i in range(3):
        rude.feed(attach_frame(f"ok{i}", i, sender=False))
    for i in range(3, 10):
        rude.feed(attach_frame(f"more{i}", i, sender=False))
    assert len(rude.of(DETACH)) == 3  # handles 3, 4, 5 refused; the 4th refusal closes
    assert rude.close_error() == (
        LIMIT,
        "links per connection limit 3 reached (refused links not detached by the peer)",
    )
    assert rude.conn.closed
    assert polite.conn.closed is False


def test_refused_session_ignores_frames_until_the_peers_end() -> None:
    core = make_core(limits=LimitsConfig(max_sessions_per_connection=1))
    raw = RawPeer(core, handshake=False)
    raw.feed(AMQP_HEADER + open_frame())
    assert raw.frames[0].fields["channel_max"] == 0
    raw.feed(begin_frame(channel=0) + begin_frame(channel=1))
    assert [f.code for f in raw.frames[1:]] == [BEGIN, BEGIN, END]
    end = raw.frames[-1]
    assert end.error() == (LIMIT, "sessions per connection limit 1 reached (channel-max 0)")
    raw.feed(attach_frame("ignored", 0, sender=False, channel=1))
    assert raw.frames[-1] is end  # nothing answered
    raw.feed(perf(END, channel=1))
    assert raw.frames[-1] is end  # our END was sent already: no second one
    raw.feed(begin_frame(channel=1))  # still over the limit: refused again, not a framing error
    assert raw.frames[-1].code == END and raw.close_error() is None
    raw.feed(attach_frame("works", 0, sender=False, channel=0))
    assert raw.of(ATTACH)[-1].fields["name"] == "works"


def test_inter_router_connections_are_not_limited() -> None:
    from qrouter.config import ListenerConfig

    core = make_core(limits=LimitsConfig(max_sessions_per_connection=1))
    raw = RawPeer(core, ListenerConfig(role="inter-router"), handshake=False)
    assert raw.conn.limits is None
    assert raw.conn.channel_max == ListenerConfig().channel_max
