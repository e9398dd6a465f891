"""New connections a second from one remote host (``limits.max_connection_rate_per_host``,
docs/configuration.md "[limits]").

A client that is closed for breaking a rule (a message over max-message-size, a wrong
password, an attach storm) may reconnect at once and start again: every round costs the
router a TCP accept, a protocol header, SASL, OPEN, BEGIN and ATTACH in Python. A token bucket
per remote address bounds how often one host can make it pay that: ``rate`` connections a
second, in bursts of ``burst``. A connection past it is closed as soon as it is accepted,
before a byte of it is read (a TCP reset: nothing is parsed, nothing answered), and counted.
Loopback is a host like any other.

A refused socket is not reset at once: it is held, unread, for HOLD_S and then reset, so that
a client that reconnects the moment it is closed tries once a second, not thousands of times
(each try costs the router an accept). At most MAX_HELD are held; past that they are reset
at once.

At most ``max_hosts`` buckets are kept, the least recently used dropped first (it is most
likely full again: a host quiet for ``burst / rate`` seconds loses nothing by being
forgotten).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from qrouter.host_table import MAX_HOSTS, HostTable

log = logging.getLogger("qrouter.limits")

HOLD_S = 1.0  # seconds a refused socket is held unread before its reset
LOG_INTERVAL_S = 60.0  # a host's refusals are logged once in this many seconds
MAX_HELD = 64  # refused sockets held at once (file descriptors); the rest are reset at once


class _Bucket:
    __slots__ = ("tokens", "filled", "warned")

    def __init__(self, tokens: float, now: float) -> None:
        self.tokens = tokens
        self.filled = now
        self.warned = -LOG_INTERVAL_S  # when a refusal was last logged


class ConnectionRate:
    """Per-host token buckets of new connections; ``rate`` 0 turns the limit off."""

    def __init__(
        self,
        rate: int,
        burst: int,
        max_hosts: int = MAX_HOSTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = max(burst, 1)
        self._clock = clock
        self._hosts: HostTable[_Bucket] = HostTable(max_hosts)
        self.refused = 0
        self.held = 0

    def admit(self, host: str) -> bool:
        """One new connection from `host`: True when it may go on (its token is taken)."""
        if not self.rate:
            return True
        now = self._clock()
        b = self._hosts.get(host)
        if b is None:
            b = self._hosts.put(host, _Bucket(float(self.burst), now))
        else:
            b.tokens = min(float(self.burst), b.tokens + (now - b.filled) * self.rate)
            b.filled = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True
        self.refused += 1
        if now - b.warned >= LOG_INTERVAL_S:  # one line a minute per host, not one per refusal
            b.warned = now
            log.warning(
                "refusing new connections from %s: connection rate per host limit %d/s "
                "(burst %d) reached (refusals counted; logged once a minute)",
                host,
                self.rate,
                self.burst,
            )
        return False

    def refuse(self, transport: asyncio.BaseTransport) -> None:
        """Close a refused socket without reading from it: after HOLD_S, or at once when
        MAX_HELD are held already."""
        abort = getattr(transport, "abort", transport.close)  # (uvloop: not asyncio.Transport)
        if self.held >= MAX_HELD:
            abort()
            return
        getattr(transport, "pause_reading", abort)()
        self.held += 1

        def drop() -> None:
            self.held -= 1
            abort()

        asyncio.get_running_loop().call_later(HOLD_S, drop)

    @property
    def hosts(self) -> int:
        return len(self._hosts)
