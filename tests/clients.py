"""Helpers for driving the router with python-qpid-proton clients.

Two styles, both used across the interop suite:

* ``proton.utils.BlockingConnection`` — see the ``blocking`` fixture in
  ``conftest.py``; every call on it takes a timeout.
* ``proton.reactor.Container`` + ``MessagingHandler`` — subclass
  :class:`Handler` and run it with :func:`run_container`, which bounds the run
  with a watchdog timer. A handler calls ``self.done()`` when it has what it
  wanted (connections are closed, then the container stops) or
  ``self.fail(text)``; a run that hits its watchdog raises with the handler's
  ``progress()`` text so the failure says how far it got.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from proton import Condition, Delivery, Endpoint, Event, Link, Message, Terminus
from proton import Handler as ProtonHandler
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

# How long finish() lets the peer answer our CLOSE before the container is
# stopped anyway (a router that never answers CLOSE is caught by the tests that
# care about it, not here).
CLOSE_GRACE = 5.0


class _Timer(ProtonHandler):  # type: ignore[misc]
    """A proton timer task calling *fn(event)*."""

    def __init__(self, fn: Callable[[Event], None]) -> None:
        self.fn = fn

    def on_timer_task(self, event: Event) -> None:
        self.fn(event)


class Handler(MessagingHandler):  # type: ignore[misc]
    """A MessagingHandler that knows how to end its own run.

    Subclasses open their connections with ``self.connect(container, url)``
    (so they are closed on ``done()``), and override ``progress()`` to say
    how far they got when the watchdog fires.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.container: Container | None = None
        self.connections: list[Any] = []
        self.errors: list[str] = []
        self.timed_out = False
        self.finished = False
        self._watchdog: Any = None
        self._closer: Any = None

    # -- run control ------------------------------------------------------
    def connect(self, container: Container, url: str, **kwargs: Any) -> Any:
        # No silent reconnect (proton's default): a router that goes away must
        # surface as a transport error now, not as a watchdog timeout later.
        kwargs.setdefault("reconnect", False)
        conn = container.connect(url, **kwargs)
        self.connections.append(conn)
        return conn

    def progress(self) -> str:
        return ""

    def fail(self, text: str) -> None:
        self.errors.append(text)
        self.done()

    def done(self) -> None:
        """Close every connection; stop the container once they are closed."""
        if self.finished:
            return
        self.finished = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        for conn in self.connections:
            if conn.state & Endpoint.LOCAL_ACTIVE:
                conn.close()
        assert self.container is not None
        deadline = time.monotonic() + CLOSE_GRACE

        def poll(event: Event) -> None:
            if all(_connection_gone(c) for c in self.connections) or time.monotonic() > deadline:
                self.container.stop()  # type: ignore[union-attr]
            else:
                self._closer = self.container.schedule(0.05, _Timer(poll))  # type: ignore[union-attr]

        self._closer = self.container.schedule(0.0, _Timer(poll))

    def _on_watchdog(self, event: Event) -> None:
        self.timed_out = True
        self.finished = True
        event.container.stop()

    # -- errors a test should hear about -----------------------------------
    def on_transport_error(self, event: Any) -> None:
        if not self.finished:
            cond = event.transport.condition
            self.fail(f"transport error: {cond}")

    def on_connection_error(self, event: Any) -> None:
        if not self.finished:
            self.fail(f"connection closed by router: {event.connection.remote_condition}")

    def on_link_error(self, event: Any) -> None:
        if not self.finished:
            self.fail(f"link {event.link.name} detached by router: {event.link.remote_condition}")


def _connection_gone(conn: Any) -> bool:
    if conn.state & Endpoint.REMOTE_CLOSED:
        return True
    transport = conn.transport
    return transport is None or transport.closed


def run_container(handler: Handler, timeout: float = 30.0) -> Handler:
    """Run *handler* in a proton Container on this thread, at most *timeout* s.

    Raises AssertionError when the watchdog fires or the handler failed.
    """
    container = Container(handler)
    handler.container = container
    handler._watchdog = container.schedule(timeout, _Timer(handler._on_watchdog))
    container.run()
    if handler.timed_out:
        raise AssertionError(
            f"{type(handler).__name__} timed out after {timeout}s: {handler.progress()}"
        )
    if handler.errors:
        raise AssertionError(
            f"{type(handler).__name__}: {'; '.join(handler.errors)} ({handler.progress()})"
        )
    return handler


class ThreadedRun:
    """Run a handler's container in a background thread (for two parties that
    must not block each other, such as a slow consumer next to a producer).

    ``join(timeout)`` is bounded and re-raises the run's failure.
    """

    def __init__(self, handler: Handler, timeout: float = 60.0) -> None:
        self.handler = handler
        self.timeout = timeout
        self.exc: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=type(handler).__name__, daemon=True)

    def _run(self) -> None:
        try:
            run_container(self.handler, self.timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in join()
            self.exc = exc

    def start(self) -> ThreadedRun:
        self.thread.start()
        return self

    def join(self, timeout: float | None = None) -> Handler:
        self.thread.join(self.timeout + CLOSE_GRACE + 5 if timeout is None else timeout)
        if self.thread.is_alive():
            raise AssertionError(
                f"{self.thread.name} thread still running: {self.handler.progress()}"
            )
        if self.exc is not None:
            raise self.exc
        return self.handler


# --------------------------------------------------------------------------
# Link options not shipped by proton.reactor


class RcvSettleSecond(LinkOption):  # type: ignore[misc]
    """Ask for receiver-settle-mode second (AMQP 1.0 §2.8.3, exactly-once)."""

    def apply(self, link: Link) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


class DurableTarget(LinkOption):  # type: ignore[misc]
    """A target with durable unsettled-state that never expires (§3.5.5, §3.5.6): the
    router's terminus for a producer that resumes (§2.6.13)."""

    def apply(self, link: Link) -> None:
        link.target.durability = Terminus.DELIVERIES
        link.target.expiry_policy = Terminus.EXPIRE_NEVER


class SndUnsettled(LinkOption):  # type: ignore[misc]
    """Ask for sender-settle-mode unsettled (§2.8.2)."""

    def apply(self, link: Link) -> None:
        link.snd_settle_mode = Link.SND_UNSETTLED


OUTCOME_NAMES = {
    Delivery.ACCEPTED: "ACCEPTED",
    Delivery.REJECTED: "REJECTED",
    Delivery.RELEASED: "RELEASED",
    Delivery.MODIFIED: "MODIFIED",
    Delivery.RECEIVED: "RECEIVED",
    0: "none",
}


def outcome_name(state: int) -> str:
    return OUTCOME_NAMES.get(state, str(state))


def settle_with(delivery: Delivery, outcome: str, condition: Condition | None = None) -> None:
    """Settle a received delivery with an explicit outcome (§3.4)."""
    if outcome == "accept":
        delivery.update(Delivery.ACCEPTED)
    elif outcome == "reject":
        if condition is not None:
            delivery.local.condition = condition
        delivery.update(Delivery.REJECTED)
    elif outcome == "release":
        delivery.update(Delivery.RELEASED)
    elif outcome == "modify":
        delivery.local.failed = True
        delivery.local.undeliverable = True
        delivery.update(Delivery.MODIFIED)
    else:
        raise ValueError(outcome)
    delivery.settle()


def numbered(i: int, **kwargs: Any) -> Message:
    """Message i: body = i, application property seq = i, id = i."""
    return Message(id=i, body=i, properties={"seq": i}, **kwargs)


def pump_until(
    conn: Any, condition: Callable[[], bool], timeout: float = 15.0, msg: str = ""
) -> None:
    """Keep a BlockingConnection's I/O going until *condition()* holds.

    A BlockingConnection only reads and writes while one of its calls runs:
    a consumer's accept() is written out by its next call. When the thing
    awaited happens elsewhere (another thread, another process), the wait is
    sliced so that a select() with no traffic does not sleep until the next
    heartbeat.
    """
    from proton import Timeout

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout}s: {msg or condition}")
        try:
            conn.wait(condition, timeout=0.05)
        except Timeout:
            pass


def pump_until_done(conn: Any, future: Any, timeout: float = 15.0) -> Any:
    """pump_until(conn, future.done), then return the future's result: the
    producer waits in a thread for an outcome the consumer here must send."""
    pump_until(conn, future.done, timeout, "waiting for the other party")
    return future.result(timeout=0)
