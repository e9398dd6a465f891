"""Exactly-once links: receiver-settle-mode second, honoured end to end.

AMQP 1.0 §2.8.3 / §3.4: with rcv-settle-mode `second` the receiver sends its
outcome unsettled and settles only after the sender has settled. Through the
router: the consumer ACCEPTs without settling; the producer sees ACCEPTED while
the delivery is still unsettled at the router, settles it; the router then
settles toward the consumer, which sees the settlement.

The router grants a producer *second* only for a target with durable
unsettled-state (docs/client.md, "Settlement modes"): a producer asking for it
on a terminus that dies with its link gets *first*, a settled outcome.
"""

from __future__ import annotations

from typing import Any

from proton import Delivery, Link

from tests.clients import (
    DurableTarget,
    Handler,
    RcvSettleSecond,
    SndUnsettled,
    numbered,
    run_container,
)

COUNT = 100


class ExactlyOnce(Handler):
    def __init__(self, url: str, address: str, count: int, durable: bool = True) -> None:
        super().__init__(prefetch=20, auto_accept=False, auto_settle=False)
        self.url, self.address, self.count = url, address, count
        self.durable = durable
        self.sender: Any = None
        self.receiver: Any = None
        self.sent = 0
        self.received: list[int] = []
        self.accepted_unsettled = (
            0  # ACCEPTED seen by the producer with the router's side unsettled
        )
        self.settled_early = 0  # ACCEPTED arrived already settled: mode second not honoured
        self.consumer_saw_settle = 0
        self.not_accepted = 0

    def progress(self) -> str:
        return (
            f"sent={self.sent} received={len(self.received)} accepted(unsettled)={self.accepted_unsettled} "
            f"settled early={self.settled_early} consumer saw settlement={self.consumer_saw_settle}"
        )

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        self.receiver = event.container.create_receiver(
            conn, self.address, name="eo-in", options=[RcvSettleSecond()]
        )

    def on_link_opened(self, event: Any) -> None:
        if event.receiver and self.sender is None:
            conn = self.connect(event.container, self.url)
            options = [SndUnsettled(), RcvSettleSecond()]
            if self.durable:
                options.append(DurableTarget())
            self.sender = event.container.create_sender(
                conn, self.address, name="eo-out", options=options
            )

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(numbered(self.sent))
            self.sent += 1

    # consumer side -------------------------------------------------------
    def on_message(self, event: Any) -> None:
        self.received.append(event.message.body)
        # outcome now, settlement only once the router settles (mode second)
        event.delivery.update(Delivery.ACCEPTED)

    def on_settled(self, event: Any) -> None:
        d = event.delivery
        if event.receiver is not None:
            self.consumer_saw_settle += 1
            d.settle()
            self._check()

    # producer side --------------------------------------------------------
    def on_accepted(self, event: Any) -> None:
        d = event.delivery
        if d.settled:
            self.settled_early += 1
        else:
            self.accepted_unsettled += 1
        d.settle()  # the producer settles first (§2.8.3)
        self._check()

    def on_rejected(self, event: Any) -> None:
        self.not_accepted += 1
        event.delivery.settle()

    def on_released(self, event: Any) -> None:
        self.not_accepted += 1
        event.delivery.settle()

    def _check(self) -> None:
        if self.accepted_unsettled + self.settled_early + self.not_accepted == self.count and (
            self.consumer_saw_settle == self.count
        ):
            self.done()


def test_exactly_once_link_end_to_end(router: Any) -> None:
    r = router()
    h = run_container(ExactlyOnce(r.url, "eo/orders", COUNT), timeout=30)
    assert h.sender.remote_rcv_settle_mode == Link.RCV_SECOND, (
        "router did not take rcv-settle-mode second"
    )
    assert h.received == list(range(COUNT)), "each message exactly once, in order"
    assert h.not_accepted == 0
    assert h.settled_early == 0, (
        "router settled before the producer (rcv-settle-mode second broken)"
    )
    assert h.accepted_unsettled == COUNT
    assert h.consumer_saw_settle == COUNT, "producer's settlement did not reach the consumer"


def test_second_refused_for_a_terminus_that_cannot_resume(router: Any) -> None:
    """A producer asking for *second* on a non-durable target (as uAMQP's senders do) is
    granted *first* (2.7.3): its outcomes arrive settled and nothing waits on it to settle."""
    r = router()
    h = run_container(ExactlyOnce(r.url, "eo/plain", COUNT, durable=False), timeout=30)
    assert h.sender.remote_rcv_settle_mode == Link.RCV_FIRST
    assert h.received == list(range(COUNT))
    assert h.not_accepted == 0
    assert h.settled_early == COUNT, "outcomes must arrive settled under mode first"
    assert h.consumer_saw_settle == COUNT
