"""Backpressure (issue 13): a consumer that grants a million credit and stops reading its
socket must not make the router buffer everything a producer sends. Above the connection's
write-buffer high-water mark the router stops moving deliveries onto it and stops topping up
the producers that feed it (qrouter/_fast/backpressure.pxi); when the consumer reads again
every message arrives, in order. Real router processes, a raw-socket consumer, proton
producers."""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Message
from proton.reactor import AtMostOnce

from tests.clients import ThreadedRun
from tests.harness import free_port, retry
from tests.management.tooling import ok, scrape, value
from tests.stalled import Producer, RawConsumer, rss_kib, wait_stalled

N = 60_000  # messages
SIZE = 4096  # bytes of body each: 234 MiB in all
RSS_BOUND_KIB = 64 * 1024  # the router may grow by at most this while the consumer stalls


def stall_and_drain(
    routers: list[Any],
    producer_url: str,
    consumer_port: int,
    address: str,
    *,
    settled: bool,
    anonymous: bool = False,
) -> dict[str, tuple[int, int]]:
    """The stalled-consumer run: returns {router name: (VmRSS KiB before, after)}, measured
    before the producer starts and once it has stalled; then the consumer reads everything."""
    consumer = RawConsumer(consumer_port, address)
    before = {r.name: rss_kib(r.pid) for r in routers}
    producer = Producer(producer_url, address, N, SIZE, settled=settled, anonymous=anonymous)
    run = ThreadedRun(producer, timeout=600)
    h: Producer = run.handler  # type: ignore[assignment]
    run.start()
    try:
        wait_stalled(h, quiet=1.5, timeout=60)
        after = {r.name: rss_kib(r.pid) for r in routers}
        rss = {name: (before[name], after[name]) for name in before}
        for name, (b, a) in rss.items():
            print(
                f"\n{name}: VmRSS {b / 1024:.1f} MiB -> {a / 1024:.1f} MiB (+{(a - b) / 1024:.1f})"
            )
        print(f"producer stalled after {h.sent} of {N} messages")
        assert h.sent < N, "the producer was never held back"
        assert not h.errors, h.errors
        for name, (b, a) in rss.items():
            assert a - b <= RSS_BOUND_KIB, f"{name} grew by {(a - b) / 1024:.1f} MiB"
        consumer.resume()
        retry(
            lambda: consumer.received >= N or bool(consumer.errors) or bool(h.errors),
            timeout=240,
            message=lambda: f"consumer got {consumer.received}; producer {h.progress()}",
        )
        assert not consumer.errors, consumer.errors
        assert not h.errors, h.errors
        assert consumer.received == N and consumer.next_expected == N
        if not settled:
            retry(lambda: h.accepted == N, timeout=60, message=h.progress)
        time.sleep(0.2)
        assert consumer.received == N  # nothing twice
        return rss
    finally:
        h.finish()
        run.join(30)
        consumer.close()


@pytest.mark.timeout(400)
def test_stalled_consumer_presettled(router: Any) -> None:
    """The issue's case: 1,000,000 credit, socket not read, 60,000 x 4 KiB presettled."""
    port = free_port()
    r = router(extra_args=["--metrics", f"127.0.0.1:{port}"])
    consumer_rows: list[dict[str, Any]] = []

    def check_paused() -> None:
        # $management and /metrics show the paused connection (one row: the consumer's)
        rows = ok("connections", "--url", r.url, "--json").json()
        consumer_rows[:] = [row for row in rows if row["container"] == "stalled-consumer"]

    consumer = RawConsumer(r.port, "bp.stalled")
    run = ThreadedRun(Producer(r.url, "bp.stalled", 5000, SIZE, settled=True), timeout=120)
    h: Producer = run.handler  # type: ignore[assignment]
    run.start()
    try:
        wait_stalled(h, quiet=1.0, timeout=60)
        check_paused()
        assert consumer_rows and consumer_rows[0]["write_paused"] is True, consumer_rows
        assert consumer_rows[0]["write_pauses"] >= 1
        samples = scrape(port)
        assert value(samples, "qrouter_connections_write_paused") == 1
        assert value(samples, "qrouter_connection_write_pauses_total") >= 1
    finally:
        h.finish()
        run.join(30)
        consumer.close()
    stall_and_drain([r], r.url, r.port, "bp.presettled", settled=True)


@pytest.mark.timeout(400)
def test_stalled_consumer_unsettled(router: Any) -> None:
    """The same with an unsettled producer: every message is accepted in the end."""
    r = router()
    stall_and_drain([r], r.url, r.port, "bp.unsettled", settled=False)


@pytest.mark.timeout(400)
def test_stalled_consumer_anonymous_relay(router: Any) -> None:
    """The same through the anonymous relay (a null target, `to` in each message): the
    producer's credit is not topped up while the address it sends to has no room."""
    r = router()
    stall_and_drain([r], r.url, r.port, "bp.anon", settled=True, anonymous=True)


@pytest.mark.timeout(300)
def test_other_address_flows_while_a_consumer_stalls(router: Any, blocking: Any) -> None:
    """A stalled consumer holds back its own producers only: another pair on the same router
    keeps exchanging messages."""
    r = router()
    consumer = RawConsumer(r.port, "bp.stuck")
    run = ThreadedRun(Producer(r.url, "bp.stuck", N, SIZE, settled=True), timeout=120)
    h: Producer = run.handler  # type: ignore[assignment]
    run.start()
    try:
        wait_stalled(h, quiet=1.0, timeout=60)
        stalled_at = h.sent
        conn = blocking(r.url)
        rcv = conn.create_receiver("bp.free", credit=100)
        snd = conn.create_sender("bp.free", options=AtMostOnce())  # send() does not wait
        for i in range(500):
            snd.send(Message(body=i), timeout=10)
            m = rcv.receive(timeout=10)
            assert m.body == i
        assert h.sent == stalled_at  # still held back meanwhile
        assert not h.errors, h.errors
    finally:
        h.finish()
        run.join(30)
        consumer.close()
