"""Claims checked against the connection they came on (docs/mesh.md, "Security"): an address
update (MAU) whose origin is not behind its link is dropped and counted; `behind` follows the
link-state database, so equal-cost paths and flooding over every link are fine."""

from __future__ import annotations

from typing import Any

from qrouter.mesh.messages import LinkStateUpdate, MobileUpdate
from tests.mesh.network import Network


def _net(edges: list[tuple[str, str]]) -> Network:
    net = Network(delay=0.005)
    for name in sorted({n for edge in edges for n in edge}):
        net.add(name)
    for a, b in edges:
        net.connect(a, b)
    net.run(1)
    return net


def _link(net: Network, at: str, to: str) -> int:
    conn = net.connection(at, to)
    return conn.a_link if conn.a == at else conn.b_link


def test_forged_address_update_from_a_leaf_is_dropped_and_counted() -> None:
    # A-B-C, and D hangs off A: nothing but D is behind A's link to D
    net = _net([("A", "B"), ("B", "C"), ("A", "D")])
    a = net.engine("A")
    c_instance = net.engine("C").instance
    forged = MobileUpdate("C", c_instance, 99, exist=("payments",))
    a.receive(_link(net, "A", "D"), forged.to_wire(), net.now)
    assert a.refused_origins == 1
    assert "payments" not in a.addresses()
    assert any("not behind it: dropped" in msg for _level, msg in net.dp("A").logs)
    # the same update over the link C is really behind is used
    a.receive(_link(net, "A", "B"), forged.to_wire(), net.now)
    assert a.addresses().get("payments") == {"C"}
    assert a.refused_origins == 1


def test_behind_follows_the_topology_not_the_next_hop() -> None:
    # the square A-B-D-C-A: D is behind both of A's links (equal costs), B only behind its own
    net = _net([("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")])
    a = net.engine("A")
    to_b, to_c = _link(net, "A", "B"), _link(net, "A", "C")
    assert a.behind(to_b, "D") and a.behind(to_c, "D")
    assert a.behind(to_b, "B") and a.behind(to_b, "C")  # C via D
    assert not a.behind(to_b, "A") and not a.behind(to_b, "nobody")
    # cut B-D: C is no longer behind the link to B
    net.disconnect("B", "D")
    net.run(1)
    assert not a.behind(to_b, "C") and not a.behind(to_b, "D")
    assert a.behind(to_c, "D")


def test_flooded_updates_are_not_refused_while_a_mesh_converges() -> None:
    net = _net([("A", "B"), ("A", "C"), ("B", "D"), ("C", "D"), ("D", "E")])
    net.engine("E").local_address_added("orders")
    net.run(1)
    for name in "ABCD":
        assert net.engine(name).addresses() == {"orders": {"E"}}, name
        assert net.engine(name).refused_origins == 0, name


def test_guaranteed_topic_envelopes_from_a_router_not_behind_are_dropped() -> None:
    from types import SimpleNamespace

    from qrouter.inter_router import Mesh, Peer

    net = _net([("A", "B"), ("B", "C"), ("A", "D")])
    mesh = Mesh.__new__(Mesh)  # only the origin check: the routing engine and the counters
    mesh.engine = net.engine("A")
    mesh.refused = {"second-connection": 0, "hello-id": 0, "eo-origin": 0}
    from_d = Peer(SimpleNamespace(conn_id=_link(net, "A", "D")), "D", 1)  # type: ignore[arg-type]
    from_b = Peer(SimpleNamespace(conn_id=_link(net, "A", "B")), "B", 1)  # type: ignore[arg-type]
    batch = [{"to": "A", "from": "C", "n": 0}, {"to": "A", "from": "D", "n": 0}, "junk"]
    assert mesh._from_behind(from_d, batch) == [batch[1]]
    assert mesh.refused["eo-origin"] == 2  # C is not behind D; "junk" claims nobody
    assert mesh._from_behind(from_b, batch[:1]) == batch[:1]
    assert mesh.refused["eo-origin"] == 2


def _forge(net: Network, victim: str, seq_ahead: int, peers: dict[str, int]) -> dict[str, Any]:
    """`victim`'s link state as a member could forge it: its instance, a newer seq."""
    engine = net.engine(victim)
    seq = engine._ls.own.ls_seq + seq_ahead
    return LinkStateUpdate(victim, engine.instance, seq, peers).to_wire()


def test_a_link_only_one_end_advertises_is_not_used() -> None:
    # A-B-E-C (C three hops away) and D hangs off A; D says it has a link to C: C does not
    net = _net([("A", "B"), ("B", "E"), ("E", "C"), ("A", "D")])
    a = net.engine("A")
    claim = LinkStateUpdate("D", net.engine("D").instance, 50, {"A": 1, "C": 1}).to_wire()
    a.receive(_link(net, "A", "D"), claim, net.now)
    assert a.topology()["D"] == {"A": 1, "C": 1}  # held and flooded as said ...
    assert a.next_hops()["C"] == "B" and a.costs()["C"] == 3  # ... but not routed over


def test_a_neighbours_link_state_is_taken_only_from_its_own_connection() -> None:
    # D, next to A and not to C, says for C that C's only link is to D (and for itself that
    # it has one to C): if A believed it, A would reach its neighbour C through D
    net = _net([("A", "C"), ("A", "D")])
    a = net.engine("A")
    real_c = a.topology()["C"]
    from_d = _link(net, "A", "D")
    a.receive(from_d, _forge(net, "C", 10, {"D": 1}), net.now)
    a.receive(from_d, _forge(net, "D", 10, {"A": 1, "C": 1}), net.now)
    assert a.topology()["C"] == real_c == {"A": 1}
    assert a.next_hops()["C"] == "C"
    assert a.refused_link_states == 1
    assert any("link state of neighbour 'C' relayed by 'D'" in m for _l, m in net.dp("A").logs)
    net.run(2)
    assert net.engine("A").next_hops() == {"C": "C", "D": "D"}


def test_a_router_answers_a_link_state_forged_in_its_name() -> None:
    # the square A-B-C-D: D forges C's state (only a link to D) to A, which is not C's
    # neighbour, and to C; C sends its real state above the forged seq, and A takes that
    net = _net([("A", "B"), ("B", "C"), ("C", "D"), ("D", "A")])
    a, c = net.engine("A"), net.engine("C")
    forged = _forge(net, "C", 10, {"D": 1})
    a.receive(_link(net, "A", "D"), forged, net.now)
    assert a.topology()["C"] == {"D": 1}  # A cannot tell: it is not C's neighbour
    c.receive(_link(net, "C", "D"), forged, net.now)
    assert c.refused_link_states == 1
    assert c._ls.own.ls_seq == forged["ls_seq"] + 1
    net.run(1)
    assert a.topology()["C"] == {"B": 1, "D": 1}
    assert a.next_hops()["C"] == "B"  # equal costs: the lower id
    # a forged sequence number near the end of an AMQP long is counted, not outbid (ours
    # would overflow a few changes later)
    seq = c._ls.own.ls_seq
    c.receive(_link(net, "C", "D"), _forge(net, "C", 2**62, {"D": 1}), net.now)
    assert c.refused_link_states == 2 and c._ls.own.ls_seq == seq
