"""Link routes (docs/brokers.md "Link routes"): a client's link to a matching address is not
terminated by the router but routed to a broker over a route-container connector.

Per attach, Python does the control part: the client's ATTACH is held unanswered while the
router attaches a link with the same address, termini and settle modes on the broker
connection (in a session of its own: RabbitMQ ends a session on some refusals); the broker's
ATTACH answers the client's, and the two engine links are paired (`route_pair`,
qrouter/_fast/linkroute.pxi), after which credit, transfers and dispositions pass between them
in the engine. A DETACH at either end detaches the other with the same error and closed flag.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qrouter._fast.codec import Symbol
from qrouter._fast.engine import (
    Link,
    free_channels,
    route_pair,
    route_unpair,
    source_value,
    target_value,
)
from qrouter.config import LinkRouteConfig

if TYPE_CHECKING:
    from qrouter._fast.engine import Connection
    from qrouter.core import Core

log = logging.getLogger("qrouter.linkroutes")

# the ATTACH fields (2.7.3) passed through as they are, each way
PASSED = (
    "snd_settle_mode",
    "rcv_settle_mode",
    "unsettled",
    "incomplete_unsettled",
    "max_message_size",
    "offered_capabilities",
    "desired_capabilities",
    "properties",
)
GONE: tuple[str, str | None] = ("amqp:link:detach-forced", "the connection to the broker closed")
MARK = "qrouter.linkroute"  # ATTACH property naming the route, between routers of the mesh


def mesh_key(lr: LinkRouteConfig) -> str:
    """The mobile address a router with the route's broker advertises in the mesh."""
    return f"_linkroute/{lr.direction}/{lr.prefix or lr.pattern}"


def _split(address: str) -> list[str]:
    out: list[str] = []
    token = ""
    for ch in address:
        if ch in "./":
            out.append(token)
            token = ""
        else:
            token += ch
    out.append(token)
    return out


def _pattern_matches(pattern: list[str], tokens: list[str]) -> bool:
    """`*` one token, `#` zero or more; each (pattern, token) position is tried once."""
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        i, j = stack.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(pattern):
            if j == len(tokens):
                return True
            continue
        p = pattern[i]
        if p == "#":
            stack.extend((i + 1, k) for k in range(j, len(tokens) + 1))
        elif j < len(tokens) and (p == "*" or p == tokens[j]):
            stack.append((i + 1, j + 1))
    return False


def matches(lr: LinkRouteConfig, address: str) -> bool:
    if lr.prefix is not None:
        p = lr.prefix
        return address == p or (address.startswith(p) and address[len(p)] in "./")
    assert lr.pattern is not None
    return _pattern_matches(_split(lr.pattern), _split(address))


@dataclass(eq=False)
class Routed:
    """One routed link: the client's end and the broker's (both engine links)."""

    route: LinkRouteConfig | None  # None: in transit here (no route configured)
    client: Link
    broker: Link | None = None
    answered: bool = False  # the client has had its ATTACH answer
    extra: dict[str, Any] = field(default_factory=dict)


class LinkRoutes:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.routes: list[LinkRouteConfig] = core.config.linkroutes
        self.created: set[int] = set()  # id(LinkRouteConfig) made by management
        self.active: set[Routed] = set()
        self.advertised: set[str] = set()  # mesh keys of routes whose broker is up here

    def match(self, address: str, direction: str) -> LinkRouteConfig | None:
        for lr in self.routes:
            if lr.direction == direction and matches(lr, address):
                return lr
        return None

    # -- the client's ATTACH ----------------------------------------------------------------

    def claims(self, conn: Connection, link: Link, fields: dict[str, Any]) -> bool:
        """A client's ATTACH to a link-routed address: routed (or refused); True if so."""
        if not self.routes:
            return False
        # Dispatch's words, from the router's side: a client sender's messages come in
        # (direction in), a client receiver's go out (the router's link is the sender)
        direction = "out" if link.is_sender else "in"
        terminus = fields.get("source" if link.is_sender else "target")
        if not isinstance(terminus, dict) or terminus.get("dynamic"):
            return False
        address = terminus.get("address")
        if not isinstance(address, str) or not address:
            return False
        lr = self.match(address, direction)
        if lr is None:
            return False
        self._route(conn, link, fields, lr, mesh_key(lr), address)
        return True

    def claims_transit(self, conn: Connection, link: Link, fields: dict[str, Any]) -> bool:
        """An ATTACH from a neighbour router for a link route (its properties name the route):
        routed on, to the broker or to the next router toward it."""
        props = fields.get("properties")
        key = props.get(MARK) if isinstance(props, dict) else None
        if not isinstance(key, str) or link.local_init:
            return False
        assert isinstance(props, dict)
        rest = {k: v for k, v in props.items() if k != MARK}
        fields = dict(fields, properties=rest or None)
        lr = next((x for x in self.routes if x.connection and mesh_key(x) == key), None)
        self._route(conn, link, fields, lr, key, key)
        return True

    def _route(
        self,
        conn: Connection,
        link: Link,
        fields: dict[str, Any],
        lr: LinkRouteConfig | None,
        key: str,
        address: str,
    ) -> None:
        """Attach the other end: on the broker connection when this router has it, else on
        the inter-router connection toward the nearest router that has (docs/brokers.md)."""
        out: dict[str, Any] = {k: fields.get(k) for k in PASSED if fields.get(k) is not None}
        target_conn = None
        if lr is not None and lr.connection:
            bconn = self.core.brokers.conns.get(lr.connection)
            if bconn is not None and not bconn.closed:
                target_conn = bconn
        else:
            target_conn = self._next_hop(key)
            if target_conn is not None:
                props = dict(out.get("properties") or {})
                props[Symbol(MARK)] = key
                out["properties"] = props
        if target_conn is None:
            log.info(
                "[C%d][L%d] link route %r: the broker is not reachable; refused",
                conn.conn_id,
                link.handle,
                address,
            )
            link.detach("amqp:not-found", f"link route to {address!r}: the broker is not connected")
            return
        if free_channels(target_conn) <= 0:
            # each routed link has a session of its own: the peer's channel-max bounds them
            # (beyond it the peer would close the connection, and every link on it)
            log.warning(
                "[C%d] link route %r refused: no session left on [C%d] (channel-max %d)",
                conn.conn_id,
                address,
                target_conn.conn_id,
                target_conn.remote_channel_max,
            )
            link.detach(
                "amqp:resource-limit-exceeded",
                f"link route to {address!r}: the connection toward the broker has no session "
                f"left (channel-max {target_conn.remote_channel_max})",
            )
            return
        source, target = fields.get("source"), fields.get("target")
        out["source"] = source_value(source) if isinstance(source, dict) else None
        out["target"] = target_value(target) if isinstance(target, dict) else None
        session = target_conn.begin()
        # the router's role on the far side is the opposite of its role toward the client
        blink: Link = session.attach(link.name, not link.is_sender, out)
        r = Routed(lr, link, blink)
        link.info = r
        blink.info = r
        self.active.add(r)
        log.debug(
            "[C%d][L%d] link route %r -> [C%d]", conn.conn_id, link.handle, address,
            target_conn.conn_id,
        )  # fmt: skip

    def _next_hop(self, key: str) -> Connection | None:
        """The inter-router connection toward the nearest router advertising `key`."""
        mesh = self.core.mesh
        if mesh is None:
            return None
        best: tuple[int, Connection] | None = None
        for router_id in mesh.remote.get(key, ()):
            link_id = mesh.next_hop.get(router_id)
            cost = mesh.cost.get(router_id)
            peer = mesh.peers.get(link_id) if link_id is not None else None
            if peer is None or cost is None or peer.conn.closed:
                continue
            if best is None or cost < best[0]:
                best = (cost, peer.conn)
        return best[1] if best is not None else None

    def advertise(self) -> None:
        """Tell the mesh which link routes reach a broker from here (a mobile address per
        route while its broker connection is up), so other routers forward attaches here."""
        mesh = self.core.mesh
        if mesh is None:
            return
        up = set()
        for lr in self.routes:
            bconn = self.core.brokers.conns.get(lr.connection) if lr.connection else None
            if bconn is not None and not bconn.closed:
                up.add(mesh_key(lr))
        for key in sorted(up - self.advertised):
            mesh.engine.local_address_added(key)
        for key in sorted(self.advertised - up):
            mesh.engine.local_address_removed(key)
        if up != self.advertised:
            mesh.poke()
        self.advertised = up

    def on_any_attach(self, conn: Connection, link: Link, fields: dict[str, Any]) -> bool:
        """An inter-router connection's ATTACH: the answer for a routed link's far end, or a
        neighbour's routed attach."""
        r = link.info
        if isinstance(r, Routed) and r.broker is link:
            return self.on_broker_attach(conn, link, fields)
        return self.claims_transit(conn, link, fields)

    def on_detach(self, conn: Connection, link: Link, closed: bool, error: Any) -> bool:
        r = link.info
        if not isinstance(r, Routed):
            return False
        if r.broker is link:
            return self.on_broker_detach(conn, link, closed, error)
        return self.on_client_detach(link, closed, error)

    # -- the broker's side (qrouter/core.py ConnectionHandler of the broker connection) ----

    def on_broker_attach(self, conn: Connection, blink: Link, fields: dict[str, Any]) -> bool:
        r = blink.info
        if not isinstance(r, Routed):
            return False
        client = r.client
        if client.state == 2 or client.conn.closed:  # LINK_DETACHED: the client went away
            blink.detach()
            blink.session.end()
            return True
        terminus = fields.get("target" if blink.is_sender else "source")
        if terminus is None:
            return True  # 2.6.3: refused; the broker's DETACH (or END) follows with why
        answer: dict[str, Any] = {k: fields.get(k) for k in PASSED if fields.get(k) is not None}
        source, target = fields.get("source"), fields.get("target")
        answer["source"] = source_value(source) if isinstance(source, dict) else None
        answer["target"] = target_value(target) if isinstance(target, dict) else None
        client.attach(answer)
        r.answered = True
        route_pair(client, blink)
        return True

    def on_broker_detach(self, conn: Connection, blink: Link, closed: bool, error: Any) -> bool:
        r = blink.info
        if not isinstance(r, Routed):
            return False
        route_unpair(blink)
        self.active.discard(r)
        if error is None and blink.session.ended:
            error = blink.session.end_error  # RabbitMQ refuses some attaches with END
        if error is not None:
            cond, desc = _condition(error)
        elif conn.closed:
            cond, desc = GONE
        elif blink.session.ended:
            cond, desc = "amqp:not-found", "the broker ended the link's session"
        else:  # the router detached it (qrouter/_fast link_error logs why)
            cond, desc = "amqp:link:detach-forced", "the broker's end of the link failed"

        if not blink.session.ended:
            blink.session.end()
        client = r.client
        if client.state != 2 and not client.conn.closed:
            log.info(
                "[C%d][L%d] routed link %r detached by the broker: %s: %s",
                client.conn.conn_id,
                client.handle,
                client.name,
                cond,
                desc,
            )
            # closed unless the broker only suspended the link (2.6.6: closed=false)
            client.detach(cond, desc, closed or not r.answered or conn.closed)
        return True

    # -- the client's DETACH ------------------------------------------------------------------

    def on_client_detach(self, link: Link, closed: bool, error: Any) -> bool:
        r = link.info
        if not isinstance(r, Routed):
            return False
        route_unpair(link)
        self.active.discard(r)
        blink = r.broker
        if (
            blink is not None
            and blink.state != 2
            and not blink.conn.closed
            and not blink.session.ended
        ):
            cond, desc = _condition(error) if error else (None, None)
            blink.detach(cond, desc, closed)
            blink.session.end()
        return True

    # -- management (linkRoute entities) ---------------------------------------------------

    def add(self, lr: LinkRouteConfig, created: bool = True) -> None:
        self.routes.append(lr)
        if created:
            self.created.add(id(lr))
        self.advertise()

    def remove(self, lr: LinkRouteConfig) -> None:
        """Links already routed stay routed until they detach."""
        self.routes[:] = [x for x in self.routes if x is not lr]
        self.created.discard(id(lr))
        self.advertise()

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for i, lr in enumerate(self.routes):
            if lr.connection:
                bconn = self.core.brokers.conns.get(lr.connection)
                up = bconn is not None and not bconn.closed
            else:  # through the mesh: a router with the broker advertises the route
                mesh = self.core.mesh
                up = mesh is not None and bool(mesh.remote.get(mesh_key(lr)))
            rows.append(
                {
                    "identity": f"linkRoute/{i}",
                    "name": f"{lr.direction}:{lr.prefix or lr.pattern}",
                    "prefix": lr.prefix,
                    "pattern": lr.pattern,
                    "direction": lr.direction,
                    "connection": lr.connection,
                    "operStatus": "active" if up else "inactive",
                    "links": sum(1 for r in self.active if r.route is lr and r.answered),
                    "origin": "management" if id(lr) in self.created else "config",
                }
            )
        return rows


def _condition(error: Any) -> tuple[str, str | None]:
    if isinstance(error, dict) and error.get("condition"):
        desc = error.get("description")
        return str(error["condition"]), desc if isinstance(desc, str) else None
    return ("amqp:not-found", "the broker refused the link")
