"""The settled local records the tick walks (`EoCore._settled_l`, qrouter/_fast/eo_core.pyx):
at every tick of every router of many seeded schedules (tests/eo/sim.py, with crashes, broken
channels and store failures), the index's live entries are exactly the settled records of
`_locals`, in epoch order, and the tick drops what a scan of every local record would have dropped."""

from __future__ import annotations

import pytest

from qrouter.eo import AT_LEAST_ONCE
from tests.eo import sim as simulation
from tests.eo.sim import CHECK_MODE_IDS, CHECK_MODES, CI_PARAMS, Params, run


def _settled_scan(tr: object) -> dict[bytes, object]:
    return {tag: r for tag, r in tr._locals.items() if r.settled}  # type: ignore[attr-defined]


def _live_index(tr: object) -> list[object]:
    """The index's entries that are records of `_locals` (the others: dropped another way,
    let go when a walk reaches them)."""
    return [r for r in tr._settled_index() if tr._locals.get(r.out_tag) is r]  # type: ignore[attr-defined]


def _check_index(tr: object, scan: dict[bytes, object], where: str) -> None:
    live = _live_index(tr)
    assert len(live) == len(scan) and {r.out_tag: r for r in live} == scan, where  # type: ignore[attr-defined]
    # held in the order they settled, so by epoch (the tick's walk stops at the first that
    # has not passed the barrier)
    epochs = [r.settled_epoch for r in live]  # type: ignore[attr-defined]
    assert epochs == sorted(epochs), f"{where}: out of epoch order"


@pytest.mark.parametrize("params", CHECK_MODES, ids=CHECK_MODE_IDS)
def test_settled_index_matches_a_scan_at_every_tick(
    params: Params, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = simulation.Simulation._tick
    checked = {"ticks": 0, "settled": 0, "dropped": 0}

    def checking_tick(self: simulation.Simulation, name: str, instance: int) -> None:
        tr = self.routers[name].tr
        if tr is not None and self.routers[name].instance == instance:
            before = _settled_scan(tr)
            _check_index(tr, before, f"seed {self.seed}: {name} before its tick")
            assert tr._any_settled_local() == bool(before)
            checked["ticks"] += 1
            checked["settled"] += len(before)
        original(self, name, instance)
        tr = self.routers[name].tr
        if tr is not None and self.routers[name].instance == instance:
            after = _settled_scan(tr)
            _check_index(tr, after, f"seed {self.seed}: {name} after its tick")
            # the walk let go of what it passed: what it holds is what it keeps
            assert len(tr._settled_index()) <= len(after) + len(before), name
            # what stays is what a scan's _maybe_drop_local would have kept
            for rec in list(after.values()):
                tr._maybe_drop_local(rec)
            assert _settled_scan(tr) == after, f"seed {self.seed}: the tick left a droppable"
            # and what went is what it would have dropped (the barrier moves only on PONGs)
            for tag in before.keys() - after.keys():
                rec = before[tag]
                assert "drop-on-settle" in tr.unsafe or (
                    rec.all_seen() and tr._barrier_passed(rec.settled_epoch)
                ), f"seed {self.seed}: {name} dropped {tag!r} early"
            checked["dropped"] += len(before) - len(after)

    monkeypatch.setattr(simulation.Simulation, "_tick", checking_tick)
    for seed in range(60):
        sim = run(seed, params)
        if not params.unsafe:  # (the broken variant fails; its drops are checked above)
            assert not sim.violations(), sim.report()
    assert checked["ticks"] > 1000
    if params.mode != AT_LEAST_ONCE and not params.unsafe:  # (those keep no tombstones)
        assert checked["settled"] > 100 and checked["dropped"] > 100


def test_settled_index_forgets_a_record_dropped_another_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A settled record gone from `_locals` other than by the tick (`_maybe_drop_local` from
    a settlement, or a test) is neither reported nor dropped again: each entry is checked
    against `_locals` as it is read, and let go by the next walk."""
    original = simulation.Simulation._tick
    seen: list[str] = []

    def tick(self: simulation.Simulation, name: str, instance: int) -> None:
        tr = self.routers[name].tr
        if not seen and tr is not None and _live_index(tr):
            held = _live_index(tr)
            for rec in held:
                tr._drop_local(rec)
            assert not tr._any_settled_local()
            assert tr._settled_index() == []  # (let go of as it was read)
            tr._drop_settled_locals()
            assert tr._settled_index() == []
            seen.append(name)  # (the schedule goes on without them: not checked)
        original(self, name, instance)

    monkeypatch.setattr(simulation.Simulation, "_tick", tick)
    for seed in range(20):
        run(seed, CI_PARAMS)
        if seen:
            break
    assert seen, "no schedule had a settled local record at a tick"


def test_tick_gives_back_the_table_of_a_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_locals` grows its table to the largest burst's records (rate × the barrier's delay),
    and a dict's table only shrinks when it has to grow again: the tick rebuilds it once it
    is far larger than what it holds, keeping the order; a table in use stays as it is."""
    import sys

    from qrouter._fast.eo_core import LocalRecord

    original = simulation.Simulation._tick
    checked: list[str] = []

    def tick(self: simulation.Simulation, name: str, instance: int) -> None:
        tr = self.routers[name].tr
        if not checked and tr is not None and tr._locals:
            locals_ = tr._locals
            kept = list(locals_.items())
            burst = [bytes([0xFF]) + i.to_bytes(8, "big") for i in range(20_000)]
            for tag in burst:
                locals_[tag] = LocalRecord(tag)
            tr._drop_settled_locals()
            assert tr._locals is locals_, "a table in use was rebuilt"
            for tag in burst:
                del locals_[tag]
            assert sys.getsizeof(locals_) > 512 * 1024  # (what the burst left)
            tr._drop_settled_locals()
            assert sys.getsizeof(tr._locals) < 64 * 1024, "the burst's table stayed"
            assert list(tr._locals.items()) == kept, "the records left, or their order, changed"
            checked.append(name)
        original(self, name, instance)

    monkeypatch.setattr(simulation.Simulation, "_tick", tick)
    for seed in range(20):
        sim = run(seed, CI_PARAMS)
        if checked:
            assert not sim.violations(), sim.report()
            break
    assert checked, "no schedule had a local record at a tick"
