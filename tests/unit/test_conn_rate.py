"""qrouter/conn_rate.py: per-host token buckets of new connections, with a fake clock."""

from __future__ import annotations

from qrouter.conn_rate import ConnectionRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_rate() -> None:
    clock = Clock()
    rate = ConnectionRate(20, 40, clock=clock)
    assert all(rate.admit("10.0.0.1") for _ in range(40))
    assert not rate.admit("10.0.0.1")
    assert rate.admit("10.0.0.2")  # another host: its own bucket
    clock.now += 0.5  # 10 tokens back
    assert sum(rate.admit("10.0.0.1") for _ in range(20)) == 10
    assert rate.refused == 11
    clock.now += 3600  # never more than the burst
    assert sum(rate.admit("10.0.0.1") for _ in range(100)) == 40


def test_zero_rate_is_off() -> None:
    rate = ConnectionRate(0, 40, clock=Clock())
    assert all(rate.admit("10.0.0.1") for _ in range(1000))
    assert rate.hosts == 0 and rate.refused == 0


def test_hosts_are_bounded_least_recently_used_first() -> None:
    clock = Clock()
    rate = ConnectionRate(1, 2, max_hosts=3, clock=clock)
    for host in ("a", "b", "c"):
        assert rate.admit(host) and rate.admit(host) and not rate.admit(host)
    assert not rate.admit("a")  # a is now the most recent
    assert rate.admit("d")  # b, the least recently used, is forgotten
    assert rate.hosts == 3
    assert rate.admit("b") and rate.admit("b")  # a fresh (full) bucket
    assert not rate.admit("a")  # a was kept: still empty
