"""Qpid Dispatch's management types (qrouter/dispatch_schema.py) answered by a real router, to
requests shaped as Dispatch's tools send them (python-qpid-proton as the client).

What the tools send (AMQP Management over ``$management``, reply-to a dynamic address):

* ``qdstat -g`` / ``-c`` / ``-l`` / ``-a`` / ``-n``: application-properties
  ``{operation: QUERY, type: org.amqp.management, name: self, entityType: <T>}`` with T
  ``org.apache.qpid.dispatch.router`` / ``.connection`` / ``.router.link`` /
  ``.router.address`` / ``.router.node``, body ``{attributeNames: [...]}`` (the columns the
  option shows; ``-g`` asks for all with an empty list). ``qdstat -r R`` first sends
  ``GET-MGMT-NODES``.
* ``qdmanage query --type=connection``: the same QUERY with entityType
  ``org.apache.qpid.dispatch.connection`` and an empty attributeNames list (all attributes).
* ``qdmanage create --type=listener --name=N port=P``: ``{operation: CREATE, type:
  org.apache.qpid.dispatch.listener, name: N}``, body the attributes as a map of strings.
* ``qdmanage delete --type=listener --name=N``: ``{operation: DELETE, type: ..., name: N}``.

The answer: application-properties ``statusCode``/``statusDescription``; QUERY's body
``{attributeNames: [...], results: [[...], ...]}``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from qrouter.dispatch_schema import LINK, ROUTER
from tests.harness import free_port, port_open, retry
from tests.management.test_roles import PASSWORDS, users_file
from tests.management.test_runtime_changes import send_through

D = "org.apache.qpid.dispatch."

# the columns qdstat shows for -l and -a (Dispatch 1.19)
QDSTAT_L = [
    "linkType", "linkDir", "connectionId", "identity", "peer", "owningAddr", "capacity",
    "undeliveredCount", "unsettledCount", "deliveryCount", "presettledCount",
    "droppedPresettledCount", "acceptedCount", "rejectedCount", "releasedCount",
    "modifiedCount", "deliveriesDelayed1Sec", "deliveriesDelayed10Sec", "deliveriesStuck",
    "openMovedStreams", "adminStatus", "operStatus", "linkName", "priority", "settleRate",
    "creditAvailable", "zeroCreditSeconds",
]  # fmt: skip
QDSTAT_A = [
    "name", "distribution", "inProcess", "subscriberCount", "remoteCount", "containerCount",
    "deliveriesIngress", "deliveriesEgress", "deliveriesTransit", "deliveriesToContainer",
    "deliveriesFromContainer", "priority", "key",
]  # fmt: skip


class Mgmt:
    """A management client on one connection: a sender to $management, a dynamic receiver."""

    def __init__(self, conn: BlockingConnection) -> None:
        self.conn = conn
        self.replies = conn.create_receiver(None, dynamic=True, credit=10)
        self.reply_to = self.replies.remote_source.address
        self.sender = conn.create_sender("$management")

    def request(self, body: Any = None, **props: Any) -> tuple[int, str, Any]:
        mid = str(uuid.uuid4())
        self.sender.send(Message(id=mid, reply_to=self.reply_to, properties=props, body=body), 10)
        reply = self.replies.receive(timeout=10)
        assert reply.correlation_id == mid
        return reply.properties["statusCode"], reply.properties["statusDescription"], reply.body

    def qdstat(self, entity: str, names: list[str]) -> list[dict[str, Any]]:
        status, text, body = self.request(
            {"attributeNames": names},
            operation="QUERY",
            type="org.amqp.management",
            name="self",
            entityType=D + entity,
        )
        assert status == 200, text
        if names:
            assert body["attributeNames"] == names
        return [dict(zip(body["attributeNames"], row, strict=True)) for row in body["results"]]


def test_qdstat_views_after_an_exchange(router: Any, blocking: Any) -> None:
    r = router(router_id="Router.A")
    consumer = blocking(r.url).create_receiver("q1", credit=10, name="q1-consumer")
    sender = blocking(r.url).create_sender("q1", name="q1-producer")
    for i in range(3):
        send_through(sender, consumer, f"m{i}")
    m = Mgmt(blocking(r.url))

    # -g: all of the router's attributes, in the schema's order
    (general,) = m.qdstat("router", [])
    assert list(general) == list(ROUTER)
    assert general["id"] == "Router.A" and general["mode"] == "standalone"
    assert general["type"] == D + "router"
    assert general["connectionCount"] == 3
    assert general["deliveriesIngress"] >= 3 and general["acceptedDeliveries"] >= 3
    assert general["linkRouteCount"] == 0 and general["autoLinkCount"] == 0

    # -l: the producer's and the consumer's links with their counters
    links = {row["linkName"]: row for row in m.qdstat("router.link", QDSTAT_L)}
    out, into = links["q1-consumer"], links["q1-producer"]
    assert (out["linkDir"], into["linkDir"]) == ("out", "in")
    assert out["linkType"] == into["linkType"] == "endpoint"
    assert out["owningAddr"] == into["owningAddr"] == "M0q1"
    assert out["deliveryCount"] == 3 and into["deliveryCount"] == 3
    # outcomes are counted on the producer's link; the consumer's answers null
    assert into["acceptedCount"] == 3 and out["acceptedCount"] is None
    assert out["unsettledCount"] == 0 and out["undeliveredCount"] == 0
    assert out["operStatus"] == "up" and out["adminStatus"] == "enabled"
    assert into["capacity"] == 250  # the router's link_capacity default
    assert out["peer"] is None and out["settleRate"] is None  # no value here: null
    # the management links themselves are there too, on $management (Dispatch's L class)
    assert any(row["owningAddr"] == "L$management" for row in links.values())

    # -a: the address, keyed as Dispatch keys mobile addresses
    addresses = {row["name"]: row for row in m.qdstat("router.address", QDSTAT_A)}
    q1 = addresses["M0q1"]
    assert q1["key"] == "M0q1" and q1["distribution"] == "balanced"
    assert q1["subscriberCount"] == 1 and q1["remoteCount"] == 0
    assert q1["deliveriesIngress"] == 3 and q1["deliveriesEgress"] == 3

    # -c: the three connections, all accepted by a normal listener
    conns = m.qdstat("connection", ["identity", "host", "container", "role", "dir", "user"])
    assert len(conns) == 3
    assert {c["role"] for c in conns} == {"normal"} and {c["dir"] for c in conns} == {"in"}
    assert all(c["host"].startswith("127.0.0.1:") for c in conns)

    # -n: a standalone router has no mesh nodes
    assert m.qdstat("router.node", ["id", "nextHop", "cost"]) == []

    # qdmanage query --type=connection: no attribute names, all of them
    status, _, body = m.request(
        {"attributeNames": []},
        operation="QUERY",
        type="org.amqp.management",
        entityType=D + "connection",
    )
    assert status == 200 and "container" in body["attributeNames"]
    assert "enableProtocolTrace" in body["attributeNames"] and len(body["results"]) == 3

    # qdmanage read --type=router.link --identity=...
    status, _, row = m.request(
        None, operation="READ", type=D + "router.link", identity=out["identity"]
    )
    assert status == 200 and set(row) == set(LINK) and row["deliveryCount"] == 3


def test_unknown_types_and_get_types(router: Any, blocking: Any) -> None:
    r = router()
    m = Mgmt(blocking(r.url))
    status, text, _ = m.request(
        {"attributeNames": []},
        operation="QUERY",
        type="org.amqp.management",
        entityType=D + "router.config.exchange",
    )
    assert status == 404 and "unknown entity type" in text and "exchange" in text
    status, _, types = m.request(None, operation="GET-TYPES", type="org.amqp.management")
    assert status == 200
    for name in ("router", "connection", "router.link", "router.address", "router.node"):
        assert D + name in types
    assert "org.qrouter.link" in types  # qrouter's own types stay


def test_qdmanage_create_and_delete_listener_and_address(router: Any, blocking: Any) -> None:
    r = router()
    m = Mgmt(blocking(r.url))
    port = free_port()
    # qdmanage sends every attribute as a string
    status, text, row = m.request(
        {"host": "127.0.0.1", "port": str(port), "saslMechanisms": "ANONYMOUS PLAIN",
         "idleTimeoutSeconds": "30", "authenticatePeer": "no"},
        operation="CREATE", type=D + "listener", name="extra",
    )  # fmt: skip
    assert status == 201, text
    assert row["name"] == "extra" and row["origin"] == "management"
    retry(lambda: port_open(port), timeout=10, message="the created listener does not accept")
    (created,) = [x for x in m.qdstat("listener", ["name", "port", "idleTimeoutSeconds"])
                  if x["name"] == "extra"]  # fmt: skip
    assert created == {"name": "extra", "port": str(port), "idleTimeoutSeconds": 30}
    blocking(f"amqp://127.0.0.1:{port}").create_sender("via-extra")  # it carries AMQP

    # an attribute with no qrouter equivalent is refused, naming it; nothing is opened
    status, text, _ = m.request(
        {"port": str(free_port()), "sslProfile": "server-tls"},
        operation="CREATE", type=D + "listener", name="tls",
    )  # fmt: skip
    assert status == 400 and "sslProfile" in text
    for bad, named in (
        ({"port": "not-a-port"}, "port"),
        ({"port": str(free_port()), "maxSessions": "10"}, "maxSessions"),
        ({"port": str(free_port()), "authenticatePeer": "maybe"}, "authenticatePeer"),
        ({"port": str(free_port()), "role": "edge"}, "role"),
    ):
        status, text, _ = m.request(bad, operation="CREATE", type=D + "listener", name="bad")
        assert status == 400 and named in text, (bad, status, text)
    status, _, _ = m.request(None, operation="DELETE", type=D + "listener", name="extra")
    assert status == 204
    retry(lambda: not port_open(port), timeout=10, message="the deleted listener still accepts")
    with pytest.raises(ConnectionException):
        BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=5)

    # qdmanage create --type=address --name=fan prefix=fan distribution=multicast
    status, text, row = m.request(
        {"prefix": "fan", "distribution": "multicast"},
        operation="CREATE", type=D + "address", name="fan",
    )  # fmt: skip
    assert status == 201, text
    assert row["name"] == "fan" and row["distribution"] == "multicast"
    rows = m.qdstat("router.config.address", ["name", "prefix", "distribution"])
    assert {"name": "fan", "prefix": "fan", "distribution": "multicast"} in rows
    conn = blocking(r.url)
    a = conn.create_receiver("fan.news", credit=5, name="a")
    b = conn.create_receiver("fan.news", credit=5, name="b")
    send_through(blocking(r.url).create_sender("fan.news"), a, "to all", also=[b])
    # a waypoint (docs/brokers.md) is taken; an attribute qrouter lacks is refused, named
    status, text, row = m.request(
        {"prefix": "wp", "waypoint": "yes"}, operation="CREATE", type=D + "address", name="wp"
    )
    assert status == 201 and row["waypoint"] is True, text
    status, text, _ = m.request(
        {"prefix": "pri", "priority": "5"}, operation="CREATE", type=D + "address", name="pri"
    )
    assert status == 400 and "priority" in text
    status, _, _ = m.request(None, operation="DELETE", type=D + "address", name="fan")
    assert status == 204
    names = [x["name"] for x in m.qdstat("address", ["name"])]
    assert "fan" not in names


def test_monitor_may_qdstat_but_not_create(router: Any, tmp_path: Path) -> None:
    """Without a policy, a users file's users are monitors (qrouter/policy.py): qdstat works,
    qdmanage create is refused with 403."""
    r = router(
        config={"users_file": str(users_file(tmp_path))},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True}],
    )
    conn = BlockingConnection(
        r.url, timeout=10, user="mon", password=PASSWORDS["mon"],
        allowed_mechs="PLAIN", allow_insecure_mechs=True,
    )  # fmt: skip
    try:
        m = Mgmt(conn)
        (general,) = m.qdstat("router", ["id", "connectionCount"])
        assert general["connectionCount"] == 1
        status, text, _ = m.request(
            {"port": str(free_port())}, operation="CREATE", type=D + "listener", name="x"
        )
        assert status == 403 and "admin" in text
        status, text, _ = m.request(None, operation="DELETE", type=D + "connection", identity="1")
        assert status == 403
    finally:
        conn.close()


def test_qdstat_views_of_a_mesh(router: Any, blocking: Any) -> None:
    """hub <- edge: edge's connector shows as an outgoing inter-router connection with
    inter-router links, and qdstat -n lists the hub."""
    port = free_port()
    hub = router("hub", extra_args=["--inter-router-listen", f"127.0.0.1:{port}"])
    edge = router("edge", extra_args=["--inter-router-connect", f"127.0.0.1:{port}"])
    m = Mgmt(blocking(edge.url))

    def nodes() -> list[dict[str, Any]]:
        return m.qdstat("router.node", ["id", "nextHop", "cost", "routerLink"])

    (node,) = retry(nodes, timeout=20, message="the mesh never formed")
    assert node["id"] == "hub" and node["cost"] == 1
    assert node["nextHop"] is None  # a neighbour: reached directly, as Dispatch shows it
    (general,) = m.qdstat("router", ["mode", "nodeCount"])
    assert general == {"mode": "interior", "nodeCount": 1}
    conns = m.qdstat("connection", ["container", "role", "dir"])
    assert {"container": "hub", "role": "inter-router", "dir": "out"} in conns
    kinds = {(row["linkType"], row["connectionId"]) for row in m.qdstat("router.link", QDSTAT_L)}
    assert any(kind == "inter-router" for kind, _ in kinds)
    hub_conns = Mgmt(blocking(hub.url)).qdstat("connection", ["container", "role", "dir"])
    assert {"container": "edge", "role": "inter-router", "dir": "in"} in hub_conns


def test_qdmanage_link_routes(router: Any, blocking: Any) -> None:
    """qdmanage create --type=linkRoute (Dispatch's router.config.linkRoute) makes one of
    qrouter's link routes (docs/brokers.md), listed under both names, deleted by its name."""
    r = router()
    m = Mgmt(blocking(r.url))
    status, text, row = m.request(
        {"prefix": "queue.", "direction": "in", "distribution": "linkBalanced"},
        operation="CREATE", type=D + "linkRoute", name="to-broker",
    )  # fmt: skip
    assert status == 201, text
    assert row["name"] == "to-broker" and row["prefix"] == "queue" and row["direction"] == "in"
    rows = m.qdstat("router.config.linkRoute", ["name", "prefix", "direction", "operStatus"])
    # no broker and no mesh advertises the prefix: inactive
    assert rows == [
        {"name": "to-broker", "prefix": "queue", "direction": "in", "operStatus": "inactive"}
    ]
    status, _, ours = m.request(
        {"attributeNames": ["prefix", "direction"]},
        operation="QUERY", type="org.amqp.management", entityType="org.qrouter.linkRoute",
    )  # fmt: skip
    assert status == 200 and ours["results"] == [["queue", "in"]], ours
    for bad, named in (
        ({"prefix": "x", "direction": "in", "containerId": "rabbit"}, "containerId"),
        ({"prefix": "x", "direction": "in", "distribution": "linkDirect"}, "distribution"),
        ({"prefix": "x", "direction": "sideways"}, "direction"),
    ):
        status, text, _ = m.request(bad, operation="CREATE", type=D + "linkRoute", name="bad")
        assert status == 400 and named in text, (bad, status, text)
    status, text, _ = m.request(
        {"prefix": "queue", "direction": "in"},
        operation="CREATE", type=D + "linkRoute", name="again",
    )  # fmt: skip
    assert status == 409, text
    status, _, _ = m.request(None, operation="DELETE", type=D + "linkRoute", name="to-broker")
    assert status == 204
    assert m.qdstat("router.config.linkRoute", ["name"]) == []
