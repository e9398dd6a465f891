"""Fallback and dead letters across two routers (docs/brokers.md, "Fallback and dead letters").

A producer on router A, consumers on router B: the fallback applies while no router has a
consumer of the address, and stops once one on B is known to A; a dead letter is made at the
router of the consumer that refused the message (B) and may cross back to A; the outcome a
router relays from another is never dead-lettered again.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import pytest
from proton import Condition, Delivery, Message, Timeout

from tests.clients import pump_until, pump_until_done
from tests.harness import DEFAULT_TIMEOUT
from tests.interop.test_fallback_dead_letter import ADDRESSES, nothing_more, send, settle
from tests.mesh_system.mesh import mesh


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as p:
        yield p


def _arrived(*receivers: Any) -> Any:
    """The first receiver with a message waiting, or None."""
    for rcv in receivers:
        if rcv.fetcher.incoming:
            return rcv
    return None


def pump_all(conns: list[Any], condition: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Keep several BlockingConnections' I/O going until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        for conn in conns:
            try:
                conn.wait(condition, timeout=0.05)
            except Timeout:
                pass


def test_fallback_across_two_routers(router: Any, blocking: Any, pool: Any) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"], config={"address": ADDRESSES})
    consumers = blocking(r["B"].url)
    parking = consumers.create_receiver("parking", credit=20)
    sender = blocking(r["A"].url).create_sender("work")
    # nobody consumes `work` in the mesh: the message crosses to B's `parking` consumer
    future = send(pool, sender, "parked")
    assert parking.receive(timeout=DEFAULT_TIMEOUT).body == "parked"
    settle(parking, "accept")
    assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED

    # a `work` consumer attaches on B: once A knows (the mesh's propagation), messages go to it
    work = consumers.create_receiver("work", credit=20)
    deadline = time.monotonic() + DEFAULT_TIMEOUT
    i = 0
    while True:
        assert time.monotonic() < deadline, "messages never reached the new consumer"
        future = send(pool, sender, f"m{i}")
        pump_until(consumers, lambda: _arrived(work, parking) is not None, DEFAULT_TIMEOUT)
        got = _arrived(work, parking)
        assert got.receive(timeout=1).body == f"m{i}"
        settle(got, "accept")
        assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED
        i += 1
        if got is work:
            break
    for j in range(10):
        future = send(pool, sender, f"direct-{j}")
        assert work.receive(timeout=DEFAULT_TIMEOUT).body == f"direct-{j}"
        settle(work, "accept")
        assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED
    assert nothing_more(parking)

    # it goes: every message is taken by the fallback again (B diverts what A still sends
    # its way while the withdrawal travels), each ACCEPTED
    work.close()
    for j in range(10):
        future = send(pool, sender, f"again-{j}")
        assert parking.receive(timeout=DEFAULT_TIMEOUT).body == f"again-{j}"
        settle(parking, "accept")
        assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED


def test_dead_letter_made_on_the_consumer_router_crosses_back(
    router: Any, blocking: Any, pool: Any
) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"], config={"address": ADDRESSES})
    on_b = blocking(r["B"].url)
    jobs = on_b.create_receiver("jobs", credit=10)
    on_a = blocking(r["A"].url)
    dlq = on_a.create_receiver("dlq", credit=10)
    sender = blocking(r["A"].url).create_sender("jobs")

    # B's consumer rejects; B dead-letters to `dlq`, whose consumer is on A
    future = send(pool, sender, "bad")
    assert jobs.receive(timeout=DEFAULT_TIMEOUT).body == "bad"
    settle(jobs, "reject", Condition("app:invalid", "refused on B"))
    pump_all([on_b, on_a], lambda: bool(dlq.fetcher.incoming))  # B writes its disposition
    dead = dlq.receive(timeout=DEFAULT_TIMEOUT)
    assert dead.body == "bad"
    assert dead.annotations["x-opt-qr-dead-letter-address"] == "jobs"
    assert dead.annotations["x-opt-qr-dead-letter-condition"] == "app:invalid"
    settle(dlq, "accept")
    assert pump_until_done(on_a, future).remote_state == Delivery.ACCEPTED

    # the dead-letter consumer refuses too: the original rejection travels back to the
    # producer, and neither router dead-letters it again (A got it from B, not a consumer)
    future = send(pool, sender, "worse")
    assert jobs.receive(timeout=DEFAULT_TIMEOUT).body == "worse"
    settle(jobs, "reject", Condition("app:first", "refused on B"))
    pump_all([on_b, on_a], lambda: bool(dlq.fetcher.incoming))
    assert dlq.receive(timeout=DEFAULT_TIMEOUT).body == "worse"
    settle(dlq, "reject", Condition("app:second", "refused on A"))
    d = pump_until_done(on_a, future)
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "app:first"
    assert nothing_more(dlq)
    assert nothing_more(jobs)


def test_message_body_survives_dead_lettering_across_routers(
    router: Any, blocking: Any, pool: Any
) -> None:
    """A message of many frames keeps every byte through the re-encoded annotations."""
    r = mesh(router, [("A", "B")], ["A", "B"], config={"address": ADDRESSES})
    on_b = blocking(r["B"].url)
    jobs = on_b.create_receiver("jobs", credit=10)
    on_a = blocking(r["A"].url)
    dlq = on_a.create_receiver("dlq", credit=10)
    sender = blocking(r["A"].url).create_sender("jobs")
    body = bytes(range(256)) * 2048  # 512 KiB
    future = pool.submit(sender.send, Message(body=body, subject="big"), 30, [])
    assert jobs.receive(timeout=DEFAULT_TIMEOUT).body == body
    settle(jobs, "reject")
    pump_all([on_b, on_a], lambda: bool(dlq.fetcher.incoming))
    dead = dlq.receive(timeout=DEFAULT_TIMEOUT)
    assert dead.body == body and dead.subject == "big"
    settle(dlq, "accept")
    assert pump_until_done(on_a, future, timeout=30).remote_state == Delivery.ACCEPTED
