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

# compiled, so that a guaranteed transfer checks it without a Python frame
# (qrouter/_fast/eo_links.pxi); constructed as AcceptedTags(ttl, per_link, total)
from qrouter._fast.engine import AcceptedTags

PER_LINK = 1000  # = max_unsettled_per_link's default: more than a publisher has in flight
TOTAL = 100_000  # about 20 MiB at most (32-byte tags)

__all__ = ["PER_LINK", "TOTAL", "AcceptedTags"]
