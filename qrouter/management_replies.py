"""A bound on the `$management` replies held in the router for one requesting connection.

The router sends each reply presettled to the request's reply-to address (qrouter/management.py
``_send``). A requester that keeps sending requests but never reads its replies (no credit on
its reply link, or a socket it does not read, so backpressure holds the replies in the router)
would otherwise make the router keep every reply. Per requesting connection, the replies
waiting in the router for the reply addresses it named are counted (the engine's
``Address.waiting_count``), and so are the octets not yet written on the connections of those
addresses' consumers (``Address.consumer_backlog``: replies already routed wait there until the
socket takes them). At ``limit`` replies, or ``backlog`` octets, the node stops renewing the
requester's credit on its ``$management`` link and REJECTs requests that still arrive with
``amqp:resource-limit-exceeded`` (3.4.3). Credit is renewed once the replies drain.

The octets are counted because the transport's pause (backpressure.pxi) alone does not bound
the replies: its high-water mark is the operator's (``write_buffer_high``, which may be set far
above what replies should hold), and the engine's output grows for a whole loop iteration
before the transport sees it.

Called once per request, never per message on the forwarding path.
"""

from __future__ import annotations

import asyncio
from typing import Any

MAX_WAITING_REPLIES = 100  # replies held for one requesting connection
MAX_REPLY_BACKLOG = 1 << 20  # octets unwritten on a connection its replies go to
RESUME_CHECK = 0.5  # seconds between checks of a link whose credit was withheld
_LINK_ATTACHED = 1
_SWEEP_EVERY = 1000  # requests between sweeps of connections with nothing waiting


class ReplyBound:
    def __init__(
        self,
        engine: Any,
        credit: int,
        limit: int = MAX_WAITING_REPLIES,
        backlog: int = MAX_REPLY_BACKLOG,
    ) -> None:
        self.engine = engine
        self.credit = credit  # what a $management link is topped up to
        self.limit = limit
        self.backlog = backlog
        self.refused = 0  # requests REJECTed at the bound
        # conn id -> reply addresses that had replies waiting; each holds at least one, or
        # a consumer's connection at `backlog` (then the connection is over and no address
        # is added), so a set never grows much past `limit`
        self._targets: dict[int, set[str]] = {}
        self._withheld: set[int] = set()  # id() of links waiting for their credit
        self._count = 0

    def _load(self, address: str) -> tuple[int, int]:
        """Replies waiting at `address`, and the largest write backlog (octets) of its
        consumers' connections."""
        a = self.engine.address(address)
        if a is None:
            return 0, 0
        return int(a.waiting_count), int(a.consumer_backlog)

    def _measure(self, conn_id: int) -> tuple[int, int]:
        """(replies waiting at the reply addresses `conn_id` named, the largest write backlog
        of their consumers' connections); forgets the addresses that hold nothing."""
        targets = self._targets.get(conn_id)
        if not targets:
            return 0, 0
        total = backlog = 0
        for address in list(targets):
            n, b = self._load(address)
            if n == 0 and b < self.backlog:
                targets.discard(address)
            total += n
            backlog = max(backlog, b)
        if not targets:
            del self._targets[conn_id]
        return total, backlog

    def over(self, conn_id: int) -> bool:
        """Whether `conn_id` is at its bound: `limit` replies waiting, or a connection its
        replies go to has `backlog` octets not yet written (replies already routed to it sit
        in its output until the socket takes them; the transport's pause is not relied on:
        its high-water mark is the operator's, and one loop iteration may route many)."""
        waiting, backlog = self._measure(conn_id)
        return waiting >= self.limit or backlog >= self.backlog

    def sent(self, conn_id: int, reply_to: str) -> None:
        """A reply for `conn_id`'s request goes (or will go) to `reply_to`."""
        self._targets.setdefault(conn_id, set()).add(reply_to)
        self._count += 1
        if self._count % _SWEEP_EVERY == 0:  # connections gone, replies read
            for cid in list(self._targets):
                self._measure(cid)

    def may_renew(self, link: Any) -> bool:
        """Whether the $management `link` may get more credit now; if not, it gets it later,
        when its connection's replies have drained (and its write buffer is not full)."""
        if not self._blocked(link):
            return True
        if id(link) not in self._withheld:
            self._withheld.add(id(link))
            asyncio.get_running_loop().call_later(RESUME_CHECK, self._check, link)
        return False

    def _blocked(self, link: Any) -> bool:
        return bool(link.conn.write_paused) or self.over(link.conn.conn_id)

    def _check(self, link: Any) -> None:
        if link.state != _LINK_ATTACHED:  # detached, or its connection is gone
            self._withheld.discard(id(link))
            return
        if self._blocked(link):
            asyncio.get_running_loop().call_later(RESUME_CHECK, self._check, link)
            return
        self._withheld.discard(id(link))
        link.flow(self.credit)
