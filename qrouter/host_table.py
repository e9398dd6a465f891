"""A table of per-remote-host state with a bounded size: the connection rate buckets
(qrouter/conn_rate.py), the control-frame buckets (qrouter/host_control_rate.py) and the failed
logins (qrouter/login_throttle.py).

A peer chooses its address, so what is kept per host must be bounded: at most ``max_hosts``
entries, the least recently used dropped first when one more is put in.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

MAX_HOSTS = 4096  # hosts remembered by default

V = TypeVar("V")


class HostTable(Generic[V]):
    """Host -> value, at most ``max_hosts`` of them, least recently used dropped first."""

    __slots__ = ("max_hosts", "_hosts")

    def __init__(self, max_hosts: int = MAX_HOSTS) -> None:
        self.max_hosts = max_hosts
        self._hosts: OrderedDict[str, V] = OrderedDict()

    def get(self, host: str) -> V | None:
        """`host`'s value, now the most recently used; None if it has none."""
        value = self._hosts.get(host)
        if value is not None:
            self._hosts.move_to_end(host)
        return value

    def peek(self, host: str) -> V | None:
        """`host`'s value, leaving the order as it is; None if it has none."""
        return self._hosts.get(host)

    def put(self, host: str, value: V) -> V:
        """Set `host`'s value, the most recently used; past ``max_hosts``, the least recently
        used are dropped. Returns `value`."""
        self._hosts[host] = value
        self._hosts.move_to_end(host)
        while len(self._hosts) > self.max_hosts:
            self._hosts.popitem(last=False)
        return value

    def pop(self, host: str) -> V | None:
        return self._hosts.pop(host, None)

    def __len__(self) -> int:
        return len(self._hosts)
