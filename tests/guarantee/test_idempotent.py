"""Idempotent publishing for clients that cannot resume (docs/exactly-once.md, "Idempotent
publishing"): a python-qpid-proton publisher that loses its connection before it learns an
outcome attaches the same link again (same container-id, same link name) and resends with the
same delivery-tag; the guaranteed topic publishes it once and gives the resend the outcome."""

from __future__ import annotations

from typing import Any

from proton import Delivery, Message, Timeout
from proton.reactor import Container
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

from qrouter.eo.dedup import AcceptedTags
from tests.guarantee.common import topic_rows
from tests.harness import retry

TOPIC = "events"


def publisher(url: str) -> tuple[BlockingConnection, BlockingSender]:
    container = Container()
    container.container_id = "idempotent-app"  # the link's identity: container-id + name
    conn = BlockingConnection(url, timeout=10, container=container)
    return conn, conn.create_sender(TOPIC, name="orders-out")


def send(conn: BlockingConnection, snd: BlockingSender, body: str, tag: bytes) -> Delivery:
    delivery = snd.link.send(Message(body=body), tag=tag)
    try:
        conn.wait(lambda: bool(delivery.remote_state), timeout=0.5)
    except Timeout:
        pass  # no outcome yet: the caller decides
    return delivery


def outcome(conn: BlockingConnection, delivery: Delivery) -> Any:
    conn.wait(lambda: bool(delivery.remote_state), timeout=10, msg="the outcome")
    return delivery.remote_state


def accept(sub: BlockingConnection, rcv: BlockingReceiver) -> None:
    rcv.accept()
    try:
        sub.wait(lambda: False, timeout=0.3)  # the disposition goes out on the connection's I/O
    except Timeout:
        pass


def nothing_more(rcv: BlockingReceiver) -> None:
    try:
        msg = rcv.receive(timeout=1.5)
    except Timeout:
        return
    raise AssertionError(f"the subscriber got {msg.body!r} again")


def test_proton_resend_with_the_same_tag_is_published_once(router: Any) -> None:
    r = router(addresses={TOPIC: "multicast,exactly-once"})
    sub = BlockingConnection(r.url, timeout=10)
    rcv = sub.create_receiver(TOPIC, credit=10)
    retry(
        lambda: [row["subscribers"] for row in topic_rows(r.url)] == [1],
        timeout=10,
        message=lambda: f"topics: {topic_rows(r.url)}",
    )

    # 1. the connection goes before the outcome: the subscriber has the message, unaccepted
    conn, snd = publisher(r.url)
    d = send(conn, snd, "m0", b"tag-0")
    assert rcv.receive(timeout=10).body == "m0"
    assert not d.remote_state  # (0: none yet)
    conn.close()
    accept(sub, rcv)
    # the same link again: the resend gets the outcome, the subscriber nothing new
    conn, snd = publisher(r.url)
    assert outcome(conn, send(conn, snd, "m0", b"tag-0")) == Delivery.ACCEPTED
    nothing_more(rcv)

    # 2. the outcome was given (ACCEPTED, settled) and lost with the connection: a resend of
    # an accepted tag is answered from the topic's memory
    d = send(conn, snd, "m1", b"tag-1")
    assert rcv.receive(timeout=10).body == "m1"
    accept(sub, rcv)
    assert outcome(conn, d) == Delivery.ACCEPTED
    conn.close()
    conn, snd = publisher(r.url)
    for _ in range(2):  # and again: still the same outcome
        assert outcome(conn, send(conn, snd, "m1", b"tag-1")) == Delivery.ACCEPTED
    nothing_more(rcv)

    # 3. a new tag on the re-attached link is a new message
    d = send(conn, snd, "m2", b"tag-2")
    assert rcv.receive(timeout=10).body == "m2"
    accept(sub, rcv)
    assert outcome(conn, d) == Delivery.ACCEPTED
    retry(
        lambda: [row["origin_records"] for row in topic_rows(r.url)] == [0],
        timeout=10,
        message=lambda: f"records left: {topic_rows(r.url)}",
    )
    conn.close()
    sub.close()


def test_accepted_tags_are_bounded_and_expire() -> None:
    tags = AcceptedTags(ttl=60.0, per_link=3, total=5)
    for i in range(4):
        tags.add("a", bytes([i]), now=float(i))
    # per link: the oldest goes first
    assert not tags.accepted("a", b"\0", 4.0)
    assert all(tags.accepted("a", bytes([i]), 4.0) for i in (1, 2, 3))
    tags.add("b", b"x", 5.0)
    tags.add("b", b"y", 6.0)
    tags.add("c", b"z", 7.0)  # 6 > total: the link least recently accepted to ("a") goes
    assert len(tags) == 3 and not tags.accepted("a", b"\3", 7.0)
    assert tags.accepted("c", b"z", 7.0) and tags.evicted == 4
    # after ttl they are forgotten
    assert not tags.accepted("b", b"x", 65.5)
    tags.expire(66.5)
    assert len(tags) == 1 and tags.accepted("c", b"z", 66.5)
