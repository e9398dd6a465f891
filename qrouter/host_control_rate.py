"""Control frames a second from one remote host (``limits.max_control_rate_per_host``,
docs/configuration.md "[limits]").

``max_control_rate`` bounds the control frames (ATTACH, DETACH, BEGIN, END, ...: Python each)
of one client connection; a host with many connections multiplies it (four attach storms from
one host: four times the rate). A token bucket per remote address, shared by all the client
connections from that address and charged alongside each connection's own, bounds what the
host as a whole makes the router spend: ``rate`` frames a second, in bursts of ``burst``. Past
it the host's connections that send control frames are read more slowly, as with the
per-connection rate (qrouter/server.py); nothing is dropped or refused. A connection of that
host that sends only messages (TRANSFER, FLOW, DISPOSITION) is not slowed. Loopback is a host
like any other; inter-router connections are exempt.

A bucket is kept while it is used; at most ``max_hosts`` are kept, the least recently used
dropped first (a connection keeps the bucket it was given: it and the other connections that
hold it go on sharing it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from qrouter.host_table import MAX_HOSTS, HostTable


class ControlBucket:
    """The control-frame bucket of one remote host; its tokens may go below zero (a feed is
    charged after it was handled), and the host then waits until they are back to zero."""

    __slots__ = ("rate", "burst", "tokens", "filled", "clock")

    def __init__(self, rate: int, burst: int, clock: Callable[[], float]) -> None:
        self.rate = float(rate)
        self.burst = float(max(burst, 1))
        self.tokens = self.burst
        self.clock = clock
        self.filled = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.filled) * self.rate)
        self.filled = now

    def spend(self, used: int) -> bool:
        """Take `used` control frames: True when the host has now spent more than it has."""
        self._refill()
        self.tokens -= used
        return self.tokens < 0

    def wait(self) -> float:
        """Seconds until the bucket is back to zero (0.0: it is not overspent)."""
        self._refill()
        return -self.tokens / self.rate if self.tokens < 0 else 0.0


class HostControlRate:
    """Per-host buckets of control frames; ``rate`` 0 turns the limit off."""

    def __init__(
        self,
        rate: int,
        burst: int,
        max_hosts: int = MAX_HOSTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._hosts: HostTable[ControlBucket] = HostTable(max_hosts)

    def bucket(self, host: str) -> ControlBucket | None:
        """The bucket a new client connection from `host` is to share (None: limit off)."""
        if not self.rate:
            return None
        b = self._hosts.get(host)
        if b is None:
            b = self._hosts.put(host, ControlBucket(self.rate, self.burst, self._clock))
        return b

    @property
    def hosts(self) -> int:
        return len(self._hosts)
