"""Fallback and dead-letter addresses on one router (docs/brokers.md, "Fallback and dead
letters"; qrouter/_fast/diversion.pxi).

* fallback: while nobody consumes `work`, its producer gets credit from the consumer of
  `parking` and its messages go there, with that consumer's outcome; once a `work` consumer
  attaches, messages go to it again. Also for the anonymous relay (a per-message `to`).
* dead letter: a delivery to `jobs` that its consumer REJECTS, or MODIFIES with
  undeliverable-here, goes once more, to `dlq`, with x-opt-qr-dead-letter-* annotations; the
  producer gets ACCEPTED when the dead-letter consumer accepts, the original outcome otherwise
  (it did not accept, or there is none). RELEASED and MODIFIED without undeliverable-here are
  not dead-lettered. A dead letter is never dead-lettered again (`dlq`'s own dead-letter
  address is `jobs`: no loop).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest
from proton import Condition, Delivery, Message, Timeout
from proton.utils import SendException

from tests.clients import pump_until_done

ADDRESSES = [
    {"prefix": "work", "distribution": "balanced", "fallback": "parking"},
    {"prefix": "jobs", "distribution": "balanced", "dead_letter": "dlq"},
    # the dead-letter address names `jobs` as its own: a loop the router must not follow
    {"prefix": "dlq", "distribution": "balanced", "dead_letter": "jobs"},
    {"prefix": "lost", "distribution": "closest", "dead_letter": "nobody-home"},
]


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as p:
        yield p


@pytest.fixture
def r(router: Any) -> Any:
    return router(config={"address": ADDRESSES})


def send(pool: Any, sender: Any, body: str, **kwargs: Any) -> Any:
    """Send in the pool's thread; the future's result is the settled delivery, whatever
    its outcome."""
    return pool.submit(sender.send, Message(body=body, **kwargs), 15, [])


def settle(rcv: Any, outcome: str, condition: Condition | None = None) -> None:
    """Settle the oldest message `rcv` received with an explicit outcome (3.4)."""
    d = rcv.fetcher.unsettled[0]
    if outcome == "reject":
        if condition is not None:
            d.local.condition = condition
        rcv.settle(Delivery.REJECTED)
    elif outcome == "modify-undeliverable":
        d.local.failed = True
        d.local.undeliverable = True
        rcv.settle(Delivery.MODIFIED)
    elif outcome == "modify":
        d.local.failed = True
        rcv.settle(Delivery.MODIFIED)
    elif outcome == "release":
        rcv.settle(Delivery.RELEASED)
    else:
        rcv.settle(Delivery.ACCEPTED)


def nothing_more(rcv: Any, wait: float = 0.5) -> bool:
    """True when `rcv` gets no further message within `wait` seconds."""
    try:
        rcv.receive(timeout=wait)
    except Timeout:
        return True
    return False


# --- fallback ----------------------------------------------------------------------------------


def test_fallback_takes_messages_while_nobody_consumes(r: Any, blocking: Any, pool: Any) -> None:
    consumers = blocking(r.url)
    parking = consumers.create_receiver("parking", credit=10)
    sender = blocking(r.url).create_sender("work")
    # no `work` consumer anywhere: credit comes from `parking`'s consumer, and so does the
    # outcome (accepted here)
    future = send(pool, sender, "one")
    msg = parking.receive(timeout=10)
    assert msg.body == "one"
    assert msg.address in (None, "work")  # the message itself is not rewritten
    settle(parking, "accept")
    assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED
    # the fallback consumer's outcome is the producer's: a rejection too
    future = send(pool, sender, "two")
    assert parking.receive(timeout=10).body == "two"
    settle(parking, "reject", Condition("test:no", "parking refused"))
    d = pump_until_done(consumers, future)
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "test:no"
    # a consumer of `work` attaches: messages go to it again, none to the fallback
    work = consumers.create_receiver("work", credit=10)
    for i in range(5):
        future = send(pool, sender, f"direct-{i}")
        assert work.receive(timeout=10).body == f"direct-{i}"
        settle(work, "accept")
        assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED
    assert nothing_more(parking)
    # it detaches: the fallback takes over again
    work.close()
    future = send(pool, sender, "three")
    assert parking.receive(timeout=10).body == "three"
    settle(parking, "accept")
    assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED


def test_no_consumer_and_no_fallback_consumer_means_no_credit(r: Any, blocking: Any) -> None:
    sender = blocking(r.url).create_sender("work")
    with pytest.raises(Timeout):
        sender.send(Message(body="nowhere"), timeout=1.5)


def test_fallback_for_the_anonymous_relay(r: Any, blocking: Any, pool: Any) -> None:
    consumers = blocking(r.url)
    parking = consumers.create_receiver("parking", credit=10)
    anonymous = blocking(r.url).create_sender(None)
    future = send(pool, anonymous, "via-relay", address="work.orders")
    msg = parking.receive(timeout=10)
    assert (msg.body, msg.address) == ("via-relay", "work.orders")
    settle(parking, "accept")
    assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED


def test_fallback_does_not_apply_to_other_addresses(r: Any, blocking: Any) -> None:
    blocking(r.url).create_receiver("parking", credit=10)
    anonymous = blocking(r.url).create_sender(None)
    with pytest.raises(SendException) as info:
        anonymous.send(Message(body="x", address="elsewhere"), timeout=10)
    assert info.value.state == Delivery.REJECTED


# --- dead letters ------------------------------------------------------------------------------


def test_rejected_goes_to_the_dead_letter_address(r: Any, blocking: Any, pool: Any) -> None:
    consumers = blocking(r.url)
    jobs = consumers.create_receiver("jobs", credit=10)
    dlq = consumers.create_receiver("dlq", credit=10)
    sender = blocking(r.url).create_sender("jobs")
    future = send(pool, sender, "bad", annotations={"x-opt-app": "kept"})
    assert jobs.receive(timeout=10).body == "bad"
    settle(jobs, "reject", Condition("app:invalid", "cannot parse", {"line": 3}))
    dead = dlq.receive(timeout=10)
    assert dead.body == "bad"
    ann = dead.annotations
    assert ann["x-opt-qr-dead-letter-address"] == "jobs"
    assert ann["x-opt-qr-dead-letter-outcome"] == "rejected"
    assert ann["x-opt-qr-dead-letter-condition"] == "app:invalid"
    assert ann["x-opt-qr-dead-letter-description"] == "cannot parse"
    assert ann["x-opt-app"] == "kept"  # the message's own annotations stay
    assert not future.done()  # the producer waits for the dead-letter consumer
    settle(dlq, "accept")
    assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED


def test_modified_undeliverable_here_is_dead_lettered(r: Any, blocking: Any, pool: Any) -> None:
    consumers = blocking(r.url)
    jobs = consumers.create_receiver("jobs", credit=10)
    dlq = consumers.create_receiver("dlq", credit=10)
    sender = blocking(r.url).create_sender("jobs")
    future = send(pool, sender, "not-here")
    jobs.receive(timeout=10)
    settle(jobs, "modify-undeliverable")
    dead = dlq.receive(timeout=10)
    assert dead.body == "not-here"
    assert dead.annotations["x-opt-qr-dead-letter-outcome"] == "modified"
    assert "x-opt-qr-dead-letter-condition" not in dead.annotations
    settle(dlq, "accept")
    assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED


@pytest.mark.parametrize(
    ("outcome", "state"), [("release", Delivery.RELEASED), ("modify", Delivery.MODIFIED)]
)
def test_released_and_plain_modified_are_not_dead_lettered(
    r: Any, blocking: Any, pool: Any, outcome: str, state: int
) -> None:
    consumers = blocking(r.url)
    jobs = consumers.create_receiver("jobs", credit=10)
    dlq = consumers.create_receiver("dlq", credit=10)
    sender = blocking(r.url).create_sender("jobs")
    future = send(pool, sender, outcome)
    jobs.receive(timeout=10)
    settle(jobs, outcome)
    assert pump_until_done(consumers, future).remote_state == state
    assert nothing_more(dlq)


def test_dead_letter_consumer_rejecting_gives_the_original_outcome_and_no_loop(
    r: Any, blocking: Any, pool: Any
) -> None:
    consumers = blocking(r.url)
    jobs = consumers.create_receiver("jobs", credit=10)
    dlq = consumers.create_receiver("dlq", credit=10)
    sender = blocking(r.url).create_sender("jobs")
    future = send(pool, sender, "twice-bad")
    jobs.receive(timeout=10)
    settle(jobs, "reject", Condition("app:first", "the first refusal"))
    assert dlq.receive(timeout=10).body == "twice-bad"
    # `dlq`'s dead-letter address is `jobs`, but a dead letter is never dead-lettered again
    settle(dlq, "reject", Condition("app:second", "the dead-letter consumer refused too"))
    d = pump_until_done(consumers, future)
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "app:first"
    assert nothing_more(jobs)


def test_no_dead_letter_consumer_gives_the_original_outcome(
    r: Any, blocking: Any, pool: Any
) -> None:
    consumers = blocking(r.url)
    lost = consumers.create_receiver("lost", credit=10)
    sender = blocking(r.url).create_sender("lost")
    future = send(pool, sender, "orphan")
    lost.receive(timeout=10)
    settle(lost, "reject", Condition("app:nope", "nobody wants it"))
    d = pump_until_done(consumers, future)
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "app:nope"


def test_many_dead_letters_in_a_row(r: Any, blocking: Any, pool: Any) -> None:
    """Every other message rejected: each rejected one reaches the dead-letter consumer once,
    every producer outcome is ACCEPTED, and the router holds nothing afterwards."""
    consumers = blocking(r.url)
    jobs = consumers.create_receiver("jobs", credit=50)
    dlq = consumers.create_receiver("dlq", credit=50)
    sender = blocking(r.url).create_sender("jobs")
    dead = []
    for i in range(40):
        future = send(pool, sender, f"m{i}")
        assert jobs.receive(timeout=10).body == f"m{i}"
        settle(jobs, "reject" if i % 2 else "accept")
        if i % 2:
            dead.append(dlq.receive(timeout=10).body)
            settle(dlq, "accept")
        assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED
    assert dead == [f"m{i}" for i in range(1, 40, 2)]
    assert nothing_more(dlq)
