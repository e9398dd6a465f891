"""The qrouter client API: asyncio, on the router's own AMQP 1.0 engine (qrouter/_fast).

python-qpid-proton never writes or reads the ATTACH ``unsettled`` map, so it cannot resume a
link (AMQP 1.0 §2.6.13); this client can. A `Client` is one container (its container-id is
part of every link's identity at the router); it keeps one connection to one of its URLs,
reconnects (next URL, with backoff) when that connection is lost, and re-attaches every
sender and receiver presenting its unsettled map. See qrouter/client_links.py for how
deliveries are resumed, and docs/client.md.

    client = await Client.connect(["amqp://r1:5672", "amqp://r2:5672"], "orders-app")
    sender = await client.sender("orders", "orders-out", exactly_once=True)
    outcome = await sender.send(Message(body="hello"))
    receiver = await client.receiver("orders", "orders-in", exactly_once=True)
    async for received in receiver:
        await received.accept()
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from qrouter._fast.codec import Symbol
from qrouter._fast.engine import Connection, Router
from qrouter.client_links import Received, Receiver, Sender, _Link, _terminus
from qrouter.client_states import (
    ClientClosed,
    ClientError,
    ConnectError,
    LinkDetached,
    Outcome,
)
from qrouter.client_store import ClientStore
from qrouter.message import Message

__all__ = [
    "Client",
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "LinkDetached",
    "Message",
    "Outcome",
    "Received",
    "Receiver",
    "Sender",
]

log = logging.getLogger("qrouter.client")

DEFAULT_PORT = 5672
DEFAULT_TLS_PORT = 5671
# decision 6, for a router whose OPEN has no idle-time-out: it detects nothing by itself, so
# any wait is a guess; this one bounds it
NO_IDLE_TIMEOUT_WAIT = 60.0


def parse_url(url: str) -> tuple[str, int, bool, str | None, str | None]:
    """(host, port, tls, user, password) of ``amqp[s]://[user:password@]host[:port]`` or
    ``host:port``."""
    if "://" not in url:
        url = "amqp://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"{url}: the scheme is amqp or amqps")
    tls = parts.scheme == "amqps"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT)
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return host, port, tls, user, password


class _Protocol(asyncio.Protocol):
    def __init__(self, client: Client, conn: Connection) -> None:
        self.client = client
        self.conn = conn
        self.eof = False

    def data_received(self, data: bytes) -> None:
        self.conn.feed(data)

    def eof_received(self) -> bool | None:
        self.eof = True  # the router's end of the socket is closed
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.transport = None
        # a FIN or RST from the router's host: its socket is gone, so the router no longer
        # holds our links there (it closed them, or it died); anything else (our own idle
        # timeout, a network error) leaves it possibly half-open at the router
        # (EPIPE: a write after its RST)
        confirmed = self.eof or isinstance(exc, ConnectionResetError | BrokenPipeError)
        self.client._lost(self.conn, exc, confirmed)
        self.conn.connection_lost()  # -> on_closed -> Client._lost (already done)


class _Handler:
    """The engine's callbacks for one client connection; links carry their Sender /
    Receiver in ``link.info``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def on_sasl(self, conn: Connection, *args: Any) -> bool:
        return False  # (server side only)

    def on_open(self, conn: Connection, fields: dict[str, Any]) -> None:
        self.client._opened(conn, fields)

    def on_attach(self, conn: Connection, link: Any, fields: dict[str, Any]) -> None:
        if not link.local_init or not isinstance(link.info, _Link):
            link.detach("amqp:not-implemented", "this client does not accept links")
            return
        link.info._on_attach(link, fields)

    def on_message(self, conn: Connection, link: Any, d: Any, payload: bytes) -> None:
        if isinstance(link.info, Receiver):
            link.info._on_message(d, payload)

    def on_outcome(self, conn: Connection, link: Any, d: Any, code: int, settled: bool) -> None:
        if isinstance(link.info, Sender):
            link.info._on_outcome(d, code, settled)

    def on_settled(self, conn: Connection, link: Any, d: Any) -> None:
        if isinstance(link.info, Receiver):
            link.info._on_settled(d)

    def on_flow(self, conn: Connection, link: Any) -> None:
        pass

    def on_detach(self, conn: Connection, link: Any, closed: bool, error: Any) -> None:
        if conn.closed or not isinstance(link.info, _Link):
            return  # the connection went: the client re-attaches everything
        link.info._on_detach(link, closed, error)

    def on_closed(self, conn: Connection) -> None:
        # the router's CLOSE (2.4.3) while our socket is up and we did not fail it ourselves
        # confirms the router has ended the connection
        confirmed = conn.error is None and conn.transport is not None
        self.client._lost(conn, None, confirmed)


class Client:
    """One AMQP container connected to a router (see the module doc). Create it with
    ``await Client.connect(...)``; ``await client.close()`` ends it."""

    def __init__(
        self,
        urls: Sequence[str],
        container_id: str,
        *,
        user: str | None = None,
        password: str | None = None,
        ssl: _ssl.SSLContext | None = None,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.1, 2.0),
        max_attempts: int | None = None,
        reconnect_timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        max_frame_size: int = 65536,
        idle_timeout: float = 16.0,
        failover_wait: float | None = None,
        state_file: str | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one URL is needed")
        self.urls = list(urls)
        for u in self.urls:
            parse_url(u)
        self.container_id = container_id
        self.user = user
        self.password = password
        self.ssl = ssl
        self.reconnect = reconnect
        self.backoff = backoff
        self.max_attempts = max_attempts
        self.reconnect_timeout = reconnect_timeout
        self.connect_timeout = connect_timeout
        self.max_frame_size = max_frame_size
        self.idle_timeout = idle_timeout
        self.failover_wait = failover_wait
        # the unsettled maps of durable links, kept across restarts (qrouter/client_store.py)
        self.loop = asyncio.get_running_loop()
        self.store: ClientStore | None = (
            ClientStore(state_file, self.loop.call_soon) if state_file else None
        )
        self.engine = Router(
            container_id,
            schedule=self._schedule,
            open_properties={Symbol("product"): "qrouter-client"},
        )
        self.conn: Any = None  # the engine Connection (untyped)
        self.session: Any = None
        self.url: str | None = None  # the URL of the current connection
        self.remote_open: dict[str, Any] = {}
        self.connects = 0  # successful connections so far (1 + reconnects)
        self.error: BaseException | None = None
        self._index = -1
        self._links: dict[tuple[str, bool], _Link] = {}
        self._opening: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed_conn = asyncio.Event()
        # decision 6 (docs/exactly-once.md): links resume on another router only after the
        # old connection is confirmed closed, or the old router's idle timeout has passed
        self.resume_at: float | None = None  # loop time; None: no wait pending
        self._held_router: str | None = None  # the container-id of the possibly half-open one
        self._hold_timer: asyncio.TimerHandle | None = None

    # --- public API ------------------------------------------------------------------------

    @classmethod
    async def connect(cls, urls: str | Sequence[str], container_id: str, **options: Any) -> Client:
        """Connect to the first URL that answers (in order, with backoff between rounds while
        `reconnect` allows). Options: user, password, ssl (an SSLContext; amqps:// URLs
        make a default one), reconnect, backoff (first, max seconds), max_attempts,
        reconnect_timeout (seconds; None = forever), connect_timeout, max_frame_size,
        idle_timeout. Raises ConnectError when it gives up."""
        client = cls([urls] if isinstance(urls, str) else list(urls), container_id, **options)
        await client._connect_loop(initial=True)
        return client

    async def sender(
        self,
        address: str,
        name: str,
        *,
        durable: int = 2,
        expiry_policy: str = "never",
        timeout: int = 0,
        exactly_once: bool = False,
        max_in_flight: int = 1000,
        attach_timeout: float | None = 10.0,
    ) -> Sender:
        """Attach a sender to `address`; the target terminus (the router's end) gets the
        durability, expiry policy and timeout. Raises LinkDetached when the router refuses."""
        s = Sender(
            self,
            address,
            name,
            _terminus(address, durable, expiry_policy, timeout),
            exactly_once,
            max_in_flight,
        )
        await self._add(s, attach_timeout)
        return s

    async def receiver(
        self,
        address: str,
        name: str,
        *,
        durable: int = 2,
        expiry_policy: str = "never",
        timeout: int = 0,
        credit: int = 100,
        exactly_once: bool = False,
        attach_timeout: float | None = 10.0,
    ) -> Receiver:
        """Attach a receiver from `address`; the source terminus (the router's end) gets the
        durability, expiry policy and timeout. Raises LinkDetached when the router refuses."""
        r = Receiver(
            self,
            address,
            name,
            _terminus(address, durable, expiry_policy, timeout),
            exactly_once,
            credit,
        )
        await self._add(r, attach_timeout)
        return r

    @property
    def connected(self) -> bool:
        return self.conn is not None and self.session is not None

    @property
    def remote_container_id(self) -> str | None:
        return self.remote_open.get("container_id")

    @property
    def remote_properties(self) -> dict[Any, Any]:
        """The router's OPEN properties (e.g. ``product`` = "qrouter")."""
        return dict(self.remote_open.get("properties") or {})

    async def close(self, timeout: float = 2.0, suspend: bool = False) -> None:
        """Detach every link and close the connection; stop reconnecting. Links are closed
        (the router discards their termini) unless `suspend`: then durable termini stay at
        the router for a later attach with the same container-id and link names."""
        if self._closing:
            return
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        for link in list(self._links.values()):
            if link.engine is not None and self.conn is not None and not self.conn.closed:
                link.engine.detach(None, None, not suspend)
                link.engine = None
            if not suspend:
                link._unstore()
            link._fail(ClientClosed("client closed"))
        conn = self.conn
        if conn is not None and not conn.closed:
            conn.close()
            if self.store is not None:
                self.store.commit()
            self.engine.flush()
            try:
                await asyncio.wait_for(self._closed_conn.wait(), timeout)
            except TimeoutError:
                if conn.transport is not None:
                    conn.transport.close()
        self._stop_timer()
        if self.store is not None:
            self.store.close()
            self.store = None

    def _schedule(self, flush: Any) -> None:
        self.loop.call_soon(self._commit_then, flush)

    def _commit_then(self, flush: Any) -> None:
        """The engine's output flush, after the state file's staged writes are durable (no
        frame leaves before the records it depends on, qrouter/client_store.py)."""
        if self.store is not None:
            self.store.commit()
        flush()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # --- links -----------------------------------------------------------------------------

    async def _add(self, link: _Link, timeout: float | None) -> None:
        if self._closing:
            raise ClientClosed("client closed")
        if self.error is not None:
            raise self.error
        key = (link.name, link.sender)
        if key in self._links:
            raise ValueError(
                f"this client already has a {'sender' if link.sender else 'receiver'}"
                f" named {link.name!r}"
            )
        self._links[key] = link
        if self.connected:
            self._reattach(link)
        try:
            await link._wait_attached(timeout)
        except BaseException:
            self._forget(link)
            raise

    def _reattach(self, link: _Link) -> None:
        if self.resume_at is not None:
            return  # waiting (decision 6): _release_hold attaches every link
        if self.session is not None and self.conn is not None and not link.closed:
            link._attach(self.session, self.conn.remote_max_frame_size)

    def _forget(self, link: _Link) -> None:
        if self._links.get((link.name, link.sender)) is link:
            del self._links[(link.name, link.sender)]

    # --- connection ------------------------------------------------------------------------

    def _opened(self, conn: Connection, fields: dict[str, Any]) -> None:
        if conn is not self.conn:
            return
        self.remote_open = fields
        self.session = conn.begin()
        self.connects += 1
        if self.resume_at is not None:
            wait = self.resume_at - self.loop.time()
            if wait <= 0 or fields.get("container_id") == self._held_router:
                # the same router again: it ends the old attachment itself when we attach
                # (link stealing); or the wait is over
                self._release_hold(attach=False)
            else:
                log.info(
                    "connected to %s; resuming links in %.1f s, when %s has surely dropped"
                    " the old connection (docs/exactly-once.md, decision 6)",
                    self.url,
                    wait,
                    self._held_router,
                )
                if self._hold_timer is None:
                    self._hold_timer = self.loop.call_later(wait, self._release_hold)
        for link in list(self._links.values()):
            self._reattach(link)
        if self._opening is not None and not self._opening.done():
            self._opening.set_result(None)
        self._schedule_tick()

    def _lost(self, conn: Connection, exc: Exception | None, confirmed: bool = False) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        self.session = None
        self._stop_timer()
        self._closed_conn.set()
        why = conn.error or conn.remote_error or exc
        if self._opening is not None and not self._opening.done():
            self._opening.set_exception(ConnectError(f"{self.url}: connection failed: {why}"))
            return  # _connect_loop is waiting for it and goes on
        if not confirmed and not self._closing and self._links:
            self._hold(conn)
        for link in self._links.values():
            link._connection_lost()
        if self._closing:
            return
        log.warning("connection to %s lost (%s)", self.url, why)
        if not self.reconnect:
            self._give_up(ConnectError(f"connection to {self.url} lost: {why}"))
            return
        self._task = self.loop.create_task(self._connect_loop(initial=False))

    def _hold(self, conn: Connection) -> None:
        """The connection ended without the router confirming it (our idle timeout, a
        network error): the router may still hold our links there, and would go on acting
        for them until its own idle timeout closes the connection (2.4.5). qrouter advertises
        half its real threshold (see connection.pxi), and checks it about once a second, so
        the links may resume on another router 2 x its idle-time-out + 1 s after now (which
        is after the last byte we sent it)."""
        if conn.transport is not None:
            conn.transport.abort()  # nothing more of ours may reach it late
        wait = self.failover_wait
        if wait is None:
            advertised = conn.remote_idle_timeout_ms / 1000.0
            wait = 2 * advertised + 1.0 if advertised else NO_IDLE_TIMEOUT_WAIT
            if not advertised:
                log.warning(
                    "%s advertised no idle timeout: waiting %.0f s before resuming links"
                    " elsewhere; it may hold them longer",
                    self.url,
                    wait,
                )
        if wait <= 0:
            return
        at = self.loop.time() + wait
        if self.resume_at is None or at > self.resume_at:
            self.resume_at = at
            self._held_router = conn.remote_container_id
            if self._hold_timer is not None:
                self._hold_timer.cancel()
                self._hold_timer = None

    def _release_hold(self, attach: bool = True) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        if self.resume_at is None:
            return
        self.resume_at = None
        self._held_router = None
        if attach and self.connected:
            for link in list(self._links.values()):
                self._reattach(link)

    def _give_up(self, exc: BaseException) -> None:
        self.error = exc
        for link in list(self._links.values()):
            link._fail(exc)

    async def _connect_loop(self, initial: bool) -> None:
        delay, max_delay = self.backoff
        deadline = (
            None if self.reconnect_timeout is None else (time.monotonic() + self.reconnect_timeout)
        )
        attempts = 0
        errors: list[str] = []
        while not self._closing:
            for _ in range(len(self.urls)):
                self._index = (self._index + 1) % len(self.urls)
                url = self.urls[self._index]
                attempts += 1
                try:
                    await self._open(url)
                    if not initial:
                        log.info("reconnected to %s", url)
                    return
                except (OSError, ConnectError, TimeoutError) as e:
                    errors.append(f"{url}: {e}")
                    log.info("cannot connect to %s: %s", url, e)
                if self._closing:
                    return
                if self.max_attempts is not None and attempts >= self.max_attempts:
                    break
            out_of_time = deadline is not None and time.monotonic() + delay > deadline
            if (
                not self.reconnect
                or out_of_time
                or (self.max_attempts is not None and attempts >= self.max_attempts)
            ):
                exc = ConnectError("cannot connect: " + "; ".join(errors[-len(self.urls) :]))
                if initial:
                    raise exc
                self._give_up(exc)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)

    async def _open(self, url: str) -> None:
        host, port, tls, url_user, url_password = parse_url(url)
        ctx = self.ssl
        if ctx is None and tls:
            ctx = _ssl.create_default_context()
        user = self.user or url_user
        password = self.password if self.password is not None else url_password
        conn = Connection(
            self.engine,
            _Handler(self),
            max_frame_size=self.max_frame_size,
            idle_timeout=self.idle_timeout,
        )
        self._opening = self.loop.create_future()
        self.url = url
        self.conn = conn
        self._closed_conn = asyncio.Event()
        try:
            transport, _ = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: _Protocol(self, conn),
                    host,
                    port,
                    ssl=ctx,
                    server_hostname=host if ctx else None,
                ),
                self.connect_timeout,
            )
        except BaseException:
            self.conn = None
            self._opening = None
            raise
        conn.transport = transport
        if user is not None:
            response = b"\0" + user.encode() + b"\0" + (password or "").encode()
            conn.start("PLAIN", response, host)
        else:
            conn.start("ANONYMOUS", None, host)
        try:
            await asyncio.wait_for(asyncio.shield(self._opening), self.connect_timeout)
        except BaseException:
            if self.conn is conn:
                self.conn = None
                self.session = None
            transport.close()
            raise
        finally:
            self._opening = None

    def _schedule_tick(self) -> None:
        conn = self.conn
        if conn is None:
            return
        remote = conn.remote_idle_timeout_ms / 1000.0
        interval = min(1.0, remote / 4) if remote else 1.0
        self._timer = self.loop.call_later(max(interval, 0.01), self._tick)

    def _tick(self) -> None:
        if self.conn is None or self.conn.closed:
            return
        self.conn.tick()
        self._schedule_tick()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
