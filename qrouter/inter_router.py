"""The mesh data plane (docs/mesh.md, "Data plane"): inter-router connections, their control
links, and the per-address links that carry messages between routers.

`Mesh` implements `qrouter.mesh.DataPlane` for the routing engine and applies what it decides
to the Cython engine:

* one **control link** pair per inter-router connection (address ``_qr/control``; each router
  attaches a sender on its own session), presettled, carrying the engine's messages as AMQP
  maps (an amqp-value section); once the peer is up, the guaranteed topics' batches on it
  are received in the engine (`EoControl`, qrouter/_fast/eo_control.pxi), the rest here;
* one **per-address link** (``qr.<address>``) per (address, neighbour) that is the next hop
  toward some router with consumers for the address. Here it is a consumer of the address; at
  the neighbour it is a producer of it, so credit is proxied hop by hop from the real
  consumers and dispositions travel back the same way. A busy address cannot starve another:
  each has its own link credit.
* per link, Python sets ``cost`` (path cost to the nearest consumer behind it),
  ``transit_ok`` (the gradient rule: the neighbour is strictly closer to a consumer than this
  router) and ``valid_origins`` (multicast); address.pxi reads them per delivery.

Nothing here runs per message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qrouter import __version__
from qrouter._fast.codec import Described, Symbol, UByte, UInt, ULong, decode, encode
from qrouter._fast.engine import (
    DISTRIBUTION_CODES,
    Connection,
    EoControl,
    Link,
    eo_message,
    eo_pack,
    eo_unpack,
    source_value,
    target_value,
)
from qrouter._fast.eo_core import receive_envelopes
from qrouter.config import ConnectorConfig
from qrouter.mesh import RoutingEngine
from qrouter.reconnect import reconnect_forever

if TYPE_CHECKING:
    from qrouter.core import Core

log = logging.getLogger("qrouter.mesh")

CONTROL_ADDRESS = "_qr/control"
CONTROL_LINK = "qr.control"
LINK_PREFIX = "qr."
ROLE = "inter-router"
P_ROLE = Symbol("qrouter-role")
P_ID = Symbol("qrouter-id")
P_INSTANCE = Symbol("qrouter-instance")
P_COST = Symbol("qrouter-cost")
AMQP_VALUE = ULong(0x77)  # 3.2.8 amqp-value: the body section of a control message
CONTROL_CREDIT = 1000
EO_OP = "EO"  # a control message that carries a guaranteed topic's message (qrouter/guarantee.py)
TICK = 0.1  # seconds: at most one routing engine tick per TICK (docs/mesh.md: 0.1-0.25 s)
TICK_MAX = 1.0  # seconds: the longest the ticker sleeps while the engine has nothing due


def is_inter_router_open(fields: dict[str, Any]) -> bool:
    props = fields.get("properties")
    return isinstance(props, dict) and props.get(P_ROLE) == ROLE


@dataclass(eq=False)
class Peer:
    """One open inter-router connection."""

    conn: Connection
    router_id: str
    cost: int
    session: Any = None
    ctl_out: Link | None = None
    ctl_in: Link | None = None
    ctl_out_ready: bool = False
    up: bool = False
    xlinks: dict[str, Link] = field(default_factory=dict)  # address -> our sender link
    next_tag: int = 0
    early: list[Any] = field(default_factory=list)  # control messages before we were up
    # ctl_in's guaranteed-topic batches, received in the engine once up (eo_control.pxi)
    ctl_entry: EoControl | None = None

    @property
    def link_id(self) -> int:
        return int(self.conn.conn_id)


class Mesh:
    """The data plane of the routing engine (router.mesh.DataPlane) for one router."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.router_id = core.config.id
        self.engine = RoutingEngine(
            self.router_id,
            self,
            hello_interval=core.config.hello_interval,
            hello_max_age=core.config.hello_max_age,
        )
        self.peers: dict[int, Peer] = {}  # link id (conn_id) -> peer
        self.dropped = 0  # control messages that did not decode
        self.next_hop: dict[str, int] = {}
        self.cost: dict[str, int] = {}
        self.valid_origins: dict[str, frozenset[str]] = {}
        self.remote: dict[str, set[str]] = {}  # address -> routers with consumers for it
        self.held_by: dict[str, set[str]] = {}  # router -> its addresses
        self.local: set[str] = set()  # addresses with local consumers
        self.xlink_count: dict[str, int] = {}  # address -> our per-address links bound to it
        self._dirty: set[str] = set()
        self._touched: list[Link] = []
        self._check_scheduled = False
        # the ticker's sleep (_ticker): a future that its timer or `poke` completes
        self._sleep: asyncio.Future[None] | None = None
        self._wake_timer: asyncio.TimerHandle | None = None
        self._wake_at = 0.0
        self._last_tick = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._connector_tasks: dict[int, asyncio.Task[None]] = {}  # id(cc) -> its task
        self._connect: Callable[[ConnectorConfig], Any] | None = None
        self._stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        # control messages dropped because the router id they claim is not the peer's, or
        # their origin is not behind the connection they came on (docs/mesh.md, "Security")
        # "identity": refused by mesh_identities (qrouter/sasl.py mesh_refusal, from core.py)
        self.refused: dict[str, int] = {
            "second-connection": 0,
            "hello-id": 0,
            "eo-origin": 0,
            "identity": 0,
        }
        # router id -> the identity that first claimed it (mesh_identities not a table)
        self.bound_ids: dict[str, tuple[str, frozenset[str]]] = {}
        from qrouter.sasl import binding_warning

        warning = binding_warning(core.config)
        if warning is not None:
            log.warning("%s", warning)

    # -- lifecycle -----------------------------------------------------------------------------

    def open_properties(self, cost: int = 1) -> dict[Any, Any]:
        return {
            Symbol("product"): "qrouter",
            Symbol("version"): __version__,
            P_ROLE: ROLE,
            P_ID: self.router_id,
            P_INSTANCE: ULong(self.engine.instance),
            P_COST: UInt(cost),
        }

    def start(self, connect: Callable[[ConnectorConfig], Any]) -> None:
        """Start the tick task and one task per connector; `connect(cc)` opens a connection
        and returns an awaitable that ends when it closes."""
        self.loop = asyncio.get_running_loop()
        self._tasks.append(self.loop.create_task(self._ticker()))
        self._connect = connect
        for cc in self.core.config.connectors:
            if cc.role == "inter-router":  # route-container ones are qrouter/brokers.py's
                self.add_connector(cc)

    def add_connector(self, cc: ConnectorConfig) -> None:
        """Start a connector (at start, and for the management node's CREATE): it connects
        now and reconnects with backoff while the router runs."""
        assert self.loop is not None and self._connect is not None
        task = self.loop.create_task(self._connector(cc, self._connect))
        self._tasks.append(task)
        self._connector_tasks[id(cc)] = task

    def remove_connector(self, cc: ConnectorConfig) -> int:
        """Stop a connector (management DELETE): no more reconnects, and its connection is
        closed (amqp:connection:forced), which withdraws the routes through it (on_closed).
        Returns the connections closed."""
        task = self._connector_tasks.pop(id(cc), None)
        if task is not None:
            task.cancel()
            if task in self._tasks:
                self._tasks.remove(task)
        closed = 0
        for conn in list(self.core.connections):
            if getattr(conn.handler, "connector", None) is cc and not conn.closed:
                conn.close("amqp:connection:forced", "connector deleted by management")
                closed += 1
        return closed

    def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()

    async def _ticker(self) -> None:
        """Tick the routing engine when it has something due (RoutingEngine.next_due: a HELLO
        to send, a neighbour or a link state to age out, the RA) or an event passed to it made
        something due (poke), at most once per TICK, so a burst of control messages is one
        tick's work and anything is handled within TICK, as with a fixed period. An idle mesh
        router ticks once a second (its HELLO) instead of ten times: every wake-up costs a
        router on a loaded machine 100-200 µs, which at moderate message rates is a share of
        each message's CPU (docs/performance.md, issue 18)."""
        loop = self.loop
        assert loop is not None
        while True:
            self._last_tick = now = loop.time()
            due = now + TICK
            try:
                self.engine.tick(now)
                for link_id, reason in self.engine.refused_links().items():
                    peer = self.peers.get(link_id)
                    if peer is not None and not peer.conn.closed:
                        log.error("[C%d] refusing router %r: %s", link_id, peer.router_id, reason)
                        peer.conn.close("amqp:unauthorized-access", f"refused: {reason}")
                self._apply()
                due = min(self.engine.next_due(), now + TICK_MAX)  # TICK_MAX: a safety net
            except Exception:
                # a bug here must not end the ticker: the router would stop sending HELLOs
                # and its neighbours drop it, with nothing said until it exits
                log.exception("mesh: tick failed; ticking again in %.1f s", TICK)
            self._wake_at = max(due, now + TICK)
            self._sleep = loop.create_future()
            self._wake_timer = loop.call_at(self._wake_at, self._wake)
            try:
                await self._sleep
            finally:
                self._wake_timer.cancel()
                self._sleep = None

    def _wake(self) -> None:
        if self._sleep is not None and not self._sleep.done():
            self._sleep.set_result(None)

    def poke(self) -> None:
        """An event reached the routing engine (a control message, a link up or down, a
        local address): if that made something due (a route or an address to apply, a
        refusal to act on, a first HELLO), tick TICK after the last tick, or at once if that
        is past, unless the ticker already wakes sooner. A routine HELLO makes nothing due."""
        if self._sleep is None or self._sleep.done() or self.loop is None:
            return  # the ticker is about to tick (and then looks at next_due itself)
        try:
            due = float("-inf") if self._dirty else self.engine.next_due()
        except Exception:  # the tick says what (logged there); the caller carries on
            due = float("-inf")
        at = max(self._last_tick + TICK, due)
        if at < self._wake_at:
            self._wake_at = at
            if self._wake_timer is not None:
                self._wake_timer.cancel()
            self._wake_timer = self.loop.call_at(at, self._wake)

    async def _connector(
        self, cc: ConnectorConfig, connect: Callable[[ConnectorConfig], Any]
    ) -> None:
        # a peer router that is not up yet (ConnectionError) is no news; TLS refusals
        # (ssl.SSLError), a missing password file or an empty password (ValueError) are
        await reconnect_forever(
            lambda: connect(cc),
            f"connector {cc.host}:{cc.port}",
            log,
            quiet=(ConnectionError,),
            running=lambda: not self._stopping,
        )

    # -- connections (called by qrouter/core.py) ------------------------------------------------

    def first_use_refusal(
        self, conn: Connection, connector: ConnectorConfig | None, claimed: object
    ) -> str | None:
        """qrouter/sasl.py first_use_refusal over this run's bindings (from core.py)."""
        from qrouter.sasl import first_use_refusal

        return first_use_refusal(self.core.config, self.bound_ids, conn, connector, claimed)

    def on_open(self, conn: Connection, fields: dict[str, Any], cost: int | None) -> None:
        """An inter-router OPEN (either end). `cost`: ours for a connector; None on a
        listener, where the connector's advertised cost is used (so both ends agree)."""
        props = fields.get("properties") or {}
        peer_id = props.get(P_ID)
        if not isinstance(peer_id, str) or not peer_id:
            conn.close("amqp:invalid-field", "inter-router OPEN without qrouter-id")
            return
        if peer_id == self.router_id:
            self.refused["identity"] += 1
            log.error(
                "[C%d] duplicate router id %r: a peer uses our id; refused",
                conn.conn_id,
                peer_id,
            )
            conn.close("amqp:unauthorized-access", f"duplicate router id {peer_id!r}")
            return
        for other in self.peers.values():
            if other.router_id == peer_id and not other.conn.closed:
                # the id is bound to the connection that claimed it first
                self.refused["second-connection"] += 1
                log.error(
                    "[C%d] refusing router %r: router id %r is already connected on C%d "
                    "(a second claimant)",
                    conn.conn_id,
                    peer_id,
                    peer_id,
                    other.link_id,
                )
                conn.close(
                    "amqp:unauthorized-access", f"router id {peer_id!r} is already connected"
                )
                return
        if cost is None:
            advertised = props.get(P_COST)
            cost = int(advertised) if isinstance(advertised, int) and advertised >= 1 else 1
        peer = Peer(conn, str(peer_id), cost)
        conn.info = peer
        self.peers[peer.link_id] = peer
        log.info("[C%d] inter-router connection to %r (cost %d)", conn.conn_id, peer_id, cost)
        assert self.loop is not None
        # our OPEN must leave before our BEGIN (a listener answers the OPEN after this call)
        self.loop.call_soon(self._begin, peer)

    def _begin(self, peer: Peer) -> None:
        if peer.conn.closed or self.peers.get(peer.link_id) is not peer:
            return
        peer.session = peer.conn.begin()
        link = peer.session.attach(
            CONTROL_LINK,
            True,
            {
                "snd_settle_mode": 1,  # settled: control messages are at most once
                "source": source_value({"address": CONTROL_ADDRESS}),
                "target": target_value({"address": CONTROL_ADDRESS}),
            },
        )
        link.bind_endpoint()
        peer.ctl_out = link
        self._dirty.update(self.remote)  # per-address links wait for the session
        self._apply()

    def on_attach(self, conn: Connection, link: Link, fields: dict[str, Any]) -> None:
        peer: Peer | None = conn.info if isinstance(conn.info, Peer) else None
        if peer is None:
            link.detach("amqp:unauthorized-access", "no inter-router OPEN on this connection")
            return
        if link.local_init:
            if link is peer.ctl_out:
                peer.ctl_out_ready = True
                self._maybe_up(peer)
            return  # our per-address link: the neighbour's answer
        target = fields.get("target")
        address = target.get("address") if isinstance(target, dict) else None
        if link.is_sender or not isinstance(address, str) or not address:
            link.detach("amqp:not-implemented", "inter-router links are senders with a target")
            return
        if address == CONTROL_ADDRESS:
            link.attach(
                {
                    "snd_settle_mode": UByte(1),
                    "rcv_settle_mode": UByte(0),
                    "source": fields.get("source") and source_value(fields["source"]),
                    "target": target_value({"address": CONTROL_ADDRESS}),
                }
            )
            link.bind_endpoint()
            link.flow(CONTROL_CREDIT)
            self._unbind_control(peer)  # a second control link: only the newest is read
            peer.ctl_in = link
            if peer.up:
                self._bind_control(peer)
            self._maybe_up(peer)
            return
        # The neighbour's per-address link: a producer of the address here (no registry,
        # no user checks: the connection was admitted as inter-router).
        distribution = self.core.distribution_of(address)
        if distribution == "unavailable":
            link.detach("amqp:not-found", f"address '{address}' is unavailable")
            return
        source = fields.get("source")
        link.attach(
            {
                "snd_settle_mode": UByte(_mode(fields.get("snd_settle_mode"), 2)),
                "rcv_settle_mode": UByte(_mode(fields.get("rcv_settle_mode"), 0)),
                "source": source_value(source) if isinstance(source, dict) else None,
                "target": target_value({"address": address}),
            }
        )
        link.inter_router = True
        link.bind(address, DISTRIBUTION_CODES[distribution])
        log.debug("[C%d][L%d] per-address link in for %r", conn.conn_id, link.handle, address)

    def on_detach(self, conn: Connection, link: Link) -> None:
        peer: Peer | None = conn.info if isinstance(conn.info, Peer) else None
        if peer is None:
            return
        if link is peer.ctl_out or link is peer.ctl_in:
            self._unbind_control(peer)
            if not conn.closed:
                log.warning("[C%d] control link detached: closing the connection", conn.conn_id)
                conn.close("amqp:internal-error", "inter-router control link detached")
            return
        for address, xlink in list(peer.xlinks.items()):
            if xlink is link:
                del peer.xlinks[address]
                self._count(address, -1)
                self._dirty.add(address)
                self.poke()  # applied (the link reopened or let go) within TICK, as before

    def on_message(self, conn: Connection, link: Link, payload: bytes) -> None:
        peer: Peer | None = conn.info if isinstance(conn.info, Peer) else None
        if peer is None or peer.ctl_in is None or link is not peer.ctl_in:
            return
        if peer.ctl_in.credit < CONTROL_CREDIT // 2:
            peer.ctl_in.flow(CONTROL_CREDIT)
        try:
            value, _ = decode(payload)
            message = value.value if isinstance(value, Described) else value
        except Exception as exc:  # noqa: BLE001 - a bad message is dropped, not fatal
            self.dropped += 1
            log.warning("[C%d] undecodable control message dropped: %s", conn.conn_id, exc)
            return
        if not peer.up:
            # the neighbour saw both control links first: keep what it says (its first HELLO)
            # until our own sender's attach is answered
            peer.early.append(message)
            return
        self._dispatch(peer, message)
        self._apply()

    def _dispatch(self, peer: Peer, message: Any) -> None:
        if isinstance(message, dict) and message.get("op") == EO_OP:
            # a guaranteed topic's envelopes (qrouter/guarantee.py), to us or to pass on
            self.core.guarantees.receive_batch(self._from_behind(peer, eo_envelopes(message)))
            return
        if isinstance(message, dict) and message.get("op") == "HELLO":
            if message.get("id") != peer.router_id:
                # the HELLO must name the router the OPEN named (and the mesh admitted)
                self.refused["hello-id"] += 1
                if self.refused["hello-id"] <= 10 or self.refused["hello-id"] % 1000 == 0:
                    log.error(
                        "[C%d] HELLO claims id %r on the connection of %r: dropped (%d so far)",
                        peer.link_id,
                        message.get("id"),
                        peer.router_id,
                        self.refused["hello-id"],
                    )
                return
        assert self.loop is not None
        self.engine.receive(peer.link_id, message, self.loop.time())
        self.poke()

    def _from_behind(self, peer: Peer, envelopes: Any) -> Any:
        """The envelopes whose origin ("from") is behind `peer` (router.mesh.RoutingEngine
        .behind); the others are dropped and counted."""
        if not isinstance(envelopes, list):
            return envelopes  # receive_batch logs it
        kept = []
        verdict: dict[Any, bool] = {}
        for envelope in envelopes:
            src = envelope.get("from") if isinstance(envelope, dict) else None
            ok = verdict.get(src)
            if ok is None:
                ok = verdict[src] = isinstance(src, str) and self.engine.behind(peer.link_id, src)
            if ok:
                kept.append(envelope)
                continue
            self.refused["eo-origin"] += 1
            if self.refused["eo-origin"] <= 10 or self.refused["eo-origin"] % 1000 == 0:
                log.warning(
                    "[C%d] guaranteed-topic envelope from %r is not from behind %r: dropped "
                    "(%d so far)",
                    peer.link_id,
                    src,
                    peer.router_id,
                    self.refused["eo-origin"],
                )
        return kept

    def send_eo(self, link_id: int, envelopes: list[dict[str, Any]]) -> None:
        """Guaranteed topics' envelopes to the neighbour at the other end of `link_id`, in
        the compact encoding of qrouter/_fast/eo_wire.pxi (field "b")."""
        try:
            payload = eo_message(envelopes)  # {"op": EO_OP, "b": eo_pack(envelopes)}, encoded
        except ValueError:
            # a relayed envelope from an older router ("m", AMQP) may hold what the compact
            # encoding has no type for (a float, a ulong past 2^63...): drop only those
            kept = [e for e in envelopes if _packable(e)]
            self.core.guarantees.dropped += len(envelopes) - len(kept)
            log.warning("[C%d] unencodable guaranteed-topic envelope(s) dropped", link_id)
            payload = eo_message(kept)
        self._send_payload(link_id, payload)

    def on_closed(self, conn: Connection) -> None:
        peer: Peer | None = conn.info if isinstance(conn.info, Peer) else None
        if peer is None or self.peers.get(peer.link_id) is not peer:
            return
        del self.peers[peer.link_id]
        self._unbind_control(peer)
        for address in peer.xlinks:
            self._count(address, -1)
            self._dirty.add(address)
        peer.xlinks.clear()
        log.info("[C%d] inter-router connection to %r closed", conn.conn_id, peer.router_id)
        if peer.up:
            self.engine.link_down(peer.link_id)
            self.poke()
        self._apply()

    def _maybe_up(self, peer: Peer) -> None:
        if peer.up or not peer.ctl_out_ready or peer.ctl_in is None:
            return
        peer.up = True
        self.engine.link_up(peer.link_id, peer.cost)
        self.poke()  # its first HELLO goes at the next tick
        assert self.loop is not None
        for message in peer.early:
            self._dispatch(peer, message)
        peer.early.clear()
        self._bind_control(peer)
        self._apply()

    def _bind_control(self, peer: Peer) -> None:
        """From now on the engine receives the guaranteed-topic batches on `peer`'s control
        link itself (qrouter/_fast/eo_control.pxi: the common case of `on_message` with
        `_dispatch`, `_from_behind` and `receive_batch`, with no Python frame); every other
        control message still comes to `on_message`."""
        assert peer.ctl_in is not None and peer.up
        peer.ctl_entry = EoControl(
            self.core.guarantees,
            peer.ctl_in,
            peer.link_id,
            self,
            receive_envelopes,
            self.engine.behind_sets,
        )
        peer.ctl_entry.bind()

    def _unbind_control(self, peer: Peer) -> None:
        if peer.ctl_entry is not None:
            peer.ctl_entry.unbind()
            peer.ctl_entry = None

    # -- local consumers (qrouter/core.py calls touch on every attach / detach) -----------------

    def touch(self, link: Link) -> None:
        """A local consumer link attaches or detaches: re-check, once this loop iteration is
        done (the link is bound by then), whether its address has local consumers."""
        self._touched.append(link)
        if not self._check_scheduled and self.loop is not None:
            self._check_scheduled = True
            self.loop.call_soon(self._check_local)

    def _check_local(self) -> None:
        self._check_scheduled = False
        touched, self._touched = self._touched, []
        for address in sorted({link.address_name for link in touched} - {None}):
            a = self.core.engine.address(address)
            consumers = a.consumer_count if a is not None else 0
            has_local = consumers - self.xlink_count.get(address, 0) > 0
            if has_local and address not in self.local:
                self.local.add(address)
                self.engine.local_address_added(address)
                self.poke()
                self._dirty.add(address)
            elif not has_local and address in self.local:
                self.local.discard(address)
                self.engine.local_address_removed(address)
                self.poke()
                self._dirty.add(address)
        self._apply()

    # -- DataPlane (called by the routing engine) ----------------------------------------------

    def send(self, link_id: int, message: dict[str, Any]) -> None:
        self._send_payload(link_id, encode(Described(AMQP_VALUE, message)))

    def _send_payload(self, link_id: int, payload: bytes) -> None:
        """A control message (an encoded amqp-value section) to the neighbour on `link_id`."""
        peer = self.peers.get(link_id)
        if peer is None or peer.ctl_out is None:
            return
        peer.next_tag = (peer.next_tag + 1) & 0xFFFFFFFF
        peer.ctl_out.send(peer.next_tag.to_bytes(4, "big"), payload, settled=True)

    def set_next_hop(self, router_id: str, link_id: int | None) -> None:
        if link_id is None:
            self.next_hop.pop(router_id, None)
        else:
            self.next_hop[router_id] = link_id
        self.core.guarantees.route(router_id, link_id)  # its channel follows the route
        self._dirty.update(self.held_by.get(router_id, ()))

    def set_cost(self, router_id: str, cost: int | None) -> None:
        if cost is None:
            self.cost.pop(router_id, None)
        else:
            self.cost[router_id] = cost
        self._dirty.update(self.held_by.get(router_id, ()))

    def set_valid_origins(self, router_id: str, origins: list[str]) -> None:
        self.valid_origins[router_id] = frozenset(origins)
        self._dirty.update(self.held_by.get(router_id, ()))

    def add_remote_address(self, address: str, router_id: str) -> None:
        self.remote.setdefault(address, set()).add(router_id)
        self.held_by.setdefault(router_id, set()).add(address)
        self._dirty.add(address)

    def del_remote_address(self, address: str, router_id: str) -> None:
        self.remote.get(address, set()).discard(router_id)
        self.held_by.get(router_id, set()).discard(address)
        if not self.remote.get(address):
            self.remote.pop(address, None)
        if not self.held_by.get(router_id):
            self.held_by.pop(router_id, None)
        self._dirty.add(address)

    def router_lost(self, router_id: str) -> None:
        # Nothing to do here: deliveries toward it travel on per-address links, which are
        # detached (their unsettled deliveries go back MODIFIED, unsent ones RELEASED or to
        # another consumer) when the connection closes or the address stops being reachable
        # through them (Link.lost in link.pxi).
        log.info("[mesh %s] router %r lost", self.router_id, router_id)

    def log(self, level: str, msg: str) -> None:
        log.log(logging.getLevelName(level.upper()), "%s", msg)

    # -- per-address links ---------------------------------------------------------------------

    def _apply(self) -> None:
        """Bring the per-address links of every changed address in line with the tables."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        for address in sorted(dirty):
            self._apply_address(address)

    def _apply_address(self, address: str) -> None:
        if address.startswith("_linkroute/"):
            return  # a link route's advertisement (qrouter/linkroutes.py): no message links
        # per neighbour (connection): the nearest router with consumers behind it, and the
        # origins whose multicast copies it may carry
        via: dict[int, tuple[int, set[str]]] = {}
        for router_id in self.remote.get(address, ()):
            link_id = self.next_hop.get(router_id)
            cost = self.cost.get(router_id)
            peer = self.peers.get(link_id) if link_id is not None else None
            if peer is None or cost is None or peer.session is None:
                continue
            best, origins = via.get(peer.link_id, (cost, set()))
            origins |= self.valid_origins.get(router_id, frozenset())
            via[peer.link_id] = (min(best, cost), origins)
        distribution = self.core.distribution_of(address)
        if distribution == "unavailable":
            via = {}
        # this router's distance to a consumer: 0 with a local one, else the cheapest path
        mine: int | None = 0 if address in self.local else None
        if mine is None and via:
            mine = min(cost for cost, _ in via.values())
        for link_id, (cost, origins) in via.items():
            peer = self.peers[link_id]
            link = peer.xlinks.get(address)
            if link is None:
                link = self._open_xlink(peer, address, distribution)
            link.cost = cost
            # the gradient rule: the neighbour's own distance (our path cost less the hop to
            # it) must be strictly below ours for transit deliveries to go there
            link.transit_ok = mine is not None and cost - peer.cost < mine
            link.valid_origins = frozenset(origins)
        for peer in list(self.peers.values()):
            if address in peer.xlinks and peer.link_id not in via:
                link = peer.xlinks.pop(address)
                self._count(address, -1)
                log.debug("[C%d] per-address link for %r closed", peer.link_id, address)
                link.detach()
        engine_address = self.core.engine.address(address)
        if engine_address is not None:
            engine_address.recheck_transit()

    def _open_xlink(self, peer: Peer, address: str, distribution: str) -> Link:
        link: Link = peer.session.attach(
            LINK_PREFIX + address,
            True,
            {
                "snd_settle_mode": 2,  # mixed: presettled messages stay presettled
                "rcv_settle_mode": 0,
                "source": source_value({"address": address}),
                "target": target_value({"address": address}),
            },
        )
        link.info = peer
        link.inter_router = True
        link.bind(address, DISTRIBUTION_CODES[distribution])
        peer.xlinks[address] = link
        self._count(address, 1)
        log.debug("[C%d] per-address link for %r opened", peer.link_id, address)
        return link

    def _count(self, address: str, delta: int) -> None:
        n = self.xlink_count.get(address, 0) + delta
        if n > 0:
            self.xlink_count[address] = n
        else:
            self.xlink_count.pop(address, None)


def eo_envelopes(message: dict[Any, Any]) -> Any:
    """The envelopes of an EO control message: field "b" in the compact encoding
    (eo_wire.pxi), or "m" as an AMQP list (what routers before it sent); None if "b" does
    not decode (receive_batch counts and logs it)."""
    raw = message.get("b")
    if raw is None:
        return message.get("m")
    if not isinstance(raw, bytes):
        return None
    try:
        return eo_unpack(raw)
    except ValueError:  # DecodeError
        return None


def _packable(envelope: Any) -> bool:
    try:
        eo_pack(envelope)
    except ValueError:
        return False
    return True


def _mode(value: Any, default: int) -> int:
    if value is None or not 0 <= int(value) <= 2:
        return default
    return int(value)
