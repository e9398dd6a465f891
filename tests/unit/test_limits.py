"""qrouter/limits.py without a router: connection accounting and the terminus rules."""

from __future__ import annotations

import pytest

from qrouter.limits import RESOURCE_LIMIT, Limits, LimitsConfig
from qrouter.link_registry import AttachError, LinkRegistry


def test_connections_counted_until_released() -> None:
    lim = Limits(LimitsConfig(max_connections=3, max_connections_per_host=2), None)
    a, b, c, d = object(), object(), object(), object()
    assert lim.admit(a, "10.0.0.1", "alice") is None
    assert lim.admit(b, "10.0.0.1", None) is None
    assert lim.admit(c, "10.0.0.1", "bob") == (
        RESOURCE_LIMIT,
        "connections per host limit 2 reached for host 10.0.0.1",
    )
    assert lim.admit(c, "10.0.0.2", "bob") is None
    assert lim.admit(d, "10.0.0.3", "carol") == (RESOURCE_LIMIT, "connections limit 3 reached")
    lim.release(a)
    lim.release(a)  # twice: counted once
    lim.release(object())  # never admitted: nothing
    assert lim.admit(d, "10.0.0.1", "carol") is None
    assert dict(lim.hosts) == {"10.0.0.1": 2, "10.0.0.2": 1}
    assert lim.refused["connections_per_host"] == 1 and lim.refused["connections"] == 1
    for conn in (b, c, d):
        lim.release(conn)
    assert not lim.hosts and not lim.users and not lim.connections


class FakeLink:
    pass


def terminus(name: str, container: str = "c", **fields: object) -> tuple[tuple, dict]:
    key = ("r", container, name, "sender")
    return key, {"address": "q", "expiry_policy": "never", **fields}


def test_registry_counts_termini_per_container() -> None:
    limits = Limits(LimitsConfig(max_termini_per_container=2, max_termini=3), None)
    reg = LinkRegistry("r", limits=limits)
    links = [FakeLink() for _ in range(5)]
    for i in range(2):
        key, fields = terminus(f"t{i}")
        reg.attach(key, links[i], fields, "q")
    key, fields = terminus("t2")
    with pytest.raises(AttachError) as info:
        reg.attach(key, links[2], fields, "q")
    assert info.value.description == "termini per container limit 2 reached for container c"
    # attaching an existing terminus again is no new terminus
    key0, fields0 = terminus("t0")
    reg.attach(key0, links[3], fields0, "q")
    key, fields = terminus("x", container="other")
    reg.attach(key, links[4], fields, "q")
    key, fields = terminus("y", container="third")
    with pytest.raises(AttachError) as info:
        reg.attach(key, FakeLink(), fields, "q")
    assert info.value.description == "termini limit 3 reached"
    # a closed link's terminus goes, and its container has room again
    reg.detached(links[3], True, "link-detach")
    assert reg.per_container["c"] == 1
    key, fields = terminus("t2")
    assert reg.attach(key, links[2], fields, "q").expiry_policy == "never"  # allowed


def test_expiry_rules() -> None:
    cap = Limits(LimitsConfig(max_terminus_timeout=60, expiry_never="cap"), None)
    assert cap.expiry("never", 0) == ("link-detach", 60)
    assert cap.expiry("session-end", 1000) == ("session-end", 60)
    assert cap.expiry("session-end", 30) == ("session-end", 30)
    assert cap.refused["expiry_never"] == 1 and cap.refused["terminus_timeout"] == 1
    assert Limits(LimitsConfig(expiry_never="allow"), None).expiry("never", 5) == ("never", 5)
    with pytest.raises(AttachError):
        Limits(LimitsConfig(expiry_never="refuse"), None).expiry("never", 0)
    # no timeout cap: nothing to cap 'never' to, it is kept
    uncapped = LimitsConfig(max_terminus_timeout=0, expiry_never="cap")
    assert Limits(uncapped, None).expiry("never", 0) == ("never", 0)
