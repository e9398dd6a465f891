"""Anycast (balanced, the default distribution) between proton clients.

A producer and a consumer on the same address: every message reaches exactly
one consumer, and the consumer's outcome (ACCEPTED) reaches the producer,
which only then sees the delivery settled (end-to-end acknowledgement).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from proton import Delivery, Message

from tests.clients import Handler, numbered, pump_until_done, run_container


def test_anycast_blocking(router: Any, blocking: Any) -> None:
    r = router()
    receiver = blocking(r.url).create_receiver("anycast/blocking", credit=10)
    sender = blocking(r.url).create_sender("anycast/blocking")
    # BlockingSender.send() returns once the router settles the delivery,
    # which it may do only after the consumer's outcome: so the producer runs
    # in a thread and the consumer here.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: [sender.send(numbered(i), timeout=10) for i in range(10)])
        got = []
        for _ in range(10):
            got.append(receiver.receive(timeout=10).body)
            receiver.accept()
        deliveries = pump_until_done(receiver.connection, future, 20)
    assert got == list(range(10))
    assert [d.remote_state for d in deliveries] == [Delivery.ACCEPTED] * 10


def test_anycast_blocking_send_waits_for_outcome(router: Any, blocking: Any) -> None:
    r = router()
    receiver = blocking(r.url).create_receiver("anycast/one", credit=5)
    sender = blocking(r.url).create_sender("anycast/one")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="hello"), 15)
        msg = receiver.receive(timeout=10)
        assert msg.body == "hello"
        # The consumer holds the delivery unsettled: the producer's send()
        # (pumping its connection meanwhile) must not complete yet.
        time.sleep(0.5)
        assert not future.done(), "router settled the delivery before the consumer's outcome"
        receiver.accept()
        delivery = pump_until_done(receiver.connection, future)
    assert delivery.remote_state == Delivery.ACCEPTED


class AnycastPair(Handler):
    """One producer, one consumer, on one container; 1000 unsettled messages."""

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__(prefetch=100)
        self.url, self.address, self.count = url, address, count
        self.sent = self.accepted = 0
        self.received: list[int] = []
        self.sender: Any = None

    def progress(self) -> str:
        return f"sent={self.sent} received={len(self.received)} accepted={self.accepted}"

    def on_start(self, event: Any) -> None:
        rconn = self.connect(event.container, self.url)
        event.container.create_receiver(rconn, self.address)

    def on_link_opened(self, event: Any) -> None:
        # Attach the producer only once the consumer is known to the router.
        if event.receiver and self.sender is None:
            sconn = self.connect(event.container, self.url)
            self.sender = event.container.create_sender(sconn, self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(numbered(self.sent))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        self.received.append(event.message.body)

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            self.done()

    def on_rejected(self, event: Any) -> None:
        self.fail(f"delivery rejected: {event.delivery.remote.condition}")

    def on_released(self, event: Any) -> None:
        self.fail(f"delivery released/modified (state {event.delivery.remote_state})")


def test_anycast_container(router: Any) -> None:
    r = router()
    h = run_container(AnycastPair(r.url, "anycast/container", 1000), timeout=30)
    assert h.received == list(range(1000))
    assert h.accepted == 1000


class Balanced(Handler):
    """Two consumers on one balanced address.

    Consumers keep every delivery unsettled until all messages have arrived,
    so the router sees the first consumer's outstanding deliveries grow and
    must use the second (both have credit for every message, so a share for
    both comes from the balancing rule, not from running out of credit).
    """

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.count = url, address, count
        self.receivers: list[Any] = []
        self.opened = 0
        self.by_receiver: dict[str, list[int]] = {}
        self.deliveries: list[Any] = []
        self.sender: Any = None
        self.sent = self.accepted = 0

    def progress(self) -> str:
        shares = {k: len(v) for k, v in self.by_receiver.items()}
        return f"sent={self.sent} shares={shares} accepted={self.accepted}"

    def on_start(self, event: Any) -> None:
        for i in range(2):
            conn = self.connect(event.container, self.url)
            rcv = event.container.create_receiver(conn, self.address, name=f"consumer-{i}")
            rcv.flow(self.count)
            self.receivers.append(rcv)
            self.by_receiver[rcv.name] = []

    def on_link_opened(self, event: Any) -> None:
        if event.receiver:
            self.opened += 1
            if self.opened == 2:
                conn = self.connect(event.container, self.url)
                self.sender = event.container.create_sender(conn, self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(numbered(self.sent))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        self.by_receiver[event.receiver.name].append(event.message.body)
        self.deliveries.append(event.delivery)
        if len(self.deliveries) == self.count:
            for d in self.deliveries:
                d.update(Delivery.ACCEPTED)
                d.settle()

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            self.done()


def test_balanced_two_receivers_both_get_a_share(router: Any) -> None:
    r = router()  # default distribution: balanced
    h = run_container(Balanced(r.url, "balanced/work", 100), timeout=30)
    shares = [sorted(v) for v in h.by_receiver.values()]
    assert all(len(s) > 0 for s in shares), f"one consumer got nothing: {h.progress()}"
    everything = sorted(shares[0] + shares[1])
    assert everything == list(range(100)), "loss or duplicate across the two consumers"
