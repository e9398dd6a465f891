"""Sockets: listeners (plain or TLS), one asyncio Protocol per connection feeding the engine,
heartbeats, and clean shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from typing import TYPE_CHECKING, Any

from qrouter import gc_tuning, heap_trim
from qrouter._fast.engine import Connection, ReadGate
from qrouter.busy_poll import BusyPoll
from qrouter.config import ConfigError, ConnectorConfig, ListenerConfig, RouterConfig
from qrouter.core import Core
from qrouter.host_control_rate import ControlBucket
from qrouter.management import RunningListener, listener_names
from qrouter.tls import server_context

if TYPE_CHECKING:
    from qrouter.metrics import MetricsEndpoint

log = logging.getLogger("qrouter.server")

# A read this small means light traffic: its output (a burst of messages, a disposition) is
# written at once instead of at the loop iteration's flush, so that it does not wait behind
# the other connections read in the same iteration. Under load reads are larger and output
# stays one write per connection per iteration (docs/performance.md, latency).
FLUSH_NOW_BYTES = 2048
# A closed connection's socket reads on, and drops what it reads, until the peer closes its
# side, this many seconds have passed or it has dropped this many bytes (linger_close).
LINGER_S = 2.0
LINGER_BYTES = 1 << 20

# Control frames (ATTACH, DETACH, BEGIN, ...: Python each, tens of µs) one connection may have
# handled per loop turn; the rest wait their turn, so a peer's burst of thousands of attaches
# delays the others by about a millisecond, not by the whole burst.
CONTROL_BUDGET = 32


def linger_close(transport: asyncio.BaseTransport) -> None:
    """Close a connection's socket once our CLOSE is in it. 2.4.3: having sent CLOSE, an
    endpoint reads on until the partner's. Closing a socket with bytes unread in it sends a
    reset, not a FIN, and a peer still writing (the rest of an oversized message, say) then
    sees its next write fail, and may drop our CLOSE and its error unread. So the socket is
    half-closed at once (the peer reads the CLOSE, then the end), what still arrives is read
    and dropped (the engine's connection is closed: its feed takes nothing), and the socket
    is closed when the peer closes its side (eof_received), after LINGER_S, or once
    LINGER_BYTES are dropped (the read gate counts them), so a peer that keeps on sending
    costs at most that. A transport that cannot half-close (TLS) is closed at once, as
    before."""
    if transport.is_closing():
        return
    protocol = transport.get_protocol()  # type: ignore[attr-defined]
    gate = getattr(protocol, "gate", None)
    if gate is None:  # nothing would count the bytes it drops: closed at once, as before
        transport.close()
        return
    try:
        transport.write_eof()  # type: ignore[attr-defined]
    except (AttributeError, NotImplementedError, OSError, RuntimeError):
        transport.close()
        return
    gate.lingering = transport
    gate.linger_left = LINGER_BYTES
    transport.resume_reading()  # type: ignore[attr-defined]
    asyncio.get_running_loop().call_later(LINGER_S, transport.close)


class AmqpProtocol(asyncio.Protocol):
    """Bytes in: `Connection.feed`. Bytes out: the engine writes to the transport once per
    loop iteration (`Router.flush`, scheduled with `loop.call_soon`), or at once after a
    small read (FLUSH_NOW_BYTES).

    `data_received` is the bound method of a compiled `ReadGate` (read_path.pxi), set per
    instance before the transport reads it: a read of transfers, flows and dispositions runs
    no Python frame; `_after_read` runs when the read needs the control plane."""

    __slots__ = (
        "core", "listener", "conn", "timer", "tick_remote", "rate", "tokens", "filled", "host_rate",
        "fd", "gate", "data_received",
    )  # fmt: skip

    busy: BusyPoll | None = None  # busy_poll_us > 0: set by Server.start (busy_poll.py)

    def __init__(self, core: Core, listener: ListenerConfig) -> None:
        self.core = core
        self.listener = listener
        self.conn: Connection | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tick_remote = 0
        # a token bucket of control frames (limits.max_control_rate): client connections only
        self.rate = 0 if listener.role == "inter-router" else core.config.limits.max_control_rate
        self.tokens = float(self.rate)
        self.filled = 0.0
        self.host_rate: ControlBucket | None = None  # limits.max_control_rate_per_host
        self.fd = -1  # the socket's, polled by `busy` (busy_poll.py)
        self.gate = ReadGate(self._after_read, FLUSH_NOW_BYTES)
        self.gate.slow = self.busy is not None
        self.data_received = self.gate.data_received  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if peer and not self.core.limits.accept(str(peer[0])):
            # limits.max_connection_rate_per_host: closed without a byte read (conn_rate.py)
            self.core.limits.rate.refuse(transport)
            return
        if peer and self.listener.role != "inter-router":
            self.host_rate = self.core.limits.control.bucket(str(peer[0]))
        self.conn = self.core.new_connection(self.listener)
        self.conn.transport = transport
        self.conn.control_budget = CONTROL_BUDGET
        self.gate.conn = self.conn
        limit_writes(transport, self.core.config)
        if self.busy is not None:
            self.fd = self.busy.add(transport)
        log.debug("[C%d] accepted from %s", self.conn.conn_id, peer)
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        # 2.4.5: an empty frame at least every half of the peer's idle-time-out; checking at a
        # quarter of it keeps the gap under three quarters. Our own idle check needs 1 s.
        assert self.conn is not None
        if self.timer is not None:
            self.timer.cancel()
        self.tick_remote = self.gate.tick_remote = self.conn.remote_idle_timeout_ms
        remote = self.tick_remote / 1000.0
        interval = min(1.0, remote / 4) if remote else 1.0
        self.timer = asyncio.get_running_loop().call_later(max(interval, 0.01), self._tick)

    def _tick(self) -> None:
        if self.conn is None or self.conn.closed:
            return
        self.conn.tick()
        self._schedule_tick()

    def _after_read(self) -> None:
        assert self.conn is not None
        if self.busy is not None:
            self.busy.activity()
        over = self._spend()  # charged whether or not it yielded
        if self.conn.yielded or over:
            self._yield()
        if self.conn.remote_idle_timeout_ms != self.tick_remote:
            self._schedule_tick()  # the peer's OPEN told its idle-time-out

    def _spend(self) -> bool:
        """Take the control frames of the last feed from the bucket; True when it is empty."""
        assert self.conn is not None
        used = self.conn.control_used
        # the host's bucket (host_control_rate.py): only a connection that sent control
        # frames waits for it, one that sends messages only is not slowed by its neighbours
        host = used > 0 and self.host_rate is not None and self.host_rate.spend(used)
        if host:
            self.core.limits.refused["control_rate_per_host"] += 1
        if not self.rate or (not used and self.tokens >= 0):
            return host
        now = asyncio.get_running_loop().time()
        if self.filled:
            self.tokens = min(float(self.rate), self.tokens + (now - self.filled) * self.rate)
        self.filled = now
        self.tokens -= used
        if self.tokens < 0 and used:
            self.core.limits.refused["control_rate"] += 1
        # in debt: every read comes back here until the bucket has refilled
        self.gate.slow = self.tokens < 0 or self.busy is not None
        return self.tokens < 0 or host

    def _yield(self) -> None:
        """The engine stopped after CONTROL_BUDGET control frames, or the peer spent its
        control-frame rate (a burst of attaches costs Python each): stop reading this peer, so
        what it sends waits in its socket, and go on with the frames already read on a later
        loop turn, after the other connections, or once the bucket has refilled."""
        assert self.conn is not None and self.conn.transport is not None
        self.conn.transport.pause_reading()
        loop = asyncio.get_running_loop()
        wait = -self.tokens / self.rate if self.rate and self.tokens < 0 else 0.0
        if self.host_rate is not None:
            wait = max(wait, self.host_rate.wait())
        if wait > 0:
            loop.call_later(wait, self._go_on)
        else:
            loop.call_soon(self._go_on)

    def _go_on(self) -> None:
        conn = self.conn
        if conn is None or conn.closed or conn.transport is None:
            return
        conn.feed(b"")
        over = self._spend()
        if conn.yielded or over:
            self._yield()
        elif not conn.closed:
            conn.transport.resume_reading()

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        # the transport's write buffer passed its high-water mark: the engine sends no new
        # deliveries on this connection and tops up no producer for it (backpressure.pxi)
        if self.conn is not None:
            self.conn.pause_writing()
            log.debug("[C%d] output paused (write buffer full)", self.conn.conn_id)

    def resume_writing(self) -> None:
        if self.conn is not None:
            log.debug("[C%d] output resumed", self.conn.conn_id)
            self.conn.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.gate.after = None  # the protocol and its gate refer to each other: no more
        self.gate.lingering = None
        if self.busy is not None:
            self.busy.remove(self.fd)
            self.fd = -1
        if self.conn is not None:
            self.conn.transport = None
            self.conn.connection_lost()
            self.core.connections.discard(self.conn)


class ConnectorProtocol(AmqpProtocol):
    """A connection the router opens (client mode, the connector's SASL mechanism): to
    another router, or to a broker (role route-container); `closed` completes when it goes,
    for the connector to reconnect (qrouter/inter_router.py, qrouter/brokers.py)."""

    __slots__ = ("connector", "closed", "sasl")

    def __init__(
        self, core: Core, connector: ConnectorConfig, sasl: tuple[Any, ...] = ("ANONYMOUS",)
    ) -> None:
        super().__init__(core, ListenerConfig(connector.host, connector.port, connector.role))
        self.connector = connector
        self.sasl = sasl  # Connection.start's arguments (router.sasl.client_start)
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn = self.core.new_connection(self.listener, self.connector)
        self.conn.transport = transport
        self.conn.control_budget = CONTROL_BUDGET
        self.gate.conn = self.conn
        limit_writes(transport, self.core.config)
        if self.busy is not None:
            self.fd = self.busy.add(transport)
        self.conn.start(*self.sasl)
        log.debug("[C%d] connected to %s", self.conn.conn_id, transport.get_extra_info("peername"))
        self._schedule_tick()

    def connection_lost(self, exc: Exception | None) -> None:
        error: Any = exc  # e.g. the listener refused our certificate after the handshake
        if self.conn is not None:
            error = self.conn.error or self.conn.remote_error or exc
            if error is None and self.conn.remote_open is None:
                # e.g. TLS 1.3: the listener checks our certificate after our handshake ended
                error = "closed by the listener before its OPEN (our certificate refused?)"
        super().connection_lost(exc)
        if error:
            _connector_error(self.connector, error)
        if not self.closed.done():
            self.closed.set_result(None)


def limit_writes(transport: asyncio.BaseTransport, config: RouterConfig) -> None:
    """Backpressure (docs/configuration.md, write_buffer_high / write_buffer_low): asyncio
    calls the protocol's pause_writing() when the transport's buffer rises above `high`, and
    resume_writing() when it falls to `low`. (uvloop's transports do not derive from
    asyncio.WriteTransport: ask for the method, not the class.)"""
    limits = getattr(transport, "set_write_buffer_limits", None)
    if limits is not None:
        limits(high=config.write_buffer_high, low=config.write_buffer_low)


_last_errors: dict[tuple[str, int], str] = {}


def _connector_error(cc: ConnectorConfig, error: Any) -> None:
    """Why a connector's connection ended: a warning, then debug while the reason repeats (the
    connector retries every two seconds)."""
    if isinstance(error, tuple):
        text = str(error[1])  # (condition, description): we closed
    elif isinstance(error, dict):
        text = f"closed by the listener: {error.get('condition')}: {error.get('description')}"
    else:
        text = str(error) or type(error).__name__
    where = (cc.host, cc.port)
    level = logging.DEBUG if _last_errors.get(where) == text else logging.WARNING
    _last_errors[where] = text
    log.log(level, "connector %s:%d: %s", cc.host, cc.port, text)


class Server:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.persistence = open_persistence(config)
        self.core = Core(config, self.persistence)
        self.servers: list[asyncio.AbstractServer] = []
        self.listening: list[RunningListener] = []
        self.metrics: MetricsEndpoint | None = None
        self.core.management.listeners = self  # management CREATE / DELETE listener
        if any(cc.role == "inter-router" for cc in config.connectors) or any(
            lc.role == "inter-router" for lc in config.listeners
        ):
            from qrouter.inter_router import Mesh

            self.core.mesh = Mesh(self.core)
            # attachment ids of guaranteed topics grow with the router's instance
            self.core.guarantees.instance = self.core.mesh.engine.instance
        self.stopping = asyncio.Event()
        self.journal: Any = None
        if config.journal:
            self.journal = open_journal(config, self.core)
            self.core.guarantees.journal = True
            self.core.guarantees.journal_dir = config.journal
        if self.persistence is not None:
            crashed_at = self.persistence.last_alive()
            n = self.core.registry.recover(crashed_at)
            held = self.core.rebuild_held()
            log.info(
                "store %s at %s: %d termini, %d unsettled deliveries recovered",
                config.store,
                config.store_path,
                n,
                held,
            )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.core.engine.schedule = loop.call_soon
        self.core.engine.close_transport = linger_close
        if self.config.busy_poll_us > 0:
            AmqpProtocol.busy = BusyPoll(self.config.busy_poll_us, loop)
            log.info(
                "busy poll: up to %d µs after an active loop iteration", self.config.busy_poll_us
            )
        self.core.guarantees.start()  # recovers the records of guaranteed topics
        loop.create_task(self._housekeeping())
        if self.core.mesh is not None:
            # before the listeners: a neighbour may connect as soon as they are open
            self.core.mesh.start(self._connect)
        self.core.brokers.start(self._connect)  # connectors with role route-container
        for lc, name in zip(
            self.config.listeners, listener_names(self.config.listeners), strict=True
        ):
            await self.open_listener(lc, name, "config")
        if self.config.metrics:
            from qrouter.metrics import MetricsEndpoint  # prometheus_client only when asked

            self.metrics = MetricsEndpoint(self.core)
            await self.metrics.start(self.config.metrics)

    async def open_listener(
        self, lc: ListenerConfig, name: str, origin: str = "management"
    ) -> RunningListener:
        """Listen on `lc` (at start, and for the management node's CREATE listener)."""
        loop = asyncio.get_running_loop()
        ctx: ssl.SSLContext | None = None
        if lc.tls_cert and lc.tls_key:
            ctx = server_context(lc.tls_cert, lc.tls_key, lc.tls_ca, lc.require_client_cert)
        server = await loop.create_server(
            lambda lc=lc: AmqpProtocol(self.core, lc),
            host=lc.host,
            port=lc.port,
            ssl=ctx,
            reuse_address=True,
            backlog=1024,
        )
        self.servers.append(server)
        running = RunningListener(name, lc, server, origin)
        self.listening.append(running)
        for sock in server.sockets:
            host, port = sock.getsockname()[:2]
            log.info("listening on %s:%d%s (%s)", host, port, " with TLS" if ctx else "", lc.role)
        return running

    def close_listener(self, running: RunningListener) -> None:
        """Stop accepting on a listener (management DELETE); its connections stay open."""
        if running.server is not None:
            running.server.close()
            if running.server in self.servers:
                self.servers.remove(running.server)
        if running in self.listening:
            self.listening.remove(running)

    async def _housekeeping(self) -> None:
        # once a second: expire suspended termini (3.5.6), warn about stuck links, and note
        # that the router is alive so that after a crash the expiry clock starts about when it
        # died
        while not self.stopping.is_set():
            self.core.registry.expire()  # discarded termini settle what they held (on_discard)
            self.core.monitor.check()
            if self.persistence is not None:
                self.core.engine.checkpoint(due=True)  # a quiet second's logged changes
                self.persistence.mark_alive()
            if self.journal is not None:
                self.core.engine.journal_flush()  # rows of a quiet second reach the writer
                self.journal.tick()  # segments rotate by age too
            await asyncio.sleep(1.0)

    async def _connect(self, cc: ConnectorConfig) -> asyncio.Future[None]:
        """Open one inter-router connection; the returned future completes when it closes."""
        loop = asyncio.get_running_loop()
        from qrouter.sasl import client_start

        sasl = client_start(cc)  # reads the password: a missing file is retried like a refusal
        ctx: ssl.SSLContext | None = None
        if cc.tls:
            from qrouter.tls import client_context

            ctx = client_context(
                cc.tls_ca, cc.tls_cert, cc.tls_key, check_hostname=cc.tls_verify_hostname
            )
        _transport, protocol = await loop.create_connection(
            lambda: ConnectorProtocol(self.core, cc, sasl),
            cc.host,
            cc.port,
            ssl=ctx,
            server_hostname=cc.host if ctx is not None else None,
        )
        return protocol.closed

    async def stop(self) -> None:
        if AmqpProtocol.busy is not None:
            busy = AmqpProtocol.busy
            log.info("busy poll: %d spins, %d ended by a readable socket", busy.spins, busy.caught)
        self.core.guarantees.stop()
        if self.core.mesh is not None:
            self.core.mesh.stop()
        self.core.brokers.stop()
        for server in self.servers:
            server.close()
        if self.metrics is not None:
            self.metrics.close()
        for conn in list(self.core.connections):
            conn.close()
        self.core.login_throttle.close()
        self.core.engine.flush()
        # let the transports write the CLOSE frames before the loop ends
        await asyncio.sleep(0.05)
        if self.journal is not None:
            self.core.engine.flush()
            self.core.engine.journal_flush()
            self.journal.close()
        if self.persistence is not None:
            self.core.engine.checkpoint()
            self.persistence.mark_alive()
            self.persistence.close()


def open_journal(config: RouterConfig, core: Core) -> Any:
    """The delivery journal: the engine stores each event in column buffers on the data path
    (and samples there) and hands them over in batches; the writer wraps them as Arrow
    columns and writes Parquet segments in its own thread (docs/journal.md)."""
    from qrouter.journal import JournalWriter

    assert config.journal is not None
    writer = JournalWriter(config.journal, config.id, sample=config.journal_sample)
    core.engine.journal_start(writer.append_buffers, writer.threshold, writer.spare)
    log.info("journal: %s (sample %.3g)", config.journal, config.journal_sample)
    return writer


def open_persistence(config: RouterConfig) -> Any:
    """The terminus store; None for the memory store (nothing survives a restart)."""
    if config.store == "memory":
        return None
    from qrouter.termini_store import StorePersistence

    return StorePersistence.open(
        config.store, config.store_path, config.store_sync, config.store_map_size
    )


async def serve(config: RouterConfig) -> int:
    from qrouter.stores.base import StoreError

    try:
        server = Server(config)
    except StoreError as exc:
        log.error("store: %s", exc)
        return 2
    try:
        await server.start()
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stopping.set)
    log.info("router %s ready", config.id)
    gc_tuning.tune()
    heap_trim.start()
    await server.stopping.wait()
    log.info("shutting down")
    await server.stop()
    return 0


def run(config: RouterConfig) -> int:
    """Run the router until SIGTERM or SIGINT; the process exit code."""
    runner: Any
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    return int(runner(serve(config)))
