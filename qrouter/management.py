"""The ``$management`` node: AMQP Management (OASIS working draft, "AMQP Management Version
1.0") over the router's own tables, as Qpid Dispatch's ``qdmanage`` / ``qdstat`` use it.

A request is a message sent to ``$management`` with ``reply-to`` set (usually a dynamic
address) and application-properties ``operation`` (QUERY, READ, CREATE, UPDATE, DELETE,
GET-TYPES, GET-OPERATIONS, GET-ATTRIBUTES, GET-MGMT-NODES), ``type`` (the entity type) and
``name`` or ``identity``; CREATE and UPDATE carry the attributes as a map body, QUERY a map
``{"attributeNames": [...]}``. The response goes to the request's ``reply-to`` with
``correlation-id`` = the request's ``message-id`` (its ``correlation-id`` if it has none),
application-properties ``statusCode`` (HTTP-like: 200, 201, 204, 400, 404, 405, 409, 500, 501)
and ``statusDescription``, and the result as the body: a map of attributes (READ, CREATE,
UPDATE), nothing (DELETE), or ``{"attributeNames": [...], "results": [[...], ...]}`` (QUERY).

Entity types live under ``org.qrouter.`` (``org.qrouter.link``); a request may give the short
name (``link``). For QUERY, ``type`` may also be ``org.amqp.management`` with the entity type
in ``entityType``, as qdmanage sends it. Attribute names are snake_case, like the keys of the
configuration file, so that ``CREATE listener`` takes what a ``[[listener]]`` table takes.

Control path only: a request costs a walk over the tables it asks about; nothing here runs per
message of other links.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from qrouter import __version__
from qrouter._fast.codec import UByte, ULong
from qrouter._fast.engine import error_value, source_value, target_value
from qrouter.addresses import AddressEntry
from qrouter.config import (
    ConfigError,
    ListenerConfig,
    autolink_from_table,
    connector_from_table,
    linkroute_from_table,
    listener_from_table,
)
from qrouter.log import tag
from qrouter.management_replies import ReplyBound
from qrouter.message import DecodeError, Message, decode_leading, decode_message, encode_message

if TYPE_CHECKING:
    from qrouter.core import Core

log = logging.getLogger("qrouter.management")
# one line per management change (and per refused or failed request): who, what, when, where
audit = logging.getLogger("qrouter.audit")
# the trail is kept at info whatever the router's level (``--log-level warning`` must not drop
# it); ``[log] modules = { audit = "warning" }`` keeps only the refusals and failures
audit.setLevel(logging.INFO)

MANAGEMENT_ADDRESS = "$management"
TYPE_PREFIX = "org.qrouter."
MANAGEMENT_TYPE = "org.amqp.management"
REQUEST_CREDIT = 100  # requests a client may have in flight on one link

# what each management role may do (qrouter/policy.py gives the roles): anything else changes
# the router and needs admin
READ_OPERATIONS = frozenset(
    ("QUERY", "READ", "GET-TYPES", "GET-OPERATIONS", "GET-ATTRIBUTES", "GET-MGMT-NODES")
)
DYNAMIC_PREFIX = "_dynamic/"  # qrouter/core.py DYNAMIC_PREFIX: reply addresses, private

# Link.state (qrouter/_fast/constants.pxd)
_LINK_STATES = {0: "attaching", 1: "attached", 2: "detached"}


class ManagementError(Exception):
    """A request that fails with this status code and description."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


@dataclass
class Response:
    status: int
    description: str
    body: Any = None


Reply = Response | Coroutine[Any, Any, Response]


@dataclass
class Requester:
    """Who sent a request: the user (None: anonymous), the role the policy gives them, the
    connection, its remote address and the listener it came in on."""

    user: str | None
    role: str  # "admin" | "monitor" | "none"
    conn_id: int | None = None
    host: str | None = None
    listener: str | None = None

    def describe(self) -> str:
        return (
            f"user={_clip(self.user) if self.user else '-'} role={self.role} from={self.host or '-'} "
            f"conn=C{self.conn_id} listener={self.listener or '-'}"
        )


# -- listeners: the server opens and closes them -----------------------------------------------


@dataclass
class RunningListener:
    """A listener the server has open: its name (from CREATE, or ``HOST:PORT`` for the
    configured ones), its configuration, the asyncio server, and where it came from."""

    name: str
    config: ListenerConfig
    server: asyncio.Server | None
    origin: str = "config"  # "config" | "management"

    def bound(self) -> list[str]:
        if self.server is None:
            return []
        out = []
        for sock in self.server.sockets:
            host, port = sock.getsockname()[:2]
            out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        return out


class ListenerControl(Protocol):
    """What the management node needs from the server (qrouter/server.py `Server`)."""

    listening: list[RunningListener]

    async def open_listener(
        self, lc: ListenerConfig, name: str, origin: str = "management"
    ) -> RunningListener: ...

    def close_listener(self, running: RunningListener) -> None: ...


# -- entity types ------------------------------------------------------------------------------


@dataclass
class EntityType:
    """One entity type: its attributes (in QUERY's default order) and operations."""

    name: str
    attributes: tuple[str, ...]
    rows: Callable[[], Iterable[dict[str, Any]]]
    operations: tuple[str, ...] = ("QUERY", "READ")
    create: Callable[[str | None, dict[str, Any]], Reply] | None = None
    update: Callable[[dict[str, Any], dict[str, Any]], Reply] | None = None
    delete: Callable[[dict[str, Any]], Reply] | None = None
    doc: str = ""

    @property
    def full_name(self) -> str:
        return TYPE_PREFIX + self.name


def _ops(*extra: str) -> tuple[str, ...]:
    return ("QUERY", "READ", *extra)


MAX_REQUEST_BYTES = 65536  # the max-message-size of a $management link


class ManagementNode:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.listeners: ListenerControl | None = None  # set by the server
        self.created_entries: set[tuple[str, str]] = set()  # address entries made at run time
        self.connector_names: dict[int, str] = {}  # id(ConnectorConfig) -> name given by CREATE
        self.started = time.time()
        self.requests = 0
        self.bad_requests = 0  # requests that did not decode
        self._pending: set[asyncio.Task[None]] = set()
        # replies held for a requester that does not read them (qrouter/management_replies.py)
        self.replies = ReplyBound(core.engine, REQUEST_CREDIT)
        self.types: dict[str, EntityType] = {
            t.name: t
            for t in (
                EntityType(
                    "router",
                    ROUTER_ATTRIBUTES,
                    lambda: [self.router_row()],
                    _ops("UPDATE"),
                    update=self.update_router,
                    doc="this router: identity, version, counts, store",
                ),
                EntityType(
                    "listener",
                    LISTENER_ATTRIBUTES,
                    self.listener_rows,
                    _ops("CREATE", "DELETE"),
                    create=self.create_listener,
                    delete=self.delete_listener,
                    doc="sockets the router accepts connections on",
                ),
                EntityType(
                    "connector",
                    CONNECTOR_ATTRIBUTES,
                    self.connector_rows,
                    _ops("CREATE", "DELETE"),
                    create=self.create_connector,
                    delete=self.delete_connector,
                    doc="outgoing connections to routers and brokers ([[connector]] in the config)",
                ),
                EntityType(
                    "autoLink",
                    AUTOLINK_ATTRIBUTES,
                    lambda: self.core.brokers.autolink_rows(),
                    _ops("CREATE", "DELETE"),
                    create=self.create_autolink,
                    delete=self.delete_autolink,
                    doc="links kept attached to broker queues ([[autolink]], docs/brokers.md)",
                ),
                EntityType(
                    "linkRoute",
                    LINKROUTE_ATTRIBUTES,
                    lambda: self.core.linkroutes.rows(),
                    _ops("CREATE", "DELETE"),
                    create=self.create_linkroute,
                    delete=self.delete_linkroute,
                    doc="links routed to brokers ([[linkroute]], docs/brokers.md)",
                ),
                EntityType(
                    "address",
                    ADDRESS_ATTRIBUTES,
                    self.address_entry_rows,
                    _ops("CREATE", "UPDATE", "DELETE"),
                    create=self.create_address,
                    update=self.update_address,
                    delete=self.delete_address,
                    doc="address entries (prefix or pattern -> distribution)",
                ),
                EntityType(
                    "router.address",
                    ROUTER_ADDRESS_ATTRIBUTES,
                    self.router_address_rows,
                    doc="addresses in use in the data plane, with their counters",
                ),
                EntityType(
                    "connection",
                    CONNECTION_ATTRIBUTES,
                    self.connection_rows,
                    _ops("UPDATE", "DELETE"),
                    update=self.update_connection,
                    delete=self.delete_connection,
                    doc="open AMQP connections",
                ),
                EntityType(
                    "link",
                    LINK_ATTRIBUTES,
                    self.link_rows,
                    doc="attached links and suspended durable ones",
                ),
                EntityType(
                    "terminus",
                    TERMINUS_ATTRIBUTES,
                    self.terminus_rows,
                    _ops("DELETE"),
                    delete=self.delete_terminus,
                    doc="the link registry: termini, attached and suspended",
                ),
                EntityType(
                    "node",
                    NODE_ATTRIBUTES,
                    self.node_rows,
                    doc="routers of the mesh reachable from this one",
                ),
                EntityType(
                    "policy.group",
                    POLICY_GROUP_ATTRIBUTES,
                    lambda: self.core.policy.group_rows(),
                    doc="groups of the [policy]: members, role, connections, refusals by rule",
                ),
                EntityType(
                    "topic",
                    TOPIC_ATTRIBUTES,
                    self.topic_rows,
                    doc="topics with a guarantee: their links and the records held",
                ),
                EntityType(
                    "limit",
                    LIMIT_ATTRIBUTES,
                    self.limit_rows,
                    doc="limits ([limits] in the config): value, use, times exceeded",
                ),
            )
        }
        from qrouter.dispatch_schema import DispatchSchema  # it builds on this module

        self.dispatch = DispatchSchema(self)  # Qpid Dispatch's types, for qdstat / qdmanage

    # -- the link ------------------------------------------------------------------------------

    def claims(self, link: Any, fields: dict[str, Any]) -> bool:
        """Attach `link` as a management request link if it sends to ``$management``;
        False (and nothing done) for any other link."""
        if link.is_sender:
            return False
        target = fields.get("target")
        if not isinstance(target, dict) or target.get("address") != MANAGEMENT_ADDRESS:
            return False
        source = fields.get("source")
        link.attach(
            {
                "snd_settle_mode": UByte(_mode(fields.get("snd_settle_mode"), 2)),
                "rcv_settle_mode": UByte(0),  # 3.8.2: we settle first (accept, then answer)
                "source": source_value(source) if isinstance(source, dict) else None,
                "target": target_value({"address": MANAGEMENT_ADDRESS}),
                # 2.7.3: requests are small (a CREATE is a few KiB); a larger one is refused as
                # it arrives, before the router buffers or decodes it
                "max_message_size": ULong(MAX_REQUEST_BYTES),
            }
        )
        link.bind_endpoint()
        link.flow(REQUEST_CREDIT)
        log.debug("%s management link %r attached", tag(link.conn.conn_id, link.handle), link.name)
        return True

    def on_message(self, link: Any, delivery: Any, payload: bytes) -> None:
        """One request from a ``$management`` link: accept it, answer to its reply-to."""
        if link.credit <= REQUEST_CREDIT // 2 and self.replies.may_renew(link):
            link.flow(REQUEST_CREDIT)
        self.requests += 1
        if self.replies.over(link.conn.conn_id):
            self.replies.refused += 1
            description = (
                f"management replies waiting for this connection limit ({self.replies.limit} "
                f"replies or {self.replies.backlog} octets unwritten) reached; read the replies"
            )
            delivery.update(0x25, error_value("amqp:resource-limit-exceeded", description))
            return
        try:
            request = decode_message(payload)
        except DecodeError as exc:
            self._undecodable(link, delivery, payload, exc)
            return
        delivery.update(0x24)  # 3.4.2 accepted (and settled)
        reply_to = request.reply_to
        if not reply_to or not isinstance(reply_to, str):
            # 3.2.4: reply-to is an address (a string); without one nobody hears the answer
            log.warning(
                "%s management request without a reply-to address: dropped",
                tag(link.conn.conn_id),
            )
            return
        correlation = (
            request.message_id if request.message_id is not None else (request.correlation_id)
        )
        self.replies.sent(link.conn.conn_id, reply_to)
        requester = self.requester(link.conn)
        answer = self.handle(request, user=link.conn.user, requester=requester)
        if isinstance(answer, Response):
            self._audit(request, requester, answer)
            self._send(reply_to, correlation, answer)
            return
        task = asyncio.get_running_loop().create_task(
            self._finish(reply_to, correlation, answer, request, requester)
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _undecodable(self, link: Any, delivery: Any, payload: bytes, exc: DecodeError) -> None:
        """A request that does not decode (a bound of the codec, or plain garbage): answered
        with status 400 when its properties still name a reply-to, else REJECTED with
        amqp:decode-error (3.4.3). The link and its connection go on."""
        self.bad_requests += 1
        log.warning("%s undecodable management request: %s", tag(link.conn.conn_id), exc)
        head = decode_leading(payload)
        reply_to = head.reply_to if isinstance(head.reply_to, str) else None
        if not reply_to:
            delivery.update(0x25, error_value("amqp:decode-error", f"management request: {exc}"))
            return
        delivery.update(0x24)
        correlation = head.message_id if head.message_id is not None else head.correlation_id
        self.replies.sent(link.conn.conn_id, reply_to)
        self._send(reply_to, correlation, Response(400, f"request does not decode: {exc}"))

    async def _finish(
        self,
        reply_to: str,
        correlation: Any,
        answer: Coroutine[Any, Any, Response],
        request: Message | None = None,
        requester: Requester | None = None,
    ) -> None:
        try:
            response = await answer
        except ManagementError as exc:
            response = Response(exc.status, exc.description)
        except Exception as exc:  # noqa: BLE001 - the requester gets a 500, the log the detail
            log.exception("management request failed")
            response = Response(500, f"internal error: {exc}")
        if request is not None:
            self._audit(request, requester, response)
        self._send(reply_to, correlation, response)

    # -- who may do what -----------------------------------------------------------------------

    def requester(self, conn: Any) -> Requester:
        """The requester behind a connection: the role comes from the core's policy, from
        the connection's user, listener and remote host (qrouter/policy.py)."""
        handler = getattr(conn, "handler", None)
        info = getattr(handler, "info", None)
        role = self.core.policy.management_role(info) if info is not None else "none"
        transport = conn.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        lc = getattr(handler, "listener", None)
        listener = None
        if lc is not None:
            listener = next((r.name for r in self._running() if r.config is lc), None)
            listener = listener or f"{lc.host}:{lc.port}"
        return Requester(conn.user, role, conn.conn_id, _peer(peer), listener)

    def _authorize(self, operation: str, requester: Requester | None) -> None:
        if requester is None or requester.role == "admin":
            return
        if requester.role == "monitor" and operation in READ_OPERATIONS:
            return
        who = f"user {requester.user!r}" if requester.user else "an anonymous connection"
        need = "monitor or admin" if operation in READ_OPERATIONS else "admin"
        how = (
            "given by the [policy] (docs/configuration.md)"
            if self.core.policy.enabled
            else "given by a [policy]; without one only anonymous connections on a loopback "
            "listener of a router without users_file are admin"
        )
        raise ManagementError(
            403, f"{operation} needs the {need} role; {who} has {requester.role!r} ({how})"
        )

    def _audit(self, request: Message, requester: Requester | None, response: Response) -> None:
        """The audit trail: every change, and every request refused or failed, one line."""
        props = request.application_properties or {}
        operation = str(props.get("operation") or "").upper()
        changed = operation not in READ_OPERATIONS
        if not changed and response.status < 400:
            return
        what = " ".join(
            f"{key}={_clip(props[key])}" for key in ("type", "name", "identity") if key in props
        )
        if operation in ("CREATE", "UPDATE") and isinstance(request.body, dict):
            what += " attributes=" + _clip(
                {str(k): _plain(v) for k, v in request.body.items()}, 300
            )
        level = logging.INFO if response.status < 400 else logging.WARNING
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        audit.log(
            level,
            "%s at=%s op=%s %s status=%d %s",
            requester.describe() if requester is not None else "user=- role=internal",
            when,
            operation or "-",
            what,
            response.status,
            _clip(response.description),
        )

    def _visible(self, etype: EntityType, requester: Requester | None) -> list[dict[str, Any]]:
        """The rows a requester may see: reply addresses (dynamic sources) are private, so
        only admins see them (in router.address, link and terminus)."""
        rows = list(etype.rows())
        if requester is None or requester.role == "admin":
            return rows
        private = getattr(etype, "private", None)  # qrouter/dispatch_schema.py's types
        if private is not None:
            return [row for row in rows if not private(row)]
        key = "name" if etype.name == "router.address" else "address"
        return [
            row
            for row in rows
            if not (isinstance(row.get(key), str) and row[key].startswith(DYNAMIC_PREFIX))
        ]

    def _send(self, reply_to: Any, correlation: Any, response: Response) -> None:
        if not isinstance(reply_to, str):
            # 3.2.4: reply-to is an address (a string); a request naming anything else
            # cannot be answered
            log.warning("management request whose reply-to is not a string: not answered")
            return
        reply_to = str(reply_to)  # a symbol: its text (the engine takes exactly a str)
        if not _is_message_id(correlation):
            correlation = None  # 3.2.11: only a message-id (ulong, uuid, binary, string) is echoed
        reply = Message(
            body=response.body,
            message_id=str(uuid.uuid4()),
            correlation_id=correlation,
            application_properties={
                "statusCode": response.status,
                "statusDescription": response.description,
            },
        )
        if not self.core.engine.send(reply_to, encode_message(reply)):
            log.info("management reply to %r: nobody consumes that address", reply_to)

    # -- requests ------------------------------------------------------------------------------

    def handle(
        self, request: Message, user: str | None = None, requester: Requester | None = None
    ) -> Reply:
        """The response to one request (a coroutine for those that wait on the server).
        `requester` None: an in-process caller, with every right."""
        props = request.application_properties or {}
        operation = str(props.get("operation") or "").upper()
        try:
            if not operation:
                raise ManagementError(400, "no operation in the request's application-properties")
            self._authorize(operation, requester)
            if operation == "GET-TYPES":
                return Response(200, "OK", self.get_types())
            if operation == "GET-OPERATIONS":
                return Response(200, "OK", {t.full_name: list(t.operations) for t in self._all()})
            if operation == "GET-ATTRIBUTES":
                return Response(200, "OK", {t.full_name: list(t.attributes) for t in self._all()})
            if operation == "GET-MGMT-NODES":
                return Response(200, "OK", [])  # other routers' nodes arrive with the mesh
            etype = self._entity_type(props, operation)
            if operation not in etype.operations:
                raise ManagementError(
                    405, f"{operation} is not supported for type {etype.full_name}"
                )
            if operation == "QUERY":
                return Response(200, "OK", self.query(etype, request.body, props, requester))
            if operation == "CREATE":
                attrs = _attributes(request.body)
                name = props.get("name") or attrs.get("name")
                assert etype.create is not None
                return etype.create(None if name is None else str(name), attrs)
            row = self._find(etype, props, requester)
            if operation == "READ":
                return Response(200, "OK", row)
            if operation == "UPDATE":
                assert etype.update is not None
                return etype.update(row, _attributes(request.body))
            if operation == "DELETE":
                assert etype.delete is not None
                return etype.delete(row)
            raise ManagementError(400, f"unknown operation {operation!r}")
        except ManagementError as exc:
            return Response(exc.status, exc.description)
        except Exception as exc:  # noqa: BLE001 - the requester gets a 500, the log the detail
            log.exception("management %s failed", operation)
            return Response(500, f"internal error: {exc}")

    def _all(self) -> list[EntityType]:
        return list(self.types.values()) + self.dispatch.all()

    def get_types(self) -> dict[str, list[str]]:
        # the draft: a map from each type to the types it extends
        return {t.full_name: [MANAGEMENT_TYPE + ".entity"] for t in self._all()}

    def _entity_type(self, props: dict[str, Any], operation: str) -> EntityType:
        name = props.get("type")
        if operation == "QUERY" and (name is None or name == MANAGEMENT_TYPE):
            name = props.get("entityType")
        if not name:
            raise ManagementError(
                400, f"{operation} needs the entity type (application property 'type')"
            )
        text = str(name)
        dispatch = self.dispatch.lookup(text)
        if dispatch is not None:
            return dispatch
        short = text[len(TYPE_PREFIX) :] if text.startswith(TYPE_PREFIX) else text
        etype = self.types.get(short)
        if etype is None:
            known = ", ".join(sorted(self.types))
            raise ManagementError(404, f"unknown entity type {text!r} (known: {known})")
        return etype

    def query(
        self,
        etype: EntityType,
        body: Any,
        props: dict[str, Any],
        requester: Requester | None = None,
    ) -> dict[str, Any]:
        names: list[str] = []
        if isinstance(body, dict):
            requested = body.get("attributeNames")
            if isinstance(requested, list):
                names = [str(n) for n in requested]
        if not names:
            names = list(etype.attributes)
        rows = self._visible(etype, requester)
        offset = _int(props.get("offset"), 0)
        count = props.get("count")
        rows = rows[offset:]
        if count is not None:
            rows = rows[: _int(count, len(rows))]
        return {
            "attributeNames": names,
            "results": [[row.get(n) for n in names] for row in rows],
        }

    def _find(
        self, etype: EntityType, props: dict[str, Any], requester: Requester | None = None
    ) -> dict[str, Any]:
        identity, name = props.get("identity"), props.get("name")
        if identity is None and name is None:
            raise ManagementError(400, "give 'name' or 'identity'")
        for row in self._visible(etype, requester):
            if identity is not None and str(row.get("identity")) == str(identity):
                return row
            if identity is None and str(row.get("name")) == str(name):
                return row
        which = f"identity {identity!r}" if identity is not None else f"name {name!r}"
        raise ManagementError(404, f"no {etype.full_name} with {which}")

    # -- router --------------------------------------------------------------------------------

    def router_row(self) -> dict[str, Any]:
        core = self.core
        cfg = core.config
        links = [link for conn in core.connections for link in conn.links()]
        termini = core.registry.all()
        totals = dict.fromkeys(
            ("n_in", "n_out", "n_accepted", "n_released", "n_rejected", "n_modified", "n_dropped"),
            0,
        )
        engine = core.engine
        names = engine.address_names()
        for name in names:
            a = engine.address(name)
            if a is None:
                continue
            for key in totals:
                totals[key] += getattr(a, key)
        persistence = core.registry.persistence
        store = getattr(persistence, "store", None)
        monitor = getattr(core, "monitor", None)
        return {
            "identity": cfg.id,
            "name": cfg.id,
            "id": cfg.id,
            "version": __version__,
            "mode": "interior" if mesh_of(core) is not None else "standalone",
            "started": self.started,
            "uptime_seconds": round(time.time() - self.started, 3),
            "connection_count": len(core.connections),
            "link_count": len(links),
            "links_without_credit": sum(
                1 for link in links if link.state == 1 and link.credit <= 0
            ),
            "address_count": len(names),
            "address_entry_count": len(core.table.entries()),
            "terminus_count": len(termini),
            "suspended_terminus_count": sum(1 for t in termini if t.link is None),
            "mesh_router_count": len(self.node_rows()),
            "deliveries_in": totals["n_in"],
            "deliveries_out": totals["n_out"],
            "accepted": totals["n_accepted"],
            "released": totals["n_released"],
            "rejected": totals["n_rejected"],
            "modified": totals["n_modified"],
            "dropped": totals["n_dropped"],
            "credit_stalls": getattr(monitor, "credit_stalls_total", None),
            "stuck_deliveries": getattr(monitor, "stuck_deliveries", None),
            "store": cfg.store,
            "store_path": cfg.store_path,
            "store_durability": persistence.durability,
            "store_commits": getattr(store, "commit_count", None),
            "store_commit_seconds_total": getattr(store, "commit_seconds_total", None),
            "store_last_commit_seconds": getattr(store, "last_commit_seconds", None),
            # False while store commits fail: durable output held (qrouter/store_health.py)
            "store_available": getattr(getattr(persistence, "health", None), "available", True),
            "store_commit_failures": getattr(getattr(persistence, "health", None), "failures", 0),
            "management_requests": self.requests,
            "management_bad_requests": self.bad_requests,
            "management_replies_refused": self.replies.refused,
            "decode_errors": self.core.engine.n_decode_errors,
            **_login_counters(self.core),
            "trace": bool(cfg.trace),
        }

    # -- listeners -----------------------------------------------------------------------------

    def _running(self) -> list[RunningListener]:
        if self.listeners is not None:
            return list(self.listeners.listening)
        return [
            RunningListener(_listener_name(lc, i, self.core.config.listeners), lc, None)
            for i, lc in enumerate(self.core.config.listeners)
        ]

    def listener_rows(self) -> list[dict[str, Any]]:
        counts: dict[int, int] = {}
        for conn in self.core.connections:
            lc = getattr(conn.handler, "listener", None)
            counts[id(lc)] = counts.get(id(lc), 0) + 1
        rows = []
        for running in self._running():
            lc = running.config
            rows.append(
                {
                    "identity": running.name,
                    "name": running.name,
                    "host": lc.host,
                    "port": lc.port,
                    "bound": running.bound(),
                    "role": lc.role,
                    "tls": bool(lc.tls_cert),
                    "require_client_cert": lc.require_client_cert,
                    "sasl_mechanisms": list(lc.sasl_mechanisms),
                    "require_auth": lc.require_auth,
                    "max_frame_size": lc.max_frame_size,
                    "max_message_size": self.core.config.max_message_size
                    if lc.max_message_size is None
                    else lc.max_message_size,
                    "channel_max": lc.channel_max,
                    "idle_timeout": lc.idle_timeout,
                    "connection_count": counts.get(id(lc), 0),
                    "origin": running.origin,
                }
            )
        return rows

    def create_listener(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        control = self.listeners
        if control is None:
            raise ManagementError(501, "this router has no server to open listeners on")
        settings = {k: v for k, v in attrs.items() if k not in ("name", "identity", "type")}
        try:
            lc = listener_from_table(settings)
        except ConfigError as exc:
            raise ManagementError(400, str(exc)) from None
        if name is None:
            name = f"{lc.host}:{lc.port}"
        if any(r.name == name for r in control.listening):
            raise ManagementError(409, f"a listener named {name!r} exists")

        async def open_it() -> Response:
            try:
                running = await control.open_listener(lc, name, "management")
            except OSError as exc:
                raise ManagementError(
                    500, f"cannot listen on {lc.host}:{lc.port}: {exc.strerror or exc}"
                ) from None
            log.info("listener %r opened on %s by management", name, ", ".join(running.bound()))
            return Response(201, "Created", self._listener_row(name))

        return open_it()

    def _listener_row(self, name: str) -> dict[str, Any]:
        for row in self.listener_rows():
            if row["name"] == name:
                return row
        raise ManagementError(404, f"no listener named {name!r}")

    def delete_listener(self, row: dict[str, Any]) -> Reply:
        control = self.listeners
        if control is None:
            raise ManagementError(501, "this router has no server to close listeners on")
        for running in control.listening:
            if running.name == row["name"]:
                # new connections are refused; the ones it accepted stay open
                control.close_listener(running)
                log.info("listener %r closed by management", running.name)
                return Response(204, "No Content")
        raise ManagementError(404, f"no listener named {row['name']!r}")

    # -- connectors (the mesh) ---------------------------------------------------------------

    def connector_rows(self) -> list[dict[str, Any]]:
        rows = []
        for i, cc in enumerate(getattr(self.core.config, "connectors", None) or []):
            conn = next(
                (c for c in self.core.connections if getattr(c.handler, "connector", None) is cc),
                None,
            )
            name = self.connector_names.get(id(cc), cc.name or f"{cc.host}:{cc.port}")
            rows.append(
                {
                    "identity": f"connector/{i}",
                    "name": name,
                    "host": cc.host,
                    "port": cc.port,
                    "role": cc.role,
                    "cost": cc.cost,
                    "connection": conn.conn_id if conn is not None else None,
                    "connected": conn is not None and not conn.closed,
                }
            )
        return rows

    def create_connector(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        """CREATE connector: an inter-router connector ([[connector]] keys) that starts
        connecting at once, with the configured ones' reconnect backoff."""
        if attrs.get("role") == "route-container":
            return self._create_broker_connector(name, attrs)
        mesh = getattr(self.core, "mesh", None)  # qrouter/inter_router.py Mesh
        if mesh is None or getattr(mesh, "loop", None) is None:
            raise ManagementError(
                501, "this router is not in a mesh (no inter-router listener or connector at start)"
            )
        settings = {k: v for k, v in attrs.items() if k not in ("name", "identity", "type", "role")}
        if attrs.get("role", "inter-router") != "inter-router":
            raise ManagementError(400, "connectors are inter-router only (role inter-router)")
        try:
            cc = connector_from_table(settings)
        except ConfigError as exc:
            raise ManagementError(400, str(exc)) from None
        name = name or f"{cc.host}:{cc.port}"
        if any(row["name"] == name for row in self.connector_rows()):
            raise ManagementError(409, f"a connector named {name!r} exists")
        self.connector_names[id(cc)] = name
        self.core.config.connectors.append(cc)
        mesh.add_connector(cc)
        log.info("connector %r to %s:%d created by management", name, cc.host, cc.port)
        return Response(201, "Created", self._connector_row(name))

    def delete_connector(self, row: dict[str, Any]) -> Reply:
        """DELETE connector: it stops reconnecting and its connection is closed, which
        withdraws the routes through it."""
        mesh = getattr(self.core, "mesh", None)
        connectors = self.core.config.connectors
        index = int(str(row["identity"]).rpartition("/")[2])
        if not 0 <= index < len(connectors) or (
            mesh is None and connectors[index].role == "inter-router"
        ):
            raise ManagementError(404, f"no connector {row['identity']!r}")
        cc = connectors.pop(index)
        self.connector_names.pop(id(cc), None)
        if cc.role == "route-container":
            closed = self.core.brokers.remove_connector(cc)
            log.info(
                "connector %r deleted by management (%d connection closed)", row["name"], closed
            )
            return Response(204, "No Content")
        assert mesh is not None
        closed = mesh.remove_connector(cc)
        log.info("connector %r deleted by management (%d connection closed)", row["name"], closed)
        return Response(204, "No Content")

    def _create_broker_connector(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        """CREATE connector with role route-container: a broker connection (docs/brokers.md)
        that starts connecting at once; autolinks name it."""
        settings = {k: v for k, v in attrs.items() if k not in ("identity", "type")}
        if name:
            settings["name"] = name
        try:
            cc = connector_from_table(settings)
        except ConfigError as exc:
            raise ManagementError(400, str(exc)) from None
        name = cc.name = cc.name or f"{cc.host}:{cc.port}"
        if any(row["name"] == name for row in self.connector_rows()):
            raise ManagementError(409, f"a connector named {name!r} exists")
        if self.core.brokers.loop is None:
            raise ManagementError(503, "the router is not running its connectors yet")
        self.core.config.connectors.append(cc)
        self.core.brokers.add_connector(cc)
        log.info("broker connector %r to %s:%d created by management", name, cc.host, cc.port)
        return Response(201, "Created", self._connector_row(name))

    # -- autolinks (qrouter/brokers.py) ---------------------------------------------------------

    def create_autolink(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        """CREATE autoLink: address, direction (in / out), connection (a connector with role
        route-container), external_address (Dispatch's externalAddress is taken too)."""
        settings = {k: v for k, v in attrs.items() if k not in ("name", "identity", "type")}
        if "externalAddress" in settings:
            settings["external_address"] = settings.pop("externalAddress")
        try:
            al = autolink_from_table("autoLink", settings)
        except ConfigError as exc:
            raise ManagementError(400, str(exc)) from None
        brokers = {
            c.name or f"{c.host}:{c.port}"
            for c in self.core.config.connectors
            if c.role == "route-container"
        }
        if al.connection not in brokers:
            raise ManagementError(
                400, f"no connector named {al.connection!r} with role route-container"
            )
        key = (al.address, al.direction, al.connection)
        if any((a.address, a.direction, a.connection) == key for a in self.core.brokers.autolinks):
            raise ManagementError(409, f"an autolink {al.direction} {al.address!r} exists")
        self.core.brokers.add_autolink(al)
        log.info("autolink %s %r on %r created by management", *key[1::-1], al.connection)
        rows = self.core.brokers.autolink_rows()
        return Response(201, "Created", rows[-1])

    def create_linkroute(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        """CREATE linkRoute: prefix or pattern, direction (in / out), connection (a connector
        with role route-container). Links attached from then on are routed."""
        settings = {k: v for k, v in attrs.items() if k not in ("name", "identity", "type")}
        try:
            lr = linkroute_from_table("linkRoute", settings)
        except ConfigError as exc:
            raise ManagementError(400, str(exc)) from None
        brokers = {
            c.name or f"{c.host}:{c.port}"
            for c in self.core.config.connectors
            if c.role == "route-container"
        }
        if lr.connection and lr.connection not in brokers:
            raise ManagementError(
                400, f"no connector named {lr.connection!r} with role route-container"
            )
        key = (lr.prefix, lr.pattern, lr.direction)
        if any((x.prefix, x.pattern, x.direction) == key for x in self.core.linkroutes.routes):
            raise ManagementError(409, f"a link route {lr.direction} {lr.prefix or lr.pattern!r}")
        self.core.linkroutes.add(lr)
        log.info("link route %s %r created by management", lr.direction, lr.prefix or lr.pattern)
        return Response(201, "Created", self.core.linkroutes.rows()[-1])

    def delete_linkroute(self, row: dict[str, Any]) -> Reply:
        """DELETE linkRoute: links attached later are not routed; routed ones stay."""
        index = int(str(row["identity"]).rpartition("/")[2])
        routes = self.core.linkroutes.routes
        if not 0 <= index < len(routes):
            raise ManagementError(404, f"no linkRoute {row['identity']!r}")
        self.core.linkroutes.remove(routes[index])
        log.info("link route %r deleted by management", row["name"])
        return Response(204, "No Content")

    def delete_autolink(self, row: dict[str, Any]) -> Reply:
        """DELETE autoLink: its link is detached from the broker queue."""
        index = int(str(row["identity"]).rpartition("/")[2])
        autolinks = self.core.brokers.autolinks
        if not 0 <= index < len(autolinks):
            raise ManagementError(404, f"no autoLink {row['identity']!r}")
        self.core.brokers.remove_autolink(autolinks[index])
        log.info("autolink %r deleted by management", row["name"])
        return Response(204, "No Content")

    def _connector_row(self, name: str) -> dict[str, Any]:
        for row in self.connector_rows():
            if row["name"] == name:
                return row
        raise ManagementError(404, f"no connector named {name!r}")

    # -- frame trace (qrouter/_fast/trace.pxi) --------------------------------------------------

    def update_router(self, row: dict[str, Any], attrs: dict[str, Any]) -> Reply:
        """UPDATE router ``trace``: trace the frames of connections opened from now on."""
        unknown = sorted(str(k) for k in attrs if k not in ("trace", "name", "identity", "type"))
        if unknown or "trace" not in attrs:
            raise ManagementError(400, f"only 'trace' can be updated (got {unknown or 'none'})")
        self.core.config.trace = _trace_flag(attrs["trace"])
        log.info("frame trace of new connections %s by management", _on(self.core.config.trace))
        return Response(200, "OK", self.router_row())

    def update_connection(self, row: dict[str, Any], attrs: dict[str, Any]) -> Reply:
        """UPDATE connection ``trace``: trace (or stop tracing) this connection's frames."""
        unknown = sorted(str(k) for k in attrs if k not in ("trace", "name", "identity", "type"))
        if unknown or "trace" not in attrs:
            raise ManagementError(400, f"only 'trace' can be updated (got {unknown or 'none'})")
        on = _trace_flag(attrs["trace"])
        for conn in self.core.connections:
            if str(conn.conn_id) == row["identity"]:
                conn.trace = on
                log.info("%s frame trace %s by management", tag(conn.conn_id), _on(on))
                return Response(200, "OK", {**row, "trace": on})
        raise ManagementError(404, f"no connection {row['identity']!r}")

    # -- address entries -----------------------------------------------------------------------

    def address_entry_rows(self) -> list[dict[str, Any]]:
        preset = _preset_keys() if self.core.config.oslo_preset else {}
        configured = {
            ("prefix", ac.prefix) if ac.prefix is not None else ("pattern", ac.pattern)
            for ac in self.core.config.addresses
        }
        rows = []
        for entry in self.core.table.entries():
            key = entry.key
            if key in self.created_entries:
                origin = "management"
            elif key in configured:
                origin = "config"
            elif preset.get(key) == entry.distribution:
                origin = "preset"
            else:
                origin = "config"
            rows.append(
                {
                    "identity": f"{key[0]}:{key[1]}",
                    "name": key[1],
                    "prefix": entry.prefix,
                    "pattern": entry.pattern,
                    "distribution": entry.distribution,
                    "guarantee": entry.guarantee,
                    "fallback": entry.fallback,
                    "dead_letter": entry.dead_letter,
                    "waypoint": entry.waypoint,
                    "origin": origin,
                }
            )
        return rows

    def _entry(self, attrs: dict[str, Any]) -> AddressEntry:
        prefix, pattern = attrs.get("prefix"), attrs.get("pattern")
        try:
            return AddressEntry(
                prefix=None if prefix is None else str(prefix),
                pattern=None if pattern is None else str(pattern),
                distribution=str(attrs.get("distribution") or "balanced"),
                guarantee=None if attrs.get("guarantee") is None else str(attrs["guarantee"]),
                fallback=None if attrs.get("fallback") is None else str(attrs["fallback"]),
                dead_letter=None if attrs.get("dead_letter") is None else str(attrs["dead_letter"]),
                waypoint=_trace_flag(attrs.get("waypoint") or False, "waypoint"),  # docs/brokers.md
            )
        except ValueError as exc:
            raise ManagementError(400, str(exc)) from None

    def create_address(self, name: str | None, attrs: dict[str, Any]) -> Reply:
        if "prefix" not in attrs and "pattern" not in attrs and name:
            attrs = dict(attrs)
            attrs["pattern" if ("*" in name or "#" in name) else "prefix"] = name
        entry = self._entry(attrs)
        if any(e.key == entry.key for e in self.core.table.entries()):
            raise ManagementError(
                409, f"an address entry for {entry.key[0]} {entry.key[1]!r} exists (use UPDATE)"
            )
        self.core.table.add(entry)
        self.core.engine.refresh_diversions()  # fallback / dead letter of addresses in use
        self.created_entries.add(entry.key)
        log.info("address entry %s %r -> %s added by management", *entry.key, entry.distribution)
        return Response(201, "Created", self._entry_row(entry.key))

    def update_address(self, row: dict[str, Any], attrs: dict[str, Any]) -> Reply:
        merged = {
            "prefix": row["prefix"],
            "pattern": row["pattern"],
            "distribution": row["distribution"],
            "guarantee": row["guarantee"],
            "fallback": row["fallback"],
            "dead_letter": row["dead_letter"],
            "waypoint": row["waypoint"],
        }
        for key in ("distribution", "guarantee", "fallback", "dead_letter", "waypoint"):
            if key in attrs:
                merged[key] = attrs[key]
        entry = self._entry(merged)
        self.core.table.add(entry)  # same key: replaces the entry
        self.core.engine.refresh_diversions()
        log.info("address entry %s %r -> %s by management", *entry.key, entry.distribution)
        return Response(200, "OK", self._entry_row(entry.key))

    def delete_address(self, row: dict[str, Any]) -> Reply:
        if row["prefix"] is not None:
            self.core.table.remove(prefix=row["prefix"])
        else:
            self.core.table.remove(pattern=row["pattern"])
        self.core.engine.refresh_diversions()
        self.created_entries.discard(
            ("prefix", row["prefix"]) if row["prefix"] is not None else ("pattern", row["pattern"])
        )
        log.info("address entry %r removed by management", row["identity"])
        return Response(204, "No Content")

    def _entry_row(self, key: tuple[str, str]) -> dict[str, Any]:
        identity = f"{key[0]}:{key[1]}"
        for row in self.address_entry_rows():
            if row["identity"] == identity:
                return row
        raise ManagementError(404, f"no address entry {identity!r}")

    # -- addresses in the data plane -----------------------------------------------------------

    def router_address_rows(self) -> list[dict[str, Any]]:
        from qrouter._fast.engine import DISTRIBUTION_NAMES

        engine = self.core.engine
        rows = []
        for name in sorted(engine.address_names()):
            a = engine.address(name)
            if a is None:
                continue
            rows.append(
                {
                    "identity": name,
                    "name": name,
                    "distribution": DISTRIBUTION_NAMES.get(a.distribution, str(a.distribution)),
                    "consumers": a.consumer_count,
                    "producers": a.producer_count,
                    "undelivered": a.undelivered_count,
                    "deliveries_in": a.n_in,
                    "deliveries_out": a.n_out,
                    "accepted": a.n_accepted,
                    "released": a.n_released,
                    "rejected": a.n_rejected,
                    "modified": a.n_modified,
                    "dropped": a.n_dropped,
                    **_diversion_counters(a.diversion),
                }
            )
        return rows

    # -- connections ---------------------------------------------------------------------------

    def connection_rows(self) -> list[dict[str, Any]]:
        names = {id(r.config): r.name for r in self._running()}
        rows = []
        for conn in sorted(self.core.connections, key=lambda c: c.conn_id):
            transport = conn.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            tls = transport.get_extra_info("sslcontext") is not None if transport else False
            lc = getattr(conn.handler, "listener", None)
            remote_open = conn.remote_open if isinstance(conn.remote_open, dict) else {}
            rows.append(
                {
                    "identity": str(conn.conn_id),
                    "name": f"C{conn.conn_id}",
                    "container": conn.remote_container_id,
                    "host": _peer(peer),
                    "user": conn.user,
                    "tls": tls,
                    "role": lc.role if lc is not None else None,
                    "listener": names.get(id(lc)),
                    "opened": bool(remote_open),
                    "closed": bool(conn.closed),
                    "sessions": conn.session_count,
                    "links": len(conn.links()),
                    "bytes_in": conn.bytes_in,
                    "bytes_out": conn.bytes_out,
                    "frames_in": conn.frames_in,
                    # backpressure: its write buffer is full now; times it filled
                    "write_paused": bool(conn.write_paused),
                    "write_pauses": conn.n_write_pauses,
                    "trace": bool(conn.trace),
                }
            )
        return rows

    def delete_connection(self, row: dict[str, Any]) -> Reply:
        for conn in self.core.connections:
            if str(conn.conn_id) == row["identity"]:
                conn.close("amqp:connection:forced", "closed by management")
                log.info("%s connection closed by management", tag(conn.conn_id))
                return Response(204, "No Content")
        raise ManagementError(404, f"no connection {row['identity']!r}")

    # -- links and termini ---------------------------------------------------------------------

    def link_rows(self) -> list[dict[str, Any]]:
        registry = self.core.registry
        now = time.monotonic()
        monitor = getattr(self.core, "monitor", None)
        no_credit_since: Callable[[Any, float], float] = (
            monitor.no_credit_since
            if monitor is not None
            else lambda link, _now: link.no_credit_since
        )
        rows: list[dict[str, Any]] = []
        for conn in sorted(self.core.connections, key=lambda c: c.conn_id):
            for link in sorted(conn.links(), key=lambda x: x.handle):
                t = registry.for_link(link)
                ncs = no_credit_since(link, now) if link.state == 1 else 0.0
                rows.append(
                    {
                        "identity": f"{conn.conn_id}/{link.handle}",
                        "name": link.name,
                        "connection": conn.conn_id,
                        "container": conn.remote_container_id,
                        "direction": "out" if link.is_sender else "in",
                        "address": _link_address(link, t),
                        "durable": t.durable if t is not None else None,
                        "expiry_policy": t.expiry_policy if t is not None else None,
                        "timeout": t.timeout if t is not None else None,
                        "state": _LINK_STATES.get(link.state, str(link.state)),
                        "endpoint": bool(link.endpoint),
                        "snd_settle_mode": link.snd_settle_mode,
                        "rcv_settle_mode": link.rcv_settle_mode,
                        "credit": link.credit,
                        "delivery_count": link.delivery_count,
                        "delivered": link.n_delivered if link.is_sender else None,
                        "accepted": link.n_accepted,
                        "released": link.n_released,
                        "rejected": link.n_rejected,
                        "modified": link.n_modified,
                        "unsettled": link.unsettled_count,
                        "pending": link.pending_count,
                        "no_credit_seconds": round(now - ncs, 3) if ncs > 0 else 0.0,
                        "suspended_seconds": None,
                    }
                )
        wall = time.time()
        for t in registry.all():
            if t.link is not None:
                continue
            rows.append(
                {
                    "identity": _terminus_identity(t.key),
                    "name": t.key[2],
                    "connection": None,
                    "container": t.key[1],
                    "direction": "out" if t.role == "sender" else "in",
                    "address": t.address,
                    "durable": t.durable,
                    "expiry_policy": t.expiry_policy,
                    "timeout": t.timeout,
                    "state": "suspended",
                    "endpoint": False,
                    "snd_settle_mode": None,
                    "rcv_settle_mode": None,
                    "credit": None,
                    "delivery_count": None,
                    "delivered": None,
                    "accepted": None,
                    "released": None,
                    "rejected": None,
                    "modified": None,
                    "unsettled": _held(t),
                    "pending": None,
                    "no_credit_seconds": None,
                    "suspended_seconds": (
                        round(wall - t.suspended_at, 3) if t.suspended_at is not None else None
                    ),
                }
            )
        return rows

    def terminus_rows(self) -> list[dict[str, Any]]:
        wall = time.time()
        rows = []
        for t in sorted(self.core.registry.all(), key=lambda t: t.key):
            deadline = t.expiry_deadline()
            rows.append(
                {
                    "identity": _terminus_identity(t.key),
                    "name": t.key[2],
                    "local_container": t.key[0],
                    "container": t.key[1],
                    "role": t.role,
                    "direction": "out" if t.role == "sender" else "in",
                    "address": t.address,
                    "durable": t.durable,
                    "expiry_policy": t.expiry_policy,
                    "timeout": t.timeout,
                    "state": "attached" if t.link is not None else "suspended",
                    "connection": t.link.conn.conn_id if t.link is not None else None,
                    "suspended_at": t.suspended_at,
                    "expires_in": round(deadline - wall, 3) if deadline is not None else None,
                    "held": _held(t),
                }
            )
        return rows

    def delete_terminus(self, row: dict[str, Any]) -> Reply:
        registry = self.core.registry
        for t in registry.all():
            if _terminus_identity(t.key) != row["identity"]:
                continue
            if t.link is not None:
                raise ManagementError(
                    409, "the terminus is attached: close its connection or link first"
                )
            registry._destroy(t)
            log.info("terminus of link %r deleted by management", t.key[2])
            return Response(204, "No Content")
        raise ManagementError(404, f"no terminus {row['identity']!r}")

    # -- mesh ------------------------------------------------------------------------------

    def topic_rows(self) -> list[dict[str, Any]]:
        """Guaranteed topics (qrouter/guarantee.py) this router knows."""
        g = self.core.guarantees
        return [
            {
                "identity": name,
                "name": name,
                "guarantee": t.mode,
                "publishers": len(t.attached_publishers()),
                "subscribers": len(t.attached_subscribers()),
                "known_subscribers": len(t.view.known),
                "origin_records": len(t.origin_records()),
                "local_records": len(t.local_records()),
                "peers": g.up_routers(),
                # reachable routers without this topic's guarantee (issue 15 b)
                "lacking_routers": t.lacking_routers(),
            }
            for name, t in sorted(g.topics.items())
        ]

    def limit_rows(self) -> list[dict[str, Any]]:
        """qrouter/limits.py: one row per limit (``exceeded``: refusals, or for the timeout
        and expiry-never limits, the termini whose request was capped)."""
        core = self.core
        return core.limits.rows(core.config.max_message_size, len(core.registry.termini))

    def node_rows(self) -> list[dict[str, Any]]:
        """Routers reachable through the mesh (none until the mesh is wired into the core:
        this reads `core.mesh`, a router.mesh.engine.RoutingEngine, when there is one)."""
        mesh = mesh_of(self.core)
        if mesh is None:
            return []
        neighbours = mesh.neighbours()
        next_hops = mesh.next_hops()
        costs = mesh.costs()
        topology = mesh.topology()
        rows = []
        for router_id in sorted(set(next_hops) | set(neighbours)):
            rows.append(
                {
                    "identity": router_id,
                    "name": router_id,
                    "id": router_id,
                    "neighbour": router_id in neighbours,
                    "next_hop": next_hops.get(router_id),
                    "cost": costs.get(router_id),
                    "link_id": neighbours.get(router_id),
                    "peers": sorted(topology.get(router_id, {})),
                }
            )
        return rows


def mesh_of(core: Any) -> Any:
    """The core's routing engine (a router.mesh.engine.RoutingEngine: `core.mesh.engine`, the
    mesh data plane of qrouter/inter_router.py), or None for a standalone router."""
    mesh = getattr(core, "mesh", None)
    for candidate in (mesh, getattr(mesh, "engine", None)):
        if candidate is not None and hasattr(candidate, "next_hops"):
            return candidate
    return None


def _login_counters(core: Any) -> dict[str, int]:
    """qrouter/login_throttle.py's counters, as the router entity's attributes."""
    t = getattr(core, "login_throttle", None)
    return {
        "logins_failed": getattr(t, "failed", 0),
        "logins_delayed": getattr(t, "delayed", 0),
        "logins_refused": getattr(t, "refused", 0),
        "logins_pending": getattr(t, "pending", 0),
    }


# -- attribute lists (QUERY's default columns) ---------------------------------------------

ROUTER_ATTRIBUTES = (
    "identity", "name", "id", "version", "mode", "started", "uptime_seconds",
    "connection_count", "link_count", "links_without_credit", "address_count",
    "address_entry_count", "terminus_count", "suspended_terminus_count", "mesh_router_count",
    "deliveries_in", "deliveries_out", "accepted", "released", "rejected", "modified",
    "dropped", "credit_stalls", "stuck_deliveries", "store", "store_path", "store_durability",
    "store_commits", "store_commit_seconds_total", "store_last_commit_seconds",
    "store_available", "store_commit_failures", "management_requests",
    "management_bad_requests", "management_replies_refused", "decode_errors", "logins_failed",
    "logins_delayed", "logins_refused", "logins_pending",
    "trace",
)  # fmt: skip
LISTENER_ATTRIBUTES = (
    "identity", "name", "host", "port", "bound", "role", "tls", "require_client_cert",
    "sasl_mechanisms", "require_auth", "max_frame_size", "max_message_size", "channel_max",
    "idle_timeout",
    "connection_count", "origin",
)  # fmt: skip
CONNECTOR_ATTRIBUTES = (
    "identity", "name", "host", "port", "role", "cost", "connection", "connected",
)  # fmt: skip
LINKROUTE_ATTRIBUTES = (
    "identity", "name", "prefix", "pattern", "direction", "connection", "operStatus", "links",
    "origin",
)  # fmt: skip
AUTOLINK_ATTRIBUTES = (
    "identity", "name", "address", "direction", "connection", "external_address", "operStatus",
    "credit", "deliveries", "origin",
)  # fmt: skip
ADDRESS_ATTRIBUTES = (
    "identity", "name", "prefix", "pattern", "distribution", "guarantee", "fallback",
    "dead_letter", "waypoint", "origin",
)  # fmt: skip
ROUTER_ADDRESS_ATTRIBUTES = (
    "identity", "name", "distribution", "consumers", "producers", "undelivered",
    "deliveries_in", "deliveries_out", "accepted", "released", "rejected", "modified", "dropped",
    "fallback", "dead_letter", "fallback_deliveries", "dead_lettered", "dead_letter_failed",
)  # fmt: skip
CONNECTION_ATTRIBUTES = (
    "identity", "name", "container", "host", "user", "tls", "role", "listener", "opened",
    "closed", "sessions", "links", "bytes_in", "bytes_out", "frames_in", "write_paused",
    "write_pauses", "trace",
)  # fmt: skip
LINK_ATTRIBUTES = (
    "identity", "name", "connection", "container", "direction", "address", "durable",
    "expiry_policy", "timeout", "state", "endpoint", "snd_settle_mode", "rcv_settle_mode",
    "credit", "delivery_count", "delivered", "accepted", "released", "rejected", "modified",
    "unsettled", "pending", "no_credit_seconds", "suspended_seconds",
)  # fmt: skip
TERMINUS_ATTRIBUTES = (
    "identity", "name", "local_container", "container", "role", "direction", "address",
    "durable", "expiry_policy", "timeout", "state", "connection", "suspended_at", "expires_in",
    "held",
)  # fmt: skip
NODE_ATTRIBUTES = ("identity", "name", "id", "neighbour", "next_hop", "cost", "link_id", "peers")
LIMIT_ATTRIBUTES = (
    "identity", "name", "config_key", "value", "in_use", "exceeded", "description",
)  # fmt: skip
POLICY_GROUP_ATTRIBUTES = (
    "identity", "name", "users", "management", "connections", "refused", "refused_by_rule",
)  # fmt: skip
TOPIC_ATTRIBUTES = (
    "identity", "name", "guarantee", "publishers", "subscribers", "known_subscribers",
    "origin_records", "local_records", "peers", "lacking_routers",
)  # fmt: skip


# -- helpers ---------------------------------------------------------------------------------


def _is_message_id(v: Any) -> bool:
    """3.2.11 message-id: ulong, uuid, binary or string."""
    if isinstance(v, int) and not isinstance(v, bool):
        return 0 <= v < 1 << 64
    return isinstance(v, uuid.UUID | bytes | str)


def _trace_flag(value: Any, name: str = "trace") -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ManagementError(400, f"{name} must be true or false, not {_clip(value)}")


def _on(flag: bool) -> str:
    if flag:
        from qrouter.log import enable_trace

        enable_trace()  # the records pass the qrouter.trace logger whatever the log level
    return "on" if flag else "off"


def _attributes(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ManagementError(400, "the body must be a map of attributes")
    return {str(k): _plain(v) for k, v in body.items()}


def _plain(value: Any) -> Any:
    """Decoded AMQP values (Long, Symbol ... subclasses) as plain Python ones."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def _clip(value: Any, limit: int = 200) -> str:
    """A value for the audit line: repr'd, on one line, at most `limit` characters."""
    text = repr(value) if not isinstance(value, str) else repr(value)[1:-1]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(value: Any, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        raise ManagementError(400, f"{value!r} is not an integer") from None


def _mode(value: Any, default: int) -> int:
    try:
        mode = int(value) if value is not None else default
    except (TypeError, ValueError):
        return default
    return mode if 0 <= mode <= 2 else default


def _peer(peer: Any) -> str | None:
    if not peer:
        return None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer)


def _link_address(link: Any, t: Any) -> str | None:
    if link.endpoint:
        # a guaranteed topic's links are endpoints too (qrouter/guarantee.py): their topic
        return link.journal_address or MANAGEMENT_ADDRESS
    name = link.address_name
    if name is not None:
        return str(name)
    if t is not None and t.address is not None:
        return str(t.address)
    return None


def _held(t: Any) -> int:
    """Deliveries a terminus holds for its link (durability 2): live ones, and stored records
    not yet turned back into deliveries after a restart."""
    return len(getattr(t, "held", {}) or {}) + len(getattr(t, "records", {}) or {})


def _terminus_identity(key: tuple[str, str, str, str]) -> str:
    # role, remote container, link name: the registry key less our own container-id
    return f"{key[3]}:{key[1]}:{key[2]}"


def _listener_name(lc: ListenerConfig, index: int, all_: list[ListenerConfig]) -> str:
    name = f"{lc.host}:{lc.port}"
    if sum(1 for other in all_ if (other.host, other.port) == (lc.host, lc.port)) > 1:
        name = f"{name}#{index}"
    return name


def listener_names(listeners: list[ListenerConfig]) -> list[str]:
    """The names the configured listeners go by (``HOST:PORT``, ``#i`` added to duplicates)."""
    return [_listener_name(lc, i, listeners) for i, lc in enumerate(listeners)]


def _diversion_counters(d: Any) -> dict[str, Any]:
    """router.address columns of an address's fallback and dead letter (diversion.pxi)."""
    if d is None:
        return {
            "fallback": None,
            "dead_letter": None,
            "fallback_deliveries": 0,
            "dead_lettered": 0,
            "dead_letter_failed": 0,
        }
    return {
        "fallback": d.fallback,
        "dead_letter": d.dead_letter,
        "fallback_deliveries": d.n_fallback,
        "dead_lettered": d.n_dead_lettered,
        "dead_letter_failed": d.n_dead_letter_failed,
    }


def _preset_keys() -> dict[tuple[str, str], str]:
    from qrouter.addresses import OSLO_PRESET

    return {("prefix", prefix): dist for prefix, dist in OSLO_PRESET}


__all__ = [
    "MANAGEMENT_ADDRESS",
    "ManagementError",
    "ManagementNode",
    "Response",
    "RunningListener",
    "ListenerControl",
    "listener_names",
]
