"""Address matching: prefixes, patterns, precedence, the oslo preset, scale."""

from __future__ import annotations

import time

import pytest

from qrouter.addresses import DISTRIBUTIONS, OSLO_PRESET, AddressEntry, AddressTable
from qrouter.config import AddressConfig


def prefix(text: str, distribution: str = "closest") -> AddressEntry:
    return AddressEntry(prefix=text, pattern=None, distribution=distribution)


def pattern(text: str, distribution: str = "multicast") -> AddressEntry:
    return AddressEntry(prefix=None, pattern=text, distribution=distribution)


def test_distributions() -> None:
    assert DISTRIBUTIONS == ("closest", "balanced", "multicast", "unavailable")


@pytest.mark.parametrize(
    ("address", "matches"),
    [
        ("queue", True),
        ("queue.a", True),
        ("queue/a", True),
        ("queue/a.b/c", True),
        ("queuex", False),
        ("queu", False),
        ("x.queue", False),
        ("", False),
    ],
)
def test_prefix_matches_at_token_boundary(address: str, matches: bool) -> None:
    table = AddressTable(oslo_preset=False, entries=[prefix("queue")])
    assert (table.match(address) is not None) is matches


def test_prefix_is_literal_and_trailing_separators_are_dropped() -> None:
    table = AddressTable(oslo_preset=False, entries=[prefix("a.b/")])
    assert table.entries() == [prefix("a.b")]
    assert table.match("a.b") is not None
    assert table.match("a.b/c") is not None
    assert table.match("a/b/c") is None  # the prefix text is compared as written


def test_longest_prefix_wins() -> None:
    table = AddressTable(
        oslo_preset=False,
        entries=[prefix("a", "closest"), prefix("a.b", "multicast"), prefix("a.b.c.d", "balanced")],
    )
    assert table.distribution("a.b.c") == "multicast"
    assert table.distribution("a.b.c.d.e") == "balanced"
    assert table.distribution("a.x") == "closest"
    assert table.distribution("b") == "balanced"  # the default


@pytest.mark.parametrize(
    ("pat", "address", "matches"),
    [
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a/b/c", True),  # '.' and '/' are both separators in patterns
        ("a.*.c", "a.c", False),
        ("a.*.c", "a.b.x.c", False),
        ("a.*", "a", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c.d", True),
        ("#.z", "z", True),
        ("#.z", "x.y.z", True),
        ("#.z", "x.y.zz", False),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True),
        ("a.#.z", "a.b.c", False),
        ("#", "anything/at.all", True),
        ("*", "one", True),
        ("*", "one.two", False),
        ("#.#.x", "x", True),
        ("a.#.b.#.c", "a.x.b.y.b.c", True),
        ("a.#.b.#.c", "a.x.c", False),
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
    ],
)
def test_patterns(pat: str, address: str, matches: bool) -> None:
    table = AddressTable(oslo_preset=False, entries=[pattern(pat)])
    assert (table.match(address) is not None) is matches


@pytest.mark.parametrize(("text"), ["a*.b", "a.b#", "*x", ""])
def test_bad_patterns_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        pattern(text)


@pytest.mark.parametrize("text", ["", "./", "a.*", "a#"])
def test_bad_prefixes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        prefix(text)


def test_entry_needs_exactly_one_of_prefix_and_pattern() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        AddressEntry(prefix="a", pattern="b", distribution="closest")
    with pytest.raises(ValueError, match="exactly one"):
        AddressEntry(prefix=None, pattern=None, distribution="closest")
    with pytest.raises(ValueError, match="not one of"):
        AddressEntry(prefix="a", pattern=None, distribution="anycast")


@pytest.mark.parametrize(
    ("entries", "address", "winner"),
    [
        # literal beats '*' beats '#', token by token from the left
        ([pattern("a.*.c"), pattern("a.b.*")], "a.b.c", pattern("a.b.*")),
        ([pattern("a.#"), pattern("a.*")], "a.b", pattern("a.*")),
        ([pattern("*.b"), pattern("a.#")], "a.b", pattern("a.#")),
        # an exact pattern beats a prefix with the same text (prefix P counts as P.#)
        ([prefix("a.b"), pattern("a.b")], "a.b", pattern("a.b")),
        # a longer match beats a shorter one with the same start
        ([prefix("a"), pattern("a.b")], "a.b", pattern("a.b")),
        ([pattern("a.#"), pattern("a.#.c")], "a.b.c", pattern("a.#.c")),
        # a prefix beats a pattern that has a wildcard where the prefix has a literal
        ([prefix("a.b"), pattern("a.*.c")], "a.b.c", prefix("a.b")),
        ([prefix("a"), pattern("*.b.c")], "a.b.c", prefix("a")),
        # but a pattern that is more specific at the first difference beats a prefix
        ([prefix("a"), pattern("a.b.*")], "a.b.c", pattern("a.b.*")),
        # exact ties: prefix beats pattern, then the first added wins
        ([pattern("a.b.#"), prefix("a.b")], "a.b.c", prefix("a.b")),
        ([pattern("#.x.#"), pattern("#.y.#")], "x.y", pattern("#.x.#")),
        ([pattern("#.y.#"), pattern("#.x.#")], "x.y", pattern("#.y.#")),
    ],
)
def test_most_specific_wins(
    entries: list[AddressEntry], address: str, winner: AddressEntry
) -> None:
    table = AddressTable(oslo_preset=False, entries=entries)
    assert table.match(address) == winner
    # the order entries are added in matters only for exact ties
    if address != "x.y":
        reverse = AddressTable(oslo_preset=False, entries=list(reversed(entries)))
        assert reverse.match(address) == winner


def test_oslo_preset() -> None:
    table = AddressTable()
    assert {(e.prefix, e.distribution) for e in table.entries()} == set(OSLO_PRESET)
    expect = {
        "openstack.org/om/rpc/multicast/nova/compute": "multicast",
        "openstack.org/om/rpc/unicast/nova/compute/host1": "closest",
        "openstack.org/om/rpc/anycast/nova/compute": "balanced",
        "openstack.org/om/notify/multicast/x": "multicast",
        "openstack.org/om/notify/unicast/x": "closest",
        "openstack.org/om/notify/anycast/notifications.info": "balanced",
        "unicast": "closest",
        "unicast.reply.1234": "closest",
        "exclusive/server1": "closest",
        "broadcast.nova.fanout": "multicast",
        "openstack.org/om/rpc": "balanced",  # no entry: the default
        "openstack.org/om/rpc/multicastx": "balanced",
    }
    for address, distribution in expect.items():
        assert table.distribution(address) == distribution, address


def test_no_preset_and_default_distribution() -> None:
    table = AddressTable(default_distribution="multicast", oslo_preset=False)
    assert table.entries() == []
    assert table.match("broadcast.x") is None
    assert table.distribution("broadcast.x") == "multicast"
    with pytest.raises(ValueError):
        AddressTable(default_distribution="fanout")


def test_user_entry_replaces_preset_entry() -> None:
    table = AddressTable(entries=[AddressConfig(prefix="unicast/", distribution="balanced")])
    assert table.distribution("unicast.x") == "balanced"
    assert [e for e in table.entries() if e.prefix == "unicast"] == [prefix("unicast", "balanced")]
    assert len(table.entries()) == len(OSLO_PRESET)
    assert table.entries()[-1] == prefix("unicast", "balanced")  # re-added: now last


def test_add_and_remove() -> None:
    table = AddressTable(oslo_preset=False)
    table.add(pattern("a.*.c", "closest"))
    table.add(pattern("a.*.d", "balanced"))
    table.add(prefix("a", "multicast"))
    assert table.distribution("a.b.c") == "closest"  # second token: '*' beats the prefix's '#'
    assert table.distribution("a.b.e") == "multicast"
    assert table.remove(prefix="a") is True
    assert table.remove(prefix="a") is False
    assert table.distribution("a.b.e") == "balanced"  # the default
    assert table.remove(pattern="a.*.c") is True
    assert table.match("a.b.c") is None
    assert table.distribution("a.b.d") == "balanced"  # the sibling survived pruning
    assert table.remove(pattern="a.*.d") is True
    assert table.entries() == []
    assert table._root.children == {}  # pruned to nothing
    with pytest.raises(ValueError):
        table.remove()
    with pytest.raises(ValueError):
        table.remove(prefix="a", pattern="b")


def test_ten_thousand_entries() -> None:
    entries: list[AddressEntry] = []
    for i in range(5000):
        entries.append(prefix(f"svc{i}.queue", DISTRIBUTIONS[i % 3]))
        entries.append(pattern(f"svc{i}.topic.*.events", "multicast"))
    table = AddressTable(entries=entries)
    assert len(table.entries()) == 10000 + len(OSLO_PRESET)
    addresses = [f"svc{i}.queue/item{i}" for i in range(0, 5000, 7)]
    addresses += [f"svc{i}.topic.x{i}.events" for i in range(0, 5000, 7)]
    addresses += [f"nothing{i}.topic.x.events" for i in range(0, 5000, 7)]
    started = time.perf_counter()
    for _ in range(3):
        for address in addresses:
            table.match(address)
    per_match = (time.perf_counter() - started) / (3 * len(addresses))
    assert table.distribution("svc4999.queue.a.b") == DISTRIBUTIONS[4999 % 3]
    assert table.distribution("svc123.topic.foo.events") == "multicast"
    assert table.distribution("svc123.topic.foo.bar") == "balanced"
    assert table.match("svc5000.queue") is None
    # Generous bound (slow CI machines): a linear scan over 10k entries takes milliseconds.
    assert per_match < 200e-6, f"{per_match * 1e6:.1f} µs per match"
