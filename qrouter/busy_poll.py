"""A short, bounded busy poll after activity (`busy_poll_us`, docs/performance.md, latency).

A router that goes back to `epoll_wait` as soon as it has written a burst pays a wake-up
(tens of µs on a VM) for what arrives next: the consumer's dispositions, the producer's next
messages. With `busy_poll_us` > 0, a loop iteration that read something ends with a spin of
at most that many µs on non-blocking polls of every connection's socket; as soon as one is
readable (or the time is up) the spin returns and the event loop's own poll finds it without
sleeping. The cost is CPU: at most `busy_poll_us` per active iteration, none when idle.
"""

from __future__ import annotations

import asyncio
import select
import time
from contextlib import suppress


class BusyPoll:
    """One per router: the sockets to poll, and at most one spin scheduled per iteration."""

    __slots__ = ("ns", "epoll", "loop", "scheduled", "spins", "caught")

    def __init__(self, us: int, loop: asyncio.AbstractEventLoop) -> None:
        self.ns = us * 1000
        self.epoll = select.epoll()
        self.loop = loop
        self.scheduled = False
        self.spins = 0  # spins run
        self.caught = 0  # ... that ended with a readable socket (a wake-up saved)

    def add(self, transport: asyncio.BaseTransport) -> int:
        """Poll this transport's socket; its fd (-1: none)."""
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0:
            try:
                self.epoll.register(fd, select.EPOLLIN)
            except OSError:
                return -1
        return fd

    def remove(self, fd: int) -> None:
        if fd >= 0:
            # closed already: epoll dropped it itself. (Should a new connection have got the
            # same fd number meanwhile, it loses its registration: it is only not spun for.)
            with suppress(OSError):
                self.epoll.unregister(fd)

    def activity(self) -> None:
        """Something was read in this iteration: spin once after its other callbacks."""
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._spin)

    def _spin(self) -> None:
        self.scheduled = False
        self.spins += 1
        poll = self.epoll.poll
        clock = time.perf_counter_ns
        end = clock() + self.ns
        while True:
            if poll(0):
                self.caught += 1
                return
            if clock() >= end:
                return

    def close(self) -> None:
        self.epoll.close()
