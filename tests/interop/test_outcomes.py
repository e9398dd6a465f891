"""A consumer's explicit outcome reaches the producer (AMQP 1.0 §3.4).

The consumer rejects (with an error condition), releases, or modifies
(delivery-failed, undeliverable-here); the producer sees that outcome, with
its fields, on its own delivery, and only then is the delivery settled.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from proton import Condition, Delivery, Message
from proton.utils import SendException

from tests.clients import Handler, outcome_name, pump_until_done, run_container, settle_with

PLAN = ["accept", "reject", "release", "modify", "accept", "modify", "release", "reject"]


class Outcomes(Handler):
    """The consumer settles message i with PLAN[i]; the producer records what it sees."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__(prefetch=10, auto_accept=False)
        self.url, self.address = url, address
        self.sender: Any = None
        self.sent = 0
        self.seen: dict[int, tuple[int, Any, bool, bool]] = {}

    def progress(self) -> str:
        return (
            f"sent={self.sent} outcomes={ {k: outcome_name(v[0]) for k, v in self.seen.items()} }"
        )

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        event.container.create_receiver(conn, self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver and self.sender is None:
            conn = self.connect(event.container, self.url)
            self.sender = event.container.create_sender(conn, self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < len(PLAN):
            event.sender.send(Message(body=PLAN[self.sent], properties={"i": self.sent}))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        cond = Condition(
            "test:bad-message",
            "rejected by the test consumer",
            {"i": event.message.properties["i"]},
        )
        settle_with(event.delivery, event.message.body, cond)

    def on_delivery(self, event: Any) -> None:
        # Runs before proton's own delivery handlers (which call on_message
        # for the receiver and auto-settle for the sender).
        if not event.sender:
            return
        d = event.delivery
        if d.settled:
            i = self.sent_index(d)
            self.seen[i] = (
                d.remote_state,
                d.remote.condition,
                d.remote.failed,
                d.remote.undeliverable,
            )
            if len(self.seen) == len(PLAN):
                self.done()

    def sent_index(self, d: Any) -> int:
        # proton's default delivery tags are "1", "2", ... in send order
        return int(d.tag) - 1


def test_reject_release_modify_reach_the_sender(router: Any) -> None:
    r = router()
    h = run_container(Outcomes(r.url, "outcomes/container"), timeout=30)
    expected = {
        "accept": "ACCEPTED",
        "reject": "REJECTED",
        "release": "RELEASED",
        "modify": "MODIFIED",
    }
    got = [outcome_name(h.seen[i][0]) for i in range(len(PLAN))]
    assert got == [expected[p] for p in PLAN]
    for i, plan in enumerate(PLAN):
        state, cond, failed, undeliverable = h.seen[i]
        if plan == "reject":
            # §3.4.2 rejected carries the consumer's error
            assert cond is not None and cond.name == "test:bad-message", (
                f"message {i}: condition {cond}"
            )
            assert cond.description == "rejected by the test consumer"
        if plan == "modify":
            # §3.4.5 modified: delivery-failed / undeliverable-here as the consumer set them
            assert failed and undeliverable, (
                f"message {i}: failed={failed} undeliverable={undeliverable}"
            )


@pytest.mark.parametrize(
    ("action", "state"),
    [("reject", Delivery.REJECTED), ("release", Delivery.RELEASED), ("modify", Delivery.MODIFIED)],
    ids=["reject", "release", "modify"],
)
def test_blocking_sender_sees_outcome(router: Any, blocking: Any, action: str, state: int) -> None:
    """BlockingSender.send() in one thread, BlockingReceiver in this one."""
    r = router()
    receiver = blocking(r.url).create_receiver("outcomes/blocking", credit=1)
    sender = blocking(r.url).create_sender("outcomes/blocking")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body=action), 15, [])
        msg = receiver.receive(timeout=10)
        assert msg.body == action
        if action == "reject":
            receiver.reject()
        elif action == "release":
            receiver.release(delivered=False)  # RELEASED
        else:
            receiver.release(delivered=True)  # MODIFIED
        delivery = pump_until_done(receiver.connection, future, 20)
    assert outcome_name(delivery.remote_state) == outcome_name(state)


def test_blocking_send_raises_on_reject(router: Any, blocking: Any) -> None:
    r = router()
    receiver = blocking(r.url).create_receiver("outcomes/raise", credit=1)
    sender = blocking(r.url).create_sender("outcomes/raise")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="x"), 15)
        receiver.receive(timeout=10)
        receiver.reject()
        with pytest.raises(SendException) as info:
            pump_until_done(receiver.connection, future, 20)
    assert info.value.state == Delivery.REJECTED
