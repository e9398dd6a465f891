"""Brokers in the mesh (docs/brokers.md): connectors with role route-container, and the
autolinks the router keeps attached to broker queues for waypoint addresses.

An autolink is an ordinary engine link on the broker connection, attached from the router's
side (`Session.attach`) and bound to an address like a client's link (`Link.bind`); the
engine forwards its transfers, credit and dispositions as for any other link. Python runs
per connection and per attach / detach, never per message.

Waypoint addresses have two phases, so that what a broker queue hands back does not go
straight back into the queue:

* phase 0, the address itself: producers send to it; its consumers are the out-autolinks
  (the router sends to the queue), here or on other routers of the mesh;
* phase 1, ``_waypoint/ADDRESS`` in the engine and in the mesh: the in-autolinks (the router
  receives from the queue) produce to it; the clients' consumers of the address bind to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from qrouter._fast.codec import UInt
from qrouter._fast.engine import DISTRIBUTION_CODES, Connection, Link, source_value, target_value
from qrouter.config import AutoLinkConfig, ConnectorConfig
from qrouter.reconnect import reconnect_forever

if TYPE_CHECKING:
    from qrouter.core import Core

log = logging.getLogger("qrouter.brokers")

PHASE1 = "_waypoint/"  # the engine address the consumers of a waypoint address bind to
REATTACH = 2.0  # seconds before an autolink the broker detached (or refused) is attached again
# 3.5.3 / 3.5.4 terminus-durability 1 (configuration): RabbitMQ declares a durable queue for
# a durable terminus; the router keeps no unsettled state of its own for autolinks
QUEUE_DURABLE = UInt(1)


def connector_name(cc: ConnectorConfig) -> str:
    return cc.name or f"{cc.host}:{cc.port}"


def consumer_address(core: Core, address: str) -> str:
    """The engine address a client's consumer of `address` binds to: phase 1 for a waypoint."""
    return PHASE1 + address if core.table.waypoint(address) else address


def phase_of(address: str) -> str:
    """The configured address behind an engine address (phase 1 names carry a prefix)."""
    return address[len(PHASE1) :] if address.startswith(PHASE1) else address


class Brokers:
    """The route-container connectors of one router and the autolinks over them."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.autolinks: list[AutoLinkConfig] = core.config.autolinks
        self.conns: dict[str, Connection] = {}  # connector name -> its open connection
        self.links: dict[int, Link] = {}  # id(AutoLinkConfig) -> its link (attaching or up)
        self.created: set[int] = set()  # id(AutoLinkConfig) of autolinks made by management
        self.refusals: dict[int, str] = {}  # id(AutoLinkConfig) -> the broker's last error
        self.ended_on: set[int] = set()  # connections whose broker ended a session of ours
        self._tasks: dict[int, asyncio.Task[None]] = {}  # id(ConnectorConfig) -> its task
        self._connect: Callable[[ConnectorConfig], Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- connectors -----------------------------------------------------------------------------

    def connectors(self) -> list[ConnectorConfig]:
        return [cc for cc in self.core.config.connectors if cc.role == "route-container"]

    def start(self, connect: Callable[[ConnectorConfig], Any]) -> None:
        """`connect(cc)` opens a connection and returns an awaitable that ends when it closes
        (qrouter/server.py); one task per connector reconnects with backoff."""
        self.loop = asyncio.get_running_loop()
        self._connect = connect
        for cc in self.connectors():
            self.add_connector(cc)

    def add_connector(self, cc: ConnectorConfig) -> None:
        assert self.loop is not None
        self._tasks[id(cc)] = self.loop.create_task(self._connector(cc))

    def remove_connector(self, cc: ConnectorConfig) -> int:
        """Stop reconnecting and close its connection (its autolinks go with it)."""
        task = self._tasks.pop(id(cc), None)
        if task is not None:
            task.cancel()
        conn = self.conns.get(connector_name(cc))
        if conn is not None and not conn.closed:
            conn.close("amqp:connection:forced", "connector deleted by management")
            return 1
        return 0

    def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    async def _connector(self, cc: ConnectorConfig) -> None:
        connect = self._connect
        assert connect is not None
        where = f"broker {connector_name(cc)} ({cc.host}:{cc.port})"
        await reconnect_forever(lambda: connect(cc), where, log)

    # -- the connection (qrouter/core.py ConnectionHandler calls these) ------------------------

    def on_open(self, conn: Connection, cc: ConnectorConfig) -> None:
        """The broker's OPEN: begin a session and attach this connector's autolinks once our
        OPEN has left (2.4.1: OPEN before BEGIN)."""
        name = connector_name(cc)
        conn.info = name
        self.conns[name] = conn
        log.info(
            "[C%d] broker %r open (container %r)", conn.conn_id, name, conn.remote_container_id
        )
        self.core.linkroutes.advertise()  # link routes through this broker are reachable
        asyncio.get_running_loop().call_soon(self._begin, conn, name)

    def _begin(self, conn: Connection, name: str) -> None:
        current = self.conns.get(name)
        if conn.closed or current is None or current is not conn:
            return
        current.info = (name, current.begin())
        self._watch(conn, name)

    def _watch(self, conn: Connection, name: str) -> None:
        """Attach what is missing, now and every REATTACH seconds while the connection
        lasts: autolinks the broker detached or refused, and all of them when it ended
        their session."""
        if conn.closed or self.conns.get(name) is not conn:
            return
        self._session(name)  # a new one if the broker ended it (its links are dropped)
        for al in self.autolinks:
            if al.connection == name and id(al) not in self.links:
                self._attach(al)
        asyncio.get_running_loop().call_later(REATTACH, self._watch, conn, name)

    def _session(self, name: str) -> Any:
        conn = self.conns.get(name)
        if conn is None or conn.closed or not isinstance(conn.info, tuple):
            return None
        session = conn.info[1]
        if session.ended:
            # 2.5.5: the broker ended the session, e.g. RabbitMQ on a queue it does not have
            # (amqp:not-found); the links on it are gone: a new session for their successors.
            # Told once per connection (it may go on every REATTACH seconds), then debug.
            first = conn.conn_id not in self.ended_on
            self.ended_on.add(conn.conn_id)
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "[C%d] broker %r ended the autolinks' session; beginning a new one",
                conn.conn_id,
                name,
            )
            for key, link in list(self.links.items()):
                if link.conn is conn:
                    del self.links[key]
            session = conn.begin()
            conn.info = (name, session)
        return session

    def _attach(self, al: AutoLinkConfig) -> None:
        """2.6.3: the router's ATTACH for an autolink; the broker's answer binds it."""
        session = self._session(al.connection)
        if session is None or id(al) in self.links:
            return
        out = al.direction == "out"
        queue = {"address": al.queue, "durable": QUEUE_DURABLE}
        local = {"address": al.address}
        link: Link = session.attach(
            f"qrouter.autolink.{al.direction}.{al.address}",
            out,
            {
                "snd_settle_mode": 2,  # mixed: a presettled message stays presettled
                "rcv_settle_mode": 0,  # first (3.8.3): the broker settles its outcome at once
                "source": source_value(local if out else queue),
                "target": target_value(queue if out else local),
            },
        )
        link.info = al
        self.links[id(al)] = link

    def on_attach(self, conn: Connection, link: Link, fields: dict[str, Any]) -> None:
        al = link.info if link.local_init else None
        if not isinstance(al, AutoLinkConfig):
            # the broker attaching a link of its own: not something a waypoint needs
            link.detach("amqp:not-implemented", "qrouter takes no links from a broker")
            return
        terminus = fields.get("target" if link.is_sender else "source")
        if terminus is None:
            return  # 2.6.3: refused; its DETACH follows (on_detach attaches it again later)
        self.refusals.pop(id(al), None)
        distribution = self.core.distribution_of(al.address)
        if link.is_sender:
            # out: a consumer of the address, with the broker's credit; the producer's
            # outcome is the broker's (the engine relays its dispositions)
            link.bind(al.address, DISTRIBUTION_CODES[distribution])
            if self.core.mesh is not None:
                self.core.mesh.touch(link)  # the mesh learns the address has a consumer here
        else:
            # in: a producer of phase 1, credited from the consumers' credit (address.pxi)
            link.bind(PHASE1 + al.address, DISTRIBUTION_CODES[distribution])
            # RabbitMQ 3.10 sends what its queue had already handed to the link after a FLOW
            # of ours lowered the credit (2.6.7 asks the sender to stay within it): up to the
            # credit granted before, at most the link capacity; more is still an error
            link.overshoot = self.core.config.link_capacity
        log.info(
            "[C%d][L%d] autolink %s %r <-> queue %r attached",
            conn.conn_id,
            link.handle,
            al.direction,
            al.address,
            al.queue,
        )

    def on_detach(self, conn: Connection, link: Link, error: Any) -> None:
        al = link.info
        if not isinstance(al, AutoLinkConfig):
            return
        if self.links.get(id(al)) is link:
            del self.links[id(al)]
        if self.core.mesh is not None and link.is_sender:
            self.core.mesh.touch(link)  # it may have been the address's last consumer here
        if conn.closed:
            return  # the connection comes back with the connector; its autolinks with it
        # a broker that keeps refusing (e.g. a queue it will not declare) is told once
        text = _error_text(error)
        level = logging.DEBUG if self.refusals.get(id(al)) == text else logging.WARNING
        self.refusals[id(al)] = text
        log.log(
            level,
            "[C%d] autolink %s %r detached by the broker: %s; attaching again within %.0f s",
            conn.conn_id,
            al.direction,
            al.address,
            text,
            REATTACH,
        )

    def on_closed(self, conn: Connection) -> None:
        for name, c in list(self.conns.items()):
            if c is conn:
                del self.conns[name]
        self.core.linkroutes.advertise()
        for key, link in list(self.links.items()):
            if link.conn is conn:
                del self.links[key]
        self.ended_on.discard(conn.conn_id)

    # -- management (autoLink entities) ---------------------------------------------------------

    def add_autolink(self, al: AutoLinkConfig, created: bool = True) -> None:
        self.autolinks.append(al)
        if created:
            self.created.add(id(al))
        self._attach(al)

    def remove_autolink(self, al: AutoLinkConfig) -> None:
        self.autolinks[:] = [a for a in self.autolinks if a is not al]
        self.created.discard(id(al))
        self.refusals.pop(id(al), None)
        link = self.links.pop(id(al), None)
        if link is not None:
            link.detach()
            if self.core.mesh is not None and link.is_sender:
                self.core.mesh.touch(link)

    def autolink_rows(self) -> list[dict[str, Any]]:
        rows = []
        for i, al in enumerate(self.autolinks):
            link = self.links.get(id(al))
            up = link is not None and link.state == 1 and link.address is not None
            rows.append(
                {
                    "identity": f"autoLink/{i}",
                    "name": f"{al.direction}:{al.address}",
                    "address": al.address,
                    "direction": al.direction,
                    "connection": al.connection,
                    "external_address": al.external_address,
                    "operStatus": "active" if up else "inactive",
                    "credit": link.credit if up and link is not None else None,
                    # out: deliveries sent to the broker on the current attachment
                    "deliveries": link.n_delivered if link is not None else 0,
                    "origin": "management" if id(al) in self.created else "config",
                }
            )
        return rows


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('condition')}: {error.get('description')}"
    return "no error" if error is None else str(error)
