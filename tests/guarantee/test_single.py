"""A guaranteed topic on one router: python-qpid-proton clients take part as
docs/exactly-once.md says (no resumption), and a router restart on a durable store keeps the
topic's records (issue 5)."""

from __future__ import annotations

import threading
import time
from typing import Any

from proton import Delivery, Message, Timeout
from proton.utils import BlockingConnection

from tests.guarantee.common import topic_rows
from tests.harness import retry

TOPIC = "events"


def test_proton_publisher_and_subscribers_exactly_once(router: Any) -> None:
    r = router(addresses={TOPIC: "multicast,exactly-once"})
    n = 50
    subs = [BlockingConnection(r.url, timeout=10) for _ in range(2)]
    receivers = [c.create_receiver(TOPIC, credit=10) for c in subs]
    retry(
        lambda: [row["subscribers"] for row in topic_rows(r.url)] == [2],
        timeout=10,
        message=lambda: f"topics: {topic_rows(r.url)}",
    )
    got: list[list[str]] = [[], []]
    errors: list[BaseException] = []
    done = threading.Event()

    def consume(i: int) -> None:
        # receive() also does the connection's I/O (the dispositions of accept()): keep
        # calling it until the publisher is done
        deadline = time.monotonic() + 30
        try:
            while not done.is_set() and time.monotonic() < deadline:
                try:
                    msg = receivers[i].receive(timeout=0.2)
                except Timeout:
                    continue
                got[i].append(msg.body)
                receivers[i].accept()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    pub = BlockingConnection(r.url, timeout=20)
    sender = pub.create_sender(TOPIC)
    for i in range(n):
        # blocks until the router's outcome: ACCEPTED once both subscribers accepted
        delivery = sender.send(Message(body=f"m{i}"))
        assert delivery.remote_state == Delivery.ACCEPTED
    done.set()
    for t in threads:
        t.join(20)
    assert not errors, errors
    assert got == [[f"m{i}" for i in range(n)]] * 2
    retry(
        lambda: (
            [(row["origin_records"], row["local_records"]) for row in topic_rows(r.url)] == [(0, 0)]
        ),
        timeout=10,
        message=lambda: f"records left: {topic_rows(r.url)}",
    )
    for c in [pub, *subs]:
        c.close()


def test_topic_without_subscribers_accepts_at_once(router: Any) -> None:
    # nobody is owed anything (docs/exactly-once.md, "Publish")
    r = router(addresses={TOPIC: "multicast,at-least-once"})
    pub = BlockingConnection(r.url, timeout=10)
    sender = pub.create_sender(TOPIC)
    for i in range(5):
        sender.send(Message(body=f"m{i}"))
    rows = topic_rows(r.url)
    assert [(row["name"], row["guarantee"], row["origin_records"]) for row in rows] == [
        (TOPIC, "at-least-once", 0)
    ]
    pub.close()
