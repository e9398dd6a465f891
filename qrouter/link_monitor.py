"""Warnings for links that are stuck: without credit, or holding deliveries unsettled, for
more than a threshold (10 s by default). Users of Qpid Dispatch asked for both; skupper-router
logs the first as "link blocked with zero credit".

Called once a second from the server's housekeeping, never per message: one walk over the
links of every connection, reading counters the engine keeps anyway.

Credit: the engine stamps ``Link.no_credit_since`` (monotonic seconds) when a link's credit
reaches zero and clears it when credit returns, so the stall time is exact. A link that never
had credit is not stamped; its stall counts from when this monitor (or a management query)
first saw it. One warning per stall; an info line when credit comes back after a warning.

Unsettled age: the engine keeps no per-delivery timestamp, so the age of the oldest unsettled
delivery is bounded from what it does keep. Each check records, per link, the number of
deliveries the link has carried so far (``n_delivered`` on an outgoing link, the wrapping
``delivery_count`` on an incoming one). If a link now holds U unsettled deliveries and carried
only N new ones since a check at least 10 s ago, then at least U - N of the deliveries it held
back then are still unsettled: they are more than 10 s old. The bound never warns wrongly
(presettled deliveries and drained credit only make N larger), but it can miss an old delivery
that is overtaken by later ones settling out of order. The exact answer needs one engine
change, described in docs/operations.md ("Stuck deliveries").
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qrouter.log import tag

if TYPE_CHECKING:
    from qrouter.core import Core

log = logging.getLogger("qrouter.links")

THRESHOLD = 10.0  # seconds
_LINK_ATTACHED = 1  # qrouter/_fast/constants.pxd
_WRAP = 1 << 32  # 2.6.7 delivery-count is a uint (sequence number arithmetic)


@dataclass(slots=True)  # one per attached link: kept small (an idle link costs < 2 KiB)
class _Watch:
    zero_since: float = 0.0  # first seen with zero credit, for links the engine never stamped
    stall_warned: float = 0.0  # the no_credit_since value we warned about
    # (time, carried) samples, made only while the link has unsettled deliveries
    history: deque[tuple[float, int]] | None = None
    raw_count: int | None = None  # last delivery_count seen (incoming links)
    carried: int = 0  # deliveries carried, unwrapped
    stuck_warned: bool = False


class LinkMonitor:
    def __init__(
        self,
        core: Core,
        threshold: float = THRESHOLD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.threshold = threshold
        self.clock = clock
        self._watch: dict[Any, _Watch] = {}
        # what the last check found (for metrics and `qrouter-tool stats`)
        self.without_credit = 0
        self.stalled = 0  # links without credit for more than the threshold
        self.stuck_links = 0
        self.stuck_deliveries = 0  # lower bound, summed over links
        self.credit_stalls_total = 0  # stalls longer than the threshold since start
        self.stuck_warnings_total = 0

    def check(self, now: float | None = None) -> None:
        """Look at every attached link once (call about once a second)."""
        try:
            self._check(self.clock() if now is None else now)
        except Exception:  # a bug here must not stop the housekeeping that calls it
            log.exception("link check failed")

    def _check(self, now: float) -> None:
        seen: dict[Any, _Watch] = {}
        without = stalled = stuck_links = stuck = 0
        for conn in list(self.core.connections):
            for link in conn.links():
                if link.state != _LINK_ATTACHED:
                    continue
                w = self._watch.get(link) or _Watch()
                seen[link] = w
                ncs = self._no_credit_since(link, w, now)
                if ncs > 0:
                    without += 1
                    if now - ncs >= self.threshold:
                        stalled += 1
                        if w.stall_warned != ncs:
                            w.stall_warned = ncs
                            self.credit_stalls_total += 1
                            self._warn_credit(link, now - ncs)
                elif w.stall_warned:
                    log.info(
                        "%s link %r has credit again after %.0f s",
                        tag(conn.conn_id, link.handle),
                        link.name,
                        now - w.stall_warned,
                    )
                    w.stall_warned = 0.0
                n = self._stuck(link, w, now)
                if n > 0:
                    stuck_links += 1
                    stuck += n
                    if not w.stuck_warned:
                        w.stuck_warned = True
                        self.stuck_warnings_total += 1
                        log.warning(
                            "%s link %r (%s, address %r): %d deliveries unsettled for more "
                            "than %.0f s (%d unsettled in all)",
                            tag(conn.conn_id, link.handle),
                            link.name,
                            "out" if link.is_sender else "in",
                            _address(link),
                            n,
                            self.threshold,
                            link.unsettled_count,
                        )
                elif w.stuck_warned and link.unsettled_count == 0:
                    w.stuck_warned = False
        self._watch = seen
        self.without_credit = without
        self.stalled = stalled
        self.stuck_links = stuck_links
        self.stuck_deliveries = stuck

    def no_credit_since(self, link: Any, now: float | None = None) -> float:
        """When the link's credit went to zero (monotonic seconds), 0 while it has credit."""
        w = self._watch.get(link)
        if w is None:
            w = self._watch[link] = _Watch()
        return self._no_credit_since(link, w, self.clock() if now is None else now)

    def _no_credit_since(self, link: Any, w: _Watch, now: float) -> float:
        # The engine stamps no_credit_since when credit drops to zero; a link that never had
        # any (a producer attached to an address without consumers, a consumer that has not
        # granted credit yet) is not stamped, so the stall counts from when we first saw it.
        ncs = float(link.no_credit_since)
        if ncs > 0 or link.credit > 0:
            w.zero_since = 0.0
            return ncs
        if w.zero_since == 0.0:
            w.zero_since = now
        return w.zero_since

    def _warn_credit(self, link: Any, seconds: float) -> None:
        if link.is_sender:
            why = f"the consumer has granted none; {link.pending_count} deliveries wait for it"
        elif getattr(link, "endpoint", False):
            # a guaranteed topic's publisher (qrouter/guarantee.py): credit comes back as its
            # deliveries get their outcomes and it settles them
            why = f"{link.unsettled_count} of its deliveries are unsettled (its window)"
        else:
            why = "no consumer of its address has credit"
        log.warning(
            "%s link %r (%s, address %r) without credit for %.0f s: %s",
            tag(link.conn.conn_id, link.handle),
            link.name,
            "out" if link.is_sender else "in",
            _address(link),
            seconds,
            why,
        )

    def _stuck(self, link: Any, w: _Watch, now: float) -> int:
        """At least how many of the link's unsettled deliveries are older than the threshold."""
        if link.is_sender:
            w.carried = int(link.n_delivered)
        else:
            raw = int(link.delivery_count)
            if w.raw_count is not None:
                w.carried += (raw - w.raw_count) % _WRAP
            w.raw_count = raw
        if not link.unsettled_count:
            w.history = None  # nothing unsettled: nothing can be stuck
            return 0
        if w.history is None:
            w.history = deque()
        w.history.append((now, w.carried))
        # keep the newest sample that is at least `threshold` old, and everything after it
        while len(w.history) >= 2 and w.history[1][0] <= now - self.threshold:
            w.history.popleft()
        then, carried_then = w.history[0]
        if now - then < self.threshold:
            return 0
        return max(0, int(link.unsettled_count) - (w.carried - carried_then))


def _address(link: Any) -> str | None:
    """The link's address; a guaranteed topic's links are endpoints, without an engine
    Address: their topic (`journal_address`, set by qrouter/guarantee.py)."""
    name = link.address_name
    return name if name is not None else getattr(link, "journal_address", None)
