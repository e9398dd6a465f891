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

from typing import Any

import pytest

from qrouter._fast.eo_core import LocalRecord
from qrouter.eo import AT_LEAST_ONCE
from tests.eo import sim as simulation
from tests.eo.sim import CI_PARAMS, STORE_PARAMS, Params, run

_EVERY = 97  # steps between the checks of every local record held so far


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
