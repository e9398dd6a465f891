"""Waypoints through a real RabbitMQ (issue 17 items 1, 2, 6; docs/brokers.md): routers
connect to the broker with a route-container connector and keep autolinks attached to a
durable queue; producers and consumers talk to the routers only.

One broker serves the whole module (rabbitmq fixture); each test uses its own queue.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

from tests.broker.rabbitmq import RabbitMQ
from tests.harness import HOST, MeshRouter, retry
from tests.management.test_dispatch_compat import D, Mgmt
from tests.management.tooling import ok

_queues = itertools.count(1)


def _queue(name: str) -> str:
    return f"{name}-{next(_queues)}-{int(time.time() * 1000) % 100000}"


def broker_config(
    broker: RabbitMQ, address: str, *, out: bool = True, inn: bool = True
) -> dict[str, Any]:
    """Config keys (inline arrays of tables) for a router attached to `broker` with
    autolinks for `address` on the broker queue /queue/ADDRESS (RabbitMQ 3.10 declares it,
    durable, on first use)."""
    autolinks = []
    for direction, wanted in (("out", out), ("in", inn)):
        if wanted:
            autolinks.append(
                {
                    "address": address,
                    "direction": direction,
                    "connection": "rabbit",
                    "external_address": f"/queue/{address}",
                }
            )
    return {
        "connector": [
            {"name": "rabbit", "role": "route-container", "host": HOST, "port": broker.port}
        ],
        "address": [{"prefix": address, "waypoint": True}],
        "autolink": autolinks,
    }


def waypoint_only(address: str) -> dict[str, Any]:
    """A router of the mesh with no broker: it must know the address is a waypoint."""
    return {"address": [{"prefix": address, "waypoint": True}]}


class DurableQueue(LinkOption):  # type: ignore[misc]
    """A terminus with durability 1 (configuration): RabbitMQ refuses a link whose
    terminus durability differs from the queue's (PRECONDITION_FAILED), and the routers
    attach durable ones (docs/brokers.md)."""

    def apply(self, link: Any) -> None:
        terminus = link.target if link.is_sender else link.source
        terminus.durability = terminus.CONFIGURATION


def _send(blocking: Any, url: str, address: str, bodies: list[str]) -> list[Any]:
    """Send durable messages one by one; the outcomes (remote states) in order."""
    conn = blocking(url, timeout=20)
    direct = address.startswith("/queue/")  # to RabbitMQ itself
    sender = conn.create_sender(address, options=DurableQueue() if direct else None)
    states = []
    for body in bodies:
        delivery = sender.send(Message(body=body, durable=True), timeout=20)
        states.append(delivery.remote_state)
    # no link close: RabbitMQ 3.10 does not answer a DETACH of a link to a queue; the
    # connection goes at teardown
    return states


def _receive(blocking: Any, url: str, address: str, n: int, timeout: float = 20) -> list[str]:
    conn = blocking(url, timeout=timeout)
    direct = address.startswith("/queue/")
    receiver = conn.create_receiver(address, credit=n, options=DurableQueue() if direct else None)
    got = []
    for _ in range(n):
        got.append(receiver.receive(timeout=timeout).body)
        receiver.accept()
    return got


def _autolinks_active(r: Any, n: int) -> bool:
    rows = ok("manage", "query", "--type", "autoLink", "--url", r.url, "--json").json()
    return sum(1 for row in rows if row["operStatus"] == "active") == n


def test_out_autolink_puts_messages_in_the_broker_queue(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """The producer's outcome is the broker's: ACCEPTED with no consumer anywhere, and the
    messages are in the broker queue (read from RabbitMQ directly)."""
    q = _queue("out")
    r = router("B", config=broker_config(broker_up, q, inn=False))
    retry(lambda: _autolinks_active(r, 1), timeout=20, message="out-autolink not attached")
    states = _send(blocking, r.url, q, [f"m{i}" for i in range(10)])
    assert set(states) == {Delivery.ACCEPTED}
    direct = _receive(blocking, broker_up.url, f"/queue/{q}", 10)
    assert direct == [f"m{i}" for i in range(10)]


def test_in_autolink_hands_the_queue_to_consumers(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """Messages put on the broker queue directly reach a consumer of the router; its
    acceptance reaches the broker (the queue is empty afterwards)."""
    q = _queue("in")
    assert set(_send(blocking, broker_up.url, f"/queue/{q}", ["a", "b", "c"])) == {
        Delivery.ACCEPTED
    }
    r = router("B", config=broker_config(broker_up, q, out=False))
    assert _receive(blocking, r.url, q, 3) == ["a", "b", "c"]
    # nothing left: the broker got the consumer's ACCEPTED
    r_rows = ok("manage", "query", "--type", "autoLink", "--url", r.url, "--json").json()
    assert r_rows[0]["operStatus"] == "active"
    conn = blocking(broker_up.url)
    direct = conn.create_receiver(f"/queue/{q}", credit=1, options=DurableQueue())
    with pytest.raises(Timeout):
        direct.receive(timeout=1.0)


def test_two_routers_store_and_forward(
    broker_up: RabbitMQ, router: Any, blocking: Any, tmp_path: Path
) -> None:
    """producer -> A -> B -> RabbitMQ -> B -> A -> consumer. Sent while nobody listens: every
    send is ACCEPTED (by the broker); a consumer attached later on A receives all, in order."""
    q = _queue("mesh")
    b = router("B", cls=MeshRouter, config=broker_config(broker_up, q))
    a = router("A", cls=MeshRouter, connect=[b.inter_port], config=waypoint_only(q))
    retry(lambda: _autolinks_active(b, 2), timeout=20, message="autolinks not attached")
    bodies = [f"n{i}" for i in range(50)]
    assert set(_send(blocking, a.url, q, bodies)) == {Delivery.ACCEPTED}
    assert _receive(blocking, a.url, q, 50) == bodies
    # and the other way round: a producer on B, a consumer on A that is already there
    conn = blocking(a.url, timeout=20)
    receiver = conn.create_receiver(q, credit=10)
    assert set(_send(blocking, b.url, q, ["late"])) == {Delivery.ACCEPTED}
    assert receiver.receive(timeout=20).body == "late"
    receiver.accept()


class _Stream(MessagingHandler):  # type: ignore[misc]
    """Sends `total` durable messages as credit allows; records each outcome by body. After
    `kill_at` acceptances it calls `on_kill` (the broker is SIGKILLed) and stops sending
    new ones; done when every message sent has an outcome."""

    def __init__(self, url: str, total: int, kill_at: int, on_kill: Any) -> None:
        super().__init__(auto_accept=False)
        self.url, self.total, self.kill_at, self.on_kill = url, total, kill_at, on_kill
        self.sent: dict[bytes, str] = {}  # delivery tag -> body
        self.outcomes: dict[str, str] = {}
        self.killed = False
        self.error: str | None = None
        self.conn: Any = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        event.container.create_sender(self.conn, self.address)

    def on_sendable(self, event: Any) -> None:
        while not self.killed and event.sender.credit and len(self.sent) < self.total:
            body = f"k{len(self.sent)}"
            d = event.sender.send(Message(body=body, durable=True))
            self.sent[d.tag] = body

    def _outcome(self, event: Any, what: str) -> None:
        self.outcomes[self.sent[event.delivery.tag]] = what
        accepted = sum(1 for v in self.outcomes.values() if v == "ACCEPTED")
        if not self.killed and accepted >= self.kill_at:
            self.killed = True
            self.on_kill()
        if self.killed and len(self.outcomes) == len(self.sent):
            self.conn.close()

    def on_accepted(self, event: Any) -> None:
        self._outcome(event, "ACCEPTED")

    def on_released(self, event: Any) -> None:
        state = event.delivery.remote_state
        self._outcome(event, "MODIFIED" if state == event.delivery.MODIFIED else "RELEASED")

    def on_rejected(self, event: Any) -> None:
        self._outcome(event, "REJECTED")


def test_broker_killed_mid_stream(broker_up: RabbitMQ, router: Any, blocking: Any) -> None:
    """RabbitMQ SIGKILLed while a producer streams through the router: what the broker had
    not accepted comes back RELEASED or MODIFIED; the autolinks come back with the broker;
    nothing it accepted is lost (durable queue, persistent messages)."""
    q = _queue("kill")
    r = router("B", config=broker_config(broker_up, q))
    retry(lambda: _autolinks_active(r, 2), timeout=20, message="autolinks not attached")
    # The autolinks made the queue, and RabbitMQ keeps a queue's declaration in Mnesia,
    # written to disk in the background: SIGKILLed 0.3 s later, it came back without the
    # queue ("Recovering 0 queues" in its log) and so without the 500 messages it had
    # accepted into it, in 1 run of 16 under load. A clean restart writes the declaration;
    # what is tested is the messages' durability across the kill, not the queue's.
    broker_up.stop()
    retry(lambda: not _autolinks_active(r, 2), timeout=30, message="autolinks did not go")
    broker_up.start()
    retry(lambda: _autolinks_active(r, 2), timeout=30, message="autolinks did not come back")

    stream = _Stream(r.url, total=3000, kill_at=300, on_kill=broker_up.kill)
    stream.address = q
    done = threading.Event()

    def run() -> None:
        try:
            Container(stream).run()
        finally:
            done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert done.wait(60), f"the stream did not finish: {len(stream.outcomes)} outcomes"
    assert stream.killed
    outcomes = stream.outcomes
    assert len(outcomes) == len(stream.sent)
    accepted = {body for body, what in outcomes.items() if what == "ACCEPTED"}
    others = {what for what in outcomes.values() if what != "ACCEPTED"}
    assert others <= {"RELEASED", "MODIFIED"}, others
    assert len(accepted) >= 300
    counts = {what: list(outcomes.values()).count(what) for what in set(outcomes.values())}
    print(f"\nbroker killed after {len(stream.sent)} sent: {counts}")

    broker_up.start()
    retry(lambda: _autolinks_active(r, 2), timeout=30, message="autolinks did not come back")
    # every accepted message is still in the queue: drain it through the router
    conn = blocking(r.url, timeout=20)
    receiver = conn.create_receiver(q, credit=500)
    got: set[str] = set()
    deadline = time.monotonic() + 40
    while not accepted <= got and time.monotonic() < deadline:
        try:
            m = receiver.receive(timeout=2)
        except Exception:  # noqa: BLE001 - a quiet queue: check what is missing
            continue
        got.add(m.body)
        receiver.accept()
    missing = accepted - got
    assert not missing, f"{len(missing)} accepted messages lost, e.g. {sorted(missing)[:5]}"
    assert got <= set(stream.sent.values())  # nothing the producer did not send


def test_connector_and_autolinks_made_at_run_time(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """`qrouter-tool manage` creates the connector (role route-container), the waypoint
    address and both autolinks of a router started without any; a message goes through the
    queue; deleting them detaches the autolinks and closes the broker connection."""
    q = _queue("runtime")
    r = router("B")
    url = ["--url", r.url, "--json"]
    created = ok(
        "manage", "create", "--type", "connector", "--name", "rabbit", "role=route-container",
        f"host={HOST}", f"port={broker_up.port}", *url,
    ).json()  # fmt: skip
    assert created["role"] == "route-container" and created["name"] == "rabbit"
    ok("manage", "create", "--type", "address", f"prefix={q}", "waypoint=true", *url)
    ok(
        "manage", "create", "--type", "autoLink", f"address={q}", "direction=out",
        "connection=rabbit", f"external_address=/queue/{q}", *url,
    )  # fmt: skip
    # the in-autolink as qdmanage creates it: Dispatch's type and attribute names
    m = Mgmt(blocking(r.url))
    status, text, row = m.request(
        {"address": q, "direction": "in", "connection": "rabbit", "externalAddress": f"/queue/{q}"},
        operation="CREATE", type=D + "router.config.autoLink", name="from-rabbit",
    )  # fmt: skip
    assert status == 201 and row["phase"] == 1, text
    retry(lambda: _autolinks_active(r, 2), timeout=20, message="autolinks not attached")
    assert {x["operStatus"] for x in m.qdstat("autoLink", ["operStatus"])} == {"active"}
    assert set(_send(blocking, r.url, q, ["rt"])) == {Delivery.ACCEPTED}
    assert _receive(blocking, r.url, q, 1) == ["rt"]

    ok("manage", "delete", "--type", "autoLink", "--identity", "autoLink/0", *url)
    rows = ok("manage", "query", "--type", "autoLink", *url).json()
    assert [(row["direction"], row["operStatus"]) for row in rows] == [("in", "active")]
    ok("manage", "delete", "--type", "connector", "--name", "rabbit", *url)
    assert ok("manage", "query", "--type", "connector", *url).json() == []
    retry(lambda: not _autolinks_active(r, 1), timeout=10, message="autolink still active")


def test_refused_autolink_is_attached_again(
    broker_up: RabbitMQ, router: Any, blocking: Any
) -> None:
    """An in-autolink on a queue the broker does not have (/amq/queue/NAME needs an existing
    one) is refused (RabbitMQ 3.10 ends the session with amqp:not-found); once the queue
    exists the router's next attempt, on a new session, attaches it."""
    q = _queue("later")
    config = broker_config(broker_up, q, out=False)
    config["autolink"][0]["external_address"] = f"/amq/queue/{q}"
    r = router("B", config=config)
    retry(
        lambda: "ended the autolinks' session" in r.outfile.read_text(errors="replace"),
        timeout=20,
        message="the broker did not refuse the autolink",
    )
    assert not _autolinks_active(r, 1)
    # declare the queue (durable, as the routers would) with a message in it
    assert set(_send(blocking, broker_up.url, f"/queue/{q}", ["waited"])) == {Delivery.ACCEPTED}
    retry(lambda: _autolinks_active(r, 1), timeout=20, message="autolink not attached again")
    assert _receive(blocking, r.url, q, 1) == ["waited"]


@pytest.mark.parametrize(("password", "works"), [("guest", True), ("wrong", False)])
def test_tls_and_sasl_plain_to_the_broker(
    broker_up: RabbitMQ, router: Any, blocking: Any, tmp_path: Path, password: str, works: bool
) -> None:
    """The connector's TLS (the broker's certificate checked against tls_ca) and SASL PLAIN
    (a password file), as for inter-router connectors: the right password attaches the
    autolinks; a wrong one is refused by the broker and the autolinks stay inactive."""
    q = _queue("tls")
    secret = tmp_path / "rabbit.password"
    secret.write_text(password + "\n")
    config = broker_config(broker_up, q)
    config["connector"][0].update(
        port=broker_up.tls_port,
        tls_ca=str(broker_up.certs.ca),
        sasl_mechanism="PLAIN",
        sasl_username="guest",
        sasl_password_file=str(secret),
    )
    r = router("B", config=config)
    if works:
        retry(lambda: _autolinks_active(r, 2), timeout=20, message="autolinks not attached")
        assert set(_send(blocking, r.url, q, ["tls"])) == {Delivery.ACCEPTED}
        assert _receive(blocking, r.url, q, 1) == ["tls"]
        return
    retry(
        lambda: "connector 127.0.0.1" in r.outfile.read_text(errors="replace"),
        timeout=20,
        message="no connector error logged",
    )
    assert not _autolinks_active(r, 1)
