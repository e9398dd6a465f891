"""Valid origins give exactly one copy per router, with no loops.

`Network.multicast` forwards a message with the tables the engines pushed, the way the data
plane must (docs/mesh.md, "Valid origins"): at the origin, one copy per next-hop connection
toward every router with the address; elsewhere, only toward routers whose valid origins list
the message's origin. It fails on any second copy.
"""

from __future__ import annotations

import itertools
import random

import pytest

from tests.mesh.network import Network

ADDRESS = "broadcast.events"


def build(edges: list[tuple[str, str, int]], consumers: set[str]) -> Network:
    net = Network(delay=0.005)
    for name in sorted({r for a, b, _ in edges for r in (a, b)}):
        net.add(name)
    for a, b, cost in edges:
        net.connect(a, b, cost)
    for name in consumers:
        net.engine(name).local_address_added(ADDRESS)
    net.run(1)
    return net


def assert_exactly_once(net: Network, consumers: set[str]) -> None:
    for origin in net.alive():
        copies = net.multicast(origin, ADDRESS)
        for router in consumers:
            assert copies[router] == 1, (origin, router, copies)


@pytest.mark.parametrize("a_c_cost", [1, 5], ids=["equal-costs", "b-is-transit"])
def test_triangle_every_router_one_copy(a_c_cost: int) -> None:
    net = build([("A", "B", 1), ("B", "C", 1), ("A", "C", a_c_cost)], {"A", "B", "C"})
    assert_exactly_once(net, {"A", "B", "C"})
    if a_c_cost == 5:
        assert net.dp("B").valid_origins == {"A": ["C"], "C": ["A"]}
        assert net.multicast("A", ADDRESS) == {"A": 1, "B": 1, "C": 1}


def test_copies_only_where_consumers_are() -> None:
    net = build([("A", "B", 1), ("B", "C", 1), ("C", "D", 1)], {"D"})
    assert net.multicast("A", ADDRESS) == {"A": 1, "B": 1, "C": 1, "D": 1}
    assert net.multicast("D", ADDRESS) == {"D": 1}  # local only


def test_square_with_diagonal_and_after_loss() -> None:
    edges = [("A", "B", 1), ("B", "D", 1), ("D", "C", 1), ("C", "A", 1), ("A", "D", 2)]
    net = build(edges, {"A", "B", "C", "D"})
    assert_exactly_once(net, {"A", "B", "C", "D"})
    net.kill("B")
    net.run(5)
    assert_exactly_once(net, {"A", "C", "D"})


@pytest.mark.parametrize("seed", range(6))
def test_random_meshes(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"R{i}" for i in range(8)]
    edges = [(names[i], names[i + 1], rng.choice((1, 1, 2))) for i in range(len(names) - 1)]
    edges += [
        (a, b, rng.choice((1, 1, 2)))
        for a, b in itertools.combinations(names, 2)
        if abs(names.index(a) - names.index(b)) > 1 and rng.random() < 0.3
    ]
    consumers = set(rng.sample(names, 4))
    net = build(edges, consumers)
    assert_exactly_once(net, consumers)
