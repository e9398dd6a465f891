"""The link registry (qrouter/link_registry.py): uniqueness, stealing, expiry policies and
timeouts (3.5.6, counted from suspension, also across a restart), recovery of a terminus
for a null source/target, durability capped by the store. A fake clock, fake links and a
real store for the restart cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qrouter import stores
from qrouter.link_registry import EXPIRY_POLICIES, AttachError, LinkRegistry
from qrouter.termini_store import StorePersistence

KEY = ("router", "client", "orders-in", "sender")


class FakeLink:
    def __init__(self, conn: object | None = None) -> None:
        self.detached: tuple[Any, ...] | None = None
        self.conn = conn if conn is not None else object()  # its own connection by default

    def detach(self, condition: str, description: str, closed: bool = True) -> None:
        self.detached = (condition, description, closed)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def terminus(policy: str | None = None, timeout: int = 0, durable: int = 1) -> dict[str, Any]:
    t: dict[str, Any] = {"address": "orders", "durable": durable, "timeout": timeout}
    if policy is not None:
        t["expiry_policy"] = policy
    return t


class Persist:
    """In-memory persistence with a durability, as a store would advertise."""

    def __init__(self, durability: int = 2) -> None:
        self.durability = durability
        self.saved: dict[Any, Any] = {}

    def save(self, t: Any) -> None:
        self.saved[t.key] = t

    def delete(self, key: Any) -> None:
        self.saved.pop(key, None)

    def load(self) -> Any:
        return list(self.saved.values())


def test_one_attachment_per_key_and_stealing() -> None:
    reg = LinkRegistry("router", Persist())
    first, second = FakeLink(), FakeLink()
    reg.attach(KEY, first, terminus(), "orders")
    reg.attach(KEY, second, terminus(), "orders")
    assert first.detached == ("amqp:link:stolen", first.detached[1], False)
    assert reg.get(KEY).link is second and reg.for_link(first) is None
    # the stolen link's later detach does not touch the terminus now held by the second
    assert reg.detached(first, closed=False, cause="link-detach") is None
    assert reg.get(KEY).link is second


def test_volatile_links_sharing_a_key_coexist() -> None:
    """Durable 0 and an expiry other than never: nothing outlives the link, so two clients
    that reuse one container-id and link name (as load tools do) are not stolen from."""
    reg = LinkRegistry("router", Persist())
    first, second = FakeLink(), FakeLink()
    reg.attach(KEY, first, terminus("link-detach", durable=0), "orders")
    reg.attach(KEY, second, terminus("link-detach", durable=0), "orders")
    assert first.detached is None and second.detached is None
    assert reg.get(KEY) is None  # nothing to recover later either
    # a terminus meant to outlive its link is unique per key
    third = FakeLink()
    reg.attach(KEY, third, terminus("never", durable=0), "orders")
    reg.attach(KEY, FakeLink(), terminus("never", durable=0), "orders")
    assert third.detached is not None and third.detached[0] == "amqp:link:stolen"
    # on one connection a link name is unique (2.6.1): attached again, the first is stolen
    conn = object()
    a, b = FakeLink(conn), FakeLink(conn)
    other = ("router", "client", "same-conn", "sender")
    reg.attach(other, a, terminus("link-detach", durable=0), "orders")
    reg.attach(other, b, terminus("link-detach", durable=0), "orders")
    assert a.detached is not None and a.detached[0] == "amqp:link:stolen"
    assert b.detached is None


@pytest.mark.parametrize("policy", EXPIRY_POLICIES)
@pytest.mark.parametrize("cause", ["link-detach", "session-end", "connection-close"])
def test_expiry_policy_without_timeout(policy: str, cause: str) -> None:
    """3.5.6: a policy triggers on its own event and every broader one; timeout 0 discards the
    terminus when it triggers, else it stays suspended."""
    reg = LinkRegistry("router", Persist())
    link = FakeLink()
    reg.attach(KEY, link, terminus(policy), "orders")
    reg.detached(link, closed=False, cause=cause)
    triggers = policy != "never" and EXPIRY_POLICIES.index(cause) >= EXPIRY_POLICIES.index(policy)
    assert (reg.get(KEY) is None) is triggers


@pytest.mark.parametrize("policy", ["link-detach", "session-end", "connection-close"])
def test_expiry_timeout_counts_from_suspension(policy: str) -> None:
    clock = Clock()
    reg = LinkRegistry("router", Persist(), clock=clock)
    link = FakeLink()
    reg.attach(KEY, link, terminus(policy, timeout=30), "orders")
    clock.now += 100  # attached time does not count
    reg.detached(link, closed=False, cause="connection-close")
    clock.now += 29
    assert reg.expire() == [] and reg.get(KEY) is not None
    clock.now += 2
    assert [t.key for t in reg.expire()] == [KEY] and reg.get(KEY) is None


def test_never_expires_and_closed_detach_destroys() -> None:
    clock = Clock()
    reg = LinkRegistry("router", Persist(), clock=clock)
    link = FakeLink()
    reg.attach(KEY, link, terminus("never", timeout=1), "orders")
    reg.detached(link, closed=False, cause="connection-close")
    clock.now += 10_000
    assert reg.expire() == [] and reg.get(KEY) is not None
    again = FakeLink()
    reg.attach(KEY, again, None, None)  # recovered
    reg.detached(again, closed=True, cause="link-detach")
    assert reg.get(KEY) is None


def test_null_terminus_recovers_the_stored_one() -> None:
    reg = LinkRegistry("router", Persist())
    link = FakeLink()
    reg.attach(KEY, link, terminus("never"), "orders")
    reg.detached(link, closed=False, cause="link-detach")
    t = reg.attach(KEY, FakeLink(), None, None)
    assert t.address == "orders" and t.expiry_policy == "never"
    with pytest.raises(AttachError) as e:
        reg.attach(("router", "client", "unknown", "sender"), FakeLink(), None, None)
    assert e.value.condition == "amqp:not-found"


def test_durability_is_capped_by_the_store() -> None:
    assert (
        LinkRegistry("r", Persist(0)).attach(KEY, FakeLink(), terminus(durable=2), "a").durable == 0
    )
    assert (
        LinkRegistry("r", Persist(1)).attach(KEY, FakeLink(), terminus(durable=2), "a").durable == 1
    )
    assert (
        LinkRegistry("r", Persist(2)).attach(KEY, FakeLink(), terminus(durable=2), "a").durable == 2
    )
    assert (
        LinkRegistry("r", Persist(2)).attach(KEY, FakeLink(), terminus(durable=0), "a").durable == 0
    )


@pytest.mark.parametrize(
    "bad", ["", "x" * 1025, "tab\there", 7], ids=["empty", "too-long", "control", "not-str"]
)
def test_names_from_the_wire_are_checked(bad: Any) -> None:
    reg = LinkRegistry("router", Persist())
    with pytest.raises(AttachError) as e:
        reg.key_for("client", bad, True)
    assert e.value.condition == "amqp:invalid-field"
    with pytest.raises(AttachError):
        reg.key_for(bad, "link", True)


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_expiry_across_a_restart(tmp_path: Path, backend: str) -> None:
    """A suspended terminus keeps its suspension time in the store: after a restart the
    timeout runs on from then; one attached when the router died counts from the last time
    the router was known alive."""
    if not stores.available(backend):
        pytest.skip(f"the {backend} driver is not installed: pip install {stores.DRIVERS[backend]}")
    clock = Clock()
    p = StorePersistence.open(backend, str(tmp_path / "s"))
    reg = LinkRegistry("router", p, clock=clock)
    suspended, attached = FakeLink(), FakeLink()
    reg.attach(KEY, suspended, terminus("link-detach", timeout=60), "orders")
    key2 = ("router", "client", "other", "receiver")
    reg.attach(key2, attached, terminus("connection-close", timeout=60), "other")
    reg.detached(suspended, closed=False, cause="link-detach")
    p.mark_alive(clock.now + 10)
    p.close()

    clock.now += 40  # the restart
    p = StorePersistence.open(backend, str(tmp_path / "s"))
    reg = LinkRegistry("router", p, clock=clock)
    assert reg.recover(p.last_alive()) == 2
    assert reg.get(KEY).suspended_at == 1_000.0
    assert reg.get(key2).suspended_at == 1_010.0
    clock.now = 1_000.0 + 61
    assert [t.key for t in reg.expire()] == [KEY]
    clock.now = 1_010.0 + 61
    assert [t.key for t in reg.expire()] == [key2]
    p.close()
    p = StorePersistence.open(backend, str(tmp_path / "s"))
    assert LinkRegistry("router", p, clock=clock).recover(None) == 0  # gone from the store too
    p.close()
