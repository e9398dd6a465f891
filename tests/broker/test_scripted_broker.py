"""Autolinks against a scripted broker (a python-qpid-proton listener), for what RabbitMQ
does not do on demand: the producer's outcome is whatever the broker answers (REJECTED,
RELEASED, MODIFIED, not only ACCEPTED), and a link the broker attaches of its own is refused
while the autolinks keep working (docs/brokers.md). Runs without RabbitMQ."""

from __future__ import annotations

import threading
from typing import Any

from proton import Delivery, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from tests.harness import HOST, free_port, port_open, retry
from tests.management.tooling import ok

OUTCOMES = {
    "accept": Delivery.ACCEPTED,
    "reject": Delivery.REJECTED,
    "release": Delivery.RELEASED,
    "modify": Delivery.MODIFIED,
}


class ScriptedBroker(MessagingHandler):  # type: ignore[misc]
    """Takes messages on any link the router attaches and settles each with the outcome
    its body names; attaches a sending link of its own toward the router once opened."""

    def __init__(self, port: int) -> None:
        super().__init__(auto_accept=False, prefetch=10)
        self.port = port
        self.got: list[str] = []
        self.own_link_error: str | None = None
        self.own: Any = None
        self.container: Any = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.acceptor = event.container.listen(f"{HOST}:{self.port}")

    def on_connection_init(self, event: Any) -> None:
        event.connection.container = "scripted-broker"  # an accepted one has none by default

    def on_connection_opened(self, event: Any) -> None:
        self.own = event.container.create_sender(event.connection, "broker-pushes")

    def on_link_error(self, event: Any) -> None:
        if event.link is self.own or event.link.name == self.own.name:
            self.own_link_error = str(event.link.remote_condition.name)

    def on_link_closed(self, event: Any) -> None:
        if self.own is not None and event.link.name == self.own.name:
            condition = event.link.remote_condition
            self.own_link_error = str(condition.name) if condition else "closed"

    def on_message(self, event: Any) -> None:
        body = str(event.message.body)
        self.got.append(body)
        event.delivery.update(OUTCOMES[body])
        event.delivery.settle()


def test_the_producer_gets_the_brokers_outcome(router: Any, blocking: Any) -> None:
    port = free_port()
    broker = ScriptedBroker(port)
    container = Container(broker)
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    try:
        retry(lambda: port_open(port), timeout=10, message="the scripted broker does not listen")
        r = router(
            "B",
            config={
                "connector": [
                    {"name": "scripted", "role": "route-container", "host": HOST, "port": port}
                ],
                "address": [{"prefix": "work", "waypoint": True}],
                "autolink": [{"address": "work", "direction": "out", "connection": "scripted"}],
            },
        )

        def active() -> bool:
            rows = ok("manage", "query", "--type", "autoLink", "--url", r.url, "--json").json()
            return [row["operStatus"] for row in rows] == ["active"]

        retry(active, timeout=20, message="autolink not attached")
        # the broker's own link is refused; the connection and the autolink stay
        retry(
            lambda: broker.own_link_error is not None,
            timeout=10,
            message="the broker's own link was not refused",
        )
        assert broker.own_link_error == "amqp:not-implemented"
        sender = blocking(r.url, timeout=20).create_sender("work")
        states = {
            body: sender.send(Message(body=body), timeout=20, error_states=[]).remote_state
            for body in ("accept", "reject", "release", "modify")
        }
        assert states == OUTCOMES
        assert broker.got == ["accept", "reject", "release", "modify"]
        assert active()
    finally:
        container.stop()
        thread.join(10)
