"""Link routes through a real RabbitMQ 3.10 (issue 17 item 3; docs/brokers.md "Link
routes"): a client's link to /queue/... on the router is routed to the broker; the broker
answers the attach, grants the credit and settles the outcomes, through the router.

One broker serves the whole module (rabbitmq fixture); each test uses its own queue.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from proton import Delivery, Message, Timeout
from proton.utils import LinkDetached

from tests.broker.rabbitmq import RabbitMQ
from tests.broker.test_rabbitmq_waypoint import DurableQueue, _receive, _send
from tests.harness import HOST, MeshRouter, retry
from tests.management.tooling import ok

_queues = itertools.count(1)


def _queue(name: str) -> str:
    return f"lr-{name}-{next(_queues)}-{int(time.time() * 1000) % 100000}"


def routed_config(
    broker: RabbitMQ, prefixes: tuple[str, ...] = ("/queue", "/amq/queue")
) -> dict[str, Any]:
    """A router with a connector to `broker` and link routes both ways for `prefixes`."""
    return {
        "connector": [
            {"name": "rabbit", "role": "route-container", "host": HOST, "port": broker.port}
        ],
        "linkroute": [
            {"prefix": p, "direction": d, "connection": "rabbit"}
            for p in prefixes
            for d in ("out", "in")
        ],
    }


def _routes_active(r: Any) -> bool:
    rows = ok("manage", "query", "--type", "linkRoute", "--url", r.url, "--json").json()
    return bool(rows) and all(row["operStatus"] == "active" for row in rows)


def _routed_links(r: Any) -> int:
    rows = ok("manage", "query", "--type", "linkRoute", "--url", r.url, "--json").json()
    return sum(int(row["links"]) for row in rows)


def test_sender_through_link_route_gets_the_brokers_outcomes(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """A proton sender to /queue/Q on the router: the attach is answered with RabbitMQ's
    target, the credit is RabbitMQ's (no consumer anywhere, yet credit), the outcomes are
    RabbitMQ's ACCEPTED, and the messages are in the broker queue."""
    q = _queue("out")
    r = router("B", config=routed_config(broker_up))
    retry(lambda: _routes_active(r), timeout=20, message="broker not connected")
    conn = blocking(r.url, timeout=20)
    sender = conn.create_sender(f"/queue/{q}", options=DurableQueue())
    assert sender.remote_target.address == f"/queue/{q}"
    assert sender.remote_target.durability == sender.remote_target.CONFIGURATION
    assert _routed_links(r) == 1
    states = [
        sender.send(Message(body=f"m{i}", durable=True), timeout=20).remote_state for i in range(20)
    ]
    assert set(states) == {Delivery.ACCEPTED}
    assert _receive(blocking, broker_up.url, f"/queue/{q}", 20) == [f"m{i}" for i in range(20)]


def test_receiver_through_link_route_receives_from_the_queue(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """Messages put on the queue directly reach a receiver attached through the router; a
    RELEASED goes back to RabbitMQ, which delivers it again; the ACCEPTED ones leave the
    queue (nothing left afterwards, read directly)."""
    q = _queue("in")
    assert set(_send(blocking, broker_up.url, f"/queue/{q}", ["a", "b", "c"])) == {
        Delivery.ACCEPTED
    }
    r = router("B", config=routed_config(broker_up))
    retry(lambda: _routes_active(r), timeout=20, message="broker not connected")
    conn = blocking(r.url, timeout=20)
    receiver = conn.create_receiver(f"/queue/{q}", credit=1, options=DurableQueue())
    assert receiver.remote_source.address == f"/queue/{q}"
    first = receiver.receive(timeout=20)
    assert first.body == "a"
    receiver.release(delivered=False)  # back to the broker, which hands it out again
    got = []
    for _ in range(3):
        got.append(receiver.receive(timeout=20).body)
        receiver.accept()
    assert sorted(got) == ["a", "b", "c"]
    receiver.close()
    direct = blocking(broker_up.url).create_receiver(
        f"/queue/{q}", credit=1, options=DurableQueue()
    )
    with pytest.raises(Timeout):
        direct.receive(timeout=1.0)


def test_brokers_refusal_reaches_the_client(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """A receiver on /amq/queue/Q, a queue RabbitMQ does not have: RabbitMQ refuses it
    (amqp:not-found) and the client's attach fails with that error, from the router."""
    q = _queue("missing")
    r = router("B", config=routed_config(broker_up))
    retry(lambda: _routes_active(r), timeout=20, message="broker not connected")
    conn = blocking(r.url, timeout=20)
    with pytest.raises(LinkDetached) as info:
        conn.create_receiver(f"/amq/queue/{q}", credit=1)
    assert "not-found" in str(info.value) or "not_found" in str(info.value).lower(), info.value
    # the router and its other routed links are fine
    sender = conn.create_sender(f"/queue/{q}", options=DurableQueue())
    assert sender.send(Message(body="x", durable=True), timeout=20).remote_state == (
        Delivery.ACCEPTED
    )


def test_broker_down_refuses_then_killed_detaches(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """The broker killed: routed client links are detached with an error
    (amqp:link:detach-forced); a new attach while it is down is refused with amqp:not-found;
    once it is back, attaches are routed again."""
    q = _queue("kill")
    r = router("B", config=routed_config(broker_up))
    retry(lambda: _routes_active(r), timeout=20, message="broker not connected")
    conn = blocking(r.url, timeout=20)
    sender = conn.create_sender(f"/queue/{q}", options=DurableQueue())
    receiver = conn.create_receiver(f"/queue/{q}", credit=5, options=DurableQueue())
    assert sender.send(Message(body="before", durable=True), timeout=20).remote_state == (
        Delivery.ACCEPTED
    )
    assert receiver.receive(timeout=20).body == "before"
    receiver.accept()
    broker_up.kill()
    for _ in range(3):  # the blocking connection raises once per detached link
        try:
            conn.wait(
                lambda: (
                    sender.link.remote_condition is not None
                    and receiver.link.remote_condition is not None
                ),
                timeout=20,
                msg="routed links not detached",
            )
            break
        except LinkDetached:
            continue
    assert sender.link.remote_condition.name == "amqp:link:detach-forced"
    assert receiver.link.remote_condition.name == "amqp:link:detach-forced"
    retry(lambda: not _routes_active(r), timeout=10, message="route still active")
    conn2 = blocking(r.url, timeout=20)
    with pytest.raises(LinkDetached) as info:
        conn2.create_sender(f"/queue/{q}", options=DurableQueue())
    assert "amqp:not-found" in str(info.value)
    broker_up.start()
    retry(lambda: _routes_active(r), timeout=30, message="broker not connected again")
    conn3 = blocking(r.url, timeout=20)
    again = conn3.create_sender(f"/queue/{q}", options=DurableQueue())
    assert again.send(Message(body="after", durable=True), timeout=20).remote_state == (
        Delivery.ACCEPTED
    )


def test_link_route_made_at_run_time(broker_up: RabbitMQ, router: Any, blocking: Any) -> None:
    """`qrouter-tool manage` creates the connector and a linkRoute; a sender is routed;
    after DELETE linkRoute the address is the router's own again (no consumer: no credit)."""
    q = _queue("rt")
    r = router("B")
    url = ["--url", r.url, "--json"]
    ok(
        "manage", "create", "--type", "connector", "--name", "rabbit", "role=route-container",
        f"host={HOST}", f"port={broker_up.port}", *url,
    )  # fmt: skip
    row = ok(
        "manage", "create", "--type", "linkRoute", "prefix=/queue", "direction=in",
        "connection=rabbit", *url,
    ).json()  # fmt: skip
    assert (row["identity"], row["prefix"], row["direction"]) == ("linkRoute/0", "/queue", "in")
    retry(lambda: _routes_active(r), timeout=20, message="broker not connected")
    assert set(_send(blocking, r.url, f"/queue/{q}", ["rt"])) == {Delivery.ACCEPTED}
    ok("manage", "delete", "--type", "linkRoute", "--identity", "linkRoute/0", *url)
    assert ok("manage", "query", "--type", "linkRoute", *url).json() == []
    conn = blocking(r.url, timeout=20)
    sender = conn.create_sender(f"/queue/{q}")
    assert sender.remote_target.address == f"/queue/{q}"
    assert sender.link.credit == 0  # the router's own address, with no consumer


def test_link_route_across_the_mesh(broker_up: RabbitMQ, router: Any, blocking: Any) -> None:
    """Clients on router A, the broker on router B: A's [[linkroute]] names no connection,
    B advertises the route while its broker is connected, and A forwards the attach to B
    over the inter-router connection; outcomes, messages and refusals pass end to end."""
    q = _queue("mesh")
    b = router("B", cls=MeshRouter, config=routed_config(broker_up))
    mesh_routes = [
        {"prefix": p, "direction": d} for p in ("/queue", "/amq/queue") for d in ("out", "in")
    ]
    a = router("A", cls=MeshRouter, connect=[b.inter_port], config={"linkroute": mesh_routes})
    retry(lambda: _routes_active(a), timeout=30, message="A does not see B's link routes")
    conn = blocking(a.url, timeout=20)
    sender = conn.create_sender(f"/queue/{q}", options=DurableQueue())
    assert sender.remote_target.address == f"/queue/{q}"
    states = [
        sender.send(Message(body=f"x{i}", durable=True), timeout=20).remote_state for i in range(10)
    ]
    assert set(states) == {Delivery.ACCEPTED}
    receiver = conn.create_receiver(f"/queue/{q}", credit=10, options=DurableQueue())
    got = []
    for _ in range(10):
        got.append(receiver.receive(timeout=20).body)
        receiver.accept()
    assert got == [f"x{i}" for i in range(10)]
    with pytest.raises(LinkDetached) as info:
        conn.create_receiver(f"/amq/queue/{q}-missing", credit=1)
    assert "not-found" in str(info.value), info.value
    assert _routed_links(b) == 2  # B routed A's two links to the broker


def test_routed_links_are_bounded_by_the_brokers_channel_max(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """Each routed link has its own session toward the broker: past RabbitMQ's channel-max
    an attach is refused with amqp:resource-limit-exceeded instead of the router breaking
    the broker connection; the links already routed keep working, and a detached link's
    session is given back."""
    q = _queue("many")
    r = router("B", config=routed_config(broker_up))
    retry(lambda: _routes_active(r), timeout=20, message="broker not connected")
    conn = blocking(r.url, timeout=20)
    senders = []
    refusal = None
    for i in range(150):
        try:
            senders.append(conn.create_sender(f"/queue/{q}", name=f"s{i}", options=DurableQueue()))
        except LinkDetached as exc:
            refusal = str(exc)
            break
    assert refusal is not None and "amqp:resource-limit-exceeded" in refusal, refusal
    assert len(senders) >= 90  # RabbitMQ 3.10 offers channel-max 99
    assert senders[0].send(Message(body="first", durable=True), timeout=20).remote_state == (
        Delivery.ACCEPTED
    )
    for s in senders[-3:]:
        s.close()

    names = iter(range(1000, 1100))

    def attach_again() -> bool:
        try:
            conn.create_sender(f"/queue/{q}", name=f"s{next(names)}", options=DurableQueue())
        except LinkDetached:
            return False
        return True

    retry(attach_again, timeout=20, message="no session given back")


def test_large_messages_cross_in_several_frames(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """A 300 KB message (five frames of RabbitMQ's 64 KiB and the router's) goes through a
    routed sender and comes back through a routed receiver unchanged."""
    q = _queue("big")
    r = router("B", config=routed_config(broker_up))
    retry(lambda: _routes_active(r), timeout=20, message="broker not connected")
    body = "".join(chr(0x41 + i % 26) for i in range(300_000))
    conn = blocking(r.url, timeout=20)
    sender = conn.create_sender(f"/queue/{q}", options=DurableQueue())
    assert sender.send(Message(body=body, durable=True), timeout=20).remote_state == (
        Delivery.ACCEPTED
    )
    receiver = conn.create_receiver(f"/queue/{q}", credit=1, options=DurableQueue())
    assert receiver.receive(timeout=20).body == body
    receiver.accept()
