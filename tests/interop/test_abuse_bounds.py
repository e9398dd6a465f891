"""What keeps abusive clients from taking the router's time (docs/security.md, "The abuse
benchmark"), against a real router with raw sockets: a message over max-message-size closes
its connection, so the rest of it is never read; one host's new connections are rate-limited.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from qrouter._fast.codec import UInt

from tests.engine.pump import (
    AMQP_HEADER,
    ATTACH,
    CLOSE,
    DETACH,
    FLOW,
    TRANSFER,
    attach_frame,
    flow_frame,
    message_bytes,
    transfer_frame,
)
from tests.harness import HOST, free_port, retry
from tests.interop.test_limits import SocketPeer, exceeded, round_trip
from tests.management.tooling import scrape

CHUNK = 400  # payload bytes per TRANSFER: frames under the 512 every peer takes (2.7.1)


def _oversize_frames(total: int) -> bytes:
    """The first `total` bytes of one delivery on handle 1, in CHUNK-byte frames (2.7.5
    more=true on each)."""
    first = transfer_frame(1, 0, b"big", message_bytes("x" * CHUNK), more=True, settled=True)
    rest = transfer_frame(1, None, None, b"x" * CHUNK, more=True, settled=True)
    return first + rest * (total // CHUNK)


def _producer(port: int, container: str) -> SocketPeer:
    """A consumer of q (so the router grants credit) and a sender to q, on one connection."""
    peer = SocketPeer(port, container)
    peer.send(attach_frame("r", 0, sender=False, address="q"))
    peer.send(flow_frame(handle=0, delivery_count=0, link_credit=10))
    peer.send(attach_frame("s", 1, sender=True, address="q"))
    peer.wait(lambda f: f.code == ATTACH and f.fields["name"] == "s")
    peer.wait(lambda f: f.code == FLOW and f.fields.get("handle") == UInt(1))
    return peer


def test_oversize_message_closes_its_connection(router: Any) -> None:
    """limits.message_size_exceeded = "close" (the default): DETACH with
    amqp:link:message-size-exceeded, then CLOSE with amqp:connection:forced, then the socket
    is closed while the client still has megabytes of the message to send (more than
    the sockets' buffers hold). Other clients go
    on."""
    mport = free_port()
    r = router(
        listeners=[{"max_message_size": 1000}], extra_args=["--metrics", f"127.0.0.1:{mport}"]
    )
    retry(lambda: scrape(mport), timeout=10)
    peer = _producer(r.port, "oversize")
    frames = _oversize_frames(32 * 1024 * 1024)
    sent = 0
    peer.sock.settimeout(10)
    try:
        while sent < len(frames):  # until the router stops taking the bytes
            sent += peer.sock.send(frames[sent : sent + 65536])
    except (BrokenPipeError, ConnectionResetError):
        pass
    detach = peer.wait(lambda f: f.code == DETACH)
    assert detach.error() == ("amqp:link:message-size-exceeded", "message exceeds 1000 bytes")
    condition, description = peer.closed_with() or ("", "")
    assert condition == "amqp:connection:forced"
    assert description is not None and "message exceeds 1000 bytes" in description
    assert TRANSFER not in [f.code for f in peer.frames]  # nothing of it was forwarded
    assert sent < len(frames), "the router read the whole 32 MiB"
    assert exceeded(mport, "message_size") == 1
    round_trip(r.port, "after", "after")
    peer.close()


def test_oversize_message_detaches_only_with_detach_policy(router: Any) -> None:
    """limits.message_size_exceeded = "detach": the link is detached, the connection goes on
    (the rest of the message, in flight, is dropped) and carries a new link's message."""
    r = router(
        listeners=[{"max_message_size": 1000}],
        extra_args=["--limit", "message_size_exceeded=detach"],
    )
    peer = _producer(r.port, "oversize")
    peer.send(_oversize_frames(20_000))
    detach = peer.wait(lambda f: f.code == DETACH)
    assert detach.error() == ("amqp:link:message-size-exceeded", "message exceeds 1000 bytes")
    peer.send(attach_frame("s2", 2, sender=True, address="q"))
    peer.wait(lambda f: f.code == FLOW and f.fields.get("handle") == UInt(2))
    peer.send(transfer_frame(2, 1, b"t", message_bytes("small"), settled=True))
    assert b"small" in peer.wait(lambda f: f.code == TRANSFER).payload
    assert CLOSE not in [f.code for f in peer.frames]
    peer.close()


def _answer(sock: socket.socket) -> bytes:
    """What the router says to a protocol header: its own header, or b"" when it reset us."""
    try:
        sock.sendall(AMQP_HEADER)
        sock.settimeout(10)
        return sock.recv(8)
    except (ConnectionResetError, BrokenPipeError):
        return b""


def test_connection_rate_per_host(router: Any) -> None:
    """limits.max_connection_rate_per_host: a host that opens connections faster than the
    rate (past its burst) has the extra ones reset as accepted, before anything is read or
    answered; other hosts connect as usual, and the host again once its bucket refills."""
    mport = free_port()
    r = router(
        extra_args=[
            "--metrics", f"127.0.0.1:{mport}",
            "--limit", "max_connection_rate_per_host=1",
            "--limit", "connection_rate_burst=3",
        ]
    )  # fmt: skip
    retry(lambda: scrape(mport), timeout=10)
    socks = [
        socket.create_connection((HOST, r.port), timeout=10, source_address=("127.0.0.3", 0))
        for _ in range(12)
    ]
    answers = [_answer(s) for s in socks]
    accepted = [a for a in answers if a == AMQP_HEADER]
    assert len(accepted) >= 3  # the burst
    assert b"" in answers  # the rest, as fast as they came, were reset unanswered
    assert set(answers) <= {AMQP_HEADER, b""}
    refused = answers.count(b"")
    assert exceeded(mport, "connection_rate_per_host") == refused
    for s in socks:
        s.close()
    round_trip(r.port, "q", "other-host")  # from 127.0.0.1: its own bucket

    # the host's bucket refills at one connection a second
    def again() -> bool:
        with socket.create_connection((HOST, r.port), source_address=("127.0.0.3", 0)) as s:
            return _answer(s) == AMQP_HEADER

    retry(again, timeout=10)


def _attaches(peer: SocketPeer, first: int, n: int, prefix: str) -> None:
    """`n` sender links on one connection, in one write (handles first..first+n-1)."""
    peer.send(
        b"".join(
            attach_frame(f"{prefix}-{h}", h, sender=True, address=f"{prefix}.{h}")
            for h in range(first, first + n)
        )
    )


def _answered(peer: SocketPeer, n: int) -> None:
    """The router has answered `n` ATTACHes on `peer` (bounded wait)."""
    peer.wait(lambda f: sum(g.code == ATTACH for g in peer.frames) >= n, timeout=30)


def test_control_rate_per_host(router: Any) -> None:
    """limits.max_control_rate_per_host: the control frames of all of one host's connections
    share one bucket. Two connections whose attaches are each within the burst, but not
    together, meet the limit; the host is read more slowly (the attaches take at least the
    time the rate allows) and every attach is still answered; another host is not counted."""
    mport = free_port()
    r = router(
        extra_args=[
            "--metrics", f"127.0.0.1:{mport}",
            "--limit", "max_control_rate=0",  # the per-connection rate off: only the host's
            "--limit", "max_control_rate_per_host=50",
            "--limit", "control_rate_per_host_burst=200",
        ]
    )  # fmt: skip
    retry(lambda: scrape(mport), timeout=10)
    # another host (127.0.0.5): 2 connections x 60 control frames, within its own burst
    calm = [SocketPeer(r.port, f"calm-{i}", source="127.0.0.5") for i in range(2)]
    for peer in calm:
        _attaches(peer, 0, 60, "calm")
    for peer in calm:
        _answered(peer, 60)
    assert exceeded(mport, "control_rate_per_host") == 0
    assert exceeded(mport, "control_rate") == 0

    # one host (127.0.0.4): 2 connections x 400 attaches; 800 frames at 50/s past a burst of
    # 200 need 12 s less what the last feeds of up to 32 frames (server.CONTROL_BUDGET) each
    # take before they are charged: more than 8 s however fast the machine
    busy = [SocketPeer(r.port, f"busy-{i}", source="127.0.0.4") for i in range(2)]
    start = time.monotonic()
    for peer in busy:
        _attaches(peer, 0, 400, "busy")
    for peer in busy:
        _answered(peer, 400)  # nothing dropped: every attach answered
    elapsed = time.monotonic() - start
    assert exceeded(mport, "control_rate_per_host") > 0
    assert exceeded(mport, "control_rate") == 0
    assert elapsed > 8.0, elapsed  # a lower bound: only a missing limit makes this fail
    assert not any(f.code in (DETACH, CLOSE) for p in busy for f in p.frames)
    round_trip(r.port, "q", "other-host")  # 127.0.0.1: its own bucket, full
    for peer in calm + busy:
        peer.close()
