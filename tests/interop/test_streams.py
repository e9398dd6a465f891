"""Long streams: nothing lost, nothing duplicated, order kept.

* 100,000 unsettled messages, consumer credit 500: each accepted once, in order.
* 100,000 presettled (at-most-once) messages into a slow consumer that grants
  little credit and stalls now and then: the router must throttle the
  producer by credit (issue 2: "never silently dropped while the router
  runs") so the consumer still gets all of them, in order.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Message
from proton.reactor import AtMostOnce

from tests.clients import Handler, ThreadedRun, run_container
from tests.harness import retry

COUNT = 100_000
LINK_CAPACITY = 100


class SequenceCheck:
    """Counts messages carrying body = 0, 1, 2, ... and notes any gap/duplicate."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.expected = 0
        self.seen = bytearray(count)
        self.duplicates = 0
        self.out_of_order = 0
        self.received = 0

    def add(self, seq: int) -> None:
        self.received += 1
        if seq != self.expected:
            self.out_of_order += 1
        self.expected = seq + 1
        if self.seen[seq]:
            self.duplicates += 1
        self.seen[seq] = 1

    @property
    def complete(self) -> bool:
        return self.received >= self.count

    def missing(self) -> int:
        return self.count - sum(self.seen)

    def __repr__(self) -> str:
        return (
            f"received={self.received} missing={self.missing()} duplicates={self.duplicates} "
            f"out_of_order={self.out_of_order}"
        )


class OrderedStream(Handler):
    def __init__(self, url: str, address: str, count: int, credit: int) -> None:
        super().__init__(prefetch=credit)
        self.url, self.address, self.count = url, address, count
        self.check = SequenceCheck(count)
        self.sender: Any = None
        self.sent = self.accepted = self.other = 0
        self.body = b"x" * 100

    def progress(self) -> str:
        return f"sent={self.sent} accepted={self.accepted} other outcomes={self.other} {self.check}"

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        event.container.create_receiver(conn, self.address, name="stream-in")

    def on_link_opened(self, event: Any) -> None:
        if event.receiver and self.sender is None:
            conn = self.connect(event.container, self.url)
            self.sender = event.container.create_sender(conn, self.address, name="stream-out")

    def on_sendable(self, event: Any) -> None:
        snd = event.sender
        while snd.credit and self.sent < self.count:
            snd.send(Message(body=self.sent, properties={"pad": self.body}))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        self.check.add(event.message.body)

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            self.done()

    def on_rejected(self, event: Any) -> None:
        self.other += 1

    def on_released(self, event: Any) -> None:
        self.other += 1


@pytest.mark.timeout(150)
def test_100k_ordered_unsettled_stream(router: Any) -> None:
    r = router()
    h = run_container(OrderedStream(r.url, "stream/ordered", COUNT, credit=500), timeout=120)
    assert h.check.complete and h.check.missing() == 0, h.progress()
    assert h.check.duplicates == 0 and h.check.out_of_order == 0, h.progress()
    assert h.accepted == COUNT and h.other == 0, h.progress()


class SlowConsumer(Handler):
    """Grants `window` credit at a time, and stalls every now and then."""

    def __init__(self, url: str, address: str, count: int, window: int) -> None:
        super().__init__(prefetch=0)
        self.url, self.address, self.window = url, address, window
        self.check = SequenceCheck(count)
        self.ready = False
        self.complete = False
        self.unsettled_arrivals = 0

    def progress(self) -> str:
        return f"consumer {self.check} unsettled arrivals={self.unsettled_arrivals}"

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        rcv = event.container.create_receiver(conn, self.address, name="slow-in")
        rcv.flow(self.window)

    def on_link_opened(self, event: Any) -> None:
        self.ready = True

    def on_message(self, event: Any) -> None:
        if not event.delivery.settled:
            self.unsettled_arrivals += 1
        self.check.add(event.message.body)
        n = self.check.received
        if n % 2_000 == 0:
            time.sleep(0.02)  # a slow consumer ...
        if n in (20_000, 60_000):
            time.sleep(0.5)  # ... with a couple of long stalls
        rcv = event.receiver
        if rcv.credit < self.window // 2:
            rcv.flow(self.window - rcv.credit)
        if self.check.complete:
            self.complete = True
            self.done()


class PresettledProducer(Handler):
    def __init__(self, url: str, address: str, count: int, consumer: SlowConsumer) -> None:
        super().__init__(prefetch=0)
        self.url, self.address, self.count, self.consumer = url, address, count, consumer
        self.sent = 0
        self.max_credit = 0

    def progress(self) -> str:
        return f"producer sent={self.sent} max credit seen={self.max_credit}; {self.consumer.progress()}"

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        event.container.create_sender(
            conn, self.address, name="presettled-out", options=AtMostOnce()
        )
        event.container.schedule(0.1, self)

    def on_sendable(self, event: Any) -> None:
        snd = event.sender
        self.max_credit = max(self.max_credit, snd.credit)
        while snd.credit and self.sent < self.count:
            dlv = snd.send(Message(body=self.sent))
            dlv.settle()
            self.sent += 1

    def on_timer_task(self, event: Any) -> None:
        # Stay connected until the consumer has everything: presettled
        # messages the router holds must not depend on the producer leaving.
        if self.consumer.complete or self.consumer.finished:  # finished: failed or timed out
            self.done()
        else:
            event.container.schedule(0.1, self)


@pytest.mark.timeout(180)
def test_100k_presettled_into_slow_consumer_zero_loss(router: Any) -> None:
    # link_capacity: the most credit the router may grant one producer link
    r = router(config={"link_capacity": LINK_CAPACITY})
    consumer = SlowConsumer(r.url, "stream/presettled", COUNT, window=20)
    crun = ThreadedRun(consumer, timeout=150).start()
    retry(lambda: consumer.ready or not crun.thread.is_alive(), timeout=10)
    assert consumer.ready, f"consumer did not attach: {consumer.errors}"
    producer = PresettledProducer(r.url, "stream/presettled", COUNT, consumer)
    run_container(producer, timeout=150)
    crun.join()
    check = consumer.check
    assert producer.sent == COUNT
    assert check.complete and check.missing() == 0, producer.progress()
    assert check.duplicates == 0 and check.out_of_order == 0, producer.progress()
    assert consumer.unsettled_arrivals == 0, "presettled messages arrived unsettled"
    # issue 2: "credit per producer stays bounded"
    assert 0 < producer.max_credit <= LINK_CAPACITY, producer.progress()
