"""Idempotent publishing: the tags a publisher link was told ACCEPTED, for a while.

A client that cannot resume a link (python-qpid-proton never sends the ATTACH's unsettled map,
AMQP 1.0 §2.6.13) learns nothing of its in-flight deliveries after a lost connection; what it
can do is attach the same link again (same container-id and link name) and resend each
delivery whose outcome it did not see, with the same delivery-tag. The guaranteed topic's
router remembers here, per publisher link, the tags it accepted in the last
`guarantee_timeout`, and answers such a resend with the outcome it gave (ACCEPTED) instead of
publishing it again (docs/exactly-once.md, "Idempotent publishing"). Resends of deliveries that
were not accepted yet need no memory: their records are still held (`TopicRouter`,
``resumable=False``).

Bounded, as every structure a peer can grow (docs/security.md): at most `per_link` tags per
publisher link (its oldest are forgotten first) and `total` tags in all (the memory of the
publisher link least recently accepted to is forgotten first). A forgotten tag that is resent
is published again: at-least-once for that delivery, as without this memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

PER_LINK = 1000  # = max_unsettled_per_link's default: more than a publisher has in flight
TOTAL = 100_000  # about 20 MiB at most (32-byte tags)


class AcceptedTags:
    """(link key, tag) -> the time it was accepted, forgotten after `ttl` seconds."""

    def __init__(self, ttl: float, per_link: int = PER_LINK, total: int = TOTAL) -> None:
        self.ttl = ttl
        self.per_link = per_link
        self.total = total
        self.size = 0
        self.evicted = 0  # tags forgotten early because of a cap
        # link key -> its tags in the order accepted; links in the order last accepted to
        self._links: OrderedDict[Hashable, OrderedDict[bytes, float]] = OrderedDict()

    def add(self, key: Hashable, tag: bytes, now: float) -> None:
        tags = self._links.get(key)
        if tags is None:
            tags = self._links[key] = OrderedDict()
        else:
            self._links.move_to_end(key)
        if tag in tags:
            del tags[tag]
            self.size -= 1
        tags[tag] = now
        self.size += 1
        if len(tags) > self.per_link:
            tags.popitem(last=False)
            self.size -= 1
            self.evicted += 1
        while self.size > self.total:
            oldest_key, oldest = next(iter(self._links.items()))
            if oldest_key == key and len(self._links) == 1:
                oldest.popitem(last=False)  # (only with total < per_link)
                self.size -= 1
                self.evicted += 1
                continue
            del self._links[oldest_key]
            self.size -= len(oldest)
            self.evicted += len(oldest)

    def accepted(self, key: Hashable, tag: bytes, now: float) -> bool:
        """Was `tag` accepted on this link within the last `ttl` seconds?"""
        tags = self._links.get(key)
        if tags is None:
            return False
        at = tags.get(tag)
        return at is not None and now - at <= self.ttl

    def expire(self, now: float) -> None:
        """Forget what is older than `ttl` (called on the router's tick)."""
        for key in list(self._links):
            tags = self._links[key]
            while tags:
                tag, at = next(iter(tags.items()))
                if now - at <= self.ttl:
                    break
                del tags[tag]
                self.size -= 1
            if not tags:
                del self._links[key]

    def __len__(self) -> int:
        return self.size
