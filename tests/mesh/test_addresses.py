"""Mobile addresses: propagation, withdrawal, gap recovery (MAR), restarts.

Bound (docs/mesh.md): an MAU is sent at the change and flooded on at each hop as it arrives,
so every router knows within (hops x link delay), well under 1 s; a lost MAU costs one extra
round trip to the neighbour when the next MAU shows the gap, or waits for the next RA
(ra_interval) if no further change comes.
"""

from __future__ import annotations

from typing import Any

from tests.mesh.network import Network

DELAY = 0.005


def chain(*names: str, **args: float) -> Network:
    net = Network(delay=DELAY, **args)
    for name in names:
        net.add(name)
    for a, b in zip(names, names[1:], strict=False):
        net.connect(a, b)
    net.run(1)
    return net


def test_propagate_and_withdraw_across_three_hops() -> None:
    net = chain("A", "B", "C", "D")
    net.engine("D").local_address_added("orders")
    took = net.run_until(lambda: net.dp("A").remote == {"orders": {"D"}}, timeout=1)
    assert took <= 3 * DELAY + 1e-9
    assert net.engine("A").addresses() == {"orders": {"D"}}
    assert net.engine("D").addresses() == {"orders": {"D"}}
    net.engine("A").local_address_added("orders")
    net.run(0.1)
    assert net.engine("B").addresses() == {"orders": {"A", "D"}}
    net.engine("D").local_address_removed("orders")
    took = net.run_until(lambda: net.dp("A").remote == {}, timeout=1)
    assert took <= 3 * DELAY + 1e-9
    assert net.dp("B").remote == {"orders": {"A"}}


def test_repeated_add_is_one_update() -> None:
    net = chain("A", "B")
    sent = net.dp("A").sent["MAU"]
    net.engine("A").local_address_added("q")
    net.engine("A").local_address_added("q")
    net.engine("A").local_address_removed("absent")
    assert net.dp("A").sent["MAU"] == sent + 1


def test_new_router_learns_existing_addresses() -> None:
    net = chain("A", "B")
    net.engine("A").local_address_added("q1")
    net.run(0.1)
    net.add("C")
    net.connect("B", "C")  # C learns A's addresses from B's database sync
    took = net.run_until(lambda: net.dp("C").remote == {"q1": {"A"}}, timeout=1)
    assert took <= 6 * DELAY


def drop_first(op: str, sender: str, **fields: Any) -> Any:
    """A drop predicate that loses the first message from `sender` matching op and fields."""
    state = {"dropped": False}

    def drop(who: str, message: dict[str, Any]) -> bool:
        if state["dropped"] or who != sender or message["op"] != op:
            return False
        if any(message.get(key) != value for key, value in fields.items()):
            return False
        state["dropped"] = True
        return True

    return drop


def test_sequence_gap_triggers_mar_and_full_resync() -> None:
    net = chain("A", "B", "C")
    net.connection("B", "C").drop = drop_first("MAU", "B", id="A", mobile_seq=1)
    net.engine("A").local_address_added("x")  # seq 1: lost between B and C
    net.run(0.1)
    assert "x" not in net.engine("C").addresses()
    net.engine("A").local_address_added("y")  # seq 2: C sees the gap
    took = net.run_until(lambda: net.dp("C").remote == {"x": {"A"}, "y": {"A"}}, timeout=1)
    # The delta's two hops, then MAR to B and B's full list back: one extra round trip.
    assert took <= 4 * DELAY + 1e-9
    assert net.dp("C").sent["MAR"] == 1
    net.engine("A").local_address_removed("x")  # deltas apply again after the resync
    net.run(0.1)
    assert net.dp("C").remote == {"y": {"A"}}


def test_lost_last_update_recovered_by_router_advert() -> None:
    net = chain("A", "B", "C", ra_interval=5.0, remote_ls_max_age=12.0)
    net.connection("B", "C").drop = drop_first("MAU", "B", id="A", mobile_seq=1)
    net.engine("A").local_address_added("x")
    took = net.run_until(lambda: net.dp("C").remote == {"x": {"A"}}, timeout=20)
    assert took <= 5.0 + 0.2  # the next RA shows C it is behind; MAR / MAU round trip
    assert net.dp("C").sent["MAR"] >= 1


def test_lost_link_state_recovered_by_router_advert() -> None:
    net = Network(delay=DELAY, ra_interval=5.0, remote_ls_max_age=12.0)
    for name in "ABC":
        net.add(name)
    net.connect("A", "B")
    net.run(1)
    conn = net.connect("B", "C")
    # B's copy of A's link state on the new connection is lost; C cannot reach A until the
    # next RA from A makes it ask.
    conn.drop = drop_first("LSU", "B", id="A")
    took = net.run_until(lambda: "A" in net.via("C"), timeout=20)
    assert took <= 5.0 + 0.2
    assert net.dp("C").sent["LSR"] >= 1


def test_unreachable_router_addresses_withdrawn_then_restored() -> None:
    net = chain("A", "B", "C")
    net.engine("C").local_address_added("q")
    net.run(0.1)
    net.disconnect("B", "C")
    net.run(0.1)
    assert net.dp("A").remote == {}  # withdrawn before the route: nothing routes to C
    assert "C" not in net.dp("A").next_hop
    net.connect("B", "C")
    net.run_until(lambda: net.dp("A").remote == {"q": {"C"}}, timeout=1)


def test_restarted_router_resyncs() -> None:
    net = chain("A", "B", "C")
    net.engine("C").local_address_added("old")
    net.run(0.1)
    assert net.dp("A").remote == {"old": {"C"}}
    net.kill("C")
    net.run(0.5)
    new = net.restart("C", instance=2)  # a new process: mobile_seq starts again at 0
    new.local_address_added("new")
    net.run_until(lambda: net.dp("A").remote == {"new": {"C"}}, timeout=1)
    assert net.via("A") == {"B": "B", "C": "B"}
    assert "C" in net.dp("A").lost
    assert net.engine("A").duplicate_ids == set()


def test_restart_before_old_connection_noticed() -> None:
    """The new process connects while B still thinks the old one is alive on the old link:
    B holds the newcomer back (no duplicate) until the old link's hellos age out."""
    net = chain("A", "B", "C")
    net.engine("C").local_address_added("old")
    net.run(0.3)
    net.kill("C")
    new = net.restart("C", instance=2, close_old=False)
    new.local_address_added("new")
    took = net.run_until(lambda: net.dp("A").remote == {"new": {"C"}}, timeout=10)
    assert took <= 3.0 + 0.1 + 0.05  # hello_max_age + a tick, then a few link delays
    for router in "AB":
        assert net.engine(router).duplicate_ids == set()
        assert net.dp(router).errors() == []
    assert any("already connected as another instance" in m for _, m in net.dp("B").logs)
