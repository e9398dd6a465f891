"""Topologies converge: next hops, costs, re-routing on loss.

Bounds (docs/mesh.md, "Convergence"): an adjacency forms in one round trip (a new peer's
HELLO is answered at once) and a link-state change reaches every router in one flood, i.e.
(diameter x link delay). A neighbour that dies silently is dropped after hello_max_age plus
at most one tick; a closed connection (link_down) re-routes at once.
"""

from __future__ import annotations

from tests.mesh.network import Network

DELAY = 0.005
TICK = 0.1


def chain(*names: str) -> Network:
    net = Network(tick=TICK, delay=DELAY)
    for name in names:
        net.add(name)
    for a, b in zip(names, names[1:], strict=False):
        net.connect(a, b)
    return net


def routed(net: Network, expected: dict[str, dict[str, str]]) -> bool:
    return all(net.via(router) == want for router, want in expected.items())


def test_chain_of_three_converges_in_one_flood() -> None:
    net = chain("A", "B", "C")
    want = {
        "A": {"B": "B", "C": "B"},
        "B": {"A": "A", "C": "C"},
        "C": {"A": "B", "B": "B"},
    }
    took = net.run_until(lambda: routed(net, want), timeout=1.0)
    # HELLO round trip (2 delays) + LSU over 2 hops; no timer is waited for.
    assert took <= 5 * DELAY
    assert net.dp("A").cost == {"B": 1, "C": 2}
    assert net.dp("C").cost == {"B": 1, "A": 2}
    assert net.engine("B").neighbours() == {
        "A": net.connection("A", "B").b_link,
        "C": net.connection("B", "C").a_link,
    }
    assert net.engine("A").topology() == {"A": {"B": 1}, "B": {"A": 1, "C": 1}, "C": {"B": 1}}


def test_triangle() -> None:
    net = chain("A", "B", "C")
    net.connect("A", "C")
    net.run(1)
    for router in "ABC":
        others = {r for r in "ABC" if r != router}
        assert net.via(router) == {r: r for r in others}
        assert net.dp(router).cost == dict.fromkeys(others, 1)


def test_costs_respected() -> None:
    net = chain("A", "B", "C")
    net.connect("A", "C", cost=5, cost_back=1)  # A's end expensive, C's end cheap
    net.run(1)
    assert net.via("A") == {"B": "B", "C": "B"}
    assert net.dp("A").cost == {"B": 1, "C": 2}
    assert net.via("C") == {"A": "A", "B": "B"}
    assert net.dp("C").cost == {"A": 1, "B": 1}


def square() -> Network:
    net = Network(tick=TICK, delay=DELAY)
    for name in "ABCD":
        net.add(name)
    for a, b in (("A", "B"), ("B", "D"), ("D", "C"), ("C", "A")):
        net.connect(a, b)
    net.run(1)
    assert net.via("A")["D"] == "B"  # the tie goes to the lower id
    return net


def test_square_loses_b_silently() -> None:
    net = square()
    net.run(0.55)  # somewhere between two hellos
    net.kill("B")
    took = net.run_until(lambda: net.via("A") == {"C": "C", "D": "C"}, timeout=10)
    assert took <= 3.0 + TICK  # hello_max_age + one tick
    net.run_until(lambda: net.via("D") == {"C": "C", "A": "C"}, timeout=1)
    assert net.dp("A").cost == {"C": 1, "D": 2}
    assert "B" in net.dp("A").lost  # in-flight deliveries through B get released
    assert "B" not in net.engine("A").next_hops()


def test_square_loses_b_by_connection_close() -> None:
    net = square()
    net.disconnect("A", "B")
    # link_down re-routes A at once, without waiting for a timer or a message.
    assert net.via("A") == {"B": "C", "C": "C", "D": "C"}
    assert net.dp("A").cost == {"B": 3, "C": 1, "D": 2}
    assert net.dp("A").lost == ["B"]  # what was sent on the closed connection


def test_parallel_connections_use_the_cheaper() -> None:
    net = chain("A", "B")
    net.connect("A", "B", cost=3)
    net.run(1)
    cheap = net.connection("A", "B")
    assert net.engine("A").neighbours() == {"B": cheap.a_link}
    net.disconnect("A", "B")  # closes the cheap one (first found)
    dear = net.connection("A", "B")
    assert net.engine("A").neighbours() == {"B": dear.a_link}
    assert net.dp("A").next_hop == {"B": dear.a_link}
    assert net.dp("A").cost == {"B": 3}


def test_stable_mesh_pushes_nothing_more() -> None:
    net = square()
    net.engine("D").local_address_added("q")
    net.run(1)
    before = {r: net.dp(r).table_calls for r in "ABCD"}
    net.run(200)  # many hello and RA rounds
    assert {r: net.dp(r).table_calls for r in "ABCD"} == before
    assert all(net.engine(r).next_hops() for r in "ABCD")  # nobody aged out


def test_deterministic() -> None:
    def scenario() -> list[list[tuple[str, str]]]:
        net = square()
        net.engine("D").local_address_added("q")
        net.kill("B")
        net.run(10)
        return [net.dp(r).logs for r in "ABCD"]

    assert scenario() == scenario()
