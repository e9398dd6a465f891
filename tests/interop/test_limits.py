"""[limits] (qrouter/limits.py, qrouter/_fast/limits.pxi) against a real router: for each limit,
one test with a small configured value. Below the limit everything works; past it the peer gets
amqp:resource-limit-exceeded with a description that names the limit, the limit's counter in
/metrics moves, and the other connections are not disturbed.

The peers are raw sockets speaking hand-built frames (tests/engine/pump.py builds and decodes
them), so each test sees the exact frames the router answers with.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from qrouter._fast.codec import Symbol, UInt

from tests.engine.pump import (
    ACCEPTED,
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    OPEN,
    SOURCE,
    TARGET,
    TRANSFER,
    Frame,
    attach_frame,
    begin_frame,
    described,
    flow_frame,
    message_bytes,
    open_frame,
    parse_output,
    perf,
    transfer_frame,
)
from tests.harness import free_port, retry
from tests.management.tooling import ok, scrape, value

LIMIT = "amqp:resource-limit-exceeded"


class SocketPeer:
    """A raw AMQP client on a real socket: header + OPEN at connect, then frames as written."""

    def __init__(
        self, port: int, container: str = "raw", *, source: str | None = None, begin: bool = True
    ) -> None:
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=10, source_address=(source, 0) if source else None
        )
        self.buf = b""
        self.frames: list[Frame] = []
        self.send(AMQP_HEADER + open_frame(container))
        self.wait(lambda f: f.code == OPEN)
        if begin:
            self.send(begin_frame())
            self.wait(lambda f: f.code == BEGIN)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def wait(self, match: Any, timeout: float = 10.0) -> Frame:
        """The first frame (already read or still to come) that `match`es."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for f in self.frames[seen:]:
                if match(f):
                    return f
            seen = len(self.frames)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching frame in {timeout} s; got {self.names()}")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError(f"the router closed the socket; got {self.names()}")
            self._split(self.buf + data)

    def _split(self, data: bytes) -> None:
        pos = 0
        if data.startswith(b"AMQP"):
            pos = 8
        while len(data) - pos >= 8:
            size = int.from_bytes(data[pos : pos + 4], "big")
            if len(data) - pos < size:
                break
            self.frames += parse_output(data[pos : pos + size])[1]
            pos += size
        self.buf = data[pos:]

    def names(self) -> list[str]:
        return [f.name for f in self.frames]

    def closed_with(self) -> tuple[str, str | None] | None:
        f = self.wait(lambda f: f.code == CLOSE)
        return f.error()

    def close(self) -> None:
        self.sock.close()


def limited_router(router: Any, *limits: str, **kwargs: Any) -> tuple[Any, int]:
    """A router with `limits` (``--limit NAME=VALUE``) and /metrics."""
    mport = free_port()
    args = ["--metrics", f"127.0.0.1:{mport}"]
    for item in limits:
        args += ["--limit", item]
    r = router(extra_args=args, **kwargs)
    retry(lambda: scrape(mport), timeout=10, message="/metrics never answered")
    return r, mport


def exceeded(mport: int, name: str) -> float:
    return value(scrape(mport), "qrouter_limit_exceeded_total", limit=name)


def round_trip(port: int, address: str, container: str) -> None:
    """A consumer and a producer on fresh connections move one message: the router works."""
    rcv = SocketPeer(port, container + "-rcv")
    rcv.send(attach_frame("r", 0, sender=False, address=address))
    rcv.wait(lambda f: f.code == ATTACH)
    rcv.send(flow_frame(handle=0, delivery_count=0, link_credit=1))
    snd = SocketPeer(port, container + "-snd")
    snd.send(attach_frame("s", 0, sender=True, address=address))
    snd.wait(lambda f: f.code == FLOW and (f.fields.get("link_credit") or 0) > 0)
    snd.send(transfer_frame(0, 0, b"t", message_bytes("hello"), settled=True))
    got = rcv.wait(lambda f: f.code == TRANSFER)
    assert b"hello" in got.payload
    rcv.close()
    snd.close()


# -- connections ------------------------------------------------------------------------------


def test_connections_total(router: Any) -> None:
    r, mport = limited_router(router, "max_connections=2")
    a, b = SocketPeer(r.port, "a"), SocketPeer(r.port, "b")
    third = SocketPeer(r.port, "c", begin=False)
    # 2.4.1: OPEN, then CLOSE with the condition: the client learns which limit it met
    assert third.names()[0] == "open"
    assert third.closed_with() == (LIMIT, "connections limit 2 reached")
    assert exceeded(mport, "connections") == 1
    # the two admitted connections still work
    a.send(attach_frame("r", 0, sender=False, address="q"))
    a.send(flow_frame(handle=0, delivery_count=0, link_credit=1))
    b.send(attach_frame("s", 0, sender=True, address="q"))
    b.wait(lambda f: f.code == FLOW and (f.fields.get("link_credit") or 0) > 0)
    b.send(transfer_frame(0, 0, b"t", message_bytes("still here"), settled=True))
    assert b"still here" in a.wait(lambda f: f.code == TRANSFER).payload
    # a place frees when a connection goes
    a.close()
    retry(lambda: value(scrape(mport), "qrouter_connections") == 1, timeout=10)
    SocketPeer(r.port, "d").close()
    b.close()
    third.close()


def test_connections_per_host(router: Any) -> None:
    r, mport = limited_router(router, "max_connections_per_host=1")
    first = SocketPeer(r.port, "a", source="127.0.0.1")
    second = SocketPeer(r.port, "b", source="127.0.0.1", begin=False)
    assert second.closed_with() == (
        LIMIT,
        "connections per host limit 1 reached for host 127.0.0.1",
    )
    # another host (another loopback address) is not affected
    other = SocketPeer(r.port, "c", source="127.0.0.2")
    assert exceeded(mport, "connections_per_host") == 1
    for p in (first, second, other):
        p.close()


def test_connections_per_user(router: Any) -> None:
    """Anonymous connections count as one user."""
    r, mport = limited_router(router, "max_connections_per_user=2")
    peers = [SocketPeer(r.port, f"p{i}") for i in range(2)]
    refused = SocketPeer(r.port, "p2", begin=False)
    assert refused.closed_with() == (
        LIMIT,
        "connections per user limit 2 reached for user <anonymous>",
    )
    assert exceeded(mport, "connections_per_user") == 1
    peers[0].send(attach_frame("r", 0, sender=False, address="q"))
    assert peers[0].wait(lambda f: f.code == ATTACH).fields["source"]["address"] == "q"
    for p in [*peers, refused]:
        p.close()


# -- sessions and links (the engine: channel-max and handle-max) --------------------------------


def test_sessions_per_connection(router: Any) -> None:
    r, mport = limited_router(router, "max_sessions_per_connection=2")
    p = SocketPeer(r.port, begin=False)
    # 2.7.1: the router advertises channel-max = the limit less one
    assert p.wait(lambda f: f.code == OPEN).fields["channel_max"] == 1
    p.send(begin_frame(channel=0) + begin_frame(channel=1))
    p.wait(lambda f: f.code == BEGIN and f.fields["remote_channel"] == 1)
    # a third session (here on a channel above channel-max) gets BEGIN then END with the error
    p.send(begin_frame(channel=2))
    begin = p.wait(lambda f: f.code == BEGIN and f.fields["remote_channel"] == 2)
    end = p.wait(lambda f: f.code == END)
    assert end.channel == begin.channel
    assert end.error() == (LIMIT, "sessions per connection limit 2 reached (channel-max 1)")
    # frames on the refused session are ignored until the peer's END; then the channel is free
    p.send(attach_frame("ignored", 0, sender=False, address="q", channel=2))
    p.send(perf(END, channel=2))
    # the connection and its sessions go on
    p.send(attach_frame("r", 0, sender=False, address="q", channel=1))
    attach = p.wait(lambda f: f.code == ATTACH)
    assert attach.fields["name"] == "r"
    assert CLOSE not in [f.code for f in p.frames]
    assert exceeded(mport, "sessions_per_connection") == 1
    round_trip(r.port, "after-sessions", "other")
    p.close()


def test_sessions_refused_without_end_close_the_connection(router: Any) -> None:
    """A peer that piles up refused sessions without ending them is closed: what it can make
    the router keep is bounded."""
    r, _ = limited_router(router, "max_sessions_per_connection=1")
    p = SocketPeer(r.port)  # channel 0: the one session allowed
    p.send(b"".join(begin_frame(channel=c) for c in range(1, 4)))
    assert p.closed_with() == (
        LIMIT,
        "sessions per connection limit 1 reached (1 refused sessions not ended by the peer)",
    )
    p.close()


def test_links_per_connection(router: Any) -> None:
    r, mport = limited_router(router, "max_links_per_connection=2")
    p = SocketPeer(r.port, begin=False)
    p.send(begin_frame(handle_max=UInt(100)))
    # 2.7.2: the router's handle-max is the limit less one, not the peer's echoed
    assert p.wait(lambda f: f.code == BEGIN).fields["handle_max"] == 1
    p.send(attach_frame("a", 0, sender=False, address="q"))
    p.send(attach_frame("b", 1, sender=True, address="q"))
    p.wait(lambda f: f.code == ATTACH and f.fields["name"] == "b")
    # past the limit, on a handle within handle-max of another session: attached with a null
    # terminus and detached with the error (2.6.3)
    p.send(begin_frame(channel=1))
    p.wait(lambda f: f.code == BEGIN and f.fields["remote_channel"] == 1)
    p.send(attach_frame("c", 0, sender=False, address="q", channel=1))
    attach = p.wait(lambda f: f.code == ATTACH and f.fields["name"] == "c")
    assert attach.fields["source"] is None
    detach = p.wait(lambda f: f.code == DETACH)
    assert detach.fields["closed"] is True
    assert detach.error() == (LIMIT, "links per connection limit 2 reached (handle-max 1)")
    # a handle above handle-max is refused the same way
    p.send(perf(DETACH, channel=1, handle=UInt(0), closed=True))
    p.send(attach_frame("d", 5, sender=False, address="q"))
    d = p.wait(lambda f: f.code == DETACH and f.channel == 0)
    assert d.error() == (LIMIT, "links per connection limit 2 reached (handle-max 1)")
    p.send(perf(DETACH, handle=UInt(5), closed=True))  # 2.6.4: answering ours frees it
    assert exceeded(mport, "links_per_connection") == 2
    # the links below the limit still work: "b" produces to "a"
    p.send(flow_frame(handle=0, delivery_count=0, link_credit=5))
    p.wait(lambda f: f.code == FLOW and f.fields.get("link_credit"))
    p.send(transfer_frame(1, 0, b"t", message_bytes("under the limit"), settled=True))
    assert b"under the limit" in p.wait(lambda f: f.code == TRANSFER).payload
    # once a link goes, a new one fits
    p.send(perf(DETACH, handle=UInt(0), closed=True))
    p.wait(lambda f: f.code == DETACH and f.channel == 0 and not f.error())
    p.send(attach_frame("e", 0, sender=False, address="q"))
    e = p.wait(lambda f: f.code == ATTACH and f.fields["name"] == "e")
    assert e.fields["source"]["address"] == "q"
    round_trip(r.port, "after-links", "other")
    p.close()


# -- unsettled deliveries per link ----------------------------------------------------------


def test_unsettled_per_link(router: Any) -> None:
    """A consumer that takes deliveries and never settles: the producer's credit stops at the
    limit's room; a producer that sends anyway is detached naming the limit."""
    r, mport = limited_router(router, "max_unsettled_per_link=3")
    consumer = SocketPeer(r.port, "consumer")
    consumer.send(attach_frame("r", 0, sender=False, address="q"))
    consumer.send(flow_frame(handle=0, delivery_count=0, link_credit=1000))
    producer = SocketPeer(r.port, "producer")
    producer.send(attach_frame("s", 0, sender=True, address="q"))
    credit = producer.wait(lambda f: f.code == FLOW and f.fields.get("handle") == 0)
    assert credit.fields["link_credit"] == 3  # not the link capacity (250): the limit's room
    for i in range(3):
        producer.send(transfer_frame(0, i, bytes([i]), message_bytes(i)))
    consumer.wait(lambda f: f.code == TRANSFER and f.fields["delivery_id"] == 2)
    producer.send(transfer_frame(0, 3, b"\x03", message_bytes(3)))
    detach = producer.wait(lambda f: f.code == DETACH)
    assert detach.error() == (LIMIT, "unsettled deliveries per link limit 3 reached")
    assert exceeded(mport, "unsettled_per_link") == 1
    round_trip(r.port, "after-unsettled", "other")
    consumer.close()
    producer.close()


def test_unsettled_limit_credit_comes_back(router: Any) -> None:
    """Below the limit everything flows: a consumer that settles as it goes gets all of a
    producer's 20 unsettled deliveries through a limit of 3 (credit returns as they settle)."""
    r, mport = limited_router(router, "max_unsettled_per_link=3")
    consumer = SocketPeer(r.port, "consumer")
    consumer.send(attach_frame("r", 0, sender=False, address="q"))
    consumer.send(flow_frame(handle=0, delivery_count=0, link_credit=1000))
    producer = SocketPeer(r.port, "producer")
    producer.send(attach_frame("s", 0, sender=True, address="q"))

    def window() -> int:  # 2.6.7: what the producer may send: delivery-count + link-credit
        flows = [f for f in producer.frames if f.code == FLOW and f.fields.get("handle") == 0]
        return (
            (flows[-1].fields["delivery_count"] + flows[-1].fields["link_credit"]) if flows else 0
        )

    sent = got = 0
    while got < 20:
        if sent == got:  # all settled: wait for the credit that comes back
            producer.wait(
                lambda f, sent=sent: (
                    f.code == FLOW and f.fields.get("handle") == 0 and window() > sent
                )
            )
        while sent < min(window(), 20):
            producer.send(transfer_frame(0, sent, bytes([sent]), message_bytes(sent)))
            sent += 1
        assert sent - got <= 3, "more credit than the unsettled limit allows"
        t = consumer.wait(lambda f, got=got: f.code == TRANSFER and f.fields["delivery_id"] == got)
        consumer.send(
            perf(
                DISPOSITION,
                role=True,
                first=UInt(t.fields["delivery_id"]),
                settled=True,
                state=described(ACCEPTED),
            )
        )
        got += 1
    assert DETACH not in [f.code for f in producer.frames]
    assert exceeded(mport, "unsettled_per_link") == 0
    consumer.close()
    producer.close()


# -- max message size per listener ------------------------------------------------------------


def test_max_message_size_per_listener(router: Any) -> None:
    mport = free_port()
    r = router(
        listeners=[{"max_message_size": 1000}, {}],
        extra_args=["--metrics", f"127.0.0.1:{mport}"],
    )
    retry(lambda: scrape(mport), timeout=10)
    small = SocketPeer(r.listeners[0].port, "small")
    small.send(attach_frame("r", 0, sender=False, address="q"))
    small.send(flow_frame(handle=0, delivery_count=0, link_credit=10))
    small.send(attach_frame("s", 1, sender=True, address="q"))
    attach = small.wait(lambda f: f.code == ATTACH and f.fields["name"] == "s")
    assert attach.fields["max_message_size"] == 1000  # 2.7.3: the listener's
    small.wait(lambda f: f.code == FLOW and f.fields.get("link_credit"))
    small.send(transfer_frame(1, 0, b"t", message_bytes("x" * 100), settled=True))
    assert b"x" * 100 in small.wait(lambda f: f.code == TRANSFER).payload  # under the limit
    small.send(transfer_frame(1, 1, b"u", message_bytes("x" * 2000), settled=True))
    detach = small.wait(lambda f: f.code == DETACH)
    assert detach.error() == ("amqp:link:message-size-exceeded", "message exceeds 1000 bytes")
    assert exceeded(mport, "message_size") == 1
    # the other listener has the router's (100 MiB): the same message goes through
    big = SocketPeer(r.listeners[1].port, "big")
    big.send(attach_frame("s", 0, sender=True, address="q"))
    assert big.wait(lambda f: f.code == ATTACH).fields["max_message_size"] == 100 * 1024 * 1024
    small.close()
    big.close()


# -- termini ----------------------------------------------------------------------------------


def never(name: str, handle: int, address: str = "q", **terminus: Any) -> bytes:
    """A consumer ATTACH whose source asks expiry-policy never (so the registry keeps it)."""
    terminus.setdefault("expiry_policy", Symbol("never"))
    return attach_frame(
        name,
        handle,
        sender=False,
        source=described(SOURCE, address=address, **terminus),
        target=described(TARGET),
    )


def test_termini_per_container(router: Any) -> None:
    r, mport = limited_router(router, "max_termini_per_container=2")
    p = SocketPeer(r.port, "greedy")
    for i in range(3):
        p.send(never(f"sub{i}", i))
    detach = p.wait(lambda f: f.code == DETACH)
    assert detach.error() == (
        LIMIT,
        "termini per container limit 2 reached for container greedy",
    )
    assert len([f for f in p.frames if f.code == ATTACH and f.fields["source"]]) == 2
    assert exceeded(mport, "termini_per_container") == 1
    # another container is not affected
    q = SocketPeer(r.port, "modest")
    q.send(never("sub", 0))
    assert q.wait(lambda f: f.code == ATTACH).fields["source"]["address"] == "q"
    p.close()
    q.close()


def test_termini_total(router: Any) -> None:
    r, mport = limited_router(router, "max_termini=2")
    peers = [SocketPeer(r.port, f"c{i}") for i in range(3)]
    for p in peers[:2]:
        p.send(never("sub", 0))
        p.wait(lambda f: f.code == ATTACH)
    peers[2].send(never("sub", 0))
    assert peers[2].wait(lambda f: f.code == DETACH).error() == (
        LIMIT,
        "termini limit 2 reached",
    )
    assert exceeded(mport, "termini") == 1
    # a link that does not ask the router to keep its terminus is not counted
    peers[2].send(attach_frame("volatile", 1, sender=False, address="q"))
    attach = peers[2].wait(lambda f: f.code == ATTACH and f.fields["name"] == "volatile")
    assert attach.fields["source"]["address"] == "q"
    for p in peers:
        p.close()


def test_terminus_timeout_capped(router: Any) -> None:
    r, mport = limited_router(router, "max_terminus_timeout=60")
    p = SocketPeer(r.port)
    # durable 1 (granted 0 by the memory store) asks the registry to keep the terminus
    p.send(
        never("long", 0, expiry_policy=Symbol("link-detach"), timeout=UInt(100000), durable=UInt(1))
    )
    source = p.wait(lambda f: f.code == ATTACH).fields["source"]
    # 3.5.3: the router's ATTACH states what it grants
    assert (source["expiry_policy"], source["timeout"]) == ("link-detach", 60)
    assert exceeded(mport, "terminus_timeout") == 1
    p.close()


def test_expiry_never_capped(router: Any) -> None:
    r, mport = limited_router(router, "max_terminus_timeout=60", "expiry_never=cap")
    p = SocketPeer(r.port)
    p.send(never("forever", 0))
    source = p.wait(lambda f: f.code == ATTACH).fields["source"]
    assert (source["expiry_policy"], source["timeout"]) == ("link-detach", 60)
    assert exceeded(mport, "expiry_never") == 1
    p.close()


def test_expiry_never_refused(router: Any) -> None:
    r, mport = limited_router(router, "expiry_never=refuse")
    p = SocketPeer(r.port)
    p.send(never("forever", 0))
    assert p.wait(lambda f: f.code == DETACH).error() == (
        LIMIT,
        "expiry_never limit: expiry-policy never is refused",
    )
    p.send(
        never("bounded", 1, expiry_policy=Symbol("session-end"), timeout=UInt(30), durable=UInt(1))
    )
    source = p.wait(lambda f: f.code == ATTACH and f.fields["name"] == "bounded").fields["source"]
    assert (source["expiry_policy"], source["timeout"]) == ("session-end", 30)
    assert exceeded(mport, "expiry_never") == 1
    p.close()


def test_expiry_never_allowed_by_default(router: Any) -> None:
    r, _ = limited_router(router)
    p = SocketPeer(r.port)
    p.send(never("forever", 0, timeout=UInt(0)))
    source = p.wait(lambda f: f.code == ATTACH).fields["source"]
    assert source["expiry_policy"] == "never"
    p.close()


# -- operations: $management, qrouter-tool ----------------------------------------------------


def test_limits_in_management_and_tool(router: Any) -> None:
    r, mport = limited_router(router, "max_links_per_connection=2")  # the tool uses 2
    p = SocketPeer(r.port)
    for i in range(3):
        p.send(attach_frame(f"l{i}", i, sender=False, address="q"))
    p.wait(lambda f: f.code == DETACH)
    rows = {row["name"]: row for row in ok("limits", "--url", r.url, "--json").json()}
    assert rows["links_per_connection"]["value"] == 2
    assert rows["links_per_connection"]["exceeded"] == 1
    assert rows["connections"]["value"] == 10_000  # the defaults
    assert rows["connections"]["in_use"] >= 1
    assert rows["sessions_per_connection"]["value"] == 100
    assert rows["expiry_never"]["value"] == "allow"
    table = ok("limits", "--url", r.url).stdout
    assert "links_per_connection" in table and "max_links_per_connection" in table
    assert value(scrape(mport), "qrouter_limit", limit="links_per_connection") == 2
    assert value(scrape(mport), "qrouter_limit", limit="message_size") == 100 * 1024 * 1024
    p.close()


def test_defaults_do_not_limit_mesh_links_or_ulong_fields(router: Any) -> None:
    """Sanity of the defaults: the OPEN and BEGIN a client sees."""
    r, _ = limited_router(router)
    p = SocketPeer(r.port, begin=False)
    assert p.wait(lambda f: f.code == OPEN).fields["channel_max"] == 99
    p.send(begin_frame())
    assert p.wait(lambda f: f.code == BEGIN).fields["handle_max"] == 999
    p.send(attach_frame("s", 0, sender=True, address="q"))
    assert p.wait(lambda f: f.code == ATTACH).fields["max_message_size"] == 100 * 1024 * 1024
    p.close()
