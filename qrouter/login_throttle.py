"""SASL PLAIN checks off the event loop, bounded, with a per-host backoff after failures
(SCRAM-SHA-256 and EXTERNAL outcomes count toward it too: ``judge``).

A PLAIN check costs one PBKDF2 run (~50 ms, qrouter/auth.py). Run on the event loop, a burst
of wrong passwords would stall every connection's traffic, so checks run on a few worker
threads (hashlib releases the GIL while it hashes). What is asked of them is bounded:

* at most ``max_pending`` checks queued or running; one more is refused (``check`` returns
  False, or ``done(None)`` after a backoff wait) and the caller answers SASL sys-temp
  (5.3.3.6 code 4: a transient failure, retry later) rather than queue without bound;
* a host with ``backoff_after`` failed logins within ``backoff_window`` seconds waits before
  each further check: 0.25 s, doubled per failure, at most ``backoff_max``. The wait comes
  before the hash and holds no thread and no place in the queue, so a throttled host costs no
  CPU and cannot crowd out other hosts' logins; it delays the outcome too. A successful
  login from the host forgets its failures. At most ``max_hosts`` hosts are remembered, the
  least recently failed dropped first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from qrouter.config import LoginConfig
from qrouter.host_table import HostTable

log = logging.getLogger("qrouter.auth")

_FIRST_DELAY = 0.25  # seconds: the first backoff step


class _Failures:
    __slots__ = ("count", "since")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.since = now


class LoginThrottle:
    """Runs login checks on worker threads and hands their results back on the loop."""

    def __init__(self, config: LoginConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._pool: ThreadPoolExecutor | None = None
        # the least recently failed forgotten first
        self._hosts: HostTable[_Failures] = HostTable(config.max_hosts)
        self.pending = 0  # checks queued on or running in the pool
        self.refused = 0  # checks refused because `pending` was at max_pending
        self.delayed = 0  # checks that waited for a host's backoff
        self.failed = 0  # checks that said no

    # -- the per-host backoff --

    def delay(self, host: str) -> float:
        """Seconds the next check from `host` waits (0 unless it failed too often lately)."""
        f = self._hosts.peek(host)
        if f is None:
            return 0.0
        if self._clock() - f.since > self.config.backoff_window:
            self._hosts.pop(host)
            return 0.0
        over = f.count - self.config.backoff_after
        if over < 0:
            return 0.0
        return min(self.config.backoff_max, _FIRST_DELAY * 2.0 ** min(over, 32))

    def record(self, host: str, ok: bool) -> None:
        """Count a login's result for `host`."""
        if ok:
            self._hosts.pop(host)
            return
        self.failed += 1
        now = self._clock()
        f = self._hosts.peek(host)
        if f is None or now - f.since > self.config.backoff_window:
            f = _Failures(now)
        f.count += 1
        self._hosts.put(host, f)

    def judge(self, host: str, ok: bool, answer: Any, done: Callable[[Any], None]) -> bool:
        """A login decided on the loop without a hash (a SCRAM proof, an EXTERNAL
        certificate): count it for `host` like a PLAIN check and, if `host` was in backoff,
        call `done(answer)` after its delay and return True; False: answer now. The delay does
        not depend on `ok`, so it tells nothing about the proof. Must be called on the loop."""
        wait = self.delay(host)
        self.record(host, ok)
        if wait <= 0:
            return False
        self.delayed += 1
        asyncio.get_running_loop().call_later(wait, done, answer)
        return True

    @property
    def hosts(self) -> int:
        return len(self._hosts)

    # -- running checks --

    def check(self, host: str, verify: Callable[[], Any], done: Callable[[Any], None]) -> bool:
        """Run `verify()` on a worker thread, after `host`'s backoff delay, and call
        `done(result)` on the event loop: result False if verify raised, None if the check was
        refused after the delay because max_pending were waiting. Must be called on the loop.
        False, and nothing happens, when there is no delay and max_pending are waiting."""
        loop = asyncio.get_running_loop()
        wait = self.delay(host)
        if wait > 0:
            self.delayed += 1
            loop.call_later(wait, self._submit, loop, host, verify, done)
            return True
        if self.pending >= self.config.max_pending:
            self.refused += 1
            return False
        self._submit(loop, host, verify, done)
        return True

    def _submit(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        verify: Callable[[], Any],
        done: Callable[[Any], None],
    ) -> None:
        if self.pending >= self.config.max_pending:  # (after a backoff wait)
            self.refused += 1
            done(None)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.config.workers, thread_name_prefix="qrouter-login"
            )
        try:
            fut = self._pool.submit(verify)
        except RuntimeError:  # the pool was shut down: the router is stopping
            done(None)
            return
        self.pending += 1

        def finished(f: Future[Any]) -> None:  # on the worker thread
            try:
                loop.call_soon_threadsafe(self._finished, host, f, done)
            except RuntimeError:  # the loop closed meanwhile
                pass

        fut.add_done_callback(finished)

    def _finished(self, host: str, fut: Future[Any], done: Callable[[Any], None]) -> None:
        self.pending -= 1
        try:
            result = False if fut.cancelled() else fut.result()
        except Exception:  # a login check fails closed
            log.exception("login check failed")
            result = False
        self.record(host, bool(result))
        done(result)

    def close(self) -> None:
        """Stop the worker threads (queued checks are dropped; their connections close)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
