"""Anycast credit is proxied from consumers (DESIGN.md §4, issue 2).

With no consumer on its address a producer gets no credit at all (it is
blocked, not fed and then RELEASED); once a consumer attaches and grants
credit, the producer gets some and its messages flow.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest
from proton import Delivery, Message, Timeout

from tests.clients import Handler, pump_until_done, run_container

NO_CREDIT_WINDOW = 2.0


def test_no_credit_without_consumer_then_credit_blocking(router: Any, blocking: Any) -> None:
    r = router()
    sconn = blocking(r.url)
    sender = sconn.create_sender("credit/blocking")
    # The attach must complete (the router answers ATTACH) but grant nothing.
    with pytest.raises(Timeout):
        sconn.wait(lambda: sender.link.credit > 0, timeout=NO_CREDIT_WINDOW)
    assert sender.link.credit == 0

    receiver = blocking(r.url).create_receiver("credit/blocking", credit=10)
    sconn.wait(lambda: sender.link.credit > 0, timeout=10, msg="credit after a consumer attached")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="now"), 10)
        assert receiver.receive(timeout=10).body == "now"
        receiver.accept()
        assert pump_until_done(receiver.connection, future).remote_state == Delivery.ACCEPTED


class CreditWatcher(Handler):
    """A producer alone for NO_CREDIT_WINDOW seconds, then a consumer joins."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__(prefetch=10)
        self.url, self.address = url, address
        self.sender: Any = None
        self.credit_before: list[int] = []
        self.sender_opened_at: float | None = None
        self.consumer_at: float | None = None
        self.credit_at: float | None = None
        self.received: list[str] = []

    def progress(self) -> str:
        return (
            f"credit samples before consumer={self.credit_before} consumer_at={self.consumer_at} "
            f"credit_at={self.credit_at} received={self.received}"
        )

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        self.sender = event.container.create_sender(conn, self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.sender is not None and self.sender_opened_at is None:
            self.sender_opened_at = time.monotonic()
            event.container.schedule(NO_CREDIT_WINDOW, self)

    def on_timer_task(self, event: Any) -> None:
        # Only reached once: then attach the consumer.
        self.credit_before.append(self.sender.credit)
        self.consumer_at = time.monotonic()
        conn = self.connect(event.container, self.url)
        event.container.create_receiver(conn, self.address)

    def on_link_flow(self, event: Any) -> None:
        if event.sender is not None and self.consumer_at is None:
            self.credit_before.append(event.sender.credit)

    def on_sendable(self, event: Any) -> None:
        if self.consumer_at is None:
            self.credit_before.append(event.sender.credit)
            return
        if self.credit_at is None:
            self.credit_at = time.monotonic()
            event.sender.send(Message(body="after"))

    def on_message(self, event: Any) -> None:
        self.received.append(event.message.body)

    def on_accepted(self, event: Any) -> None:
        self.done()


def test_no_credit_without_consumer_then_credit_container(router: Any) -> None:
    r = router()
    h = run_container(CreditWatcher(r.url, "credit/container"), timeout=20)
    assert h.credit_before and all(c == 0 for c in h.credit_before), (
        f"producer got credit with no consumer: {h.credit_before}"
    )
    assert h.received == ["after"]


def test_two_producers_share_one_consumer(router: Any, blocking: Any) -> None:
    """Credit proxied from one consumer must reach every producer on the
    address, not only the first to attach (an RPC reply address has one
    consumer and a producer per server that answers; oslo.messaging hits
    this). The first producer keeps its credit after sending."""
    r = router()
    receiver = blocking(r.url).create_receiver("credit/shared", credit=20)
    a_conn, b_conn = blocking(r.url), blocking(r.url)
    a = a_conn.create_sender("credit/shared")
    a_conn.wait(lambda: a.link.credit > 0, timeout=5, msg="credit for the first producer")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(a.send, Message(body="from a"), 10)
        assert receiver.receive(timeout=10).body == "from a"
        receiver.accept()
        pump_until_done(receiver.connection, future)
    b = b_conn.create_sender("credit/shared")
    b_conn.wait(lambda: b.link.credit > 0, timeout=5, msg="credit for the second producer")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        fa = pool.submit(a.send, Message(body="a again"), 10)
        fb = pool.submit(b.send, Message(body="from b"), 10)
        got = set()
        for _ in range(2):
            got.add(receiver.receive(timeout=10).body)
            receiver.accept()
        pump_until_done(receiver.connection, fa)
        pump_until_done(receiver.connection, fb)
    assert got == {"a again", "from b"}
