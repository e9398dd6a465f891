"""Where a guaranteed topic's records live in a `qrouter.stores.TerminusStore` (issue 15).

A topic's records are under ``eo/<escaped topic>/`` (sub-keys ``o/<tag>``, ``m/<tag>``,
``k/<sub>``, ``c/<sub>``: docs/exactly-once.md, "What is durable"), its mark is
``eot/<topic>`` (one exact key each, so the name goes in as it is). The escape (``%`` ->
``%25``, ``/`` -> ``%2F``) leaves no ``/`` in the escaped name, so no topic's prefix is a
prefix of another's (``eo/x/`` and ``eo/x%2Fo/``): a topic's scan reads its own records only,
whatever a publisher names its topics. A name without ``/`` or ``%`` keeps the key it had
before the escape.

Stores written before the escape (no `LAYOUT_KEY`) put ``eo/x/o/`` and ``eo/x/`` in one
range; `legacy_moves` says where each of their keys goes (see its doc for what is ambiguous).
"""

from __future__ import annotations

from collections.abc import Iterable

RECORDS = b"eo/"
TOPIC_MARK = b"eot/"
# written (with the moves of `legacy_moves`) when a router first opens a store: its keys are
# escaped. It has no "/" after "eo/", so it is in no topic's range.
LAYOUT_KEY = b"eo/%layout"
LAYOUT_ESCAPED = b"escaped-1"
SUB_KEYS = (b"o/", b"m/", b"k/", b"c/")  # the kinds of record under a topic's prefix


def escape_topic(topic: str) -> bytes:
    """The topic's name in its key prefix: UTF-8, ``%`` -> ``%25``, ``/`` -> ``%2F``."""
    return topic.encode().replace(b"%", b"%25").replace(b"/", b"%2F")


def topic_prefix(topic: str) -> bytes:
    """The prefix of the topic's records: ``eo/<escaped topic>/``."""
    return RECORDS + escape_topic(topic) + b"/"


def topic_mark(topic: str) -> bytes:
    """The key that says the store holds records of the topic (`Guarantees.start`)."""
    return TOPIC_MARK + topic.encode()


def legacy_moves(
    topics: Iterable[str], keys: Iterable[bytes]
) -> tuple[dict[bytes, bytes], list[bytes]]:
    """For a store written before the escape (prefix ``eo/<topic>/`` unescaped): (old key ->
    new key for each record whose key changes, the keys of no topic).

    A key is its topic's if it starts with ``eo/<topic>/`` and the rest is a record's sub-key
    (`SUB_KEYS`); of the topics (from the marks) it can be, the longest name takes it. That
    is ambiguous only when both readings are records: topics ``x`` and ``x/o``, ``eo/x/o/k/s``
    is ``x/o``'s known-subscriber record ``k/s`` or ``x``'s origin record of the out tag
    ``k/s`` (out tags are binary, so one may begin with a sub-key); it goes to ``x/o``.
    Keys of no marked topic (the marks are written with the records: none should be) are
    left where they are and reported."""
    names = sorted({t.encode() for t in topics}, key=lambda n: (-len(n), n))
    moves: dict[bytes, bytes] = {}
    orphans: list[bytes] = []
    for key in keys:
        if not key.startswith(RECORDS) or key == LAYOUT_KEY:
            continue
        for name in names:
            old = RECORDS + name + b"/"
            if key.startswith(old) and key[len(old) :].startswith(SUB_KEYS):
                new = topic_prefix(name.decode())
                if new != old:
                    moves[key] = new + key[len(old) :]
                break
        else:
            orphans.append(key)
    return moves, orphans
