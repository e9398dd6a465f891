"""A guaranteed topic on one router: python-qpid-proton clients take part as
docs/exactly-once.md says (no resumption), and a router restart on a durable store keeps the
topic's records (issue 5)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest
from proton import Delivery, Message, Timeout
from proton.utils import BlockingConnection

from tests.client.conftest import run
from tests.guarantee.common import (
    open_listener,
    publish_and_hold,
    subscriber_then_publisher,
    topic_rows,
    wait_until,
)
from tests.harness import free_port, retry

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


@pytest.mark.skipif(
    os.environ.get("QROUTER_STORE", "memory") == "memory",
    reason="a restart keeps records only on a durable store: runs in the lmdb and leveldb tox "
    "envs (QROUTER_STORE)",
)
def test_restart_recovers_the_records_then_clients_finish(router: Any) -> None:
    # messages published, not yet accepted (the subscriber holds them); SIGKILL; the restarted
    # router has the origin records back before the clients return, then everything completes
    port = free_port()
    r = router("r", listeners=[{"port": port}], addresses={TOPIC: "multicast,exactly-once"})
    url = r.url
    n = 5

    async def scenario() -> None:
        slow = {"backoff": (2.0, 2.0), "reconnect_timeout": 60.0, "connect_timeout": 3.0}
        subc, receiver, pubc, sender = await subscriber_then_publisher(url, 20, **slow)
        futs, held = await publish_and_hold(sender, receiver, n)
        assert not any(f.done() for f in futs), "nothing accepted before the subscriber did"
        r.kill()
        # restarted on a port the clients do not know, read, then given theirs: its records
        # are the store's, not resent deliveries (on their port this raced their reconnect)
        r2 = await asyncio.to_thread(
            router,
            "r",
            listeners=[{"port": free_port()}],
            addresses={TOPIC: "multicast,exactly-once"},
        )
        rows = await asyncio.to_thread(topic_rows, r2.url)
        got = [(row["origin_records"], row["publishers"], row["subscribers"]) for row in rows]
        assert got == [(n, 0, 0)], rows
        await asyncio.to_thread(open_listener, r2.url, port)
        # the clients come back (2 s backoff) and resume: the held messages are not yielded
        # again; accepting them completes every delivery
        for h in held:
            await h.accept()
        outcomes = await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert {o.state for o in outcomes} == {"accepted"}
        await wait_until(
            lambda: (
                [(row["origin_records"], row["local_records"]) for row in topic_rows(url)]
                == [(0, 0)]
            ),
            30,
            lambda: f"records: {topic_rows(url)}",
        )
        assert receiver._queue.empty(), "a message was yielded twice"
        await pubc.close()
        await subc.close()

    run(scenario(), timeout=90)
