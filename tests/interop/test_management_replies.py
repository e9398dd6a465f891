"""`$management` replies to a requester that never reads them are bounded
(qrouter/management_replies.py): a raw-socket client attaches a reply receiver with a million
credit and a `$management` sender, then sends requests as fast as the router's credit
renewal would allow and never reads its socket. The router holds at most 100 replies for it
(then stops renewing its credit and REJECTs what still arrives), its RSS stays bounded, and
other clients' traffic and management requests go on."""

from __future__ import annotations

import socket
import time
from typing import Any

from proton import Message
from proton.reactor import AtMostOnce
from qrouter._fast.codec import UInt

from tests.engine.pump import (
    AMQP_HEADER,
    ATTACH,
    FLOW,
    attach_frame,
    begin_frame,
    message_bytes,
    open_frame,
    perf,
    transfer_frame,
)
from tests.harness import HOST, free_port, retry
from tests.management.tooling import scrape, value
from tests.stalled import rss_kib

REQUESTS = 20_000  # each answered with the GET-ATTRIBUTES table (~5 KB): ~100 MB of replies
# ~100 held replies and a 1 MiB write buffer, plus the allocator's arenas from decoding the
# requests the router did read: measured +9 to +17 MiB on one machine. Unbounded holding of
# the 20,000 replies would be ~100 MB, so 32 MiB still fails such a router threefold.
RSS_BOUND_KIB = 32 * 1024


def _read_until_attached(sock: socket.socket, handles: int) -> None:
    """Read frames until the router has answered `handles` ATTACHes (then read no more)."""
    from qrouter._fast.codec import decode

    buf = b""
    seen = 0
    deadline = time.monotonic() + 10
    while seen < handles:
        assert time.monotonic() < deadline, "the router did not answer the ATTACHes"
        data = sock.recv(65536)
        assert data, "the router closed the connection"
        buf += data
        while True:
            if buf.startswith(b"AMQP") and len(buf) >= 8:
                buf = buf[8:]
                continue
            if len(buf) < 8 or len(buf) < int.from_bytes(buf[:4], "big"):
                break
            size = int.from_bytes(buf[:4], "big")
            body, buf = buf[8:size], buf[size:]
            if body:
                performative, _ = decode(body)
                seen += int(performative.descriptor) == ATTACH


def _flood(sock: socket.socket, reply_to: str) -> int:
    """Send up to REQUESTS requests, never reading; returns how many the socket took."""
    sock.sendall(
        AMQP_HEADER
        + open_frame("never-reads", max_frame_size=UInt(65536))
        + begin_frame()
        + attach_frame("replies", 0, sender=False, address=reply_to)
        + perf(
            FLOW,
            next_incoming_id=UInt(0),
            incoming_window=UInt(0x7FFFFFFF),
            next_outgoing_id=UInt(0),
            outgoing_window=UInt(0x7FFFFFFF),
            handle=UInt(0),
            delivery_count=UInt(0),
            link_credit=UInt(1_000_000),
        )
        + attach_frame("requests", 1, sender=True, address="$management")
    )
    _read_until_attached(sock, 2)
    sent = 0
    try:
        for i in range(REQUESTS):
            payload = message_bytes(
                reply_to=reply_to,
                id=f"req-{i}",
                properties={"operation": "GET-ATTRIBUTES", "type": "org.amqp.management"},
            )
            sock.sendall(transfer_frame(1, i, str(i).encode(), payload))
            sent += 1
    except OSError:  # the router closed the connection: the client broke the credit rules
        pass
    return sent


def _flood_and_measure(r: Any, mport: int, reply_to: str) -> tuple[socket.socket, float]:
    """Flood router `r` (metrics on `mport`) with requests whose replies go to `reply_to`,
    never read, until it reads no more; checks it answered fewer than all and stayed within
    RSS_BOUND_KIB. Returns the open socket and the requests REJECTed at the bound."""
    retry(lambda: scrape(mport), timeout=10, message="/metrics never answered")
    before = rss_kib(r.pid)
    sock = socket.create_connection((HOST, r.port), timeout=10)  # open until the end
    sent = _flood(sock, reply_to)
    seen: list[float] = []

    def settled_down() -> bool:  # the router has read what it will read
        seen.append(value(scrape(mport), "qrouter_management_requests_total"))
        return len(seen) >= 3 and seen[-1] == seen[-3]

    retry(settled_down, timeout=60, delay=0.5, message="requests kept arriving")
    after = rss_kib(r.pid)
    metrics = scrape(mport)
    handled = value(metrics, "qrouter_management_requests_total")
    refused = value(metrics, "qrouter_management_replies_refused_total")
    print(
        f"\n{sent} requests sent, {handled:.0f} reached the node, {refused:.0f} REJECTED; "
        f"VmRSS {before / 1024:.1f} -> {after / 1024:.1f} MiB (+{(after - before) / 1024:.1f})"
    )
    assert handled < REQUESTS, "every request was answered: no bound"
    assert after - before <= RSS_BOUND_KIB, f"the router grew by {(after - before) / 1024:.1f} MiB"
    r.check_running()
    return sock, refused


def test_replies_to_a_requester_that_never_reads_are_bounded(router: Any, blocking: Any) -> None:
    mport = free_port()
    r = router(extra_args=["--metrics", f"127.0.0.1:{mport}"])
    sock, refused = _flood_and_measure(r, mport, "replies-never-read")

    # another client is not disturbed: messages flow and its management requests are answered
    conn = blocking(r.url)
    rcv = conn.create_receiver("other/q", credit=10)
    snd = conn.create_sender("other/q", options=AtMostOnce())
    snd.send(Message(body="still flowing"), timeout=10)
    assert rcv.receive(timeout=10).body == "still flowing"
    replies = conn.create_receiver(None, dynamic=True, credit=10)
    mgmt = conn.create_sender("$management")
    mgmt.send(
        Message(
            reply_to=replies.remote_source.address,
            id="other",
            properties={"operation": "READ", "type": "org.qrouter.router", "name": "router"},
        ),
        timeout=10,
    )
    answer = replies.receive(timeout=10)
    assert answer.properties["statusCode"] == 200
    assert answer.body["management_replies_refused"] == refused
    sock.close()


def test_replies_are_bounded_when_the_transport_never_pauses(router: Any) -> None:
    """The bound does not rest on the transport's pause alone: with a write buffer limit
    no flood reaches (512 MiB), replies waiting in the router's own output or the
    transport's buffer for the reply consumer's connection still stop the requester's
    credit. (A clean-clone CI once saw all 20,000 requests answered and +254 MiB before the
    transport paused.)"""
    mport = free_port()
    r = router(
        extra_args=["--metrics", f"127.0.0.1:{mport}", "--write-buffer-high", str(512 << 20)]
    )
    sock, _ = _flood_and_measure(r, mport, "replies-unpaused")
    sock.close()
