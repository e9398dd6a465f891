"""qrouter/host_control_rate.py: one control-frame bucket per remote host, on a fake clock."""

from __future__ import annotations

from qrouter.host_control_rate import HostControlRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_connections_of_one_host_share_its_bucket() -> None:
    clock = Clock()
    rate = HostControlRate(10, 20, clock=clock)
    a, b, other = rate.bucket("10.0.0.1"), rate.bucket("10.0.0.1"), rate.bucket("10.0.0.2")
    assert a is b and a is not None and other is not a
    assert not a.spend(15)
    assert b.spend(15)  # 30 frames from the host: 10 past its burst of 20
    assert a.wait() == 1.0 and b.wait() == 1.0  # 10 frames at 10 a second
    assert other is not None and not other.spend(20) and other.wait() == 0.0
    clock.now += 0.5
    assert a.wait() == 0.5
    clock.now += 10.0
    assert a.wait() == 0.0 and not a.spend(20)  # refilled to the burst, no further


def test_off_and_bounded() -> None:
    assert HostControlRate(0, 10).bucket("10.0.0.1") is None
    rate = HostControlRate(10, 10, max_hosts=3, clock=Clock())
    first = rate.bucket("h0")
    for i in range(1, 6):
        rate.bucket(f"h{i}")
    assert rate.hosts == 3
    assert rate.bucket("h0") is not first  # forgotten (least recently used): a fresh bucket
