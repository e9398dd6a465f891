"""oslo.messaging as the seed draws it (issue 17 item 5, docs/brokers.md): RPC is routed
point to point through the mesh, notifications go through a broker queue (waypoints on
`openstack.org/om/notify/anycast`). A notifier with no listener publishes (the broker takes
the notifications); a listener started later receives every one; no RPC message reaches the
broker (the out-autolinks sent exactly the notifications)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.broker.rabbitmq import RabbitMQ
from tests.harness import HOST, MeshRouter, retry
from tests.management.tooling import ok

pytest.importorskip(
    "oslo_messaging",
    reason="oslo.messaging<15 is a test dependency (pip install 'oslo.messaging<15' pyngus)",
)
pytest.importorskip("pyngus", reason="pyngus is the AMQP 1.0 driver's protocol library")

import oslo_messaging  # noqa: E402

from tests.interop.test_oslo_messaging import Oslo  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

NOTIFY = "openstack.org/om/notify/anycast"  # the driver's routable notification prefix
TOPIC = "om-notify"
EXCHANGE = "openstack"  # oslo's control_exchange default: part of the address


def _config(broker: RabbitMQ) -> dict[str, Any]:
    autolinks = []
    for priority in ("info", "error"):
        # the driver sends a notification to NOTIFY/EXCHANGE/TOPIC.PRIORITY
        address = f"{NOTIFY}/{EXCHANGE}/{TOPIC}.{priority}"
        for direction in ("out", "in"):
            autolinks.append(
                {
                    "address": address,
                    "direction": direction,
                    "connection": "rabbit",
                    "external_address": f"/queue/{TOPIC}.{priority}",
                }
            )
    return {
        "connector": [
            {"name": "rabbit", "role": "route-container", "host": HOST, "port": broker.port}
        ],
        "address": [{"prefix": NOTIFY, "distribution": "balanced", "waypoint": True}],
        "autolink": autolinks,
    }


def _autolinks(r: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ok(
        "manage", "query", "--type", "autoLink", "--url", r.url, "--json"
    ).json()
    return rows


def test_notifications_through_the_broker_rpc_routed(broker_up: RabbitMQ, router: Any) -> None:
    b = router("B", cls=MeshRouter, config=_config(broker_up))
    waypoint = {"address": [{"prefix": NOTIFY, "distribution": "balanced", "waypoint": True}]}
    a = router("A", cls=MeshRouter, connect=[b.inter_port], config=waypoint)
    retry(
        lambda: all(row["operStatus"] == "active" for row in _autolinks(b)),
        timeout=20,
        message="autolinks not attached",
    )
    oslo = Oslo(f"amqp://{HOST}:{a.port}/", "routable")
    try:
        # nobody listens: the notifications wait in the broker (no error, no timeout)
        notifier = oslo_messaging.Notifier(
            oslo.notification_transport(),
            publisher_id="test.publisher",
            driver="messaging",
            topics=[TOPIC],
        )
        notifier.info({}, "thing.happened", {"n": 1})
        notifier.error({}, "thing.failed", {"n": 2})
        # RPC through the mesh: a server behind B, the caller on A
        server = Oslo(f"amqp://{HOST}:{b.port}/", "routable")
        try:
            server.rpc_server("server-b")
            client = oslo.client()
            for i in range(5):
                assert client.call({}, "echo", value=i) == {"server": "server-b", "value": i}
            client.cast({}, "record", value="cast")
        finally:
            server.close()
        # a listener started later gets both
        endpoint = oslo.notification_listener(TOPIC)
        got = sorted(
            [endpoint.seen.get(timeout=20), endpoint.seen.get(timeout=20)], key=lambda s: s[0]
        )
        assert got == [("error", "thing.failed", {"n": 2}), ("info", "thing.happened", {"n": 1})]
    finally:
        oslo.close()
    # the broker got the two notifications and nothing else: no RPC message touched it
    sent = {row["address"]: row["deliveries"] for row in _autolinks(b) if row["direction"] == "out"}
    assert sent == {f"{NOTIFY}/{EXCHANGE}/{TOPIC}.info": 1, f"{NOTIFY}/{EXCHANGE}/{TOPIC}.error": 1}
