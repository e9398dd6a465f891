"""Changes made at run time through ``qrouter-tool manage`` take effect: a new listener accepts
connections (and stops when deleted), a new address entry's distribution applies to an
address created after it, an updated entry likewise."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

import pytest
from proton import ConnectionException, Delivery, Message
from proton.utils import BlockingConnection

from tests.clients import pump_until_done
from tests.harness import free_port, port_open, retry
from tests.management.tooling import ok, run_tool


def test_create_and_delete_a_listener(router: Any, blocking: Any) -> None:
    r = router()
    port = free_port()
    created = ok(
        "manage", "create", "--type", "listener", "--name", "extra", "host=127.0.0.1",
        f"port={port}", "idle_timeout=30", "--url", r.url, "--json",
    ).json()  # fmt: skip
    assert created["name"] == "extra" and created["origin"] == "management"
    assert created["bound"] == [f"127.0.0.1:{port}"] and created["idle_timeout"] == 30

    # the new listener carries AMQP: a message through it to a consumer on the first one
    consumer = blocking(r.url).create_receiver("via-extra", credit=1)
    extra = blocking(f"amqp://127.0.0.1:{port}")
    send_through(extra.create_sender("via-extra"), consumer, "hello")

    rows = ok("manage", "query", "--type", "listener", "--url", r.url, "--json").json()
    assert {row["name"]: row["origin"] for row in rows} == {
        f"127.0.0.1:{r.port}": "config",
        "extra": "management",
    }
    conns = ok("connections", "--url", r.url, "--json").json()
    assert sorted(c["listener"] for c in conns) == sorted([f"127.0.0.1:{r.port}", "extra"])

    # the same name again: 409
    again = run_tool(
        "manage", "create", "--type", "listener", "--name", "extra", f"port={free_port()}",
        "--url", r.url,
    )  # fmt: skip
    assert again.returncode == 1 and "409" in again.stderr, str(again)
    # a bad setting: 400 naming it
    bad = run_tool("manage", "create", "--type", "listener", "port=99999", "--url", r.url)
    assert bad.returncode == 1 and "400" in bad.stderr and "port" in bad.stderr, str(bad)

    deleted = ok("manage", "delete", "--type", "listener", "--name", "extra", "--url", r.url)
    assert deleted.stdout.strip() == "deleted listener extra"
    retry(lambda: not port_open(port), timeout=5, message="the deleted listener still accepts")
    with pytest.raises(ConnectionException):
        BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=5)
    # connections it accepted stay open
    send_through(extra.create_sender("via-extra"), consumer, "still here")


def test_create_an_address_entry(router: Any, blocking: Any) -> None:
    r = router()
    created = ok(
        "manage", "create", "--type", "address", "prefix=fanout", "distribution=multicast",
        "--url", r.url, "--json",
    ).json()  # fmt: skip
    assert created["identity"] == "prefix:fanout" and created["distribution"] == "multicast"

    # two consumers of a new address under the prefix both get the message (multicast);
    # with the default (balanced) only one would
    conn = blocking(r.url)
    a = conn.create_receiver("fanout.news", credit=5, name="a")
    b = conn.create_receiver("fanout.news", credit=5, name="b")
    retry(lambda: _consumers(r, "fanout.news") == 2, timeout=10)
    send_through(blocking(r.url).create_sender("fanout.news"), a, "to all", also=[b])
    rows = {row["name"]: row for row in ok("addresses", "--url", r.url, "--json").json()}
    assert rows["fanout.news"]["distribution"] == "multicast"
    assert rows["fanout.news"]["deliveries_out"] == 2

    entries = ok("addresses", "--entries", "--url", r.url, "--json").json()
    assert {"prefix": "fanout", "pattern": None, "distribution": "multicast"}.items() <= next(
        e for e in entries if e["prefix"] == "fanout"
    ).items()

    # UPDATE to unavailable: a new address under it is refused; DELETE: back to the default
    ok("manage", "update", "--type", "address", "--name", "fanout", "distribution=unavailable",
       "--url", r.url)  # fmt: skip
    with pytest.raises(Exception, match="unavailable"):
        blocking(r.url).create_receiver("fanout.closed", credit=1)
    ok("manage", "delete", "--type", "address", "--identity", "prefix:fanout", "--url", r.url)
    blocking(r.url).create_receiver("fanout.open", credit=1)
    rows = {row["name"]: row for row in ok("addresses", "--url", r.url, "--json").json()}
    assert rows["fanout.open"]["distribution"] == "balanced"


def test_create_a_pattern_entry(router: Any, blocking: Any) -> None:
    r = router()
    ok("manage", "create", "--type", "address", "pattern=sensors.*.alerts",
       "distribution=closest", "--url", r.url)  # fmt: skip
    blocking(r.url).create_receiver("sensors.kitchen.alerts", credit=1)
    rows = {row["name"]: row for row in ok("addresses", "--url", r.url, "--json").json()}
    assert rows["sensors.kitchen.alerts"]["distribution"] == "closest"


def test_a_connector_needs_a_mesh(router: Any) -> None:
    """Connectors are created at run time only on a router of a mesh (one with an
    inter-router listener or connector); tests/mesh_system/test_runtime_connector.py has
    the rest."""
    r = router()
    assert ok("manage", "query", "--type", "connector", "--url", r.url, "--json").json() == []
    result = run_tool("manage", "create", "--type", "connector", "--name", "c1", "--url", r.url)
    assert result.returncode == 1 and "501" in result.stderr
    assert "not in a mesh" in result.stderr


def send_through(sender: Any, consumer: Any, body: str, also: Sequence[Any] = ()) -> None:
    """Send from a thread (a blocking send waits for the outcome), receive and accept here
    (`also`: more consumers on the consumer's connection)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body=body), 15)
        for receiver in [consumer, *also]:
            assert receiver.receive(timeout=10).body == body
            receiver.accept()
        assert pump_until_done(consumer.connection, future).remote_state == Delivery.ACCEPTED


def _consumers(r: Any, address: str) -> int:
    rows = ok("addresses", "--url", r.url, "--json").json()
    return int(next((row["consumers"] for row in rows if row["name"] == address), 0))


def test_delete_a_connection_and_a_suspended_terminus(router: Any, blocking: Any) -> None:
    from proton.reactor import DurableSubscription

    r = router()
    subscriber = BlockingConnection(r.url, timeout=10)
    container = subscriber.conn.container
    subscriber.create_receiver("news", name="news-sub", options=DurableSubscription())
    victim = blocking(r.url)
    victim_container = victim.conn.container

    conns = ok("connections", "--url", r.url, "--json").json()
    identity = next(c["identity"] for c in conns if c["container"] == victim_container)
    ok("manage", "delete", "--type", "connection", "--identity", identity, "--url", r.url)
    retry(
        lambda: all(
            c["container"] != victim_container
            for c in ok("connections", "--url", r.url, "--json").json()
        ),
        timeout=10,
        message="the deleted connection is still open",
    )

    subscriber.close()  # the link goes with its connection: expiry never keeps the terminus

    def suspended() -> list[dict[str, Any]]:
        rows = ok("termini", "--url", r.url, "--json").json()
        return [t for t in rows if t["container"] == container and t["state"] == "suspended"]

    (terminus,) = retry(suspended, timeout=10, message="the terminus was not kept")
    assert terminus["identity"] == f"sender:{container}:news-sub"
    links = ok("links", "--url", r.url, "--json").json()
    assert [(x["name"], x["state"]) for x in links] == [("news-sub", "suspended")]
    ok("manage", "delete", "--type", "terminus", "--identity", terminus["identity"], "--url", r.url)
    assert ok("termini", "--url", r.url, "--json").json() == []
