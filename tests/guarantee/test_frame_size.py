"""Guaranteed-topic deliveries to a subscriber that allows only 512-byte frames (2.7.1,
issue 13 point 6): the router's copies carry 32-byte tags and are split to fit. proton closes
the connection with a framing error on any larger frame; the socketless property test over
512-65,536 is tests/engine/test_frame_size.py."""

from __future__ import annotations

import threading
import time
from typing import Any

from proton import Delivery, Message, Timeout
from proton.utils import BlockingConnection

from tests.guarantee.common import topic_rows
from tests.harness import retry

TOPIC = "events"


def test_exactly_once_copies_fit_a_512_byte_subscriber(router: Any) -> None:
    r = router(addresses={TOPIC: "multicast,exactly-once"})
    sub = BlockingConnection(r.url, timeout=10, max_frame_size=512)
    assert sub.conn.transport.max_frame_size == 512
    receiver = sub.create_receiver(TOPIC, credit=10)
    retry(lambda: [row["subscribers"] for row in topic_rows(r.url)] == [1], timeout=10)
    bodies = ["x" * n for n in (0, 300, 440, 441, 460, 512, 2000, 20000)]
    got: list[str] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        deadline = time.monotonic() + 60
        try:
            while not done.is_set() and time.monotonic() < deadline:
                try:
                    msg = receiver.receive(timeout=0.2)
                except Timeout:
                    continue
                got.append(msg.body)
                receiver.accept()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    pub = BlockingConnection(r.url, timeout=20)
    sender = pub.create_sender(TOPIC)
    # past delivery-id 255 a delivery-id takes 5 bytes instead of 2 (1.6.6 uint, smalluint):
    # the first transfer of a message is then 52 bytes plus payload
    warmup = [f"w{i}" for i in range(260)]
    for body in warmup + bodies:
        assert sender.send(Message(body=body)).remote_state == Delivery.ACCEPTED
    done.set()
    t.join(20)
    assert not errors, errors
    assert got == warmup + bodies
    assert sub.conn.transport.condition is None
    for c in (pub, sub):
        c.close()
