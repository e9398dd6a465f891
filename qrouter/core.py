"""The control plane of one router: who may connect, what a link attaches to, and which
address (and distribution) it joins. Called by the engine once per connection and per link,
never per message.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING, Any

from qrouter import __version__
from qrouter._fast import engine as fast
from qrouter._fast.codec import Symbol, UByte, UInt, ULong, decode, encode
from qrouter._fast.engine import (
    DISTRIBUTION_CODES,
    Connection,
    Link,
    Router,
    source_value,
    target_value,
)
from qrouter.addresses import AddressTable
from qrouter.auth import UserDB, parse_plain
from qrouter.brokers import Brokers, consumer_address, phase_of
from qrouter.config import ConnectorConfig, ListenerConfig, RouterConfig
from qrouter.guarantee import Guarantees
from qrouter.journal import origin_id
from qrouter.limits import Limits
from qrouter.link_monitor import LinkMonitor
from qrouter.link_registry import AttachError, LinkRegistry, Terminus, TerminusPersistence
from qrouter.linkroutes import LinkRoutes
from qrouter.login_throttle import LoginThrottle
from qrouter.management import ManagementNode
from qrouter.policy import ConnInfo, Policy, Refusal

if TYPE_CHECKING:
    from qrouter.inter_router import Mesh

log = logging.getLogger("qrouter.core")

# Bounds on names taken from the wire: a link name or container-id is a key of router tables
MAX_NAME = 1024
# Dynamic nodes (3.5.3 dynamic source / 3.5.4 dynamic target) are named under this prefix
DYNAMIC_PREFIX = "_dynamic/"


class Core:
    """One router's tables and policies; one `ConnectionHandler` per connection talks to it."""

    def __init__(
        self,
        config: RouterConfig,
        persistence: TerminusPersistence | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.config = config
        # who may do what (qrouter/policy.py); by default the one the configuration gives
        self.policy = policy or Policy(config.policy, users_file=config.users_file is not None)
        # 3.5.3 dynamic sources: a reply address belongs to the connection that asked for it
        self.dynamic_owner: dict[str, Connection] = {}
        self.table = AddressTable(
            default_distribution=config.default_distribution,
            entries=config.addresses,
            oslo_preset=config.oslo_preset,
        )
        self.users: UserDB | None = UserDB.load(config.users_file) if config.users_file else None
        # PLAIN checks on worker threads, with a per-host backoff (qrouter/login_throttle.py)
        self.login_throttle = LoginThrottle(config.login)
        self.engine = Router(
            config.id,
            link_capacity=config.link_capacity,
            resolver=self.table.distribution,
            diversions=self.diversion_of,
            open_properties={Symbol("product"): "qrouter", Symbol("version"): __version__},
        )
        self.connections: set[Connection] = set()
        self.persistence = persistence
        # limits (qrouter/limits.py): the engine enforces those met at frame parse
        lc = config.limits
        self.limits = Limits(
            lc,
            fast.Limits(
                lc.max_sessions_per_connection,
                lc.max_links_per_connection,
                lc.max_unsettled_per_link,
                lc.message_size_exceeded == "close",
            ),
        )
        self.registry = LinkRegistry(
            config.id, persistence, on_discard=self._discard_held, limits=self.limits
        )
        if persistence is not None and hasattr(persistence, "commit"):
            self.engine.committer = persistence.commit
            # a deleted terminus's records must not come back from the record log
            persistence.on_drop = self.engine.drop_records  # type: ignore[attr-defined]
        # operations (docs/operations.md): the $management node and the stuck-link warnings
        self.management = ManagementNode(self)
        self.monitor = LinkMonitor(self)
        # the mesh data plane (qrouter/inter_router.py), set by the server when it starts
        self.mesh: Mesh | None = None
        # topics with a guarantee (qrouter/guarantee.py): their links bypass the fast path
        self.guarantees = Guarantees(self)
        # connectors to brokers and their autolinks (qrouter/brokers.py)
        self.brokers = Brokers(self)
        # links routed to brokers (qrouter/linkroutes.py)
        self.linkroutes = LinkRoutes(self)
        health = getattr(persistence, "health", None)
        if health is not None:  # a failed store commit is retried (qrouter/store_health.py)
            health.retries += [self.engine.retry_commit, self.guarantees.retry]

    def diversion_of(self, address: str) -> tuple[str | None, str | None] | None:
        """(fallback, dead_letter) of an address (qrouter/_fast/diversion.pxi); reply
        addresses have neither."""
        if address.startswith(DYNAMIC_PREFIX):
            return None
        return self.table.diversion(address)

    def distribution_of(self, address: str) -> str:
        if address.startswith(DYNAMIC_PREFIX):
            return "closest"
        return self.table.distribution(phase_of(address))  # a waypoint's phase 1: its own

    # -- durability 2: held deliveries -------------------------------------------------------

    def rebuild_held(self) -> int:
        """After a restart: turn the stored unsettled records of durable termini back into
        engine deliveries, copies joined to the deliveries they copy (via their origin)."""
        from qrouter.termini_store import terminus_digest

        inbound: dict[bytes, Any] = {}
        count = 0
        termini = [t for t in self.registry.all() if t.records]
        for t in termini:
            if t.role != "receiver":
                continue
            digest = terminus_digest(t.key)
            for rid, rec in t.records.items():
                # the record's id is the delivery's tag unless the record carries the tag
                tag = rid if rec.tag is None else rec.tag
                d = fast.restore_inbound(self.engine, digest, tag, rec.message, rec.state, rid)
                t.held[tag] = d
                inbound[digest + rid] = d
                count += 1
        for t in termini:
            if t.role != "sender":
                continue
            for rid, rec in t.records.items():
                # a copy's record is stored under its tag (the router chose it), see
                # qrouter/stores/termini.py; `forget` names it that way
                origin = inbound.get(rec.origin) if rec.origin else None
                tag = rid if rec.tag is None else rec.tag
                t.held[tag] = fast.restore_copy(origin, tag, rec.message)
                count += 1
        for t in termini:
            t.records = {}
        return count

    def _discard_held(self, t: Terminus) -> None:
        """A durable terminus is gone for good: what it held is settled the usual way."""
        for d in t.held.values():
            if t.role == "sender":
                fast.abandon_copy(d)
            else:
                fast.producer_forgot(self.engine, d)
        t.held = {}

    def new_connection(
        self, listener: ListenerConfig, connector: ConnectorConfig | None = None
    ) -> Connection:
        """A connection accepted on `listener`, or (client mode) opened by `connector`."""
        from qrouter.sasl import anonymous_allowed, offered

        limited = listener.role != "inter-router"  # routers of the mesh are not limited
        channel_max = listener.channel_max
        sessions = self.config.limits.max_sessions_per_connection
        if limited and sessions:
            channel_max = min(channel_max, sessions - 1)  # 2.7.1: channels 0..channel-max
        max_message_size = listener.max_message_size
        conn = Connection(
            self.engine,
            ConnectionHandler(self, listener, connector),
            sasl_mechanisms=offered(listener, self.users is not None),
            require_sasl=not anonymous_allowed(listener),
            max_frame_size=listener.max_frame_size,
            channel_max=channel_max,
            idle_timeout=listener.idle_timeout,
            max_message_size=self.config.max_message_size
            if max_message_size is None
            else max_message_size,
        )
        if limited:
            conn.limits = self.limits.engine
        if connector is None:
            conn.handshake_timeout = listener.handshake_timeout
        if listener.role == "inter-router" and self.mesh is not None:
            conn.open_properties = self.mesh.open_properties(connector.cost if connector else 1)
        conn.trace = self.config.trace  # the frame trace (qrouter/_fast/trace.pxi)
        self.connections.add(conn)
        return conn

    def dynamic_address(self) -> str:
        return f"{DYNAMIC_PREFIX}{self.config.id}/{secrets.token_hex(8)}"


def _running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the socketless tests drive the engine without a loop
        return False
    return True


def _peer_host(conn: Connection) -> str:
    transport = conn.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


def _plain_result(conn: Connection, user: str, ok: bool) -> str | bool:
    if ok:
        log.info("[C%d] authenticated user %r", conn.conn_id, user)
        return user
    log.warning("[C%d] SASL PLAIN: wrong user or password for %r", conn.conn_id, user)
    return False


class ConnectionHandler:
    """The engine's callbacks for one connection."""

    def __init__(
        self, core: Core, listener: ListenerConfig, connector: ConnectorConfig | None = None
    ) -> None:
        self.core = core
        self.listener = listener
        self.connector = connector  # set on the router's own inter-router connections
        self.inter_router = False  # the OPEN exchange admitted an inter-router peer
        self.info: ConnInfo | None = None  # a client connection: what the policy knows of it
        self.dynamic: list[str] = []  # the dynamic source addresses this connection made
        self.sasl: Any = None  # router.sasl.ServerMechanisms: SCRAM / EXTERNAL, when asked
        # our connection to a broker (qrouter/brokers.py): its links are autolinks
        self.broker = connector is not None and connector.role == "route-container"

    # 5.3.3.2 sasl-init
    def on_sasl(
        self, conn: Connection, mechanism: str, response: bytes | None, hostname: Any
    ) -> Any:
        if mechanism == "ANONYMOUS":
            from qrouter.sasl import anonymous_allowed

            return anonymous_allowed(self.listener)
        if mechanism in ("SCRAM-SHA-256", "EXTERNAL"):
            from qrouter.sasl import ServerMechanisms

            self.sasl = ServerMechanisms(self.listener, self.core.users)
            return self._judged(conn, self.sasl.start(conn, mechanism, response))
        if mechanism == "PLAIN" and self.core.users is not None:
            try:
                _authzid, user, password = parse_plain(response or b"")
            except ValueError:
                log.warning("[C%d] malformed SASL PLAIN response", conn.conn_id)
                return False
            if _running_loop():
                return self._plain_off_loop(conn, self.core.users, user, password)
            return _plain_result(conn, user, self.core.users.verify(user, password))
        return False

    def _plain_off_loop(self, conn: Connection, users: UserDB, user: str, password: str) -> int:
        # The hash runs on a worker thread (qrouter/login_throttle.py); the engine holds the
        # connection's later bytes until complete_sasl gives the outcome.
        def done(ok: Any) -> None:
            if ok is None:  # refused after its backoff wait: too many checks pending
                log.warning(
                    "[C%d] SASL PLAIN: too many logins being checked; sys-temp", conn.conn_id
                )
                conn.complete_sasl(4)
            else:
                conn.complete_sasl(_plain_result(conn, user, bool(ok)))

        host = _peer_host(conn)
        if self.core.login_throttle.check(host, lambda: users.verify(user, password), done):
            conn.defer_sasl()
            return 0
        log.warning("[C%d] SASL PLAIN: too many logins being checked; sys-temp", conn.conn_id)
        return 4  # 5.3.3.6 sys-temp: a temporary failure, the client may retry

    # 5.3.3.4 sasl-response (to our challenge)
    def on_sasl_response(self, conn: Connection, response: bytes | None) -> Any:
        if self.sasl is None:
            return False
        return self._judged(conn, self.sasl.respond(conn, response))

    def _judged(self, conn: Connection, verdict: Any) -> Any:
        """A SCRAM or EXTERNAL verdict counts toward the host's login backoff like a PLAIN
        check (qrouter/login_throttle.py); a host in backoff gets its outcome late."""
        if isinstance(verdict, bytes) or not _running_loop():  # a challenge: nothing decided
            return verdict
        if self.core.login_throttle.judge(
            _peer_host(conn), bool(verdict), verdict, conn.complete_sasl
        ):
            conn.defer_sasl()
            return 0
        return verdict

    def on_open(self, conn: Connection, fields: dict[str, Any]) -> None:
        cid = fields["container_id"]
        if not isinstance(cid, str) or not cid or len(cid) > MAX_NAME:
            conn.close(
                "amqp:invalid-field", "container-id must be a string of 1 to 1024 characters"
            )
            return
        log.info("[C%d] open from container %r", conn.conn_id, cid)
        if self.broker:
            assert self.connector is not None
            self.core.brokers.on_open(conn, self.connector)
            return
        # roles (docs/mesh.md): a router on a normal listener, or a client on an inter-router
        # listener, is refused before anything else happens
        from qrouter.inter_router import is_inter_router_open

        peer_router = is_inter_router_open(fields)
        if self.listener.role == "inter-router":
            if not peer_router or self.core.mesh is None:
                conn.close(
                    "amqp:unauthorized-access",
                    "this listener is for inter-router connections only; clients use a normal "
                    "listener"
                    if self.connector is None
                    else "the peer did not answer as an inter-router listener",
                )
                return
            from qrouter.inter_router import P_ID
            from qrouter.sasl import mesh_refusal

            claimed = fields["properties"].get(P_ID)  # a map: is_inter_router_open said so
            refusal = mesh_refusal(self.core.config, conn, self.connector, claimed)
            if refusal is None:
                refusal = self.core.mesh.first_use_refusal(conn, self.connector, claimed)
            if refusal is not None:
                self.core.mesh.refused["identity"] += 1
                log.error("[C%d] inter-router connection refused: %s", conn.conn_id, refusal)
                conn.close("amqp:unauthorized-access", refusal)
                return
            self.inter_router = True
            self.core.mesh.on_open(conn, fields, self.connector.cost if self.connector else None)
        elif peer_router:
            conn.close(
                "amqp:unauthorized-access",
                "inter-router connections are accepted only on an inter-router listener",
            )
        else:
            self._admit(conn)

    def _admit(self, conn: Connection) -> None:
        """A client's OPEN: the connection limits (qrouter/limits.py), then the policy's group
        and its connection maxima (qrouter/policy.py). After SASL and OPEN, so that the client
        learns from the CLOSE which one it met (2.4.3)."""
        transport = conn.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        host = str(peer[0]) if isinstance(peer, tuple) and peer else None
        limited = self.core.limits.admit(conn, host or "unknown", conn.user)
        if limited is not None:
            log.warning("[C%d] refused: %s", conn.conn_id, limited[1])
            conn.close(*limited)
            return
        info = ConnInfo(
            conn.conn_id, conn.user, host, self.listener.host, self.listener.require_auth
        )
        self.info = info
        refusal = self.core.policy.admit(info)
        if refusal is not None:
            conn.close(refusal.condition, refusal.description)
            return
        sessions = self.core.policy.max_sessions(info)
        if sessions and sessions - 1 < conn.channel_max:
            # 2.7.1: channel-max in our OPEN is the highest channel number the peer may use
            conn.channel_max = sessions - 1

    def on_channel_refused(self, conn: Connection, channel: int) -> str | None:
        """A BEGIN above our channel-max (2.7.1): when the policy's max_sessions set it, the
        refusal is counted and logged as the policy's, and named in the error's description."""
        sessions = self.core.policy.max_sessions(self.info) if self.info is not None else 0
        if self.info is None or not sessions or conn.channel_max != sessions - 1:
            return None
        refusal = self.core.policy.refuse_session(self.info, channel)
        return refusal.description if refusal is not None else None

    def on_attach(self, conn: Connection, link: Link, fields: dict[str, Any]) -> None:
        if self.broker:
            if not self.core.linkroutes.on_broker_attach(conn, link, fields):
                self.core.brokers.on_attach(conn, link, fields)
            return
        if self.inter_router:
            assert self.core.mesh is not None
            if not self.core.linkroutes.on_any_attach(conn, link, fields):
                self.core.mesh.on_attach(conn, link, fields)
            return
        if self.core.mesh is not None and link.is_sender:
            # it may be the address's first local consumer (checked after this iteration)
            self.core.mesh.touch(link)
        if self.core.management.claims(link, fields):  # a sender to $management
            return
        try:
            self._check_policy(conn, link, fields)
            if self.core.linkroutes.claims(conn, link, fields):
                return  # routed to a broker (qrouter/linkroutes.py)
            key = self.core.registry.key_for(conn.remote_container_id, link.name, link.is_sender)
            if link.is_sender:
                self._attach_consumer(key, link, fields)
            else:
                self._attach_producer(key, link, fields)
        except AttachError as e:
            link.detach(e.condition, e.description)

    def _check_policy(self, conn: Connection, link: Link, fields: dict[str, Any]) -> None:
        """Raise AttachError when the policy refuses this attach, or when it is a receiver
        on another connection's reply address (3.5.3 dynamic: a reply address is private)."""
        info = self.info
        if info is None:
            return
        receiving = link.is_sender  # the client receives on a link where the router sends
        terminus = fields.get("source" if receiving else "target")
        if not isinstance(terminus, dict):
            return  # null: a stored terminus is recovered; the registry checks the key
        dynamic = bool(terminus.get("dynamic"))
        address = terminus.get("address")
        address = address if isinstance(address, str) and address else None
        if receiving and not dynamic and address is not None:
            self._check_private(conn, address)

        def open_links() -> int:
            return sum(
                1
                for other in conn.links()
                if other.is_sender == receiving and other.state == 1 and not other.endpoint
            )

        refusal = self.core.policy.check_attach(info, receiving, address, dynamic, open_links)
        if refusal is not None:
            raise AttachError(refusal.condition, refusal.description)

    def _check_private(self, conn: Connection, address: str) -> None:
        if not address.startswith(DYNAMIC_PREFIX):
            return
        if self.core.dynamic_owner.get(address) is conn:
            return
        assert self.info is not None
        refusal: Refusal = self.core.policy.refuse_reply_address(self.info, address)
        raise AttachError(refusal.condition, refusal.description)

    def _check_recovered(self, link: Link, address: str | None) -> None:
        """A null terminus recovered a stored one: the policy applies to its address as if
        the peer had named it; a refusal leaves the stored terminus suspended."""
        which = "source" if link.is_sender else "target"
        try:
            self._check_policy(link.conn, link, {which: {"address": address}})
        except AttachError:
            self.core.registry.detached(link, False, "link-detach")
            raise

    def _attach_consumer(self, key: Any, link: Link, fields: dict[str, Any]) -> None:
        source = fields.get("source")
        if source is None:
            # a null source: recover the stored terminus (durable subscriptions)
            t = self.core.registry.attach(key, link, None, None)
            address = t.address
            self._check_recovered(link, address)
        else:
            if not isinstance(source, dict):
                raise AttachError("amqp:invalid-field", "source is not a source terminus")
            address = source.get("address")
            if source.get("dynamic"):
                address = self.core.dynamic_address()
                self.core.dynamic_owner[address] = link.conn
                self.dynamic.append(address)
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
        if self.core.table.guarantee(address) is not None:
            reply = _reply_terminus(t, address)
            self.core.guarantees.attach_subscriber(link, address, fields, reply, t.durable)
            return
        target = fields.get("target")
        link.attach(
            {
                "snd_settle_mode": _mode(fields.get("snd_settle_mode"), 2),
                "rcv_settle_mode": _mode(fields.get("rcv_settle_mode"), 0),
                "source": source_value(_reply_terminus(t, address)),
                "target": target_value(target) if isinstance(target, dict) else None,
                "unsettled": _held_map(t, sender=True) if t.durable == 2 else None,
            }
        )
        # a waypoint's consumers receive what its in-autolinks take from the broker (phase 1)
        link.bind(consumer_address(self.core, address), DISTRIBUTION_CODES[distribution])
        if t.durable == 2:
            self._resume_consumer(link, t, fields.get("unsettled"))
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
            self._check_recovered(link, address)
        else:
            if not isinstance(target, dict):
                raise AttachError("amqp:invalid-field", "target is not a target terminus")
            address = target.get("address")
            if target.get("dynamic"):
                address = self.core.dynamic_address()
                self.core.dynamic_owner[address] = link.conn  # 3.5.4: private as well
                self.dynamic.append(address)
            elif address is not None and (not isinstance(address, str) or not address):
                raise AttachError("amqp:invalid-field", "target address must be a non-empty string")
            t = self.core.registry.attach(key, link, target, address)
        distribution = self.core.table.distribution(address) if address else None
        if distribution == "unavailable":
            self.core.registry.detached(link, True, "link-detach")
            raise AttachError("amqp:not-found", f"address '{address}' is unavailable")
        if address is not None and self.core.table.guarantee(address) is not None:
            reply = _reply_terminus(t, address)
            self.core.guarantees.attach_publisher(link, address, fields, reply)
            return
        source = fields.get("source")
        max_size = link.conn.max_message_size  # the listener's (or the router's)
        if self.info is not None:
            max_size = self.core.policy.max_message_size(self.info, max_size)
        link.origin_prefix = origin_id(link.conn.remote_container_id, link.name, b"")
        link.attach(
            {
                "snd_settle_mode": _mode(fields.get("snd_settle_mode"), 2),
                "rcv_settle_mode": _producer_rcv_mode(fields, target, t.durable),
                "source": source_value(source) if isinstance(source, dict) else None,
                "target": target_value(_reply_terminus(t, address)),
                "max_message_size": ULong(max_size) if max_size > 0 else None,  # 2.7.3: a ulong
                "unsettled": _held_map(t, sender=False) if t.durable == 2 else None,
            }
        )
        if t.durable == 2:
            self._resume_producer(link, t, fields.get("unsettled"))
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

    # 2.6.13 resuming: the router's map went out in its ATTACH; now act on the peer's
    def _resume_producer(self, link: Link, t: Terminus, peer: Any) -> None:
        from qrouter.termini_store import terminus_digest

        link.durable_key = terminus_digest(t.key)
        peer_tags = set(peer) if isinstance(peer, dict) else set()
        keep = {}
        for tag, d in t.held.items():
            if tag in peer_tags:
                keep[tag] = d  # the producer resends it: it re-binds on arrival
            else:
                fast.producer_forgot(self.core.engine, d)  # the producer settled it
        t.held = {}
        link.set_resumable(keep)

    def _resume_consumer(self, link: Link, t: Terminus, peer: Any) -> None:
        from qrouter.termini_store import terminus_digest

        key = terminus_digest(t.key)
        link.durable_key = key
        peer = peer if isinstance(peer, dict) else {}
        for tag, out in t.held.items():
            inbound = out.inbound_delivery
            done = inbound is None or inbound.is_settled
            if tag in peer:
                state = peer[tag]
                raw = encode(state) if state is not None else None
                code = fast.state_code(raw) if raw else 0
                if code in (0x24, 0x25, 0x26, 0x27):
                    fast.consumer_state(out, code, raw)
                    if done:
                        fast.forget(self.core.engine, key, tag)
                    link.resend(out, True, False, raw, done)
                else:
                    link.resend(out, True, True)  # it has it, undecided: resume with payload
            elif done:
                fast.forget(self.core.engine, key, tag)  # settled all along
            else:
                link.resend(out, False, True)  # it never reached the consumer
        t.held = {}

    def on_detach(self, conn: Connection, link: Link, closed: bool, error: Any) -> None:
        if self.broker:
            if not self.core.linkroutes.on_broker_detach(conn, link, closed, error):
                self.core.brokers.on_detach(conn, link, error)
            return
        if self.inter_router:
            assert self.core.mesh is not None
            if not self.core.linkroutes.on_detach(conn, link, closed, error):
                self.core.mesh.on_detach(conn, link)
            return
        if self.core.linkroutes.on_client_detach(link, closed, error):
            return
        if self.core.mesh is not None and link.is_sender:
            self.core.mesh.touch(link)  # it may be the address's last local consumer
        if self.core.guarantees.owns(link):
            self.core.guarantees.on_detach(link, closed)
        cause = (
            "connection-close"
            if conn.closed
            else ("session-end" if link.session.ended else "link-detach")
        )
        held = link.take_resumable() if link.durable_key is not None else {}
        t = self.core.registry.detached(link, closed, cause)
        if t is not None and t.durable == 2:
            t.held.update(held)
        elif held:
            role = "sender" if link.is_sender else "receiver"
            gone = Terminus(key=("", "", link.name, role), address=None, fields={}, held=held)
            self.core._discard_held(gone)
        if error:
            log.info(
                "[C%d][L%d] link %r detached by peer: %s",
                conn.conn_id,
                link.handle,
                link.name,
                error,
            )

    # Deliveries of endpoint links (Link.bind_endpoint): the $management node's, and those of
    # guaranteed topics (qrouter/guarantee.py).
    def on_message(self, conn: Connection, link: Link, delivery: Any, payload: bytes) -> None:
        if self.inter_router:
            assert self.core.mesh is not None
            self.core.mesh.on_message(conn, link, payload)
            return
        if self.core.guarantees.owns(link):
            self.core.guarantees.on_message(link, delivery, payload)
            return
        self.core.management.on_message(link, delivery, payload)

    def on_outcome(
        self, conn: Connection, link: Link, delivery: Any, code: int, settled: bool
    ) -> None:
        # the node's replies are presettled; a guaranteed topic's subscriber answers
        if self.core.guarantees.owns(link):
            self.core.guarantees.on_outcome(link, delivery, code, settled)

    def on_settled(self, conn: Connection, link: Link, delivery: Any) -> None:
        if self.core.guarantees.owns(link):
            self.core.guarantees.on_settled(link, delivery)

    def on_flow(self, conn: Connection, link: Link) -> None:
        pass

    def on_closed(self, conn: Connection) -> None:
        self.core.connections.discard(conn)
        self.core.limits.release(conn)
        if self.info is not None:
            self.core.policy.release(self.info)
        for address in self.dynamic:
            if self.core.dynamic_owner.get(address) is conn:
                del self.core.dynamic_owner[address]
        if self.inter_router and self.core.mesh is not None:
            self.core.mesh.on_closed(conn)
        if self.broker:
            self.core.brokers.on_closed(conn)
        log.info("[C%d] connection closed", conn.conn_id)


def _held_map(t: Terminus, *, sender: bool) -> dict[bytes, Any]:
    """The router's unsettled map for a resuming durable link (2.6.13): each held delivery's
    tag with the state the router knows (a producer's outcome), else null."""
    out: dict[bytes, Any] = {}
    for tag, d in t.held.items():
        raw = None if sender else d.outcome_bytes
        out[tag] = decode(raw)[0] if raw else None
    return out


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


def _producer_rcv_mode(fields: dict[str, Any], target: Any, stored: int) -> UByte:
    """The rcv-settle-mode the router grants a producer (2.7.3: the receiver's ATTACH states
    the mode it uses; the sender may detach if it cannot live with it). *second* (3.8.3) only
    when the producer's target asks for durable unsettled-state (3.5.5; a null target: the
    stored terminus has it), i.e. a sender that keeps its deliveries' state and resumes them
    (2.6.13). Anywhere else the router settles its outcome at once, as Qpid Dispatch does: a
    client that asks for *second* but never settles first (uAMQP) sees its sends complete."""
    asked = _mode(fields.get("rcv_settle_mode"), 0)
    durable = target.get("durable") if isinstance(target, dict) else stored
    return asked if durable == 2 else UByte(0)


def _mode(value: Any, default: int) -> UByte:
    if value is None or not 0 <= int(value) <= 2:
        return UByte(default)
    return UByte(int(value))
