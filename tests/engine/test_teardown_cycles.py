"""A closed connection, an ended session and their links are freed by reference counting.

The router runs the cyclic collector rarely (qrouter/gc_tuning.py: start-up objects frozen, a
full pass only when the long-lived objects grew by a quarter), so anything a closed
connection leaves in a reference cycle stays, with the connection's output buffer, until
such a pass: on the exactly-once RSS bench each round's load clients left about 137 KiB per
connection that way. These tests run with the collector off and count the engine's objects
that are still tracked: a cycle would leave them there.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from qrouter._fast.engine import Connection, Link, Session

from tests.engine.pump import Peer, make_core, pump, receive, send


def alive(kind: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def counts() -> tuple[int, int, int]:
    return alive(Connection), alive(Session), alive(Link)


def traffic(core) -> Peer:  # type: ignore[no-untyped-def]
    """A client with a receiver and a sender on one session, 200 messages through them."""
    peer = Peer(core)
    ssn = peer.session()
    rcv = peer.receiver("cycles.q", credit=500, session=ssn)
    snd = peer.sender("cycles.q", session=ssn)
    pump(peer)
    for i in range(200):
        send(snd, i)
    pump(peer)
    assert len(receive(rcv)) == 200
    return peer


def test_lost_connection_is_freed_without_the_collector(no_collector: None) -> None:
    """2.4.3 / 2.6.12: the socket goes, every link is lost; nothing of it stays alive."""
    core = make_core()
    before = counts()
    peer = traffic(core)
    assert counts() > before
    peer.conn.connection_lost()
    core.engine.flush()  # the server's loop writes what the teardown left (and drops it)
    del peer
    assert counts() == before


def test_closed_connection_is_freed_without_the_collector(no_collector: None) -> None:
    """The peer's CLOSE (2.7.9) tears the connection down the same way."""
    core = make_core()
    before = counts()
    peer = traffic(core)
    peer.connection.close()
    pump(peer)
    peer.conn.connection_lost()  # the server's transport closing after the CLOSE exchange
    core.engine.flush()
    del peer
    assert counts() == before


def test_ended_session_is_freed_without_the_collector(no_collector: None) -> None:
    """The peer's END (2.7.8) on a connection that stays: the session and its links go."""
    core = make_core()
    peer = Peer(core)
    pump(peer)
    before = counts()
    ssn = peer.session()
    rcv = ssn.receiver("cycles.s")
    rcv.open()
    rcv.flow(10)
    pump(peer)
    assert alive(Link) > before[2]
    ssn.close()
    pump(peer)
    assert counts() == before
