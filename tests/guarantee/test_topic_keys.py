"""A guaranteed topic's records are in a key range no other topic's keys are in (issue 15):
topics ``x`` and ``x/o`` each recover their own records only, and a store written before the
names were escaped (qrouter/eo/keys.py) is moved to the escaped keys when a router opens it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from qrouter._fast.eo_core import commit_memory, scan_memory
from qrouter.client import Client
from qrouter.client import Message as ClientMessage
from qrouter.eo.keys import LAYOUT_KEY, escape_topic, legacy_moves, topic_prefix
from qrouter.stores import available, open_store
from qrouter.stores.termini import fold_log
from tests.client.conftest import run
from tests.guarantee.common import open_listener, topic_rows, wait_until
from tests.harness import free_port

TOPICS = ["x", "x/o", "x/k", "x/m"]  # "x/o": eo/x/o/... was read as x's origin records
ADDRESSES = {"x": "multicast,exactly-once"}  # (a prefix: x/o, x/k, x/m too)
NAMES = ["x", "x/o", "x/o/k", "x/k", "a%b", "a%2Fb", "a/b", "", "/", "%", "é/ü", "o", "k/c"]


def test_no_prefix_is_in_another_topics_range() -> None:
    prefixes = {name: topic_prefix(name) for name in NAMES}
    assert len(set(prefixes.values())) == len(NAMES)
    for a, pa in prefixes.items():
        for b, pb in prefixes.items():
            assert a == b or not pb.startswith(pa), (a, b)
    # a name without "/" or "%" keeps the key it had before the escape
    assert topic_prefix("orders.eu-1") == b"eo/orders.eu-1/"
    assert escape_topic("x/o") == b"x%2Fo"
    assert escape_topic("a%2Fb") == b"a%252Fb"


def test_legacy_keys_go_to_the_longest_topic_they_can_be_records_of() -> None:
    keys = [
        b"eo/x/o/t1",  # x's origin record (x/o has no sub-key "t1")
        b"eo/x/m/t1",  # its body
        b"eo/x/k/s1",  # x's known subscriber s1 (x/k has no sub-key "s1")
        b"eo/x/o/k/s2",  # x/o's known subscriber s2 (or x's record of tag "k/s2": ambiguous)
        b"eo/x/o/o/t2",
        b"eo/x/o/m/t2",
        b"eo/x/k/c/s3",  # x/k's closed subscriber s3
        b"eo/a%b/o/t3",  # "%" escaped too
        b"eo/a%2Fb/o/t4",  # a topic named "a%2Fb": its new key is the old one of "a/b"'s
        b"eo/a/b/o/t5",
        b"eo/gone/o/t6",  # no mark: left, reported
    ]
    moves, orphans = legacy_moves(["x", "x/o", "x/k", "a%b", "a%2Fb", "a/b", "a"], keys)
    assert moves == {
        b"eo/x/o/k/s2": b"eo/x%2Fo/k/s2",
        b"eo/x/o/o/t2": b"eo/x%2Fo/o/t2",
        b"eo/x/o/m/t2": b"eo/x%2Fo/m/t2",
        b"eo/x/k/c/s3": b"eo/x%2Fk/c/s3",
        b"eo/a%b/o/t3": b"eo/a%25b/o/t3",
        b"eo/a%2Fb/o/t4": b"eo/a%252Fb/o/t4",
        b"eo/a/b/o/t5": b"eo/a%2Fb/o/t5",
    }
    assert orphans == [b"eo/gone/o/t6"]
    # the layout mark is in no topic's range (and never moved)
    assert legacy_moves(["", "%layout"], [LAYOUT_KEY]) == ({}, [])


def test_memory_records_of_x_and_x_slash_o_stay_apart() -> None:
    # no store: the records are kept per topic prefix (commit_memory); a key goes to the
    # topic whose prefix it has, and a topic's scan reads its own records only
    px, pxo = topic_prefix("x"), topic_prefix("x/o")
    memory: dict[bytes, bytes] = {}
    topics: dict[bytes, dict[bytes, bytes]] = {px: {}, pxo: {}}
    loose: dict[bytes, bytes | None] = {px + b"k/s1": b"1", pxo + b"k/s2": b"2", b"eot/x": b""}
    commit_memory([], loose, memory, topics)
    assert topics == {px: {b"k/s1": b"1"}, pxo: {b"k/s2": b"2"}}
    assert scan_memory(px, memory, topics) == [(px + b"k/s1", b"1")]
    assert scan_memory(pxo, memory, topics) == [(pxo + b"k/s2", b"2")]
    assert scan_memory(b"eot/", memory, topics) == [(b"eot/x", b"")]


def _durable_store(tmp_path: Path) -> tuple[str, list[str]]:
    """The suite's store if durable, else LMDB: (its name, the router's arguments)."""
    name = os.environ.get("QROUTER_STORE", "memory")
    if name == "memory":
        name = "lmdb"
    if not available(name):
        pytest.skip(f"the {name} store is not installed (a restart keeps records only on one)")
    return name, ["--store", name, "--store-path", str(tmp_path / "r-store")]


def _to_legacy_layout(store_name: str, path: Path) -> int:
    """The store as a router before the escape wrote it: each topic's records under
    eo/<topic>/ (unescaped), no layout mark. Returns the number of keys moved."""
    store = open_store(store_name, str(path))
    try:
        fold_log(store)
        old = {t: b"eo/" + t.encode() + b"/" for t in TOPICS}
        moved = 0
        with store.batch() as b:
            b.delete(LAYOUT_KEY)
            for topic in TOPICS:
                new = topic_prefix(topic)
                if new == old[topic]:
                    continue
                for key, value in list(store.scan(new)):
                    b.delete(key)
                    b.put(old[topic] + key[len(new) :], value)
                    moved += 1
        store.flush()
    finally:
        store.close()
    return moved


def _restart_scenario(router: Any, tmp_path: Path, legacy: bool) -> None:
    # each topic: a subscriber holds n messages (unaccepted); SIGKILL; (legacy: the store
    # rewritten in the old layout); the restarted router recovers n records per topic, the
    # clients resume and each subscriber gets exactly its own topic's messages, once
    store_name, args = _durable_store(tmp_path)
    port = free_port()
    r = router("r", listeners=[{"port": port}], addresses=ADDRESSES, extra_args=args)
    url = r.url
    n = 3

    async def scenario() -> None:
        slow = {"backoff": (2.0, 2.0), "reconnect_timeout": 60.0, "connect_timeout": 3.0}
        clients, receivers, senders = [], {}, {}
        for i, topic in enumerate(TOPICS):
            c = await Client.connect(url, f"sub{i}", **slow)
            clients.append(c)
            receivers[topic] = await c.receiver(topic, f"sub{i}", exactly_once=True, credit=20)
        await wait_until(
            lambda: (
                {row["name"]: row["subscribers"] for row in topic_rows(url)}
                == dict.fromkeys(TOPICS, 1)
            ),
            10,
            lambda: f"subscribers: {topic_rows(url)}",
        )
        futs = []
        for i, topic in enumerate(TOPICS):
            c = await Client.connect(url, f"pub{i}", **slow)
            clients.append(c)
            senders[topic] = await c.sender(topic, f"pub{i}", exactly_once=True)
            futs += [senders[topic].submit(ClientMessage(body=f"{topic}:{j}")) for j in range(n)]
        held: dict[str, list[Any]] = {}
        for t, rcv in receivers.items():
            held[t] = []
            for _ in range(n):
                held[t].append(await rcv.receive(timeout=10))
        for topic, got in held.items():
            assert sorted(h.message.body for h in got) == [f"{topic}:{j}" for j in range(n)]
        assert not any(f.done() for f in futs), "nothing accepted before the subscribers did"
        r.kill()
        if legacy:
            assert _to_legacy_layout(store_name, tmp_path / "r-store") > 0
        # restarted on a port the clients do not know, read, then given theirs: the records
        # are the store's, not resent deliveries (on their port this raced their reconnect)
        r2 = await asyncio.to_thread(
            router, "r", listeners=[{"port": free_port()}], addresses=ADDRESSES, extra_args=args
        )
        rows = await asyncio.to_thread(topic_rows, r2.url)
        recovered = {
            row["name"]: (row["origin_records"], row["publishers"], row["subscribers"])
            for row in rows
        }
        assert recovered == dict.fromkeys(TOPICS, (n, 0, 0)), rows
        await asyncio.to_thread(open_listener, r2.url, port)
        for got in held.values():
            for h in got:
                await h.accept()
        outcomes = await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert {o.state for o in outcomes} == {"accepted"}
        await wait_until(
            lambda: (
                {(row["origin_records"], row["local_records"]) for row in topic_rows(url)}
                == {(0, 0)}
            ),
            30,
            lambda: f"records: {topic_rows(url)}",
        )
        for topic, rcv in receivers.items():
            assert rcv._queue.empty(), f"{topic}: a message was yielded again, or another's"
        for c in clients:
            await c.close()

    run(scenario(), timeout=120)


def test_topic_and_topic_slash_o_each_recover_their_own_records(
    router: Any, tmp_path: Path
) -> None:
    _restart_scenario(router, tmp_path, legacy=False)


def test_a_store_in_the_old_key_layout_is_moved_and_recovered(router: Any, tmp_path: Path) -> None:
    _restart_scenario(router, tmp_path, legacy=True)
