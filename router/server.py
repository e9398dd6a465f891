"""Sockets: listeners (plain or TLS), one asyncio Protocol per connection feeding the engine,
heartbeats, and clean shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from typing import Any

from router._fast.engine import Connection
from router.config import ConfigError, ListenerConfig, RouterConfig
from router.core import Core
from router.tls import server_context

log = logging.getLogger("qrouter.server")


class AmqpProtocol(asyncio.Protocol):
    """Bytes in: `Connection.feed`. Bytes out: the engine writes to the transport once per
    loop iteration (`Router.flush`, scheduled with `loop.call_soon`)."""

    __slots__ = ("core", "listener", "conn", "timer", "tick_remote")

    def __init__(self, core: Core, listener: ListenerConfig) -> None:
        self.core = core
        self.listener = listener
        self.conn: Connection | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tick_remote = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn = self.core.new_connection(self.listener)
        self.conn.transport = transport
        peer = transport.get_extra_info("peername")
        log.debug("[C%d] accepted from %s", self.conn.conn_id, peer)
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        # 2.4.5: an empty frame at least every half of the peer's idle-time-out; checking at a
        # quarter of it keeps the gap under three quarters. Our own idle check needs 1 s.
        assert self.conn is not None
        if self.timer is not None:
            self.timer.cancel()
        self.tick_remote = self.conn.remote_idle_timeout_ms
        remote = self.tick_remote / 1000.0
        interval = min(1.0, remote / 4) if remote else 1.0
        self.timer = asyncio.get_running_loop().call_later(max(interval, 0.01), self._tick)

    def _tick(self) -> None:
        if self.conn is None or self.conn.closed:
            return
        self.conn.tick()
        self._schedule_tick()

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.feed(data)
        if self.conn.remote_idle_timeout_ms != self.tick_remote:
            self._schedule_tick()  # the peer's OPEN told its idle-time-out

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.conn is not None:
            self.conn.transport = None
            self.conn.connection_lost()
            self.core.connections.discard(self.conn)


class Server:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.persistence = open_persistence(config)
        self.core = Core(config, self.persistence)
        self.servers: list[asyncio.AbstractServer] = []
        self.stopping = asyncio.Event()
        if self.persistence is not None:
            crashed_at = self.persistence.last_alive()
            n = self.core.registry.recover(crashed_at)
            log.info("store %s at %s: %d termini recovered", config.store, config.store_path, n)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.core.engine.schedule = loop.call_soon
        loop.create_task(self._housekeeping())
        for lc in self.config.listeners:
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
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                log.info(
                    "listening on %s:%d%s (%s)", host, port, " with TLS" if ctx else "", lc.role
                )

    async def _housekeeping(self) -> None:
        # once a second: expire suspended termini (3.5.6), and note that the router is alive
        # so that after a crash the expiry clock starts about when it died
        while not self.stopping.is_set():
            self.core.registry.expire()
            if self.persistence is not None:
                self.persistence.mark_alive()
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        for conn in list(self.core.connections):
            conn.close()
        self.core.engine.flush()
        # let the transports write the CLOSE frames before the loop ends
        await asyncio.sleep(0.05)
        if self.persistence is not None:
            self.persistence.mark_alive()
            self.persistence.close()


def open_persistence(config: RouterConfig) -> Any:
    """The terminus store; None for the memory store (nothing survives a restart)."""
    if config.store == "memory":
        return None
    from router.termini_store import StorePersistence

    return StorePersistence.open(config.store, config.store_path, config.store_sync)


async def serve(config: RouterConfig) -> int:
    from stores.base import StoreError

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
