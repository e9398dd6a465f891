"""qrouter/host_table.py: per-host state, at most max_hosts, least recently used dropped first."""

from __future__ import annotations

from qrouter.host_table import MAX_HOSTS, HostTable


def test_the_least_recently_used_is_dropped_first() -> None:
    table: HostTable[int] = HostTable(max_hosts=3)
    for i, host in enumerate(("a", "b", "c")):
        assert table.put(host, i) == i
    assert table.get("a") == 0  # a is now the most recently used; b the least
    table.put("d", 3)
    assert len(table) == 3
    assert table.peek("b") is None
    assert [table.peek(h) for h in ("a", "c", "d")] == [0, 2, 3]


def test_peek_leaves_the_order_and_put_refreshes_it() -> None:
    table: HostTable[str] = HostTable(max_hosts=2)
    table.put("a", "1")
    table.put("b", "2")
    assert table.peek("a") == "1"  # not a use: a stays the least recently used
    table.put("c", "3")
    assert table.peek("a") is None and table.peek("b") == "2"
    table.put("b", "2'")  # a new value for b: now the most recently used
    table.put("d", "4")
    assert table.peek("c") is None and table.peek("b") == "2'" and len(table) == 2


def test_pop_and_missing_hosts() -> None:
    table: HostTable[int] = HostTable()
    assert table.max_hosts == MAX_HOSTS == 4096
    assert table.get("x") is None and table.pop("x") is None and len(table) == 0
    table.put("x", 1)
    assert table.pop("x") == 1 and len(table) == 0


def test_many_hosts_stay_bounded() -> None:
    table: HostTable[int] = HostTable(max_hosts=100)
    for i in range(10_000):
        table.put(f"10.0.{i // 256}.{i % 256}", i)
    assert len(table) == 100
    assert table.peek("10.0.0.0") is None and table.peek(f"10.0.{9999 // 256}.{9999 % 256}") == 9999
