"""The control plane of one router: who may connect, what a link attaches to, and which
address (and distribution) it joins. Called by the engine once per connection and per link,
never per message.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from router import __version__
from router._fast.codec import Symbol, UByte, UInt, ULong
from router._fast.engine import (
    DISTRIBUTION_CODES,
    Connection,
    Link,
    Router,
    source_value,
    target_value,
)
from router.addresses import AddressTable
from router.auth import UserDB, parse_plain
from router.config import ListenerConfig, RouterConfig
from router.link_registry import AttachError, LinkRegistry, Terminus, TerminusPersistence

log = logging.getLogger("qrouter.core")

# Bounds on names taken from the wire: a link name or container-id is a key of router tables
MAX_NAME = 1024
# Dynamic nodes (3.5.3 dynamic source / 3.5.4 dynamic target) are named under this prefix
DYNAMIC_PREFIX = "_dynamic/"


class Core:
    """One router's tables and policies; one `ConnectionHandler` per connection talks to it."""

    def __init__(
        self, config: RouterConfig, persistence: TerminusPersistence | None = None
    ) -> None:
        self.config = config
        self.table = AddressTable(
            default_distribution=config.default_distribution,
            entries=config.addresses,
            oslo_preset=config.oslo_preset,
        )
        self.users: UserDB | None = UserDB.load(config.users_file) if config.users_file else None
        self.engine = Router(
            config.id,
            link_capacity=config.link_capacity,
            resolver=self.table.distribution,
            open_properties={Symbol("product"): "qrouter", Symbol("version"): __version__},
        )
        self.connections: set[Connection] = set()
        self.registry = LinkRegistry(config.id, persistence)

    def new_connection(self, listener: ListenerConfig) -> Connection:
        mechanisms = [
            m for m in listener.sasl_mechanisms if m != "ANONYMOUS" or not listener.require_auth
        ]
        if self.users is None:
            mechanisms = [m for m in mechanisms if m != "PLAIN"]
        conn = Connection(
            self.engine,
            ConnectionHandler(self, listener),
            sasl_mechanisms=tuple(mechanisms),
            require_sasl=listener.require_auth,
            max_frame_size=listener.max_frame_size,
            channel_max=listener.channel_max,
            idle_timeout=listener.idle_timeout,
            max_message_size=self.config.max_message_size,
        )
        self.connections.add(conn)
        return conn

    def dynamic_address(self) -> str:
        return f"{DYNAMIC_PREFIX}{self.config.id}/{secrets.token_hex(8)}"


class ConnectionHandler:
    """The engine's callbacks for one connection."""

    def __init__(self, core: Core, listener: ListenerConfig) -> None:
        self.core = core
        self.listener = listener

    # 5.3.3.2 sasl-init
    def on_sasl(
        self, conn: Connection, mechanism: str, response: bytes | None, hostname: Any
    ) -> Any:
        if mechanism == "ANONYMOUS":
            return not self.listener.require_auth
        if mechanism == "PLAIN" and self.core.users is not None:
            try:
                _authzid, user, password = parse_plain(response or b"")
            except ValueError:
                log.warning("[C%d] malformed SASL PLAIN response", conn.conn_id)
                return False
            if self.core.users.verify(user, password):
                log.info("[C%d] authenticated user %r", conn.conn_id, user)
                return user
            log.warning("[C%d] SASL PLAIN: wrong user or password for %r", conn.conn_id, user)
        return False

    def on_open(self, conn: Connection, fields: dict[str, Any]) -> None:
        cid = fields["container_id"]
        if not isinstance(cid, str) or not cid or len(cid) > MAX_NAME:
            conn.close(
                "amqp:invalid-field", "container-id must be a string of 1 to 1024 characters"
            )
            return
        log.info("[C%d] open from container %r", conn.conn_id, cid)

    def on_attach(self, conn: Connection, link: Link, fields: dict[str, Any]) -> None:
        try:
            key = self.core.registry.key_for(conn.remote_container_id, link.name, link.is_sender)
            if link.is_sender:
                self._attach_consumer(key, link, fields)
            else:
                self._attach_producer(key, link, fields)
        except AttachError as e:
            link.detach(e.condition, e.description)

    def _attach_consumer(self, key: Any, link: Link, fields: dict[str, Any]) -> None:
        source = fields.get("source")
        if source is None:
            # a null source: recover the stored terminus (durable subscriptions)
            t = self.core.registry.attach(key, link, None, None)
            address = t.address
        else:
            if not isinstance(source, dict):
                raise AttachError("amqp:invalid-field", "source is not a source terminus")
            address = source.get("address")
            if source.get("dynamic"):
                address = self.core.dynamic_address()
            elif not isinstance(address, str) or not address:
                raise AttachError("amqp:invalid-field", "source address is missing")
            t = self.core.registry.attach(key, link, source, address)
        assert address is not None
        distribution = (
            "closest"
            if address.startswith(DYNAMIC_PREFIX)
            else self.core.table.distribution(address)
        )
        if distribution == "unavailable":
            self.core.registry.detached(link, True, "link-detach")
            raise AttachError("amqp:not-found", f"address '{address}' is unavailable")
        target = fields.get("target")
        link.attach(
            {
                "snd_settle_mode": _mode(fields.get("snd_settle_mode"), 2),
                "rcv_settle_mode": _mode(fields.get("rcv_settle_mode"), 0),
                "source": source_value(_reply_terminus(t, address)),
                "target": target_value(target) if isinstance(target, dict) else None,
            }
        )
        link.bind(address, DISTRIBUTION_CODES[distribution])
        log.debug(
            "[C%d][L%d] consumer %r on %r (%s, durable %d)",
            link.conn.conn_id,
            link.handle,
            link.name,
            address,
            distribution,
            t.durable,
        )

    def _attach_producer(self, key: Any, link: Link, fields: dict[str, Any]) -> None:
        target = fields.get("target")
        if target is None:
            t = self.core.registry.attach(key, link, None, None)
            address = t.address
        else:
            if not isinstance(target, dict):
                raise AttachError("amqp:invalid-field", "target is not a target terminus")
            address = target.get("address")
            if target.get("dynamic"):
                address = self.core.dynamic_address()
            elif address is not None and (not isinstance(address, str) or not address):
                raise AttachError("amqp:invalid-field", "target address must be a non-empty string")
            t = self.core.registry.attach(key, link, target, address)
        distribution = self.core.table.distribution(address) if address else None
        if distribution == "unavailable":
            self.core.registry.detached(link, True, "link-detach")
            raise AttachError("amqp:not-found", f"address '{address}' is unavailable")
        source = fields.get("source")
        max_size = self.core.config.max_message_size
        link.attach(
            {
                "snd_settle_mode": _mode(fields.get("snd_settle_mode"), 2),
                "rcv_settle_mode": _mode(fields.get("rcv_settle_mode"), 0),
                "source": source_value(source) if isinstance(source, dict) else None,
                "target": target_value(_reply_terminus(t, address)),
                "max_message_size": ULong(max_size) if max_size > 0 else None,  # 2.7.3: a ulong
            }
        )
        if address is None:
            link.bind_anonymous()
        else:
            assert distribution is not None
            link.bind(address, DISTRIBUTION_CODES[distribution])
        log.debug(
            "[C%d][L%d] producer %r to %r (durable %d)",
            link.conn.conn_id,
            link.handle,
            link.name,
            address,
            t.durable,
        )

    def on_detach(self, conn: Connection, link: Link, closed: bool, error: Any) -> None:
        cause = (
            "connection-close"
            if conn.closed
            else ("session-end" if link.session.ended else "link-detach")
        )
        self.core.registry.detached(link, closed, cause)
        if error:
            log.info(
                "[C%d][L%d] link %r detached by peer: %s",
                conn.conn_id,
                link.handle,
                link.name,
                error,
            )

    def on_closed(self, conn: Connection) -> None:
        self.core.connections.discard(conn)
        log.info("[C%d] connection closed", conn.conn_id)


def _reply_terminus(t: Terminus, address: str | None) -> dict[str, Any]:
    """The router's terminus as its ATTACH states it: what the peer asked, with the address
    (dynamic ones filled in) and the durability and expiry the router grants (3.5.3)."""
    reply = dict(t.fields)
    reply.pop("_code", None)
    reply["address"] = address
    reply["durable"] = UInt(t.durable)
    reply["expiry_policy"] = Symbol(t.expiry_policy)
    reply["timeout"] = UInt(int(t.timeout))
    return reply


def _mode(value: Any, default: int) -> UByte:
    if value is None or not 0 <= int(value) <= 2:
        return UByte(default)
    return UByte(int(value))
