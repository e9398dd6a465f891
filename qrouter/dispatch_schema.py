"""Qpid Dispatch's management entity types over qrouter's tables, so that Dispatch's own tools
(``qdstat -g -c -l -a -n``, ``qdmanage query / create / delete``) work against qrouter.

Type and attribute names are those of Dispatch 1.19's management schema (``qdrouter.json``):
``org.apache.qpid.dispatch.router``, ``.connection``, ``.router.link``, ``.router.address``,
``.router.node``, ``.listener``, ``.connector``, ``.address`` (also by its schema name
``.router.config.address``). Each type here is a function from the rows qrouter/management.py
already builds to Dispatch's attribute names and values; an attribute qrouter has no value for
answers null. CREATE / DELETE on ``.listener``, ``.address`` and ``.connector`` translate the
request into qrouter's own operation (and its checks); an attribute with no qrouter equivalent
is refused with 400 naming it, never ignored. The roles are management's: these are changes,
so they need admin (qrouter/policy.py).

Control path only: a request costs a walk over the tables it asks about.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# qrouter/management.py imports this module from ManagementNode.__init__, after its own
from qrouter.management import (
    EntityType,
    ManagementError,
    ManagementNode,
    Reply,
    Response,
    mesh_of,
)

DISPATCH_PREFIX = "org.apache.qpid.dispatch."

# Dispatch's address hash prefixes (router.address identity/key): L local to this router
# ($management), M<phase> mobile (a client's address), _topo router addresses are R/T
_LOCAL_ADDRESSES = ("$management",)
_DYNAMIC_PREFIX = "_dynamic/"  # qrouter/core.py DYNAMIC_PREFIX


def address_key(address: str) -> str:
    """Dispatch's key of an address: ``L$management``, ``M0queue`` (mobile, phase 0)."""
    return ("L" if address in _LOCAL_ADDRESSES else "M0") + address


def address_of_key(key: str) -> str:
    if key.startswith("M") and len(key) > 1 and key[1].isdigit():
        return key[2:]
    if key[:1] in ("L", "M"):
        return key[1:]
    return key


# -- attribute lists: the schema's, in its order (QUERY's default columns) ------------------

_ENTITY = ("name", "identity", "type")
ROUTER = (
    *_ENTITY, "id", "mode", "area", "version", "helloIntervalSeconds", "helloMaxAgeSeconds",
    "raIntervalSeconds", "raIntervalFluxSeconds", "remoteLsMaxAgeSeconds", "workerThreads",
    "debugDumpFile", "saslConfigPath", "saslConfigName", "allowResumableLinkRoute",
    "defaultDistribution", "timestampsInUTC", "metadata", "addrCount", "linkCount", "nodeCount",
    "connectionCount", "linkRouteCount", "autoLinkCount", "presettledDeliveries",
    "droppedPresettledDeliveries", "acceptedDeliveries", "rejectedDeliveries",
    "releasedDeliveries", "modifiedDeliveries", "deliveriesDelayed1Sec",
    "deliveriesDelayed10Sec", "deliveriesStuck", "deliveriesIngress", "deliveriesEgress",
    "deliveriesTransit", "deliveriesIngressRouteContainer", "deliveriesEgressRouteContainer",
    "deliveriesRedirectedToFallback", "linksBlocked", "uptimeSeconds", "memoryUsage",
)  # fmt: skip
CONNECTION = (
    *_ENTITY, "container", "opened", "host", "dir", "role", "protocol", "isAuthenticated",
    "user", "isEncrypted", "sslProto", "sslCipher", "sslSsf", "tenant", "properties", "sasl",
    "ssl", "uptimeSeconds", "lastDlvSeconds", "enableProtocolTrace", "adminStatus",
    "operStatus", "active",
)  # fmt: skip
LINK = (
    *_ENTITY, "linkType", "linkDir", "owningAddr", "capacity", "peer", "undeliveredCount",
    "unsettledCount", "deliveryCount", "connectionId", "adminStatus", "operStatus", "linkName",
    "presettledCount", "droppedPresettledCount", "acceptedCount", "rejectedCount",
    "releasedCount", "modifiedCount", "deliveriesDelayed1Sec", "deliveriesDelayed10Sec",
    "deliveriesStuck", "openMovedStreams", "creditAvailable", "zeroCreditSeconds",
    "settleRate", "ingressHistogram", "priority",
)  # fmt: skip
ROUTER_ADDRESS = (
    *_ENTITY, "key", "distribution", "inProcess", "subscriberCount", "remoteCount",
    "containerCount", "remoteHostRouters", "deliveriesIngress", "deliveriesEgress",
    "deliveriesTransit", "deliveriesToContainer", "deliveriesFromContainer",
    "deliveriesEgressRouteContainer", "deliveriesIngressRouteContainer",
    "deliveriesRedirectedToFallback", "transitOutstanding", "trackedDeliveries", "priority",
)  # fmt: skip
NODE = (
    *_ENTITY, "id", "protocolFamily", "instance", "linkState", "nextHop", "validOrigins",
    "address", "routerLink", "cost", "lastTopoChange", "index",
)  # fmt: skip
LISTENER = (
    *_ENTITY, "host", "port", "protocolFamily", "socketAddressFamily", "role", "cost",
    "sslProfile", "saslMechanisms", "authenticatePeer", "requireEncryption", "requireSsl",
    "maxFrameSize", "maxSessions", "maxSessionFrames", "idleTimeoutSeconds",
    "initialHandshakeTimeoutSeconds", "stripAnnotations", "linkCapacity", "multiTenant",
    "failoverUrls", "healthz", "metrics", "websockets", "http", "httpRootDir",
    "messageLoggingComponents", "policyVhost",
)  # fmt: skip
CONNECTOR = (
    *_ENTITY, "host", "port", "protocolFamily", "socketAddressFamily", "role", "cost",
    "sslProfile", "saslMechanisms", "allowRedirect", "maxFrameSize", "maxSessionFrames",
    "idleTimeoutSeconds", "stripAnnotations", "linkCapacity", "verifyHostname",
    "saslUsername", "saslPassword", "messageLoggingComponents", "failoverUrls",
    "connectionStatus", "connectionMsg", "policyVhost",
)  # fmt: skip
ADDRESS = (
    *_ENTITY, "prefix", "pattern", "distribution", "waypoint", "ingressPhase", "egressPhase",
    "priority", "enableFallback",
)  # fmt: skip
AUTOLINK = (
    *_ENTITY, "address", "direction", "phase", "containerId", "connection", "externalAddress",
    "operStatus", "linkRef", "lastError",
)  # fmt: skip

LINKROUTE = (
    *_ENTITY, "prefix", "pattern", "addExternalPrefix", "delExternalPrefix", "containerId",
    "connection", "distribution", "direction", "operStatus",
)  # fmt: skip

# what CREATE takes, as qrouter's name (None: taken and checked by the translation itself)
_LISTENER_CREATE: dict[str, str | None] = {
    "host": "host",
    "port": "port",
    "role": "role",
    "saslMechanisms": "sasl_mechanisms",
    "authenticatePeer": "require_auth",
    "maxFrameSize": "max_frame_size",
    "idleTimeoutSeconds": "idle_timeout",
    "initialHandshakeTimeoutSeconds": "handshake_timeout",
}
_CONNECTOR_CREATE: dict[str, str | None] = {
    "host": "host",
    "port": "port",
    "role": None,  # inter-router, or route-container (passed on by create_connector)
    "cost": "cost",
    "verifyHostname": "tls_verify_hostname",
    "saslUsername": "sasl_username",
}
_ADDRESS_CREATE: dict[str, str | None] = {
    "prefix": "prefix",
    "pattern": "pattern",
    "distribution": "distribution",
    "waypoint": "waypoint",
}
# attributes CREATE accepts only with the value Dispatch treats as "off"
_ADDRESS_DEFAULTS: dict[str, Any] = {"enableFallback": False}
_AUTOLINK_CREATE: dict[str, str | None] = {
    "address": "address",
    "direction": "direction",
    "connection": "connection",
    "externalAddress": "external_address",
}
_AUTOLINK_DEFAULTS: dict[str, Any] = {}
_LINKROUTE_CREATE: dict[str, str | None] = {
    "prefix": "prefix",
    "pattern": "pattern",
    "direction": "direction",
    "connection": "connection",
    "distribution": None,  # Dispatch's only value, linkBalanced: checked by create_linkroute
}
_IGNORED = ("name", "identity", "type")
_PORT_NAMES = {"amqp": 5672, "amqps": 5671}


@dataclass
class DispatchType(EntityType):
    """A management EntityType named as Dispatch names it (`name` without DISPATCH_PREFIX)."""

    # a row only admins may see (reply addresses are private, as in management's own types)
    private: Callable[[dict[str, Any]], bool] | None = None

    @property
    def full_name(self) -> str:  # type: ignore[override]
        return DISPATCH_PREFIX + self.name


class DispatchSchema:
    """Dispatch's entity types over one ManagementNode."""

    def __init__(self, node: ManagementNode) -> None:
        self.node = node
        self.address_names: dict[str, str] = {}  # Dispatch name of a created entry -> identity
        # Dispatch name given to a link route created through this type -> (prefix, pattern,
        # direction); others are named as qrouter names them ("in:prefix")
        self.linkroute_names: dict[str, tuple[str, str, str]] = {}
        address = DispatchType(
            "router.config.address",
            ADDRESS,
            self.address_rows,
            ("QUERY", "READ", "CREATE", "DELETE"),
            create=self.create_address,
            delete=self.delete_address,
        )
        types = [
            DispatchType("router", ROUTER, lambda: [self.router_row()]),
            DispatchType(
                "connection",
                CONNECTION,
                self.connection_rows,
                ("QUERY", "READ", "DELETE"),
                delete=lambda row: node.delete_connection({"identity": row["identity"]}),
            ),
            DispatchType("router.link", LINK, self.link_rows, private=_private("owningAddr")),
            DispatchType(
                "router.address", ROUTER_ADDRESS, self.router_address_rows, private=_private("key")
            ),
            DispatchType("router.node", NODE, self.node_rows),
            DispatchType(
                "listener",
                LISTENER,
                self.listener_rows,
                ("QUERY", "READ", "CREATE", "DELETE"),
                create=self.create_listener,
                delete=lambda row: node.delete_listener({"name": row["name"]}),
            ),
            DispatchType(
                "connector",
                CONNECTOR,
                self.connector_rows,
                ("QUERY", "READ", "CREATE", "DELETE"),
                create=self.create_connector,
                delete=self.delete_connector,
            ),
            address,
            DispatchType(
                "router.config.autoLink",
                AUTOLINK,
                self.autolink_rows,
                ("QUERY", "READ", "CREATE", "DELETE"),
                create=self.create_autolink,
                delete=node.delete_autolink,
            ),
            DispatchType(
                "router.config.linkRoute",
                LINKROUTE,
                self.linkroute_rows,
                ("QUERY", "READ", "CREATE", "DELETE"),
                create=self.create_linkroute,
                delete=self.delete_linkroute,
            ),
        ]
        for t in types:  # every row has every attribute of its type (null: no value here)
            t.rows = _completed(t.attributes, t.rows)
        self.types: dict[str, DispatchType] = {t.full_name: t for t in types}
        # qdmanage's --type=address and the configuration section's name
        self.types[DISPATCH_PREFIX + "address"] = address
        self.types[DISPATCH_PREFIX + "autoLink"] = self.types[
            DISPATCH_PREFIX + "router.config.autoLink"
        ]
        self.types[DISPATCH_PREFIX + "linkRoute"] = self.types[
            DISPATCH_PREFIX + "router.config.linkRoute"
        ]

    def lookup(self, name: str) -> DispatchType | None:
        return self.types.get(name)

    def all(self) -> list[EntityType]:
        return list({t.full_name: t for t in self.types.values()}.values())

    # -- router ------------------------------------------------------------------------------

    def router_row(self) -> dict[str, Any]:
        ours = self.node.router_row()
        cfg = self.node.core.config
        return _entity(
            "router",
            ours["name"],
            ours["identity"],
            id=ours["id"],
            mode=ours["mode"],
            area="0",
            version=ours["version"],
            helloIntervalSeconds=int(cfg.hello_interval),
            helloMaxAgeSeconds=int(cfg.hello_max_age),
            workerThreads=1,
            allowResumableLinkRoute=True,  # resumption passes through (docs/brokers.md)
            defaultDistribution=cfg.default_distribution,
            timestampsInUTC=True,
            addrCount=ours["address_count"],
            linkCount=ours["link_count"],
            nodeCount=ours["mesh_router_count"],
            connectionCount=ours["connection_count"],
            linkRouteCount=len(self.node.core.linkroutes.routes),
            autoLinkCount=len(self.node.core.brokers.autolinks),
            acceptedDeliveries=ours["accepted"],
            rejectedDeliveries=ours["rejected"],
            releasedDeliveries=ours["released"],
            modifiedDeliveries=ours["modified"],
            droppedPresettledDeliveries=ours["dropped"],
            deliveriesStuck=ours["stuck_deliveries"],
            deliveriesIngress=ours["deliveries_in"],
            deliveriesEgress=ours["deliveries_out"],
            deliveriesIngressRouteContainer=0,
            deliveriesEgressRouteContainer=0,
            deliveriesRedirectedToFallback=0,
            linksBlocked=ours["links_without_credit"],
            uptimeSeconds=int(ours["uptime_seconds"]),
        )

    # -- connections and links ---------------------------------------------------------------

    def connection_rows(self) -> list[dict[str, Any]]:
        node = self.node
        by_id = {str(c.conn_id): c for c in node.core.connections}
        rows = []
        for ours in node.connection_rows():
            conn = by_id.get(ours["identity"])
            outgoing = conn is not None and getattr(conn.handler, "connector", None) is not None
            role = "inter-router" if outgoing else ours["role"]
            rows.append(
                _entity(
                    "connection",
                    ours["name"],
                    ours["identity"],
                    container=ours["container"],
                    opened=ours["opened"],
                    host=ours["host"],
                    dir="out" if outgoing else "in",
                    role=role,
                    protocol="amqp",
                    isAuthenticated=ours["user"] is not None,
                    user=ours["user"],
                    isEncrypted=ours["tls"],
                    ssl=ours["tls"],
                    sasl=None,
                    properties={},
                    enableProtocolTrace=False,
                    adminStatus="enabled",
                    operStatus="closing" if ours["closed"] else "up",
                    active=True,
                )
            )
        return rows

    def link_rows(self) -> list[dict[str, Any]]:
        node = self.node
        capacity = node.core.config.link_capacity
        conns = {str(c.conn_id): c for c in node.core.connections}
        rows = []
        for ours in node.link_rows():
            if ours["connection"] is None:
                continue  # a suspended durable terminus: Dispatch has no such link
            conn = conns.get(str(ours["connection"]))
            mesh = conn is not None and (
                getattr(conn.handler, "connector", None) is not None
                or getattr(getattr(conn.handler, "listener", None), "role", None) == "inter-router"
            )
            out = ours["direction"] == "out"
            address = ours["address"]
            rows.append(
                _entity(
                    "router.link",
                    ours["name"],
                    ours["identity"],
                    linkType="inter-router" if mesh else "endpoint",
                    linkDir=ours["direction"],
                    owningAddr=address_key(address) if address is not None else None,
                    capacity=capacity,
                    undeliveredCount=ours["pending"],
                    unsettledCount=ours["unsettled"],
                    # out: deliveries sent; in: the link's delivery-count (2.6.7), which counts
                    # the transfers received from the sender's initial-delivery-count
                    deliveryCount=ours["delivered"] if out else ours["delivery_count"],
                    connectionId=ours["connection"],
                    adminStatus="enabled",
                    operStatus="up" if ours["state"] == "attached" else "down",
                    linkName=ours["name"],
                    # outcomes are counted where they end: on the producer's link (in);
                    # a consumer's link (out) has no such counters here, so null
                    acceptedCount=None if out else ours["accepted"],
                    rejectedCount=None if out else ours["rejected"],
                    releasedCount=None if out else ours["released"],
                    modifiedCount=None if out else ours["modified"],
                    creditAvailable=ours["credit"],
                    zeroCreditSeconds=int(ours["no_credit_seconds"] or 0),
                )
            )
        return rows

    # -- addresses ---------------------------------------------------------------------------

    def router_address_rows(self) -> list[dict[str, Any]]:
        standalone = _mesh(self.node) is None
        rows = []
        for ours in self.node.router_address_rows():
            key = address_key(ours["name"])
            rows.append(
                _entity(
                    "router.address",
                    key,
                    key,
                    key=key,
                    distribution=ours["distribution"],
                    inProcess=0,
                    subscriberCount=ours["consumers"],
                    remoteCount=0 if standalone else None,
                    containerCount=0,
                    remoteHostRouters=[] if standalone else None,
                    deliveriesIngress=ours["deliveries_in"],
                    deliveriesEgress=ours["deliveries_out"],
                    deliveriesTransit=0 if standalone else None,
                    deliveriesToContainer=0,
                    deliveriesFromContainer=0,
                    deliveriesEgressRouteContainer=0,
                    deliveriesIngressRouteContainer=0,
                    deliveriesRedirectedToFallback=0,
                )
            )
        return rows

    def address_rows(self) -> list[dict[str, Any]]:
        names = {identity: name for name, identity in self.address_names.items()}
        rows = []
        for ours in self.node.address_entry_rows():
            rows.append(
                _entity(
                    "router.config.address",
                    names.get(ours["identity"], ours["identity"]),
                    ours["identity"],
                    prefix=ours["prefix"],
                    pattern=ours["pattern"],
                    distribution=ours["distribution"],
                    waypoint=ours["waypoint"],
                    enableFallback=False,
                )
            )
        return rows

    def autolink_rows(self) -> list[dict[str, Any]]:
        return [
            _entity(
                "router.config.autoLink",
                ours["name"],
                ours["identity"],
                address=ours["address"],
                direction=ours["direction"],
                phase=1 if ours["direction"] == "in" else 0,  # the waypoint's phases
                connection=ours["connection"],
                externalAddress=ours["external_address"],
                operStatus=ours["operStatus"],
            )
            for ours in self.node.core.brokers.autolink_rows()
        ]

    def create_autolink(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        ours = _translate("autoLink", attrs, _AUTOLINK_CREATE, _AUTOLINK_DEFAULTS)
        reply = self.node.create_autolink(name, ours)
        assert isinstance(reply, Response)
        rows = self.autolink_rows()
        return Response(reply.status, reply.description, rows[-1])

    def linkroute_rows(self) -> list[dict[str, Any]]:
        names = {key: name for name, key in self.linkroute_names.items()}
        return [
            _entity(
                "router.config.linkRoute",
                names.get((ours["prefix"], ours["pattern"], ours["direction"]), ours["name"]),
                ours["identity"],
                prefix=ours["prefix"] or None,
                pattern=ours["pattern"] or None,
                connection=ours["connection"] or None,
                distribution="linkBalanced",
                direction=ours["direction"],
                operStatus=ours["operStatus"],
            )
            for ours in self.node.core.linkroutes.rows()
        ]

    def create_linkroute(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        """qdmanage create --type=linkRoute: prefix or pattern, direction, connection."""
        distribution = attrs.get("distribution")
        if distribution is not None and distribution != "linkBalanced":
            raise ManagementError(
                400, f"linkRoute attribute 'distribution'={distribution!r} is not supported"
            )
        if name is not None and name in self.linkroute_names:
            raise ManagementError(409, f"a linkRoute named {name!r} exists")
        ours = _translate("linkRoute", attrs, _LINKROUTE_CREATE, {})
        reply = self.node.create_linkroute(None, ours)
        assert isinstance(reply, Response)
        body = reply.body
        if name is not None:
            self.linkroute_names[name] = (body["prefix"], body["pattern"], body["direction"])
        return Response(reply.status, reply.description, self.linkroute_rows()[-1])

    def delete_linkroute(self, row: dict[str, Any]) -> Reply:
        reply = self.node.delete_linkroute({"identity": row["identity"], "name": row["name"]})
        self.linkroute_names.pop(row["name"], None)
        return reply

    def create_address(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        ours = _translate("address", attrs, _ADDRESS_CREATE, _ADDRESS_DEFAULTS)
        if name is not None and name in self.address_names:
            raise ManagementError(409, f"an address named {name!r} exists")
        reply = self.node.create_address(None, ours)
        assert isinstance(reply, Response)
        identity = reply.body["identity"]
        if name is not None:
            self.address_names[name] = identity
        return Response(reply.status, reply.description, self._row(self.address_rows, identity))

    def delete_address(self, row: dict[str, Any]) -> Reply:
        reply = self.node.delete_address(
            {"identity": row["identity"], "prefix": row["prefix"], "pattern": row["pattern"]}
        )
        for name, identity in list(self.address_names.items()):
            if identity == row["identity"]:
                del self.address_names[name]
        return reply

    # -- listeners and connectors ------------------------------------------------------------

    def listener_rows(self) -> list[dict[str, Any]]:
        rows = []
        for ours in self.node.listener_rows():
            rows.append(
                _entity(
                    "listener",
                    ours["name"],
                    ours["identity"],
                    host=ours["host"],
                    port=str(ours["port"]),
                    protocolFamily=None,
                    role=ours["role"],
                    saslMechanisms=" ".join(ours["sasl_mechanisms"]),
                    authenticatePeer=ours["require_auth"],
                    requireEncryption=ours["tls"],
                    requireSsl=ours["tls"],
                    maxFrameSize=ours["max_frame_size"],
                    idleTimeoutSeconds=int(ours["idle_timeout"]),
                    linkCapacity=self.node.core.config.link_capacity,
                    healthz=False,
                    metrics=False,
                    websockets=False,
                    http=False,
                )
            )
        return rows

    def create_listener(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        ours = _translate("listener", attrs, _LISTENER_CREATE, {})
        return self.node.create_listener(name, ours)

    def connector_rows(self) -> list[dict[str, Any]]:
        rows = []
        for ours in self.node.connector_rows():
            rows.append(
                _entity(
                    "connector",
                    ours["name"],
                    ours["identity"],
                    host=ours["host"],
                    port=str(ours["port"]),
                    role=ours["role"],
                    cost=ours["cost"],
                    connectionStatus="SUCCESS" if ours["connected"] else "CONNECTING",
                )
            )
        return rows

    def create_connector(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        role = attrs.get("role", "inter-router")
        if role not in ("inter-router", "route-container"):
            raise ManagementError(
                400,
                f"connector role {role!r}: qrouter's connectors are inter-router or "
                "route-container (a broker, docs/brokers.md)",
            )
        ours = _translate("connector", attrs, _CONNECTOR_CREATE, {})
        if role == "route-container":
            ours["role"] = role
        create = self.node.types["connector"].create
        assert create is not None
        return create(name, ours)

    def delete_connector(self, row: dict[str, Any]) -> Reply:
        delete = self.node.types["connector"].delete
        assert delete is not None
        return delete({"identity": row["identity"], "name": row["name"]})

    # -- the mesh ----------------------------------------------------------------------------

    def node_rows(self) -> list[dict[str, Any]]:
        rows = []
        for index, ours in enumerate(self.node.node_rows()):
            rows.append(
                _entity(
                    "router.node",
                    ours["name"],
                    ours["identity"],
                    id=ours["id"],
                    protocolFamily="IPv4",
                    linkState=ours["peers"],
                    nextHop=None if ours["neighbour"] else ours["next_hop"],
                    validOrigins=[],
                    address=f"amqp:/_topo/0/{ours['id']}/$management",
                    routerLink=ours["link_id"],
                    cost=ours["cost"],
                    index=index,
                )
            )
        return rows

    def _row(self, rows: Callable[[], list[dict[str, Any]]], identity: str) -> dict[str, Any]:
        return next((row for row in rows() if row["identity"] == identity), {})


def _entity(kind: str, name: Any, identity: Any, **values: Any) -> dict[str, Any]:
    return {"name": name, "identity": str(identity), "type": DISPATCH_PREFIX + kind, **values}


def _completed(
    attributes: tuple[str, ...], rows: Callable[[], Iterable[dict[str, Any]]]
) -> Callable[[], list[dict[str, Any]]]:
    def complete() -> list[dict[str, Any]]:
        return [{**dict.fromkeys(attributes), **row} for row in rows()]

    return complete


def _mesh(node: ManagementNode) -> Any:
    return mesh_of(node.core)


def _private(key: str) -> Callable[[dict[str, Any]], bool]:
    def private(row: dict[str, Any]) -> bool:
        value = row.get(key)
        return isinstance(value, str) and address_of_key(value).startswith(_DYNAMIC_PREFIX)

    return private


def _translate(
    kind: str, attrs: dict[str, Any], names: dict[str, str | None], defaults: dict[str, Any]
) -> dict[str, Any]:
    """A CREATE's Dispatch attributes as qrouter's: each one mapped, or refused with 400."""
    ours: dict[str, Any] = {}
    for key, value in attrs.items():
        if key in _IGNORED or value is None:
            continue
        if key in defaults:
            if _boolean(key, value) != defaults[key]:
                raise ManagementError(
                    400, f"{kind} attribute {key!r}={value!r} is not supported by qrouter"
                )
            continue
        if key not in names:
            raise ManagementError(400, f"{kind} attribute {key!r} is not supported by qrouter")
        target = names[key]
        if target is None:
            continue
        ours[target] = _convert(target, key, value)
    return ours


def _convert(target: str, key: str, value: Any) -> Any:
    """qdmanage sends every attribute as a string; qrouter's checks want typed values."""
    if target == "port":
        text = str(value).strip().lower()
        if text in _PORT_NAMES:
            return _PORT_NAMES[text]
        return _integer(key, text)
    if target in ("max_frame_size", "cost"):
        return _integer(key, value)
    if target in ("idle_timeout", "handshake_timeout"):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ManagementError(400, f"{key}: {value!r} is not a number") from None
    if target in ("require_auth", "tls_verify_hostname", "waypoint"):
        return _boolean(key, value)
    if target == "sasl_mechanisms":
        return str(value).split()
    return value


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ManagementError(400, f"{key}: {value!r} is not an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ManagementError(400, f"{key}: {value!r} is not an integer") from None


def _boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ManagementError(400, f"{key}: {value!r} is not a boolean")
