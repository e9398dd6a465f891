"""The local records' mark (`LocalRecord._held_by`, qrouter/_fast/eo_core.pyx: "`_locals`
holds me"): a subscriber's accept takes the record at the head of the records delivered to it
(`LocalSub._dring`) instead of asking `_locals`, trusting that mark. A path that took a record
out of `_locals` without clearing it would act on a stale record, so every step of many seeded
schedules (tests/eo/sim.py: crashes, broken channels, store failures, detaches) is checked:
every record a core can reach is marked exactly when `_locals` holds it, and now and then every
local record alive (the garbage collector's list) too."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from qrouter._fast.eo_core import LocalRecord
from qrouter.eo import AT_LEAST_ONCE
from tests.eo import sim as simulation
from tests.eo.sim import CI_PARAMS, STORE_PARAMS, Params, run

_EVERY_GC = 97  # steps between the checks of every local record alive


@pytest.mark.parametrize(
    "params",
    [
        CI_PARAMS,
        STORE_PARAMS,
        Params(**{**CI_PARAMS.__dict__, "mode": AT_LEAST_ONCE}),
        Params(**{**CI_PARAMS.__dict__, "unsafe": ("drop-on-settle",)}),
    ],
    ids=["eo", "store", "alo", "drop-on-settle"],
)
def test_a_local_record_is_marked_held_exactly_while_locals_holds_it(
    monkeypatch: pytest.MonkeyPatch, params: Params
) -> None:
    checked = {"steps": 0, "records": 0}
    original = simulation.Simulation.at

    def cores(sim: simulation.Simulation) -> list[Any]:
        return [r.tr for r in sim.routers.values() if r.tr is not None and hasattr(r.tr, "_locals")]

    def at(self: simulation.Simulation, when: float, fn: Any, *args: Any) -> None:
        def step(*a: Any) -> None:
            fn(*a)
            checked["steps"] += 1
            everyone = checked["steps"] % _EVERY_GC == 0
            alive = [o for o in gc.get_objects() if type(o) is LocalRecord] if everyone else []
            for tr in cores(self):
                checked["records"] += len(tr._locals)
                tr._check_locals(alive)

        original(self, when, step, *args)

    monkeypatch.setattr(simulation.Simulation, "at", at)
    for seed in range(150):
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
