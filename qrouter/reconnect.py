"""The reconnect loop of an outgoing connector: inter-router connectors (qrouter/inter_router.py)
and route-container connectors to brokers (qrouter/brokers.py).

A connector tries again after a failed attempt or a closed connection: 0.1 s after the first,
the wait doubled after each further one, at most 2 s; a connection that had been up more than
5 s is tried again promptly (the wait starts over). A failure is logged once per distinct
error as a warning, its repeats at debug level, so a peer that stays away fills no log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from qrouter.config import ConfigError

FIRST_S = 0.1  # seconds: the first wait
MOST_S = 2.0  # seconds: the longest wait (doubling up to it)
UP_FOR_S = 5.0  # a connection up longer than this was not a failure: the wait starts over


class Backoff:
    """The waits between attempts: FIRST_S, doubled each time, at most MOST_S."""

    __slots__ = ("delay",)

    def __init__(self) -> None:
        self.delay = FIRST_S

    def next(self) -> float:
        """The wait before the next attempt; the one after it is twice as long (at most MOST_S)."""
        delay = self.delay
        self.delay = min(delay * 2, MOST_S)
        return delay

    def reset(self) -> None:
        self.delay = FIRST_S


async def reconnect_forever(
    connect: Callable[[], Any],
    where: str,
    log: logging.Logger,
    quiet: tuple[type[BaseException], ...] = (),
    running: Callable[[], bool] = lambda: True,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> None:
    """Connect, wait until the connection closes, and again, while `running()`, until the
    task is cancelled. `connect()` opens a connection and returns an awaitable that ends when
    it closes (qrouter/server.py), or raises OSError (refused, TLS: ssl.SSLError), ValueError
    (a missing password file, an empty password) or ConfigError. `where` names the connector in
    the log lines; errors of a `quiet` type (e.g. ConnectionError: the peer is not up yet) are
    logged at debug level only."""
    loop = asyncio.get_running_loop()
    backoff = Backoff()
    last_error = ""
    while running():
        started = loop.time()
        try:
            closed = await connect()
        except (OSError, ValueError, ConfigError) as exc:
            text = str(exc)
            quieter = isinstance(exc, quiet) or text == last_error
            last_error = text
            level = logging.DEBUG if quieter else logging.WARNING
            log.log(level, "%s: %s; retrying in %.1f s", where, exc, backoff.delay)
        else:
            log.info("%s: connected", where)
            await closed
            log.info("%s: connection closed", where)
            if loop.time() - started > UP_FOR_S:
                backoff.reset()  # it had been up a while: reconnect promptly
        await sleep(backoff.next())
