"""Duplicate router ids, ageing out, bad input."""

from __future__ import annotations

import pytest

from qrouter.mesh import RoutingEngine
from qrouter.mesh.messages import Hello, LinkStateUpdate, MobileUpdate
from tests.mesh.network import MockDataPlane, Network


def test_hello_claiming_our_id_is_refused() -> None:
    net = Network(delay=0.005)
    net.add("A", instance=1, name="A1")
    net.add("A", instance=2, name="A2")
    net.add("B")
    net.connect("A1", "A2")
    net.connect("A1", "B")
    net.run(3)
    for name in ("A1", "A2"):
        engine = net.engine(name)
        assert engine.duplicate_ids == {"A"}
        assert any("duplicate router id" in msg for msg in net.dp(name).errors())
        link = net.connection("A1", "A2").a_link if name == "A1" else None
        if link is not None:
            assert engine.refused_links() == {link: "peer claims our router id"}
    assert net.engine("A1").neighbours() == {"B": net.connection("A1", "B").a_link}
    assert net.engine("A2").neighbours() == {}


def test_two_live_instances_on_two_links() -> None:
    net = Network(delay=0.005)
    net.add("B")
    net.add("X", instance=1, name="X1")
    net.add("X", instance=2, name="X2")
    first = net.connect("B", "X1")
    net.run(0.5)
    second = net.connect("B", "X2")
    net.run(3)
    b = net.engine("B")
    assert b.duplicate_ids >= {"X"}
    assert b.neighbours() == {"X": first.a_link}  # the incumbent keeps its place
    assert second.a_link in b.refused_links()
    assert any("used by two live instances" in msg for msg in net.dp("B").errors())


def test_duplicate_elsewhere_in_the_mesh() -> None:
    """X1 - B - C - X2: no router has both on its own links; the floods give them away.

    X1 sees a newer instance advertise its id at once. B, next to X1, drops X1's floods as
    stale (it holds instance 2) but sees X1's RAs keep advancing: a second one convicts.
    Stale floods go no further than B, so C and X2 route to X2 and are not told.
    """
    net = Network(delay=0.005, ra_interval=2.0, remote_ls_max_age=5.0)
    for name in "BC":
        net.add(name)
    net.add("X", instance=1, name="X1")
    net.add("X", instance=2, name="X2")
    net.connect("X1", "B")
    net.connect("B", "C")
    net.connect("C", "X2")
    net.run(0.5)
    assert net.engine("X1").duplicate_ids == {"X"}
    assert net.engine("B").duplicate_ids == set()  # one RA of the old instance proves nothing
    net.run(2 * 2.0 + 0.5)
    assert net.engine("B").duplicate_ids == {"X"}
    assert any("still advertises" in msg for msg in net.dp("B").errors())
    assert net.via("B")["X"] == "C"  # the newest instance is the one routed to


def test_partitioned_router_ages_out() -> None:
    net = Network(delay=0.005, ra_interval=10.0, remote_ls_max_age=20.0)
    for name in "ABC":
        net.add(name)
    net.connect("A", "B")
    net.connect("B", "C")
    net.engine("C").local_address_added("q")
    net.run(1)
    cut_at = net.now
    net.connection("B", "C").cut = True  # both alive, nothing gets through, nobody told
    net.run_until(lambda: "C" not in net.dp("A").next_hop, timeout=3.0 + 0.2)
    assert net.dp("A").remote == {}
    assert "C" in net.engine("A").topology()  # still held: only its age removes it
    net.run_until(lambda: "C" not in net.engine("A").topology(), timeout=30)
    assert net.now - cut_at <= 20.0 + 0.1  # remote_ls_max_age after C's last word, + a tick
    assert any("aged out" in msg for _, msg in net.dp("A").logs)
    assert net.engine("A").next_hops() == {"B": "B"}


def test_ghost_state_ages_out() -> None:
    """A record nobody refreshes (its originator is gone) is dropped after remote_ls_max_age."""
    dp = MockDataPlane(None, "A")
    engine = RoutingEngine("A", dp, instance=1, remote_ls_max_age=60.0)
    engine.link_up(7)
    engine.receive(7, Hello("B", 1, ("A",)).to_wire(), now=0.0)
    engine.receive(7, LinkStateUpdate("B", 1, 2, {"A": 1, "G": 1}).to_wire(), now=0.0)
    engine.receive(7, LinkStateUpdate("G", 5, 1, {"B": 1}).to_wire(), now=0.0)
    engine.receive(7, MobileUpdate("G", 5, 1, add=("g",)).to_wire(), now=0.0)
    assert engine.addresses() == {"g": {"G"}}
    for second in range(1, 62):
        # B keeps saying hello (and refreshes itself); nobody refreshes G.
        engine.receive(7, Hello("B", 1, ("A",)).to_wire(), now=float(second))
        engine.receive(7, LinkStateUpdate("B", 1, 2 + second, {"A": 1, "G": 1}).to_wire(), second)
        engine.tick(float(second))
    assert "G" not in engine.topology()
    assert engine.addresses() == {}
    assert dp.remote == {} and "G" not in dp.next_hop and "G" in dp.lost


def test_bad_messages_are_logged_and_dropped() -> None:
    dp = MockDataPlane(None, "A")
    engine = RoutingEngine("A", dp, instance=1)
    engine.link_up(7)
    engine.receive(7, {"op": "HELLO", "v": 99, "id": "B", "instance": 1}, now=0.0)
    engine.receive(7, {"op": "LSU", "v": 1}, now=0.0)
    engine.receive(8, Hello("B", 1).to_wire(), now=0.0)  # a link that is not up
    # An LSU before any HELLO on the link: the peer is not accepted yet.
    engine.receive(7, LinkStateUpdate("B", 1, 2, {"A": 1}).to_wire(), now=0.0)
    assert [level for level, _ in dp.logs].count("warning") == 2
    assert engine.topology() == {"A": {}}


def test_bad_parameters() -> None:
    dp = MockDataPlane(None, "A")
    with pytest.raises(ValueError):
        RoutingEngine("A", dp, hello_interval=3.0, hello_max_age=3.0)
    with pytest.raises(ValueError):
        RoutingEngine("A", dp, ra_interval=60.0, remote_ls_max_age=60.0)
    with pytest.raises(ValueError):
        RoutingEngine("A", dp).link_up(1, cost=0)
