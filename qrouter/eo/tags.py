"""The outgoing delivery tag of a guaranteed topic (docs/exactly-once.md, "Outgoing tags").

A subscriber's link carries deliveries from many publishers, so the publisher's own tag is not
unique there. The router gives each delivery the tag

    BLAKE2b-256(key = TAG_KEY, person = b"qrouter-eo-tag1",
                len(container) | container | len(link) | link | len(tag) | tag)

where each `len` is 4 bytes big-endian. It is a pure function of (publisher container-id,
publisher link name, original tag), so every router computes the same tag for the same
delivery, after any failover, with no mapping table; it is exactly 32 bytes, the most
AMQP allows (1.0 §2.8.7, delivery-tag).

Collisions: for n distinct deliveries unsettled or remembered at once, the chance that two
share a tag is below n² / 2^257 (birthday bound on a 256-bit digest). Even 10^12 live records
give under 10^-53. The length prefixes make the input encoding injective, so two different
triples can only collide through the hash itself. The key is fixed (not secret): it only
separates these digests from any other use of BLAKE2b; a mesh that wants tags an outsider
cannot predict may configure its own key, the same on every router.
"""

from __future__ import annotations

import hashlib

from qrouter._fast.eo_core import TAG_KEY, TAG_SIZE
from qrouter._fast.eo_core import TAG_PERSON as _PERSON

__all__ = ["TAG_KEY", "TAG_SIZE", "outgoing_tag"]


def outgoing_tag(container: str, link: str, tag: bytes, *, key: bytes = TAG_KEY) -> bytes:
    """The 32-byte tag under which the delivery `tag` of publisher (container, link) reaches
    every subscriber, on every router."""
    h = hashlib.blake2b(digest_size=TAG_SIZE, key=key, person=_PERSON)
    for part in (container.encode(), link.encode(), bytes(tag)):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()
