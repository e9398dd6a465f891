"""RoutingEngine.next_due: the router ticks its routing engine when something is due, or after
an event, instead of every 0.1 s (qrouter/inter_router.py, Mesh._ticker). That is only right if
a tick before next_due changes nothing: checked here against an engine ticked every 0.1 s."""

from __future__ import annotations

import math
from typing import Any

from qrouter.mesh import RoutingEngine
from qrouter.mesh.messages import Hello, LinkStateUpdate, MobileUpdate
from tests.mesh.network import MockDataPlane

STEP = 0.1  # the fixed period, and the ticker's least spacing (inter_router.TICK)


def _state(dp: MockDataPlane, engine: RoutingEngine) -> tuple[Any, ...]:
    return (
        dict(dp.next_hop),
        dict(dp.cost),
        {a: set(r) for a, r in dp.remote.items()},
        list(dp.lost),
        list(dp.logs),
        list(dp.outbox),
        engine.topology(),
        engine.neighbours(),
    )


def _script() -> dict[int, list[tuple[int, dict[str, Any]]]]:
    """What the neighbours say, by step: B (link 7) and C (link 8) say HELLO every second,
    B until 5 s, C until 12 s, then both go silent without their links going down (a hung
    neighbour: only the ages notice); B's link state names D, which only B refreshes."""
    out: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for second in range(13):
        step = second * 10 + 3  # off the ticks' second boundaries
        msgs = out.setdefault(step, [])
        if second <= 5:
            msgs.append((7, Hello("B", 1, ("A",)).to_wire()))
            msgs.append((7, LinkStateUpdate("B", 1, 2 + second, {"A": 1, "D": 1}).to_wire()))
        msgs.append((8, Hello("C", 1, ("A",)).to_wire()))
        if second == 1:
            msgs.append((7, LinkStateUpdate("D", 4, 1, {"B": 1}).to_wire()))
            msgs.append((7, MobileUpdate("D", 4, 1, add=("d",)).to_wire()))
            msgs.append((8, MobileUpdate("C", 1, 1, add=("c",)).to_wire()))
    return out


def test_ticking_at_next_due_matches_a_fixed_period() -> None:
    """Two engines get the same messages at the same times for 100 simulated seconds (the
    RA at 30 s, neighbours ageing out at hello_max_age, a router's link state at
    remote_ls_max_age): one ticks every 0.1 s, the other only at a step where next_due has
    come, also after the messages (what the ticker's poke checks). After every step the two
    have sent the same messages and hold the same tables and logs. A deadline missing from
    next_due (a HELLO, an age, the RA, a log line to drain) makes the second act late or
    never."""
    engines = []
    for _ in range(2):
        dp = MockDataPlane(None, "A")
        engine = RoutingEngine("A", dp, instance=1, remote_ls_max_age=60.0)
        engine.link_up(7)
        engine.link_up(8)
        engines.append((dp, engine))
    script = _script()
    ticks = 0
    for step in range(1001):
        now = step * STEP
        for _dp, engine in engines:
            for link_id, message in script.get(step, []):
                engine.receive(link_id, message, now)
        fixed, lazy = engines[0][1], engines[1][1]
        fixed.tick(now)
        if now >= lazy.next_due():
            lazy.tick(now)
            ticks += 1
        assert _state(*engines[0]) == _state(*engines[1]), f"differ at {now:.1f} s"
    assert "B" not in fixed.neighbours() and "C" not in fixed.neighbours()  # aged out
    assert "D" not in fixed.topology()  # its link state aged out too
    assert any("aged out" in text for _, text in engines[0][0].logs)
    assert ticks < 150, f"{ticks} ticks of 1001 steps"  # about 1 a second, not 10


def test_next_due() -> None:
    """At once for a link that has sent no HELLO yet and before the first tick; then the
    next HELLO, a neighbour's age and the RA."""
    dp = MockDataPlane(None, "A")
    engine = RoutingEngine("A", dp, instance=1, hello_interval=1.0, hello_max_age=3.0)
    assert engine.next_due() == -math.inf  # no RA scheduled yet
    engine.tick(0.0)
    assert engine.next_due() == 30.0  # the RA; no link
    engine.link_up(7)
    assert engine.next_due() == -math.inf  # its first HELLO
    engine.tick(0.5)
    assert engine.next_due() == 1.5  # the next HELLO
    engine.receive(7, Hello("B", 1, ("A",)).to_wire(), now=0.7)
    engine.tick(0.8)
    engine.tick(1.5)
    assert engine.next_due() == 2.5
    engine.tick(2.5)
    engine.tick(3.5)
    assert engine.next_due() == 0.7 + 3.0  # B ages out after hello_max_age
    engine.tick(3.71)
    assert engine.neighbours() == {}
