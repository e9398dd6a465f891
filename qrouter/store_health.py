"""Store failure is fail-stop (docs/architecture.md, "store failure").

When a commit to the terminus store fails (a full disk, EIO, an LMDB map at its size limit),
whoever committed keeps what it could not commit and holds every output that depends on it
(the engine's `Router.retry_commit`, the guaranteed topics' `Guarantees.retry`); this object
says so once in the log, counts the failures, and retries with backoff (0.1 s doubling to
5 s) until a commit succeeds, when the held output goes out and it says so once more.
While it is failing the router takes no new durable work (`available` is False: the link
registry refuses durable attaches with amqp:resource-limit-exceeded, "store unavailable").

A test hook: with QROUTER_TEST_STORE_FAIL set to a path, every commit fails with ENOSPC while
that file exists (`check_injected`), so a test can make a failure transient.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("qrouter.store")

__all__ = ["StoreHealth", "check_injected"]

RETRY_FIRST = 0.1
RETRY_MAX = 5.0
FAIL_ENV = "QROUTER_TEST_STORE_FAIL"


# read once (the router's environment is set before it starts): a lookup in os.environ at
# every group commit cost about 0.6% of a guaranteed topic's driving router on LMDB
_FAIL_FLAG = os.environ.get(FAIL_ENV)


def check_injected() -> None:
    """Raise OSError(ENOSPC) while the test hook's flag file exists."""
    flag = _FAIL_FLAG
    if flag and os.path.exists(flag):
        raise OSError(errno.ENOSPC, "injected by " + FAIL_ENV, flag)


class StoreHealth:
    def __init__(self) -> None:
        self.available = True
        self.failures = 0  # commits that failed since the router started
        self.failing_since: float | None = None  # time.time() of the first failure
        self.last_error = ""
        # each returns True if it had something to commit (and tried); called on a retry
        self.retries: list[Callable[[], bool]] = []
        # a cheap write that tells whether the store works again, when nothing was pending
        self.probe: Callable[[], None] | None = None
        self._backoff = RETRY_FIRST
        self._timer: asyncio.TimerHandle | None = None

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = str(exc) or type(exc).__name__
        if self.available:
            self.available = False
            self.failing_since = time.time()
            self._backoff = RETRY_FIRST
            log.error(
                "store: commit failed (%s): holding durable output, refusing durable attaches, "
                "retrying with backoff until it works",
                self.last_error,
            )
        self._schedule()

    def succeeded(self) -> None:
        if self.available:
            return
        self.available = True
        since = self.failing_since or time.time()
        self.failing_since = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        log.warning(
            "store: commits succeed again after %.1f s (%d failed): held output released",
            time.time() - since,
            self.failures,
        )

    def _schedule(self) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a unit test): the caller retries
        self._timer = loop.call_later(self._backoff, self._retry)
        self._backoff = min(self._backoff * 2, RETRY_MAX)

    def _retry(self) -> None:
        self._timer = None
        before = self.failures
        try:
            if self.probe is not None:
                self.probe()
            for retry in self.retries:
                retry()
                if self.failures != before:
                    break
        except Exception as exc:  # noqa: BLE001 - any failure of the store: try again later
            if self.failures == before:
                self.failed(exc)
        if self.failures == before:
            self.succeeded()
        else:
            self._schedule()
