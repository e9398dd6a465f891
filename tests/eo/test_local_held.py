"""The local records' mark (`LocalRecord._held_by`, qrouter/_fast/eo_core.pyx: "`_locals`
holds me"): a subscriber's accept takes the record at the head of the records delivered to it
(`LocalSub._dring`), a SETTLE the one at the head of those the FWDs made (`EoCore._fring`),
instead of asking `_locals`, trusting that mark. A path that took a record
out of `_locals` without clearing it would act on a stale record, so every step of many seeded
schedules (tests/eo/sim.py: crashes, broken channels, store failures, detaches) is checked:
every record a core can reach is marked exactly when `_locals` holds it, and now and then every
local record the run has held in a `_locals` so far (kept by the test: the records are not
tracked by the garbage collector) too."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from qrouter._fast.eo_core import LocalRecord
from tests.eo import sim as simulation
from tests.eo.sim import CHECK_MODE_IDS, CHECK_MODES, CI_PARAMS, Params, run

_EVERY = 97  # steps between the checks of every local record held so far


@pytest.mark.parametrize("params", CHECK_MODES, ids=CHECK_MODE_IDS)
def test_a_local_record_is_marked_held_exactly_while_locals_holds_it(
    monkeypatch: pytest.MonkeyPatch, params: Params
) -> None:
    checked = {"steps": 0, "records": 0}
    held: dict[int, LocalRecord] = {}  # every record seen in a `_locals` (this seed's run)
    original = simulation.Simulation.at

    def cores(sim: simulation.Simulation) -> list[Any]:
        return [r.tr for r in sim.routers.values() if r.tr is not None and hasattr(r.tr, "_locals")]

    def at(self: simulation.Simulation, when: float, fn: Any, *args: Any) -> None:
        def step(*a: Any) -> None:
            fn(*a)
            checked["steps"] += 1
            everyone = checked["steps"] % _EVERY == 0
            for tr in cores(self):
                checked["records"] += len(tr._locals)
                held.update((id(rec), rec) for rec in tr._locals.values())
            for tr in cores(self):
                tr._check_locals(list(held.values()) if everyone else ())

        original(self, when, step, *args)

    monkeypatch.setattr(simulation.Simulation, "at", at)
    for seed in range(150):
        held.clear()
        run(seed, params)
    assert checked["steps"] > 10_000 and checked["records"] > 10_000, checked


def test_a_record_taken_out_is_no_longer_marked() -> None:
    """A record dropped (here by the test hook, as any path must) loses its mark, and a
    placeholder put in its place (protocol.py's, through `_put_local`) has it."""
    seen: list[bool] = []
    original = simulation.Simulation._tick

    def tick(self: simulation.Simulation, name: str, instance: int) -> None:
        tr = self.routers[name].tr
        if not seen and tr is not None and tr._locals:
            rec = next(iter(tr._locals.values()))
            tr._drop_local(rec)
            tr._check_locals([rec])
            assert rec.out_tag not in tr._locals
            with pytest.raises(KeyError):
                tr._drop_local(rec)  # (not held: the mark is gone with it)
            placeholder = LocalRecord(rec.out_tag)
            tr._put_local(rec.out_tag, placeholder)
            tr._check_locals([rec, placeholder])
            with pytest.raises(ValueError):
                tr._put_local(rec.out_tag, LocalRecord(rec.out_tag))
            tr._drop_local(placeholder)
            seen.append(True)
        original(self, name, instance)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulation.Simulation, "_tick", tick)
        for seed in range(20):
            run(seed, CI_PARAMS)
            if seen:
                break
    assert seen, "no schedule had a local record at a tick"


def test_records_dropped_from_locals_are_let_go_by_the_rings_at_the_tick() -> None:
    """A subscriber detaches with records in flight (its router drops them: no subscriber
    left there); the ring of the FWDs' records held them, and bodies, until the tick."""
    from tools.bench.eo_state import PUB

    routers, att, pump = _pair()
    for i in range(200):
        routers["A"].publisher_transfer(PUB, i.to_bytes(4, "big"), b"x" * 100, 0.0)
    pump()
    b = routers["B"]
    assert len(b._locals) == 200 and sum(map(len, b._ring_records())) >= 200
    b.subscriber_detached(att, True, 0.0)
    pump()
    assert not b._locals  # (dropped: nobody here wants them)
    b.tick(1.0)
    assert b._ring_records() in ([], [[]]), "the rings kept records _locals let go"


def test_a_record_delivered_at_once_is_in_its_subscribers_ring() -> None:
    """A FWD for one subscriber with nothing queued is delivered without the subscriber's queue
    (`_c_on_fwd`); its record must still go into the subscriber's ring of delivered records,
    or every accept of B's and C's common case would fall back to probing `_locals`."""
    from tools.bench.eo_state import PUB

    routers, _att, pump = _pair()
    for i in range(50):
        routers["A"].publisher_transfer(PUB, i.to_bytes(4, "big"), b"x" * 100, 0.0)
        pump()  # (one at a time: the subscriber's queue is empty at every FWD)
    b = routers["B"]
    fring, *drings = b._ring_records()
    assert len(b._locals) == 50 and len(fring) == 50
    assert len(drings) == 1, "the subscriber has no ring of delivered records"
    assert {id(r) for r in drings[0]} == {id(r) for r in b._locals.values()}


def _pair() -> tuple[dict[str, Any], Any, Any]:
    """Routers A (the publisher's) and B (a subscriber's, attached), and their wire's pump."""
    from collections import deque

    from qrouter.eo import TopicRouter
    from tools.bench.eo_state import PUB, _Port

    wire: deque[tuple[str, str, Any]] = deque()
    routers = {r: TopicRouter(r, _Port(wire, r), instance=1, topic="t") for r in "AB"}

    def pump() -> None:
        while wire:
            src, dst, msg = wire.popleft()
            routers[dst].receive(src, msg, 0.0)

    routers["A"].router_up("B", 0.0)
    routers["B"].router_up("A", 0.0)
    pump()
    att = routers["B"].subscriber_attached(("sub", "link"), [], 0.0, resumable=False)
    pump()
    routers["A"].publisher_attached(PUB, [], 0.0)
    return routers, att, pump


def _rings_of(obj: Any) -> list[list[Any]]:
    """The slot lists of the rings of local records `obj` (a core, a LocalSub) refers to."""
    rings = [x for x in gc.get_referents(obj) if type(x).__name__ == "_RecRing"]
    return [x for r in rings for x in gc.get_referents(r) if isinstance(x, list)]


def test_a_record_held_at_the_head_leaves_the_later_accepts_their_ring() -> None:
    """A subscriber leaves its first delivery unaccepted and accepts the rest in order: each
    accept must find its record in the subscriber's ring of delivered records, the one held
    at its head notwithstanding (the gaps the takes behind it left counted towards the few
    slots a look-up reads, and from the ninth on every accept probed `_locals`)."""
    from qrouter.eo import outgoing_tag
    from tools.bench.eo_state import PUB

    routers, att, pump = _pair()
    tags = [i.to_bytes(4, "big") for i in range(30)]
    for tag in tags:
        routers["A"].publisher_transfer(PUB, tag, b"x" * 100, 0.0)
    pump()
    b = routers["B"]
    first = b.local_records()[outgoing_tag(*PUB, tags[0])]
    _, dring = b._ring_records()
    assert len(dring) == 30
    for tag in tags[1:]:
        b.subscriber_accepted(att, outgoing_tag(*PUB, tag), 0.0)
    pump()
    _, dring = b._ring_records()
    # (an accept found in the ring takes its record out of it; one that missed left it there)
    assert dring == [first], f"{len(dring) - 1} accepts missed the ring"


def test_a_rings_slots_shrink_at_the_tick_after_a_burst() -> None:
    """5000 deliveries in flight grow the rings of local records (a subscriber's to its most,
    4096 slots; the core's to 8192); once they are accepted and settled, the tick gives both
    back their first size rather than keeping the burst's for the life of the attachment."""
    from qrouter.eo import outgoing_tag
    from tools.bench.eo_state import PUB

    routers, att, pump = _pair()
    a, b = routers["A"], routers["B"]
    tags = [i.to_bytes(4, "big") for i in range(5000)]
    for tag in tags:
        a.publisher_transfer(PUB, tag, b"x", 0.0)
    pump()
    ls = b._subs[att]
    assert max(map(len, _rings_of(ls))) == 4096 and max(map(len, _rings_of(b))) == 8192
    for tag in tags:
        b.subscriber_accepted(att, outgoing_tag(*PUB, tag), 0.0)
    pump()
    for tag in tags:
        a.publisher_settled(PUB, tag, 0.0)
    pump()
    b.tick(1.0)
    pump()
    assert [len(x) for x in _rings_of(ls)] == [64] and [len(x) for x in _rings_of(b)] == [64]


def test_a_detached_subscribers_ring_lets_go_of_its_records() -> None:
    """A subscriber detaches with deliveries in flight: its LocalSub (which the core's hints
    may keep alive until the next look-up) no longer holds them through its ring."""
    from tools.bench.eo_state import PUB

    routers, att, pump = _pair()
    b = routers["B"]
    for i in range(20):
        routers["A"].publisher_transfer(PUB, i.to_bytes(4, "big"), b"x" * 100, 0.0)
    pump()
    ls = b._subs[att]
    records = {id(r) for r in b.local_records().values()}
    assert len(records) == 20 and {id(x) for x in _rings_of(ls)[0]} >= records
    b.subscriber_detached(att, True, 0.0)
    pump()
    assert not any(id(x) in records for ring in _rings_of(ls) for x in ring)
